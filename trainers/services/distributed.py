"""Synchronous data-parallel training over ``torch.distributed``, launched by ``torchrun``.

Every rank is one ``torchrun`` process with its own sampler and envs, seeded by rank. The model
is wrapped in ``DistributedDataParallel`` (NCCL on GPUs, gloo on CPUs), so gradients are averaged
over ranks at every backward pass and the parameters stay identical. Rank 0 alone logs, draws
the progress bar and writes checkpoints; the metrics it logs are reduced over all ranks.

The step budget and the batch are *global*: with ``K`` ranks each rank collects ``1/K`` of the
env steps, the effective batch of an update is the sum of the ranks' batches, and the trainers'
``lr_scaling`` option scales the learning rate in that effective batch (so ``linear`` scaling
multiplies it by ``K`` for ``K`` ranks, ``none`` leaves it alone).

Fault behaviour. A rank that dies makes the survivors fail instead of hang: gloo notices the
closed connection at the next collective, every collective has a timeout
(``VECACCEL_DIST_TIMEOUT`` seconds, 120 by default), and ``torchrun`` ends the remaining ranks as
soon as one exits with an error.

Launch::

    torchrun --nproc_per_node=2 -m vecaccel train ppo --env CartPole-v1 --total-timesteps 100000
    vecaccel train ppo --nproc 2 --env CartPole-v1 --total-timesteps 100000   # the same
    # two machines (run on each, NODE_RANK 0 and 1):
    torchrun --nnodes 2 --nproc_per_node 1 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        -m vecaccel train ppo --env CartPole-v1 --total-timesteps 100000

Example:
    >>> is_distributed(), world_size(), rank(), is_main_process()
    (False, 1, 0, True)
    >>> rank_seed(7)
    7
"""

from __future__ import annotations

import datetime
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "MethodDDP",
    "all_reduce_any",
    "all_reduce_mean",
    "all_reduce_moments",
    "barrier",
    "cleanup",
    "init_from_env",
    "is_distributed",
    "is_main_process",
    "launch_torchrun",
    "rank",
    "rank_seed",
    "reduce_metrics",
    "reduce_log_row",
    "world_size",
    "wrap_model",
]

#: seconds a collective may wait for the other ranks before it fails (``VECACCEL_DIST_TIMEOUT``)
DEFAULT_TIMEOUT_S = 120.0


def _dist() -> Any:
    import torch.distributed as dist

    return dist


def is_distributed() -> bool:
    """Whether a ``torch.distributed`` process group with more than one rank is running."""
    try:
        dist = _dist()
    except ImportError:  # pragma: no cover - torch without distributed support
        return False
    return bool(dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1)


def world_size() -> int:
    """Number of ranks (1 without a process group)."""
    return _dist().get_world_size() if is_distributed() else 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return _dist().get_rank() if is_distributed() else 0


def is_main_process() -> bool:
    """Whether this process is rank 0, the one that logs and checkpoints."""
    return rank() == 0


def rank_seed(seed: int) -> int:
    """The seed of this rank's envs, exploration and minibatches: ``seed`` itself on rank 0.

    Other ranks get an independent seed derived from ``(seed, rank)``, so their envs differ.
    """
    if rank() == 0:
        return int(seed)
    from vecaccel.trainers.services.seeding import split_seed

    return split_seed(seed, 0x5EED, rank())


def timeout_seconds() -> float:
    """The collective timeout in seconds, from ``VECACCEL_DIST_TIMEOUT`` (default 120)."""
    try:
        return float(os.environ.get("VECACCEL_DIST_TIMEOUT", DEFAULT_TIMEOUT_S))
    except ValueError:
        return DEFAULT_TIMEOUT_S


