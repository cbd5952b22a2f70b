"""SB3 PPO's rollout phase on PettingZoo's pistonball: SuperSuit's vec env against vecaccel's.

Both routes step the env of PettingZoo's SB3 pistonball tutorial: ``pistonball_v6.parallel_env``
with the tutorial's arguments, then SuperSuit's ``color_reduction_v0(mode="B")``,
``resize_v1(84, 84)`` and ``frame_stack_v1(3)``: 20 agents, each seeing 84x84x3 frames.
``--num-envs`` such envs (8: 160 agent rows) are stepped by

* ``supersuit``: ``concat_vec_envs_v1(pettingzoo_env_to_vec_env_v1(env), 8,
  num_cpus=--num-cpus, base_class="stable_baselines3")``, the tutorial's route;
* ``vecaccel-shm``: ``to_sb3(make_vec(make_env, 8, backend="shm", num_workers=--num-cpus,
  autoreset_mode=SAME_STEP))``. ``to_sb3`` refuses the ``async`` backend (SB3 steps every row
  each step, in order), so ``shm`` is the vecaccel route.

On each, ``PPO("CnnPolicy")`` with the same settings (the tutorial's, but ``--n-steps``,
``--batch-size`` and ``--n-epochs`` small) collects rollouts of ``n_steps x 160`` rows; a
callback times the rollout phase (``_on_rollout_start`` to ``_on_rollout_end``), as
``sb3_rollout.py`` does. What a rollout step is made of is timed two ways:

* in the loop: stopwatches around the calls ``collect_rollouts`` makes, the policy's
  ``forward``, the vec env's ``step`` (through the ``VecTransposeImage`` that SB3 puts around an
  image env) and ``predict_values`` (the last step's values, and the bootstrap of every row that
  the time limit truncated, which SB3 runs one row at a time for the rows whose info carries
  ``TimeLimit.truncated``: vecaccel's adapter sets it, SuperSuit's does not), the rest being
  SB3's buffer, action clipping, info handling and the callback;
* alone, after the timed updates on the same model and vec env: the forward pass on one step's
  160 rows (``obs_as_tensor``, ``policy(obs)``, the actions back to NumPy) and the vec env's
  ``step`` with random actions.

Each round builds one route, runs ``--warmup-updates`` untimed PPO updates and ``--updates``
timed ones, times the forward pass and the env step alone, and closes it; the routes take turns,
the order reversing from round to round, so that drifts in the machine's load reach both.

Usage::

    python benchmarks/throughput/sb3_rollout_pistonball.py                  # 3 rounds of 3 timed updates
    python benchmarks/throughput/sb3_rollout_pistonball.py --rounds 1 --updates 1 --json /tmp/smoke.json

Writes ``benchmarks/results/sb3_rollout_pistonball.json`` (``--json`` elsewhere) with the
machine, the command line and every round's figures. Needs ``pip install supersuit``.
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from importlib.metadata import version
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AutoresetMode
from sb3_rollout import RolloutTimer, TimedUpdates
from stable_baselines3 import PPO
from stable_baselines3.common.utils import obs_as_tensor
from stable_baselines3.common.vec_env import VecEnv, VecTransposeImage

import vecaccel
from vecaccel.bench import RunRecord, command_line, machine_info
from vecaccel.sb3 import to_sb3

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
ROUTES = ("supersuit", "vecaccel-shm")

# pistonball_v6.parallel_env(...) and PPO(...) as PettingZoo's SB3 pistonball tutorial has them;
# n_steps, batch_size and n_epochs come from the command line
ENV_KWARGS: dict[str, Any] = {
    "n_pistons": 20,
    "time_penalty": -0.1,
    "continuous": True,
    "random_drop": True,
    "random_rotate": True,
    "ball_mass": 0.75,
    "ball_friction": 0.3,
    "ball_elasticity": 1.5,
    "max_cycles": 125,
}
AGENTS = ENV_KWARGS["n_pistons"]  # rows per env
PPO_KWARGS: dict[str, Any] = {
    "gamma": 0.95,
    "ent_coef": 0.0905168,
    "learning_rate": 0.00062211,
    "vf_coef": 0.042202,
    "max_grad_norm": 0.9,
    "gae_lambda": 0.99,
    "clip_range": 0.3,
}


def make_env():
    """One tutorial env: pistonball, greyscale, 84x84, 3 frames stacked (a ParallelEnv)."""
    import supersuit as ss
    from pettingzoo.butterfly import pistonball_v6

    env = pistonball_v6.parallel_env(**ENV_KWARGS)
    env = ss.color_reduction_v0(env, mode="B")
    env = ss.resize_v1(env, x_size=84, y_size=84)
    return ss.frame_stack_v1(env, 3)


def build(route: str, args: argparse.Namespace) -> VecEnv:
    """The SB3 vec env of ``route`` over ``args.num_envs`` tutorial envs."""
    if route == "supersuit":
        import supersuit as ss

        vec = ss.pettingzoo_env_to_vec_env_v1(make_env())
        venv = ss.concat_vec_envs_v1(
            vec, args.num_envs, num_cpus=args.num_cpus, base_class="stable_baselines3"
        )
        concat = venv.venv
        # SuperSuit's vec env has no seed() for SB3's PPO(seed=...) to call: a seeded reset is one
        concat.seed = lambda seed=None: concat.reset(seed=seed)
        return venv
    if route.startswith("vecaccel-"):
        envs = vecaccel.make_vec(
            make_env,
            args.num_envs,
            backend=route.partition("-")[2],
            num_workers=args.num_cpus,
            autoreset_mode=AutoresetMode.SAME_STEP,
        )
        try:
            return to_sb3(envs)
        except BaseException:
            envs.close()
            raise
    raise ValueError(f"unknown route {route!r}; choose from {', '.join(ROUTES)}")


class Stopwatch:
    """Seconds spent in the calls of the functions it wraps."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


