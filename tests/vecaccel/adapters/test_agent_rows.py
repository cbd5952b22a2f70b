"""PettingZoo envs through ``make_vec``: one row per (env, agent) on every backend.

Each backend is stepped side by side with the same PettingZoo envs stepped here by hand, with
the same seeds and actions, through agent deaths and resets; every row is compared.
"""

from __future__ import annotations

import functools
import os
import signal

import numpy as np
import pytest
from backend_matrix import options_for, select

pettingzoo = pytest.importorskip("pettingzoo")
from gymnasium.vector import AutoresetMode  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from pettingzoo.butterfly import (  # noqa: E402
    cooperative_pong_v6,
    knights_archers_zombies_v11,
    pistonball_v6,
)
from pettingzoo.test import parallel_api_test  # noqa: E402

import vecaccel  # noqa: E402
from tests.support.pettingzoo_envs import EchoAgentsEnv  # noqa: E402
from vecaccel.errors import WorkerError  # noqa: E402

# agents die at different times (line_death, zombies every 5 cycles), episodes end at 30 cycles
KAZ = functools.partial(
    knights_archers_zombies_v11.parallel_env, max_cycles=30, line_death=True, spawn_delay=5
)
NEXT, SAME = AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP
# action 1 walks an agent down, into the bottom line, so agents die at different steps
MOVES = [0.25, 0.35, 0.1, 0.1, 0.1, 0.1]


def _numpy(value):
    return value.cpu().numpy() if type(value).__module__.startswith("torch") else value


class Reference:
    """The rows of PettingZoo envs stepped by hand, as the contract describes them."""

    def __init__(self, env_fns, mode: AutoresetMode) -> None:
        self.envs = [fn() for fn in env_fns]
        self.mode = mode
        first = self.envs[0]
        self.agents = list(first.possible_agents)
        self.shape = first.observation_space(self.agents[0]).shape
        self.needs_reset = [False] * len(self.envs)
        self.ended = self.deaths = 0  # episodes ended; steps where an agent died before the rest

    def _rows(self, obs, rewards=None, terms=None, truncs=None, infos=None):
        n = len(self.agents)
        rows = {
            "obs": np.zeros((n, *self.shape)),
            "reward": np.zeros(n),
            "terminated": np.zeros(n, bool),
            "truncated": np.zeros(n, bool),
            "active": np.zeros(n, bool),
            "info": [{} for _ in range(n)],
            "final": {},
        }
        for i, agent in enumerate(self.agents):
            if agent in obs:
                rows["obs"][i] = obs[agent]
                rows["active"][i] = True
                rows["info"][i] = dict((infos or {}).get(agent, {}))
                if rewards is not None:
                    rows["reward"][i] = rewards.get(agent, 0)
                    rows["terminated"][i] = terms.get(agent, False)
                    rows["truncated"][i] = truncs.get(agent, False)
        return rows

    def reset(self, k: int, seed=None):
        obs, infos = self.envs[k].reset(seed=seed)
        self.needs_reset[k] = False
        return self._rows(obs, infos=infos)

    def step(self, k: int, actions: np.ndarray):
        env = self.envs[k]
        if self.mode is NEXT and self.needs_reset[k]:
            return self.reset(k)
        live = list(env.agents)
        obs, rewards, terms, truncs, infos = env.step(
            {a: actions[self.agents.index(a)] for a in live}
        )
        rows = self._rows(obs, rewards, terms, truncs, infos)
        done = not env.agents
        self.needs_reset[k] = done
        self.ended += done
        self.deaths += bool(rows["terminated"].any() and not done)
        if self.mode is SAME:
            ending = np.flatnonzero(rows["active"] & (rows["terminated"] | rows["truncated"]))
            rows["final"] = {int(i): (rows["obs"][i].copy(), rows["info"][i]) for i in ending}
            if done:
                reset = self.reset(k)
                rows["obs"], rows["info"] = reset["obs"], reset["info"]
            else:
                for i in ending:
                    rows["obs"][i] = 0
                    rows["info"][i] = {}
        return rows


