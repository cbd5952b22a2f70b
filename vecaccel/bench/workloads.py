"""What ``vecaccel bench`` measures: the environments and how every implementation builds them.

An env is a :class:`BenchEnv`: a picklable env function for the process-based implementations,
the argument ``vecaccel.make_vec`` takes, and EnvPool's twin task where one has the same dynamics.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import gymnasium as gym

__all__ = ["BenchEnv", "make_gym_env", "make_pong_env", "resolve_env"]


def make_gym_env(env_id: str) -> gym.Env:
    """``gym.make(env_id)``, registering installed packages' envs first only when needed.

    The peers' worker processes call this too. Gymnasium's built-in ids (CartPole) need no
    registration, so under ``spawn`` or ``forkserver`` those workers never import vecaccel's
    plugins: the peers are not charged for vecaccel's start-up.

    Example:
        >>> env = make_gym_env("CartPole-v1")
        >>> env.spec.id
        'CartPole-v1'
        >>> env.close()
    """
    if env_id not in gym.registry:
        from vecaccel.manager import register_envs

        register_envs()
    return gym.make(env_id)


def make_pong_env(noop_max: int = 30, frame_skip: int = 4, screen_size: int = 84) -> gym.Env:
    """Build the ``pong`` preset: Gymnasium ``AtariPreprocessing`` over ``PongNoFrameskip-v4``.

    84x84 grayscale frames, a frame skip of 4 (max-pooled over the last two frames) and up to 30
    no-ops at reset. It is a module-level function, so it pickles by reference and works under
    the ``spawn`` and ``forkserver`` start methods; it registers the ALE ids itself, so worker
    processes need nothing else.

    Args:
        noop_max: most no-op actions taken at reset.
        frame_skip: frames per step.
        screen_size: side of the square grayscale observation.

    Returns:
        The wrapped env (observation ``Box(0, 255, (84, 84), uint8)``, 6 actions).

    Raises:
        ImportError: if ``ale-py`` is not installed (``pip install vecaccel[atari]``).

    Example:
        >>> env = make_pong_env()  # doctest: +SKIP
        >>> env.observation_space.shape  # doctest: +SKIP
        (84, 84)
    """
    import ale_py
    from gymnasium.wrappers import AtariPreprocessing

    gym.register_envs(ale_py)
    env = gym.make("PongNoFrameskip-v4")
    return AtariPreprocessing(
        env,
        noop_max=noop_max,
        frame_skip=frame_skip,
        screen_size=screen_size,
        grayscale_obs=True,
    )


@dataclass(frozen=True)
class BenchEnv:
    """One environment to benchmark and how each implementation builds it.

    Attributes:
        label: the name shown in tables and plots.
        env_fn: a picklable zero-argument function returning one ``gymnasium.Env``.
        make_vec_arg: what ``vecaccel.make_vec`` receives (the Gymnasium id, or ``env_fn``).
        envpool_id: the EnvPool task with the same dynamics, or ``None`` when there is none.
        envpool_kwargs: keyword arguments that make the EnvPool task match ``env_fn``.
    """

    label: str
    env_fn: Callable[[], gym.Env]
    make_vec_arg: Any
    envpool_id: str | None = None
    envpool_kwargs: dict[str, Any] = field(default_factory=dict)


#: Gymnasium ids whose EnvPool task of the same name has the same dynamics and time limit
#: (EnvPool's MuJoCo v5 tasks take Gymnasium v5's defaults: models, frame skips, rewards).
_ENVPOOL_TWINS: dict[str, tuple[str, dict[str, Any]]] = {
    "CartPole-v1": ("CartPole-v1", {}),
    **{
        name: (name, {})
        for name in ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5")
    },
}

#: EnvPool settings matching :func:`make_pong_env` (no life loss, raw rewards, no sticky actions).
_PONG_ENVPOOL_KWARGS: dict[str, Any] = {
    "episodic_life": False,
    "reward_clip": False,
    "stack_num": 1,
    "img_height": 84,
    "img_width": 84,
    "frame_skip": 4,
    "noop_max": 30,
    "repeat_action_probability": 0.0,
    "use_fire_reset": False,  # AtariPreprocessing does not press FIRE at reset
}


def resolve_env(name: str) -> BenchEnv:
    """Turn ``--env`` into a :class:`BenchEnv`: the ``pong`` preset or a Gymnasium id.

    Args:
        name: ``"pong"`` (case-insensitive) or any registered Gymnasium id.

    Returns:
        The environment description.

    Raises:
        ValueError: if ``name`` is neither the preset nor a registered id.

    Example:
        >>> target = resolve_env("CartPole-v1")
        >>> target.label, target.envpool_id
        ('CartPole-v1', 'CartPole-v1')
        >>> resolve_env("pong").envpool_id
        'Pong-v5'
    """
    if name.lower() == "pong":
        return BenchEnv(
            label="pong",
            env_fn=make_pong_env,
            make_vec_arg=make_pong_env,
            envpool_id="Pong-v5",
            envpool_kwargs=dict(_PONG_ENVPOOL_KWARGS),
        )
    from vecaccel.manager import register_envs

    register_envs()
    if name not in gym.registry:
        raise ValueError(f"unknown environment {name!r}: use 'pong' or a registered Gymnasium id")
    twin_id, twin_kwargs = _ENVPOOL_TWINS.get(name, (None, {}))
    return BenchEnv(
        label=name,
        env_fn=functools.partial(make_gym_env, name),
        make_vec_arg=name,
        envpool_id=twin_id,
        envpool_kwargs=dict(twin_kwargs),
    )
