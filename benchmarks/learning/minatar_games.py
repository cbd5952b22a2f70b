"""MinAtar's five games: vecaccel's trainers against the published curves, large batches against
small ones, and (with ``--setting sb3``) SB3's PPO or DQN on the same work.

Every (algorithm, game, setting, seed) is one run in a child process, and writes its own result
file under ``--runs`` as soon as it ends: the return curve against env steps and against
wall-clock seconds, the score, the load average and the versions. ``run`` skips the runs whose
file exists, so it resumes where a stopped sitting left off; ``report`` builds the table, the
rliable aggregate and the plots from whatever run files exist.

The games are the ``-v0`` ids (all six actions, sticky actions 0.1 and difficulty ramping: the
MinAtar paper's setting). One frame is one env step (MinAtar has no frame skip). The score is the
MinAtar paper's: the mean return of the last 100 training episodes. Each algorithm trains with
its ``minatar`` preset (one setting for all five games); the other settings change a few of its
values:

- ``preset``: the preset as it is (PPO 256 envs x 32 steps in 16 minibatches; the DQN family at
  batch 512, C51 at 2,048, replay ratio 8; A2C 128 envs x 5 steps; PQN 128 envs x 32 steps, 2
  epochs of 32 minibatches, purejaxql's);
- ``envs16``, ``envs256`` and ``envs256-mb16`` (PPO): 16 or 256 envs in 4 minibatches, and 256
  in 16 (the preset's own split), the learning rate following the preset's ``sqrt`` rule: the
  batch-size claim, run at 2M frames since PPO anneals over its budget;
- ``envs128-mb4`` and ``envs128-mb4-bf16`` (PPO): 128 envs in 4 minibatches, as the preset was
  before it took 16 minibatches of 256 envs, in float32 and under bfloat16 autocast
  (``bf16="on"``, faster on CPUs with bf16 units: AMX, AVX512-BF16); each run file says which
  arithmetic it trained in (``bf16_in_force``);
- ``envs32`` and ``envs512`` (PQN): 32 or 512 envs against the preset's 128, each rollout in
  the preset's 32 minibatches (so minibatches of 32, 128 and 512) and at its learning rate,
  which purejaxql does not scale with the batch: the batch-size claim at the same frames;
  ``envs512-mb128`` (PQN): 512 envs in 128 minibatches of the preset's 128, so the preset's
  gradient steps per frame on four times its envs;
- ``batch32``, ``batch512`` and ``batch2048`` (the DQN family): the training batch at the same
  replay ratio, the learning rate following the preset's ``sqrt`` rule from its batch-32 value;
  ``rr32``: MinAtar DQN's schedule in frames (replay ratio 32, the target every 1,000 frames);
- ``max-target`` and ``rmsprop`` (DQN): the preset with one of MinAtar DQN's own choices, the
  target's plain max in place of Double DQN's, or centred RMSprop (its 2.5e-4 at batch 32,
  scaled by the preset's ``sqrt`` rule) in place of Adam;
- ``minatar-original`` (DQN): MinAtar's own DQN, its four choices together: a batch of 32 trained
  on every frame (replay ratio 32), the target every 1,000 frames, the plain max, centred
  RMSprop at 2.5e-4 and no gradient clipping, on the preset's 64 envs (64 updates after each
  vector step, so the same updates per frame as its one env);
- ``sb3`` (PPO and DQN): Stable-Baselines3's PPO or DQN with the same network (a features
  extractor), envs and hyperparameters; SB3's DQN has no Double DQN, so it is also the peer of
  ``max-target``.

``race`` times vecaccel's PPO against SB3's on the same work: both with the PPO preset's
network, envs and hyperparameters, seed by seed with the order of the arms rotating, each
stopped when the mean return of the last 100 episodes reaches ``--score``; reported are the
seconds and env steps to that score (from before the envs are made) and the steps per second.
The arms are ``vecaccel-bf16`` (the preset under bf16 autocast), ``vecaccel-fp32`` (the preset
in float32) and ``sb3``. Run it on a quiet machine, alone.

Run (niced, in the background; a run of 5M frames takes 4 to 8 minutes for PPO and 12 to 30 for
DQN on 2 CPU cores, by how fast the host is)::

    nice -n 19 python benchmarks/learning/minatar_games.py run --algos ppo --seeds 1 2 3
    nice -n 19 python benchmarks/learning/minatar_games.py run --algos pqn --setting envs512 \
        --games Breakout SpaceInvaders
    python benchmarks/learning/minatar_games.py report
    python benchmarks/learning/minatar_games.py race --game Breakout --score 15 \
        --arms vecaccel-fp32 sb3

``pace`` times each algorithm's preset on one game for ``--steps`` env steps (1M by default),
seed by seed with the algorithms' order rotating, and projects a 5M-frame run's wall-clock from
each run's steady rate past its first fifth (the DQN family's replay warm-up trains nothing);
it reports each algorithm's median projection over the first algorithm's. Run it on a quiet
machine, alone::

    python benchmarks/learning/minatar_games.py pace --game Breakout --algos dqn pqn --seeds 1 2

``relabel --algo ALGO --from OLD --to NEW`` moves an algorithm's run files to another setting
when a preset change makes ``NEW`` mean what ``OLD`` did, checking each file's recorded config.

Run files go to ``benchmarks/results/minatar_runs/``; the report to
``benchmarks/results/minatar_games.{json,md,png}`` (the ``.md`` ends with the batch-size claim,
each large batch against its small one), ``minatar_games_batch.png``,
``minatar_games_bf16.png`` and ``minatar_games_mb16.png``; the race to
``benchmarks/results/minatar_race.json``; the pace to
``benchmarks/results/minatar_pace_GAME.json`` (its runs under ``minatar_pace_runs/``).

The script is ``minatar_games.py``, not ``minatar.py``: Python searches a script's own folder
first on import, where a ``minatar.py`` would be imported in place of the ``minatar`` package.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from vecaccel.bench import RunRecord, command_line, run_in_child
from vecaccel.bench.learning import (
    WINDOW,
    ReturnCurve,
    format_cell,
    iqm_interval,
    json_values,
    learn_on_curve,
    median,
    pace_summary,
    plot_seed_curves,
    race_summary,
    return_by,
    run_race,
    sb3_curve_callback,
    steady_pace,
    time_ratios,
    up_to,
)
from vecaccel.bench.learning import load_runs as load_run_files

RESULTS = Path(__file__).resolve().parent.parent / "results"
RUNS = RESULTS / "minatar_runs"
GAMES = ("Asterix", "Breakout", "Freeway", "Seaquest", "SpaceInvaders")
ALGOS = ("ppo", "dqn", "a2c", "c51", "rainbow", "pqn")
PRESET_OF = {
    "a2c": "minatar",
    "ppo": "minatar",
    "dqn": "minatar-dqn",
    "c51": "minatar-c51",
    "rainbow": "minatar-rainbow",
    "pqn": "minatar",
}
#: setting -> the config values it changes (``sb3`` runs SB3's PPO or DQN instead)
SETTINGS: dict[str, dict[str, Any]] = {
    "preset": {},
    # PPO's batch-size claim at 2M frames: 16 and 256 envs in 4 minibatches, and 256 envs in 16
    # (the preset's own split, apart because PPO anneals over its budget)
    "envs16": {"num_envs": 16, "num_minibatches": 4},
    "envs256": {"num_envs": 256, "num_minibatches": 4},
    "envs256-mb16": {"num_envs": 256, "num_minibatches": 16},
    # PPO as the preset was before it took 16 minibatches of 256 envs: 128 envs in 4 minibatches,
    # in float32 and under bf16 autocast
    "envs128-mb4": {"num_envs": 128, "num_minibatches": 4},
    "envs128-mb4-bf16": {"num_envs": 128, "num_minibatches": 4, "bf16": "on"},
    # PQN's batch-size claim: 32 and 512 envs against the preset's 128, in its 32 minibatches
    "envs32": {"num_envs": 32},
    "envs512": {"num_envs": 512},
    # 512 envs at the preset's minibatch size and gradient steps per frame
    "envs512-mb128": {"num_envs": 512, "num_minibatches": 128},
    "batch32": {"batch_size": 32},
    "batch512": {"batch_size": 512},
    "batch2048": {"batch_size": 2048},
    # the DQN family at MinAtar DQN's own schedule in frames: 32 samples trained on per frame
    # (its batch of 32 every frame) and the target updated every 1,000 frames, at the preset's
    # batch of 512; a probe of what the preset's replay ratio of 8 costs
    "rr32": {"replay_ratio": 32.0, "target_update_period": 1000},
    # the preset with one of MinAtar DQN's own choices: the plain max over the target network's
    # values, or centred RMSprop at its learning rate
    "max-target": {"double": False},
    "rmsprop": {"optimizer": "rmsprop", "learning_rate": 2.5e-4},
    # all four together: MinAtar's DQN (its examples/dqn.py) on the preset's 64 envs
    "minatar-original": {
        "batch_size": 32,
        "replay_ratio": 32.0,
        "target_update_period": 1000,
        "double": False,
        "optimizer": "rmsprop",
        "learning_rate": 2.5e-4,
        "max_grad_norm": 0.0,
    },
    "sb3": {},
}
#: the algorithms a setting applies to (the rest apply to every algorithm)
_OFF_POLICY = ("dqn", "c51", "rainbow")
APPLIES_TO: dict[str, tuple[str, ...]] = {
    "envs16": ("ppo",),
    "envs256": ("ppo",),
    "envs256-mb16": ("ppo",),
    "envs128-mb4": ("ppo",),
    "envs128-mb4-bf16": ("ppo",),
    "envs32": ("pqn",),
    "envs512": ("pqn",),
    "envs512-mb128": ("pqn",),
    "sb3": ("ppo", "dqn"),
    "batch32": _OFF_POLICY,
    "batch512": _OFF_POLICY,
    "batch2048": _OFF_POLICY,
    "rr32": _OFF_POLICY,
    "max-target": ("dqn",),
    "rmsprop": ("dqn",),
    "minatar-original": ("dqn",),
}
#: the published scores at 5M frames, read off the learning curves of the MinAtar README (30
#: seeds; approximate): DQN, and the actor-critic AC(lambda=0.8)
PUBLISHED = {
    "DQN": {
        "Asterix": 17.0,
        "Breakout": 10.0,
        "Freeway": 50.0,
        "Seaquest": 20.0,
        "SpaceInvaders": 43.0,
    },
    "AC(lambda)": {
        "Asterix": 19.0,
        "Breakout": 17.5,
        "Freeway": 47.0,
        "Seaquest": 15.5,
        "SpaceInvaders": 185.0,
    },
}
FRAMES = 5_000_000  # the published scores' budget


def run_file(runs: Path, algo: str, game: str, setting: str, seed: int) -> Path:
    """Where the run's result lives."""
    return runs / f"{algo}-{game}-{setting}-s{seed}.json"