def init_from_env(device: str = "cpu") -> bool:
    """Join the process group ``torchrun`` describes in the environment, if there is one.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT`` (set by
    ``torchrun``). Uses NCCL when ``device`` is a CUDA device (and selects ``cuda:LOCAL_RANK``
    when the device names no index), gloo otherwise. A world of one rank starts no group.

    Args:
        device: the trainer's torch device.

    Returns:
        Whether a multi-rank process group is now running.
    """
    dist = _dist()
    if dist.is_initialized():
        return is_distributed()
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or "RANK" not in os.environ:
        return False
    cuda = str(device).startswith("cuda")
    if cuda:
        import torch

        torch.cuda.set_device(local_device(device))
    dist.init_process_group(
        backend="nccl" if cuda else "gloo",
        timeout=datetime.timedelta(seconds=timeout_seconds()),
    )
    return is_distributed()


def local_device(device: str) -> str:
    """``cuda`` becomes ``cuda:LOCAL_RANK`` under torchrun; other devices are returned as given.

    Example:
        >>> local_device("cpu")
        'cpu'
    """
    if str(device) == "cuda" and "LOCAL_RANK" in os.environ:
        return f"cuda:{int(os.environ['LOCAL_RANK'])}"
    return str(device)


def cleanup(barrier: bool = True) -> None:
    """Leave the process group (no-op without one).

    Drop the trainers (their ``DistributedDataParallel`` models) first: a DDP model that outlives
    its process group can abort the interpreter at exit.

    Args:
        barrier: meet the other ranks at a barrier first, so that none tears its connections
            down while another still talks to it (a normal end, which every rank reaches).
            Pass ``False`` when leaving because of an error: the other ranks are then waiting
            in some collective of their own and would never enter the barrier, so this rank
            would sit in it for the whole collective timeout, and they in theirs; closing the
            connections at once makes their collective fail at once ("Connection closed by
            peer") instead.
    """
    import gc

    dist = _dist()
    if dist.is_available() and dist.is_initialized():
        gc.collect()
        try:
            if barrier and dist.get_world_size() > 1:
                dist.barrier()
        except RuntimeError:  # a peer is gone: nothing left to wait for
            pass
        dist.destroy_process_group()


def barrier() -> None:
    """Wait for every rank (no-op without a process group)."""
    if is_distributed():
        _dist().barrier()


# -- models ----------------------------------------------------------------------------------


def _ddp_module() -> type:
    import torch

    class _MethodForward(torch.nn.Module):
        """Routes ``forward(*args, _method=name)`` to ``module.name(*args)``.

        ``DistributedDataParallel`` synchronises gradients of what goes through its
        ``forward``; actor-critic losses call ``evaluate``, so the call is routed through it.
        """

        def __init__(self, module: torch.nn.Module) -> None:
            super().__init__()
            self.module = module

        def forward(self, *args: Any, _method: str = "forward", **kwargs: Any) -> Any:
            return getattr(self.module, _method)(*args, **kwargs)

    return _MethodForward


class MethodDDP:
    """A ``DistributedDataParallel`` model whose methods (``evaluate``, ``value``...) sync gradients.

    ``proxy.evaluate(obs, actions)`` runs ``model.evaluate`` through DDP's ``forward``, so the
    backward pass of its loss all-reduces the gradients. Calling the proxy runs ``forward``.

    Args:
        model: the model, already on its device; its parameters are broadcast from rank 0.
        device: the model's device (CUDA devices become ``device_ids``).
    """

    def __init__(self, model: Any, device: Any = "cpu") -> None:
        import torch
        from torch.nn.parallel import DistributedDataParallel

        self.module = model
        wrapper = _ddp_module()(model)
        device = torch.device(device)
        device_ids = (
            [device.index if device.index is not None else 0] if device.type == "cuda" else None
        )
        self.ddp = DistributedDataParallel(wrapper, device_ids=device_ids)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.ddp(*args, _method="forward", **kwargs)

    def __getattr__(self, name: str) -> Any:
        method = getattr(self.module, name)
        if not callable(method):
            return method

        def call(*args: Any, **kwargs: Any) -> Any:
            return self.ddp(*args, _method=name, **kwargs)

        return call


def wrap_model(model: Any, device: Any = "cpu") -> Any:
    """``MethodDDP(model)`` under a process group, else ``model`` itself."""
    if not is_distributed():
        return model
    return MethodDDP(model, device)


