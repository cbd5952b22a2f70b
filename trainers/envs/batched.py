"""Batched simulators as a trainer's envs: one vector env per worker over its slice of the envs.

Two sources, both ``NextStep`` autoreset (the only mode they have), both built by
``make_vec(..., vectorized=True)`` (see :mod:`vecaccel.envs.vectorized_slices`):

* ``vectorized=True``: the id's Gymnasium ``vector_entry_point`` (:class:`EntryPointVectorFn`);
* ``env_source="envpool"``: an Atari game's frames from EnvPool with the ALE route's
  preprocessing (:func:`envpool_atari_fn`), or a MuJoCo task's EnvPool twin
  (:func:`envpool_mujoco_fn`).

Example:
    >>> envpool_task_id("ALE/Pong-v5")
    'Pong-v5'
"""

from __future__ import annotations

from collections.abc import Callable

import gymnasium as gym

from vecaccel.envs.vectorized_slices import require_vector_entry_point

__all__ = [
    "EntryPointVectorFn",
    "batched_env_fn",
    "envpool_atari_fn",
    "envpool_mujoco_fn",
    "envpool_task_id",
]


class EntryPointVectorFn:
    """A picklable vector env function: ``EntryPointVectorFn(env_id)(n)`` is the id's Gymnasium
    ``vector_entry_point`` env of ``n`` envs, with Gymnasium's vector
    ``RecordEpisodeStatistics`` (``info["episode"]`` and its ``_episode`` mask).

    Raises:
        ValueError: if ``env_id`` is unknown or registers no ``vector_entry_point``.

    Example:
        >>> envs = EntryPointVectorFn("CartPole-v1")(3)
        >>> envs.num_envs, envs.metadata["autoreset_mode"].value
        (3, 'NextStep')
        >>> envs.close()
    """

    def __init__(self, env_id: str) -> None:
        require_vector_entry_point(
            env_id, "a batched simulator of its own: train it without vectorized=True"
        )
        self.env_id = env_id

    def __call__(self, num_envs: int) -> gym.vector.VectorEnv:
        from vecaccel.manager import register_envs

        register_envs()
        envs = gym.make_vec(self.env_id, num_envs, vectorization_mode="vector_entry_point")
        return gym.wrappers.vector.RecordEpisodeStatistics(envs)

    def __repr__(self) -> str:
        return f"EntryPointVectorFn({self.env_id!r})"


def envpool_task_id(env_id: str) -> str:
    """EnvPool's task id of the Atari game a Gymnasium ALE id names.

    Example:
        >>> envpool_task_id("ALE/Pong-v5"), envpool_task_id("BreakoutNoFrameskip-v4")
        ('Pong-v5', 'Breakout-v5')
    """
    name = env_id.removeprefix("ALE/")
    game = name.split("-v", 1)[0]
    for suffix in ("NoFrameskip", "Deterministic"):
        game = game.removesuffix(suffix)
    if not game or not game.isidentifier():
        raise ValueError(f"{env_id!r} names no Atari game that EnvPool could have")
    return f"{game}-v5"


def envpool_atari_fn(env_id: str, training: bool = True) -> Callable[[int], gym.vector.VectorEnv]:
    """The vector env function of EnvPool's pool of the Atari game ``env_id`` names, with the
    preprocessing of :func:`~vecaccel.trainers.envs.make.make_atari_env`: 84x84 grey, frame skip 4 with max-pooling, a
    stack of 4, up to 30 no-op starts, and in training life-loss terminals (the game goes on) and
    clipped rewards; ``info["episode"]`` holds true scores of whole games either way.

    Sticky actions follow the id: ``ALE/*-v5`` ids repeat the last action with probability 0.25
    as Gymnasium's do, the ``*-v4`` ids never. EnvPool's FIRE at reset is off, as in the ALE
    route. Each pool steps its envs on one thread: a worker is one core. EnvPool is imported
    when a pool is built (``pip install 'vecaccel[envpool]'``).

    Example:
        >>> envpool_atari_fn("PongNoFrameskip-v4")
        envpool_vector_fn('Pong-v5', **{... 'episodic_life': True, 'reward_clip': True, ...})
    """
    from vecaccel.adapters.envpool import envpool_vector_fn

    sticky = 0.25 if env_id.startswith("ALE/") and env_id.endswith("-v5") else 0.0
    return envpool_vector_fn(
        envpool_task_id(env_id),
        num_threads=1,
        episode_scores=True,
        episodic_life=training,
        reward_clip=training,
        noop_max=30,
        frame_skip=4,
        stack_num=4,
        img_height=84,
        img_width=84,
        gray_scale=True,
        use_fire_reset=False,
        repeat_action_probability=sticky,
    )


