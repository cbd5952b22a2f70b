"""The vector env a run with normalisation steps: its observations normalised on the way out.

:class:`NormalizedVecEnv` sits between a trainer's vector env and what steps it for training
(the on-policy sampler, the off-policy env stepper, or an asynchronous run's collector), in the
process that steps them: every env's observation of a vector step is counted in the statistics
of one :class:`~vecaccel.trainers.nets.normalization.Normalizer` and returned normalised, the
true final observations of ended episodes (``infos["final_obs"]``) normalised alike. So the
policy acts on normalised observations and the rollout or replay buffer stores them, as after
CleanRL's wrappers. Rewards pass through as the env gave them (checked finite when they are
normalised), so that the episode returns counted from them stay the env's own: the trainer
scales them where it stores them (:meth:`Normalizer.scale_rewards
<vecaccel.trainers.nets.normalization.Normalizer.scale_rewards>`).

The observations of a ``reset`` are normalised but not counted: a run resumed from a checkpoint
repeats the reset of its restart point, which the run it continues counted before it saved.

Example:
    >>> import numpy as np, vecaccel
    >>> from vecaccel.trainers.nets.normalization import NormalizationSettings, Normalizer
    >>> envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial", autoreset_mode="SameStep")
    >>> normalizer = Normalizer(NormalizationSettings(norm_obs=True), envs.single_observation_space)
    >>> wrapped = NormalizedVecEnv(envs, normalizer)
    >>> _ = wrapped.reset(seed=0)
    >>> _ = wrapped.step(np.zeros(2, dtype=np.int64))
    >>> normalizer.obs.count
    2.0
    >>> envs.close()
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from vecaccel.trainers.nets.normalization import Normalizer, check_finite
from vecaccel.vec_env import Capabilities

__all__ = ["NormalizedVecEnv", "normalized_envs"]


def _to_numpy(value: Any) -> np.ndarray:
    detach = getattr(value, "detach", None)
    if detach is not None:  # a torch tensor (the action server's)
        return np.asarray(detach().cpu().numpy())
    return np.asarray(value)


def _like(values: np.ndarray, original: Any) -> Any:
    """``values`` in the kind of ``original``: a tensor on its device, or an array."""
    device = getattr(original, "device", None)
    if device is None or isinstance(original, np.ndarray):
        return values
    import torch

    return torch.as_tensor(values, device=device)


class NormalizedVecEnv(gym.vector.VectorWrapper):
    """``env`` with its observations normalised by ``normalizer``, which counts them.

    Args:
        env: a vector env that returns every env, in index order, from each step.
        normalizer: the run's normaliser.

    Raises:
        ValueError: ``env`` returns part of its envs per step (the action server's alternating
            halves, an asynchronous backend's ``batch_size``), or its observations have another
            shape than the normaliser's statistics (both shapes in the message).
    """

    def __init__(self, env: gym.vector.VectorEnv, normalizer: Normalizer) -> None:
        super().__init__(env)
        capabilities = Capabilities.of(env)
        if (
            capabilities.alternating
            or capabilities.batch_size != env.num_envs
            or not capabilities.fixed_batch
        ):
            raise ValueError(
                "normalisation counts every env's observation of each vector step; this env "
                "returns part of its envs per step (alternating halves, or a batch_size below "
                "num_envs): train it without norm_obs and norm_reward"
            )
        shape = normalizer.observation_shape
        found = tuple(getattr(env.single_observation_space, "shape", None) or ())
        if shape is not None and found != shape:
            raise ValueError(
                f"the observation normalisation statistics have shape {shape}, but the env's "
                f"observations have shape {found}: they were made for another env"
            )
        self.normalizer = normalizer

    def _normalized(self, obs: Any) -> Any:
        if self.normalizer.obs is None:
            return obs
        return _like(self.normalizer.normalize_obs(_to_numpy(obs)), obs)

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        """Reset as ``env`` does; the observations normalised, not counted. A full reset (no
        ``reset_mask``) starts every env's discounted return from 0."""
        obs, infos = self.env.reset(seed=seed, options=options)
        if not (options and "reset_mask" in options):
            self.normalizer.reset_returns()
        return self._normalized(obs), infos

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        """Step as ``env`` does; every env's observation counted, then all normalised.

        Raises:
            NonFiniteInputError: an env returned a NaN or infinite observation (or reward,
                with ``norm_reward``), naming the env; nothing of the step is counted.
        """
        obs, rewards, terminated, truncated, infos = self.env.step(actions)
        normalizer = self.normalizer
        if normalizer.returns is not None:
            check_finite(_to_numpy(rewards), "reward")
        if normalizer.obs is None:
            return obs, rewards, terminated, truncated, infos
        normalizer.observe_obs(_to_numpy(obs))
        final = infos.get("final_obs") if isinstance(infos, dict) else None
        if final is not None:
            infos = {**infos, "final_obs": self._normalized_finals(final)}
        return self._normalized(obs), rewards, terminated, truncated, infos

    def _normalized_finals(self, final: Any) -> Any:
        """``infos["final_obs"]`` normalised: an object array with an observation (or
        ``None``) per env, or an array of them."""
        if hasattr(final, "detach") or np.asarray(final).dtype != np.dtype(object):
            return self._normalized(final)
        array = np.asarray(final)
        out = np.empty(len(array), dtype=object)
        for index, item in enumerate(array):
            out[index] = None if item is None else self._normalized(item)
        return out


def normalized_envs(envs: Any, normalizer: Normalizer | None, previous: Any = None) -> Any:
    """What steps ``envs`` for training: ``envs`` itself without a ``normalizer``, else
    ``previous`` if it wraps them already (its discounted returns go on), else a new
    :class:`NormalizedVecEnv` around them."""
    if normalizer is None or envs is None:
        return envs
    if isinstance(previous, NormalizedVecEnv) and previous.env is envs:
        if previous.normalizer is normalizer:
            return previous
    return NormalizedVecEnv(envs, normalizer)
