"""The small envs of tests and benchmarks: a step counter that fails where it is told to (and
never ends the test process), a fault-injection env whose observations depend only on its seed
and actions and whose faults fire once, armed in the env or through a control file, and envs of
costly steps and wide spaces."""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import time
from collections.abc import Callable

import gymnasium as gym
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.testing.envs import (
    CounterEnv,
    FaultEnv,
    HeavyTailEnv,
    InjectedFault,
    WideSpacesEnv,
    arm,
    counter_fns,
    env_pid,
    env_state,
    fault_env_fns,
)


def _step_in_child(env_fn: Callable[[], gym.Env]) -> None:
    env = env_fn()
    env.reset(seed=0)
    env.step(0)
    os._exit(0)  # the fault did not end the process


def _exit_code_of_a_step_in_a_child(env_fn: Callable[[], gym.Env]) -> int | None:
    child = multiprocessing.get_context("fork").Process(target=_step_in_child, args=(env_fn,))
    child.start()
    child.join(30)
    if child.is_alive():
        child.kill()
        child.join()
    return child.exitcode


# ---------------------------------------------------------------------------------------------
# CounterEnv


def test_the_counter_observes_its_step_calls_through_resets() -> None:
    env = CounterEnv()
    assert env.reset(seed=0)[0].tolist() == [0]
    assert [env.step(0)[0].item() for _ in range(3)] == [1, 2, 3]
    env.reset()
    obs, reward, terminated, truncated, info = env.step(1)
    assert obs.item() == 4 and (reward, terminated, truncated, info) == (1.0, False, False, {})
    assert env.resets == 2


def test_the_counter_fails_at_the_step_reset_or_construction_asked_for(tmp_path) -> None:
    stamp = tmp_path / "stamp"
    env = CounterEnv(fault_step=2, stamp_path=str(stamp))
    env.step(0)
    assert not stamp.exists()
    before = time.monotonic()
    with pytest.raises(ValueError, match="boom in step 2"):
        env.step(0)
    assert before <= float(stamp.read_text()) <= time.monotonic()
    env = CounterEnv(fault_reset=2)
    env.reset()
    with pytest.raises(ValueError, match="boom in reset 2"):
        env.reset()
    with pytest.raises(ValueError, match="boom in init"):
        CounterEnv(fault_init=True)
    with pytest.raises(SystemExit) as caught:
        CounterEnv(fault="sys_exit", fault_step=1, exit_code=7).step(0)
    assert caught.value.code == 7
    with pytest.raises(AssertionError, match="unknown fault 'melt'"):
        CounterEnv(fault="melt", fault_init=True)


def test_the_counter_s_info_holds_a_lock_at_the_step_asked_for() -> None:
    env = CounterEnv(lock_info_step=2)
    assert env.step(0)[4] == {}
    with pytest.raises(TypeError):
        pickle.dumps(env.step(0)[4])


@pytest.mark.parametrize("fault", ["exit", "sigkill", "segfault"])
def test_process_ending_faults_spare_the_test_process_and_end_another(fault) -> None:
    (safe,) = counter_fns(1, {0: {"fault": fault, "fault_step": 1, "exit_code": 5}})
    env = safe()
    with pytest.raises(RuntimeError, match=f"refusing to {fault} the test process"):
        env.step(0)
    expected = {"exit": 5, "sigkill": -signal.SIGKILL, "segfault": -signal.SIGSEGV}[fault]
    assert _exit_code_of_a_step_in_a_child(safe) == expected


def test_counter_fns_plant_faults_only_in_the_envs_named() -> None:
    fns = counter_fns(3, {1: {"fault_step": 1}})
    envs = [fn() for fn in fns]
    assert all(env.safe_pid == os.getpid() for env in envs)
    assert envs[0].step(0)[0].item() == envs[2].step(0)[0].item() == 1
    with pytest.raises(ValueError, match="boom in step 1"):
        envs[1].step(0)


# ---------------------------------------------------------------------------------------------
# FaultEnv


def _run(env: FaultEnv, seed: int, actions: list[int]) -> list:
    out = [env.reset(seed=seed, options={})[0]]
    for action in actions:
        obs, reward, terminated, truncated, _ = env.step(action)
        out.append((obs, reward, terminated, truncated))
        if terminated or truncated:
            out.append(env.reset()[0])  # as a vector env's autoreset does
    return out


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), actions=st.lists(st.integers(0, 2), max_size=40))
def test_a_twin_with_the_same_seed_and_actions_observes_the_same(seed, actions) -> None:
    env, twin = FaultEnv(horizon=5), FaultEnv(horizon=5)
    mine, theirs = _run(env, seed, actions), _run(twin, seed, actions)
    for a, b in zip(mine, theirs):
        np.testing.assert_equal(a, b)
    assert len(mine) == len(theirs) and env_state(env) == env_state(twin)


