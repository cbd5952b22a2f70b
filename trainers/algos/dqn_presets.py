"""Named settings of the DQN family: ``DQN(env, preset="atari-dqn", **overrides)`` and
``vecaccel train dqn --preset NAME``."""

from __future__ import annotations

from typing import Any

__all__ = ["PRESETS"]

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

#: Named settings, applied with ``DQN(env, preset="atari-dqn", **overrides)``.
PRESETS: dict[str, dict[str, Any]] = {
    "cartpole": _CARTPOLE,
    # the settings above (Double, 3-step) with a categorical head: plain 1-step C51 did not
    # reach 475 in 60k steps. CartPole's discounted returns (at most 100 at gamma 0.99) need a
    # support on [0, 100], not Atari's clipped [-10, 10] (``loss`` applies to expected values only)
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
}
