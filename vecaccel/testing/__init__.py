"""A kit for testing vector envs and the backends that build them.

:mod:`vecaccel.testing.envs` holds small envs (step counters, planted faults, heavy-tailed step
times), :mod:`vecaccel.testing.leaks` the probes for processes and shared memory left behind, and
:mod:`vecaccel.testing.action_server` the checks of the ``action_server`` backend on a device.
"""

from __future__ import annotations
