"""The cost of a step over Ray: the ``ray`` backend against local ``shm`` on one machine.

Three figures, all with Ray bound to 127.0.0.1, without dashboard or usage statistics:

1. steps/s of local ``shm`` and of ``ray`` with 1 and 2 shards of ``shm`` (the machine's CPUs
   split between the shards' workers) on each workload, beside the ceiling (one raw env per
   usable CPU, summed, measured in the same run);
2. the per-call overhead: one env stepped through one ``ray`` shard of ``serial`` against the
   same env stepped in place, and a bare synchronous Ray actor call, in microseconds;
3. on a simulated two-node cluster (``ray.cluster_utils.Cluster``, both nodes on this machine,
   so they share its cores), 2 shards placed ``SPREAD`` (one per node) against ``PACK`` (both on
   one node): whether anything serialises across nodes.

Every figure times its cases in alternating windows (``--rounds``) and keeps each case's
median, so that the load of a shared machine weighs on every case alike.

Run (writes ``benchmarks/results/ray_step_cost.json``)::

    python benchmarks/scale_out/ray_step_cost.py --seconds 3
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

import numpy as np

import vecaccel
from vecaccel.bench import RunRecord, command_line, measure_ceiling, parse_workloads, resolve_env
from vecaccel.worker import usable_cpus

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results")
DEFAULT_WORKLOADS = {"pong": [16, 64], "CartPole-v1": [256]}
#: Ray's published figure for one synchronous actor call (its microbenchmarks, one node).
RAY_PUBLISHED_CALL_US = 500.0
RAY_ARGS = {"include_dashboard": False, "logging_level": "WARNING"}


def _prepare(envs: Any, seed: int = 0) -> list:
    """Reset and warm ``envs``; return the random actions its timed steps take, in turn."""
    envs.reset(seed=seed)
    envs.action_space.seed(seed)
    actions = [envs.action_space.sample() for _ in range(32)]
    for k in range(10):
        envs.step(actions[k % 32])
    return actions


def _timed(envs: Any, actions: list, seconds: float) -> float:
    """Steps/s of ``envs`` over ``seconds``, random actions sampled before the clock."""
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        envs.step(actions[steps % 32])
        steps += 1
    return steps * envs.num_envs / (time.perf_counter() - start)


def _interleaved(cases: dict[str, Any], seconds: float, rounds: int) -> dict[str, float]:
    """The median steps/s of each case over ``rounds`` windows taken in turn, so that a change
    of the machine's load hits every case alike."""
    actions = {label: _prepare(envs) for label, envs in cases.items()}
    rates: dict[str, list[float]] = {label: [] for label in cases}
    for _ in range(rounds):
        for label, envs in cases.items():
            rates[label].append(_timed(envs, actions[label], seconds / rounds))
    return {label: float(np.median(values)) for label, values in rates.items()}