# -- collectives -----------------------------------------------------------------------------


def all_reduce_mean(values: Sequence[float], device: Any = "cpu") -> list[float]:
    """Element-wise mean over ranks of a list of numbers (identity without a process group)."""
    if not is_distributed():
        return [float(v) for v in values]
    import torch

    tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=device)
    _dist().all_reduce(tensor)
    return (tensor / world_size()).tolist()


def all_reduce_moments(
    moments: Sequence[tuple[float, Any, Any]], device: Any = "cpu"
) -> list[tuple[float, Any, Any]]:
    """Every rank's moments merged: for each ``(count, mean, var)`` of ``moments`` (a
    population variance, NumPy arrays of any shape), the count, mean and variance of the
    samples of all ranks together; every rank must call it with the same shapes, and all get
    the same result (identity without a process group).

    Two all-reduces in float64 carry the parallel-variance merge (Chan et al.): the counts and
    count-weighted sums give the common mean, then each rank's sum of squared deviations about
    it (``count * var + count * (mean - common)**2``) adds up to the whole ``M2``.

    Example:
        >>> import numpy as np
        >>> all_reduce_moments([(2.0, np.array([1.0]), np.array([0.25]))])
        [(2.0, array([1.]), array([0.25]))]
    """
    import numpy as np

    if not is_distributed():
        return [(float(n), np.asarray(m), np.asarray(v)) for n, m, v in moments]
    import torch

    counts = [float(n) for n, _, _ in moments]
    means = [np.asarray(m, dtype=np.float64) for _, m, _ in moments]
    variances = [np.asarray(v, dtype=np.float64) for _, _, v in moments]
    sums = np.concatenate([np.concatenate(([n], n * m.ravel())) for n, m in zip(counts, means)])
    first = torch.from_numpy(sums).to(device)
    _dist().all_reduce(first)
    reduced = first.cpu().numpy()
    totals, common, at = [], [], 0
    for mean in means:
        total = float(reduced[at])
        totals.append(total)
        summed = reduced[at + 1 : at + 1 + mean.size].reshape(mean.shape)
        common.append(summed / total if total > 0 else np.zeros_like(mean))
        at += 1 + mean.size
    squares = [
        (n * v + n * np.square(m - c)).ravel() if n > 0 else np.zeros(m.size)
        for n, m, v, c in zip(counts, means, variances, common)
    ]
    second = torch.from_numpy(np.concatenate(squares)).to(device)
    _dist().all_reduce(second)
    whole = second.cpu().numpy()
    out, at = [], 0
    for total, mean in zip(totals, common):
        m2 = whole[at : at + mean.size].reshape(mean.shape)
        out.append((total, mean, m2 / total if total > 0 else np.ones_like(mean)))
        at += mean.size
    return out


def all_gather_object(obj: Any) -> list[Any]:
    """Every rank's ``obj`` (small, picklable), in rank order; ``[obj]`` without a process group."""
    if not is_distributed():
        return [obj]
    gathered: list[Any] = [None] * world_size()
    _dist().all_gather_object(gathered, obj)
    return gathered


def all_reduce_any(flag: bool, device: Any = "cpu") -> bool:
    """Whether ``flag`` is true on any rank (every rank must call it)."""
    if not is_distributed():
        return bool(flag)
    import torch

    tensor = torch.tensor([1.0 if flag else 0.0], device=device)
    _dist().all_reduce(tensor)
    return bool(tensor.item() > 0)


