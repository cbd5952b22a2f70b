"""Tracking on Weights & Biases, offline: one tiny tracked PPO run, read back from the run's
``.wandb`` file (the config, every metric row at its global_step, the curve, a video), the same
config in TensorBoard's hyperparameters, a resumed run continuing its W&B run, rank 0 alone
tracking, the command line's flags, and the errors when wandb is missing or an online run has no
login (checked in fresh interpreters whose home holds no login; nothing goes online)."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from helpers import REPO, run_main

from vecaccel.cli import build_parser
from vecaccel.testing.leaks import wait_until
from vecaccel.trainers import PPO
from vecaccel.trainers.services.tracking import RUN_ID_FILE, STEP_KEY

wandb = pytest.importorskip("wandb")
pb = pytest.importorskip("wandb.proto.wandb_internal_pb2")
DecodeError = pytest.importorskip("google.protobuf.message").DecodeError

torch.set_num_threads(1)

#: a few hundred CartPole steps on the serial backend, one short update each
TINY = dict(backend="serial", num_envs=2, num_steps=64, update_epochs=1, num_minibatches=2,
            seed=3, progress=False, torch_threads=1)  # fmt: skip
STEPS = 256
PROJECT = "vecaccel-tests"

#: wandb's transaction log: LevelDB's log format after a 7-byte header of its own
_HEADER = struct.Struct("<4sHB")
_CHUNK = struct.Struct("<IHB")
_BLOCK = 32 * 1024
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> Iterator[Any]:
    """The records (``wandb_internal_pb2.Record``) of an offline run's ``run-ID.wandb`` file."""
    data = path.read_bytes()
    ident, magic, _ = _HEADER.unpack_from(data)
    assert (ident, magic) == (b":W&B", 0xBEE1), f"{path} is no W&B transaction log"
    position, pending = _HEADER.size, b""
    while position + _CHUNK.size <= len(data):
        left = _BLOCK - position % _BLOCK
        if left < _CHUNK.size:  # a block's tail too short for a header is padding
            position += left
            continue
        _, length, kind = _CHUNK.unpack_from(data, position)
        if kind == 0:
            position += left
            continue
        chunk = data[position + _CHUNK.size : position + _CHUNK.size + length]
        position += _CHUNK.size + length
        if kind in (_FULL, _FIRST):
            pending = chunk
        elif kind in (_MIDDLE, _LAST):
            pending += chunk
        if kind in (_FULL, _LAST):
            record = pb.Record()
            record.ParseFromString(pending)
            yield record


def _items(items: Any) -> dict[str, Any]:
    """Record items as a dict; a media value (nested keys under its own key) as a dict."""
    out: dict[str, Any] = {}
    for item in items:
        *parents, name = [item.key] if item.key else list(item.nested_key)
        target = out
        for parent in parents:
            target = target.setdefault(parent, {})
        target[name] = json.loads(item.value_json)
    return out


class OfflineRun:
    """What an offline W&B run folder holds: the run record, the config, the history rows and
    how it exited."""

    def __init__(self, folder: Path) -> None:
        (log,) = folder.glob("run-*.wandb")
        self.folder = folder
        self.run: Any = None
        self.config: dict[str, Any] = {}
        self.history: list[dict[str, Any]] = []
        self.exit_code: int | None = None
        for record in wandb_records(log):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                self.run = record.run
                self.config.update(_items(record.run.config.update))
            elif kind == "config":
                self.config.update(_items(record.config.update))
            elif kind == "history":
                self.history.append(_items(record.history.item))
            elif kind == "exit":
                self.exit_code = record.exit.exit_code


def offline_runs(wandb_dir: Path, timeout_s: float = 60.0) -> list[OfflineRun]:
    """The offline runs under ``wandb_dir``, each read once its log holds the exit record:
    wandb's service process writes the log after ``finish()`` returns, as it does for a run
    that ``wandb sync`` uploads later."""
    folders = sorted((wandb_dir / "wandb").glob("offline-run-*"))

    def written(folder: Path) -> bool:
        try:
            return OfflineRun(folder).exit_code is not None
        # no log yet, its header only, or a record half written
        except (ValueError, AssertionError, struct.error, DecodeError):
            return False

    assert wait_until(lambda: all(written(folder) for folder in folders), timeout_s, 0.1), (
        "a W&B run log was never completed"
    )
    return [OfflineRun(folder) for folder in folders]


