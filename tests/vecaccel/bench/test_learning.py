"""The learning benchmarks' shared parts: the return curve and its stopping score, the callback
that feeds it from a real trainer, the medians of races, rliable's interval and the plot."""

from __future__ import annotations

import math

import pytest

from vecaccel.bench import RunRecord
from vecaccel.bench.learning import (
    CurveCallback,
    ReturnCurve,
    censored_median,
    iqm_interval,
    learn_on_curve,
    load_runs,
    plot_seed_curves,
    return_by,
    steady_pace,
    up_to,
)


def test_the_curve_keeps_evenly_spaced_means_of_the_last_window():
    curve = ReturnCurve(1000, points=4, window=3)
    assert curve.every == 250
    curve.add(100, [1.0])
    curve.add(600, [2.0, 3.0, 4.0])  # two points pass at once, both with what ended by 600
    curve.add(1000, [])
    assert [point["step"] for point in curve.points] == [250, 500, 750, 1000]
    assert [point["return"] for point in curve.points] == [3.0, 3.0, 3.0, 3.0]
    assert [point["episodes"] for point in curve.points] == [4, 4, 4, 4]
    assert curve.score() == 3.0
    outcome = curve.outcome(1000, {"lr": 1.0})
    assert (outcome["steps"], outcome["episodes"], outcome["reached"]) == (1000, 4, None)


def test_the_curve_stops_at_its_score_over_a_full_window_only():
    curve = ReturnCurve(1000, stop_at=10.0, window=2)
    assert curve.add(10, [50.0])  # one episode is not a full window
    assert curve.add(20, [-40.0])  # a full window, whose mean is 5
    assert not curve.add(30, [60.0])  # the last two, -40 and 60: a mean of 10
    assert curve.reached is not None and curve.reached["step"] == 30
    assert not curve.add(40, [-100.0])  # once reached, it stays reached
    assert curve.reached["step"] == 30


def test_a_run_short_of_the_score_counts_as_the_slowest():
    """The race's median with one run of three stopped short of the score is the slower of the
    two that reached it; with two of three short, it is unknown."""

    def run(seconds):
        return {"reached": {"wall_s": seconds, "step": 1000 * seconds} if seconds else None}

    assert censored_median([run(388.0), run(None), run(166.0)], "wall_s") == 388.0
    assert censored_median([run(388.0), run(None), run(166.0)], "step") == 388_000.0
    assert censored_median([run(None), run(None), run(166.0)], "wall_s") is None
    assert censored_median([run(120.0), run(None)], "wall_s") is None
    assert censored_median([], "wall_s") is None


def test_the_iqm_interval_depends_on_its_own_scores_only():
    pytest.importorskip("rliable")
    import numpy as np

    matrix = [[1.0, 0.8], [1.2, 0.9], [0.7, 1.1]]
    first = iqm_interval(matrix, reps=200)
    np.random.seed(123)  # whatever the global generator held before
    assert iqm_interval(matrix, reps=200) == first
    iqm, (low, high) = first
    assert low < iqm < high
    one_run = iqm_interval([[2.0, 4.0]], reps=50)
    assert math.isclose(one_run[0], 3.0) and one_run[1] == [3.0, 3.0]


def test_curves_are_cut_by_steps_and_read_by_seconds():
    curve = [{"step": 100 * i, "wall_s": 2.0 * i, "return": float(i)} for i in range(1, 6)]
    assert [point["step"] for point in up_to(curve, 300)] == [100, 200, 300]
    assert return_by(curve, 7.0) == 3.0 and math.isnan(return_by(curve, 1.0))


def test_every_seed_thin_and_the_median_bold():
    matplotlib = pytest.importorskip("matplotlib")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = [
        [{"step": 100 * i, "wall_s": scale * i, "return": scale * i} for i in range(1, 4)]
        for scale in (1.0, 2.0, 3.0)
    ]
    figure, (by_steps, by_seconds) = plt.subplots(1, 2)
    try:
        plot_seed_curves(by_steps, by_seconds, curves, "tab:red", "PPO (3 seeds)")
        for axis in (by_steps, by_seconds):
            lines = axis.get_lines()
            assert [line.get_linewidth() for line in lines] == [0.6, 0.6, 0.6, 2.2]
            assert list(lines[-1].get_ydata()) == [2.0, 4.0, 6.0]  # the middle seed's
            assert lines[-1].get_label() == "PPO (3 seeds)"
        assert list(by_seconds.get_lines()[-1].get_xdata()) == [2.0, 4.0, 6.0]
    finally:
        plt.close(figure)


def test_a_real_agent_feeds_the_curve_and_stops_at_the_score(tmp_path):
    """PPO on CartPole-v1: the callback hands over the episodes each iteration ended, and a
    score every policy reaches stops the run at its first full window."""
    pytest.importorskip("torch")
    from vecaccel.trainers import PPO

    agent = PPO("CartPole-v1", preset="none", num_envs=4, num_steps=32, backend="serial",
                seed=1, device="cpu", tensorboard=False, progress=False)  # fmt: skip
    curve = ReturnCurve(4096, stop_at=0.0, window=5)
    outcome = learn_on_curve(agent, 4096, curve)
    assert outcome["reached"] is not None and outcome["steps"] < 4096
    assert outcome["episodes"] >= 5 and outcome["reached"]["step"] == outcome["steps"]
    assert outcome["config"]["num_envs"] == 4 and "device" in outcome["config"]
    # the file a benchmark writes is read back with the keys it asks for
    RunRecord("python bench.py", "learning/toy").write(
        tmp_path / "run.json", outcome["curve"], summary={"score": outcome["score"]}, seed=1
    )
    (found,) = load_runs(tmp_path, ("seed",))
    assert found["seed"] == 1 and found["score"] == outcome["score"]
    assert found["file"] == "run.json" and found["curve"] == outcome["curve"]
    assert callable(CurveCallback(curve))


def test_the_steady_pace_leaves_out_the_first_fifth_and_projects_the_rest():
    # a slow start (20 s for the first 200 steps), then 100 steps a second
    curve = [
        {"step": 200, "wall_s": 20.0},
        {"step": 600, "wall_s": 24.0},
        {"step": 1000, "wall_s": 28.0},
    ]
    outcome = {"steps": 1000, "wall_s": 28.0, "curve": curve}
    paced = steady_pace(outcome, 3000)
    assert paced["steps_per_s"] == pytest.approx(1000 / 28)
    assert paced["steady_steps_per_s"] == pytest.approx(100.0)
    assert paced["projected_wall_s"] == pytest.approx(48.0)
    assert "steady_steps_per_s" not in outcome  # the outcome is left as it was


def test_a_run_too_short_for_a_steady_pace_keeps_its_overall_rate():
    outcome = {"steps": 1000, "wall_s": 20.0, "curve": [{"step": 1000, "wall_s": 20.0}]}
    paced = steady_pace(outcome, 3000)
    assert paced["steady_steps_per_s"] == paced["steps_per_s"] == pytest.approx(50.0)
    assert paced["projected_wall_s"] == pytest.approx(60.0)
