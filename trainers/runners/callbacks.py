"""Training callbacks: one protocol for every algorithm, and SB3's ``BaseCallback`` as it is.

``agent.learn(n, callback)`` (or ``SyncRunner(agent).run(n, callback)``) takes:

- **a callable** ``callback(agent, metrics)`` (or ``callback(agent)``), called once per iteration
  of the loop, after the iteration's collect and its update, for every algorithm. An iteration
  of A2C and PPO collects one ``[T, B]`` rollout and makes one update from it; one of the DQN
  family steps the envs once and makes the updates the replay ratio allows then (none before
  ``learning_starts``). Returning ``False`` stops training (``None`` goes on). ``metrics``
  always holds the keys of :data:`CALLBACK_KEYS`, and the ``losses/...`` of the algorithm when
  the iteration made an update (their mean over its updates).
- **an SB3** ``stable_baselines3.common.callbacks.BaseCallback`` (``EvalCallback``,
  ``CheckpointCallback``, a ``CallbackList``, your own subclass), given the agent as its
  ``model``: ``_on_training_start`` before the first collect, ``_on_rollout_start`` before each
  collect, ``_on_step`` once per vector step of it (``n_calls`` counts vector steps, as in SB3;
  ``locals`` holds that step's ``rewards`` and ``dones``), ``_on_rollout_end`` after it and
  before the update, ``_on_training_end`` at the end. ``_on_step`` returning ``False`` stops
  training before the update, as in SB3. A2C and PPO collect a rollout in one call, so their
  ``_on_step`` calls come once the rollout is in, with ``num_timesteps`` at its end.
- **a list** of any of these.

In asynchronous mode (``mode="async"``) the callbacks are called in the optimiser's process once
per turn of its loop, with the same keys: a rollout and its update (A2C, PPO), or a chunk of
vector steps and the updates it made due (the DQN family). An SB3 callback's ``_on_step`` comes
once per vector step of the turn, after its updates (the collector process has moved on).

Example:
    >>> from vecaccel.trainers import DQN
    >>> seen = []
    >>> def callback(agent, metrics):
    ...     seen.append(metrics["global_step"])
    ...     return metrics["global_step"] < 40   # False stops training
    >>> agent = DQN("CartPole-v1", backend="serial", num_envs=4, learning_starts=16,
    ...             batch_size=8, progress=False, tensorboard=False)
    >>> _ = agent.learn(1_000, callback)
    >>> seen
    [4, 8, 12, 16, 20, 24, 28, 32, 36, 40]
    >>> agent.close()
"""

from __future__ import annotations

import inspect
import sys
from typing import Any

from vecaccel.trainers.algos.base import Algorithm, Callback

__all__ = ["CALLBACK_KEYS", "Callbacks", "call_callback", "is_sb3_callback"]

#: The keys of every callback's ``metrics``, for every algorithm (a value is ``None`` where
#: there is nothing to report, an episode return when no episode ended in the iteration, say).
CALLBACK_KEYS = (
    "global_step",
    "charts/updates",
    "charts/episodes",
    "charts/episodic_return",
    "charts/episodic_length",
    "charts/SPS",
    "charts/learning_rate",
)


def is_sb3_callback(callback: Any) -> bool:
    """Whether ``callback`` is an SB3 ``BaseCallback`` (SB3 is not imported to find out: an
    instance of it means it was)."""
    module = sys.modules.get("stable_baselines3.common.callbacks")
    return module is not None and isinstance(callback, module.BaseCallback)


class Callbacks:
    """The callbacks of one run, called by the runner at the points of its loop.

    Args:
        callback: what ``learn`` was given (see the module's docstring), or ``None``.

    Raises:
        TypeError: ``callback`` is neither callable nor an SB3 callback.
    """

    def __init__(self, callback: Any) -> None:
        if callback is None:
            items: list[Any] = []
        elif isinstance(callback, (list, tuple)):
            items = list(callback)
        else:
            items = [callback]

        sb3 = [item for item in items if is_sb3_callback(item)]
        self.plain = [item for item in items if not is_sb3_callback(item)]
        for item in self.plain:
            if not callable(item):
                raise TypeError(
                    f"a callback is callback(agent, metrics) or an SB3 BaseCallback, got "
                    f"{type(item).__name__}"
                )
        self.sb3: Any = None
        if len(sb3) == 1:
            self.sb3 = sb3[0]
        elif sb3:
            from stable_baselines3.common.callbacks import CallbackList

            self.sb3 = CallbackList(sb3)

    def add_config_callbacks(self, agent: Any) -> None:
        """Add the callbacks ``agent``'s config asks for, after the user's: its periodic
        evaluation (``eval_every``, :mod:`~vecaccel.trainers.runners.evaluation`). Called once
        the run has begun, its step counters set."""
        from vecaccel.trainers.runners.evaluation import periodic_evaluation

        evaluation = periodic_evaluation(agent)
        if evaluation is not None:
            self.plain.append(evaluation)

    def training_start(self, agent: Any, total_timesteps: int) -> None:
        """Before the first collect of a run to ``total_timesteps`` env steps in all."""
        if self.sb3 is not None:
            self.sb3.init_callback(agent)
            self.sb3.on_training_start({"self": agent, "total_timesteps": int(total_timesteps)}, {})

    def rollout_start(self) -> None:
        """Before each collect."""
        if self.sb3 is not None:
            self.sb3.on_rollout_start()

    def rollout_end(self, steps: list[dict[str, Any]]) -> bool:
        """After each collect, before its update; ``steps`` holds each vector step's locals.
        Whether training goes on."""
        for step in steps:
            self.sb3.update_locals(step)
            if not self.sb3.on_step():
                return False
        self.sb3.on_rollout_end()
        return True

    def iteration_end(self, agent: Any, metrics: dict[str, Any]) -> bool:
        """After each iteration's update; whether training goes on."""
        go_on = True
        for callback in self.plain:
            go_on = call_callback(callback, agent, metrics) and go_on
        return go_on

    def training_end(self) -> None:
        """When the run has ended without an error."""
        if self.sb3 is not None:
            self.sb3.on_training_end()


def call_callback(callback: Callback, agent: Algorithm, metrics: dict[str, Any]) -> bool:
    """Call ``callback(agent, metrics)`` (or ``callback(agent)`` for a one-parameter callable);
    whether training goes on."""
    if _takes_one_argument(callback):
        return callback(agent) is not False
    return callback(agent, metrics) is not False


def _takes_one_argument(callback: Callback) -> bool:
    try:
        parameters = list(inspect.signature(callback).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters):
        return False
    positional = [
        p
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    return len(positional) == 1
