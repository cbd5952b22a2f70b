"""``vecaccel tune``: measures every candidate and prints the best with its make_vec call."""

from __future__ import annotations

import re

import gymnasium as gym
import pytest
import torch
from helpers import run_main
from toy_envs import BrokenStepEnv

from vecaccel.cli import main
from vecaccel.tune import autotune, candidate_configs

torch.set_num_threads(1)


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


# ---------------------------------------------------------------------------------------------
# usage errors and failed configurations


def test_tune_with_no_configuration_to_try_is_an_error_not_a_crash(capsys):
    # hybrid needs fewer workers than envs: with one env there is nothing to try
    code = run_main(
        ["tune", "CartPole-v1", "--num-envs", "1", "--backends", "hybrid", "--seconds", "0.01"]
    )  # raised IndexError (trials[0] of an empty list)
    assert code in (1, 2)
    assert "best:" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["tune", "NoSuchToyEnv-v0", "--num-envs", "2", "--backends", "serial"],
        ["tune", "CartPole-v1", "--num-envs", "2", "--backends", "no-such-backend"],
        ["tune", "CartPole-v1", "--num-envs", "0", "--backends", "serial"],
    ],
    ids=["unknown-env", "unknown-backend", "zero-envs"],
)
def test_tune_usage_errors_exit_2_like_bench(argv, capsys):
    """``vecaccel bench`` turns bad arguments into exit code 2 and a one-line message; so does
    ``tune``, with no traceback (unknown env or backend) and no failed run reported as the best
    one (``--num-envs 0``: "best: serial with 0 envs", exit 0)."""
    code = run_main([*argv, "--seconds", "0.01"])
    assert code == 2
    assert "best:" not in capsys.readouterr().out


def test_tune_never_reports_a_failed_configuration_as_the_best(capsys):
    env_id = "VecaccelBrokenStep-v0"
    gym.register(env_id, entry_point=BrokenStepEnv)
    try:
        code = run_main(
            ["tune", env_id, "--num-envs", "2", "--backends", "serial", "--seconds", "0.01"]
        )
    finally:
        del gym.registry[env_id]
    out = capsys.readouterr().out
    assert "failed: " in out  # the trial's own line
    assert "best:" not in out and "reproduce with" not in out
    assert code != 0


@pytest.mark.parametrize(
    "extra",
    [["--seconds", "0"], ["--seconds", "-1"], ["--policy-ms", "-1"]],
    ids=["seconds-0", "seconds-negative", "policy-ms-negative"],
)
def test_tune_rejects_nonpositive_budgets_like_bench(extra, capsys):
    """``bench --seconds 0`` is a usage error (exit 2), and so are ``tune --seconds 0`` (which
    would measure nothing and announce "best: serial ... 0 steps/s") and ``--policy-ms -1``
    (which would fail every trial, time.sleep of a negative, with "no configuration ran")."""
    code = run_main(
        ["tune", "CartPole-v1", "--num-envs", "2", "--backends", "serial", "--seconds", "0.02",
         *extra]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 2 and "best:" not in out, (
        f"expected exit 2 and an error naming {extra[0]}; got exit {code} with output {out!r}"
    )


# ---------------------------------------------------------------------------------------------
# the setting auto picks, the summary, the help


def test_the_setting_auto_picks_is_timed_once_when_it_is_one_of_the_others():
    trials = candidate_configs([64], ["auto", "shm"], cpus=2, step_s=1e-3)
    keys = [(t.backend, t.num_envs, tuple(sorted(t.options.items()))) for t in trials]
    assert len(keys) == len(set(keys)), keys
    (auto,) = [t for t in trials if t.auto]
    assert auto.reason and auto.label == f"auto->{auto.backend}"


def test_the_summary_never_puts_auto_above_the_best(capsys):
    """auto's share is of the best at its env count, auto's own timing included: never above
    1.0, as when the same setting timed twice came out 1.11 "of the best"."""
    code = main(
        ["tune", "CartPole-v1", "--num-envs", "2,4", "--backends", "auto,serial,shm",
         "--seconds", "0.05"]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    lines = [line for line in out.splitlines() if line.startswith("auto with")]
    assert len(lines) == 2, out
    for line in lines:
        share = re.search(r"([0-9.]+) of the best", line)
        assert share is not None or "the fastest of the" in line, line
        assert share is None or float(share.group(1)) <= 1.0, line
    assert out.splitlines()[0].startswith("timing "), out  # the plan and its duration first


def test_tune_help_is_plain_words_with_defaults_and_duration(capsys):
    assert run_main(["tune", "--help"]) == 0
    text = capsys.readouterr().out
    assert "``" not in text and ":func:" not in text and ":mod:" not in text
    assert "(default: 8,16,32)" in text and "(default: 2)" in text
    assert re.search(r"about (\d+ s|a minute or two|\d+ minutes)", text), text


def test_a_misspelled_backend_gets_a_did_you_mean(capsys):
    assert run_main(["tune", "CartPole-v1", "--backends", "Serial", "--seconds", "0.01"]) == 2
    assert "did you mean 'serial'?" in capsys.readouterr().err


def test_tune_leaves_the_cores_to_the_workers_quietly_and_restores_torchs_threads():
    """tune runs no torch compute of its own: the action server's trials run with one torch
    thread, so the warning meant for training scripts (torch's threads against the workers')
    is not raised at a user who cannot act on it, and the caller's setting comes back."""
    import warnings

    torch.set_num_threads(2)  # as a user's process may have it (this module sets 1)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)
            trials = autotune(
                "CartPole-v1", [2], backends=["action_server"], seconds=0.05, policy_ms=0.5
            )
        assert all(t.error is None and t.steps_per_s > 0 for t in trials), trials
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(1)