def run_vecaccel(
    algo: str,
    env_id: str,
    changes: dict[str, Any],
    seed: int,
    steps: int,
    stop_at: float | None = None,
) -> dict[str, Any]:
    """One run of ``algo``'s preset with ``changes``; the outcome's config says whether bf16
    autocast was in force (``bf16_in_force``), which ``bf16="auto"`` leaves to the hardware."""
    from vecaccel.trainers.config import registry

    cls = registry.get(algo).load_class()
    curve = ReturnCurve(steps, stop_at)
    agent = cls(
        env_id,
        preset=PRESET_OF[algo],
        seed=seed,
        progress=False,
        tensorboard=False,
        **changes,
    )
    outcome = learn_on_curve(agent, steps, curve)
    network = agent.model if hasattr(agent, "model") else agent.q_network
    outcome["config"]["bf16_in_force"] = any(
        getattr(part, "bf16", False) for part in network.modules()
    )
    return outcome


def _sb3_extractor() -> type:
    """SB3's features extractor of the MinAtar network (its conv and 128-unit layer; the heads
    are SB3's)."""
    import gymnasium as gym
    import torch
    from stable_baselines3.common.torch_layers import BaseFeaturesExtractor

    from vecaccel.trainers.nets.networks import MinAtarNet

    class MinAtarExtractor(BaseFeaturesExtractor):
        def __init__(self, observation_space: gym.spaces.Box) -> None:
            super().__init__(observation_space, features_dim=128)
            height, width, channels = observation_space.shape
            self.net = MinAtarNet(channels, (height, width))

        def forward(self, observations: torch.Tensor) -> torch.Tensor:
            return self.net(observations)

    return MinAtarExtractor


