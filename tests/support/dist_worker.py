"""One rank of the distributed tests, launched by ``torchrun`` from ``test_distributed.py``.

Trains a tiny agent (``dqn-async``/``ppo-async``: asynchronously, a collector process per rank), then
gathers every rank's parameter checksum and step counts and writes them (rank 0) as JSON to
``--out``. With ``--hold`` it writes ``RUN_DIR/pid-RANK`` after the first update (``dqn-async``:
after a few, with the sampler's pid in ``RUN_DIR/sampler-pid-RANK``) and keeps training until
killed (for the dead-rank and dead-sampler tests).

With ``--train ALGO:STEPS[:fixed-lag|:norm]`` (repeated) the ranks train one agent after another in
the same process group, each seeded as when it runs alone, and ``--out`` gets ``{SPEC: result}`` (a
spec given again: ``SPEC#2``, ...): one launch of torch and the ranks for several checks. ``:norm``
trains ``ppo`` or ``ppo-async`` with normalised observations and rewards, and the result holds every
rank's statistics.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path
from typing import Any

import torch

torch.set_num_threads(1)

ALGOS = ("ppo", "dqn", "dqn-async", "ppo-async")


def _watch_sampler(sampler_pid_file: Path, pid_file: Path, agent: Any) -> None:
    """Once the async collector process runs and a few updates are done, write its pid and ours."""
    import multiprocessing
    import threading
    import time

    def watch() -> None:
        while True:
            children = [
                p for p in multiprocessing.active_children() if p.name == "vecaccel-async-sampler"
            ]
            if children and agent.num_updates > 5:
                sampler_pid_file.write_text(str(children[0].pid))
                pid_file.write_text(str(os.getpid()))
                return
            time.sleep(0.05)

    threading.Thread(target=watch, daemon=True).start()


def train(
    algo: str, total_timesteps: int, fixed_lag: bool, hold: bool, out: Path, norm: bool = False
) -> dict | None:
    """Train one agent on every rank; rank 0 returns what the test checks (others ``None``)."""
    import torch.distributed as dist

    from vecaccel.trainers.services import distributed

    rank = int(os.environ["RANK"])
    pid_file = out.parent / f"pid-{rank}"

    def mark(*_: Any) -> None:
        if hold and not pid_file.exists():
            pid_file.write_text(str(os.getpid()))

    common: dict[str, Any] = dict(backend="serial", seed=3, torch_threads=1)
    normalization: dict[str, Any] = dict(norm_obs=True, norm_reward=True) if norm else {}
    extra: dict[str, Any] = {}
    if algo == "ppo":
        from vecaccel.trainers import PPO

        agent: Any = PPO(
            "CartPole-v1",
            num_envs=2,
            num_steps=8,
            num_minibatches=2,
            update_epochs=2,
            lr_scaling="linear",
            base_batch_size=16,
            **common,
            **normalization,
        )
        model = agent.model
        agent.learn(total_timesteps, callback=lambda a, m: mark())
        local_steps = agent.num_updates * agent.local_batch_size
        local_batch = agent.local_batch_size
    elif algo == "dqn-async":
        from vecaccel.trainers import AsyncRunner
        from vecaccel.trainers.algos.dqn import DQN

        agent = DQN(
            env=None,
            env_id="CartPole-v1",
            num_envs=2,
            batch_size=16,
            learning_starts=100,
            buffer_size=2_000,
            replay_ratio=4.0,
            async_max_lead=32,
            log_every_steps=200,
            hidden_sizes=(32, 32),
            progress=False,
            tensorboard=False,
            **common,
        )
        runner = AsyncRunner(agent)  # builds the networks for the sampler's env
        model = agent.q_network
        if hold:
            _watch_sampler(out.parent / f"sampler-pid-{rank}", pid_file, agent)
        runner.run(total_timesteps, fixed_lag=fixed_lag)
        stats = runner.stats
        local_steps = agent.global_step // agent.world_size
        local_batch = agent.config.batch_size
        extra = {
            "replay_ratio": stats.replay_ratio,
            "logged_replay_ratio": [
                [row["step"], row["charts/replay_ratio"]]
                for row in agent.logger.history
                if row.get("charts/replay_ratio") is not None
            ],
            "logged_world_size": agent.logger.history[-1].get("charts/world_size"),
            "episode_log": agent.episode_log,
        }
    elif algo == "ppo-async":
        from vecaccel.trainers import PPO, AsyncRunner

        agent = PPO(
            None, env_id="CartPole-v1", num_envs=2, num_steps=8, num_minibatches=2,
            update_epochs=2, **common, **normalization,
        )  # fmt: skip
        model = agent.model
        AsyncRunner(agent).run(total_timesteps)
        local_steps = agent.num_updates * agent.local_batch_size
        local_batch = agent.local_batch_size
    else:
        from vecaccel.trainers.algos.dqn import DQN

        agent = DQN(
            "CartPole-v1",
            num_envs=2,
            batch_size=8,
            learning_starts=32,
            buffer_size=500,
            replay_ratio=4.0,
            lr_scaling="linear",
            progress=False,
            tensorboard=False,
            **common,
        )
        model = agent.q_network
        agent.learn(total_timesteps, callback=lambda a: mark())
        local_steps = agent.global_step // agent.world_size
        local_batch = agent.config.batch_size
    # in --hold mode the budget is huge: a killed peer must end this rank with an error

    flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    mine = torch.tensor(
        [flat.sum().item(), (flat * flat).sum().item(), float(local_steps), float(local_batch)],
        dtype=torch.float64,
    )
    gathered = [torch.zeros_like(mine) for _ in range(distributed.world_size())]
    dist.all_gather(gathered, mine)
    if agent.normalizer is not None:  # every rank's statistics, for the test to compare
        statistics = torch.cat(agent.normalizer.tensors())
        ranks = [torch.zeros_like(statistics) for _ in range(distributed.world_size())]
        dist.all_gather(ranks, statistics)
        extra["normalization"] = [rank_statistics.tolist() for rank_statistics in ranks]
    result = None
    if rank == 0:
        rows = [g.tolist() for g in gathered]
        result = {
            "checksums": [row[:2] for row in rows],
            "local_steps": [row[2] for row in rows],
            "local_batch": [row[3] for row in rows],
            "global_step": agent.global_step,
            "batch_size": getattr(agent, "batch_size", None),
            "lr_scale": agent.lr_scale,
            "world_size": distributed.world_size(),
            "updates": getattr(agent, "update_index", getattr(agent, "num_updates", 0)),
            "seed": agent.config.seed,
            **extra,
        }
    agent.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algo", default="ppo", choices=ALGOS)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--total-timesteps", type=int, default=128)
    parser.add_argument("--hold", action="store_true")
    parser.add_argument(
        "--fixed-lag", action="store_true", help="dqn-async: AsyncRunner.run's option"
    )
    parser.add_argument(  # (not --run: torchrun would take it for its --run-path)
        "--train",
        action="append",
        metavar="ALGO:STEPS[:fixed-lag|:norm]",
        help="train these one after another instead (--algo, --total-timesteps, --fixed-lag unused)",
    )
    args = parser.parse_args()

    from vecaccel.trainers.services import distributed

    if args.train:
        results = {}
        for spec in args.train:
            algo, steps, *option = spec.split(":")
            if algo not in ALGOS or option not in ([], ["fixed-lag"], ["norm"]):
                parser.error(f"--train {spec}: not ALGO:STEPS[:fixed-lag|:norm]")
            fixed_lag, norm = option == ["fixed-lag"], option == ["norm"]
            # a spec given again is a repeat: its result is kept under SPEC#2, SPEC#3, ...
            repeat = sum(key.split("#")[0] == spec for key in results)
            key = f"{spec}#{repeat + 1}" if repeat else spec
            results[key] = train(algo, int(steps), fixed_lag, False, args.out, norm)
        if int(os.environ["RANK"]) == 0:
            args.out.write_text(json.dumps(results))
    else:
        result = train(args.algo, args.total_timesteps, args.fixed_lag, args.hold, args.out)
        if result is not None:
            args.out.write_text(json.dumps(result))
    # DistributedDataParallel must go before its process group does, or exit may abort
    gc.collect()
    distributed.cleanup()


if __name__ == "__main__":
    main()
