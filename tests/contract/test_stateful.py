"""Stateful fuzzing of every backend.

A ``hypothesis`` state machine drives one vector env of :class:`vecaccel.testing.envs.FaultEnv`
through random interleavings of ``reset`` (seeded or not, masked), ``step``, ``step_async`` +
``step_wait(timeout)``, waiting on a step that timed out, ``call``, ``set_attr``, bad actions,
armed faults (an exception, ``os._exit``, SIGKILL, a segfault, a slow step) and ``close``
followed by a new env, under both failure policies and both autoreset modes that return every
env. Next to it runs a model: one in-process twin per env (the same :class:`EnvRunner` the
serial backend uses, over a fault-free ``FaultEnv``) stepped with the same actions, and the
expected effect of every armed fault.

Invariants:
* nothing hangs: every wait is bounded (``step_wait(timeout)``), and each example runs under a
  deadline after which it fails;
* every error is a ``vecaccel.WorkerError``, a ``ValueError`` or a ``TimeoutError``, and the
  one the model expects;
* every surviving env matches its twin exactly (observation, reward, flags, ``final_obs``, and
  its state read with ``call``); every rebuilt env says so (``info["worker_restarted"]``,
  truncated), and ``env.failures`` counts each fault once;
* ``close()`` always works and leaves no child process, file descriptor or ``/dev/shm`` entry.
"""

from __future__ import annotations

import functools
import gc
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from backend_matrix import backend_of, options_for, partial_batch_options, select
from gymnasium.vector import AutoresetMode
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
)

import vecaccel
from vecaccel.testing.envs import HARD_FAULTS, FaultEnv, env_state, fault_env_fns
from vecaccel.testing.leaks import child_pids, leaked_shm, open_fds, shm_entries, wait_until
from vecaccel.vec_env import EnvRunner

NUM_ENVS = 4
WORKER_ENVS = ((0, 1), (2, 3))  # num_workers=2 gives each worker half of the envs
SLOW_SECONDS = 0.2  # a "slow" step; step_wait(SHORT) on it must time out
SHORT = 0.01
LONG = 60.0  # a wait that must finish (a hang is caught by the example deadline anyway)
EXAMPLE_DEADLINE = 120.0
#: Backends whose steps return envs as they come (``info["env_id"]``), each env in a worker.
POOLED = select(partial_batches=True, envs_in_workers=True)

#: The machine's backends: those stepping envs in the caller only (the model leaves out the
#: faults that would end the test process) and those stepping every env in a worker.
MACHINE_BACKENDS = [*select(worker_processes=False), *select(envs_in_workers=True)]


class Hang(Exception):
    """A call did not return before the example's deadline."""


def _on_deadline(signum, frame):
    raise Hang(f"the example ran past its {EXAMPLE_DEADLINE} s deadline: something hangs")


def _to_numpy(x: Any) -> np.ndarray:
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def _worker_envs(env: int) -> tuple[int, ...]:
    return next(group for group in WORKER_ENVS if env in group)


@functools.cache
def _warm_up(backend: str) -> None:
    """Import what a backend imports (torch...) before the leak baselines are taken."""
    envs = vecaccel.make_vec(
        fault_env_fns(2),
        backend=backend,
        **options_for(backend),
    )
    envs.close()


@dataclass
class Twin:
    """The model of one env: its in-process twin (``None``: state unknown), its attributes,
    and the fault armed on it."""

    runner: EnvRunner | None = None
    reward_scale: float = 1.0
    armed: str | None = None


@dataclass
class Plan:
    """What one vector step must do, worked out from the faults armed before it."""

    actions: np.ndarray  # by env index
    error: str | None = None  # None, "env" (an env raised, raise policy) or "dead" (broken)
    error_envs: set[int] = field(default_factory=set)
    advanced: set[int] = field(default_factory=set)  # envs whose state moves on
    restarted: set[int] = field(default_factory=set)
    new_failures: int = 0
    per_env_failures: dict[int, int] = field(default_factory=dict)
    consumed: set[int] = field(default_factory=set)  # envs whose armed fault fires
    slow: bool = False  # a slow step that will run