def write_video(agent: PPO, metrics: dict[str, float]) -> None:
    """A callback that writes a short clip into the run directory, as a run's evaluation
    would, once."""
    import imageio.v2 as imageio

    path = agent.run_dir / "videos" / "clip.mp4"
    if not path.exists():
        path.parent.mkdir()
        frames = [np.full((32, 32, 3), 30 * k, np.uint8) for k in range(6)]
        imageio.mimwrite(path, frames, fps=4)


@pytest.fixture(scope="module")
def offline(tmp_path_factory) -> Iterator[Path]:
    """wandb kept on this machine: offline, quiet, its files in a temporary folder."""
    wandb_dir = tmp_path_factory.mktemp("wandb")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_DIR", str(wandb_dir))
        env.setenv("WANDB_SILENT", "true")
        # pytest captures the output, which wandb would wrap too; and the repository's git
        # state is no part of what is tested
        env.setenv("WANDB_CONSOLE", "off")
        env.setenv("WANDB_DISABLE_GIT", "true")
        yield wandb_dir
        wandb.teardown()  # its service process, which would outlive the module otherwise


@pytest.fixture(scope="module")
def tracked(offline, tmp_path_factory) -> tuple[Path, OfflineRun, dict[str, Any]]:
    """The run directory, the offline W&B run and the agent's resolved config."""
    run_dir = tmp_path_factory.mktemp("tracked") / "ppo-CartPole-v1-3"
    agent = PPO("CartPole-v1", run_dir=run_dir, track=True, wandb_project_name=PROJECT, **TINY)
    try:
        agent.learn(STEPS, callback=write_video)
    finally:
        agent.close()
    (run,) = offline_runs(offline)
    return run_dir, run, dataclasses.asdict(agent.config)


def test_the_resolved_config_is_the_runs_config(tracked) -> None:
    run_dir, run, resolved = tracked
    assert run.run.project == PROJECT
    assert run.run.display_name == run_dir.name
    assert run.run.run_id == (run_dir / RUN_ID_FILE).read_text().strip()
    config = {key: value for key, value in run.config.items() if not key.startswith("_")}
    assert config["algo"] == "ppo" and config["total_timesteps"] == STEPS
    assert config["env_id"] == "CartPole-v1" and config["track"] is True
    for key, value in TINY.items():
        assert config[key] == value, key
    # every setting the run resolved (defaults, the preset's), not only those given
    assert {key: config[key] for key in resolved} == json.loads(json.dumps(resolved))
    assert set(config) == {*resolved, "algo", "total_timesteps"}


def test_every_metric_row_reaches_wandb_at_its_global_step(tracked) -> None:
    run_dir, run, _ = tracked
    with open(run_dir / "metrics.csv", newline="") as file:
        rows = list(csv.DictReader(file))
    sent = [
        row for row in run.history if "charts/learning_curve" not in row and "videos" not in row
    ]
    assert len(sent) == len(rows) >= 2
    for row, sent_row in zip(rows, sent):
        assert sent_row[STEP_KEY] == int(row["step"])
        metrics = {
            key: float(value) for key, value in row.items() if value and key not in ("step", "time")
        }
        assert {key: sent_row[key] for key in metrics} == metrics
        assert not set(sent_row) - set(metrics) - {STEP_KEY, "_step", "_runtime", "_timestamp"}
    assert sent[-1][STEP_KEY] == STEPS
    assert "charts/episodic_return" in {key for row in sent for key in row}


def test_the_curve_and_the_runs_video_are_sent_when_it_ends(tracked) -> None:
    _, run, _ = tracked
    curve = [row for row in run.history if "charts/learning_curve" in row]
    videos = [row for row in run.history if "videos" in row]
    assert len(curve) == 1 and curve[0]["charts/learning_curve"]["_type"] == "image-file"
    assert len(videos) == 1 and videos[0]["videos"]["_type"] == "video-file"
    assert curve[0][STEP_KEY] == videos[0][STEP_KEY] == STEPS
    for media in (curve[0]["charts/learning_curve"], videos[0]["videos"]):
        assert (run.folder / "files" / media["path"]).is_file()
    assert run.exit_code == 0


