"""Adam and RMSprop over one flat buffer of parameters: lean optimizers for small networks.

With the 9k-parameter MLPs of classic-control tasks, a PPO update is a few hundred
microseconds of arithmetic, and ``torch.optim`` adds its own fixed costs around it:

* constructing any ``torch.optim.Optimizer`` imports ``torch._dynamo`` (about a second of CPU
  on a small machine, paid once per process, inside every short run's wall-clock);
* each ``step()`` goes through several Python wrappers (profiling hooks, grad-mode and
  compile checks) before the per-tensor update, and gradient clipping takes one norm per
  tensor.

Here every parameter is a view into one contiguous ``flat`` tensor and every gradient a view
into one ``grad`` tensor, so zeroing, clipping and the update are a handful of operations on
one tensor each. The arithmetic is ``torch.optim``'s single-tensor Adam and RMSprop (the CPU
default, and what Stable-Baselines3 runs), element for element, so learning is unchanged
(``tests/trainers/nets/test_optim.py`` checks both against ``torch.optim`` step by step).

Example:
    >>> import torch
    >>> net = torch.nn.Linear(3, 2)
    >>> opt = FlatAdam(net.parameters(), lr=1e-3)
    >>> net(torch.ones(4, 3)).sum().backward()
    >>> norm = opt.clip_grad_norm_(0.5)
    >>> opt.step()
    >>> opt.zero_grad()
    >>> float(opt.grad.abs().sum())
    0.0
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Any

import torch

__all__ = ["FlatAdam", "FlatOptimizer", "FlatRMSprop"]


class FlatOptimizer(abc.ABC):
    """The flat buffers, ``zero_grad``, gradient clipping and (de)serialisation; subclasses
    add their per-element state and ``step``.

    Attributes:
        flat: every parameter's values, back to back (the parameters are views into it).
        grad: every parameter's gradient, back to back (``p.grad`` are views into it).
        param_groups: one group, as ``torch.optim``'s, whose ``"lr"`` may be changed between
            steps (learning-rate schedules).
    """

    #: names of the per-element state tensors (each shaped like ``flat``)
    state_names: tuple[str, ...] = ()

    def __init__(self, params: Iterable[torch.nn.Parameter], defaults: dict[str, Any]) -> None:
        params = [p for p in params if p.requires_grad]
        if not params:
            raise ValueError("the optimizer got no parameters that require gradients")
        device, dtype = params[0].device, params[0].dtype
        if any(p.device != device or p.dtype != dtype for p in params):
            raise ValueError(
                "a flat optimizer needs every parameter on one device with one dtype, got "
                f"{sorted({(str(p.device), str(p.dtype)) for p in params})}"
            )
        numel = sum(p.numel() for p in params)
        self.flat = torch.empty(numel, device=device, dtype=dtype)
        self.grad = torch.zeros(numel, device=device, dtype=dtype)
        offset = 0
        with torch.no_grad():
            for p in params:
                n = p.numel()
                self.flat[offset : offset + n].copy_(p.reshape(-1))
                p.data = self.flat[offset : offset + n].view_as(p)
                # autograd accumulates into an existing .grad in place: into the flat buffer
                p.grad = self.grad[offset : offset + n].view_as(p)
                offset += n
        self.params = params
        self.param_groups = [{"params": params, **defaults}]
        self.steps = 0
        self.state = {name: torch.zeros_like(self.flat) for name in self.state_names}

    def zero_grad(self, set_to_none: bool = False) -> None:
        """Zero every gradient (always in place: the gradients must stay views of ``grad``)."""
        self.grad.zero_()

    def clip_grad_norm_(self, max_norm: float) -> torch.Tensor:
        """Scale the gradients so that their global L2 norm is at most ``max_norm``.

        Same rule as ``torch.nn.utils.clip_grad_norm_``; returns the norm before clipping.
        """
        norm = torch.linalg.vector_norm(self.grad)
        self.grad.mul_(torch.clamp(max_norm / (norm + 1e-6), max=1.0))
        return norm

    @abc.abstractmethod
    def step(self) -> None:
        """One update of ``flat`` from ``grad``."""

    def state_dict(self) -> dict[str, Any]:
        """The optimizer's state (hyperparameters, step count, per-element tensors)."""
        group = {key: value for key, value in self.param_groups[0].items() if key != "params"}
        return {
            "type": type(self).__name__,
            "param_group": group,
            "steps": self.steps,
            "state": {name: tensor.clone() for name, tensor in self.state.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (from the same kind of optimizer), or the
        ``state_dict()`` of the matching ``torch.optim`` optimizer over the same parameters."""
        if "param_groups" in state and "state" in state:  # torch.optim's format
            state = self._from_torch(state)
        if state.get("type") != type(self).__name__:
            raise ValueError(
                f"cannot load the state of a {state.get('type', 'torch.optim')} optimizer into "
                f"{type(self).__name__}"
            )
        self.param_groups[0].update(state["param_group"])
        self.steps = int(state["steps"])
        for name, tensor in state["state"].items():
            if tensor.shape != self.flat.shape:
                raise ValueError(
                    f"optimizer state {name!r} has shape {tuple(tensor.shape)}, the parameters "
                    f"{tuple(self.flat.shape)}: it belongs to another model"
                )
            self.state[name].copy_(tensor)

    def _from_torch(self, state: dict[str, Any]) -> dict[str, Any]:
        """A ``torch.optim`` state dict (per-parameter tensors, in parameter order) as ours."""
        groups = state["param_groups"]
        ids = [i for group in groups for i in group["params"]]
        if len(ids) != len(self.params):
            raise ValueError(
                f"the torch.optim state covers {len(ids)} parameters, this model has "
                f"{len(self.params)}: it belongs to another model"
            )
        per_param = [state["state"].get(i, {}) for i in ids]
        if not all(per_param):  # never stepped: nothing but the settings to take over
            tensors = {name: torch.zeros_like(self.flat) for name in self.state_names}
            steps = 0
        else:
            tensors = {
                name: torch.cat([entry[name].reshape(-1) for entry in per_param])
                for name in self.state_names
            }
            steps = int(per_param[0]["step"])
        group = {key: groups[0][key] for key in self.param_groups[0] if key != "params"}
        return {"type": type(self).__name__, "param_group": group, "steps": steps, "state": tensors}


class FlatAdam(FlatOptimizer):
    """Adam (Kingma & Ba, 2015) as ``torch.optim.Adam`` computes it, without weight decay.

    Args:
        params: the parameters (they become views into :attr:`flat`).
        lr: learning rate (``param_groups[0]["lr"]`` may change it later).
        betas: the moving averages' coefficients.
        eps: added to the denominator.
    """

    state_names = ("exp_avg", "exp_avg_sq")

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        super().__init__(params, {"lr": lr, "betas": tuple(betas), "eps": eps})

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step (torch's ``_single_tensor_adam``, element for element)."""
        group = self.param_groups[0]
        beta1, beta2 = group["betas"]
        exp_avg, exp_avg_sq = self.state["exp_avg"], self.state["exp_avg_sq"]
        self.steps += 1
        exp_avg.lerp_(self.grad, 1 - beta1)
        exp_avg_sq.mul_(beta2).addcmul_(self.grad, self.grad, value=1 - beta2)
        bias_correction1 = 1 - beta1**self.steps
        bias_correction2_sqrt = (1 - beta2**self.steps) ** 0.5
        denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(group["eps"])
        self.flat.addcdiv_(exp_avg, denom, value=-group["lr"] / bias_correction1)


class FlatRMSprop(FlatOptimizer):
    """RMSprop as ``torch.optim.RMSprop`` computes it (not centered, no momentum or decay).

    Args:
        params: the parameters (they become views into :attr:`flat`).
        lr: learning rate (``param_groups[0]["lr"]`` may change it later).
        alpha: smoothing constant of the squared-gradient average.
        eps: added to the denominator.
    """

    state_names = ("square_avg",)

    def __init__(
        self,
        params: Iterable[torch.nn.Parameter],
        lr: float = 1e-2,
        alpha: float = 0.99,
        eps: float = 1e-8,
    ) -> None:
        super().__init__(params, {"lr": lr, "alpha": alpha, "eps": eps})

    @torch.no_grad()
    def step(self) -> None:
        """One RMSprop step (torch's ``_single_tensor_rmsprop``, element for element)."""
        group = self.param_groups[0]
        square_avg = self.state["square_avg"]
        self.steps += 1
        square_avg.mul_(group["alpha"]).addcmul_(self.grad, self.grad, value=1 - group["alpha"])
        avg = square_avg.sqrt().add_(group["eps"])
        self.flat.addcdiv_(self.grad, avg, value=-group["lr"])