def expect(
    errors: type[BaseException] | tuple[type[BaseException], ...], fn: Callable, *args
) -> BaseException:
    try:
        fn(*args)
    except errors as error:
        return error
    except Exception as error:
        raise AssertionError(f"expected {errors}, got {error!r}") from error
    raise AssertionError(f"expected {errors}, nothing was raised")


class VecEnvMachine(RuleBasedStateMachine):
    backend = "shm"

    def __init__(self) -> None:
        super().__init__()
        _warm_up(self.backend)
        self.envs = None
        gc.collect()  # what earlier examples left (the heap from before the test is frozen)
        self.base_children = child_pids()
        self.base_fds = open_fds()
        self.base_shm = shm_entries()
        self.previous_handler = signal.signal(signal.SIGUSR1, _on_deadline)
        self.watchdog = threading.Timer(EXAMPLE_DEADLINE, os.kill, (os.getpid(), signal.SIGUSR1))
        self.watchdog.daemon = True
        self.watchdog.start()

    # -- building and checking ---------------------------------------------------------------

    @property
    def serial(self) -> bool:
        """The envs run in this process."""
        return not backend_of(self.backend).worker_processes

    @property
    def pooled(self) -> bool:
        return backend_of(self.backend).partial_batches

    @property
    def first_ready(self) -> bool:
        """Steps return the first ``batch_size`` envs ready: a new step waits until the envs
        still stepping are received."""
        return backend_of(self.backend).accepts("batch_size")

    def open(self, seed: int) -> None:
        options = options_for(
            self.backend,
            num_workers=2,
            context="fork",
            on_worker_failure=self.policy,
            max_restarts=self.max_restarts,
        )
        self.envs = vecaccel.make_vec(
            fault_env_fns(NUM_ENVS, slow_seconds=SLOW_SECONDS),
            backend=self.backend,
            autoreset_mode=self.mode,
            **options,
        )
        self.twins = [Twin() for _ in range(NUM_ENVS)]
        self.broken = False
        self.failed: set[int] = set()
        self.pending: Plan | None = None
        self.failures = 0
        self.failures_per_env = np.zeros(NUM_ENVS, dtype=np.int64)
        self.last_ids = np.arange(NUM_ENVS)
        self.calls = 0  # rules run on this vector env
        self.reset(seed=seed, mask=None)

    def check_no_leaks(self) -> None:
        new_children = lambda: child_pids() - self.base_children  # noqa: E731
        assert wait_until(lambda: not new_children(), 10.0), f"children left: {new_children()}"
        new_fds = lambda: open_fds() - self.base_fds  # noqa: E731
        if new_fds():
            gc.collect()  # (slow with torch loaded: only when needed)
            assert wait_until(lambda: not new_fds(), 5.0), f"fds left open: {new_fds()}"
        assert leaked_shm(self.base_shm) == set()

    def teardown(self) -> None:
        try:
            if self.envs is not None:
                self.envs.close()
                self.envs = None
                self.check_no_leaks()
        finally:
            self.watchdog.cancel()
            signal.signal(signal.SIGUSR1, self.previous_handler)

    def as_actions(self, actions: np.ndarray) -> Any:
        if backend_of(self.backend).tensors:
            import torch

            return torch.as_tensor(actions)
        return actions

    def by_env(self, actions: list[int]) -> np.ndarray:
        """The action each env gets: pooled backends take them in the order of the envs the
        last call returned (``info["env_id"]``)."""
        out = np.empty(NUM_ENVS, dtype=np.int64)
        out[self.last_ids] = actions
        return out

    def unpack(self, result: tuple) -> tuple:
        """A result as numpy arrays in env order, with the env-order masks of its infos."""
        obs, rew, term, trunc, infos = result
        ids = np.asarray(infos.get("env_id", np.arange(NUM_ENVS)))
        assert sorted(ids.tolist()) == list(range(NUM_ENVS)), ids
        self.last_ids = ids
        order = np.argsort(ids)

        def mask(key: str) -> np.ndarray:
            out = np.zeros(NUM_ENVS, dtype=bool)
            if key in infos:
                out[ids] = infos[f"_{key}"]
            return out

        def values(key: str) -> dict[int, Any]:
            return {int(ids[p]): infos[key][p] for p in range(NUM_ENVS)} if key in infos else {}

        arrays = [_to_numpy(x)[order] for x in (obs, rew, term, trunc)]
        return (*arrays, mask("worker_restarted"), mask("final_obs"), values("final_obs"))

    # -- the model of one step ----------------------------------------------------------------

    def plan_step(self, actions: np.ndarray) -> Plan:
        armed = {i: twin.armed for i, twin in enumerate(self.twins) if twin.armed is not None}
        everyone = set(range(NUM_ENVS))
        if self.serial:  # envs step one after another; the first exception ends the step
            raised = sorted(i for i, kind in armed.items() if kind == "raise")
            if raised:
                first = raised[0]
                return Plan(
                    actions,
                    error="env",
                    error_envs={first},
                    advanced=set(range(first)),
                    consumed={i for i in armed if i <= first},
                )
            slow = any(kind == "slow" for kind in armed.values())
            return Plan(actions, advanced=everyone, consumed=set(armed), slow=slow)
        faults = {i: kind for i, kind in armed.items() if kind != "slow"}
        # a slow step runs unless a process-ending fault earlier in its worker's slice ends it
        slow = any(
            kind == "slow"
            and not any(faults.get(j) in HARD_FAULTS for j in _worker_envs(i) if j < i)
            for i, kind in armed.items()
        )
        plan = Plan(actions, consumed=set(armed), slow=slow)
        if self.policy == "raise":
            if any(kind in HARD_FAULTS for kind in faults.values()):
                plan.error = "dead"
            elif faults:
                plan.error = "env"
                plan.error_envs = set(faults)
            plan.advanced = everyone - set(faults)
            return plan
        for i, kind in faults.items():
            group = _worker_envs(i) if kind in HARD_FAULTS else (i,)
            plan.restarted.update(group)
            for j in group:
                plan.per_env_failures[j] = plan.per_env_failures.get(j, 0) + 1
        plan.new_failures = len(faults)
        plan.advanced = everyone - plan.restarted
        if self.failures + plan.new_failures > self.max_restarts:
            plan.error = "dead"  # the max_restarts cap: the failure is raised
        return plan

    def apply(
        self,
        plan: Plan,
        result: tuple | None = None,
        error: Exception | None = None,
        swallowed: bool = False,
    ) -> None:
        """Move the model on by ``plan``; compare with ``result`` (``None``: the results were
        dropped) or check ``error`` (``swallowed``: a reset drained it silently)."""
        if swallowed:
            assert plan.error != "dead"
        elif plan.error is not None:
            assert isinstance(error, vecaccel.WorkerError), f"expected WorkerError, got {error!r}"
        else:
            assert error is None, f"no error expected, got {error!r}"
        if plan.error == "dead":
            self.broken = True
            return
        if plan.error == "env" and not swallowed:
            assert set(error.env_indices) == plan.error_envs, (error.env_indices, plan)
        for i in plan.consumed:
            self.twins[i].armed = None
        if result is not None:
            obs, rew, term, trunc, restarted, final_mask, final_obs = self.unpack(result)
        for i in range(NUM_ENVS):
            twin = self.twins[i]
            if i in plan.restarted:
                self.twins[i] = Twin()  # rebuilt from its env function: attributes reset too
                if result is not None:
                    assert restarted[i] and trunc[i] and not term[i] and rew[i] == 0.0, i
                    assert obs[i][1] == 0 and obs[i][2] == -1, obs[i]  # a new episode
                continue
            if i in plan.error_envs:
                twin.runner = None
                continue
            if result is not None:
                assert not restarted[i], i
            if i not in plan.advanced or twin.runner is None:
                continue
            expected = twin.runner.step(plan.actions[i])
            if result is None:
                continue
            exp_obs, exp_rew, exp_term, exp_trunc, exp_info = expected
            np.testing.assert_array_equal(obs[i], exp_obs, err_msg=f"env {i}", strict=True)
            assert (rew[i], term[i], trunc[i]) == (exp_rew, exp_term, exp_trunc), i
            assert final_mask[i] == ("final_obs" in exp_info), i
            if final_mask[i]:
                np.testing.assert_array_equal(final_obs[i], exp_info["final_obs"])
        if plan.error == "env" and not self.serial:
            self.failed |= plan.error_envs
        self.failures += plan.new_failures
        for i, count in plan.per_env_failures.items():
            self.failures_per_env[i] += count

    # -- rules ----------------------------------------------------------------------------------

    @initialize(
        policy=st.sampled_from(["raise", "restart"]),
        mode=st.sampled_from([AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP]),
        max_restarts=st.sampled_from([2, 100]),
        seed=st.integers(0, 2**16),
    )
    def start(self, policy, mode, max_restarts, seed):
        self.policy = "raise" if self.serial else policy
        self.mode = mode
        self.max_restarts = max_restarts
        self.open(seed)

    @rule(
        seed=st.one_of(st.none(), st.integers(0, 2**16)),
        mask=st.one_of(st.none(), st.lists(st.booleans(), min_size=NUM_ENVS, max_size=NUM_ENVS)),
    )
    def reset(self, seed, mask):
        if self.pooled or (mask is not None and not any(mask)):
            mask = None  # pooled backends return the reset envs as their batch: reset them all
        options = {} if mask is None else {"reset_mask": np.array(mask, dtype=bool)}
        reset = functools.partial(self.envs.reset, seed=seed, options=options)
        if self.broken:
            expect(vecaccel.WorkerError, reset)
            return
        if self.pending is not None:  # a reset first finishes the step that timed out
            plan, self.pending = self.pending, None
            if plan.error == "dead":  # a broken pool cannot reset
                self.apply(plan, error=expect(vecaccel.WorkerError, reset))
                return
            self.apply(plan, swallowed=True)  # every backend resets the failed envs anyway
        obs, infos = reset()
        obs = _to_numpy(obs)
        ids = np.asarray(infos.get("env_id", np.arange(NUM_ENVS)))
        self.last_ids = ids
        obs = obs[np.argsort(ids)] if len(ids) == NUM_ENVS else obs
        for i in range(NUM_ENVS):
            if mask is not None and not mask[i]:
                continue
            twin = self.twins[i]
            self.failed.discard(i)
            if seed is not None:
                twin.runner = EnvRunner(FaultEnv(env_id=i, slow_seconds=SLOW_SECONDS), self.mode, i)
                twin.runner.env.reward_scale = twin.reward_scale
                expected, _ = twin.runner.reset(seed=seed + i, options={})
            elif twin.runner is not None:
                expected, _ = twin.runner.reset(seed=None, options={})
            else:
                continue
            np.testing.assert_array_equal(obs[i], expected, err_msg=f"env {i}", strict=True)

    def do_step(self, actions: list[int], timeout: float | None) -> None:
        by_env = self.by_env(actions)
        acts = self.as_actions(np.asarray(actions, dtype=np.int64))
        if self.broken:
            expect(vecaccel.WorkerError, self.envs.step_async, acts)
            return
        if self.pending is not None:
            if self.first_ready:  # those envs are still stepping: receive them first
                expect(ValueError, self.envs.step_async, acts)
                return
            plan, self.pending = self.pending, None  # the others' step_async drains it
            if plan.error is not None:
                self.apply(plan, error=expect(vecaccel.WorkerError, self.envs.step_async, acts))
                return
            self.apply(plan)  # its results are discarded
        if self.failed:
            errors = (vecaccel.WorkerError, ValueError) if self.pooled else vecaccel.WorkerError
            expect(errors, self.envs.step_async, acts)
            return
        plan = self.plan_step(by_env)
        if timeout is None:
            try:
                result = self.envs.step(acts)
            except vecaccel.WorkerError as error:
                self.apply(plan, error=error)
            else:
                self.apply(plan, result)
            return
        self.envs.step_async(acts)
        try:
            result = self.envs.step_wait(timeout=timeout)
        except TimeoutError:
            assert timeout == SHORT, "a step timed out after a long wait: it hangs"
            if self.serial:  # the step ran to the end; its results are dropped
                assert plan.error is None
                self.apply(plan)
            else:
                self.pending = plan
            return
        except vecaccel.WorkerError as error:
            self.apply(plan, error=error)
            return
        # a step that sleeps SLOW_SECONDS cannot finish within SHORT
        assert not (plan.slow and plan.error is None and timeout == SHORT), "missed timeout"
        self.apply(plan, result)

    @rule(actions=st.lists(st.integers(0, 2), min_size=NUM_ENVS, max_size=NUM_ENVS))
    def step(self, actions):
        self.do_step(actions, None)

    @rule(
        actions=st.lists(st.integers(0, 2), min_size=NUM_ENVS, max_size=NUM_ENVS),
        timeout=st.sampled_from([SHORT, LONG]),
    )
    def step_async_wait(self, actions, timeout):
        self.do_step(actions, timeout)

    # Whether a step is pending depends on timing (did step_wait(SHORT) time out?), so no
    # precondition may read it: hypothesis must draw the same rules when it replays a case.
    # Rules that need no pending step settle it first instead.
    def _settle(self):
        if self.pending is not None:
            self.wait_pending()

    @rule()
    def wait_pending(self):
        if self.pending is None:
            return
        plan, self.pending = self.pending, None
        try:
            result = self.envs.step_wait(timeout=LONG)
        except vecaccel.WorkerError as error:
            self.apply(plan, error=error)
        else:
            self.apply(plan, result)

    @rule(
        faults=st.lists(
            st.tuples(
                st.integers(0, NUM_ENVS - 1),
                st.sampled_from(["raise", "exit", "kill", "segfault", "slow"]),
            ),
            min_size=1,
            max_size=3,
        )
    )
    def inject(self, faults):
        self._settle()
        if self.broken:
            return
        for env, kind in faults:
            if self.serial and kind in HARD_FAULTS:
                kind = "raise"  # the serial backend's envs live in this process
            if kind != "slow":
                # one failure per step (raise policy) or per worker (restart): exact counts
                others = range(NUM_ENVS) if self.policy == "raise" else _worker_envs(env)
                if any(self.twins[i].armed not in (None, "slow") for i in others if i != env):
                    kind = "slow"
            self.envs.set_attr_indices("inject", kind, [env])
            self.twins[env].armed = kind

    @rule(envs=st.lists(st.integers(0, NUM_ENVS - 1), min_size=1, max_size=2, unique=True))
    def inject_slow(self, envs):
        """Slow steps (and so timeouts) get a rule of their own, to come often."""
        self._settle()
        if self.broken:
            return
        self.envs.set_attr_indices("inject", "slow", envs)
        for env in envs:
            self.twins[env].armed = "slow"

    @rule(
        indices=st.lists(st.integers(0, NUM_ENVS - 1), min_size=1, max_size=NUM_ENVS, unique=True),
        value=st.sampled_from([0.5, 1.0, 3.0]),
    )
    def set_reward_scale(self, indices, value):
        self._settle()
        if self.broken:
            expect(vecaccel.WorkerError, self.envs.set_attr_indices, "reward_scale", value, indices)
            return
        self.envs.set_attr_indices("reward_scale", value, indices)
        for i in indices:
            self.twins[i].reward_scale = value
            if self.twins[i].runner is not None:
                self.twins[i].runner.env.reward_scale = value

    @rule(
        indices=st.lists(st.integers(0, NUM_ENVS - 1), min_size=1, max_size=NUM_ENVS, unique=True)
    )
    def call_state(self, indices):
        self._settle()
        if self.broken:
            expect(vecaccel.WorkerError, self.envs.call_indices, env_state, indices)
            return
        states = self.envs.call_indices(env_state, indices)
        assert len(states) == len(indices)
        for i, state in zip(indices, states):
            twin = self.twins[i]
            if twin.runner is not None:
                assert state == twin.runner.env.get_state(), (i, state)
            else:
                assert state[3] == twin.reward_scale

    @rule(kind=st.sampled_from(["range", "shape", "dtype"]), position=st.integers(0, NUM_ENVS - 1))
    def bad_action(self, kind, position):
        actions = np.zeros(NUM_ENVS, dtype=np.int64)
        if kind == "range":
            actions[position] = 7
        elif kind == "shape":
            actions = np.zeros(NUM_ENVS + 1, dtype=np.int64)
        else:
            actions = np.full(NUM_ENVS, 0.5)
        acts = self.as_actions(actions)
        if self.broken:
            expect(vecaccel.WorkerError, self.envs.step_async, acts)
            return
        if self.pending is not None:
            if self.first_ready:
                expect(ValueError, self.envs.step_async, acts)
                return
            plan, self.pending = self.pending, None  # the others drain it first
            if plan.error is not None:
                self.apply(plan, error=expect(vecaccel.WorkerError, self.envs.step_async, acts))
                return
            self.apply(plan)
        if self.failed:
            errors = (vecaccel.WorkerError, ValueError) if self.pooled else vecaccel.WorkerError
            expect(errors, self.envs.step_async, acts)
            return
        error = expect(ValueError, self.envs.step_async, acts)
        if kind == "range":
            assert f"env {self.last_ids[position]}" in str(error), error

    @rule()
    def close_and_reopen(self):
        if not (self.broken or self.calls >= 6):
            return  # (not a precondition: whether the env broke can depend on timing)
        self.envs.close()
        self.envs.close()  # idempotent
        self.envs = None
        self.check_no_leaks()
        self.open(seed=1234)

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def count_calls(self):
        self.calls += 1

    @invariant()
    def failures_are_counted_once(self):
        if self.envs is None or self.serial or self.broken or self.pending is not None:
            return
        assert self.envs.failures == self.failures
        assert self.envs.failures_per_env.tolist() == self.failures_per_env.tolist()
        assert all(worker.process.is_alive() for worker in self.envs.pool.workers)


