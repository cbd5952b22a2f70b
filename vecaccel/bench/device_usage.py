"""How busy a torch device was, and how much memory it took, while a block of code ran.

torch is imported when a :class:`DeviceUsage` is made, not with this module.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["DeviceUsage"]


class DeviceUsage:
    """A torch device's peak memory and busy share over a ``with`` block.

    The peak is ``torch.cuda.max_memory_allocated`` of this process, its counter reset on
    entering. The busy share is NVML's ``utilization.gpu`` (the share of the last sample period
    in which a kernel ran on the GPU, from any process), sampled in a thread every ``period_s``:
    through ``torch.cuda.utilization`` when the ``pynvml`` module (``nvidia-ml-py``) is
    importable, else from ``nvidia-smi``. On a CPU device both are ``None``, as is the share
    when neither source answers.

    Args:
        device: the torch device (``"cuda"``, ``"cuda:1"``, ``"cpu"``...).
        period_s: seconds between two samples of the busy share.

    Example:
        >>> with DeviceUsage("cpu") as usage:
        ...     pass
        >>> usage.summary()["gpu_busy_share"], usage.summary()["max_memory_allocated_bytes"]
        (None, None)
    """

    def __init__(self, device: str | torch.device, period_s: float = 0.2) -> None:
        import torch

        self.device = torch.device(device)
        self.period_s = period_s
        self.samples: list[float] = []
        self.max_memory_allocated: int | None = None
        self.source: str | None = None
        self._read = self._reader()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _reader(self) -> Callable[[], float] | None:
        import torch

        if self.device.type != "cuda":
            return None
        try:
            torch.cuda.utilization(self.device)
            self.source = "nvml"
            return lambda: float(torch.cuda.utilization(self.device))
        except Exception:  # noqa: BLE001 - no pynvml, or NVML refuses: try nvidia-smi
            pass
        smi = shutil.which("nvidia-smi")
        if smi is None:
            return None
        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        uuid = str(getattr(torch.cuda.get_device_properties(index), "uuid", "")).lower()
        command = [smi, "--query-gpu=uuid,utilization.gpu", "--format=csv,noheader,nounits"]

        def read() -> float:
            out = subprocess.run(command, capture_output=True, text=True, timeout=5).stdout
            rows = [line.split(",") for line in out.strip().splitlines()]
            # the row of this device (nvidia-smi numbers GPUs apart from CUDA_VISIBLE_DEVICES);
            # the first when no UUID matches
            mine = [row for row in rows if uuid and uuid in row[0].lower()] or rows
            return float(mine[0][1])

        try:
            read()
        except (OSError, ValueError, IndexError, subprocess.SubprocessError):
            return None
        self.source = "nvidia-smi"
        return read

    def _loop(self) -> None:
        assert self._read is not None
        while not self._stop.wait(self.period_s):
            with contextlib.suppress(Exception):
                self.samples.append(self._read())

    def __enter__(self) -> DeviceUsage:
        if self.device.type == "cuda":
            import torch

            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        if self._read is not None:
            self._thread = threading.Thread(target=self._loop, name="gpu-busy", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.device.type == "cuda":
            import torch

            self.max_memory_allocated = int(torch.cuda.max_memory_allocated(self.device))

    def summary(self) -> dict[str, Any]:
        """``max_memory_allocated_bytes`` (after the block; ``None`` off CUDA),
        ``gpu_busy_share`` (0 to 1, or ``None``), the sample count and where they came from."""
        share = sum(self.samples) / len(self.samples) / 100.0 if self.samples else None
        return {
            "max_memory_allocated_bytes": self.max_memory_allocated,
            "gpu_busy_share": share,
            "gpu_busy_samples": len(self.samples),
            "gpu_busy_source": self.source,
        }
