"""Which named settings (presets) each trainer has, and the env ids each preset is made for.

A preset is a dict of config values: ``PRESETS`` in :mod:`~vecaccel.trainers.algos.ppo`,
:mod:`~vecaccel.trainers.algos.a2c` and :mod:`~vecaccel.trainers.algos.dqn_presets`. :data:`ENV_PRESETS`
below is the one table that says which env ids each preset suits; a run on such an id that names
no preset starts from it (``PPO("CartPole-v1")``, ``vecaccel train ppo --env CartPole-v1``).
Explicit settings always win over a preset's, and ``preset=None`` (``--preset none``) gives the
plain defaults.

Example:
    >>> preset_for_env("ppo", "CartPole-v1"), preset_for_env("dqn", "CartPole-v1")
    ('cartpole', 'cartpole')
    >>> preset_for_env("rainbow", "CartPole-v1"), preset_for_env("ppo", "Acrobot-v1") is None
    ('cartpole-rainbow', True)
    >>> resolve_preset("ppo", {"cartpole": {}}, "auto", "CartPole-v1")
    'cartpole'
    >>> resolve_preset("ppo", {"cartpole": {}}, "none", "CartPole-v1") is None
    True
"""

from __future__ import annotations

import logging
from typing import Any

#: Says, at INFO, which preset a run took by itself (the CLI prints the same on stdout).
logger = logging.getLogger(__name__)

__all__ = [
    "ATARI",
    "AUTO",
    "ENV_PRESETS",
    "NONE",
    "apply_preset",
    "preset_for_env",
    "resolve_preset",
    "suited_env_ids",
]

#: ``preset=AUTO`` (the default): the preset made for the env id trained on, if it has one.
AUTO = "auto"
#: ``preset=NONE`` or ``None``: no preset, the algorithm's plain defaults.
NONE = "none"
#: Stands for every ALE game id in :data:`ENV_PRESETS` (``ALE/Pong-v5``,
#: ``PongNoFrameskip-v4``...), as :func:`~vecaccel.trainers.envs.is_atari_id` decides.
ATARI = "<every ALE id>"

#: algorithm -> preset -> the env ids the preset is made for. The first preset that suits an env
#: id is the one a run on it starts from when it names none; a preset missing here
#: (``atari-large``) is only ever applied by name.
ENV_PRESETS: dict[str, dict[str, tuple[str, ...]]] = {
    "ppo": {"cartpole": ("CartPole-v1",), "atari": (ATARI,)},
    "a2c": {"cartpole": ("CartPole-v1",), "atari": (ATARI,)},
    "dqn": {"cartpole": ("CartPole-v1",), "atari-dqn": (ATARI,)},
    "c51": {"cartpole-c51": ("CartPole-v1",), "atari-c51": (ATARI,)},
    "rainbow": {"cartpole-rainbow": ("CartPole-v1",), "atari-rainbow": (ATARI,)},
}


def suited_env_ids(algo: str, preset: str) -> tuple[str, ...]:
    """The env ids ``algo``'s ``preset`` is made for (:data:`ATARI`: every ALE game).

    Example:
        >>> suited_env_ids("ppo", "cartpole"), suited_env_ids("ppo", "atari-large")
        (('CartPole-v1',), ())
    """
    return ENV_PRESETS.get(algo, {}).get(preset, ())


def preset_for_env(algo: str, env_id: str) -> str | None:
    """The preset of ``algo`` made for ``env_id``, or ``None`` when it has none."""
    from vecaccel.trainers.envs import is_atari_id

    atari: bool | None = None  # resolving an id can import ale_py: only when a preset asks
    for preset, env_ids in ENV_PRESETS.get(algo, {}).items():
        if env_id in env_ids:
            return preset
        if ATARI in env_ids:
            if atari is None:
                atari = is_atari_id(env_id)
            if atari:
                return preset
    return None


def resolve_preset(
    algo: str, presets: dict[str, Any], preset: str | None, env_id: str | None
) -> str | None:
    """The name of the preset a new run applies, or ``None`` for the plain defaults.

    Args:
        algo: the algorithm's name (``ppo``, ``dqn``...).
        presets: the algorithm's named settings.
        preset: a name in ``presets``; :data:`AUTO` for the one made for ``env_id``; ``None``
            or :data:`NONE` for none.
        env_id: the env id the run trains on, if the caller named one.

    Raises:
        ValueError: ``preset`` is none of these, naming the choices.
    """
    if preset is None or preset == NONE:
        return None
    if preset == AUTO:
        return None if env_id is None else preset_for_env(algo, env_id)
    if preset not in presets:
        choices = ", ".join(repr(name) for name in sorted(presets))
        raise ValueError(
            f"unknown preset {preset!r} for {algo}; choose one of {choices}, {NONE!r} (the plain "
            f"defaults) or {AUTO!r} (the preset made for the env id, if any)"
        )
    return preset


def apply_preset(
    algo: str,
    presets: dict[str, Any],
    base: dict[str, Any],
    preset: str | None,
    env_id: str | None,
    explicit: dict[str, Any],
) -> dict[str, Any]:
    """``base`` (defaults), then the preset's values, then ``explicit``'s, with the preset's
    name recorded under ``"preset"`` (``None``: none applied).

    Example:
        >>> named = {"cartpole": {"num_envs": 8, "gamma": 0.98}}
        >>> apply_preset("ppo", named, {"gamma": 0.99}, "auto", "CartPole-v1", {"num_envs": 2})
        {'gamma': 0.98, 'num_envs': 2, 'preset': 'cartpole'}
    """
    name = resolve_preset(algo, presets, preset, env_id)
    if preset == AUTO and name is not None:
        logger.info(
            "%s on %s starts from the preset %r, made for it (preset=None: the plain defaults)",
            algo,
            env_id,
            name,
        )
    values = {**base, **(presets[name] if name is not None else {}), **explicit}
    values["preset"] = name
    return values