#: Examples are drawn anew each run (no fixed seed, no database), so runs explore different
#: programs: each run's share can stay small.
SETTINGS = settings(
    max_examples=10,
    stateful_step_count=20,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)

#: The process backends start workers in every example (and again after each close or death):
#: fewer examples a run.
PROCESS_SETTINGS = settings(SETTINGS, max_examples=5)


def _freeze_the_heap(case) -> None:
    """Collect, then leave the objects alive before the test out of every later collection:
    each example collects before it takes its leak baselines, and a full collection of a test
    process with torch loaded costs a good part of an example."""
    gc.collect()
    gc.freeze()


def _unfreeze_the_heap(case) -> None:
    gc.unfreeze()


def _machine_test(backend: str) -> type:
    """The test case of the machine over ``backend``, named ``Test`` and the backend's name in
    CamelCase (``TestActionServer``)."""
    camel = "".join(part.capitalize() for part in backend.replace("-", "_").split("_"))
    machine = type(f"{camel}Machine", (VecEnvMachine,), {"backend": backend})
    case = machine.TestCase
    case.settings = PROCESS_SETTINGS if backend_of(backend).worker_processes else SETTINGS
    case.setUp = _freeze_the_heap
    case.tearDown = _unfreeze_the_heap
    globals()[f"Test{camel}"] = case
    return case