def _compare(envs, result, expected, env_ids, step):
    obs, reward, terminated, truncated = (_numpy(v) for v in result[:4])
    infos = result[4]
    n = envs.agents_per_env
    for p, k in enumerate(env_ids):
        rows = slice(p * n, (p + 1) * n)
        want = expected[k]
        where = f"step {step}, env {k}"
        np.testing.assert_array_equal(obs[rows], want["obs"], err_msg=where)
        np.testing.assert_array_equal(reward[rows], want["reward"], err_msg=where)
        np.testing.assert_array_equal(terminated[rows], want["terminated"], err_msg=where)
        np.testing.assert_array_equal(truncated[rows], want["truncated"], err_msg=where)
        np.testing.assert_array_equal(infos["active"][rows], want["active"], err_msg=where)
        for i in range(n):
            row = p * n + i
            final = want["final"].get(i)
            has_final = bool(infos.get("_final_obs", np.zeros(len(obs), bool))[row])
            assert has_final == (final is not None), where
            if final is not None:
                np.testing.assert_array_equal(infos["final_obs"][row], final[0], err_msg=where)
                got = {k: v[row] for k, v in infos["final_info"].items() if not k.startswith("_")}
                assert got == final[1], where
            for key, value in want["info"][i].items():
                assert infos[f"_{key}"][row] and infos[key][row] == value, (where, key)


def _run_side_by_side(backend, mode, steps=70, num_envs=3, env_fn=KAZ, **options):
    envs = vecaccel.make_vec(env_fn, num_envs, backend=backend, autoreset_mode=mode, **options)
    ref = Reference([env_fn] * num_envs, mode)
    rng = np.random.default_rng(1)
    tensors = backend == "action_server"
    try:
        assert envs.num_envs == num_envs * len(ref.agents)
        assert envs.row_agent.tolist() == ref.agents * num_envs
        result = envs.reset(seed=5)
        expected = {k: ref.reset(k, seed=5 + k) for k in range(num_envs)}
        for step in range(steps):
            infos = result[-1]
            ids = envs.rows_of(range(num_envs)) if "env_id" not in infos else infos["env_id"]
            env_ids = ids[:: envs.agents_per_env] // envs.agents_per_env
            if step:
                _compare(envs, result, expected, env_ids.tolist(), step)
            actions = rng.choice(6, len(ids), p=MOVES)
            for p, k in enumerate(env_ids.tolist()):
                expected[k] = ref.step(k, actions[p * envs.agents_per_env :][: len(ref.agents)])
            if tensors:
                import torch

                actions = torch.as_tensor(actions)
            result = envs.step(actions)
        assert ref.deaths and ref.ended, (ref.deaths, ref.ended)
    finally:
        envs.close()


@pytest.mark.parametrize(
    "env_fn", [KAZ, functools.partial(pistonball_v6.parallel_env, n_pistons=3, max_cycles=15)]
)
def test_the_envs_used_pass_pettingzoos_parallel_api_test(env_fn):
    parallel_api_test(env_fn(), num_cycles=40)


@pytest.mark.parametrize("mode", [NEXT, SAME], ids=["next_step", "same_step"])
# auto by name: the selections leave it out (backend_matrix.SETUPS), and this is where its
# probe meets multi-agent envs
@pytest.mark.parametrize("backend", [*select(lockstep=True, tensors=False), "auto"])
def test_rows_match_the_envs_stepped_by_hand(backend, mode):
    _run_side_by_side(backend, mode, **options_for(backend, num_workers=2))


@pytest.mark.parametrize("mode", [NEXT, SAME], ids=["next_step", "same_step"])
def test_per_agent_infos_come_back_per_row(mode):
    echo = functools.partial(EchoAgentsEnv, num_agents=3, lifetimes=(2, 5, 4), max_steps=6)
    _run_side_by_side("shm", mode, steps=20, env_fn=echo, num_workers=2)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_rows_match_under_each_start_method(context):
    _run_side_by_side("shm", SAME, steps=40, num_workers=2, context=context)


@pytest.mark.parametrize("mode", [NEXT, SAME], ids=["next_step", "same_step"])
def test_async_returns_whole_envs_with_their_row_ids(mode):
    _run_side_by_side("async", mode, num_envs=4, batch_size=2, num_workers=2)


