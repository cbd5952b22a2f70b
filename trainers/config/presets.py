"""Every algorithm's named settings (presets), and which preset a run on an env id starts from.

A preset is a dict of config values: :data:`PPO_PRESETS`, :data:`A2C_PRESETS`,
:data:`DQN_PRESETS` (which DQN, C51 and Rainbow share) and :data:`PQN_PRESETS`. Which env ids each preset is made for
is part of each algorithm's entry in :mod:`vecaccel.trainers.config.registry` (``made_for``); a run on
such an id that names no preset starts from it (``PPO("CartPole-v1")``, ``vecaccel train ppo
--env CartPole-v1``). Explicit settings always win over a preset's, and ``preset=None``
(``--preset none``) gives the plain defaults. Nothing here imports torch.

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

from vecaccel.trainers.config.registry import ALGORITHMS, ATARI, MINATAR

#: Says, at INFO, which preset a run took by itself (the CLI prints the same on stdout).
logger = logging.getLogger(__name__)

__all__ = [
    "A2C_PRESETS",
    "ATARI",
    "AUTO",
    "DQN_PRESETS",
    "ENV_PRESETS",
    "MINATAR",
    "NONE",
    "PPO_PRESETS",
    "PQN_PRESETS",
    "apply_preset",
    "check_preset_fits",
    "preset_for_env",
    "resolve_preset",
    "suited_env_ids",
]

#: ``preset=AUTO`` (the default): the preset made for the env id trained on, if it has one.
AUTO = "auto"
#: ``preset=NONE`` or ``None``: no preset, the algorithm's plain defaults.
NONE = "none"

#: algorithm -> preset -> the env ids the preset is made for, read from the registry's
#: ``made_for`` (:data:`ATARI`: every ALE game).
ENV_PRESETS: dict[str, dict[str, tuple[str, ...]]] = {
    name: dict(info.made_for) for name, info in ALGORITHMS.items()
}

# MinAtar's games step in about 5 µs, less than a worker's round trip: the envs run in the
# trainer's process and torch keeps every core (docs/minatar.md)
_MINATAR_BACKEND = "serial"

#: PPO's named settings: ``PPO(env, preset=NAME)`` and ``vecaccel train ppo --preset NAME``.
PPO_PRESETS: dict[str, dict[str, Any]] = {
    # rl-baselines3-zoo's hyperparams/ppo.yml for CartPole-v1 (n_envs 8, n_steps 32,
    # batch_size 256, gae_lambda 0.8, gamma 0.98, n_epochs 20, ent_coef 0, lin_1e-3, lin_0.2)
    "cartpole": dict(
        env_id="CartPole-v1",
        num_envs=8,
        num_steps=32,
        num_minibatches=1,
        update_epochs=20,
        gamma=0.98,
        gae_lambda=0.8,
        ent_coef=0.0,
        learning_rate=1e-3,
        anneal_lr=True,
        clip_coef=0.2,
        anneal_clip=True,
        clip_vloss=False,
        base_batch_size=256,
    ),
    # the standard Atari PPO (baselines, CleanRL ppo_atari.py): 8 envs x 128 steps
    "atari": dict(
        env_id="PongNoFrameskip-v4",
        num_envs=8,
        num_steps=128,
        learning_rate=2.5e-4,
        num_minibatches=4,
        update_epochs=4,
        clip_coef=0.1,
        ent_coef=0.01,
        # baselines and CleanRL weigh 0.5 x (0.5 x MSE); vecaccel's value loss is the plain MSE
        # (SB3's convention), so their weight on it is 0.25
        vf_coef=0.25,
        base_batch_size=1024,
        bf16="auto",  # bf16 autocast where the CPU or GPU has bf16 units
    ),
    # the seed paper's large-batch regime: many more envs per update, learning rate scaled
    # from the 1024-sample base (Stooke & Abbeel, 2018, section 4)
    "atari-large": dict(
        env_id="PongNoFrameskip-v4",
        num_envs=128,
        num_steps=128,
        learning_rate=2.5e-4,
        lr_scaling="sqrt",
        base_batch_size=1024,
        num_minibatches=16,
        update_epochs=4,
        clip_coef=0.1,
        ent_coef=0.01,
        vf_coef=0.25,  # CleanRL's value-loss weight, as in "atari"
        bf16="auto",
    ),
    # MinAtar's five games with one setting (as the MinAtar paper), in the seed paper's
    # large-batch regime: 256 envs x 32 steps = 8,192 samples an update, 4 epochs of 16
    # minibatches of 512; the learning rate, set for 4,096 samples, scaled by sqrt(batch / 4096)
    # (Stooke & Abbeel, 2018, section 4). The batch and minibatch choices: docs/minatar.md
    "minatar": dict(
        env_id="MinAtar/Breakout-v0",
        backend=_MINATAR_BACKEND,
        num_envs=256,
        num_steps=32,
        num_minibatches=16,
        update_epochs=4,
        learning_rate=5e-4,
        lr_scaling="sqrt",
        base_batch_size=4096,
        anneal_lr=True,
        gamma=0.99,
        gae_lambda=0.95,
        clip_coef=0.2,
        ent_coef=0.01,
        vf_coef=0.5,
        max_grad_norm=0.5,
        network="minatar",
        bf16="off",  # float32: docs/minatar.md, "bf16 and learning"
    ),
    # Gymnasium's MuJoCo locomotion tasks with one setting: CleanRL's ppo_continuous_action.py
    # update (a batch of 2,048 samples, 10 epochs of 32 minibatches of 64, Adam 3e-4 annealed,
    # GAE 0.95, clip 0.2, no entropy bonus, separate 64x64 tanh actor and critic, a
    # state-independent log-std, observations and rewards normalised and clipped at 10),
    # collected from 32 envs x 64 steps instead of one env x 2,048 so that the policy acts for
    # 32 envs at once; the learning rate, set for 2,048 samples, scales by
    # sqrt(batch / 2048) when the envs or steps change (Stooke & Abbeel, 2018, section 4)
    "mujoco": dict(
        env_id="Hopper-v5",
        num_envs=32,
        num_steps=64,
        num_minibatches=32,
        update_epochs=10,
        learning_rate=3e-4,
        lr_scaling="sqrt",
        base_batch_size=2048,
        anneal_lr=True,
        gamma=0.99,
        gae_lambda=0.95,
        clip_coef=0.2,
        clip_vloss=True,
        ent_coef=0.0,
        # CleanRL weighs 0.5 x (0.5 x MSE); vecaccel's value loss is the plain MSE
        vf_coef=0.25,
        max_grad_norm=0.5,
        network="mlp",
        hidden_sizes=(64, 64),
        activation="tanh",
        norm_obs=True,
        norm_reward=True,
    ),
}


#: A2C's named settings: ``A2C(env, preset=NAME)`` and ``vecaccel train a2c --preset NAME``.
A2C_PRESETS: dict[str, dict[str, Any]] = {
    # rl-baselines3-zoo's hyperparams/a2c.yml for CartPole-v1: n_envs 8, ent_coef 0, the rest
    # SB3's A2C defaults (n_steps 5, lr 7e-4 constant, gamma 0.99, gae_lambda 1)
    "cartpole": dict(
        env_id="CartPole-v1",
        num_envs=8,
        num_steps=5,
        ent_coef=0.0,
        learning_rate=7e-4,
        anneal_lr=False,
        base_batch_size=40,
    ),
    # the classic Atari A2C (baselines): 16 envs x 5 steps, RMSprop 7e-4, annealed
    "atari": dict(
        env_id="PongNoFrameskip-v4",
        num_envs=16,
        num_steps=5,
        learning_rate=7e-4,
        ent_coef=0.01,
        base_batch_size=80,
        bf16="auto",  # bf16 autocast where the CPU or GPU has bf16 units
    ),
    # the seed paper's large-batch A2C: 256 envs x 5 steps, learning rate scaled from the
    # 80-sample base (Stooke & Abbeel, 2018, section 4)
    "atari-large": dict(
        env_id="PongNoFrameskip-v4",
        num_envs=256,
        num_steps=5,
        learning_rate=7e-4,
        lr_scaling="sqrt",
        base_batch_size=80,
        ent_coef=0.01,
        bf16="auto",
    ),
    # MinAtar's five games with one setting, large batch: 128 envs x 5 steps, the classic
    # A2C learning rate (7e-4 at 16 x 5 = 80 samples) scaled by sqrt(640 / 80) as the seed
    # paper does
    "minatar": dict(
        env_id="MinAtar/Breakout-v0",
        backend=_MINATAR_BACKEND,
        num_envs=128,
        num_steps=5,
        learning_rate=7e-4,
        lr_scaling="sqrt",
        base_batch_size=80,
        gamma=0.99,
        ent_coef=0.01,
        network="minatar",
        bf16="off",  # float32: docs/minatar.md, "bf16 and learning"
    ),
    # Gymnasium's MuJoCo locomotion tasks with one setting: rl-baselines3-zoo's A2C for MuJoCo
    # (hyperparams/a2c.yml: SB3's A2C defaults, 5 steps, RMSprop 7e-4 constant, GAE 1, no
    # entropy bonus, observations normalised) on 32 envs, the learning rate scaled from the
    # classic 80-sample batch by sqrt(160 / 80) as the seed paper does; returns are scaled too,
    # as for PPO, since 32 envs of unscaled MuJoCo rewards swamp the value loss
    "mujoco": dict(
        env_id="Hopper-v5",
        num_envs=32,
        num_steps=5,
        learning_rate=7e-4,
        lr_scaling="sqrt",
        base_batch_size=80,
        anneal_lr=False,
        gamma=0.99,
        gae_lambda=1.0,
        ent_coef=0.0,
        network="mlp",
        hidden_sizes=(64, 64),
        activation="tanh",
        norm_obs=True,
        norm_reward=True,
    ),
}


# Atari settings of Stooke & Abbeel (2018), "Accelerated Methods for Deep RL": the Nature-DQN
# agent at replay ratio 8 with Adam, DQN at batch 512 and Categorical DQN at batch 2048, the
# learning rate scaled from its batch-32 value, and ε-Rainbow (Rainbow without noisy nets, so
# with ε-greedy exploration). Budgets are 50M env steps (200M frames) on 8 GPUs in the paper.
_ATARI_COMMON: dict[str, Any] = dict(
    num_envs=16,
    backend="shm",
    buffer_size=1_000_000,
    gamma=0.99,
    replay_ratio=8.0,
    learning_starts=80_000,
    target_update_period=40_000,
    start_epsilon=1.0,
    end_epsilon=0.01,
    exploration_steps=1_000_000,
    eval_epsilon=0.001,
    max_grad_norm=10.0,
    network="cnn",
    frame_stack=4,
    log_every_steps=10_000,
)

# tuned to solve CartPole-v1 within a CI budget on 2 CPU cores
_CARTPOLE: dict[str, Any] = dict(
    learning_rate=3.5e-4,
    base_batch_size=32,
    lr_scaling="sqrt",  # 3.5e-4 at batch 32 is 9.9e-4 at batch 256
    batch_size=256,
    buffer_size=20_000,
    replay_ratio=32.0,  # one update of 256 every 8 env steps
    learning_starts=500,
    target_update_period=500,
    exploration_fraction=0.15,
    end_epsilon=0.02,
    double=True,
    n_step=3,
    hidden_sizes=(128, 128),
    loss="mse",
)

# MinAtar's five games (Young & Tian, 2019), one setting for all: its DQN's schedule (replay of
# 100k, learning from 5k frames, ε from 1 to 0.1 over the first 100k frames, γ 0.99) in the seed
# paper's large-batch form: 64 envs, Adam, replay ratio 8 (8 samples trained on per env step),
# the learning rate scaled from its batch-32 value by sqrt(batch / 32) (Stooke & Abbeel, 2018,
# section 4), and the target network updated after as many samples as MinAtar's (1,000 updates
# of 32 = 32k samples, 4,000 env steps at replay ratio 8)
_MINATAR_COMMON: dict[str, Any] = dict(
    env_id="MinAtar/Breakout-v0",
    num_envs=64,
    backend=_MINATAR_BACKEND,
    buffer_size=100_000,
    gamma=0.99,
    replay_ratio=8.0,
    learning_starts=5_000,
    target_update_period=4_000,
    start_epsilon=1.0,
    end_epsilon=0.1,
    exploration_steps=100_000,
    eval_epsilon=0.0,
    max_grad_norm=10.0,
    network="minatar",
    bf16="off",  # as the on-policy MinAtar presets
    base_batch_size=32,
    lr_scaling="sqrt",
    log_every_steps=10_000,
)

#: The DQN family's named settings (DQN, C51 and Rainbow share them):
#: ``DQN(env, preset="atari-dqn", **overrides)`` and ``vecaccel train dqn --preset NAME``.
DQN_PRESETS: dict[str, dict[str, Any]] = {
    "cartpole": _CARTPOLE,
    # the settings above (Double, 3-step) with a categorical head whose support spans
    # CartPole's discounted returns, at most 100 at gamma 0.99 (``loss`` applies to expected
    # values only)
    "cartpole-c51": dict(_CARTPOLE, categorical=True, v_min=0.0, v_max=100.0),
    # ε-Rainbow with the settings above: Double, Dueling, 3-step, prioritized, C51 on [0, 100]
    "cartpole-rainbow": dict(
        _CARTPOLE,
        dueling=True,
        prioritized=True,
        priority_alpha=0.5,
        categorical=True,
        v_min=0.0,
        v_max=100.0,
    ),
    "atari-dqn": dict(
        _ATARI_COMMON,
        batch_size=512,
        base_batch_size=32,
        learning_rate=1e-4,
        lr_scaling="sqrt",
        adam_eps=1.5e-4,
        double=True,
    ),
    "atari-c51": dict(
        _ATARI_COMMON,
        categorical=True,
        batch_size=2048,
        base_batch_size=32,
        learning_rate=2.5e-4,
        lr_scaling="sqrt",
        adam_eps=0.01 / 32,
    ),
    "atari-rainbow": dict(
        _ATARI_COMMON,
        double=True,
        dueling=True,
        n_step=3,
        prioritized=True,
        priority_alpha=0.5,
        categorical=True,
        batch_size=512,
        base_batch_size=32,
        learning_rate=6.25e-5,
        lr_scaling="sqrt",
        adam_eps=1.5e-4,
    ),
    "minatar-dqn": dict(
        _MINATAR_COMMON,
        batch_size=512,
        learning_rate=1e-4,
        adam_eps=1.5e-4,
        double=True,
    ),
    # MinAtar's rewards are 0 or 1 a step and unclipped: discounted returns reach tens, so the
    # support spans [-10, 100] (as Obando-Ceron & Castro's MinAtar Rainbow, 2021)
    "minatar-c51": dict(
        _MINATAR_COMMON,
        categorical=True,
        v_min=-10.0,
        v_max=100.0,
        batch_size=2048,
        learning_rate=2.5e-4,
        adam_eps=0.01 / 32,
    ),
    "minatar-rainbow": dict(
        _MINATAR_COMMON,
        double=True,
        dueling=True,
        n_step=3,
        prioritized=True,
        priority_alpha=0.5,
        categorical=True,
        v_min=-10.0,
        v_max=100.0,
        batch_size=512,
        learning_rate=6.25e-5,
        adam_eps=1.5e-4,
    ),
}


#: PQN's named settings: ``PQN(env, preset=NAME)`` and ``vecaccel train pqn --preset NAME``.
#:
#: ``minatar``: purejaxql's MinAtar setting, one for all five games, from
#: ``purejaxql/config/alg/pqn_minatar.yaml`` (github.com/mttga/purejaxql, commit 47af6d7):
#: ``NUM_ENVS`` 128, ``NUM_STEPS`` 32, ``NUM_EPOCHS`` 2, ``NUM_MINIBATCHES`` 32, ``LAMBDA``
#: 0.65, ``GAMMA`` 0.99, ``LR`` 5e-4 with ``LR_LINEAR_DECAY``, ``MAX_GRAD_NORM`` 10,
#: ``EPS_START`` 1, ``EPS_FINISH`` 0.05 and ``EPS_DECAY`` 0.1 (of the updates),
#: ``NORM_TYPE`` layer_norm, ``EPS_TEST`` 0; and from its ``purejaxql/pqn_minatar.py``: RAdam,
#: half the squared error as the loss, and the MinAtar network with a LayerNorm after the
#: convolution and after the hidden layer. Its learning rate does not follow the batch size.
PQN_PRESETS: dict[str, dict[str, Any]] = {
    "minatar": dict(
        env_id="MinAtar/Breakout-v0",
        backend=_MINATAR_BACKEND,
        num_envs=128,
        num_steps=32,
        update_epochs=2,
        num_minibatches=32,
        q_lambda=0.65,
        gamma=0.99,
        learning_rate=5e-4,
        anneal_lr=True,
        lr_scaling="none",
        base_batch_size=4096,
        max_grad_norm=10.0,
        loss="mse",
        start_epsilon=1.0,
        end_epsilon=0.05,
        exploration_fraction=0.1,
        eval_epsilon=0.0,
        layer_norm=True,
        network="minatar",
        bf16="off",  # float32, as the other MinAtar presets
    ),
}


def suited_env_ids(algo: str, preset: str) -> tuple[str, ...]:
    """The env ids ``algo``'s ``preset`` is made for (:data:`ATARI`: every ALE game).

    Example:
        >>> suited_env_ids("ppo", "cartpole"), suited_env_ids("ppo", "atari-large")
        (('CartPole-v1',), ())
    """
    return ENV_PRESETS.get(algo, {}).get(preset, ())


def preset_for_env(algo: str, env_id: str) -> str | None:
    """The preset of ``algo`` made for ``env_id``, or ``None`` when it has none.

    Example:
        >>> preset_for_env("ppo", "MinAtar/Breakout-v0"), preset_for_env("dqn", "MinAtar/Seaquest-v1")
        ('minatar', 'minatar-dqn')
    """
    from vecaccel.trainers.envs.make import is_atari_id, is_minatar_id

    atari: bool | None = None  # resolving an id can import ale_py: only when a preset asks
    for preset, env_ids in ENV_PRESETS.get(algo, {}).items():
        if env_id in env_ids or (MINATAR in env_ids and is_minatar_id(env_id)):
            return preset
        if ATARI in env_ids:
            if atari is None:
                atari = is_atari_id(env_id)
            if atari:
                return preset
    return None


def check_preset_fits(algo: str, preset: str, env_id: str | None) -> None:
    """Refuse a MinAtar preset for an env that is not a MinAtar game.

    A MinAtar preset builds the MinAtar network over boolean ``[10, 10, C]`` grids, and its
    schedule is counted in MinAtar frames: on any other env it could only fail later, or train
    with settings made for another game. (The other presets apply anywhere by name.)

    Raises:
        ValueError: naming the preset, the env and the presets made for it.

    Example:
        >>> check_preset_fits("ppo", "minatar", "MinAtar/Asterix-v0")
        >>> check_preset_fits("ppo", "minatar", "ALE/Pong-v5")
        Traceback (most recent call last):
        ...
        ValueError: preset 'minatar' of ppo is made for MinAtar's games (boolean [10, 10, C] grids, the MinAtar network); 'ALE/Pong-v5' is not one: use the preset made for it ('atari') or name another with preset=... (--preset)
    """
    from vecaccel.trainers.envs.make import is_minatar_id

    suits = suited_env_ids(algo, preset)
    if env_id is None or MINATAR not in suits or is_minatar_id(env_id) or env_id in suits:
        return
    own = preset_for_env(algo, env_id)
    instead = f"the preset made for it ({own!r})" if own else "the plain defaults (preset=None)"
    raise ValueError(
        f"preset {preset!r} of {algo} is made for MinAtar's games (boolean [10, 10, C] grids, "
        f"the MinAtar network); {env_id!r} is not one: use {instead} or name another with "
        "preset=... (--preset)"
    )


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
        ValueError: ``preset`` is none of these, naming the choices; a MinAtar preset for
            another env (:func:`check_preset_fits`).
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
    check_preset_fits(algo, preset, env_id)
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