def test_tensorboard_gets_the_config_as_hyperparameters_in_the_runs_event_file(tracked) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    run_dir, run, _ = tracked
    (events,) = (run_dir / "tb").iterdir()  # one run folder: no second one for the hparams
    accumulator = EventAccumulator(str(events.parent))
    accumulator.Reload()
    content = accumulator.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    hparams = {key: value.WhichOneof("kind") and getattr(value, value.WhichOneof("kind"))
               for key, value in start.hparams.items()}  # fmt: skip
    assert hparams["algo"] == "ppo" and hparams["num_steps"] == 64.0
    assert hparams["track"] == "True" and hparams["wandb_entity"] == "None"
    assert set(hparams) == {key for key in run.config if not key.startswith("_")}
    assert "charts/episodic_return" in accumulator.Tags()["scalars"]


def test_tracking_leaves_the_training_numbers_alone(tracked, tmp_path) -> None:
    run_dir, _, _ = tracked
    agent = PPO("CartPole-v1", run_dir=tmp_path / "plain", **TINY)
    try:
        agent.learn(STEPS)
    finally:
        agent.close()

    def clock(key: str) -> bool:  # the wall-clock columns: the time, SPS and the env timing
        return key in ("time", "charts/SPS") or key.startswith("stats/")

    def numbers(path: Path) -> list[dict[str, str]]:
        with open(path, newline="") as file:
            return [{key: value for key, value in row.items() if not clock(key)}
                    for row in csv.DictReader(file)]  # fmt: skip

    assert numbers(tmp_path / "plain" / "metrics.csv") == numbers(run_dir / "metrics.csv")


def test_a_resumed_run_continues_its_wandb_run(tracked, offline) -> None:
    run_dir, first, _ = tracked
    agent = PPO.load(run_dir / "checkpoint.pt", run_dir=run_dir, progress=False)
    try:
        agent.learn(128, reset_num_timesteps=False)
    finally:
        agent.close()
    runs = offline_runs(offline)
    assert len(runs) == 2
    resumed = next(run for run in runs if run.folder != first.folder)
    assert resumed.run.run_id == first.run.run_id
    steps = [row[STEP_KEY] for row in resumed.history if "charts/learning_curve" not in row]
    assert steps and min(steps) > STEPS and max(steps) == STEPS + 128


def test_only_rank_0_tracks(offline, tmp_path) -> None:
    agent = PPO("CartPole-v1", run_dir=tmp_path / "run", track=True, **TINY)
    agent.is_main = False  # what another rank of a torchrun job is
    before = len(offline_runs(offline))
    try:
        agent.learn(128)
    finally:
        agent.close()
    assert len(offline_runs(offline)) == before
    assert not (tmp_path / "run" / RUN_ID_FILE).exists()


def test_without_wandb_track_fails_before_the_run_writes(tmp_path, monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # import wandb fails, as uninstalled
    agent = PPO("CartPole-v1", run_dir=tmp_path / "run", track=True, **TINY)
    try:
        with pytest.raises(ModuleNotFoundError, match=r"track=True needs wandb.*vecaccel\[track\]"):
            agent.learn(128)
    finally:
        agent.close()
    assert not (tmp_path / "run").exists() or not os.listdir(tmp_path / "run")


@pytest.mark.usefixtures("trainers_plugin")
def test_the_flags_are_cleanrls_and_set_the_config_fields() -> None:
    argv = ["train", "dqn", "--env", "CartPole-v1", "--track", "--wandb-project-name", "atari",
            "--wandb-entity", "lab"]  # fmt: skip
    args = build_parser().parse_args(argv)
    assert args.config == {"track": True, "wandb_project_name": "atari", "wandb_entity": "lab"}
    assert build_parser().parse_args([*argv[:4], "--no-track"]).config == {"track": False}


@pytest.mark.usefixtures("trainers_plugin")
def test_without_wandb_track_is_a_one_line_usage_error(tmp_path, monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)
    argv = ["train", "ppo", "--env", "CartPole-v1", "--backend", "serial", "--num-envs", "2",
            "--total-timesteps", "64", "--no-progress", "--run-dir", str(tmp_path / "run"),
            "--preset", "none", "--track"]  # fmt: skip
    assert run_main(argv) == 2
    assert capsys.readouterr().err == (
        "error: --track needs wandb, which is not installed: pip install 'vecaccel[track]'\n"
    )
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "field, value",
    [("track", "yes"), ("wandb_project_name", ""), ("wandb_entity", 7)],
)
def test_bad_tracking_settings_are_refused_naming_the_field(field, value) -> None:
    with pytest.raises(ValueError, match=field):
        PPO.config_cls(**{field: value})