class PhaseTimer(RolloutTimer):
    """``RolloutTimer``, plus the seconds each stopwatch ran within every timed rollout."""

    def __init__(self, warmup_rollouts: int, watches: dict[str, Stopwatch]) -> None:
        super().__init__(warmup_rollouts)
        self.watches = watches
        self.in_rollout: dict[str, list[float]] = {name: [] for name in watches}
        self._marks: dict[str, float] = {}

    def _on_rollout_start(self) -> None:
        self._marks = {name: watch.seconds for name, watch in self.watches.items()}
        super()._on_rollout_start()

    def _on_rollout_end(self) -> None:
        super()._on_rollout_end()
        if self.rollouts > self.warmup_rollouts:
            for name, watch in self.watches.items():
                self.in_rollout[name].append(watch.seconds - self._marks[name])


class Route(TimedUpdates):
    """One route's vec env and PPO model: timed updates, then the forward pass and the env step
    alone."""

    def __init__(self, route: str, args: argparse.Namespace) -> None:
        self.route = route
        self.args = args
        self.venv = build(route, args)
        try:
            # what PPO would wrap around it itself; here so that its step can be timed in the loop
            self.venv = VecTransposeImage(self.venv)
            self.model = PPO(
                "CnnPolicy",
                self.venv,
                n_steps=args.n_steps,
                batch_size=args.batch_size,
                n_epochs=args.n_epochs,
                seed=args.seed,
                device=args.device,
                verbose=0,
                **PPO_KWARGS,
            )
        except BaseException:
            self.venv.close()
            raise
        self.rows = self.venv.num_envs
        self.steps_per_update = args.n_steps * self.rows
        # Instance attributes in front of the methods collect_rollouts calls: one perf_counter
        # pair per call. predict_values runs once at a rollout's end and once for every row
        # truncated by the time limit whose info says so (SB3 bootstraps its value).
        watches = {"forward": Stopwatch(), "env_step": Stopwatch(), "values": Stopwatch()}
        policy = self.model.policy
        policy.forward = watches["forward"].wrap(policy.forward)
        policy.predict_values = watches["values"].wrap(policy.predict_values)
        env = self.model.get_env()
        env.step = watches["env_step"].wrap(env.step)
        self.timer = PhaseTimer(args.warmup_updates, watches)
        self.learn_seconds: list[float] = []
        self.forward_ms: list[float] = []
        self.env_step_ms: list[float] = []
        self._started = False

    def time_env_step(self, steps: int, warmup: int) -> np.ndarray:
        """Milliseconds of each of ``steps`` steps of the vec env PPO steps, random actions;
        returns the last observations (160 real stacked frames) for the forward pass."""
        env = self.model.get_env()
        rng = np.random.default_rng(self.args.seed)
        low, high = env.action_space.low, env.action_space.high
        actions = [
            rng.uniform(low, high, (self.rows, *env.action_space.shape)).astype(np.float32)
            for _ in range(16)
        ]
        obs = None
        for step in range(warmup + steps):
            start = time.perf_counter()
            obs, _, _, _ = env.step(actions[step % len(actions)])
            if step >= warmup:
                self.env_step_ms.append((time.perf_counter() - start) * 1e3)
        return obs

    def time_forward(self, obs: np.ndarray, passes: int, warmup: int) -> None:
        """Milliseconds of the policy's forward pass on one step's rows, as collect_rollouts
        runs it."""
        policy = self.model.policy
        policy.set_training_mode(False)
        low, high = self.model.action_space.low, self.model.action_space.high
        with torch.no_grad():
            for index in range(warmup + passes):
                start = time.perf_counter()
                actions, _, _ = policy(obs_as_tensor(obs, self.model.device))
                np.clip(actions.cpu().numpy(), low, high)
                if index >= warmup:
                    self.forward_ms.append((time.perf_counter() - start) * 1e3)

    def close(self) -> None:
        self.venv.close()

    def samples(self) -> dict[str, Any]:
        """The raw timings of this route's round; :func:`summarize` turns them into figures."""
        return {
            "rollout_seconds": list(self.timer.rollout_seconds),
            "learn_seconds": list(self.learn_seconds),
            "in_loop_seconds": {name: list(s) for name, s in self.timer.in_rollout.items()},
            "forward_alone_ms": list(self.forward_ms),
            "env_step_alone_ms": list(self.env_step_ms),
        }


