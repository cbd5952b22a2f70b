"""A kit for testing vector envs and the backends that build them.

:func:`check_backend` checks that a registered backend keeps the vector-env contract
(:mod:`vecaccel.testing.contract`, comparing results with :mod:`vecaccel.testing.compare`);
:mod:`vecaccel.testing.contract_envs` holds the small envs it runs on, :mod:`vecaccel.testing.envs` small envs for tests and benchmarks (step counters, planted
faults, heavy-tailed step times), :mod:`vecaccel.testing.leaks` the probes for processes and
shared memory left behind, and :mod:`vecaccel.testing.action_server` the checks of the
``action_server`` backend on a device.

Example:
    >>> from vecaccel.testing import CONTRACT_ENVS, NUM_ENVS
    >>> NUM_ENVS, sorted(CONTRACT_ENVS)  # check_backend's vector envs: 4 of each of these
    (4, ['cartpole', 'dict_tuple'])
"""

from __future__ import annotations

from vecaccel.testing.contract import CONTRACT_ENVS, NUM_ENVS, STEPS, check_backend
from vecaccel.testing.leaks import LeakBaseline

__all__ = ["CONTRACT_ENVS", "NUM_ENVS", "STEPS", "LeakBaseline", "check_backend"]
