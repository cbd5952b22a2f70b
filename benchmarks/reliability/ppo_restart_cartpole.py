"""PPO on CartPole with ``on_worker_failure="restart"`` while a worker is SIGKILLed every 2,000 steps.

Training must still solve CartPole. The killed worker's envs are rebuilt and
reseeded, their interrupted episodes end as truncated (so PPO bootstraps them), and the episode
statistics only count episodes that really ended (``RecordEpisodeStatistics`` lives inside the
rebuilt env, so a cut-off episode never reports a return).

Run (writes ``benchmarks/results/ppo_restart_cartpole.json``)::

    python benchmarks/reliability/ppo_restart_cartpole.py
"""

from __future__ import annotations

import argparse
import os
import signal
import time

import numpy as np

from vecaccel.bench import RunRecord, command_line
from vecaccel.trainers.algos.ppo import PPO, PRESETS
from vecaccel.trainers.envs.make import make_env_for_training

RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--total-timesteps", type=int, default=100_000)
    parser.add_argument("--kill-every", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--json",
        default=os.path.join(RESULTS, "ppo_restart_cartpole.json"),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))

    preset = dict(PRESETS["cartpole"])
    envs = make_env_for_training(
        "CartPole-v1",
        preset["num_envs"],
        backend="shm",
        num_workers=2,
        on_worker_failure="restart",
        max_restarts=10_000,
    )
    agent = PPO(envs, **preset, seed=args.seed, torch_threads=1)
    rng = np.random.default_rng(args.seed)
    state = {"next_kill": args.kill_every, "kills": 0, "returns": [], "steps": []}

    def kill_a_worker(agent: PPO, metrics: dict) -> None:
        while agent.global_step >= state["next_kill"]:
            worker = envs.pool.workers[int(rng.integers(len(envs.pool.workers)))]
            os.kill(worker.process.pid, signal.SIGKILL)
            state["kills"] += 1
            state["next_kill"] += args.kill_every
        ret = metrics.get("charts/episodic_return")
        if ret is not None:
            state["returns"].append(float(ret))
            state["steps"].append(agent.global_step)

    start = time.perf_counter()
    agent.learn(args.total_timesteps, callback=kill_a_worker)
    elapsed = time.perf_counter() - start
    failures = envs.failures
    envs.close()
    final = float(np.mean(state["returns"][-5:])) if state["returns"] else float("nan")
    solved_at = next((s for s, r in zip(state["steps"], state["returns"]) if r >= 475), None)
    print(
        f"PPO CartPole, shm with on_worker_failure='restart', a worker SIGKILLed every "
        f"{args.kill_every} steps"
    )
    print(
        f"steps {args.total_timesteps}, workers killed {state['kills']}, failures recovered "
        f"{failures}, final mean return {final:.1f}, first >= 475 at step {solved_at}, "
        f"{elapsed:.1f} s"
    )
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        run_record.write(
            args.json,
            [{"step": s, "episodic_return": r} for s, r in zip(state["steps"], state["returns"])],
            summary={
                "kills": state["kills"],
                "failures_recovered": failures,
                "final_mean_return": final,
                "solved_at_step": solved_at,
                "seconds": elapsed,
            },
            total_steps=args.total_timesteps,
            kill_every=args.kill_every,
            seed=args.seed,
        )
    return 0 if final >= 475 else 1


if __name__ == "__main__":
    raise SystemExit(main())
