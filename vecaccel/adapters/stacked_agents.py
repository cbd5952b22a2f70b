"""PettingZoo parallel envs as single Gymnasium envs that stack their agents.

:class:`StackedAgentsEnv` turns one ``pettingzoo.ParallelEnv`` into a ``gymnasium.Env`` whose
observation is a fixed-size ``Dict``: every agent's observation stacked in ``possible_agents``
order, and each agent's reward, termination, truncation and whether it is live. Every backend
moves such an env through shared memory as it moves any other, so worker processes, restarts
and fault reports apply unchanged; :class:`vecaccel.adapters.agent_rows.MultiAgentVecEnv` then
unpacks one row per (env, agent). The env's own reward is the agents' sum; it terminates when
no agent is left, and never truncates (a truncated stacked env is one that a worker restarted).

Nothing here imports PettingZoo at module level: ``import vecaccel`` stays light, and an env id
never leads to PettingZoo being imported.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import batch_space

from vecaccel.vec_env import snapshot

__all__ = [
    "AgentInfos",
    "StackedAgentsEnv",
    "StackedAgentsFn",
    "common_spaces",
    "is_multiagent_env",
]

#: the keys of a stacked env's observation, besides ``obs``
FLAG_KEYS = ("reward", "terminated", "truncated", "active")


class AgentInfos:
    """The info dicts of one step, one per possible agent (``{}`` where an agent gave none).

    One object rather than a dict keyed by agent, so that Gymnasium's info batching keeps it
    whole (one entry per stacked env) for the vector env to hand out row by row.
    """

    __slots__ = ("infos",)

    def __init__(self, infos: tuple[dict, ...]) -> None:
        self.infos = infos

    def __reduce__(self):
        return (AgentInfos, (self.infos,))

    def __repr__(self) -> str:
        return f"AgentInfos({self.infos!r})"


def _pettingzoo_types() -> tuple[type, type] | None:
    """``(ParallelEnv, AECEnv)`` where PettingZoo is imported already, else ``None``."""
    if "pettingzoo" not in sys.modules:
        return None
    from pettingzoo.utils.env import AECEnv, ParallelEnv

    return ParallelEnv, AECEnv


def is_multiagent_env(env: Any) -> bool:
    """Whether ``env`` is a PettingZoo ``ParallelEnv`` or ``AECEnv`` (imports nothing).

    Example:
        >>> import gymnasium as gym
        >>> is_multiagent_env(gym.make("CartPole-v1"))
        False
    """
    types = _pettingzoo_types()
    return types is not None and isinstance(env, types)


def as_parallel(env: Any) -> Any:
    """``env`` as a ``ParallelEnv``: AEC envs go through PettingZoo's ``aec_to_parallel``."""
    types = _pettingzoo_types()
    if types is not None and isinstance(env, types[1]):
        from pettingzoo.utils.conversions import aec_to_parallel

        return aec_to_parallel(env)
    return env


def common_spaces(env: Any, index: int = 0) -> tuple[list[str], gym.Space, gym.Space]:
    """``(possible agents, observation space, action space)`` shared by every agent of ``env``.

    Raises:
        ValueError: naming the agents and their spaces, where they differ (env ``index``).
    """
    agents = list(env.possible_agents)
    if not agents:
        raise ValueError(f"multi-agent env {index} has no possible_agents")
    found = {}
    for kind, space_of in (("observation", env.observation_space), ("action", env.action_space)):
        per_agent = [(agent, space_of(agent)) for agent in agents]
        first_agent, first = per_agent[0]
        others = [(agent, space) for agent, space in per_agent if space != first]
        if others:
            listed = "; ".join(f"{agent}: {space}" for agent, space in [per_agent[0], *others])
            raise ValueError(
                f"multi-agent env {index}: the agents' {kind} spaces differ ({listed}); one row "
                f"per agent needs one {kind} space for all agents (pad or wrap the env so "
                f"every agent has {first_agent}'s)"
            )
        found[kind] = first
    return agents, found["observation"], found["action"]


def _zero_tree(space: gym.Space, n: int) -> Any:
    from gymnasium.vector.utils import create_empty_array

    return create_empty_array(space, n, fn=np.zeros)


def _write_row(tree: Any, index: int, value: Any) -> None:
    if isinstance(tree, dict):
        for key, item in tree.items():
            _write_row(item, index, value[key])
    elif isinstance(tree, tuple):
        for item, part in zip(tree, value):
            _write_row(item, index, part)
    else:
        tree[index] = value


def zero_row(tree: Any, index: int) -> None:
    """Set row ``index`` of every leaf of ``tree`` (arrays in dicts and tuples) to zero."""
    if isinstance(tree, dict):
        for item in tree.values():
            zero_row(item, index)
    elif isinstance(tree, tuple):
        for item in tree:
            zero_row(item, index)
    else:
        tree[index] = 0


def _read_row(tree: Any, index: int) -> Any:
    if isinstance(tree, dict):
        return {key: _read_row(item, index) for key, item in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_read_row(item, index) for item in tree)
    return tree[index]