def test_an_injected_fault_fires_once_at_the_next_advance() -> None:
    env = FaultEnv(env_id=4, horizon=2)
    env.reset(seed=0, options={})
    env.inject = "raise"
    with pytest.raises(InjectedFault, match="injected raise in env 4 \\(step\\)"):
        env.step(0)
    env.step(0)  # fired once
    env.inject = "raise"
    env.reset(seed=1, options={})  # an explicit reset is not an advance: still armed
    with pytest.raises(InjectedFault, match="\\(autoreset\\)"):
        env.reset()
    env.inject = "melt"
    with pytest.raises(ValueError, match="unknown fault 'melt'"):
        env.step(0)


def test_a_hard_fault_in_the_safe_process_is_raised_instead(tmp_path) -> None:
    (fn,) = fault_env_fns(1)
    env = fn()
    assert env.safe_pid == os.getpid() and env.env_id == 0
    env.reset(seed=0, options={})
    for kind in ("exit", "kill", "segfault"):
        env.inject = kind
        with pytest.raises(InjectedFault, match=f"injected {kind}"):
            env.step(1)
    (unsafe,) = fault_env_fns(1, safe=False, horizon=3)
    assert unsafe().safe_pid is None and unsafe().horizon == 3


def test_a_fault_armed_through_its_control_file_fires_once(tmp_path) -> None:
    env, other = (FaultEnv(env_id=i, control_dir=str(tmp_path)) for i in (0, 1))
    for each in (env, other):
        each.reset(seed=0, options={})
    arm(str(tmp_path), 0, "raise")
    other.step(0)  # not its file
    with pytest.raises(InjectedFault):
        env.step(0)
    assert list(tmp_path.iterdir()) == []  # claimed and removed
    env.step(0)
    with pytest.raises(ValueError, match="unknown fault 'melt'"):
        arm(str(tmp_path), 0, "melt")


def test_a_slow_fault_delays_one_step_and_then_steps_as_usual() -> None:
    env, twin = FaultEnv(slow_seconds=0.02), FaultEnv()
    env.reset(seed=3, options={})
    twin.reset(seed=3, options={})
    env.inject = "slow"
    started = time.perf_counter()
    obs = env.step(2)[0]
    assert time.perf_counter() - started >= 0.02
    np.testing.assert_array_equal(obs, twin.step(2)[0])


@pytest.mark.parametrize("kind", ["exit", "kill", "segfault"])
def test_an_armed_hard_fault_ends_the_process_the_env_steps_in(kind, tmp_path) -> None:
    arm(str(tmp_path), 0, kind)
    (fn,) = fault_env_fns(1, control_dir=str(tmp_path))
    expected = {"exit": 3, "kill": -signal.SIGKILL, "segfault": -signal.SIGSEGV}[kind]
    assert _exit_code_of_a_step_in_a_child(fn) == expected


def test_call_helpers_read_the_state_and_the_process() -> None:
    env = gym.wrappers.TimeLimit(FaultEnv(), 5)
    env.reset(seed=2, options={})
    assert env_state(env) == env.unwrapped.get_state()
    assert env_pid(env) == os.getpid()


# ---------------------------------------------------------------------------------------------
# costly steps and wide spaces


def test_a_heavy_tail_step_costs_its_cpu_and_truncates_at_200() -> None:
    env = HeavyTailEnv(cpu_s=0.002, p_slow=0.0)
    env.reset(seed=0)
    started = time.perf_counter()
    env.step(0)
    assert time.perf_counter() - started >= 0.002
    fast = HeavyTailEnv(cpu_s=0.0, p_slow=0.0)
    fast.reset(seed=0)
    truncations = [fast.step(0)[3] for _ in range(200)]
    assert truncations == [False] * 199 + [True]


def test_wide_spaces_pickle_larger_than_a_socket_buffer() -> None:
    env = WideSpacesEnv()
    assert len(pickle.dumps((env.observation_space, env.action_space))) > 1 << 20
    assert (env.reset(seed=0)[0] == 7).all() and (env.step(1)[0] == 1).all()
