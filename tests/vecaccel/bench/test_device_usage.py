"""A device's peak memory and busy share over a block: nothing to read on a CPU, the share as
the mean of the samples, and on a CUDA device the peak this process allocated in the block."""

from __future__ import annotations

import threading

import pytest
import torch

from vecaccel.bench.device_usage import DeviceUsage


def test_a_cpu_device_has_no_peak_and_no_busy_share() -> None:
    with DeviceUsage("cpu", period_s=0.001) as usage:
        # no sampling thread: nothing to sample
        assert not any(thread.name == "gpu-busy" for thread in threading.enumerate())
        torch.ones(1024).sum()
    assert usage.summary() == {
        "max_memory_allocated_bytes": None,
        "gpu_busy_share": None,
        "gpu_busy_samples": 0,
        "gpu_busy_source": None,
    }


def test_the_busy_share_is_the_mean_of_the_samples_in_percent() -> None:
    usage = DeviceUsage("cpu")
    usage.samples.extend([50.0, 100.0, 0.0, 50.0])
    summary = usage.summary()
    assert summary["gpu_busy_share"] == pytest.approx(0.5)
    assert summary["gpu_busy_samples"] == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_device_reports_the_peak_of_the_block_and_samples_its_busy_share() -> None:
    held = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # before the block
    with DeviceUsage("cuda", period_s=0.01) as usage:
        block = torch.empty(16 << 20, dtype=torch.uint8, device="cuda")
        end = torch.cuda.Event(enable_timing=False)
        for _ in range(200):
            block.add_(1)
        end.record()
        end.synchronize()
        threading.Event().wait(0.05)  # a few sampling periods
    del block, held
    summary = usage.summary()
    assert summary["max_memory_allocated_bytes"] >= (64 + 16) << 20
    if summary["gpu_busy_source"] is not None:  # NVML or nvidia-smi answered
        assert summary["gpu_busy_samples"] >= 1
        assert 0.0 <= summary["gpu_busy_share"] <= 1.0