for _backend in MACHINE_BACKENDS:
    _machine_test(_backend)
del _backend


# ---------------------------------------------------------------------------------------------
# single fault paths, each bounded: a failure fails the test, it does not hang it


class deadline:  # lower case: read as a statement, `with deadline(...)`
    """Fail with :class:`Hang` if the block runs past ``seconds``."""

    def __init__(self, seconds: float = 60.0) -> None:
        self.seconds = seconds

    def __enter__(self):
        self.previous = signal.signal(signal.SIGUSR1, _on_deadline)
        self.timer = threading.Timer(self.seconds, os.kill, (os.getpid(), signal.SIGUSR1))
        self.timer.daemon = True
        self.timer.start()
        return self

    def __exit__(self, *exc_info):
        self.timer.cancel()
        signal.signal(signal.SIGUSR1, self.previous)
        return False


def _make(backend: str, num_envs: int = NUM_ENVS, **options):
    return vecaccel.make_vec(
        fault_env_fns(num_envs, slow_seconds=0.5, hang_seconds=60.0),
        backend=backend,
        **{**options_for(backend, num_workers=2, context="fork"), **options},
    )


def _zeros(envs, n: int = NUM_ENVS):
    actions = np.zeros(n, dtype=np.int64)
    return actions if getattr(envs, "device", None) is None else _torch(actions)


