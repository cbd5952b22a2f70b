"""A kit for testing vector envs and the backends that build them.

:mod:`vecaccel.testing.envs` holds small envs (step counters, planted faults, heavy-tailed step
times) and :mod:`vecaccel.testing.leaks` the probes for processes and shared memory left behind.
"""

from __future__ import annotations
