"""Returns and advantages of on-policy batches: GAE with truncation bootstrapping.

:func:`flat_batch_with_advantages` is the step A2C and PPO share before their losses: the
bootstrap values, GAE over the ``[T, B]`` batch, then the batch flattened to the rows the losses
learn from.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "FlatBatch",
    "compute_gae",
    "explained_variance",
    "flat_batch_with_advantages",
    "learning_rows",
]


class FlatBatch(NamedTuple):
    """A rollout batch flattened to the rows the losses learn from (``b_`` in the losses).

    Attributes:
        obs: ``[N, *obs_shape]``.
        actions: ``[N, ...]`` in the model's numbering.
        log_probs: the behaviour policy's log-probabilities (``None`` if the batch has none).
        values: the values the batch was collected with.
        advantages: GAE advantages (not normalised).
        returns: ``advantages + values``.
    """

    obs: Any
    actions: Any
    log_probs: Any
    values: Any
    advantages: Any
    returns: Any


def flat_batch_with_advantages(
    batch: Any, value: Callable[[Any], Any], gamma: float, gae_lambda: float
) -> FlatBatch:
    """GAE over the time-major ``batch`` and the batch flattened, for A2C's and PPO's losses.

    The next row's value bootstraps every step; a truncated episode's bootstraps from its true
    final observation (``batch.final_obs``). The flat batch leaves out ``NEXT_STEP`` reset rows
    (no transition) and a multi-agent env's rows whose agent was not active
    (:func:`learning_rows`), so they weigh in no loss term and no advantage normalisation.

    Args:
        batch: a :class:`vecaccel.sampler.SampleBatch` with ``extras["value"]`` (and
            ``extras["log_prob"]`` for PPO).
        value: the critic, ``obs -> [N]`` values (called without gradients).
        gamma: discount.
        gae_lambda: GAE's lambda.
    """
    import torch

    with torch.no_grad():
        next_value = value(batch.next_obs)
        final_values = value(batch.final_obs) if len(batch.final_obs) else next_value[:0]
    advantages, returns = compute_gae(
        batch.rewards,
        batch.extras["value"],
        next_value,
        batch.terminated,
        batch.truncated,
        final_values,
        batch.final_index,
        gamma,
        gae_lambda,
        active=batch.active,
    )
    rows = learning_rows(batch)
    keep = None if rows is None else rows.reshape(-1).nonzero().squeeze(1)

    def flat(x: Any) -> Any:
        x = x.reshape(-1, *x.shape[2:])
        return x if keep is None else x[keep]

    log_probs = batch.extras.get("log_prob")
    return FlatBatch(
        obs=flat(batch.obs),
        actions=flat(batch.actions),
        log_probs=None if log_probs is None else flat(log_probs),
        values=flat(batch.extras["value"]),
        advantages=flat(advantages),
        returns=flat(returns),
    )


def compute_gae(
    rewards: Any,
    values: Any,
    next_value: Any,
    terminated: Any,
    truncated: Any,
    final_values: Any,
    final_index: Any,
    gamma: float,
    gae_lambda: float,
    active: Any = None,
) -> tuple[Any, Any]:
    """Generalized advantage estimation over a time-major batch, bootstrapping truncations.

    ``V(s_{t+1})`` is the value of the next row's observation (``next_value`` after the last
    row), except at truncated steps, where it is the value of the episode's true final
    observation (``final_values`` at ``final_index``); at terminated steps it is 0. The
    recursion stops at every episode end, terminated or truncated.

    Args:
        rewards: ``[T, B]``.
        values: ``[T, B]`` ``V(obs_t)``.
        next_value: ``[B]`` value of the batch's ``next_obs``.
        terminated: ``[T, B]`` bool.
        truncated: ``[T, B]`` bool.
        final_values: ``[K]`` values of ``batch.final_obs``.
        final_index: ``[K, 2]`` ``(t, b)`` of each final observation.
        gamma: discount.
        gae_lambda: GAE's lambda (1 gives n-step returns, as A2C uses).
        active: ``[T, B]`` bool ``batch.active`` of a multi-agent env, or ``None``. A step whose
            next row is not active is an end: the next row holds no continuation of the
            agent's episode, so there is no bootstrap (unless the step is a truncation, which
            bootstraps from its final observation) and the recursion stops. The entries of
            inactive rows are meaningless; :func:`learning_rows` leaves them out of the losses.

    Returns:
        ``(advantages, returns)``, each ``[T, B]`` float32, ``returns = advantages + values``.
    """
    import torch

    if active is not None:
        ends = torch.zeros_like(terminated)
        ends[:-1] = ~active[1:]
        terminated = terminated | (ends & ~truncated)
    rewards = rewards.float()
    values = values.float()
    next_values = torch.cat([values[1:], next_value.float().reshape(1, -1)], dim=0)
    if len(final_index):
        next_values[final_index[:, 0], final_index[:, 1]] = final_values.float()
    if rewards.device.type == "cpu":
        # the recursion is T row operations on B numbers: NumPy does each in about a
        # microsecond, torch pays its per-op dispatch (several microseconds) T times; the
        # arrays are views of the tensors, and the equations the same
        ended, cut = terminated.numpy(), truncated.numpy()
        advantages = torch.from_numpy(
            _gae_recursion(
                rewards.numpy(),
                values.numpy(),
                next_values.numpy(),
                (~ended).astype(np.float32),
                (~(ended | cut)).astype(np.float32),
                gamma,
                gae_lambda,
            )
        )
    else:
        not_terminal = (~terminated).float()
        not_done = (~(terminated | truncated)).float()
        advantages = _gae_recursion(
            rewards, values, next_values, not_terminal, not_done, gamma, gae_lambda
        )
    return advantages, advantages + values


def _gae_recursion(
    rewards: Any,
    values: Any,
    next_values: Any,
    not_terminal: Any,
    not_done: Any,
    gamma: float,
    gae_lambda: float,
) -> Any:
    """GAE's equations on float32 ``[T, B]`` NumPy arrays or torch tensors alike:
    ``delta_t = r_t + gamma * V(s_{t+1}) * (1 - terminal_t) - V(s_t)`` and, from the last row
    back, ``A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}`` (``A_T = 0``)."""
    deltas = rewards + gamma * next_values * not_terminal - values
    decay = not_done * (gamma * gae_lambda)
    advantages = deltas * 1  # a new array or tensor of the same kind, written over below
    last = deltas[-1]
    for t in range(deltas.shape[0] - 2, -1, -1):
        last = deltas[t] + decay[t] * last
        advantages[t] = last
    return advantages


def learning_rows(batch: Any) -> Any:
    """``[T, B]`` bool: the rows of ``batch`` the losses learn from, or ``None`` for all.

    Left out are ``NEXT_STEP`` reset steps (``batch.valid``, no transition) and, for a
    multi-agent env, the rows whose agent was not active (``batch.active``). Leaving them out of
    the flattened batch keeps them out of every loss term and of advantage normalisation.
    """
    active = getattr(batch, "active", None)
    rows = batch.valid if active is None else batch.valid & active
    return None if bool(rows.all()) else rows


def explained_variance(predictions: Any, targets: Any) -> float:
    """``1 - Var(targets - predictions) / Var(targets)`` (NaN when the targets are constant)."""
    variance = float(targets.var())
    if variance == 0:
        return float("nan")
    return 1.0 - float((targets - predictions).var()) / variance
