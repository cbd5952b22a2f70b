"""Observation and reward normalisation, as SB3's ``VecNormalize`` and Gymnasium's
``NormalizeObservation``/``NormalizeReward`` do it, kept as state of the run like the weights.

A :class:`Normalizer` holds the running statistics (:class:`~vecaccel.trainers.nets.running_stats.RunningMeanStd`,
float64) of the observations and of the discounted return, and applies them:

- an observation becomes ``clip((obs - mean) / sqrt(var + epsilon), -clip_obs, clip_obs)``;
- a reward is divided by ``sqrt(var + epsilon)`` of the discounted return
  ``R_t = gamma * R_{t-1} + r_t`` (reset to 0 where an episode ends) and clipped to
  ``clip_reward``, not centred.

The statistics are updated in the trainer's process from whole vector steps (every env of the
batch), never per worker, so every env is normalised alike. Where they are updated is the
normaliser's ``mode``:

- ``"update"``: each batch is merged into the statistics at once (one process, as SB3);
- ``"defer"``: kept apart until :meth:`Normalizer.sync` merges every rank's share (data-parallel
  ranks: all hold the same statistics after each sync, and normalise with them and their own
  share meanwhile);
- ``"collect"``: kept apart and handed to the trainer (:meth:`Normalizer.take_moments`), the
  values normalised with the statistics the trainer handed over (an asynchronous sampler).

Only floating-point ``Box`` observations are normalised (images and other integer or discrete
observations are refused, as SB3 refuses spaces it cannot normalise); a NaN or infinite
observation or reward is refused before it reaches the statistics, naming the env.

Example:
    >>> import gymnasium as gym, numpy as np
    >>> settings = NormalizationSettings(norm_obs=True, norm_reward=True, gamma=0.9)
    >>> normalizer = Normalizer(settings, gym.spaces.Box(-1.0, 1.0, (2,)))
    >>> normalizer.observe_obs(np.array([[0.0, 2.0], [2.0, 6.0]], dtype=np.float32))
    >>> normalizer.obs.mean.tolist(), normalizer.obs.var.tolist()
    ([1.0, 4.0], [1.0, 4.0])
    >>> normalizer.normalize_obs(np.array([3.0, 4.0], dtype=np.float32)).round(3).tolist()
    [2.0, 0.0]
    >>> normalizer.scale_rewards(np.array([1.0, 3.0]), np.array([False, False])).round(3).tolist()
    [1.0, 3.0]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from vecaccel.trainers.nets.running_stats import RunningMeanStd

__all__ = [
    "NonFiniteInputError",
    "NormalizationSettings",
    "Normalizer",
    "check_finite",
    "make_normalizer",
]

#: where a normaliser's observations go (see the module's docstring)
Mode = Literal["update", "defer", "collect"]


class NonFiniteInputError(ValueError):
    """An env returned a NaN or infinite observation or reward, which the running statistics
    refuse (one NaN in a running mean makes it NaN for the rest of the run).

    Attributes:
        env_index: the env (row of the vector env) that returned it.
        kind: ``"observation"`` or ``"reward"``.
    """

    def __init__(self, message: str, env_index: int, kind: str) -> None:
        super().__init__(message)
        self.env_index = env_index
        self.kind = kind


def check_finite(values: Any, kind: str) -> None:
    """Raise :class:`NonFiniteInputError` naming the first env whose ``kind`` (``"observation"``
    or ``"reward"``) in ``values`` (``[num_envs, ...]``) is NaN or infinite.

    Example:
        >>> try:
        ...     check_finite(np.array([0.5, np.nan]), "reward")
        ... except NonFiniteInputError as exc:
        ...     print(exc.env_index, exc.kind)
        1 reward
    """
    array = np.asarray(values)
    if not np.issubdtype(array.dtype, np.floating):
        return
    finite = np.isfinite(array).reshape(len(array), -1).all(axis=1)
    if finite.all():
        return
    index = int(np.flatnonzero(~finite)[0])
    bad = np.asarray(array[index]).reshape(-1)
    value = bad[~np.isfinite(bad)][0]
    raise NonFiniteInputError(
        f"env {index} returned a non-finite {kind} ({value}); the {kind} normalisation refuses "
        f"it before it reaches the running statistics, which one NaN or inf would spoil for the "
        f"rest of the run (fix the env, or clip its {kind}s with a wrapper)",
        index,
        kind,
    )


@dataclass(frozen=True)
class NormalizationSettings:
    """What a run normalises and how; the names are SB3's ``VecNormalize`` arguments.

    Attributes:
        norm_obs: normalise observations by their running mean and variance.
        norm_reward: scale rewards by the running standard deviation of the discounted return.
        clip_obs: the bound of a normalised observation.
        clip_reward: the bound of a scaled reward.
        gamma: the discount of the return whose variance scales the rewards.
        epsilon: added to each variance before its square root.
    """

    norm_obs: bool = False
    norm_reward: bool = False
    clip_obs: float = 10.0
    clip_reward: float = 10.0
    gamma: float = 0.99
    epsilon: float = 1e-8

    @classmethod
    def of(cls, config: Any) -> NormalizationSettings | None:
        """The settings a run's config asks for (its ``norm_*`` and ``clip_*`` fields, the
        algorithm's ``gamma`` where ``norm_gamma`` is ``None``); ``None`` when it normalises
        nothing.

        Example:
            >>> from vecaccel.trainers.algos.ppo import PPOConfig
            >>> NormalizationSettings.of(PPOConfig()) is None
            True
            >>> NormalizationSettings.of(PPOConfig(norm_reward=True, gamma=0.9)).gamma
            0.9
        """
        if not (config.norm_obs or config.norm_reward):
            return None
        gamma = config.norm_gamma
        if gamma is None:
            gamma = getattr(config, "gamma", cls.gamma)
        return cls(
            norm_obs=bool(config.norm_obs),
            norm_reward=bool(config.norm_reward),
            clip_obs=float(config.clip_obs),
            clip_reward=float(config.clip_reward),
            gamma=float(gamma),
            epsilon=float(config.norm_epsilon),
        )


def _observation_shape(space: gym.Space[Any]) -> tuple[int, ...]:
    """The shape of ``space``'s observations, which must be floating-point ``Box`` ones."""
    if not isinstance(space, gym.spaces.Box) or not np.issubdtype(space.dtype, np.floating):
        raise TypeError(
            f"norm_obs normalises floating-point Box observations, got {space}: images and "
            "integer or discrete observations are not normalised (the networks scale images "
            "themselves); train without norm_obs, or turn the observations into a float Box "
            "with a wrapper first"
        )
    return tuple(space.shape)


