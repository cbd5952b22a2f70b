"""The vector env's timing stats (``envs.stats()``, :mod:`vecaccel.stats`) as logged metrics."""

from __future__ import annotations

from typing import Any

from vecaccel.trainers.envs.layers import layers

__all__ = ["env_timing_metrics", "verdict_of"]


def env_timing_metrics(env: Any) -> dict[str, float]:
    """``stats/...`` metrics of the vecaccel vector env inside ``env`` (through wrappers and
    adapters), or none when there is none.

    Example:
        >>> import vecaccel, numpy as np
        >>> envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial")
        >>> _ = envs.reset(seed=0); _ = envs.step(np.zeros(2, dtype=np.int64))
        >>> sorted(env_timing_metrics(envs))[0]
        'stats/env_ms_per_step'
        >>> envs.close()
    """
    for layer in layers(env):
        if callable(getattr(type(layer), "stats", None)):
            return layer.stats().as_dict()
    return {}


def verdict_of(metrics: dict[str, Any]) -> str | None:
    """``"env"``, ``"policy"`` or ``"transport"``: the largest share among ``metrics``'
    ``stats/..._share`` (``None`` without them), for the progress bar.

    Example:
        >>> verdict_of({"stats/env_share": 0.2, "stats/policy_share": 0.7,
        ...             "stats/transport_share": 0.1})
        'policy'
    """
    shares = {part: metrics.get(f"stats/{part}_share") for part in ("env", "policy", "transport")}
    if any(value is None for value in shares.values()):
        return None
    return max(shares, key=lambda part: float(shares[part]))  # type: ignore[arg-type]
