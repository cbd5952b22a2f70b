"""Adapters between vecaccel's vector envs and other libraries' contracts.

* :mod:`~vecaccel.adapters.sb3`: a vecaccel vector env as a Stable-Baselines3 ``VecEnv``
  (also importable as ``vecaccel.sb3``);
* :mod:`~vecaccel.adapters.env_calls`: what that adapter runs on each env inside the workers,
  kept apart from its import of Stable-Baselines3;
* :mod:`~vecaccel.adapters.stacked_agents`: a PettingZoo env as one Gymnasium env with its
  agents stacked, which every backend steps;
* :mod:`~vecaccel.adapters.agent_rows`: ``MultiAgentVecEnv``, one row per (env, agent) on top
  of any backend;
* :mod:`~vecaccel.adapters.envpool`: EnvPool's batched simulators as vector env functions.

Nothing here is imported by ``import vecaccel``: each adapter loads its library when used.
"""
