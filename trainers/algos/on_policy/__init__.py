"""The on-policy family: its base (rollout storage, the policy-gradient update's shared step),
its synchronous loop, its asynchronous rollout feed and the GAE advantages its algorithms
learn from. The algorithms on it (A2C, PPO, and PQN, whose model is a Q-network) are modules of
:mod:`vecaccel.trainers.algos`.

Example:
    >>> from vecaccel.trainers.algos.on_policy import OnPolicyAlgorithm
    >>> OnPolicyAlgorithm.__module__
    'vecaccel.trainers.algos.on_policy.base'
"""

from vecaccel.trainers.algos.on_policy.base import OnPolicyAlgorithm, OnPolicyConfig, RolloutConfig

__all__ = ["OnPolicyAlgorithm", "OnPolicyConfig", "RolloutConfig"]