# -- an online run without a login ------------------------------------------------------------

#: what refusing an online run without credentials says, after what asked for tracking
NOT_LOGGED_IN = (
    " logs to W&B online, but wandb finds no login on this machine: run `wandb login`, set "
    "WANDB_API_KEY, or set WANDB_MODE=offline to keep the run on disk (`wandb sync` uploads "
    "it later)"
)


def _without_login(home: Path, args: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    """``python ARGS`` in a fresh interpreter (wandb reads its settings once per process) whose
    home holds no wandb login, with no ``WANDB_*`` variable but ``env``; stdin is no terminal,
    so wandb could not prompt either. The interpreter is stopped after two minutes at most,
    so a check that reached for the network fails rather than hangs."""
    clean = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("WANDB_") and key not in ("NETRC", "XDG_CONFIG_HOME")
    }
    clean.update(HOME=str(home), PYTHONPATH=str(REPO), **env)
    return subprocess.run(
        [sys.executable, *args],
        cwd=home,
        env=clean,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


CHECK = (
    "from vecaccel.trainers.services.tracking import wandb_not_logged_in; "
    "print(wandb_not_logged_in('--track'))"
)
#: a key in the form wandb takes (never sent anywhere: nothing here goes online)
KEY = "k" * 40


def test_without_a_login_an_online_run_is_refused_with_what_to_do(tmp_path) -> None:
    done = _without_login(tmp_path, ["-c", CHECK])
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"--track{NOT_LOGGED_IN}\n"


def _netrc_entry(home: Path) -> dict[str, str]:
    """The ``~/.netrc`` entry ``wandb login`` writes for wandb's default host; no variable."""
    from urllib.parse import urlsplit

    host = urlsplit(wandb.Settings().base_url).netloc
    (home / ".netrc").write_text(f"machine {host}\n  login user\n  password {KEY}\n")
    (home / ".netrc").chmod(0o600)
    return {}


#: each way a run passes the check: what it puts in the empty home, and its variables
LOGINS: dict[str, Any] = {
    "WANDB_API_KEY": lambda home: {"WANDB_API_KEY": KEY},
    "netrc": _netrc_entry,
    "offline": lambda home: {"WANDB_MODE": "offline"},
    "disabled": lambda home: {"WANDB_MODE": "disabled"},
}


@pytest.mark.parametrize("login", sorted(LOGINS))
def test_a_login_or_a_run_kept_off_line_passes_the_check(login, tmp_path) -> None:
    done = _without_login(tmp_path, ["-c", CHECK], **LOGINS[login](tmp_path))
    assert (done.returncode, done.stdout) == (0, "None\n"), done.stderr


def test_a_key_wandb_cannot_use_is_named_before_the_run(tmp_path) -> None:
    done = _without_login(tmp_path, ["-c", CHECK], WANDB_API_KEY="short")
    assert done.stdout.startswith("--track: wandb cannot use the credentials it found: ")
    assert "40" in done.stdout  # wandb's own reason: the length of a key


def test_without_a_login_track_is_one_line_before_the_run_writes(tmp_path) -> None:
    run_dir = tmp_path / "run"
    argv = ["-m", "vecaccel", "train", "ppo", "--env", "CartPole-v1", "--backend", "serial",
            "--num-envs", "2", "--total-timesteps", "64", "--no-progress", "--run-dir",
            str(run_dir), "--preset", "none", "--track"]  # fmt: skip
    done = _without_login(tmp_path, argv)
    assert (done.returncode, done.stderr) == (2, f"error: --track{NOT_LOGGED_IN}\n")
    assert not run_dir.exists() and not (tmp_path / "wandb").exists()
    # the Python API refuses it where learn starts, before the run directory is written
    learn = (
        "from vecaccel.trainers import PPO\n"
        f"agent = PPO('CartPole-v1', run_dir={str(run_dir)!r}, track=True, "
        "backend='serial', num_envs=2, progress=False)\n"
        "try:\n"
        "    agent.learn(64)\n"
        "except RuntimeError as exc:\n"
        "    print(exc)\n"
    )
    done = _without_login(tmp_path, ["-c", learn])
    assert done.stdout == f"track=True{NOT_LOGGED_IN}\n", done.stderr
    assert not run_dir.exists() or not os.listdir(run_dir)
