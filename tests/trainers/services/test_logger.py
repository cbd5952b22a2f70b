"""The run logger: the files a run writes, and how a resumed run continues them."""

from __future__ import annotations

import csv

import torch

from vecaccel.trainers.services.logger import RunLogger

torch.set_num_threads(1)


def test_run_logger_files_and_resume(tmp_path):
    logger = RunLogger(tmp_path, 300, progress=False)
    for step in (100, 200, 300):
        logger.log(step, {"charts/episodic_return": step / 10, "losses/value_loss": 1.0})
    assert logger.close() == tmp_path / "learning_curve.png"
    assert (tmp_path / "learning_curve.png").stat().st_size > 0
    assert any((tmp_path / "tb").iterdir())

    resumed = RunLogger(tmp_path, 400, use_tensorboard=False, progress=False, resume_step=200)
    resumed.log(300, {"charts/SPS": 5.0})  # a new column rewrites the header
    resumed.close()
    rows = list(csv.DictReader(open(tmp_path / "metrics.csv")))
    assert [int(r["step"]) for r in rows] == [100, 200, 300]
    assert rows[-1]["charts/SPS"] == "5.0" and rows[-1]["charts/episodic_return"] == ""
