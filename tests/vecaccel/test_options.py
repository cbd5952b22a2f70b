"""The typed backend options: unit names, aliases, and the ``TypeError`` for a misspelled option.

``make_vec`` checks the options against the backend's dataclass before any worker starts or
any env is built.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from backend_matrix import backends

import vecaccel
from vecaccel.manager import BackendRegistry, get_backend
from vecaccel.options import (
    ActionServerOptions,
    AsyncOptions,
    BackendOptions,
    HybridOptions,
    SerialOptions,
    ShmOptions,
    WorkerOptions,
)
from vecaccel.worker import WorkerPool

#: The built-ins' option classes, as each declares when it registers.
OPTIONS_OF = {
    "serial": SerialOptions,
    "shm": ShmOptions,
    "hybrid": HybridOptions,
    "async": AsyncOptions,
    "action_server": ActionServerOptions,
}

#: Every registered backend's option class (only the classes: no backend runs here).
DECLARED = {b.name: b.options_class for b in backends() if b.options_class is not None}


def taking(alias: str) -> list[str]:
    """The registered backends whose options take ``alias``."""
    return [name for name, options in DECLARED.items() if alias in options.aliases()]


class CountingEnvFn:
    """An env function that counts how often it was called (it must not be, on a bad option)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self):
        import gymnasium as gym

        self.calls += 1
        return gym.make("CartPole-v1")


@pytest.fixture
def no_workers(monkeypatch):
    """Fail the test if a worker pool is started."""

    def refuse(self, *args, **kwargs):
        raise AssertionError("a worker pool was started")

    monkeypatch.setattr(WorkerPool, "__init__", refuse)


# -- the dataclasses ----------------------------------------------------------------------------


def test_each_builtin_backend_declares_its_options_class():
    for name, options in OPTIONS_OF.items():
        assert get_backend(name).options is options


def test_durations_carry_their_unit_in_the_name():
    for options in DECLARED.values():
        for name in options.option_names():
            if "timeout" in name or "spin" in name:
                assert name.endswith(("_s", "_us")), (options.__name__, name)
    names = set(WorkerOptions.option_names())
    assert {"step_timeout_s", "start_timeout_s", "spin_us", "worker_spin_us"} <= names
    assert "drain_timeout_s" in ShmOptions.option_names()
    assert "drain_timeout_s" in ActionServerOptions.option_names()


def test_every_option_has_a_docstring_in_the_source():
    """Each field is documented where it is declared (a string right under it)."""
    import ast
    import inspect

    import vecaccel.options as module

    tree = ast.parse(inspect.getsource(module))
    for node in tree.body:
        if not isinstance(node, ast.ClassDef) or not node.name.endswith("Options"):
            continue
        body = node.body
        for index, item in enumerate(body):
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                if item.target.id.isupper():
                    continue  # ALIASES
                following = body[index + 1] if index + 1 < len(body) else None
                assert (
                    isinstance(following, ast.Expr)
                    and isinstance(following.value, ast.Constant)
                    and isinstance(following.value.value, str)
                ), f"{node.name}.{item.target.id} has no docstring"


def test_defaults_are_those_of_the_backends():
    options = ShmOptions()
    assert options.copy is True
    assert options.num_workers is None
    assert options.on_worker_failure == "raise"
    assert options.max_restarts == 100
    assert options.step_timeout_s is None
    assert options.start_timeout_s == 120.0
    assert options.drain_timeout_s == 30.0
    assert options.worker_threads == 1
    assert options.inline_envs == 0
    assert HybridOptions().inline_envs is None
    assert AsyncOptions().batch_size is None
    assert ActionServerOptions().device == "cpu"
    assert ActionServerOptions().alternating is False


def test_options_are_frozen():
    options = ShmOptions(num_workers=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        options.num_workers = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_workers", 0, "num_workers"),
        ("num_workers", 1.5, "num_workers"),
        ("on_worker_failure", "retry", "on_worker_failure"),
        ("step_timeout_s", 0, "step_timeout_s"),
        ("start_timeout_s", -1, "start_timeout_s"),
        ("spin_us", -1, "spin_us"),
        ("worker_spin_us", 1e6, "worker_spin_us"),
        ("max_restarts", -1, "max_restarts"),
    ],
)
def test_values_out_of_range_are_a_value_error(field, value, message):
    with pytest.raises(ValueError, match=message):
        ShmOptions(**{field: value})


def test_limits_that_mean_no_limit_are_accepted():
    import math

    options = ShmOptions(max_restarts=math.inf, start_timeout_s=None, spin_us=5_000_000)
    assert options.max_restarts == math.inf and options.start_timeout_s is None


# -- aliases: one test per family -----------------------------------------------------------------


@pytest.mark.parametrize("backend", taking("step_timeout"))
def test_step_timeout_is_an_alias_of_step_timeout_s(backend):
    options = DECLARED[backend].from_kwargs(backend, {"step_timeout": 2.5})
    assert options.step_timeout_s == 2.5


@pytest.mark.parametrize("backend", taking("start_timeout"))
def test_start_timeout_is_an_alias_of_start_timeout_s(backend):
    options = DECLARED[backend].from_kwargs(backend, {"start_timeout": 60})
    assert options.start_timeout_s == 60


@pytest.mark.parametrize("backend", taking("drain_timeout"))
def test_drain_timeout_is_an_alias_of_drain_timeout_s(backend):
    options = DECLARED[backend].from_kwargs(backend, {"drain_timeout": 0.5})
    assert options.drain_timeout_s == 0.5


