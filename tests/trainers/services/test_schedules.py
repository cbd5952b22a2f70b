"""The linear schedule (against CleanRL's), the off-policy replay schedule and the log period:
when updates, target updates and metric rows fall due, on one rank and on several."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.trainers.services.schedules import LogPeriod, ReplaySchedule, linear_schedule


def test_linear_schedule_holds_its_end_after_the_duration() -> None:
    assert linear_schedule(1.0, 0.1, 100, 0) == 1.0
    assert linear_schedule(1.0, 0.1, 100, 100) == pytest.approx(0.1)
    assert linear_schedule(1.0, 0.1, 100, 10_000) == pytest.approx(0.1)


def _cleanrl_linear_schedule(start_e: float, end_e: float, duration: int, t: int) -> float:
    slope = (end_e - start_e) / duration
    return max(slope * t + start_e, end_e)


@given(
    st.floats(0.05, 1.0),
    st.floats(0.0, 0.05),
    st.integers(1, 10_000),
    st.integers(0, 20_000),
)
@settings(max_examples=200, deadline=None, derandomize=True)
def test_linear_schedule_matches_cleanrl(start, end, duration, t) -> None:
    assert linear_schedule(start, end, duration, t) == pytest.approx(
        _cleanrl_linear_schedule(start, end, duration, t), abs=1e-12
    )


def test_updates_keep_the_replay_ratio_at_every_step() -> None:
    schedule = ReplaySchedule(
        learning_starts=0, replay_ratio=0.5, batch_size=8, target_update_period=10
    )
    for learned in range(0, 500, 7):
        updates = schedule.updates_due(learned)
        assert updates * schedule.samples_per_update <= schedule.replay_ratio * learned
        assert (updates + 1) * schedule.samples_per_update > schedule.replay_ratio * learned
    assert schedule.measured_ratio(schedule.updates_due(160), 160) == pytest.approx(0.5)


def test_a_resumed_run_with_its_buffer_skips_the_warm_up() -> None:
    schedule = ReplaySchedule(
        learning_starts=1000, replay_ratio=1.0, batch_size=32, target_update_period=500
    )
    assert schedule.learn_from(5000, min_fill=32) == 6000
    assert schedule.learn_from(5000, min_fill=32, warm_up=False) == 5032


def test_ranks_share_the_warm_up_and_add_their_batches() -> None:
    config = SimpleNamespace(
        learning_starts=101, replay_ratio=2.0, batch_size=16, target_update_period=64
    )
    schedule = ReplaySchedule.of(config, ranks=4)
    assert schedule.samples_per_update == 64
    assert schedule.updates_per_target_update == 2  # 64 steps x 2 samples / 64 per update
    share = schedule.rank_share()
    assert (share.learning_starts, share.ranks, share.samples_per_update) == (26, 1, 16)


def test_target_updates_every_period_and_at_least_every_update() -> None:
    schedule = ReplaySchedule(
        learning_starts=0, replay_ratio=0.01, batch_size=256, target_update_period=10
    )
    assert not schedule.target_update_due(step=109, last_target_update=100)
    assert schedule.target_update_due(step=110, last_target_update=100)
    assert schedule.updates_per_target_update == 1


def test_log_period_is_due_once_per_period() -> None:
    period = LogPeriod(100, next_step=100)
    assert [step for step in range(0, 450, 25) if period.due(step)] == [100, 200, 300, 400]


def test_a_log_period_of_zero_logs_every_time() -> None:
    period = LogPeriod(0, next_step=100)
    assert all(period.due(step) for step in (0, 1, 2))
