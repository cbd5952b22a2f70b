"""``vecaccel tune``: measures every candidate and prints the best with its make_vec call."""

from __future__ import annotations

from vecaccel.cli import main
from vecaccel.tune import autotune, candidate_configs


def test_candidates_cover_backends_workers_batches_and_alternation():
    trials = candidate_configs([8], ["serial", "shm", "async", "action_server"], cpus=2)
    kinds = {(t.backend, tuple(sorted(t.options.items()))) for t in trials}
    assert ("serial", ()) in kinds
    assert ("shm", (("num_workers", 2),)) in kinds
    assert ("async", (("batch_size", 4), ("num_workers", 4))) in kinds
    assert ("action_server", (("alternating", True),)) in kinds


def test_autotune_orders_by_speed_and_reports_failures():
    trials = autotune("CartPole-v1", [4], backends=["serial", "shm"], seconds=0.1)
    rates = [t.steps_per_s for t in trials]
    assert rates == sorted(rates, reverse=True) and rates[0] > 0
    assert all(t.error is None for t in trials)


def test_tune_command_prints_reproducing_call(capsys):
    code = main(
        ["tune", "CartPole-v1", "--num-envs", "4", "--backends", "serial,async", "--seconds", "0.1"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "best:" in out and "reproduce with: vecaccel.make_vec('CartPole-v1', 4" in out


def test_autotune_refuses_an_empty_budget_or_a_negative_latency():
    import pytest

    for kwargs in ({"seconds": 0.0}, {"seconds": 0.1, "policy_ms": -1.0}):
        with pytest.raises(ValueError, match="seconds must be positive"):
            autotune("CartPole-v1", [2], backends=["serial"], **kwargs)