IN_LOOP = ("forward", "env_step", "values")


def summarize(route: str, samples: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """Figures from raw timings (one round's, or every round's joined)."""
    rows = args.num_envs * AGENTS
    rollouts = samples["rollout_seconds"]
    rollout_seconds = sum(rollouts)
    loop_steps = len(rollouts) * args.n_steps
    steps = loop_steps * rows
    rollout_ms = rollout_seconds / loop_steps * 1e3
    in_loop = {name: sum(samples["in_loop_seconds"][name]) / loop_steps * 1e3 for name in IN_LOOP}
    return {
        "route": route,
        "num_envs": args.num_envs,
        "rows": rows,
        "updates": len(rollouts),
        "steps": steps,
        "rollout_seconds": round(rollout_seconds, 3),
        "rollout_sps": round(steps / rollout_seconds, 1),
        "rollout_ms_per_step": round(rollout_ms, 2),
        "rollout_sps_per_update": [round(rows * args.n_steps / s, 1) for s in rollouts],
        "learn_sps": round(steps / sum(samples["learn_seconds"]), 1),
        "rollout_share": round(rollout_seconds / sum(samples["learn_seconds"]), 3),
        # per rollout step, inside SB3's loop: the policy's forward, the vec env's step, and
        # predict_values (the last step's values and the bootstrap of time-limited rows)
        **{f"in_loop_{name}_ms": round(ms, 2) for name, ms in in_loop.items()},
        # what is left: SB3's buffer, action clipping, info handling, the callback
        "in_loop_rest_ms": round(rollout_ms - sum(in_loop.values()), 2),
        # medians of the forward pass and the env step timed alone after the updates
        "forward_alone_ms": round(statistics.median(samples["forward_alone_ms"]), 2),
        "env_step_alone_ms": round(statistics.median(samples["env_step_alone_ms"]), 2),
    }


def join(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Every round's raw timings in one set of samples."""
    joined: dict[str, Any] = {key: [] for key in rounds[0] if key != "in_loop_seconds"}
    joined["in_loop_seconds"] = {name: [] for name in IN_LOOP}
    for samples in rounds:
        for key, values in samples.items():
            if key == "in_loop_seconds":
                for name in IN_LOOP:
                    joined[key][name] += values[name]
            else:
                joined[key] += values
    return joined


def measure(route: str, args: argparse.Namespace) -> dict[str, Any]:
    """One route in one round: warm-up, timed updates, then the forward pass and env step alone."""
    config = Route(route, args)
    try:
        if args.warmup_updates:
            config.run(args.warmup_updates, timed=False)
        config.run(args.updates)
        obs = config.time_env_step(args.env_steps, warmup=args.bound_warmup)
        config.time_forward(obs, args.forward_passes, warmup=args.bound_warmup)
    finally:
        config.close()
    samples = config.samples()
    # Drop the model and vec env now: the next route's workers would otherwise inherit them
    # when they fork, and SuperSuit's close() in a finalizer asserts it runs in their parent.
    del config
    gc.collect()
    return samples


def add_ratios(records: list[dict[str, Any]]) -> None:
    """``x supersuit``: rollout rate against SuperSuit's, over all rounds and round by round
    (a round runs the routes back to back, so its ratio compares neighbours in time)."""
    base = next((r for r in records if r["route"] == "supersuit"), None)
    if base is None:
        return
    for record in records:
        record["rollout_x_supersuit"] = round(record["rollout_sps"] / base["rollout_sps"], 3)
        # without predict_values: SuperSuit's infos lack TimeLimit.truncated, so SB3 skips the
        # bootstrap of truncated rows there that it runs, row by row, on vecaccel's
        record["rollout_x_supersuit_without_values"] = round(
            (base["rollout_ms_per_step"] - base["in_loop_values_ms"])
            / (record["rollout_ms_per_step"] - record["in_loop_values_ms"]),
            3,
        )
        record["rollout_x_supersuit_per_round"] = [
            round(mine["rollout_sps"] / theirs["rollout_sps"], 3)
            for mine, theirs in zip(record["rounds"], base["rounds"])
        ]


def format_table(records: list[dict[str, Any]]) -> str:
    lines = [
        "| route | timed updates | rollout rows/s | x supersuit | rollout ms/step "
        "| in loop: forward | env step | values | rest | alone: forward | env step "
        "| rollout share of learn |",
        "| " + " | ".join(["---"] * 12) + " |",
    ]
    for r in records:
        lines.append(
            f"| {r['route']} | {r['updates']} | {r['rollout_sps']:.0f} "
            f"| {r.get('rollout_x_supersuit', float('nan')):.2f} | {r['rollout_ms_per_step']:.1f} "
            f"| {r['in_loop_forward_ms']:.1f} | {r['in_loop_env_step_ms']:.1f} "
            f"| {r['in_loop_values_ms']:.1f} | {r['in_loop_rest_ms']:.1f} "
            f"| {r['forward_alone_ms']:.1f} | {r['env_step_alone_ms']:.1f} "
            f"| {r['rollout_share']:.0%} |"
        )
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--routes", default=",".join(ROUTES), help="supersuit,vecaccel-BACKEND")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; the order reverses each")
    parser.add_argument("--updates", type=int, default=3, help="timed PPO updates per round")
    parser.add_argument("--warmup-updates", type=int, default=1, help="untimed updates first")
    parser.add_argument("--num-envs", type=int, default=8, help="pistonball envs (20 rows each)")
    parser.add_argument(
        "--num-cpus",
        type=int,
        default=2,
        help="processes stepping the envs: SuperSuit's num_cpus and vecaccel's num_workers",
    )
    parser.add_argument("--n-steps", type=int, default=64)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--n-epochs", type=int, default=1)
    parser.add_argument(
        "--env-steps", type=int, default=64, help="timed vec-env steps alone, per round"
    )
    parser.add_argument(
        "--forward-passes", type=int, default=20, help="timed forward passes alone, per round"
    )
    parser.add_argument(
        "--bound-warmup", type=int, default=3, help="untimed steps and passes before those"
    )
    parser.add_argument(
        "--torch-threads", type=int, default=None, help="torch.set_num_threads (default: torch's)"
    )
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "sb3_rollout_pistonball.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    for name in ("rounds", "updates", "env_steps", "forward_passes", "num_envs", "num_cpus"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    if args.torch_threads is not None:
        torch.set_num_threads(args.torch_threads)
    routes = args.routes.split(",")
    rounds: dict[str, list[dict[str, Any]]] = {route: [] for route in routes}
    for round_index in range(args.rounds):
        order = routes if round_index % 2 == 0 else routes[::-1]
        for route in order:
            print(f"{route} (round {round_index + 1} of {args.rounds}) ...", file=sys.stderr)
            rounds[route].append(measure(route, args))
            r = summarize(route, rounds[route][-1], args)
            print(
                f"  rollout {r['rollout_ms_per_step']:.1f} ms/step ({r['rollout_sps']:.0f} "
                f"rows/s); in the loop forward {r['in_loop_forward_ms']:.1f} ms, env step "
                f"{r['in_loop_env_step_ms']:.1f} ms; alone forward {r['forward_alone_ms']:.1f} "
                f"ms, env step {r['env_step_alone_ms']:.1f} ms",
                file=sys.stderr,
            )
    records = []
    for route in routes:
        record = summarize(route, join(rounds[route]), args)
        record["rounds"] = [
            {**summarize(route, samples, args), "samples": samples} for samples in rounds[route]
        ]
        records.append(record)
    add_ratios(records)
    print(format_table(records))
    info = machine_info()
    print(
        f"\npistonball_v6, {args.num_envs} envs ({records[0]['rows']} rows), "
        f"n_steps {args.n_steps}, {info['usable_cpus']} usable CPUs, load average "
        f"{info['load_average']}, torch threads {torch.get_num_threads()}"
    )
    for r in records:
        if "rollout_x_supersuit_without_values" in r:
            print(
                f"{r['route']}: rollout x supersuit {r['rollout_x_supersuit']:.2f}, without "
                f"predict_values {r['rollout_x_supersuit_without_values']:.2f}"
            )
    for r in records:
        print(
            f"{r['route']}: forward {r['forward_alone_ms']:.1f} ms + env step "
            f"{r['env_step_alone_ms']:.1f} ms per step alone; rollout "
            f"{r['rollout_ms_per_step']:.1f} ms per step = forward {r['in_loop_forward_ms']:.1f} "
            f"+ env step {r['in_loop_env_step_ms']:.1f} + values {r['in_loop_values_ms']:.1f} "
            f"+ rest {r['in_loop_rest_ms']:.1f} ms"
        )
    run_record.write(
        args.json,
        records,
        torch_threads=torch.get_num_threads(),
        options={k: v for k, v in vars(args).items() if k != "json"},
        env_kwargs=ENV_KWARGS,
        ppo_kwargs=PPO_KWARGS,
        route_versions={name: version(name) for name in ("supersuit", "pettingzoo", "torch")},
    )
    print(f"wrote {os.path.abspath(args.json)}")
    return 0


# The guard matters: workers started by spawn or forkserver re-import this file.
if __name__ == "__main__":
    raise SystemExit(main())