def _torch(actions):
    import torch

    return torch.as_tensor(actions)


@pytest.mark.parametrize("backend", POOLED)
def test_reset_after_a_worker_died_during_a_timed_out_step_raises(backend, no_leaks):
    """A pooled reset swallowed the death (raise policy) and then waited on the dead worker."""
    envs = _make(backend)
    try:
        with deadline():
            envs.reset(seed=0, options={})
            envs.set_attr_indices("inject", "slow", [0, 2])
            envs.step_async(_zeros(envs))
            with pytest.raises(TimeoutError):
                envs.step_wait(timeout=SHORT)
            os.kill(envs.pool.workers[1].process.pid, signal.SIGKILL)
            with pytest.raises(vecaccel.WorkerError, match="SIGKILL"):
                envs.reset(seed=1, options={})
            with pytest.raises(vecaccel.WorkerError):
                envs.step(_zeros(envs))
    finally:
        envs.close()


@pytest.mark.parametrize("backend", select(envs_in_workers=True))
def test_reset_waits_for_every_stepping_env_before_raising(backend, no_leaks):
    """An env error that arrives while a reset drains a timed-out step is raised only once every
    other env has finished its step: raising it earlier would let the reset take a stepping env's
    step byte for its reply and leave that env "still stepping" for good. Every backend starts
    the env over on reset, ``shm`` as the pooled backends do."""
    envs = _make(backend)
    try:
        with deadline():
            envs.reset(seed=0, options={})
            envs.set_attr_indices("slow_seconds", 0.2, [0])
            envs.set_attr_indices("inject", "slow", [0])
            envs.set_attr_indices("inject", "raise", [1])  # after env 0, in the same worker
            envs.set_attr_indices("slow_seconds", 0.6, [3])
            envs.set_attr_indices("inject", "slow", [3])
            envs.step_async(_zeros(envs))
            with pytest.raises(TimeoutError):
                envs.step_wait(timeout=SHORT)
            obs, infos = envs.reset(seed=5, options={})
            twins = [EnvRunner(FaultEnv(env_id=i), AutoresetMode.NEXT_STEP, i) for i in range(4)]
            expected = [twin.reset(seed=5 + i, options={})[0] for i, twin in enumerate(twins)]
            # pooled envs come back in the order they finish
            order = np.argsort(infos.get("env_id", np.arange(4)))
            np.testing.assert_array_equal(_to_numpy(obs)[order], np.stack(expected))
            for _ in range(3):
                obs, *_, infos = envs.step(_zeros(envs))
                expected = [twin.step(0)[0] for twin in twins]
                order = np.argsort(infos.get("env_id", np.arange(4)))
                np.testing.assert_array_equal(_to_numpy(obs)[order], np.stack(expected))
    finally:
        envs.close()