def run_sb3(env_id: str, seed: int, steps: int, stop_at: float | None = None) -> dict[str, Any]:
    """SB3's PPO with the MinAtar network and the vecaccel preset's hyperparameters."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env

    from vecaccel.manager import register_envs
    from vecaccel.trainers.config.presets import PPO_PRESETS
    from vecaccel.trainers.config.settings import lr_scale

    register_envs()
    preset = PPO_PRESETS["minatar"]
    curve = ReturnCurve(steps, stop_at)
    MinAtarExtractor = _sb3_extractor()
    envs = make_vec_env(env_id, n_envs=preset["num_envs"], seed=seed)
    batch = preset["num_envs"] * preset["num_steps"]
    # the learning rate vecaccel's PPO trains with: the preset's, scaled to its batch
    start_lr = preset["learning_rate"] * lr_scale(
        batch, preset["base_batch_size"], preset["lr_scaling"]
    )
    model = PPO(
        "MlpPolicy",
        envs,
        n_steps=preset["num_steps"],
        batch_size=batch // preset["num_minibatches"],
        n_epochs=preset["update_epochs"],
        learning_rate=lambda remaining: start_lr * remaining,
        gamma=preset["gamma"],
        gae_lambda=preset["gae_lambda"],
        clip_range=preset["clip_coef"],
        ent_coef=preset["ent_coef"],
        vf_coef=preset["vf_coef"],
        max_grad_norm=preset["max_grad_norm"],
        policy_kwargs=dict(
            features_extractor_class=MinAtarExtractor,
            net_arch=[],
            share_features_extractor=True,
            normalize_images=False,
        ),
        seed=seed,
        device="cpu",
    )
    model.learn(steps, callback=sb3_curve_callback(curve))
    envs.close()
    return curve.outcome(model.num_timesteps, dict(preset))


def run_sb3_dqn(env_id: str, seed: int, steps: int) -> dict[str, Any]:
    """SB3's DQN with the MinAtar network and the vecaccel DQN preset's hyperparameters: the
    same envs, batch, replay ratio (one gradient step per ``batch / replay_ratio`` frames),
    buffer, ε schedule in frames, target period, Huber loss, gradient clip and Adam at the
    scaled rate; SB3 takes the plain max over its target network (no Double DQN) and draws one
    ε coin per vector step for all its envs (the preset draws one per env)."""
    from stable_baselines3 import DQN
    from stable_baselines3.common.env_util import make_vec_env

    from vecaccel.manager import register_envs
    from vecaccel.trainers.config.presets import DQN_PRESETS
    from vecaccel.trainers.config.settings import lr_scale

    register_envs()
    preset = DQN_PRESETS[PRESET_OF["dqn"]]
    curve = ReturnCurve(steps)
    MinAtarExtractor = _sb3_extractor()
    num_envs = preset["num_envs"]
    envs = make_vec_env(env_id, n_envs=num_envs, seed=seed)
    samples = preset["replay_ratio"] * num_envs  # trained on per vector step
    gradient_steps = max(1, round(samples / preset["batch_size"]))
    model = DQN(
        "MlpPolicy",
        envs,
        learning_rate=preset["learning_rate"]
        * lr_scale(preset["batch_size"], preset["base_batch_size"], preset["lr_scaling"]),
        buffer_size=preset["buffer_size"],
        learning_starts=preset["learning_starts"],
        batch_size=preset["batch_size"],
        gamma=preset["gamma"],
        train_freq=(1, "step"),
        gradient_steps=gradient_steps,
        target_update_interval=preset["target_update_period"],
        exploration_fraction=min(1.0, preset["exploration_steps"] / steps),
        exploration_initial_eps=preset["start_epsilon"],
        exploration_final_eps=preset["end_epsilon"],
        max_grad_norm=preset["max_grad_norm"],
        policy_kwargs=dict(
            features_extractor_class=MinAtarExtractor,
            net_arch=[],
            normalize_images=False,
            optimizer_kwargs=dict(eps=preset["adam_eps"]),
        ),
        seed=seed,
        device="cpu",
    )
    model.learn(steps, callback=sb3_curve_callback(curve))
    envs.close()
    config = json_values(preset)
    config.update(double=False, gradient_steps=gradient_steps)
    return curve.outcome(model.num_timesteps, config)


def one(algo: str, game: str, setting: str, seed: int, steps: int, runs: str, command: str) -> str:
    """One run, written to its file; returns the file's path (called in a child process)."""
    record = RunRecord(command, benchmark="learning/minatar_games")
    env_id = f"MinAtar/{game}-v0"
    if setting == "sb3":
        outcome = (
            run_sb3(env_id, seed, steps) if algo == "ppo" else run_sb3_dqn(env_id, seed, steps)
        )
    else:
        outcome = run_vecaccel(algo, env_id, SETTINGS[setting], seed, steps)
    path = run_file(Path(runs), algo, game, setting, seed)
    summary = {key: outcome[key] for key in ("score", "episodes", "wall_s", "steps")}
    summary["steps_per_s"] = summary["steps"] / summary["wall_s"]
    record.write(
        path,
        outcome["curve"],
        summary=summary,
        algo=algo,
        game=game,
        env_id=env_id,
        setting=setting,
        seed=seed,
        total_steps=steps,
        config=outcome["config"],
    )
    return str(path)


