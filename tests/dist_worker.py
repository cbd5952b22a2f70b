"""One rank of the distributed tests, launched by ``torchrun`` from ``test_distributed.py``.

Trains a tiny agent, then gathers every rank's parameter checksum and step counts and writes them
(rank 0) as JSON to ``--out``. With ``--hold`` it writes ``RUN_DIR/pid-RANK`` after the first update
and keeps training until killed (for the dead-rank test).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

import torch

torch.set_num_threads(1)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--algo", default="ppo")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--total-steps", type=int, default=128)
    parser.add_argument("--hold", action="store_true")
    args = parser.parse_args()

    import torch.distributed as dist

    from vecaccel.trainers import distributed

    rank = int(os.environ["RANK"])
    pid_file = args.out.parent / f"pid-{rank}"

    def mark(*_: Any) -> None:
        if not pid_file.exists():
            pid_file.write_text(str(os.getpid()))

    common: dict[str, Any] = dict(backend="serial", seed=3, torch_threads=1)
    if args.algo == "ppo":
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
        )
        model = agent.model
        agent.learn(args.total_steps, callback=lambda a, m: mark())
        local_steps = agent.update_index * agent.local_batch_size
        local_batch = agent.local_batch_size
    else:
        from vecaccel.trainers.dqn import DQN

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
        agent.learn(args.total_steps, callback=lambda a: mark())
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
    if rank == 0:
        rows = [g.tolist() for g in gathered]
        args.out.write_text(
            json.dumps(
                {
                    "checksums": [row[:2] for row in rows],
                    "local_steps": [row[2] for row in rows],
                    "local_batch": [row[3] for row in rows],
                    "global_step": agent.global_step,
                    "batch_size": getattr(agent, "batch_size", None),
                    "lr_scale": agent.lr_scale,
                    "world_size": distributed.world_size(),
                    "updates": getattr(agent, "update_index", getattr(agent, "num_updates", 0)),
                    "seed": agent.config.seed,
                }
            )
        )
    agent.close()
    # DistributedDataParallel must go before its process group does, or exit may abort
    del agent, model
    distributed.cleanup()


if __name__ == "__main__":
    main()