def test_async_stuck_env_is_killed_while_other_envs_fill_the_batches(no_leaks):
    """step_timeout counts from the step's start, not from the start of each wait: with
    batch_size < num_envs the other worker's envs fill every batch and no wait lasts
    step_timeout, yet the stuck worker (with every env it holds) is killed."""
    envs = _make("async", 8, batch_size=4, on_worker_failure="restart", step_timeout=0.5)
    try:
        with deadline():
            envs.reset(seed=0, options={})
            envs.set_attr_indices("inject", "hang", [0])
            restarted = set()
            while not restarted:
                obs, rew, term, trunc, infos = envs.step(_zeros(envs, 4))
                if "worker_restarted" in infos:
                    mask = infos["_worker_restarted"]
                    assert all("step_timeout" in r for r in infos["restart_reason"][mask])
                    restarted.update(infos["env_id"][mask].tolist())
            assert restarted <= {0, 1, 2, 3} and envs.failures == 1
    finally:
        envs.close()


@pytest.mark.parametrize("backend", POOLED)
def test_replacement_worker_steps_only_the_envs_it_is_sent(backend, no_leaks):
    """A worker that dies mid-step leaves the step-mask bits of the envs it had not reached;
    its replacement must not step them at its first command (they would enter the ready queue
    twice)."""
    envs = _make(backend, 8, on_worker_failure="restart", **partial_batch_options(backend, 8))
    try:
        with deadline():
            _, infos = envs.reset(seed=0, options={})
            held = infos["env_id"].tolist()
            other = [i for i in range(8) if i not in held]
            victim = next(i for i in other if envs.pool.worker_of(i).start < i)
            # the worker of ``victim`` steps the envs before it, dies, and never reaches the rest
            envs.set_attr_indices("inject", "exit", [victim])
            steps = 0
            while steps < 12 or envs.failures == 0:  # the other worker may fill many batches
                obs, rew, term, trunc, infos = envs.step(_zeros(envs, 4))
                steps += 1
                held = infos["env_id"].tolist()
                # each env is in exactly one place: held by the caller, ready, or stepping
                places = held + list(envs._ready) + np.flatnonzero(envs._in_flight).tolist()
                assert sorted(places) == list(range(8)), (held, envs._ready, envs._in_flight)
            assert envs.failures == 1
    finally:
        envs.close()


@pytest.mark.parametrize("kind, signal_name", [("kill", "SIGKILL"), ("segfault", "SIGSEGV")])
@pytest.mark.parametrize("backend", select(restarts_workers=True, envs_in_workers=True))
def test_restart_reason_names_the_signal(backend, kind, signal_name, no_leaks):
    """The restart reason is read after the dead worker is reaped, so it names the signal
    rather than "unresponsive"."""
    envs = _make(backend, on_worker_failure="restart")
    try:
        with deadline():
            envs.reset(seed=0, options={})
            for _ in range(3):
                envs.set_attr_indices("inject", kind, [2])
                obs, rew, term, trunc, infos = envs.step(_zeros(envs))
                reasons = infos["restart_reason"][infos["_worker_restarted"]]
                assert len(reasons) == 2 and all(signal_name in r for r in reasons), reasons
            assert envs.failures == 3
    finally:
        envs.close()