#: the race's arms: what each runs (a vecaccel setting of PPO, or SB3's PPO)
RACE_ARMS: dict[str, dict[str, Any] | None] = {
    "vecaccel-bf16": {"bf16": "on"},
    "vecaccel-fp32": {"bf16": "off"},
    "sb3": None,
}


def race_one(library: str, game: str, seed: int, score: float, max_steps: int) -> dict[str, Any]:
    """One run of the race: an arm of :data:`RACE_ARMS` on PPO's preset work, stopped when the
    mean return of the last 100 episodes reaches ``score`` (called in a child process)."""
    env_id = f"MinAtar/{game}-v0"
    if library == "sb3":
        outcome = run_sb3(env_id, seed, max_steps, stop_at=score)
    else:
        changes = RACE_ARMS[library] or {}
        outcome = run_vecaccel("ppo", env_id, changes, seed, max_steps, stop_at=score)
    outcome.pop("config")
    outcome.pop("curve")
    outcome["steps_per_s"] = outcome["steps"] / outcome["wall_s"]
    return outcome


#: the run length ``pace`` projects each algorithm's wall-clock to: the benchmark's runs
PACE_TARGET_STEPS = 5_000_000


def pace_one(algo: str, game: str, seed: int, steps: int) -> dict[str, Any]:
    """One run of ``pace``: ``algo``'s ``minatar`` preset for ``steps`` env steps, timed
    (called in a child process), with the wall-clock of a full run projected from its steady
    rate (:func:`~vecaccel.bench.learning.steady_pace`)."""
    outcome = run_vecaccel(algo, f"MinAtar/{game}-v0", {}, seed, steps)
    outcome.pop("config")
    paced = steady_pace(outcome, PACE_TARGET_STEPS)
    paced.pop("curve")
    return paced


def pace(args: argparse.Namespace) -> dict[str, Any]:
    """Each algorithm's preset on one game for ``--steps`` env steps, seed by seed with the
    algorithms' order rotating; the wall-clock of a 5M-frame run projected from each run's
    steady rate, and each algorithm's median projection over the first's."""
    record = RunRecord(command_line(), benchmark="learning/minatar_games")
    folder = Path(args.out) / "minatar_pace_runs"
    common = dict(game=args.game, steps=args.steps)
    algos = list(args.algos)

    def run_path(algo: str, seed: int) -> Path:
        return folder / f"{algo}-{args.game}-steps{args.steps}-s{seed}.json"

    runs = run_race(
        __file__,
        "pace_one",
        args.seeds,
        algos,
        run_path,
        benchmark="learning/minatar_games",
        command=command_line(),
        common=common,
        arm_key="algo",
        label=args.game,
    )
    summary: dict[str, Any] = pace_summary(runs, "algo", algos)
    baseline = summary[algos[0]]["median_projected_wall_s"]
    summary["projected_wall_ratio"] = {
        algo: summary[algo]["median_projected_wall_s"] / baseline for algo in algos[1:]
    }
    out = Path(args.out) / f"minatar_pace_{args.game}.json"
    return record.write(out, runs, summary=summary, **common)


def race(args: argparse.Namespace) -> dict[str, Any]:
    """vecaccel's PPO and SB3's, seed by seed with the arms' order rotating, each to the same
    score.

    Each run is written to its own file under ``OUT/minatar_race_runs`` as it ends, and a run
    whose file exists is read instead of run again: an interrupted race resumes where it was.
    """
    record = RunRecord(command_line(), benchmark="learning/minatar_games")
    folder = Path(args.out) / "minatar_race_runs"
    common = dict(game=args.game, score=args.score, max_steps=args.max_steps)
    arms = list(args.arms)

    def run_path(library: str, seed: int) -> Path:
        return folder / f"{library}-{args.game}-score{args.score:g}-s{seed}.json"

    runs = run_race(
        __file__,
        "race_one",
        args.seeds,
        arms,
        run_path,
        benchmark="learning/minatar_games",
        command=command_line(),
        common=common,
        arm_key="library",
        label=args.game,
    )
    summary = race_summary(runs, arms, arm_key="library")
    # each vecaccel arm's median time to score over SB3's
    summary["time_to_score_ratio"] = time_ratios(summary, "sb3")
    return record.write(Path(args.out) / "minatar_race.json", runs, summary=summary, **common)