class Normalizer:
    """The running statistics of a run's observations and returns, and their use.

    Args:
        settings: what is normalised and how.
        observation_space: the single-env observation space (a floating-point ``Box`` when
            ``settings.norm_obs``).
        mode: where observed values go: ``"update"``, ``"defer"`` or ``"collect"`` (see the
            module's docstring).

    Attributes:
        obs: the observation statistics (``None`` without ``norm_obs``): the ones every rank
            holds alike, and the ones saved and handed to an asynchronous sampler.
        returns: the discounted return's statistics (``None`` without ``norm_reward``).

    Raises:
        TypeError: ``norm_obs`` for a space that is not a floating-point ``Box``, naming it.
    """

    def __init__(
        self,
        settings: NormalizationSettings,
        observation_space: gym.Space[Any],
        mode: Mode = "update",
    ) -> None:
        if mode not in ("update", "defer", "collect"):
            raise ValueError(f"mode must be 'update', 'defer' or 'collect', got {mode!r}")
        self.settings = settings
        self.observation_space = observation_space
        self.mode: Mode = mode
        dtype = getattr(observation_space, "dtype", None)
        self.dtype = np.dtype(np.float32 if dtype is None else dtype)
        self.obs: RunningMeanStd | None = None
        self.returns: RunningMeanStd | None = None
        if settings.norm_obs:
            self.obs = RunningMeanStd(_observation_shape(observation_space))
        if settings.norm_reward:
            self.returns = RunningMeanStd(())
        # what was observed since the last sync (defer) or hand-over (collect)
        self._pending = [stats.copy() for stats in self._streams()]
        for pending in self._pending:
            pending.reset()
        self._discounted: np.ndarray | None = None  # each env's running discounted return

    def _streams(self) -> list[RunningMeanStd]:
        return [stats for stats in (self.obs, self.returns) if stats is not None]

    @property
    def observation_shape(self) -> tuple[int, ...] | None:
        """The shape of the observations normalised (``None`` without ``norm_obs``)."""
        return None if self.obs is None else self.obs.shape

    # -- applying the statistics ----------------------------------------------------------------

    def _in_force(self, stats: RunningMeanStd, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The mean and variance that normalise now: with ``defer``, the common statistics and
        this process's own share since the last sync together."""
        pending = self._pending[index]
        if self.mode != "defer" or pending.count == 0:
            return stats.mean, stats.var
        merged = stats.copy()
        merged.merge_from(pending)
        return merged.mean, merged.var

    def normalize_obs(self, obs: Any) -> np.ndarray:
        """``obs`` (one observation or a batch) normalised and clipped, in the observation
        space's dtype; as it is without ``norm_obs``. Nothing is counted."""
        if self.obs is None:
            return np.asarray(obs)
        mean, var = self._in_force(self.obs, 0)
        bound = self.settings.clip_obs
        scaled = (np.asarray(obs, dtype=np.float64) - mean) / np.sqrt(var + self.settings.epsilon)
        return np.clip(scaled, -bound, bound).astype(self.dtype, copy=False)

    def observe_obs(self, obs: Any) -> None:
        """Count the ``[num_envs, *shape]`` batch ``obs`` (every env of a vector step).

        Raises:
            NonFiniteInputError: an env's observation is NaN or infinite (nothing is counted).
        """
        if self.obs is None:
            return
        check_finite(obs, "observation")
        self._observe(0, obs)

    def _observe(self, index: int, values: Any) -> None:
        if self.mode == "update":
            self._streams()[index].update(values)
        else:
            self._pending[index].update(values)

    def scale_rewards(self, rewards: Any, dones: Any) -> np.ndarray:
        """One vector step's rewards scaled (float32): each env's discounted return takes its
        reward and is counted, the rewards are divided by the return's running standard
        deviation and clipped, and the returns of the envs whose episode ended (``dones``)
        start again from 0. As they are (float32) without ``norm_reward``.

        Raises:
            NonFiniteInputError: an env's reward is NaN or infinite (nothing is counted).
        """
        reward = np.asarray(rewards, dtype=np.float64).reshape(-1)
        if self.returns is None:
            return reward.astype(np.float32)
        check_finite(reward, "reward")
        if self._discounted is None or len(self._discounted) != len(reward):
            self._discounted = np.zeros(len(reward))
        discounted = self._discounted
        discounted *= self.settings.gamma
        discounted += reward
        self._observe(len(self._streams()) - 1, discounted)
        _, var = self._in_force(self.returns, len(self._streams()) - 1)
        bound = self.settings.clip_reward
        scaled = np.clip(reward / np.sqrt(var + self.settings.epsilon), -bound, bound)
        discounted[np.asarray(dones, dtype=bool).reshape(-1)] = 0.0
        return scaled.astype(np.float32)

    def scale_reward_rows(self, rewards: Any, dones: Any) -> np.ndarray:
        """:meth:`scale_rewards` for each row of the ``[T, num_envs]`` arrays, in order."""
        rows = np.asarray(rewards)
        done = np.asarray(dones, dtype=bool)
        return np.stack([self.scale_rewards(rows[t], done[t]) for t in range(len(rows))])

    def reset_returns(self) -> None:
        """Start every env's discounted return from 0 (the envs were reset)."""
        if self._discounted is not None:
            self._discounted[:] = 0.0

    # -- meeting other processes ------------------------------------------------------------------

    def sync(self, device: Any = "cpu") -> None:
        """Merge what every rank observed since the last sync into the statistics, which are
        then the same on every rank (``defer``: a collective every rank calls; nothing to do
        in the other modes)."""
        if self.mode != "defer" or not self._pending:
            return
        from vecaccel.trainers.services import distributed

        shares = [(p.count, p.mean, p.var) for p in self._pending]
        for stats, pending, merged in zip(
            self._streams(), self._pending, distributed.all_reduce_moments(shares, device)
        ):
            stats.merge(merged[1], merged[2], merged[0])
            pending.reset()

    @property
    def moments_size(self) -> int:
        """The length of the flat array :meth:`take_moments` fills."""
        return sum(p.data.size for p in self._pending)

    def take_moments(self, out: np.ndarray) -> None:
        """Write the moments observed since the last hand-over into the flat float64 ``out``
        (:attr:`moments_size` long) and forget them (``collect``)."""
        at = 0
        for pending in self._pending:
            out[at : at + pending.data.size] = pending.data
            at += pending.data.size
            pending.reset()

    def add_moments(self, moments: np.ndarray) -> None:
        """Count the moments another process handed over (what its :meth:`take_moments`
        wrote), as if observed here."""
        at = 0
        for index, pending in enumerate(self._pending):
            share = pending.copy()
            share.data[:] = moments[at : at + share.data.size]
            at += share.data.size
            if self.mode == "update":
                self._streams()[index].merge_from(share)
            else:
                pending.merge_from(share)

    def tensors(self) -> list[Any]:
        """The statistics as torch tensors that share their memory: what an asynchronous run
        hands its sampler with the weights (written into in place there)."""
        import torch

        return [torch.from_numpy(stats.data) for stats in self._streams()]

    def for_collector(self) -> Normalizer:
        """A copy for an asynchronous sampler (``collect``): the same statistics, nothing
        pending."""
        twin = Normalizer(self.settings, self.observation_space, "collect")
        for mine, theirs in zip(twin._streams(), self._streams()):
            mine.data[:] = theirs.data
        return twin

    # -- checkpoints ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The statistics as plain data (``torch.load(weights_only=True)`` loads it): for each
        of ``obs`` and ``returns`` its ``mean``, ``var`` (float64 tensors) and ``count``, or
        ``None``."""
        import torch

        def entry(stats: RunningMeanStd | None) -> dict[str, Any] | None:
            if stats is None:
                return None
            return {
                "mean": torch.from_numpy(stats.mean.copy()),
                "var": torch.from_numpy(stats.var.copy()),
                "count": stats.count,
            }

        return {"obs": entry(self.obs), "returns": entry(self.returns)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the statistics :meth:`state_dict` returned; a stream this normaliser does not
        keep is ignored, one the state lacks stays as it is.

        Raises:
            ValueError: the saved observation statistics have another shape than the
                observations normalised here (both shapes in the message).
        """
        for stats, key in ((self.obs, "obs"), (self.returns, "returns")):
            saved = state.get(key)
            if stats is None or saved is None:
                continue
            mean = _as_float64(saved["mean"])
            if tuple(mean.shape) != stats.shape:
                raise ValueError(
                    f"the saved {key} normalisation statistics have shape {tuple(mean.shape)}, "
                    f"but the observations here have shape {stats.shape}: they were made for "
                    "another env"
                )
            stats.data[: stats.size] = mean.reshape(-1)
            stats.data[stats.size : 2 * stats.size] = _as_float64(saved["var"]).reshape(-1)
            stats.data[-1] = float(saved["count"])

    def __repr__(self) -> str:
        fields = dataclasses.asdict(self.settings)
        shown = ", ".join(f"{key}={value}" for key, value in fields.items())
        return f"Normalizer({shown}, mode={self.mode!r})"


def _as_float64(value: Any) -> np.ndarray:
    """A saved tensor (on whichever device the checkpoint was loaded to) as a float64 array."""
    detach = getattr(value, "detach", None)
    if detach is not None:
        value = detach().cpu().numpy()
    return np.asarray(value, dtype=np.float64)


def make_normalizer(
    config: Any, observation_space: gym.Space[Any] | None, world_size: int = 1
) -> Normalizer | None:
    """The normaliser a run's config asks for, for ``observation_space`` (``None`` when it
    normalises nothing, or before the space is known): ``defer`` on several ranks, else
    ``update``.

    Raises:
        TypeError: ``norm_obs`` for a space that is not a floating-point ``Box``.
    """
    settings = NormalizationSettings.of(config)
    if settings is None or observation_space is None:
        return None
    return Normalizer(settings, observation_space, "defer" if world_size > 1 else "update")