def test_old_names_reach_the_running_backend(leak_check):
    envs = vecaccel.make_vec(
        "CartPole-v1",
        2,
        backend="shm",
        num_workers=1,
        context="fork",
        step_timeout=5,
        start_timeout=60,
        drain_timeout=1.5,
    )
    try:
        assert envs.pool.step_timeout_s == 5
        assert envs.pool.start_timeout_s == 60
        assert envs.drain_timeout_s == 1.5
        envs.reset(seed=0)
        envs.step(np.zeros(2, dtype=np.int64))
    finally:
        envs.close()


def test_an_option_under_both_spellings_is_a_type_error(no_workers):
    with pytest.raises(TypeError, match="step_timeout_s.*twice"):
        vecaccel.make_vec("CartPole-v1", 2, backend="shm", step_timeout=1.0, step_timeout_s=2.0)


# -- unknown and misspelled options -------------------------------------------------------------


@pytest.mark.parametrize(
    "backend, given, suggested",
    [
        ("shm", "num_worker", "num_workers"),
        ("shm", "step_timout", "step_timeout_s"),  # a near-miss of the old name: the new one
        ("shm", "step_timeout_ms", "step_timeout_s"),
        ("hybrid", "inline_env", "inline_envs"),
        ("async", "batchsize", "batch_size"),
        ("action_server", "alternate", "alternating"),
        ("action_server", "drain_timout", "drain_timeout_s"),
        ("serial", "cpy", "copy"),
        # the house's one rule (vecaccel.errors.closest_name): letter case and "-" for "_"
        # are the same spelling
        ("shm", "NUM-WORKERS", "num_workers"),
        ("shm", "Step-Timeout", "step_timeout_s"),
    ],
)
def test_a_misspelled_option_is_a_type_error_naming_backend_option_and_suggestion(
    backend, given, suggested, no_workers
):
    env_fn = CountingEnvFn()
    with pytest.raises(TypeError) as info:
        vecaccel.make_vec(env_fn, 2, backend=backend, **{given: 1})
    message = str(info.value)
    assert f"backend {backend!r}" in message
    assert f"option {given!r}" in message
    assert f"did you mean {suggested!r}?" in message
    assert env_fn.calls == 0  # raised before any env was built


def test_an_option_of_another_backend_is_a_type_error(no_workers):
    """``serial`` has no workers: ``num_workers`` is refused by ``make_vec``, naming it."""
    with pytest.raises(TypeError, match="backend 'serial' has no option 'num_workers'"):
        vecaccel.make_vec("CartPole-v1", 2, backend="serial", num_workers=2)


def test_an_option_a_backend_refuses_on_purpose_says_why(no_workers):
    with pytest.raises(TypeError, match="sets its batch itself"):
        vecaccel.make_vec("CartPole-v1", 2, backend="action_server", batch_size=1)


def test_an_option_with_no_close_match_lists_the_valid_ones(no_workers):
    with pytest.raises(TypeError) as info:
        vecaccel.make_vec("CartPole-v1", 2, backend="async", zzz=1)
    message = str(info.value)
    assert "did you mean" not in message
    assert "batch_size" in message and "num_workers" in message


def test_a_bad_value_is_a_value_error_before_any_worker_starts(no_workers):
    env_fn = CountingEnvFn()
    with pytest.raises(ValueError, match="on_worker_failure"):
        vecaccel.make_vec(env_fn, 2, backend="shm", on_worker_failure="sometimes")
    assert env_fn.calls == 0


# -- factories and third-party backends -----------------------------------------------------------


def test_a_builtin_factory_called_directly_takes_keywords():
    envs = get_backend("serial").factory(
        [CountingEnvFn()] * 2, autoreset_mode="NextStep", copy=False
    )
    try:
        assert envs.copy is False
    finally:
        envs.close()
    with pytest.raises(TypeError, match="did you mean 'copy'"):
        get_backend("serial").factory([CountingEnvFn()] * 2, cpoy=False)


def test_a_factory_refuses_options_and_keywords_together():
    with pytest.raises(TypeError, match="one or the other"):
        SerialOptions.resolve("serial", SerialOptions(), {"copy": False})
    with pytest.raises(TypeError, match="takes SerialOptions"):
        SerialOptions.resolve("serial", ShmOptions(), None)


def test_a_third_party_options_class_with_aliases():
    @dataclasses.dataclass(frozen=True, kw_only=True)
    class MyOptions(BackendOptions):
        poll_interval_s: float = 0.1
        """How often to poll."""

        ALIASES = {"poll_interval": "poll_interval_s"}

    options = MyOptions.from_kwargs("mine", {"poll_interval": 0.5, "copy": False})
    assert (options.poll_interval_s, options.copy) == (0.5, False)
    assert MyOptions.aliases() == {"poll_interval": "poll_interval_s"}
    with pytest.raises(TypeError, match="did you mean 'poll_interval_s'"):
        MyOptions.from_kwargs("mine", {"poll_intervall": 1})


def test_registry_refuses_an_options_class_that_is_not_backend_options():
    registry = BackendRegistry()
    with pytest.raises(TypeError, match="BackendOptions"):
        registry.add("mine", lambda env_fns, **kwargs: None, options=dict)  # type: ignore[arg-type]
    registry.add("mine", lambda env_fns, **kwargs: None, options=SerialOptions)
    assert registry["mine"].options is SerialOptions