def reduce_metrics(
    metrics: Mapping[str, float | None],
    weights: Mapping[str, float] | None = None,
    sums: Sequence[str] = (),
    device: Any = "cpu",
) -> dict[str, float | None]:
    """Aggregate one update's metrics over ranks; every rank must call it with the same keys.

    Each metric becomes the weighted mean over the ranks that have a value for it (``None`` or
    NaN means none), the weight of a metric being ``weights[key]`` (e.g. the number of episodes
    behind a mean return) or 1. Keys in ``sums`` are summed instead. A metric no rank has stays
    ``None``. Without a process group the metrics are returned unchanged.

    Example:
        >>> reduce_metrics({"losses/value_loss": 0.5, "charts/episodic_return": None})
        {'losses/value_loss': 0.5, 'charts/episodic_return': None}
    """
    if not is_distributed():
        return dict(metrics)
    import torch

    keys = sorted(metrics)
    weights = weights or {}
    data = torch.zeros(2 * len(keys), dtype=torch.float64, device=device)
    for i, key in enumerate(keys):
        value = metrics[key]
        if value is None or (isinstance(value, float) and math.isnan(value)):
            continue
        weight = 1.0 if key in sums else float(weights.get(key, 1.0))
        data[2 * i] = float(value) * weight
        data[2 * i + 1] = weight
    _dist().all_reduce(data)
    out: dict[str, float | None] = {}
    for i, key in enumerate(keys):
        total, weight = float(data[2 * i]), float(data[2 * i + 1])
        if weight <= 0:
            out[key] = None
        elif key in sums:
            out[key] = total
        else:
            out[key] = total / weight
    return out


def reduce_log_row(
    metrics: Mapping[str, float | None],
    episodes: float,
    *,
    keys: Sequence[str] = (),
    sums: Sequence[str] = (),
    device: Any = "cpu",
) -> dict[str, float | None]:
    """One log row reduced over ranks, as every runner logs it; every rank must call it.

    The mean episodic return and length are weighted by each rank's ``episodes`` (so that a
    rank that saw none does not count), ``charts/episodes`` and the keys in ``sums`` are summed,
    and ``charts/world_size`` is added. ``keys`` are the metrics every rank sends even when it
    has no value for one (a rank's row may lack a loss the others have): the ranks must reduce
    the same keys.

    Example:
        >>> reduce_log_row({"charts/episodic_return": 1.0}, 1)["charts/world_size"]
        1.0
    """
    full = {key: metrics.get(key) for key in keys} | dict(metrics)
    reduced = reduce_metrics(
        full,
        weights={"charts/episodic_return": episodes, "charts/episodic_length": episodes},
        sums=("charts/episodes", *sums),
        device=device,
    )
    reduced["charts/world_size"] = float(world_size())
    return reduced


# -- launching -------------------------------------------------------------------------------


def strip_nproc(argv: Sequence[str]) -> list[str]:
    """``argv`` without its ``--nproc K`` / ``--nproc=K`` option.

    Example:
        >>> strip_nproc(["train", "ppo", "--nproc", "2", "--seed", "1"])
        ['train', 'ppo', '--seed', '1']
    """
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        if arg == "--nproc":
            skip = True
            continue
        if arg.startswith("--nproc="):
            continue
        out.append(arg)
    return out


def launch_torchrun(nproc: int, argv: Sequence[str]) -> int:
    """Run ``python -m vecaccel ARGV`` as ``nproc`` ranks on this machine through torchrun.

    Equivalent to ``torchrun --standalone --nproc_per_node=NPROC -m vecaccel ARGV``; torchrun
    picks a free port, and ends every rank when one fails.

    Args:
        nproc: ranks to start.
        argv: the ``vecaccel`` arguments, without ``--nproc``.

    Returns:
        0 when every rank succeeded, 128 + the signal's number when this process was
        interrupted (the ranks checkpoint on SIGINT/SIGTERM), else 1.
    """
    import sys

    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run

    args = get_args_parser().parse_args(
        ["--standalone", f"--nproc_per_node={int(nproc)}", "--module", "vecaccel", *argv]
    )
    try:
        run(args)
    except ChildFailedError as exc:
        print(f"error: a rank failed: {exc}", file=sys.stderr)
        return 1
    except SignalException as exc:
        # torchrun passed the signal on to the ranks, which checkpointed before exiting
        print(f"interrupted by signal {int(exc.sigval)}", file=sys.stderr)
        return 128 + int(exc.sigval)
    return 0