class StackedAgentsEnv(gym.Env):
    """One PettingZoo parallel env as a Gymnasium env with every agent stacked.

    Observation: ``Dict(obs=<common space batched over agents>, reward=Box(n),
    terminated=MultiBinary(n), truncated=MultiBinary(n), active=MultiBinary(n))``. Action: the
    common action space batched over agents; each step hands the env a dict of the actions of
    its live agents only. An agent that is not live (dead before, not spawned yet) has zeros
    everywhere; on the step it dies it is active and carries its terminal values.

    Attributes and methods this class lacks are looked up on the PettingZoo env, so
    ``call("state")`` and ``get_attr("possible_agents")`` reach it.

    Example:
        >>> from pettingzoo.butterfly import pistonball_v6
        >>> env = StackedAgentsEnv(pistonball_v6.parallel_env(n_pistons=3, continuous=False))
        >>> obs, info = env.reset(seed=0)
        >>> obs["obs"].shape, obs["active"].tolist()
        ((3, 457, 120, 3), [1, 1, 1])
        >>> env.close()
    """

    def __init__(self, par_env: Any, index: int = 0) -> None:
        self.par_env = as_parallel(par_env)
        self.agents, self.agent_observation_space, self.agent_action_space = common_spaces(
            self.par_env, index
        )
        n = len(self.agents)
        self.num_agents = n
        self._index = {agent: i for i, agent in enumerate(self.agents)}
        self.observation_space = spaces.Dict(
            {
                "obs": batch_space(self.agent_observation_space, n),
                "reward": spaces.Box(-np.inf, np.inf, (n,), np.float64),
                "terminated": spaces.MultiBinary(n),
                "truncated": spaces.MultiBinary(n),
                "active": spaces.MultiBinary(n),
            }
        )
        self.action_space = batch_space(self.agent_action_space, n)
        self.metadata = dict(getattr(self.par_env, "metadata", {}) or {})
        self.render_mode = getattr(self.par_env, "render_mode", None)
        self._pid = os.getpid()

    def _observation(self, observations: dict, rewards=None, terms=None, truncs=None) -> dict:
        n = self.num_agents
        stacked = _zero_tree(self.agent_observation_space, n)
        reward = np.zeros(n, dtype=np.float64)
        terminated = np.zeros(n, dtype=np.int8)
        truncated = np.zeros(n, dtype=np.int8)
        active = np.zeros(n, dtype=np.int8)
        index = self._index
        for agent, value in observations.items():
            i = index.get(agent)
            if i is None:
                raise ValueError(
                    f"agent {agent!r} is not one of the env's possible_agents {self.agents}"
                )
            _write_row(stacked, i, value)
            active[i] = 1
            if rewards is not None:
                reward[i] = rewards.get(agent, 0.0)
                terminated[i] = bool(terms.get(agent, False))
                truncated[i] = bool(truncs.get(agent, False))
        return {
            "obs": stacked,
            "reward": reward,
            "terminated": terminated,
            "truncated": truncated,
            "active": active,
        }

    def _infos(self, infos: dict) -> dict:
        per_agent = tuple(snapshot(dict(infos.get(agent) or {})) for agent in self.agents)
        return {"agents": AgentInfos(per_agent)}

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        observations, infos = self.par_env.reset(seed=seed, options=options)
        return self._observation(observations), self._infos(infos)

    def step(self, action: Any):
        live = self.par_env.agents
        index = self._index
        actions = {agent: _read_row(action, index[agent]) for agent in live}
        observations, rewards, terms, truncs, infos = self.par_env.step(actions)
        obs = self._observation(observations, rewards, terms, truncs)
        done = not self.par_env.agents
        return obs, float(obs["reward"].sum()), done, False, self._infos(infos)

    def render(self):
        return self.par_env.render()

    def close(self):
        self.par_env.close()

    def get_wrapper_attr(self, name: str) -> Any:
        if hasattr(self, name):
            return getattr(self, name)
        return getattr(self.par_env, name)

    def set_wrapper_attr(self, name: str, value: Any, *, force: bool = True) -> bool:
        if hasattr(self, name) or not hasattr(self.par_env, name):
            setattr(self, name, value)
        else:
            setattr(self.par_env, name, value)
        return True


class StackedAgentsFn:
    """A picklable env function: the PettingZoo env of ``fn`` as a :class:`StackedAgentsEnv`
    (env ``index``, for the messages).

    Example:
        >>> from vecaccel.envs import EnvCall, make_pettingzoo_env
        >>> fn = StackedAgentsFn(EnvCall(make_pettingzoo_env, "pettingzoo.butterfly.pistonball_v6"), 0)
        >>> fn
        StackedAgentsFn(EnvCall(make_pettingzoo_env, 'pettingzoo.butterfly.pistonball_v6'), 0)
    """

    def __init__(self, fn: Callable[[], Any], index: int) -> None:
        self.fn = fn
        self.index = index

    def __call__(self) -> StackedAgentsEnv:
        env = self.fn()
        if not is_multiagent_env(env):
            raise TypeError(
                f"multi-agent env function {self.index} returned {type(env).__name__}, not a "
                "PettingZoo ParallelEnv or AECEnv"
            )
        return StackedAgentsEnv(env, self.index)

    def __repr__(self) -> str:
        return f"StackedAgentsFn({self.fn!r}, {self.index})"
