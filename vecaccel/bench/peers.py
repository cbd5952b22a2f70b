"""The implementations vecaccel is compared with, and how each is built, reset and skipped."""

from __future__ import annotations

import importlib.util
from typing import Any

import gymnasium as gym

from vecaccel.bench.workloads import BenchEnv

__all__ = ["PEERS", "build_peer", "installed", "reset_envs", "unavailable_reason"]

#: The implementations vecaccel is compared with, in the order they are measured. ``raw`` is
#: one plain env in a loop; ``ceiling`` one such process per usable CPU, summed.
PEERS: tuple[str, ...] = (
    "raw",
    "ceiling",
    "gym-sync",
    "gym-async",
    "sb3-subproc",
    "sb3-dummy",
    "envpool",
)


def installed(module: str) -> bool:
    """Whether ``module`` can be imported here, without importing it.

    Example:
        >>> installed("gymnasium"), installed("no_such_module_here")
        (True, False)
    """
    return importlib.util.find_spec(module) is not None


def unavailable_reason(peer: str, target: BenchEnv) -> str | None:
    """Why ``peer`` cannot run here, or ``None`` when it can.

    Example:
        >>> from vecaccel.bench.workloads import resolve_env
        >>> unavailable_reason("gym-sync", resolve_env("CartPole-v1")) is None
        True
    """
    if peer in ("sb3-subproc", "sb3-dummy") and not installed("stable_baselines3"):
        return "stable-baselines3 is not installed"
    if peer == "envpool":
        if not installed("envpool"):
            return "envpool is not installed"
        if target.envpool_id is None:
            return f"envpool has no equivalent of {target.label}"
    return None


def build_peer(peer: str, target: BenchEnv, num_envs: int, seed: int) -> Any:
    """Build the vector env of a peer implementation.

    Args:
        peer: a name from :data:`PEERS` other than ``"raw"`` and ``"ceiling"``.
        target: the env to vectorize.
        num_envs: how many copies.
        seed: EnvPool's seed (the others are seeded at reset).

    Returns:
        The peer's vector env (Gymnasium's, SB3's or EnvPool's).

    Raises:
        ValueError: for an unknown peer.
    """
    env_fns = [target.env_fn] * num_envs
    if peer == "gym-sync":
        return gym.vector.SyncVectorEnv(env_fns)
    if peer == "gym-async":
        return gym.vector.AsyncVectorEnv(env_fns)
    if peer == "sb3-subproc":
        import multiprocessing

        from stable_baselines3.common.vec_env import SubprocVecEnv

        # SB3's default, forkserver, makes every worker import torch afresh (SB3 imports it
        # everywhere): some 170 MB and seconds of CPU per worker, ~40 GB at 256 envs. The start
        # method changes start-up and memory, not stepping, so fork it like Gymnasium's Async.
        fork = "fork" in multiprocessing.get_all_start_methods()
        return SubprocVecEnv(env_fns, start_method="fork" if fork else None)
    if peer == "sb3-dummy":
        from stable_baselines3.common.vec_env import DummyVecEnv

        return DummyVecEnv(env_fns)
    if peer == "envpool":
        import envpool

        return envpool.make_gymnasium(
            target.envpool_id,
            num_envs=num_envs,
            batch_size=num_envs,
            seed=seed,
            **target.envpool_kwargs,
        )
    raise ValueError(f"unknown peer {peer!r}; known: {', '.join(PEERS)}")


def reset_envs(envs: Any, impl: str, seed: int) -> None:
    """Reset a vector env built by :func:`build_peer` or ``make_vec`` with ``seed``, each its way."""
    if impl.startswith("sb3-"):
        envs.seed(seed)
        envs.reset()
    elif impl == "envpool":
        envs.reset()  # EnvPool takes its seed when it is made
    else:
        envs.reset(seed=seed)
