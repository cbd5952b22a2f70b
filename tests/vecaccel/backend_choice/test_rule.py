"""The rule of ``vecaccel.backend_choice.choose_backend``: its choices on given step costs, one
env's (properties over the whole range, and CartPole's and Pong's figures) and a vector env's
(cheap and costly batched simulators, EnvPool with and without its own threads)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.backend_choice import (
    INLINE_MAX_STEP_S,
    MIN_SAVING_S,
    ROUND_TRIP_S,
    SHM_MIN_SLICE_S,
    choose_backend,
)
from vecaccel.backend_choice.vector_step_cost import VectorStepCost, worker_slots

RANK = {"serial": 0, "hybrid": 1, "shm": 2}
CHEAP_S, COSTLY_S = 13e-6, 800e-6  # CartPole's step and Pong's, roughly

step_costs = st.floats(min_value=0.0, max_value=0.1, allow_nan=False)
counts = st.integers(min_value=1, max_value=512)
cpu_counts = st.integers(min_value=1, max_value=64)


# ---------------------------------------------------------------------------------------------
# one env's step cost


@settings(max_examples=300, deadline=None)
@given(
    step_s=step_costs,
    num_envs=counts,
    cpus=cpu_counts,
    isolate=st.booleans(),
    workers=st.booleans(),
    num_workers=st.none() | st.integers(min_value=1, max_value=64),
)
def test_the_rule_gives_a_runnable_choice_and_says_why(
    step_s, num_envs, cpus, isolate, workers, num_workers
):
    choice = choose_backend(
        step_s, num_envs, cpus, isolate=isolate, workers=workers, num_workers=num_workers
    )
    assert choice.backend in RANK and choice.reason
    if isolate:  # nothing in the caller's process: no serial, no inline share
        assert choice.backend == "shm" and "inline_envs" not in choice.options
    if workers or isolate:
        assert choice.backend != "serial"
    if choice.backend == "serial":
        assert choice.options == {}
        saved = num_envs * step_s * (1 - 1 / cpus)
        assert num_envs == 1 or cpus == 1 or saved <= ROUND_TRIP_S
    else:
        workers_chosen = choice.options["num_workers"]
        assert workers_chosen == (num_workers or workers_chosen)
        assert 1 <= workers_chosen <= max(num_workers or 0, cpus, 1)
    if choice.backend == "hybrid":
        inline = choice.options["inline_envs"]
        assert step_s < INLINE_MAX_STEP_S
        assert 1 <= inline < num_envs  # the workers have envs too
        assert choice.options["num_workers"] < num_envs
    if choice.backend == "shm" and num_workers is None:
        assert choice.options["num_workers"] == min(num_envs, cpus)


@settings(max_examples=300, deadline=None)
@given(low=step_costs, high=step_costs, num_envs=counts, cpus=cpu_counts)
def test_a_costlier_env_step_never_moves_the_choice_back_towards_the_caller(
    low, high, num_envs, cpus
):
    low, high = sorted((low, high))
    cheap = choose_backend(low, num_envs, cpus)
    costly = choose_backend(high, num_envs, cpus)
    assert RANK[cheap.backend] <= RANK[costly.backend]


def test_cartpole_and_pong_costs_on_two_cpus():
    assert choose_backend(CHEAP_S, 4, 2).backend == "serial"
    assert choose_backend(CHEAP_S, 64, 2).options == {"num_workers": 1, "inline_envs": 32}
    assert choose_backend(COSTLY_S, 16, 2).options == {"num_workers": 2}
    assert choose_backend(COSTLY_S, 1, 2).backend == "serial"  # nothing to spread


@pytest.mark.parametrize("bad", [-1.0, float("nan"), "fast", True])
def test_the_rule_refuses_a_step_cost_that_is_not_seconds(bad):
    with pytest.raises(ValueError, match="step_s"):
        choose_backend(bad, 4, 2)


@pytest.mark.parametrize(
    "counts, named",
    [((0, 2, None), "num_envs"), ((4, 0, None), "cpus"), ((4, 2, 0), "num_workers"),
     ((True, 2, None), "num_envs"), ((4, 2.0, None), "cpus")],
)  # fmt: skip
def test_the_rule_refuses_counts_that_are_not_positive_integers(counts, named):
    num_envs, cpus, num_workers = counts
    with pytest.raises(ValueError, match=f"{named} must be a positive integer"):
        choose_backend(CHEAP_S, num_envs, cpus, num_workers=num_workers)


# ---------------------------------------------------------------------------------------------
# a vector env's step cost


def test_a_cheap_batched_simulator_stays_in_the_caller():
    # CartPole's native vector env on 2 cores: 256 envs in 47 µs, 128 in 25 µs
    choice = choose_backend(VectorStepCost(47e-6, 25e-6), 256, 2)
    assert choice.backend == "serial", choice
    assert "round trip" in choice.reason


def test_a_large_cheap_batch_steps_a_slice_in_the_caller_beside_a_worker():
    # 4,096 envs gain a few per cent from hybrid on a quiet machine, too few to risk; 16,384 more
    assert choose_backend(VectorStepCost(181e-6, 95e-6), 4096, 2).backend == "serial"
    choice = choose_backend(VectorStepCost(900e-6, 450e-6), 16384, 2)
    assert choice.backend == "hybrid", choice
    assert choice.options == {"num_workers": 1, "inline_envs": 8192}


def test_a_costly_slice_goes_to_one_worker_per_cpu():
    # Pong from EnvPool with one thread per pool: 16 envs in 8 ms, a slice of 8 in 4 ms
    choice = choose_backend(VectorStepCost(8e-3, 4e-3, cores=1.0), 16, 2)
    assert choice.backend == "shm" and choice.options == {"num_workers": 2}, choice
    assert choose_backend(VectorStepCost(40e-3, 10e-3), 64, 4).options == {"num_workers": 4}


def test_envpool_with_its_own_threads_stays_in_the_caller():
    # EnvPool's default threads: the pool alone keeps both cores busy
    choice = choose_backend(VectorStepCost(4e-3, 4e-3, cores=1.9), 16, 2)
    assert choice.backend == "serial", choice
    assert "its own threads" in choice.reason


def test_a_multithreaded_vector_env_gets_the_workers_its_threads_leave_room_for():
    assert worker_slots(64, 16, cores=4.1) == 4
    choice = choose_backend(VectorStepCost(40e-3, 10e-3, cores=4.1), 64, 16)
    assert choice.backend == "shm" and choice.options == {"num_workers": 4}, choice


@pytest.mark.parametrize(
    "step_s, slice_s",
    [(47e-6, 25e-6), (200e-6, 100e-6), (2e-3, 1e-3), (20e-3, 10e-3), (0.0, 0.0)],
)
@pytest.mark.parametrize("cpus", [1, 2, 8])
def test_a_costlier_vector_step_never_moves_the_choice_back_towards_the_caller(
    step_s, slice_s, cpus
):
    low = choose_backend(VectorStepCost(step_s, slice_s), 4096, cpus)
    high = choose_backend(VectorStepCost(step_s * 10, slice_s * 10), 4096, cpus)
    assert RANK[low.backend] <= RANK[high.backend], (low, high)


def test_the_thresholds_are_where_the_rule_says():
    at_the_margin = VectorStepCost(2 * MIN_SAVING_S, MIN_SAVING_S)
    assert choose_backend(at_the_margin, 4096, 2).backend == "serial"
    past_it = VectorStepCost(2.2 * MIN_SAVING_S, MIN_SAVING_S)
    assert choose_backend(past_it, 4096, 2).backend == "hybrid"
    above = VectorStepCost(2 * SHM_MIN_SLICE_S, SHM_MIN_SLICE_S)
    assert choose_backend(above, 4096, 2).backend == "shm"


def test_isolation_or_worker_options_keep_the_envs_in_workers():
    cheap = VectorStepCost(47e-6, 25e-6)
    assert choose_backend(None, 256, 2, isolate=True).backend == "shm"
    assert choose_backend(cheap, 256, 2, workers=True).backend != "serial"
    kept = choose_backend(cheap, 256, 2, workers=True, num_workers=3)
    assert kept.options["num_workers"] == 3
    with pytest.raises(ValueError, match="step cost is needed"):
        choose_backend(None, 256, 2)


def test_one_env_or_one_cpu_is_serial():
    assert choose_backend(VectorStepCost(1.0, 1.0), 1, 8).backend == "serial"
    assert choose_backend(VectorStepCost(1.0, 0.5), 64, 1).backend == "serial"
