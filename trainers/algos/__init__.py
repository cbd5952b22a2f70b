"""The algorithms, one module each (``a2c``, ``ppo``, ``dqn``), on their family's base: the
on-policy family in :mod:`vecaccel.trainers.algos.on_policy`, the off-policy family in
:mod:`vecaccel.trainers.algos.off_policy`; ``base`` holds what every family shares and
``training_loop`` the interface a runner drives."""
