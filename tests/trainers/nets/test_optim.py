"""The flat-buffer optimizers compute what ``torch.optim`` computes, element for element."""

from __future__ import annotations

import copy

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.trainers.nets.optim import FlatAdam, FlatRMSprop


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(4, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3), torch.nn.Tanh()
    )


def _loss(net: torch.nn.Module, step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + step)
    x = torch.randn(32, 4, generator=generator)
    target = torch.randn(32, 3, generator=generator)
    return ((net(x) - target) ** 2).mean() * (1 + step % 3)


def _train(net, optimizer, steps: int, max_norm: float | None, flat: bool) -> list[float]:
    norms = []
    for step in range(steps):
        if flat:
            optimizer.zero_grad()
        else:
            optimizer.zero_grad(set_to_none=True)
        _loss(net, step).backward()
        if max_norm is not None:
            if flat:
                norms.append(float(optimizer.clip_grad_norm_(max_norm)))
            else:
                norms.append(float(torch.nn.utils.clip_grad_norm_(net.parameters(), max_norm)))
        optimizer.step()
    return norms


@settings(max_examples=15, deadline=None)
@given(
    lr=st.floats(1e-4, 1e-1),
    beta1=st.floats(0.0, 0.99),
    beta2=st.floats(0.9, 0.9999),
    eps=st.sampled_from([1e-8, 1e-5, 1e-3]),
)
def test_adam_is_torch_adam(lr, beta1, beta2, eps):
    reference, flat = _net(), _net()
    torch_adam = torch.optim.Adam(
        reference.parameters(), lr=lr, betas=(beta1, beta2), eps=eps, foreach=False
    )
    flat_adam = FlatAdam(flat.parameters(), lr=lr, betas=(beta1, beta2), eps=eps)
    _train(reference, torch_adam, 12, None, flat=False)
    _train(flat, flat_adam, 12, None, flat=True)
    for a, b in zip(reference.parameters(), flat.parameters(), strict=True):
        assert torch.equal(a, b)  # the same operations on the same elements


@settings(max_examples=15, deadline=None)
@given(lr=st.floats(1e-4, 1e-1), alpha=st.floats(0.5, 0.999), eps=st.sampled_from([1e-8, 1e-5]))
def test_rmsprop_is_torch_rmsprop(lr, alpha, eps):
    reference, flat = _net(), _net()
    torch_rms = torch.optim.RMSprop(
        reference.parameters(), lr=lr, alpha=alpha, eps=eps, foreach=False
    )
    flat_rms = FlatRMSprop(flat.parameters(), lr=lr, alpha=alpha, eps=eps)
    _train(reference, torch_rms, 12, None, flat=False)
    _train(flat, flat_rms, 12, None, flat=True)
    for a, b in zip(reference.parameters(), flat.parameters(), strict=True):
        assert torch.equal(a, b)


def test_clipping_and_learning_rate_changes_follow_torch():
    """Global-norm clipping as ``clip_grad_norm_`` does it (one norm instead of one per tensor,
    so equal up to rounding), and ``param_groups[0]["lr"]`` changes between steps apply."""
    reference, flat = _net(3), _net(3)
    torch_adam = torch.optim.Adam(reference.parameters(), lr=1e-2, eps=1e-5, foreach=False)
    flat_adam = FlatAdam(flat.parameters(), lr=1e-2, eps=1e-5)
    for step in range(10):
        for optimizer in (torch_adam, flat_adam):
            optimizer.param_groups[0]["lr"] = 1e-2 * (1 - step / 10)
        ref_norm = _train(reference, torch_adam, 1, 0.05, flat=False)
        flat_norm = _train(flat, flat_adam, 1, 0.05, flat=True)
        assert flat_norm == pytest.approx(ref_norm, rel=1e-5)
        assert ref_norm[0] > 0.05  # the clip did act
    for a, b in zip(reference.parameters(), flat.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_parameters_are_views_of_the_flat_buffers():
    net = _net()
    before = [p.detach().clone() for p in net.parameters()]
    optimizer = FlatAdam(net.parameters(), lr=0.1)
    assert optimizer.flat.numel() == sum(p.numel() for p in net.parameters())
    for p, value in zip(net.parameters(), before):
        assert torch.equal(p, value)  # values kept
        assert p.data_ptr() >= optimizer.flat.data_ptr()
        assert p.grad is not None and p.grad.data_ptr() >= optimizer.grad.data_ptr()
    net.load_state_dict({k: torch.zeros_like(v) for k, v in net.state_dict().items()})
    assert float(optimizer.flat.abs().sum()) == 0.0  # loading a state dict writes the buffer
    _loss(net, 0).backward()
    assert float(optimizer.grad.abs().sum()) > 0.0  # autograd accumulates into the buffer


def test_state_dict_round_trip_and_mismatches():
    net = _net()
    optimizer = FlatAdam(net.parameters(), lr=0.01)
    _train(net, optimizer, 3, 0.5, flat=True)
    saved = copy.deepcopy(optimizer.state_dict())
    twin_net = copy.deepcopy(net)
    twin = FlatAdam(twin_net.parameters(), lr=0.5)
    twin.load_state_dict(saved)
    assert twin.steps == 3 and twin.param_groups[0]["lr"] == 0.01
    _train(net, optimizer, 2, 0.5, flat=True)
    _train(twin_net, twin, 2, 0.5, flat=True)
    for a, b in zip(net.parameters(), twin_net.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="FlatRMSprop"):
        FlatRMSprop(_net().parameters()).load_state_dict(saved)
    with pytest.raises(ValueError, match="another model"):
        FlatAdam(torch.nn.Linear(2, 2).parameters()).load_state_dict(saved)


def test_bad_parameters():
    with pytest.raises(ValueError, match="no parameters"):
        FlatAdam([])
    mixed = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2).double())]
    with pytest.raises(ValueError, match="one device with one dtype"):
        FlatAdam(mixed)


@pytest.mark.parametrize(
    "flat_cls, torch_cls, kwargs",
    [
        (FlatAdam, torch.optim.Adam, {"lr": 1e-2, "eps": 1e-5}),
        (FlatRMSprop, torch.optim.RMSprop, {"lr": 1e-2, "alpha": 0.99, "eps": 1e-5}),
    ],
)
def test_loads_the_state_of_the_matching_torch_optimizer(flat_cls, torch_cls, kwargs):
    """A checkpoint written with torch.optim (earlier vecaccel versions) continues the same."""
    reference, flat = _net(5), _net(5)
    torch_opt = torch_cls(reference.parameters(), foreach=False, **kwargs)
    _train(reference, torch_opt, 4, None, flat=False)
    flat.load_state_dict(reference.state_dict())
    flat_opt = flat_cls(flat.parameters(), **{**kwargs, "lr": 0.5})
    flat_opt.load_state_dict(torch_opt.state_dict())
    assert flat_opt.steps == 4 and flat_opt.param_groups[0]["lr"] == kwargs["lr"]
    _train(reference, torch_opt, 3, None, flat=False)
    _train(flat, flat_opt, 3, None, flat=True)
    for a, b in zip(reference.parameters(), flat.parameters(), strict=True):
        assert torch.equal(a, b)
    fresh = flat_cls(_net(5).parameters(), **kwargs)
    fresh.load_state_dict(torch_cls(_net(5).parameters(), **kwargs).state_dict())  # unstepped
    assert fresh.steps == 0
    with pytest.raises(ValueError, match="another model"):
        flat_cls(torch.nn.Linear(2, 2).parameters()).load_state_dict(torch_opt.state_dict())