def run(args: argparse.Namespace) -> int:
    runs = Path(args.runs)
    runs.mkdir(parents=True, exist_ok=True)
    for seed in args.seeds:  # seeds outermost: every game gets its first seed before any a second
        for algo in args.algos:
            for game in args.games:
                path = run_file(runs, algo, game, args.setting, seed)
                if path.exists():
                    continue
                print(f"{algo} {game} {args.setting} seed {seed} ...", flush=True)
                started = time.perf_counter()
                kwargs = dict(
                    algo=algo,
                    game=game,
                    setting=args.setting,
                    seed=seed,
                    steps=args.steps,
                    runs=str(runs),
                    command=command_line(),
                )
                run_in_child(__file__, "one", kwargs)
                print(f"  {path.name} in {time.perf_counter() - started:.0f} s", flush=True)
    return 0


def _trained_as(config: dict[str, Any], key: str, value: Any) -> bool:
    """Whether a run of recorded ``config`` trained with ``key=value``. ``bf16="auto"`` is read
    by what it came to on the run's hardware (``bf16_in_force``)."""
    if key == "bf16" and config[key] == "auto" and "bf16_in_force" in config:
        return value == "auto" or config["bf16_in_force"] == (value == "on")
    return bool(config[key] == value)


def relabel(runs: Path, algo: str, old: str, new: str) -> list[Path]:
    """Move ``algo``'s runs of setting ``old`` to setting ``new`` (the file's name and its
    ``setting``), for when a preset changes and a setting comes to mean what another did.

    Each file must have trained with what ``new`` now means (the preset with ``SETTINGS[new]``
    applied, as its recorded config says), and no file of ``new`` may be in the way; nothing
    moves unless every file passes. Returns the new paths."""
    from vecaccel.trainers.config import registry

    expected = {**registry.get(algo).load_presets()[PRESET_OF[algo]], **SETTINGS[new]}
    expected.pop("env_id", None)  # the game's own
    moves = []
    for path in sorted(runs.glob(f"{algo}-*-{old}-s*.json")):
        payload = json.loads(path.read_text(encoding="utf-8"))
        meta = payload["meta"]
        if (meta["algo"], meta["setting"]) != (algo, old):  # the glob's * can take a setting's head
            continue
        config = meta["config"]
        differ = {
            key: (config[key], value)
            for key, value in expected.items()
            if key in config and not _trained_as(config, key, json.loads(json.dumps(value)))
        }
        if differ:
            raise ValueError(
                f"{path.name} trained with {', '.join(f'{k}={v[0]!r}' for k, v in differ.items())}"
                f", where the setting {new!r} now means "
                f"{', '.join(f'{k}={v[1]!r}' for k, v in differ.items())}"
            )
        target = run_file(runs, algo, meta["game"], new, meta["seed"])
        if target.exists():
            raise ValueError(f"{target.name} exists: relabelling {path.name} would overwrite it")
        meta["setting"] = new
        moves.append((path, target, payload))
    for path, target, payload in moves:
        target.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
        path.unlink()
    return [target for _, target, _ in moves]


# -- the report -----------------------------------------------------------------------------------


def load_runs(runs: Path) -> list[dict[str, Any]]:
    """Every run file under ``runs``: its settings, summary and curve, one dict each."""
    return load_run_files(runs, ("algo", "game", "setting", "seed", "total_steps"))


def arm_name(algo: str, setting: str) -> str:
    """How a table or plot names an (algorithm, setting): ``PPO``, ``PPO envs16``, ``SB3 PPO``."""
    if setting == "sb3":
        return f"SB3 {algo.upper()}"
    name = {"rainbow": "ε-Rainbow"}.get(algo, algo.upper())
    return name if setting == "preset" else f"{name} {setting}"


def _by_arm(found: list[dict[str, Any]]) -> dict[tuple[str, str, str], list[dict[str, Any]]]:
    """The runs grouped by (algorithm, setting, game)."""
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for entry in found:
        groups.setdefault((entry["algo"], entry["setting"], entry["game"]), []).append(entry)
    return groups


def score_table(found: list[dict[str, Any]], frames: int = FRAMES) -> list[dict[str, Any]]:
    """One row per (algorithm, setting, game): the seeds' scores, their median and the
    published levels; where every run had the published budget of ``frames``, whether the
    median is at or above them (``None`` for shorter runs)."""
    rows = []
    for (algo, setting, game), entries in sorted(_by_arm(found).items()):
        entries.sort(key=lambda entry: entry["seed"])
        scores = [entry["score"] for entry in entries]
        middle = median(scores)
        row = {
            "algo": algo,
            "setting": setting,
            "game": game,
            "arm": arm_name(algo, setting),
            "seeds": [entry["seed"] for entry in entries],
            "scores": scores,
            "median": middle,
            "steps": min(entry["steps"] for entry in entries),
            "wall_s": median([entry["wall_s"] for entry in entries]),
            "steps_per_s": median([entry["steps_per_s"] for entry in entries]),
        }
        for name, levels in PUBLISHED.items():
            row[f"published {name}"] = levels[game]
            row[f"at or above {name}"] = middle >= levels[game] if row["steps"] >= frames else None
        rows.append(row)
    return rows


