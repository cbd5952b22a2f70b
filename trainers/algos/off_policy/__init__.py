"""The off-policy family: its base (replay buffer, target network, epsilon-greedy acting), its
synchronous loop, its asynchronous replay feed and the env stepping of its exploration. The
algorithms on it (DQN, C51, Rainbow) are modules of :mod:`vecaccel.trainers.algos`.

Example:
    >>> from vecaccel.trainers.algos.off_policy import OffPolicyAlgorithm
    >>> OffPolicyAlgorithm.__module__
    'vecaccel.trainers.algos.off_policy.base'
"""

from vecaccel.trainers.algos.off_policy.base import OffPolicyAlgorithm

__all__ = ["OffPolicyAlgorithm"]
