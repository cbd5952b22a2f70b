"""Small PettingZoo parallel envs for the multi-agent tests (importing this module imports
PettingZoo, so it lives apart from ``toy_envs``)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np
from gymnasium import spaces
from pettingzoo import ParallelEnv


class EchoAgentsEnv(ParallelEnv):
    """Each agent sees ``[env tag, its index, its last action, actions it received, step]``.

    Agent ``i`` terminates at step ``lifetimes[i]`` (all agents live ``max_steps`` at most,
    then the rest truncate). ``raise_at`` makes ``step`` raise at that step; ``exit_at`` ends
    the process there (a dying worker). Every step checks that only live agents got actions.
    """

    metadata = {"name": "echo_agents_v0"}

    def __init__(
        self,
        tag: int = 0,
        num_agents: int = 2,
        lifetimes: tuple[int, ...] | None = None,
        max_steps: int = 6,
        raise_at: int | None = None,
        exit_at: int | None = None,
        odd_spaces: bool = False,
    ) -> None:
        self.tag = tag
        self.possible_agents = [f"agent_{i}" for i in range(num_agents)]
        self.lifetimes = tuple(lifetimes or [max_steps] * num_agents)
        self.max_steps = max_steps
        self.raise_at = raise_at
        self.exit_at = exit_at
        self.odd_spaces = odd_spaces
        self.agents: list[str] = []
        self._last = {}
        self._received = {}
        self._t = 0

    def observation_space(self, agent: str) -> spaces.Space:
        shape = (6,) if self.odd_spaces and agent == self.possible_agents[-1] else (5,)
        return spaces.Box(-1e6, 1e6, shape, np.float64)

    def action_space(self, agent: str) -> spaces.Space:
        return spaces.Discrete(10)

    def _obs(self, agent: str) -> np.ndarray:
        i = self.possible_agents.index(agent)
        return np.array(
            [self.tag, i, self._last[agent], self._received[agent], self._t], dtype=np.float64
        )

    def reset(self, seed: int | None = None, options: dict | None = None):
        self.agents = list(self.possible_agents)
        self._t = 0
        self._last = {agent: -1 for agent in self.agents}
        self._received = {agent: 0 for agent in self.agents}
        return {a: self._obs(a) for a in self.agents}, {a: {"seed": seed} for a in self.agents}

    def step(self, actions: dict[str, Any]):
        if set(actions) != set(self.agents):
            raise AssertionError(f"actions for {sorted(actions)}, live agents {self.agents}")
        self._t += 1
        if self.raise_at is not None and self._t == self.raise_at:
            raise ZeroDivisionError(f"env {self.tag} fails at step {self._t}")
        if self.exit_at is not None and self._t == self.exit_at:
            os._exit(3)
        for agent, action in actions.items():
            self._last[agent] = int(action)
            self._received[agent] += 1
        obs = {a: self._obs(a) for a in self.agents}
        rewards = {a: float(self.tag + 0.5 * int(actions[a])) for a in self.agents}
        terms = {a: self._t >= self.lifetimes[int(a.split("_")[1])] for a in self.agents}
        truncs = {a: self._t >= self.max_steps and not terms[a] for a in self.agents}
        infos = {a: {"t": self._t, "tag": self.tag} for a in self.agents}
        self.agents = [a for a in self.agents if not (terms[a] or truncs[a])]
        return obs, rewards, terms, truncs, infos
