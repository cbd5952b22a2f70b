"""How the off-policy family acts and steps its envs: one ε-greedy policy and one env stepper.

:class:`EpsilonGreedy` is the acting policy of DQN, C51 and Rainbow (for the distributional
variants it acts on the expectation of each action's return distribution). :class:`EnvStepper`
steps a vector env with it, one vector step at a time (in any autoreset mode), and counts the
episodes that end. The synchronous loop steps through the algorithm's stepper (and stores each
step in the replay buffer); the asynchronous runner's collector process builds its own stepper
around its copy of the network. Both therefore act, and draw their random numbers, alike.

Example:
    >>> import numpy as np, torch
    >>> policy = EpsilonGreedy(torch.nn.Linear(4, 2), num_actions=2)
    >>> rng = np.random.default_rng(0)
    >>> policy(np.zeros((3, 4), dtype=np.float32), epsilon=1.0, rng=rng).shape
    (3,)
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch

from vecaccel.trainers.services.episodes import EpisodeCounter

__all__ = ["EpsilonGreedy", "Transition", "EnvStepper", "expected_q"]


def expected_q(out: torch.Tensor, support: torch.Tensor | None) -> torch.Tensor:
    """Q-values from a network's output: the output itself, or for a categorical head
    (``[N, actions, atoms]`` logits on ``support``) the expectation of each distribution.

    Example:
        >>> expected_q(torch.zeros(1, 2, 3), torch.tensor([0.0, 1.0, 2.0]))
        tensor([[1., 1.]])
    """
    if support is None:
        return out
    return (torch.softmax(out, dim=-1) * support).sum(-1)


class EpsilonGreedy:
    """ε-greedy actions of a Q-network, in the env's action numbering.

    A ``Discrete(n, start)`` env acts in ``start..start+n-1`` while the network's outputs are
    numbered from 0: the actions returned are the env's (the replay buffer stores those, and
    the update moves them back before indexing the Q-values).

    Args:
        network: maps a ``[N, *obs_shape]`` tensor to Q-values (or categorical logits).
        num_actions: ``n`` of the ``Discrete`` action space.
        action_start: ``start`` of the action space.
        support: the categorical support, or ``None`` for expected-value heads.
        device: where observations go before the network sees them.
    """

    def __init__(
        self,
        network: torch.nn.Module,
        num_actions: int,
        action_start: int = 0,
        support: torch.Tensor | None = None,
        device: torch.device | str = "cpu",
    ) -> None:
        self.network = network
        self.num_actions = int(num_actions)
        self.action_start = int(action_start)
        self.support = support
        self.device = torch.device(device)

    @torch.no_grad()
    def __call__(self, obs: np.ndarray, epsilon: float, rng: np.random.Generator) -> np.ndarray:
        """Actions for the ``[N, ...]`` batch ``obs``: each random with probability ``epsilon``
        (drawn from ``rng``), else the greedy one."""
        n = obs.shape[0]
        explore = rng.random(n) < epsilon
        actions = rng.integers(0, self.num_actions, size=n)
        if not explore.all():
            q = expected_q(self.network(torch.as_tensor(obs, device=self.device)), self.support)
            greedy = q.argmax(dim=1).cpu().numpy()
            actions = np.where(explore, actions, greedy)
        env_actions: np.ndarray = actions + self.action_start
        return env_actions


class Transition(NamedTuple):
    """One vector step of every env, as the replay buffer stores it.

    Attributes:
        obs: the observations acted on.
        actions: the actions taken (the env's numbering).
        reward: the rewards.
        terminated: the envs whose episode terminated.
        truncated: the envs whose episode was truncated.
        final_obs: ``infos["final_obs"]`` (the true last observation of ended episodes).
        active: a multi-agent env's rows whose agent was live, else ``None``.
    """

    obs: np.ndarray
    actions: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    final_obs: Any
    active: np.ndarray | None


class EnvStepper:
    """Steps a vector env with an :class:`EpsilonGreedy` policy, one vector step at a time,
    and counts the episodes that end; every step it hands back is a real transition, whatever
    the env's autoreset mode:

    - ``SAME_STEP``: as the env gives it, ``infos["final_obs"]`` the ended episodes' last
      observations;
    - ``NEXT_STEP``: the observation an episode ends on is its final one, and the step after
      it, which only resets that env (its action ignored), is marked not ``active`` in that row,
      so the replay buffer stores nothing for it;
    - ``DISABLED``: the ended envs are reset at once (``reset_mask``), as ``SAME_STEP`` does.

    Args:
        envs: the vector env.
        policy: the acting policy.

    Attributes:
        obs: the observations the envs are at (``None`` before :meth:`reset`).
        episodes: the running returns and lengths of each env's episode.
    """

    def __init__(self, envs: Any, policy: EpsilonGreedy) -> None:
        from gymnasium.vector import AutoresetMode

        self.envs = envs
        self.policy = policy
        self.obs: np.ndarray | None = None
        self.episodes = EpisodeCounter()
        mode = envs.metadata.get("autoreset_mode", AutoresetMode.NEXT_STEP)
        self.autoreset_mode = AutoresetMode(mode)
        # NEXT_STEP: the envs whose next step only resets them
        self._resetting: np.ndarray | None = None

    @property
    def num_envs(self) -> int:
        """Envs (rows) stepped together."""
        return int(self.envs.num_envs)

    def reset(self, seed: int | None = None) -> None:
        """Reset every env (``seed``: as ``envs.reset``); running episodes are dropped."""
        self.obs, _ = self.envs.reset(seed=seed)
        self.episodes.reset(self.num_envs)
        self._resetting = None

    def step(
        self, epsilon: float, rng: np.random.Generator
    ) -> tuple[Transition, list[tuple[float, float]]]:
        """One ε-greedy step of every env: the transition, and the ``(return, length)`` of the
        episodes that ended in it."""
        from gymnasium.vector import AutoresetMode

        obs = self.obs
        actions = self.policy(obs, epsilon, rng)
        next_obs, reward, terminated, truncated, infos = self.envs.step(actions)
        active = infos.get("active")
        final_obs = infos.get("final_obs")
        mode = self.autoreset_mode
        if mode is not AutoresetMode.SAME_STEP:
            done = terminated | truncated
            if done.any():  # the observation an episode ends on is its final one
                final_obs = next_obs.copy()
            if mode is AutoresetMode.DISABLED and done.any():
                reset_obs, _ = self.envs.reset(options={"reset_mask": done})
                next_obs = np.where(
                    done.reshape(-1, *[1] * (next_obs.ndim - 1)), reset_obs, next_obs
                )
            elif mode is AutoresetMode.NEXT_STEP:
                skipped = self._resetting
                if skipped is not None and skipped.any():
                    live = ~skipped if active is None else np.asarray(active, dtype=bool) & ~skipped
                    active = live
                    infos = {**infos, "active": live}
                self._resetting = done
        transition = Transition(obs, actions, reward, terminated, truncated, final_obs, active)
        self.obs = next_obs
        return transition, self.episodes.record(reward, terminated | truncated, infos)

    def close(self) -> None:
        """Close the envs."""
        self.envs.close()
