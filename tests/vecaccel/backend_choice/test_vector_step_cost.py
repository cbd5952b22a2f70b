"""The probe of a vector env function's step cost: the sizes it steps (all the envs and one
worker slice), the envs closed after, and the cores it counts as the env's own; and how the envs
are cut into slices."""

from __future__ import annotations

import functools
import hashlib
import threading
from dataclasses import replace

import gymnasium as gym
import pytest
from toy_vector_envs import costly_sync, native_cartpole

from vecaccel.backend_choice import choose_backend
from vecaccel.backend_choice.vector_step_cost import (
    MULTICORE_RATIO,
    probe_vector_step_cost,
    slice_size,
    worker_slots,
)


class _RecordsClose(gym.vector.VectorWrapper):
    closed = 0

    def close(self, **kwargs) -> None:
        type(self).closed += 1
        super().close(**kwargs)


def test_slices_are_cut_as_the_workers_cut_them():
    assert slice_size(4096, 2) == 2048 and slice_size(5, 2) == 3
    assert worker_slots(4096, 2, 1.0) == 2 and worker_slots(3, 8, 1.0) == 3
    assert worker_slots(4096, 2, 1.0, num_workers=5) == 5


def test_the_probe_steps_the_whole_batch_and_one_slice():
    sizes = []

    def recording(n):
        sizes.append(n)
        return native_cartpole(n)

    cost = probe_vector_step_cost(recording, 64, cpus=2, seconds=0.005)
    assert sizes == [64, 32]
    assert cost.step_s > 0 and cost.slice_step_s > 0 and cost.cores > 0


def test_the_slice_follows_a_given_worker_count_and_one_slot_steps_the_batch_once():
    sizes = []

    def recording(n):
        sizes.append(n)
        return _RecordsClose(native_cartpole(n))

    _RecordsClose.closed = 0
    probe_vector_step_cost(recording, 64, cpus=2, num_workers=4, seconds=0.002)
    assert sizes == [64, 16] and _RecordsClose.closed == 2
    sizes.clear()
    cost = probe_vector_step_cost(recording, 64, cpus=1, seconds=0.002)
    assert sizes == [64] and _RecordsClose.closed == 3
    assert cost.slice_step_s == cost.step_s  # the slice is the batch


@pytest.mark.parametrize("seconds", [0, -0.1])
def test_the_probe_needs_a_positive_time(seconds):
    with pytest.raises(ValueError, match="seconds must be positive"):
        probe_vector_step_cost(native_cartpole, 4, cpus=2, seconds=seconds)


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
    # whether a slice's measured time pays for a worker is the machine's load of the moment (the
    # suite runs beside this test); what the measured cores decide is checked on a slice that
    # halves the step, as the costly env's does on two idle cores
    choice = choose_backend(replace(cost, slice_step_s=cost.step_s / 2), 8, 2)
    assert choice.backend == "shm", choice.reason