def aggregate(
    found: list[dict[str, Any]], reps: int = 2000, frames: int = FRAMES
) -> dict[str, Any]:
    """rliable's interquartile mean of the scores normalised per game by the published DQN
    score, with 95 % stratified bootstrap intervals, for each arm run on the same seeds on
    every game it has (Agarwal et al., 2021). An arm counts the seeds that every one of its
    games has; its games are listed. Only runs of the published budget (``frames``) count:
    a score at 2M frames is not comparable with one published at 5M."""
    arms: dict[str, dict[str, dict[int, float]]] = {}
    for entry in found:
        if entry["steps"] < frames:
            continue
        games = arms.setdefault(arm_name(entry["algo"], entry["setting"]), {})
        games.setdefault(entry["game"], {})[entry["seed"]] = entry["score"]
    summary = {}
    for arm, games in arms.items():
        seeds = sorted(set.intersection(*(set(by_seed) for by_seed in games.values())))
        if not seeds:
            continue
        names = sorted(games)
        matrix = [[games[game][seed] / PUBLISHED["DQN"][game] for game in names] for seed in seeds]
        iqm, ci95 = iqm_interval(matrix, reps)
        summary[arm] = {"games": names, "seeds": seeds, "iqm": iqm, "ci95": ci95}
    return summary


#: the batch-size claim: per algorithm, its small batch and the large ones set against it (the
#: DQN preset is batch 512; PPO's preset anneals over 5M frames, so its arms are run apart)
BATCH_CLAIM: dict[str, tuple[str, tuple[str, ...]]] = {
    "ppo": ("envs16", ("envs256", "envs256-mb16")),
    "dqn": ("batch32", ("preset", "batch2048")),
    "pqn": ("envs32", ("preset", "envs512", "envs512-mb128")),
}
BATCH_GAMES = ("Breakout", "SpaceInvaders")


def _spread(values: list[float]) -> float:
    return max(values) - min(values) if values else math.nan


def batch_claim(found: list[dict[str, Any]], seeds_needed: int = 3) -> list[dict[str, Any]]:
    """Each large batch against its small one (``BATCH_CLAIM``) on each game both have run, at
    the smaller of their frame budgets: per seed, the return at the budget, the mean return
    over the curve up to it (how fast it learned per frame) and the wall-clock seconds to it.

    The rule, the paper's claim that large batches do not hurt the return per frame: the
    large batch holds when, for both returns, its median is at most the wider of the two arms'
    seed ranges (max - min) below the small batch's (above it is fine); it is judged once each
    arm has ``seeds_needed`` seeds (``None`` before)."""
    by_arm = _by_arm(found)
    rows = []
    for algo, (small, larges) in BATCH_CLAIM.items():
        for large in larges:
            for game in BATCH_GAMES:
                arms = {name: by_arm.get((algo, name, game), []) for name in (small, large)}
                if not all(arms.values()):
                    continue
                budget = min(entry["total_steps"] for entries in arms.values() for entry in entries)
                figures: dict[str, dict[str, Any]] = {}
                for name, entries in arms.items():
                    per_seed = []
                    for entry in sorted(entries, key=lambda entry: entry["seed"]):
                        curve = up_to(entry["curve"], budget)
                        returns = [point["return"] for point in curve
                                   if not math.isnan(point["return"])]  # fmt: skip
                        per_seed.append(
                            {
                                "seed": entry["seed"],
                                "return": curve[-1]["return"] if curve else math.nan,
                                "mean_return": statistics.fmean(returns) if returns else math.nan,
                                "wall_s": curve[-1]["wall_s"] if curve else math.nan,
                            }
                        )
                    figures[name] = {
                        "seeds": per_seed,
                        **{
                            key: median([seed[key] for seed in per_seed])
                            for key in ("return", "mean_return", "wall_s")
                        },
                    }
                judged = all(len(arm["seeds"]) >= seeds_needed for arm in figures.values())
                holds = {}
                for key in ("return", "mean_return"):
                    widest = max(_spread([seed[key] for seed in arm["seeds"]])
                                 for arm in figures.values())  # fmt: skip
                    holds[key] = figures[small][key] - figures[large][key] <= widest
                rows.append(
                    {
                        "algo": algo,
                        "game": game,
                        "small": small,
                        "large": large,
                        "budget": budget,
                        "arms": figures,
                        "holds": all(holds.values()) if judged else None,
                        "wall_s_ratio": figures[large]["wall_s"] / figures[small]["wall_s"],
                        # the small batch's median return when the large one's median run ends
                        "small_return_at_large_wall_s": median(
                            [
                                return_by(entry["curve"], figures[large]["wall_s"])
                                for entry in arms[small]
                            ]
                        ),
                    }
                )
    return rows


