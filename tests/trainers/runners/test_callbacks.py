"""The callbacks of a run: plain callables after every iteration, one or several SB3
callbacks at SB3's points of the loop, either of them able to stop training."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vecaccel.trainers.runners.callbacks import Callbacks, is_sb3_callback

callbacks_module = pytest.importorskip("stable_baselines3.common.callbacks")


class _Recording(callbacks_module.BaseCallback):
    def __init__(self, log: list, stop_at_call: int | None = None) -> None:
        super().__init__()
        self.log, self.stop_at_call = log, stop_at_call

    def _on_training_start(self) -> None:
        self.log.append(("start", self.locals["total_timesteps"]))

    def _on_rollout_start(self) -> None:
        self.log.append("rollout_start")

    def _on_step(self) -> bool:
        self.log.append(("step", self.n_calls, self.locals["rewards"]))
        return self.n_calls != self.stop_at_call

    def _on_rollout_end(self) -> None:
        self.log.append("rollout_end")

    def _on_training_end(self) -> None:
        self.log.append("end")


def _agent() -> SimpleNamespace:
    return SimpleNamespace(num_timesteps=0)


def test_an_sb3_callback_is_called_at_its_points_of_the_loop() -> None:
    log: list = []
    callbacks = Callbacks(_Recording(log))
    callbacks.training_start(_agent(), 100)
    callbacks.rollout_start()
    assert callbacks.rollout_end([{"rewards": 1.0}, {"rewards": 2.0}])
    callbacks.training_end()
    assert log == [
        ("start", 100),
        "rollout_start",
        ("step", 1, 1.0),
        ("step", 2, 2.0),
        "rollout_end",
        "end",
    ]


def test_an_sb3_step_returning_false_stops_before_the_rollout_ends() -> None:
    log: list = []
    callbacks = Callbacks(_Recording(log, stop_at_call=2))
    callbacks.training_start(_agent(), 10)
    assert not callbacks.rollout_end([{"rewards": 0.0}] * 3)
    assert "rollout_end" not in log and len([e for e in log if e[0] == "step"]) == 2


def test_plain_and_sb3_callbacks_mix_in_one_list() -> None:
    seen: list = []
    first: list = []
    second: list = []
    callbacks = Callbacks(
        [
            lambda agent, metrics: seen.append(metrics["global_step"]),
            lambda agent: False,
            _Recording(first),
            _Recording(second),
        ]
    )
    assert isinstance(callbacks.sb3, callbacks_module.CallbackList)
    assert len(callbacks.plain) == 2
    agent = _agent()
    callbacks.training_start(agent, 8)
    # the one-argument callable stops training; the other is still called
    assert not callbacks.iteration_end(agent, {"global_step": 4})
    assert seen == [4]
    callbacks.training_end()
    assert first == second == [("start", 8), "end"]


def test_no_callback_goes_on_and_a_non_callable_is_refused() -> None:
    callbacks = Callbacks(None)
    assert callbacks.iteration_end(_agent(), {}) and callbacks.sb3 is None
    assert not is_sb3_callback(print)
    with pytest.raises(TypeError, match="got int"):
        Callbacks([lambda agent: None, 3])
