"""Registers the Gymnasium environments of installed packages (ale-py, MinAtar) through the
plugin hook, so that their ids work in ``make_vec`` and the trainers without the user's own
``gym.register_envs(...)`` line, in the caller and in every worker."""

from __future__ import annotations

import importlib.util

from vecaccel import hookimpl

#: MinAtar's games, as its ids spell them (``MinAtar/<Game>-v0``) and as its modules do.
MINATAR_GAMES = {
    "Asterix": "asterix",
    "Breakout": "breakout",
    "Freeway": "freeway",
    "Seaquest": "seaquest",
    "SpaceInvaders": "space_invaders",
}


def register_minatar() -> None:
    """Register ``MinAtar/<Game>-v0`` (all 6 actions) and ``-v1`` (the game's minimal action
    set) exactly as ``minatar.gym.register_envs`` does, without importing MinAtar (which
    imports matplotlib and seaborn): the entry point loads it when an env is made."""
    import gymnasium as gym

    for game, module in MINATAR_GAMES.items():
        for version, minimal in (("v0", False), ("v1", True)):
            env_id = f"MinAtar/{game}-{version}"
            if env_id not in gym.registry:
                gym.register(
                    id=env_id,
                    entry_point="minatar.gym:BaseEnv",
                    kwargs=dict(game=module, use_minimal_action_set=minimal),
                )


@hookimpl
def vecaccel_register_envs() -> None:
    if importlib.util.find_spec("minatar") is not None:
        register_minatar()
    try:
        import ale_py
    except ImportError:
        return
    import gymnasium as gym

    gym.register_envs(ale_py)