def _step_cost(
    workloads: dict[str, list[int]], seconds: float, rounds: int, cpus: int
) -> list[dict]:
    rows = []
    for name, counts in workloads.items():
        target = resolve_env(name)
        ceiling, processes = measure_ceiling(target, seconds, 0.5, 0)
        rows.append({"figure": "ceiling", "env": target.label, "steps_per_s": ceiling})
        print(f"{target.label}: ceiling {ceiling:,.0f} steps/s ({processes} processes)")
        for n in counts:
            cases: dict[str, Any] = {}
            shards_of: dict[str, int] = {}
            try:
                cases["shm"] = vecaccel.make_vec(target.make_vec_arg, n, backend="shm")
                shards_of["shm"] = 0
                for shards in (1, 2):
                    workers = max(1, cpus // shards)
                    label = f"ray, {shards} shard(s) of shm x {workers} workers"
                    cases[label] = vecaccel.make_vec(
                        target.make_vec_arg,
                        n,
                        backend="ray",
                        num_shards=shards,
                        num_workers=workers,
                        shard_resources={"num_cpus": 0.5},
                    )
                    shards_of[label] = shards
                rates = _interleaved(cases, seconds * len(cases), rounds)
            finally:
                for envs in cases.values():
                    envs.close()
            local = rates["shm"]
            for impl, rate in rates.items():
                rows.append(
                    {
                        "figure": "step_cost",
                        "env": target.label,
                        "num_envs": n,
                        "impl": impl,
                        "num_shards": shards_of[impl],
                        "steps_per_s": rate,
                        "ms_per_step": 1000.0 * n / rate,
                        "vs_local_shm": rate / local,
                        "share_of_ceiling": rate / ceiling,
                    }
                )
                print(
                    f"  {n:>4} envs  {impl:<38} {rate:>10,.0f} steps/s  "
                    f"{1000.0 * n / rate:7.2f} ms/step  x{rate / local:.2f} of shm  "
                    f"{rate / ceiling:.2f} of ceiling",
                    flush=True,
                )
    return rows


class _Echo:
    def ping(self, value: Any) -> Any:
        return value


def _overhead(seconds: float, rounds: int) -> list[dict]:
    import ray

    cases = {
        "in_place": vecaccel.make_vec("CartPole-v1", 1, backend="serial"),
        "over_ray": vecaccel.make_vec(
            "CartPole-v1", 1, backend="ray", num_shards=1, shard_backend="serial"
        ),
    }
    try:
        rates = _interleaved(cases, 2 * seconds, rounds)
    finally:
        for envs in cases.values():
            envs.close()
    in_place, over_ray = rates["in_place"], rates["over_ray"]
    actor = ray.remote(_Echo).options(num_cpus=0).remote()
    ray.get(actor.ping.remote(0))
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        ray.get(actor.ping.remote(calls))
        calls += 1
    bare_us = 1e6 * (time.perf_counter() - start) / calls
    ray.kill(actor)
    step_us = 1e6 / over_ray - 1e6 / in_place
    print(
        f"per-call overhead: {step_us:,.0f} us a step (ray shard of serial, 1 CartPole env, "
        f"{1e6 / over_ray:,.0f} us against {1e6 / in_place:,.1f} us in place); bare actor call "
        f"{bare_us:,.0f} us; Ray's published figure ~{RAY_PUBLISHED_CALL_US:.0f} us",
        flush=True,
    )
    return [
        {
            "figure": "overhead",
            "ray_step_us": 1e6 / over_ray,
            "in_place_step_us": 1e6 / in_place,
            "overhead_us": step_us,
            "bare_actor_call_us": bare_us,
            "ray_published_call_us": RAY_PUBLISHED_CALL_US,
        }
    ]


def _two_nodes(name: str, n: int, seconds: float, rounds: int, cpus: int) -> list[dict]:
    import ray
    from ray.cluster_utils import Cluster

    # logical CPUs: both placements fit at once (the nodes share this machine's cores)
    node = {"num_cpus": 4, "node_ip_address": "127.0.0.1", "include_dashboard": False}
    cluster = Cluster(initialize_head=True, head_node_args=node)
    rows = []
    cases: dict[str, Any] = {}
    try:
        cluster.add_node(**node)
        ray.init(address=cluster.address, logging_level="WARNING")
        cluster.wait_for_nodes()
        target = resolve_env(name)
        for placement in ("SPREAD", "PACK"):
            cases[placement] = vecaccel.make_vec(
                target.make_vec_arg,
                n,
                backend="ray",
                num_shards=2,
                num_workers=max(1, cpus // 2),
                placement=placement,
                shard_resources={"num_cpus": 1},
            )
        nodes = {label: len(set(envs.shard_nodes)) for label, envs in cases.items()}
        rates = _interleaved(cases, seconds * len(cases), rounds)
    finally:
        for envs in cases.values():
            envs.close()
        ray.shutdown()
        cluster.shutdown()
    for placement, rate in rates.items():
        rows.append(
            {
                "figure": "two_nodes",
                "env": target.label,
                "num_envs": n,
                "placement": placement,
                "nodes_used": nodes[placement],
                "steps_per_s": rate,
                "vs_pack": rate / rates["PACK"],
            }
        )
        print(
            f"two-node cluster, {target.label} {n} envs, 2 shards {placement} on "
            f"{nodes[placement]} node(s): {rate:,.0f} steps/s",
            flush=True,
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="timed seconds per case")
    parser.add_argument(
        "--rounds",
        type=int,
        default=5,
        help="windows each case is timed in, taken in turn with the other cases (default: "
        "%(default)s)",
    )
    parser.add_argument(
        "--workload",
        action="append",
        metavar="ENV=N1,N2",
        help="env and env counts of the step-cost figure (repeatable; default: pong=16,64 "
        "and CartPole-v1=256)",
    )
    parser.add_argument(
        "--cluster-workload",
        default="pong=64",
        metavar="ENV=N",
        help="env and env count of the two-node figure (default: %(default)s)",
    )
    parser.add_argument(
        "--json",
        default=os.path.normpath(os.path.join(RESULTS, "ray_step_cost.json")),
        help="where the results go (default: %(default)s)",
    )
    args = parser.parse_args(argv)
    run_record = RunRecord(command_line(argv, __file__))
    import ray

    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    workloads = parse_workloads(args.workload, DEFAULT_WORKLOADS)
    cluster_env, cluster_counts = next(iter(parse_workloads([args.cluster_workload], {}).items()))
    cpus = usable_cpus()
    load_before = os.getloadavg()
    ray.init(_node_ip_address="127.0.0.1", **RAY_ARGS)
    try:
        rows = _step_cost(workloads, args.seconds, args.rounds, cpus)
        rows += _overhead(args.seconds, args.rounds)
    finally:
        ray.shutdown()
    rows += _two_nodes(cluster_env, cluster_counts[0], args.seconds, args.rounds, cpus)
    if args.json:
        os.makedirs(os.path.dirname(args.json) or ".", exist_ok=True)
        for row in rows:
            if row["figure"] == "ceiling":
                run_record.add_ceiling(row["env"], row["steps_per_s"], cpus)
        run_record.write(
            args.json,
            rows,
            note=(
                "one machine: the shards, their workers and (in the two-node figure) both "
                "nodes share its CPUs"
            ),
        )
    print(
        f"load average before {np.round(load_before, 2).tolist()}, after "
        f"{np.round(os.getloadavg(), 2).tolist()}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
