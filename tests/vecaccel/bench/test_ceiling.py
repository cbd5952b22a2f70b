"""The ceiling: one process per usable CPU, each stepping its own raw env (or for a batched
simulator its own native vector env), their rates summed, and a failing process reported with
its error."""

from __future__ import annotations

import pytest
from toy_envs import BrokenStepEnv
from toy_vector_envs import not_a_vector_env

from vecaccel.bench.ceiling import measure_ceiling, measure_vector_ceiling
from vecaccel.bench.workloads import BenchEnv, resolve_env


def test_a_failing_ceiling_process_is_reported():
    with pytest.raises(RuntimeError, match="ceiling measurement failed"):
        measure_vector_ceiling(not_a_vector_env, 4, 0.01, 0.0, 0, processes=2)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_ceiling_processes_report_their_steps_or_their_error(context):
    # two processes show the rates summed; under spawn one shows that the env travels, at the
    # cost of one fresh interpreter rather than two
    count = 2 if context == "fork" else 1
    rate, processes = measure_ceiling(
        resolve_env("CartPole-v1"), 0.01, 0.0, seed=0, processes=count, context=context
    )
    assert rate > 0 and processes == count
    broken = BenchEnv("broken", BrokenStepEnv, BrokenStepEnv)
    with pytest.raises(RuntimeError, match="this env cannot step"):
        measure_ceiling(broken, 0.01, 0.0, seed=0, processes=count, context=context)