def test_the_action_server_returns_rows_as_tensors():
    pytest.importorskip("torch")
    _run_side_by_side("action_server", SAME, steps=40, device="cpu", num_workers=2)


def test_a_module_path_and_an_aec_env_make_the_same_rows():
    kwargs = {"max_cycles": 30, "line_death": True, "spawn_delay": 5}
    path = "pettingzoo.butterfly.knights_archers_zombies_v11"
    by_path = vecaccel.make_vec(path, 2, backend="serial", env_kwargs=kwargs)
    aec = vecaccel.make_vec(knights_archers_zombies_v11.env, 2, backend="serial", env_kwargs=kwargs)
    try:
        for seed in (0, 1):
            a, b = by_path.reset(seed=seed)[0], aec.reset(seed=seed)[0]
            np.testing.assert_array_equal(a, b)
            actions = np.ones(by_path.num_envs, dtype=np.int64)
            np.testing.assert_array_equal(by_path.step(actions)[0], aec.step(actions)[0])
    finally:
        by_path.close()
        aec.close()


def test_agents_with_different_spaces_are_refused_naming_them():
    fn = functools.partial(EchoAgentsEnv, num_agents=3, odd_spaces=True)
    with pytest.raises(ValueError, match=r"agent_0: Box.*agent_2: Box.*\(6,\)"):
        vecaccel.make_vec(fn, 2, backend="shm")


@settings(max_examples=25, deadline=None)
@given(
    agents=st.integers(1, 4),
    num_envs=st.integers(1, 4),
    seed=st.integers(0, 2**16),
)
def test_rows_map_to_envs_and_agents_and_actions_reach_live_agents(agents, num_envs, seed):
    rng = np.random.default_rng(seed)
    lifetimes = [tuple(rng.integers(1, 6, agents).tolist()) for _ in range(num_envs)]
    fns = [
        functools.partial(EchoAgentsEnv, tag=k, num_agents=agents, lifetimes=lifetimes[k])
        for k in range(num_envs)
    ]
    envs = vecaccel.make_vec(fns, backend="serial")
    try:
        assert envs.agents_per_env == agents and envs.num_multiagent_envs == num_envs
        assert envs.row_env.tolist() == [k for k in range(num_envs) for _ in range(agents)]
        assert envs.row_agent.tolist() == [f"agent_{i}" for i in range(agents)] * num_envs
        obs, infos = envs.reset(seed=seed)
        assert infos["_seed"].all() and infos["seed"].tolist() == [seed + k for k in envs.row_env]
        received = np.zeros(envs.num_envs)
        for t in range(1, min(max(life) for life in lifetimes) + 1):  # until an env ends
            actions = rng.integers(0, 10, envs.num_envs)
            obs, reward, terminated, truncated, infos = envs.step(actions)
            alive_before = t <= np.reshape(lifetimes, -1)
            received += alive_before
            active = infos["active"]
            np.testing.assert_array_equal(active, alive_before)
            np.testing.assert_array_equal(obs[active, 0], envs.row_env[active])
            np.testing.assert_array_equal(obs[active, 1], np.arange(envs.num_envs)[active] % agents)
            np.testing.assert_array_equal(obs[active, 2], actions[active])
            np.testing.assert_array_equal(obs[active, 3], received[active])
            np.testing.assert_array_equal(terminated, t == np.reshape(lifetimes, -1))
            assert not obs[~active].any() and not reward[~active].any()
            assert not (terminated | truncated)[~active].any()
    finally:
        envs.close()


def _echo_fns(num_envs, faulty=None):
    return [
        functools.partial(
            EchoAgentsEnv, tag=k, num_agents=2, max_steps=50, **(faulty or {}).get(k, {})
        )
        for k in range(num_envs)
    ]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_an_env_that_raises_names_its_env_and_rows(context):
    fns = _echo_fns(3, {1: {"raise_at": 2}})
    envs = vecaccel.make_vec(fns, backend="shm", num_workers=3, context=context)
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(6, dtype=np.int64))
        with pytest.raises(
            WorkerError, match=r"ZeroDivisionError.*multi-agent env 1 is rows 2\.\.3"
        ):
            envs.step(np.zeros(6, dtype=np.int64))
    finally:
        envs.close()