def envpool_mujoco_fn(env_id: str) -> Callable[[int], gym.vector.VectorEnv]:
    """The vector env function of EnvPool's twin of Gymnasium's MuJoCo task ``env_id``
    (``Hopper-v5``, ``Ant-v4``...: EnvPool names its MuJoCo tasks as Gymnasium does), with
    ``info["episode"]`` at each episode's end. EnvPool's envs follow Gymnasium's of the same
    version (spaces, rewards, terminations, the 1,000-step time limit as a truncation); their
    actions are float64 where Gymnasium's are float32. Each pool steps its envs on one
    thread: a worker is one core.

    Example:
        >>> envpool_mujoco_fn("Hopper-v5")
        envpool_vector_fn('Hopper-v5', **{'num_threads': 1, 'episode_scores': True})
    """
    from vecaccel.adapters.envpool import envpool_vector_fn

    return envpool_vector_fn(env_id, num_threads=1, episode_scores=True)


def batched_env_fn(
    env_id: str, atari: bool | None, training: bool, env_source: str
) -> Callable[[int], gym.vector.VectorEnv]:
    """The vector env function of a batched source (``vectorized``, or ``env_source="envpool"``;
    see :func:`~vecaccel.trainers.envs.make.training_vector_fn`): EnvPool's pool
    of an Atari game or a MuJoCo task, or the id's Gymnasium ``vector_entry_point`` env; built
    without making an env, so that a source the env cannot have is refused early.

    Raises:
        ValueError: EnvPool for an id that is neither an Atari game nor a MuJoCo task, or not
            installed;
            ``vectorized`` for an Atari game from the ALE, or an id without a
            ``vector_entry_point``.

    Example:
        >>> batched_env_fn("CartPole-v1", None, True, "gymnasium")
        EntryPointVectorFn('CartPole-v1')
    """
    from vecaccel.trainers.envs.make import is_atari_id, is_mujoco_id

    if env_source == "envpool":
        game = bool(atari) or (atari is None and is_atari_id(env_id))
        mujoco = not atari and is_mujoco_id(env_id)
        if not (game or mujoco):
            raise ValueError(
                f"env_source='envpool' takes Atari games' frames and MuJoCo tasks from EnvPool; "
                f"{env_id} is neither (for another EnvPool task, hand "
                "vecaccel.adapters.envpool.envpool_vector_fn to make_vec(..., vectorized=True) "
                "and train on that vector env)"
            )
        import importlib.util

        if importlib.util.find_spec("envpool") is None:
            raise ValueError(
                "env_source='envpool': EnvPool is not installed: pip install 'vecaccel[envpool]' "
                "(EnvPool publishes wheels for Linux x86_64 and aarch64)"
            )
        return envpool_atari_fn(env_id, training) if game else envpool_mujoco_fn(env_id)
    if atari or (atari is None and is_atari_id(env_id)):
        raise ValueError(
            f"vectorized=True with the Atari game {env_id}: its batched frames come from EnvPool, "
            "with the standard preprocessing: pass env_source='envpool' (--env-source envpool)"
        )
    return EntryPointVectorFn(env_id)
