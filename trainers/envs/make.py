"""The envs trainers sample from: the standard Atari set-up, classic-control envs, and
PettingZoo parallel envs named by their module path (one row per agent, a shared policy).

Batched simulators come in two ways, both one vector env per worker over its slice of the envs
(``make_vec(..., vectorized=True)``), both ``NextStep`` autoreset: ``vectorized=True`` builds an
id through its Gymnasium ``vector_entry_point``, and ``env_source="envpool"`` takes an Atari
game's frames from EnvPool with the preprocessing of :func:`make_atari_env`; see
:mod:`vecaccel.trainers.envs.batched`.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from typing import Any

import gymnasium as gym

from vecaccel.envs.env_fns import EnvCall
from vecaccel.envs.source import EnvSource
from vecaccel.trainers.envs.batched import batched_env_fn

__all__ = [
    "EpisodicLifeEnv",
    "action_start",
    "agents_per_env",
    "backend_options_of",
    "check_tensor_spaces",
    "env_spaces",
    "is_atari_id",
    "is_minatar_id",
    "is_mujoco_id",
    "make_atari_env",
    "make_env_fn",
    "make_env_for_training",
    "make_envs_for_config",
    "make_recorded_env",
    "parallel_env_spaces",
    "training_env_source",
    "training_vector_fn",
]


@functools.lru_cache(maxsize=16)
def _parallel_env_facts(env_id: str) -> tuple[int, gym.Space, gym.Space]:
    source = EnvSource.resolve(env_id, 1)  # the one env it makes is read, then closed
    source.close_unused()
    assert source.observation_space is not None and source.action_space is not None
    return len(source.agents), source.observation_space, source.action_space


def agents_per_env(env_id: str | None) -> int:
    """Rows per env of ``env_id`` in a trainer's vector env: the number of agents of a
    PettingZoo env (one row each), 1 for a Gymnasium id (read without making an env)."""
    if not EnvSource.is_module_path(env_id):
        return 1
    assert env_id is not None
    return _parallel_env_facts(env_id)[0]


def parallel_env_spaces(env_id: str) -> tuple[gym.Space, gym.Space]:
    """The observation and action space of the agents of the PettingZoo env ``env_id`` (the
    first agent's; ``vecaccel.make_vec`` refuses envs whose agents' spaces differ)."""
    _, observation_space, action_space = _parallel_env_facts(env_id)
    return observation_space, action_space


def is_atari_id(env_id: str) -> bool:
    """Whether ``env_id`` names an ALE game (``ALE/Pong-v5``, ``PongNoFrameskip-v4``...).

    Example:
        >>> is_atari_id("PongNoFrameskip-v4"), is_atari_id("CartPole-v1")
        (True, False)
    """
    if env_id.startswith("ALE/"):
        return True
    entry = _entry_point(env_id)
    return entry.startswith("ale_py") or "AtariEnv" in entry


def is_mujoco_id(env_id: str) -> bool:
    """Whether ``env_id`` names one of Gymnasium's MuJoCo envs (``Hopper-v5``, ``Ant-v4``...).

    Example:
        >>> is_mujoco_id("Hopper-v5"), is_mujoco_id("Pendulum-v1")
        (True, False)
    """
    return _entry_point(env_id).startswith("gymnasium.envs.mujoco")


def _entry_point(env_id: str) -> str:
    """The registered entry point of ``env_id`` as a string (the ids of the plugins and
    MinAtar registered first), ``""`` for an id Gymnasium cannot resolve or a callable one."""
    try:
        from vecaccel.manager import register_envs

        register_envs()
        spec = gym.spec(env_id)
    except Exception:  # noqa: BLE001 - an id Gymnasium cannot resolve is neither kind
        return ""
    return spec.entry_point if isinstance(spec.entry_point, str) else ""


def is_minatar_id(env_id: str) -> bool:
    """Whether ``env_id`` names a MinAtar game (``MinAtar/Breakout-v0``...), in any letter case.

    Example:
        >>> is_minatar_id("MinAtar/Breakout-v1"), is_minatar_id("ALE/Breakout-v5")
        (True, False)
    """
    return env_id.lower().startswith("minatar/")


def check_tensor_spaces(
    trainer: str, observation_space: gym.Space | None, action_space: gym.Space | None
) -> None:
    """Raise ``TypeError`` if either space has a leaf with no fixed size (``Text``, ``Graph``,
    ``Sequence``, ``OneOf``, a ``Space`` subclass vecaccel does not know), naming its path.

    Every vecaccel backend but ``action_server`` steps such envs, batched as Gymnasium's
    ``SyncVectorEnv`` batches them; the trainers' networks and buffers need fixed-shape tensors.
    The check is :func:`vecaccel.spaces.payload.require_fixed_layout`'s.

    Example:
        >>> check_tensor_spaces("PPO", gym.spaces.Box(0, 1, (3,)), gym.spaces.Discrete(2))
        >>> sequence = gym.spaces.Sequence(gym.spaces.Discrete(3))
        >>> try:
        ...     check_tensor_spaces("PPO", gym.spaces.Tuple((sequence,)), gym.spaces.Discrete(2))
        ... except TypeError as exc:
        ...     print(str(exc).split(": ")[1].split(". ")[0])
        Sequence(Discrete(3), stack=False)
    """
    from vecaccel.spaces.payload import require_fixed_layout

    for kind, space in (("observation", observation_space), ("action", action_space)):
        if space is not None:
            require_fixed_layout(space, trainer, kind)


class EpisodicLifeEnv(gym.Wrapper):
    """End the episode (``terminated=True``) when a life is lost, without resetting the game.

    Gymnasium's ``AtariPreprocessing(terminal_on_life_loss=True)`` restarts the whole game at
    the next ``reset`` after a life is lost, so the agent would never play past its first life.
    DeepMind's (and SB3's) ``EpisodicLifeEnv`` instead only *signals* the end for value
    bootstrapping and continues the same game with a no-op step. Gymnasium does not ship that
    wrapper, so this is the one piece of Atari set-up vecaccel adds; use it for training only.
    """

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.lives = 0
        self.game_over = True

    def step(self, action: Any):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.game_over = bool(terminated or truncated)
        lives = self.env.unwrapped.ale.lives()
        if 0 < lives < self.lives:
            terminated = True
        self.lives = lives
        return obs, reward, terminated, truncated, info

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        if self.game_over or seed is not None:
            obs, info = self.env.reset(seed=seed, options=options)
        else:
            obs, _, terminated, truncated, info = self.env.step(0)
            if terminated or truncated:
                obs, info = self.env.reset(seed=seed, options=options)
        self.game_over = False
        self.lives = self.env.unwrapped.ale.lives()
        return obs, info


def make_atari_env(
    env_id: str,
    training: bool = True,
    frame_stack: int = 4,
    render_mode: str | None = None,
) -> gym.Env:
    """The standard Atari set-up of ``env_id`` from Gymnasium's wrappers.

    ``RecordEpisodeStatistics`` (innermost, so ``info["episode"]`` holds real, unclipped game
    scores) → ``AtariPreprocessing`` (no-op reset, frame skip 4 with max-pooling, 84x84 gray)
    → in training: :class:`EpisodicLifeEnv` and ``ClipReward(-1, 1)`` → ``FrameStackObservation(4)``.

    Args:
        env_id: an ALE id; ``ALE/*-v5`` ids are made with ``frameskip=1`` because
            ``AtariPreprocessing`` does the skipping (their sticky actions stay on).
        training: add the training-only wrappers (life-loss terminal, reward clipping).
        frame_stack: frames stacked along the first axis.
        render_mode: passed to ``gymnasium.make`` (``"rgb_array"`` for videos).
    """
    from vecaccel.manager import register_envs

    register_envs()
    kwargs: dict[str, Any] = {}
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    if gym.spec(env_id).kwargs.get("frameskip", 1) != 1:
        kwargs["frameskip"] = 1
    env = gym.make(env_id, **kwargs)
    env = gym.wrappers.RecordEpisodeStatistics(env)
    env = gym.wrappers.AtariPreprocessing(
        env, noop_max=30, frame_skip=4, screen_size=84, grayscale_obs=True
    )
    if training:
        env = EpisodicLifeEnv(env)
        env = gym.wrappers.ClipReward(env, -1.0, 1.0)
    return gym.wrappers.FrameStackObservation(env, frame_stack)


def make_recorded_env(env_id: str, render_mode: str | None = None, **kwargs: Any) -> gym.Env:
    """``gymnasium.make(env_id)`` with ``RecordEpisodeStatistics``: a trainer's env of an id
    that is not an Atari game.

    Example:
        >>> env = make_recorded_env("CartPole-v1")
        >>> type(env).__name__
        'RecordEpisodeStatistics'
        >>> env.close()
    """
    from vecaccel.manager import register_envs

    register_envs()
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    with warnings.catch_warnings():
        if is_minatar_id(env_id):
            # MinAtar's -v0 (every action) and -v1 (the minimal set) are two settings of one
            # game; Gymnasium calls -v0 out of date only because a higher version exists
            warnings.filterwarnings("ignore", ".*is out of date", DeprecationWarning)
        env = gym.make(env_id, **kwargs)
    return gym.wrappers.RecordEpisodeStatistics(env)


def make_env_fn(
    env_id: str, atari: bool | None = None, training: bool = True, render_mode: str | None = None
) -> Callable[[], gym.Env]:
    """The picklable single-env function :func:`make_env_for_training` vectorizes: the Atari
    set-up (:func:`make_atari_env`) for an ALE game, else the id with its episode statistics
    (:func:`make_recorded_env`).

    Example:
        >>> make_env_fn("CartPole-v1")
        EnvCall(make_recorded_env, 'CartPole-v1')
        >>> make_env_fn("ALE/Pong-v5", atari=True, training=False)
        EnvCall(make_atari_env, 'ALE/Pong-v5', training=False)
    """
    if atari is None:
        atari = is_atari_id(env_id)
    options: dict[str, Any] = {} if render_mode is None else {"render_mode": render_mode}
    if atari:
        return EnvCall(make_atari_env, env_id, training=training, **options)
    return EnvCall(make_recorded_env, env_id, **options)


def env_spaces(env_id: str, atari: bool | None = None) -> tuple[gym.Space, gym.Space]:
    """The single-env observation and action space of ``env_id``, which an agent without envs
    builds its networks for: read from one env made as the training envs are
    (:func:`make_env_fn`), or a PettingZoo env's agents' spaces.

    Raises:
        ValueError: for an id that names no registered env, the env layer's one line
            (:meth:`EnvSource.check_id <vecaccel.envs.source.EnvSource.check_id>`).

    Example:
        >>> observation_space, action_space = env_spaces("CartPole-v1")
        >>> observation_space.shape, action_space
        ((4,), Discrete(2))
    """
    EnvSource.check_id(env_id)
    if EnvSource.is_module_path(env_id):
        return parallel_env_spaces(env_id)
    env = make_env_fn(env_id, atari)()
    try:
        return env.observation_space, env.action_space
    finally:
        env.close()


def backend_options_of(config: Any) -> dict[str, Any]:
    """The backend options a run's config asks for: its ``backend_options``, with
    ``num_workers`` from the config's own field where it is set (``serial`` has no workers).

    Args:
        config: a :class:`~vecaccel.trainers.config.settings.RunConfig`, or the dict of its values.

    Example:
        >>> backend_options_of({"backend": "shm", "num_workers": 2, "backend_options": {"context": "spawn"}})
        {'context': 'spawn', 'num_workers': 2}
    """
    values = config if isinstance(config, dict) else vars(config)
    options = dict(values.get("backend_options") or {})
    num_workers = int(values.get("num_workers") or 0)
    if num_workers > 0 and values.get("backend") != "serial":
        options.setdefault("num_workers", num_workers)
    return options


def training_vector_fn(
    env_id: str,
    atari: bool | None = None,
    training: bool = True,
    vectorized: bool = False,
    env_source: str = "gymnasium",
) -> Callable[[int], gym.vector.VectorEnv] | None:
    """The vector env function of the batched simulator that a trainer's settings ask for
    (``vectorized``, or ``env_source="envpool"``), ``None`` where the envs are made one by one;
    built without making an env, so that a source the env cannot have is refused before any
    process starts.

    Raises:
        ValueError: for an env id that names no registered env (:meth:`EnvSource.check_id
            <vecaccel.envs.source.EnvSource.check_id>`), an unknown ``env_source``, or a source
            an env cannot have (``atari`` or a batched source for a PettingZoo env; an Atari
            game with ``vectorized`` but not ``env_source="envpool"``; EnvPool for a non-Atari
            id).

    Example:
        >>> training_vector_fn("CartPole-v1") is None
        True
        >>> training_vector_fn("CartPole-v1", vectorized=True)
        EntryPointVectorFn('CartPole-v1')
    """
    from vecaccel.trainers.config.settings import env_source_name

    env_source = env_source_name(env_source)
    batched = bool(vectorized) or env_source == "envpool"
    # the trainers wrap an id in env functions of their own, which the env source cannot look
    # into: an unknown id is refused here, in the caller, not by each worker making its env
    EnvSource.check_id(env_id)
    if EnvSource.is_module_path(env_id):
        if atari:
            raise ValueError(
                f"atari=True (--atari): {env_id} is a PettingZoo env, not an Atari game"
            )
        if batched:
            raise ValueError(
                "vectorized=True and env_source='envpool' (--vectorized, --env-source envpool) "
                f"build Gymnasium ids; {env_id} is a PettingZoo env"
            )
        return None
    return batched_env_fn(env_id, atari, training, env_source) if batched else None


def training_env_source(
    env_id: str,
    num_envs: int,
    atari: bool | None = None,
    autoreset_mode: str | None = None,
    training: bool = True,
    vectorized: bool = False,
    env_source: str = "gymnasium",
) -> EnvSource:
    """The env source a trainer builds its vector env from: the arguments as
    :func:`make_env_for_training` takes them (``autoreset_mode``: the one the vector env
    function of a batched source must have, ``NextStep`` where ``None``); a batched source is
    one whose ``vectorized`` is set.

    Raises:
        ValueError: as :func:`training_vector_fn`.

    Example:
        >>> source = training_env_source("CartPole-v1", 2)
        >>> source.num_envs, source.multiagent, source.vectorized
        (2, False, False)
    """
    vector_fn = training_vector_fn(env_id, atari, training, vectorized, env_source)
    if vector_fn is not None:
        return EnvSource.resolve(
            vector_fn, num_envs, vectorized=True, autoreset_mode=autoreset_mode or "NextStep"
        )
    if EnvSource.is_module_path(env_id):
        return EnvSource.resolve(env_id, num_envs)
    return EnvSource.resolve([make_env_fn(env_id, atari, training)] * num_envs)


def make_envs_for_config(config: Any, env_id: str, **options: Any) -> gym.vector.VectorEnv:
    """The training envs of ``env_id`` that a run's config asks for: its backend with its
    ``backend_options`` (which win over ``options``), its seed and env settings, and its
    ``autoreset_mode`` (``SameStep`` where it has none) unless the source is a batched
    simulator (``NextStep``, the only mode those have).

    Args:
        config: an algorithm's config (``num_envs``, ``backend``, ``seed``, ``vectorized``,
            ``env_source``; ``atari`` and ``autoreset_mode`` where it has them).
        env_id: a Gymnasium id, or the module path of a PettingZoo env.
        **options: backend options of the caller's own (the action server's device, say).
    """
    source = training_env_source(
        env_id,
        config.num_envs,
        atari=getattr(config, "atari", None),
        vectorized=config.vectorized,
        env_source=config.env_source,
    )
    return make_env_for_training(
        source,
        config.num_envs,
        backend=config.backend,
        seed=config.seed,
        autoreset_mode=None if source.vectorized else getattr(config, "autoreset_mode", "SameStep"),
        **{**options, **backend_options_of(config)},
    )


def make_env_for_training(
    env_id: str | EnvSource,
    num_envs: int,
    backend: str = "auto",
    seed: int | None = None,
    atari: bool | None = None,
    autoreset_mode: str | None = None,
    training: bool = True,
    vectorized: bool = False,
    env_source: str = "gymnasium",
    **backend_options: Any,
) -> gym.vector.VectorEnv:
    """Build the vectorized env a trainer samples from.

    Every env records episode statistics (``info["episode"]``, real scores for Atari); Atari
    envs get the standard set-up of :func:`make_atari_env`. A PettingZoo module path
    (:meth:`EnvSource.is_module_path <vecaccel.envs.source.EnvSource.is_module_path>`) gives ``num_envs`` copies of its ``parallel_env()`` with one
    row per agent (``num_envs * agents_per_env(env_id)`` rows), and no wrappers. Batched
    simulators (``vectorized``, ``env_source="envpool"``) give one vector env per worker.

    Args:
        env_id: a Gymnasium id, or the module path of a PettingZoo env; or an env source
            resolved already (:func:`training_env_source`), built as it is.
        num_envs: number of sub-environments (PettingZoo: envs, not rows).
        backend: a registered vecaccel backend (``auto``: chosen from one env's step cost).
        seed: seeds the batched action space; the sampler's first ``reset(seed=...)`` seeds the
            envs themselves.
        atari: force the Atari set-up on or off (``None``: detect from ``env_id``).
        autoreset_mode: Gymnasium autoreset mode (``None``: ``SameStep``, so that no step is
            wasted on a reset and ``info["final_obs"]`` gives the truncation bootstrap;
            ``NextStep`` for batched simulators, the only mode they have).
        training: include the training-only Atari wrappers (life-loss terminal, clipped reward).
        vectorized: build the id through its Gymnasium ``vector_entry_point``, one vector env
            per worker (:class:`~vecaccel.trainers.envs.batched.EntryPointVectorFn`); an Atari game needs
            ``env_source``.
        env_source: ``"gymnasium"`` (Gymnasium's registry, Atari games through the ALE) or
            ``"envpool"``: an Atari game's frames, or a MuJoCo task, from EnvPool's pools, one per
            worker (:func:`~vecaccel.trainers.envs.batched.envpool_atari_fn`,
            :func:`~vecaccel.trainers.envs.batched.envpool_mujoco_fn`).
        **backend_options: passed to the backend (``num_workers``, ``context``, ...).

    Returns:
        A ``gymnasium.vector.VectorEnv``.

    Raises:
        ValueError: for a batched source an env cannot have (a PettingZoo env; an Atari game
            with ``vectorized`` but not ``env_source="envpool"``; EnvPool for a non-Atari id).
    """
    import vecaccel

    source = env_id
    if not isinstance(source, EnvSource):
        source = training_env_source(
            source, num_envs, atari, autoreset_mode, training, vectorized, env_source
        )
    if autoreset_mode is None:
        autoreset_mode = "NextStep" if source.vectorized else "SameStep"
    envs = vecaccel.make_vec(
        source, num_envs, backend=backend, autoreset_mode=autoreset_mode, **backend_options
    )
    if seed is not None:
        envs.action_space.seed(seed)
    return envs


def action_start(space: Any) -> int:
    """``start`` of a ``Discrete`` space (0 for any other space, or none): the env's actions are
    ``start..start+n-1``, a network's outputs ``0..n-1``."""
    return int(space.start) if isinstance(space, gym.spaces.Discrete) else 0
