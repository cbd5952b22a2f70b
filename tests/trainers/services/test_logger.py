"""The run logger: the files a run writes, and how a resumed run continues them."""

from __future__ import annotations

import csv

import numpy as np
import pytest
import torch

from vecaccel.trainers.services.logger import RunLogger, draw_learning_curve

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


def test_the_config_goes_to_tensorboard_as_hyperparameters_of_the_run_itself(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.hparams import metadata

    logger = RunLogger(tmp_path, 200, progress=False)
    config = {"algo": "ppo", "learning_rate": 2.5e-4, "num_envs": 8, "anneal_lr": True,
              "run_dir": None, "hidden_sizes": (64, 64)}  # fmt: skip
    logger.log_hparams(config)
    logger.log(100, {"charts/episodic_return": 12.0})
    logger.close()

    (events,) = (tmp_path / "tb").iterdir()  # add_hparams would make a second run folder
    assert events.is_file()
    accumulator = EventAccumulator(str(tmp_path / "tb"))
    accumulator.Reload()
    content = accumulator.PluginTagToContent(metadata.PLUGIN_NAME)
    start = metadata.parse_session_start_info_plugin_data(content[metadata.SESSION_START_INFO_TAG])
    shown = {key: getattr(value, value.WhichOneof("kind")) for key, value in start.hparams.items()}
    assert shown == {"algo": "ppo", "learning_rate": 2.5e-4, "num_envs": 8.0, "anneal_lr": "True",
                     "run_dir": "None", "hidden_sizes": "(64, 64)"}  # fmt: skip
    experiment = metadata.parse_experiment_plugin_data(content[metadata.EXPERIMENT_TAG])
    assert "charts/episodic_return" in {info.name.tag for info in experiment.metric_infos}
    assert accumulator.Scalars("charts/episodic_return")[0].value == 12.0


@pytest.mark.parametrize("first_step", [2_048, 100_000], ids=["from-the-start", "resumed-at-100k"])
def test_the_step_axis_of_a_curve_to_300k_reads_in_short_distinct_labels(first_step):
    """Each tick of the step axis is a few characters in engineering notation (``150k``), none
    repeated, and no two labels overlap on the saved figure's canvas."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.linspace(first_step, 300_000, 150)
    figure = draw_learning_curve(steps, steps / 1_000, np.sqrt(steps), "episodic return")
    try:
        figure.canvas.draw()
        axis = figure.axes[0]
        low, high = axis.get_xlim()
        shown = [
            label for label in axis.get_xticklabels() if low <= label.get_position()[0] <= high
        ]
        texts = [label.get_text() for label in shown]
        assert 3 <= len(texts) <= 7, texts
        assert all(len(text) <= 5 for text in texts), texts
        assert len(set(texts)) == len(texts), texts
        assert "300k" in texts or "250k" in texts, texts
        renderer = figure.canvas.get_renderer()
        boxes = sorted((label.get_window_extent(renderer) for label in shown), key=lambda b: b.x0)
        assert all(left.x1 < right.x0 for left, right in zip(boxes, boxes[1:])), texts
    finally:
        plt.close(figure)
