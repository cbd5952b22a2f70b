"""``vecaccel bench``: environment-steps per second of vecaccel backends beside their peers.

One run measures, for every ``num_envs`` of a sweep, each vecaccel backend beside Gymnasium's
``SyncVectorEnv`` and ``AsyncVectorEnv``, Stable-Baselines3's ``SubprocVecEnv`` and
``DummyVecEnv`` (when installed) and EnvPool (when installed and the env has an EnvPool twin),
plus the raw rate of one plain env stepped in a loop and the ceiling: one process per usable
CPU, each stepping its own raw env, summed. Every rate is also reported as its share of the
ceiling. Actions are random and sampled before the clock starts, so only stepping is timed. The
optional peers and matplotlib are imported lazily: this package imports with only vecaccel's
own dependencies installed.

The package's modules hold one part each: :mod:`~vecaccel.bench.workloads` (what is measured),
:mod:`~vecaccel.bench.peers` (what vecaccel is compared with), :mod:`~vecaccel.bench.timing` (the
clock), :mod:`~vecaccel.bench.ceiling` (the processes that measure the ceiling),
:mod:`~vecaccel.bench.sweep` (one run over backends, peers and ``num_envs``),
:mod:`~vecaccel.bench.report` (table, machine, plot), :mod:`~vecaccel.bench.command` (the CLI),
:mod:`~vecaccel.bench.record` (the run record and the one result format every benchmark
writes), :mod:`~vecaccel.bench.seeds` (one child process per run, for the learning
benchmarks) and :mod:`~vecaccel.bench.learning` (what the learning benchmarks share: the return
curve and its score, the median of races, rliable's interval, the plot of seeds); :mod:`~vecaccel.bench.policy_loop` times a rollout loop with a torch policy in it,
on any backend, and :mod:`~vecaccel.bench.device_usage` records a device's peak memory and busy
share meanwhile.

Example:
    >>> from vecaccel.bench import format_table, run_benchmark
    >>> results = run_benchmark(
    ...     "CartPole-v1", [2], backends=["serial"], peers=["raw"], seconds=0.01, warmup=0.0
    ... )
    >>> [(r["impl"], r["num_envs"], r["status"]) for r in results]
    [('raw', 1, 'ok'), ('vecaccel-serial', 2, 'ok')]
    >>> print(format_table(results).splitlines()[0])
    | env | num_envs | implementation | steps/s | ceiling | share of ceiling | x raw | x gym-sync | x gym-async |
"""

from __future__ import annotations

from vecaccel.bench.ceiling import measure_ceiling
from vecaccel.bench.command import bench_command, parse_backend_options
from vecaccel.bench.peers import PEERS
from vecaccel.bench.record import (
    RESULT_FORMAT,
    RunRecord,
    check_output_path,
    command_line,
    load_average,
    load_result,
)
from vecaccel.bench.report import (
    format_table,
    machine_info,
    plot_results,
    shares_of_ceiling,
)
from vecaccel.bench.seeds import ChildRunError, run_in_child, run_seeds
from vecaccel.bench.sweep import (
    DEFAULT_BACKENDS,
    DEFAULT_NUM_ENVS,
    default_backends,
    parse_workloads,
    run_benchmark,
)
from vecaccel.bench.workloads import BenchEnv, make_gym_env, make_pong_env, resolve_env

__all__ = [
    "DEFAULT_BACKENDS",
    "DEFAULT_NUM_ENVS",
    "PEERS",
    "RESULT_FORMAT",
    "BenchEnv",
    "ChildRunError",
    "RunRecord",
    "bench_command",
    "check_output_path",
    "command_line",
    "default_backends",
    "format_table",
    "load_average",
    "load_result",
    "machine_info",
    "make_gym_env",
    "make_pong_env",
    "measure_ceiling",
    "parse_backend_options",
    "parse_workloads",
    "plot_results",
    "resolve_env",
    "run_benchmark",
    "run_in_child",
    "run_seeds",
    "shares_of_ceiling",
]