def _plot(
    found: list[dict[str, Any]],
    games: Sequence[str],
    arms: list[tuple[str, str]],
    path: Path,
    title: str,
    budget: int | None = None,
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(2, len(games), figsize=(4.2 * len(games), 7), squeeze=False)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for column, game in enumerate(games):
        for colour, (algo, setting) in zip(colours, arms):
            entries = [
                e for e in found if (e["algo"], e["setting"], e["game"]) == (algo, setting, game)
            ]
            if not entries:
                continue
            curves = [up_to(entry["curve"], budget or entry["total_steps"]) for entry in entries]
            plot_seed_curves(
                axes[0][column],
                axes[1][column],
                curves,
                colour,
                f"{arm_name(algo, setting)} ({len(entries)} seeds)",
            )
        for row in range(2):
            axis = axes[row][column]
            for style, (name, levels) in zip(("--", ":"), PUBLISHED.items()):
                axis.axhline(levels[game], color="black", ls=style, lw=1, label=f"published {name}")
            axis.set_xlabel("env steps (frames)" if row == 0 else "wall-clock seconds")
            axis.grid(alpha=0.3)
        axes[0][column].set_title(game)
        axes[0][0].set_ylabel("mean return, last 100 episodes")
        axes[1][0].set_ylabel("mean return, last 100 episodes")
    axes[0][0].legend(fontsize=7, loc="upper left")
    figure.suptitle(title)
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def markdown(
    rows: list[dict[str, Any]], summary: dict[str, Any], claim: Sequence[dict[str, Any]] = ()
) -> str:
    """The report as Markdown: the scores table, the aggregate, then the batch-size claim."""
    lines = [
        "| arm | game | seeds | score per seed | median | published DQN | published AC(λ) | "
        "frames | wall-clock (median) | steps/s |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for row in rows:
        lines.append(
            f"| {row['arm']} | {row['game']} | {len(row['seeds'])} | "
            f"{', '.join(format_cell(score) for score in row['scores'])} | {format_cell(row['median'])} | "
            f"{format_cell(row['published DQN'])} | {format_cell(row['published AC(lambda)'])} | "
            f"{row['steps'] / 1e6:.1f}M | {format_cell(row['wall_s'] / 60)} min | "
            f"{format_cell(row['steps_per_s'], 0)} |"
        )
    lines += [
        "",
        "| arm | games | seeds | IQM of score / published DQN | 95 % CI |",
        "| --- | --- | --- | ---: | --- |",
    ]
    for arm, figures in summary.items():
        low, high = figures["ci95"]
        lines.append(
            f"| {arm} | {', '.join(figures['games'])} | {', '.join(map(str, figures['seeds']))} | "
            f"{figures['iqm']:.2f} | {low:.2f} - {high:.2f} |"
        )
    if claim:
        lines += [
            "",
            "| algorithm | game | small | large | frames | return at the end, per seed "
            "(small; large) | median (small, large) | mean return over the run (small, large) | "
            "no worse, within seed noise | wall-clock, median (small, large) | large / small | "
            "small's return when large ends |",
            "| --- | --- | --- | --- | ---: | --- | --- | --- | --- | --- | ---: | ---: |",
        ]
        for row in claim:
            small, large = row["arms"][row["small"]], row["arms"][row["large"]]
            seeds = "; ".join(
                ", ".join(format_cell(seed["return"]) for seed in arm["seeds"])
                for arm in (small, large)
            )
            verdict = {None: "not judged (under 3 seeds)", True: "yes", False: "**no**"}
            lines.append(
                f"| {arm_name(row['algo'], 'preset')} | {row['game']} | "
                f"{_batch_name(row['algo'], row['small'])} | "
                f"{_batch_name(row['algo'], row['large'])} | {row['budget'] / 1e6:.1f}M | "
                f"{seeds} | {format_cell(small['return'])}, {format_cell(large['return'])} | "
                f"{format_cell(small['mean_return'])}, {format_cell(large['mean_return'])} | "
                f"{verdict[row['holds']]} | "
                f"{format_cell(small['wall_s'], 0)} s, {format_cell(large['wall_s'], 0)} s | "
                f"{row['wall_s_ratio']:.2f}x | {format_cell(row['small_return_at_large_wall_s'])} |"
            )
    return "\n".join(lines) + "\n"


def _batch_name(algo: str, setting: str) -> str:
    """A batch-size arm by what it changes: ``16 envs``, ``batch 512 (preset)`` (the DQN
    preset), ``128 envs (preset)`` (PQN's)."""
    if setting == "preset":
        from vecaccel.trainers.config import registry

        preset = registry.get(algo).load_presets()[PRESET_OF[algo]]
        if "batch_size" in preset:
            return f"batch {preset['batch_size']} (preset)"
        return f"{preset['num_envs']} envs (preset)"
    envs, _, minibatches = setting.removeprefix("envs").partition("-mb")
    if setting.startswith("batch"):
        return f"batch {setting.removeprefix('batch')}"
    return f"{envs} envs" + (f", {minibatches} minibatches" if minibatches else "")


def write_report(
    runs: Path, out: Path, command: str, frames: int = FRAMES, reps: int = 2000
) -> dict[str, Any]:
    """``minatar_games.json``, ``.md`` and the plots in ``out`` from the run files in ``runs``;
    ``frames`` is the published budget, which the comparisons with the published scores need,
    and ``reps`` the aggregate's bootstrap resamples."""
    found = load_runs(runs)
    rows = score_table(found, frames)
    summary = aggregate(found, reps, frames)
    claim = batch_claim(found)
    record = RunRecord(command, benchmark="learning/minatar_games")
    payload = record.write(
        out / "minatar_games.json",
        rows,
        summary={"iqm": summary, "batch_claim": claim} if summary or claim else None,
        runs=[entry["file"] for entry in found],
        published=PUBLISHED,
        published_frames=frames,
        window=WINDOW,
    )
    (out / "minatar_games.md").write_text(markdown(rows, summary, claim), encoding="utf-8")
    published_arms = [(algo, "preset") for algo in ALGOS] + [("ppo", "sb3")]
    if found:
        _plot(
            found,
            GAMES,
            published_arms,
            out / "minatar_games.png",
            "MinAtar -v0: return against frames and wall-clock (thin: seeds, bold: median)",
        )
        for name, games, arms, title, cut in COMPARISONS:
            # drawn once a run of an arm other than the presets exists; a cut plot stops every
            # curve at the smallest frame budget of its arms' runs
            ours = [entry for entry in found if (entry["algo"], entry["setting"]) in arms]
            if any(entry["setting"] != "preset" for entry in ours):
                budget = min(entry["total_steps"] for entry in ours) if cut else None
                _plot(found, games, arms, out / name, title, budget)
    return payload


#: the plots that set settings against the preset: file, games, arms, title, and whether every
#: curve stops at the smallest frame budget of the plot's runs
COMPARISONS = [
    (
        "minatar_games_batch.png",
        ("Breakout", "SpaceInvaders"),
        [
            ("ppo", "envs16"),
            ("ppo", "envs256"),
            ("ppo", "envs256-mb16"),
            ("dqn", "batch32"),
            ("dqn", "preset"),
            ("dqn", "batch2048"),
            ("pqn", "envs32"),
            ("pqn", "preset"),
            ("pqn", "envs512"),
            ("pqn", "envs512-mb128"),
        ],
        "Large batches against small: the same frames, less wall-clock",
        True,
    ),
    (
        "minatar_games_bf16.png",
        GAMES,
        [("ppo", "envs128-mb4"), ("ppo", "envs128-mb4-bf16")],
        "PPO, 128 envs in 4 minibatches, in float32 and under bf16 autocast",
        False,
    ),
    (
        "minatar_games_mb16.png",
        GAMES,
        [("ppo", "preset"), ("ppo", "envs128-mb4")],
        "PPO: the preset (256 envs in 16 minibatches) and 128 envs in 4",
        False,
    ),
]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    runner = commands.add_parser("run", help="train the runs whose result file is missing")
    runner.add_argument("--algos", nargs="+", choices=ALGOS, default=["ppo"])
    runner.add_argument("--games", nargs="+", choices=GAMES, default=list(GAMES))
    runner.add_argument("--setting", choices=sorted(SETTINGS), default="preset")
    runner.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    runner.add_argument("--steps", type=int, default=5_000_000, help="env steps (frames) a run")
    runner.add_argument("--runs", default=str(RUNS), help="folder of the run files")
    racer = commands.add_parser(
        "race", help="time to score: vecaccel's PPO against SB3's, seed by seed, alternating"
    )
    racer.add_argument("--game", choices=GAMES, default="Asterix")
    racer.add_argument("--score", type=float, default=15.0, help="mean of the last 100 returns")
    racer.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    racer.add_argument("--max-steps", type=int, default=5_000_000, help="a run's step budget")
    racer.add_argument(
        "--arms",
        nargs="+",
        choices=list(RACE_ARMS),
        default=["vecaccel-bf16", "vecaccel-fp32", "sb3"],
        help="what races",
    )
    racer.add_argument("--out", default=str(RESULTS), help="folder of minatar_race.json")
    pacer = commands.add_parser(
        "pace",
        help="wall-clock: each algorithm's preset for --steps, seed by seed, alternating, and "
        "a 5M-frame run's seconds projected from its steady rate",
    )
    pacer.add_argument("--game", choices=GAMES, default="Breakout")
    pacer.add_argument("--algos", nargs="+", choices=ALGOS, default=["dqn", "pqn"])
    pacer.add_argument("--seeds", nargs="+", type=int, default=[1, 2])
    pacer.add_argument("--steps", type=int, default=1_000_000, help="env steps (frames) a run")
    pacer.add_argument("--out", default=str(RESULTS), help="folder of minatar_pace_GAME.json")
    reporter = commands.add_parser("report", help="table, rliable aggregate and plots")
    reporter.add_argument("--runs", default=str(RUNS), help="folder of the run files")
    reporter.add_argument("--out", default=str(RESULTS), help="folder of the report")
    mover = commands.add_parser(
        "relabel",
        help="move an algorithm's runs from one setting to another, once a preset change makes "
        "the second mean what the first did (each file's config is checked)",
    )
    mover.add_argument("--algo", choices=ALGOS, required=True)
    mover.add_argument("--from", dest="old", required=True, help="the runs' setting now")
    mover.add_argument("--to", dest="new", choices=sorted(SETTINGS), required=True)
    mover.add_argument("--runs", default=str(RUNS), help="folder of the run files")
    args = parser.parse_args(argv)
    if args.command == "relabel":
        try:
            moved = relabel(Path(args.runs), args.algo, args.old, args.new)
        except ValueError as error:
            parser.error(str(error))
        print(f"{len(moved)} run files relabelled {args.old} -> {args.new}")
        return 0
    if args.command == "run":
        for algo in args.algos:
            if algo not in APPLIES_TO.get(args.setting, (algo,)):
                parser.error(
                    f"--setting {args.setting} does not apply to {algo}: it is for "
                    f"{', '.join(APPLIES_TO[args.setting])}"
                )
        return run(args)
    if args.command == "pace":
        print(json.dumps(pace(args)["summary"], indent=1))
        return 0
    if args.command == "race":
        summary = race(args)["summary"]
        print(json.dumps(summary, indent=1))
        return 0
    write_report(Path(args.runs), Path(args.out), command_line())
    return 0


if __name__ == "__main__":
    sys.exit(main())
