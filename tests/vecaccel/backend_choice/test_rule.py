"""``auto`` for vector env functions (``vectorized=True``) and EnvPool: the rule of
``vecaccel.backend_choice.choose_backend`` by its choices on given vector env costs, and
``make_vec(..., backend="auto", vectorized=True)`` on a cheap and on a costly vector env."""

from __future__ import annotations

import functools
import hashlib
import threading

import numpy as np
import pytest
from toy_vector_envs import costly_sync, native_cartpole

import vecaccel
from vecaccel.backend_choice import MIN_SAVING_S, SHM_MIN_SLICE_S, choose_backend
from vecaccel.backend_choice.vector_step_cost import (
    MULTICORE_RATIO,
    VectorStepCost,
    probe_vector_step_cost,
    slice_size,
    worker_slots,
)

# ---------------------------------------------------------------------------------------------
# the rule, on given costs


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
def test_a_costlier_step_never_moves_the_choice_back_towards_the_caller(step_s, slice_s, cpus):
    order = {"serial": 0, "hybrid": 1, "shm": 2}
    low = choose_backend(VectorStepCost(step_s, slice_s), 4096, cpus)
    high = choose_backend(VectorStepCost(step_s * 10, slice_s * 10), 4096, cpus)
    assert order[low.backend] <= order[high.backend], (low, high)


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


def test_slices_are_cut_as_the_workers_cut_them():
    assert slice_size(4096, 2) == 2048 and slice_size(5, 2) == 3
    assert worker_slots(4096, 2, 1.0) == 2 and worker_slots(3, 8, 1.0) == 3
    assert worker_slots(4096, 2, 1.0, num_workers=5) == 5


# ---------------------------------------------------------------------------------------------
# the probe and make_vec


def test_the_probe_steps_the_whole_batch_and_one_slice():
    sizes = []

    def recording(n):
        sizes.append(n)
        return native_cartpole(n)

    cost = probe_vector_step_cost(recording, 64, cpus=2, seconds=0.005)
    assert sizes == [64, 32]
    assert cost.step_s > 0 and cost.slice_step_s > 0 and cost.cores > 0


def test_a_busy_thread_of_the_caller_is_not_counted_as_the_env_s_cores():
    """A thread that was burning CPU (outside the GIL) before the probe began, as a training
    or data-loading thread does, is the process's, not the vector env's: the single-threaded
    env still reads as one core, and is not kept in the caller as a multithreaded one."""
    stop = threading.Event()
    chunk = bytes(8 << 20)

    def burn() -> None:
        while not stop.is_set():
            hashlib.sha256(chunk).digest()  # hashing releases the GIL

    thread = threading.Thread(target=burn, daemon=True)
    thread.start()
    try:
        fn = functools.partial(costly_sync, cpu_s=0.0012)
        cost = probe_vector_step_cost(fn, 8, cpus=2, seconds=0.2)
    finally:
        stop.set()
        thread.join()
    assert 0 < cost.cores < MULTICORE_RATIO, cost
    assert choose_backend(cost, 8, 2).backend == "shm"


def test_auto_keeps_a_cheap_native_vector_env_in_the_caller(no_leaks):
    envs = vecaccel.make_vec(native_cartpole, 256, backend="auto", vectorized=True)
    try:
        record = envs.metadata["backend"]
        assert record["name"] == "serial", record
        assert record["probed"] is True
        assert set(record["vector_step_cost"]) == {"step_s", "slice_step_s", "cores"}
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (256, 4)
        envs.step(np.zeros(256, dtype=np.int64))
    finally:
        envs.close()


def test_auto_spreads_a_costly_vector_env_over_workers(no_leaks):
    # 8 envs of 1.2 ms each: a slice of 4 costs ~4.8 ms, far above the shm threshold
    fn = functools.partial(costly_sync, cpu_s=0.0012)
    envs = vecaccel.make_vec(fn, 8, backend="auto", vectorized=True)
    try:
        record = envs.metadata["backend"]
        cpus = vecaccel.worker.usable_cpus()
        if cpus == 1:
            assert record["name"] == "serial", record
        else:
            # the reason and the measured cost, which a long record's repr would cut off
            why = (record["reason"], record["vector_step_cost"])
            assert record["name"] == "shm", why
            assert record["options"]["num_workers"] == min(8, cpus), why
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (8, 4)
        envs.step(np.zeros(8, dtype=np.int64))
    finally:
        envs.close()


def test_a_given_step_cost_skips_the_probe(no_leaks):
    calls = []

    def counting(n):
        calls.append(n)
        return native_cartpole(n)

    envs = vecaccel.make_vec(
        counting, 64, backend="auto", vectorized=True, step_cost_s=1e-3, num_workers=2
    )
    try:
        record = envs.metadata["backend"]
        assert record["probed"] is False
        assert record["name"] == "shm" and record["options"]["num_workers"] == 2, record
    finally:
        envs.close()
    assert 64 not in calls  # only the size check's one env and the workers' slices were built


def test_a_failing_probe_names_the_probe():
    def breaks_when_big(n):
        if n > 1:
            raise RuntimeError("too big")
        return native_cartpole(n)

    with pytest.raises(RuntimeError, match="measure its step cost.*too big"):
        vecaccel.make_vec(breaks_when_big, 8, backend="auto", vectorized=True)
