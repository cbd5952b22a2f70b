"""Running mean and variance of a stream of arrays, merged batch by batch in float64.

:class:`RunningMeanStd` keeps the count, mean and variance of every sample it has seen, each
element of the sample's shape apart, and merges a new batch (or another set of moments) with
the parallel-variance formula of Chan, Golub and LeVeque (1979), as SB3's ``RunningMeanStd``
does. Merging moments rather than samples is what lets the statistics of several processes
(data-parallel ranks, an asynchronous sampler) meet without any of them sending its samples.

Example:
    >>> import numpy as np
    >>> stats = RunningMeanStd(shape=(2,))
    >>> stats.update(np.array([[0.0, 1.0], [2.0, 3.0]]))
    >>> stats.update(np.array([[4.0, 5.0]]))
    >>> stats.mean.tolist(), stats.var.tolist(), stats.count
    ([2.0, 3.0], [2.6666666666666665, 2.6666666666666665], 3.0)
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["RunningMeanStd"]


class RunningMeanStd:
    """Count, mean and (population) variance of the samples seen, per element of ``shape``.

    The three live in one flat float64 array, :attr:`data` (means, variances, count), so that
    they can be handed to another process as one buffer and written back in place; the
    properties are views of it. With no sample yet the count is 0, the mean 0 and the variance 1
    (normalising by them leaves a value as it is).

    Args:
        shape: the shape of one sample (``()`` for a stream of numbers).
    """

    def __init__(self, shape: tuple[int, ...] = ()) -> None:
        self.shape = tuple(int(n) for n in shape)
        self.size = math.prod(self.shape)
        self.data = np.zeros(2 * self.size + 1, dtype=np.float64)
        self.reset()

    @property
    def mean(self) -> np.ndarray:
        """The mean of the samples seen (a view of :attr:`data`)."""
        return self.data[: self.size].reshape(self.shape)

    @property
    def var(self) -> np.ndarray:
        """Their population variance (a view of :attr:`data`)."""
        return self.data[self.size : 2 * self.size].reshape(self.shape)

    @property
    def count(self) -> float:
        """How many samples were seen."""
        return float(self.data[-1])

    def reset(self) -> None:
        """Forget every sample: count 0, mean 0, variance 1."""
        self.data[: self.size] = 0.0
        self.data[self.size :] = 1.0
        self.data[-1] = 0.0

    def update(self, batch: Any) -> None:
        """Merge the samples of ``batch``, an array of shape ``[N, *shape]`` (``N`` may be 0)."""
        values = np.asarray(batch, dtype=np.float64).reshape(-1, *self.shape)
        if len(values):
            self.merge(values.mean(axis=0), values.var(axis=0), len(values))

    def merge(self, mean: Any, var: Any, count: float) -> None:
        """Merge the moments of ``count`` further samples whose mean and population variance
        are ``mean`` and ``var`` (Chan et al.: the two sums of squared deviations, plus the
        one the gap between the two means adds)."""
        count = float(count)
        if count <= 0:
            return
        seen = self.count
        total = seen + count
        delta = np.asarray(mean, dtype=np.float64) - self.mean
        squares = self.var * seen + np.asarray(var, dtype=np.float64) * count
        squares = squares + np.square(delta) * (seen * count / total)
        self.data[: self.size] = (self.mean + delta * (count / total)).reshape(-1)
        self.data[self.size : 2 * self.size] = (squares / total).reshape(-1)
        self.data[-1] = total

    def merge_from(self, other: RunningMeanStd) -> None:
        """Merge the moments ``other`` holds (of the same shape)."""
        self.merge(other.mean, other.var, other.count)

    def copy(self) -> RunningMeanStd:
        """An independent copy."""
        twin = RunningMeanStd(self.shape)
        twin.data[:] = self.data
        return twin

    def __repr__(self) -> str:
        return f"RunningMeanStd(shape={self.shape}, count={self.count:g})"