def test_a_killed_worker_names_its_env_and_rows():
    envs = vecaccel.make_vec(_echo_fns(2), backend="shm", num_workers=2)
    try:
        envs.reset(seed=0)
        os.kill(envs.env.pool.workers[1].process.pid, signal.SIGKILL)
        with pytest.raises(WorkerError, match=r"multi-agent env 1 is rows 2\.\.3") as caught:
            for _ in range(20):
                envs.step(np.zeros(4, dtype=np.int64))
        assert caught.value.env_indices == (2, 3)
        assert caught.value.multiagent_env_indices == (1,)
    finally:
        envs.close()


@pytest.mark.parametrize("mode", [NEXT, SAME], ids=["next_step", "same_step"])
def test_a_restart_truncates_every_row_of_its_env(mode):
    fns = _echo_fns(3, {2: {"exit_at": 3}})
    envs = vecaccel.make_vec(
        fns, backend="shm", num_workers=3, autoreset_mode=mode, on_worker_failure="restart"
    )
    try:
        envs.reset(seed=0)
        for _ in range(2):
            _, _, _, truncated, _ = envs.step(np.zeros(6, dtype=np.int64))
            assert not truncated.any()
        obs, reward, terminated, truncated, infos = envs.step(np.zeros(6, dtype=np.int64))
        np.testing.assert_array_equal(truncated, [0, 0, 0, 0, 1, 1])
        assert not terminated.any() and not reward[4:].any()
        assert infos["worker_restarted"][4:].all() and not infos["_worker_restarted"][:4].any()
        assert infos["active"].all()
        if mode is SAME:
            assert infos["_final_obs"].tolist() == [0, 0, 0, 0, 1, 1]
    finally:
        envs.close()


def test_a_reset_mask_names_whole_envs():
    envs = vecaccel.make_vec(_echo_fns(2), backend="serial", autoreset_mode="Disabled")
    try:
        envs.reset(seed=0)
        envs.step(np.full(4, 7))
        obs, infos = envs.reset(options={"reset_mask": np.array([False, False, True, True])})
        assert obs[:2, 2].tolist() == [7, 7] and obs[2:, 2].tolist() == [-1, -1]
        with pytest.raises(ValueError, match=r"some rows of env 1 \(rows 2\.\.3\)"):
            envs.reset(options={"reset_mask": np.array([True, True, False, True])})
    finally:
        envs.close()


def test_sb3_ppo_trains_one_shared_policy_over_the_rows():
    pytest.importorskip("stable_baselines3")
    from stable_baselines3 import PPO

    from vecaccel.adapters.sb3 import to_sb3

    envs = vecaccel.make_vec(KAZ, 2, backend="shm", num_workers=2, autoreset_mode=SAME)
    venv = to_sb3(envs)
    try:
        model = PPO("MlpPolicy", venv, n_steps=32, batch_size=64, n_epochs=1, seed=0)
        model.learn(total_timesteps=512)
        assert model.num_timesteps >= 512
    finally:
        venv.close()


def test_sb3_refuses_rows_without_same_step_autoreset():
    from vecaccel.adapters.sb3 import to_sb3

    envs = vecaccel.make_vec(_echo_fns(2), backend="serial", autoreset_mode="Disabled")
    try:
        with pytest.raises(ValueError, match="SAME_STEP"):
            to_sb3(envs)
    finally:
        envs.close()


def test_cooperative_pong_rows_are_its_two_paddles():
    envs = vecaccel.make_vec(
        cooperative_pong_v6.parallel_env, 2, backend="serial", env_kwargs={"max_cycles": 5}
    )
    try:
        obs, infos = envs.reset(seed=0)
        assert (
            obs.shape == (4, 280, 480, 3)
            and envs.row_agent.tolist()
            == [
                "paddle_0",
                "paddle_1",
            ]
            * 2
        )
    finally:
        envs.close()
