"""Stable-Baselines3 on vecaccel, at the import path users know: the adapter lives in
:mod:`vecaccel.adapters.sb3` with the other adapters.

Example:
    >>> from vecaccel.sb3 import to_sb3
    >>> import vecaccel.adapters.sb3
    >>> to_sb3 is vecaccel.adapters.sb3.to_sb3
    True
"""

from __future__ import annotations

from vecaccel.adapters.sb3 import SB3VecEnv, VecAccelEnv, to_sb3

__all__ = ["SB3VecEnv", "VecAccelEnv", "to_sb3"]
