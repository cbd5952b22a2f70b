"""Review of what a user meets at the command line and through plugins: ``vecaccel bench``,
``tune``, ``train``/``eval``, ``vecaccel.make_vec`` and the plugin manager.

Failing tests here demonstrate defects; the passing ones pin behaviour that was checked.
Everything runs with tiny budgets and writes only under ``tmp_path``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from helpers_envs import broken_plugin_site

import vecaccel
from vecaccel.cli import main
from vecaccel.manager import DISABLE_ENV_VAR, PluginWarning, _reset_plugin_manager

REPO = Path(__file__).resolve().parents[1]
TINY_PPO = [
    "--env", "CartPole-v1", "--backend", "serial", "--num-envs", "2", "--num-steps", "16",
    "--no-progress", "--no-tensorboard", "--torch-threads", "1",
]  # fmt: skip


def run_main(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's usage errors and --help
        return int(exc.code or 0)


def run_cli(argv: list[str], cwd: Path, extra_env: dict[str, str] | None = None, timeout=120):
    env = dict(os.environ)
    extra = dict(extra_env or {})
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), extra.pop("PYTHONPATH", "")]))
    env.update(extra)
    return subprocess.run(
        [sys.executable, "-m", "vecaccel", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
    )


@pytest.fixture
def fresh_plugin_manager():
    _reset_plugin_manager()
    yield
    _reset_plugin_manager()


# ---------------------------------------------------------------------------------------------
# vecaccel bench


BENCH_TINY = [
    "bench", "--env", "CartPole-v1", "--num-envs", "2", "--backends", "serial",
    "--peers", "none", "--seconds", "0.02", "--warmup", "0", "-q",
]  # fmt: skip


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_bench_output_to_a_missing_directory_is_a_clear_error(flag, tmp_path, capsys):
    """``vecaccel bench --json OUT`` into a folder that does not exist (a typo) ran the whole
    benchmark, then died with a FileNotFoundError traceback (exit 1) and lost the results."""
    out = tmp_path / "no-such-dir" / ("out.json" if flag == "--json" else "out.png")
    try:
        code = run_main([*BENCH_TINY, flag, str(out)])
    except OSError as exc:
        pytest.fail(
            f"expected `vecaccel bench {flag} {out}` to exit 2 with an 'error' line naming the "
            f"path (checked before measuring), got a traceback: {type(exc).__name__}: {exc}"
        )
    err = capsys.readouterr().err
    assert code == 2 and str(out) in err, (code, err)


def test_bench_json_ratios_use_the_same_num_envs_baseline(tmp_path, capsys):
    """Pinned: ratios are against gym-sync at the same num_envs and the single raw env."""
    out = tmp_path / "bench.json"
    code = run_main(
        [
            "bench", "--env", "CartPole-v1", "--num-envs", "2,3", "--backends", "serial",
            "--peers", "raw,gym-sync", "--seconds", "0.02", "--warmup", "0", "-q",
            "--json", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    payload = json.loads(out.read_text())
    assert payload["meta"]["command"].startswith("vecaccel bench")
    rows = {(r["impl"], r["num_envs"]): r for r in payload["results"]}
    raw = rows[("raw", 1)]["steps_per_s"]
    for n in (2, 3):
        mine, sync = rows[("vecaccel-serial", n)], rows[("gym-sync", n)]
        assert mine["vs_gym_sync"] == pytest.approx(mine["steps_per_s"] / sync["steps_per_s"])
        assert mine["vs_raw"] == pytest.approx(mine["steps_per_s"] / raw)
        assert sync["vs_gym_sync"] == pytest.approx(1.0) and mine["vs_gym_async"] is None


# ---------------------------------------------------------------------------------------------
# vecaccel tune


@pytest.mark.parametrize(
    "extra",
    [["--seconds", "0"], ["--seconds", "-1"], ["--policy-ms", "-1"]],
    ids=["seconds-0", "seconds-negative", "policy-ms-negative"],
)
def test_tune_rejects_nonpositive_budgets_like_bench(extra, capsys):
    """``bench --seconds 0`` is a usage error (exit 2); ``tune --seconds 0`` measured nothing and
    announced "best: serial ... 0 steps/s" with exit 0, and ``--policy-ms -1`` failed every
    trial (time.sleep of a negative) and exited 1 with "no configuration ran"."""
    code = run_main(
        ["tune", "CartPole-v1", "--num-envs", "2", "--backends", "serial", "--seconds", "0.02",
         *extra]
    )  # fmt: skip
    out = capsys.readouterr().out
    assert code == 2 and "best:" not in out, (
        f"expected exit 2 and an error naming {extra[0]}; got exit {code} with output {out!r}"
    )


# ---------------------------------------------------------------------------------------------
# vecaccel.make_vec


def test_make_vec_accepts_a_numpy_integer_num_envs():
    """``num_envs`` read from a NumPy array or config (np.int64) was refused with the
    contradictory "num_envs must be a positive integer, got np.int64(2)"; batch_size of the
    async backend accepts np.integer."""
    try:
        envs = vecaccel.make_vec("CartPole-v1", np.int64(2), backend="serial")
    except ValueError as exc:
        pytest.fail(f"expected np.int64(2) to make 2 envs, got ValueError: {exc}")
    with envs:
        assert envs.num_envs == 2


def test_make_vec_with_an_empty_env_list_is_a_clear_error():
    """``make_vec([], backend="serial")`` raised a bare IndexError ('list index out of
    range'), while ``shm`` says "a vector env needs at least one env function"."""
    try:
        vecaccel.make_vec([], backend="serial").close()
    except ValueError as exc:
        assert "at least one" in str(exc), str(exc)
    except Exception as exc:
        pytest.fail(
            "expected ValueError 'a vector env needs at least one env function' (as shm says), "
            f"got {type(exc).__name__}: {exc}"
        )
    else:
        pytest.fail("expected make_vec([]) to be refused, it made a vector env of 0 envs")


def test_make_vec_with_an_env_instance_says_what_to_pass():
    """Passing ``gym.make(...)`` (an instance) instead of an id or a function gave
    "TypeError: 'TimeLimit' object is not iterable"."""
    env = gym.make("CartPole-v1")
    try:
        with pytest.raises((TypeError, ValueError)) as info:
            vecaccel.make_vec(env, 2, backend="serial")
    finally:
        env.close()
    message = str(info.value)
    assert "not iterable" not in message and ("callable" in message or "id" in message), (
        f"expected an error saying to pass an env id or env function, got {message!r}"
    )


@pytest.mark.parametrize(
    "env, expected",
    [(gym.spec("CartPole-v1"), "pass its id 'CartPole-v1'"), (3, "takes an env id")],
    ids=["env-spec", "not-iterable"],
)
def test_make_vec_with_neither_an_id_nor_functions_says_what_to_pass(env, expected):
    with pytest.raises(TypeError, match=expected):
        vecaccel.make_vec(env, 2, backend="serial")


@pytest.mark.parametrize("num_envs", [True, 2.0])
def test_make_vec_refuses_a_num_envs_that_is_not_an_integer(num_envs):
    with pytest.raises(TypeError, match="num_envs must be an integer"):
        vecaccel.make_vec("CartPole-v1", num_envs, backend="serial")


# ---------------------------------------------------------------------------------------------
# plugins


class ClaimsShm:
    @vecaccel.hookimpl
    def vecaccel_register_backends(self, registry):
        registry.add("shm", lambda env_fns, **options: None, "a third-party shm")


def test_duplicate_backend_error_blames_the_plugin_that_came_second(fresh_plugin_manager):
    """A third-party plugin registered after the built-ins that reuses the name 'shm': the
    registry lets it take 'shm' and the error's note blames the built-in
    ``vecaccel.plugins.shm`` ("in plugin 'vecaccel.plugins.shm'"), because the hook
    implementations are collected newest first (manager.py ``reversed(get_hookimpls())``)."""
    pm = vecaccel.get_plugin_manager()
    pm.register(ClaimsShm(), name="review-claims-shm")
    with pytest.raises(ValueError, match="'shm' is registered twice") as info:
        vecaccel.list_backends()
    notes = " ".join(getattr(info.value, "__notes__", []))
    assert "in plugin 'review-claims-shm'" in notes, (
        f"expected the note to name the newcomer 'review-claims-shm', got {notes!r} "
        f"(message: {info.value})"
    )


class AddsBench:
    @vecaccel.hookimpl
    def vecaccel_add_commands(self, subparsers):
        subparsers.add_parser("bench").set_defaults(handler=lambda args: 0)


def test_plugin_command_with_a_taken_name_does_not_break_the_whole_cli(
    fresh_plugin_manager, capsys
):
    """A plugin adding a sub-command named like a built-in one ('bench') made every command,
    ``vecaccel backends`` and ``vecaccel --help`` included, die with
    "argparse.ArgumentError: argument COMMAND: conflicting subparser: bench", naming no plugin."""
    pm = vecaccel.get_plugin_manager()
    pm.register(AddsBench(), name="review-adds-bench")
    try:
        with pytest.warns(PluginWarning, match="'review-adds-bench'.*VECACCEL_DISABLE_PLUGINS"):
            code = run_main(["backends"])
    except Exception as exc:
        pytest.fail(
            "expected `vecaccel backends` to work (the clashing command skipped with a warning "
            f"naming 'review-adds-bench'), got {type(exc).__name__}: {exc}"
        )
    assert code == 0


def _broken_plugin_dir(root: Path) -> Path:
    return broken_plugin_site(root, "review-broken", "review-broken", "review_broken_mod")


def test_plugin_failing_at_import_is_reported_clearly(tmp_path):
    """An installed package whose ``vecaccel`` entry point raises at import took the whole
    library down: ``vecaccel backends`` (and ``make_vec(..., backend="serial")``) died with a
    raw traceback that never says it is a vecaccel plugin, names no entry point and does not
    mention VECACCEL_DISABLE_PLUGINS."""
    site = _broken_plugin_dir(tmp_path)
    done = run_cli(["backends"], tmp_path, {"PYTHONPATH": str(site)})
    listed_builtins = done.returncode == 0 and "serial" in done.stdout
    clear_error = (
        done.returncode != 0
        and "Traceback" not in done.stderr
        and "review-broken" in done.stderr
        and DISABLE_ENV_VAR in done.stderr
    )
    assert listed_builtins or clear_error, (
        "expected the built-ins listed (the broken plugin skipped with a warning) or one error "
        "line naming entry point 'review-broken' and VECACCEL_DISABLE_PLUGINS; got exit "
        f"{done.returncode}, stderr tail: {done.stderr[-400:]!r}"
    )


def test_disable_env_var_skips_a_plugin_that_fails_at_import(tmp_path):
    """Pinned: naming the entry point in VECACCEL_DISABLE_PLUGINS is the way out."""
    site = _broken_plugin_dir(tmp_path)
    done = run_cli(
        ["backends", "--json"],
        tmp_path,
        {"PYTHONPATH": str(site), DISABLE_ENV_VAR: "review-broken"},
    )
    assert done.returncode == 0, done.stderr
    assert {"serial", "shm"} <= set(json.loads(done.stdout))


# ---------------------------------------------------------------------------------------------
# vecaccel train / eval


def test_every_documented_command_has_working_help(capsys):
    """Pinned: ``--help`` of every command and algorithm exits 0."""
    for argv in (
        [], ["backends"], ["bench"], ["tune"], ["train"], ["eval"],
        ["train", "a2c"], ["train", "ppo"], ["train", "dqn"], ["train", "c51"],
        ["train", "rainbow"],
    ):  # fmt: skip
        assert run_main([*argv, "--help"]) == 0, argv
    capsys.readouterr()


def test_resume_from_a_missing_or_corrupt_run_is_a_usage_error(tmp_path, capsys):
    """Pinned: exit 2 with one error line for a missing dir and a garbage checkpoint."""
    (tmp_path / "corrupt").mkdir()
    (tmp_path / "corrupt" / "checkpoint.pt").write_bytes(b"garbage")
    for target in ("missing", "corrupt"):
        code = run_main(["train", "ppo", "--resume", str(tmp_path / target), "--no-progress"])
        err = capsys.readouterr().err
        assert code == 2 and "error: cannot resume" in err, (target, code, err)
        assert run_main(["eval", str(tmp_path / target)]) == 2
        capsys.readouterr()


def test_train_nproc_must_be_positive(tmp_path, capsys):
    """``--nproc 0`` (or -2) was accepted and silently trained on one process, exit 0; every
    other count flag (--num-envs, --total-steps, --episodes) refuses values below 1."""
    run_dir = tmp_path / "run"
    code = run_main(
        ["train", "ppo", *TINY_PPO, "--total-steps", "32", "--nproc", "0", "--run-dir",
         str(run_dir)]
    )  # fmt: skip
    capsys.readouterr()
    assert code == 2, (
        f"expected `--nproc 0` to be a usage error (exit 2); got exit {code} and a run in "
        f"{run_dir} (checkpoint written: {(run_dir / 'checkpoint.pt').exists()})"
    )


def test_failed_async_resume_leaves_the_run_resumable(tmp_path, capsys):
    """``vecaccel train ppo --resume DIR --async --backend nosuch`` (a typo) is not checked
    before the rollout process starts: the rollout process dies with a ValueError traceback
    (exit 1) and the ``finally`` of learn_async_on_policy saves the checkpoint anyway, now
    recording backend 'nosuch' and async=True. Every later plain ``--resume DIR`` then fails
    the same way: the run is poisoned."""
    run_dir = tmp_path / "run"
    assert run_main(["train", "ppo", *TINY_PPO, "--total-steps", "32", "--run-dir",
                     str(run_dir)]) == 0  # fmt: skip
    capsys.readouterr()
    checkpoint = run_dir / "checkpoint.pt"
    before = checkpoint.read_bytes()
    done = run_cli(
        ["train", "ppo", "--resume", str(run_dir), "--async", "--backend", "nosuch",
         "--total-steps", "64", "--no-progress", "--no-tensorboard"],
        tmp_path,
    )  # fmt: skip
    rewritten = checkpoint.read_bytes() != before
    after = run_cli(
        ["train", "ppo", "--resume", str(run_dir), "--total-steps", "64", "--no-progress",
         "--no-tensorboard"],
        tmp_path,
    ).returncode if rewritten else 0  # fmt: skip
    assert not rewritten and done.returncode == 2, (
        "expected the unknown backend to be refused with exit 2 before anything runs, and the "
        f"checkpoint left as it was; got exit {done.returncode} "
        f"(stderr tail {done.stderr[-200:]!r}), checkpoint rewritten: {rewritten}, and a plain "
        f"--resume afterwards exits {after}"
    )


def test_a_reader_that_goes_away_ends_the_command_quietly() -> None:
    """``vecaccel backends | head -1``: the reader closes the pipe before the command writes.
    That used to end in a ``BrokenPipeError`` traceback (and another one at interpreter exit);
    it now ends quietly with the shell's SIGPIPE status."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # gone before the command starts: its first write fails
    try:
        done = subprocess.run(
            [sys.executable, "-m", "vecaccel", "backends"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
            cwd=REPO,
        )
    finally:
        os.close(write_end)
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr, done.stderr
    assert done.returncode == 141
