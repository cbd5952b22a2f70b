"""The ``action_server`` backend on CPU: torch tensors in and out, alternating halves exact, and
how the ``Sampler`` drives it.
"""

from __future__ import annotations

import functools
import signal
import time

import gymnasium as gym
import numpy as np
import pytest
import torch
from helpers import assert_same
from toy_envs import RaiseAt

import vecaccel
from vecaccel.sampler import Sampler
from vecaccel.testing.contract_envs import make_cartpole, make_dict_tuple
from vecaccel.testing.envs import SleepEnv, counter_fns


class SlowStep(gym.Wrapper):
    """CartPole whose ``sleep_at``-th step sleeps ``seconds`` (to time out / interrupt a step)."""

    def __init__(self, env: gym.Env, sleep_at: int | None, seconds: float) -> None:
        super().__init__(env)
        self.sleep_at, self.seconds, self.count = sleep_at, seconds, 0

    def step(self, action):
        self.count += 1
        if self.count == self.sleep_at:
            time.sleep(self.seconds)
        return self.env.step(action)


torch.set_num_threads(1)


def _serial_trajectories(n, actions, steps, seed):
    envs = vecaccel.make_vec("CartPole-v1", n, backend="serial")
    obs, _ = envs.reset(seed=seed)
    out = [obs]
    rewards = []
    for t in range(steps):
        obs, rew, term, trunc, _ = envs.step(actions[:, t])
        out.append(obs)
        rewards.append(rew)
    envs.close()
    return np.stack(out, 1), np.stack(rewards, 1)  # [n, T+1, ...], [n, T]


def test_without_alternation_matches_serial():
    n, steps = 4, 60
    actions = np.random.default_rng(1).integers(0, 2, (n, steps))
    expected_obs, expected_rew = _serial_trajectories(n, actions, steps, seed=3)
    envs = vecaccel.make_vec("CartPole-v1", n, backend="action_server", device="cpu", num_workers=2)
    try:
        obs, infos = envs.reset(seed=3)
        assert isinstance(obs, torch.Tensor) and obs.device.type == "cpu"
        assert infos["env_id"].tolist() == [0, 1, 2, 3]
        np.testing.assert_array_equal(obs.numpy(), expected_obs[:, 0])
        for t in range(steps):
            obs, rew, term, trunc, infos = envs.step(torch.as_tensor(actions[:, t]))
            assert rew.dtype == torch.float64 and term.dtype == torch.bool
            np.testing.assert_array_equal(obs.numpy(), expected_obs[:, t + 1])
            np.testing.assert_array_equal(rew.numpy(), expected_rew[:, t])
    finally:
        envs.close()


def test_alternating_halves_are_each_exact():
    n, steps = 6, 40
    actions = np.random.default_rng(2).integers(0, 2, (n, steps))
    expected_obs, expected_rew = _serial_trajectories(n, actions, steps, seed=5)
    envs = vecaccel.make_vec(
        "CartPole-v1", n, backend="action_server", device="cpu", alternating=True, num_workers=2
    )
    try:
        halves = {0: [0, 2, 4], 1: [1, 3, 5]}
        rewards: dict[int, list] = {0: [], 1: []}
        obs, infos = envs.reset(seed=5)
        seen = {0: [obs.numpy()], 1: []}
        used = {0: 0, 1: 0}
        group = 0
        for _ in range(2 * steps - 1):
            ids = halves[group]
            obs, rew, term, trunc, infos = envs.step(torch.as_tensor(actions[ids, used[group]]))
            used[group] += 1
            group = 1 - group
            assert infos["env_id"].tolist() == halves[group]
            seen[group].append(obs.numpy())
            if used[group] > 0:
                rewards[group].append(rew.numpy())
        # half B's first observation is its reset observation (served on the first step)
        for g, ids in halves.items():
            got = np.stack(seen[g], 0)  # [T, half, 4]
            want = expected_obs[ids].transpose(1, 0, 2)[: len(got)]
            np.testing.assert_array_equal(got, want)
            got_rew = np.stack(rewards[g], 0)
            want_rew = expected_rew[ids].T[: len(got_rew)]
            np.testing.assert_array_equal(got_rew, want_rew)
    finally:
        envs.close()


def test_bad_actions_and_options():
    with pytest.raises(ValueError, match="even number"):
        vecaccel.make_vec("CartPole-v1", 3, backend="action_server", alternating=True)
    envs = vecaccel.make_vec("CartPole-v1", 2, backend="action_server", num_workers=1)
    try:
        envs.reset(seed=0)
        with pytest.raises(ValueError, match="env 1 is 7"):
            envs.step(torch.tensor([0, 7]))
        obs, *_ = envs.step(torch.tensor([0, 1]))  # usable afterwards
        assert obs.shape == (2, 4)
    finally:
        envs.close()


def test_warns_when_torch_threads_would_starve_the_workers():
    """On the CPU the policy's spinning OpenMP threads share the cores with the env workers
    (the SB3 adapter warns the same way): more threads than the workers leave is a warning."""
    from vecaccel.worker import usable_cpus

    previous = torch.get_num_threads()
    torch.set_num_threads(usable_cpus() + 1)
    try:
        with pytest.warns(RuntimeWarning, match=r"torch.set_num_threads"):
            envs = vecaccel.make_vec(
                "CartPole-v1", 2, backend="action_server", device="cpu", num_workers=1
            )
        envs.close()
    finally:
        torch.set_num_threads(previous)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one thread, one worker: nothing to say
        vecaccel.make_vec(
            "CartPole-v1", 2, backend="action_server", device="cpu", num_workers=1
        ).close()


def slow_cartpole(sleep_at: int | None = None, seconds: float = 0.0) -> gym.Env:
    return SlowStep(gym.make("CartPole-v1"), sleep_at, seconds)


def raising_cartpole(at: int | None = None) -> gym.Env:
    env = gym.make("CartPole-v1")
    return RaiseAt(env, at) if at else env


def short_pendulum() -> gym.Env:
    return gym.wrappers.RecordEpisodeStatistics(gym.make("Pendulum-v1", max_episode_steps=7))


def short_cartpole() -> gym.Env:
    return gym.wrappers.RecordEpisodeStatistics(gym.make("CartPole-v1", max_episode_steps=9))


def server(fns, alternating=False, **options):
    return vecaccel.make_vec(
        fns, backend="action_server", device="cpu", alternating=alternating, num_workers=2,
        **options,
    )  # fmt: skip


# -- helpers ----------------------------------------------------------------------------------


def _split_infos(infos: dict, n: int) -> list[dict]:
    """Gymnasium-batched infos -> one dict per env (``env_id`` dropped)."""
    out: list[dict] = [{} for _ in range(n)]
    for key, value in infos.items():
        if key.startswith("_") or key == "env_id":
            continue
        mask = infos.get("_" + key, np.ones(n, dtype=bool))
        parts = _split_infos(value, n) if isinstance(value, dict) else value
        for i in range(n):
            if mask[i]:
                out[i][key] = parts[i]
    return out


def _np(tree):
    if isinstance(tree, dict):
        return {k: _np(v) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_np(v) for v in tree)
    return tree.numpy() if isinstance(tree, torch.Tensor) else np.asarray(tree)


def _at(tree, p):
    if isinstance(tree, dict):
        return {k: _at(v, p) for k, v in tree.items()}
    if isinstance(tree, tuple):
        return tuple(_at(v, p) for v in tree)
    return tree[p]


def _per_env_trajectories(env, n, rounds, actions_for, mode, seed):
    """Each env's own sequence of (obs, reward, flags, info), however the env serves them."""
    traj: dict[int, list] = {i: [] for i in range(n)}
    obs, infos = env.reset(seed=seed)
    ids = np.asarray(infos.get("env_id", np.arange(n)))
    for p, i in enumerate(ids):
        traj[i].append(("reset", _at(_np(obs), p), _split_infos(infos, len(ids))[p]))
    used = np.zeros(n, dtype=np.int64)
    alternating = getattr(env, "alternating", False)
    for _ in range(rounds * (2 if alternating else 1)):
        obs, rew, term, trunc, infos = env.step(actions_for(ids, used))
        used[ids] += 1
        ids = np.asarray(infos.get("env_id", np.arange(n)))
        obs, rew, term, trunc = _np(obs), _np(rew), _np(term), _np(trunc)
        per_env = _split_infos(infos, len(ids))
        for p, i in enumerate(ids):
            if not traj[i]:  # the second half's reset observation, served by the first step
                assert rew[p] == 0.0 and not term[p] and not trunc[p]
                traj[i].append(("reset", _at(obs, p), per_env[p]))
                continue
            traj[i].append(
                (_at(obs, p), rew[p], term[p], trunc[p], per_env[p], rew.dtype, term.dtype,
                 trunc.dtype)
            )  # fmt: skip
        if mode == "Disabled":
            done = term | trunc
            if done.any():
                mask = np.zeros(n, dtype=bool)
                mask[ids[done]] = True
                obs2, infos2 = env.reset(options={"reset_mask": mask})
                obs2, per_env2 = _np(obs2), _split_infos(infos2, len(ids))
                for p, i in enumerate(ids):
                    if done[p]:
                        traj[i].append(("masked reset", _at(obs2, p), per_env2[p]))
    return traj


def _snapshot(batch) -> dict[str, torch.Tensor]:
    fields = {name: getattr(batch, name).clone() for name in batch._fields if name != "extras"}
    fields.update({f"extras.{k}": v.clone() for k, v in batch.extras.items()})
    return fields


def _assert_same_batches(expected: list[dict], got: list[dict]) -> None:
    for a, b in zip(expected, got, strict=True):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key].dtype == b[key].dtype and a[key].shape == b[key].shape, key
            assert torch.equal(a[key], b[key]), key


#: how the server serves its envs: all at once, fixed halves, or a batch formed by a deadline
SERVING = {
    "all": {},
    "alternating": {"alternating": True},
    "formed": {"min_batch_size": 1, "max_batch_size": 3, "batch_wait_s": 0.0005},
}


@pytest.mark.parametrize("serving", list(SERVING))
@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_each_env_equals_serial_with_flags_dtypes_and_infos(mode, serving):
    """Every env's obs, float64 reward, bool flags and per-env infos (final_obs/final_info,
    masked-reset infos) equal the serial backend's, with either half order, and with envs
    returned as they report between a floor and a ceiling."""
    n, rounds = 4, 14
    # a formed batch returns some envs a step: more steps give each env its rounds
    steps = 3 * rounds if serving == "formed" else rounds
    fns = [functools.partial(make_cartpole, 5)] * n
    table = np.random.default_rng(0).integers(0, 2, (n, 2 * steps + 4))

    def numpy_actions(ids, used):
        return table[ids, used[ids]]

    def tensor_actions(ids, used):
        return torch.as_tensor(table[ids, used[ids]])

    reference = vecaccel.make_vec(fns, backend="serial", autoreset_mode=mode)
    try:
        expected = _per_env_trajectories(reference, n, steps, numpy_actions, mode, seed=1)
    finally:
        reference.close()
    envs = server(fns, autoreset_mode=mode, **SERVING[serving])
    try:
        fixed = serving != "formed"
        assert envs.capabilities.fixed_batch == fixed == envs.capabilities.in_index_order
        got = _per_env_trajectories(envs, n, steps, tensor_actions, mode, seed=1)
    finally:
        envs.close()
    for i in range(n):
        length = min(len(expected[i]), len(got[i]))
        assert length >= (rounds if fixed else 2)
        assert_same(expected[i][:length], got[i][:length], f"env {i}")


def test_dict_and_tuple_spaces_under_spawn_equal_serial():
    n, rounds, mode = 4, 8, "SameStep"
    fns = [functools.partial(make_dict_tuple, 5)] * n
    rng = np.random.default_rng(3)
    table = [
        [
            (rng.uniform(-1, 1, 2).astype(np.float32), int(rng.integers(3)),
             rng.integers(0, 2, 2).astype(np.int8))
            for _ in range(2 * rounds + 4)
        ]
        for _ in range(n)
    ]  # fmt: skip

    def actions_for(ids, used):
        rows = [table[i][used[i]] for i in ids]
        return (
            np.stack([r[0] for r in rows]),
            {"choice": np.array([r[1] for r in rows]), "bits": np.stack([r[2] for r in rows])},
        )

    reference = vecaccel.make_vec(fns, backend="serial", autoreset_mode=mode)
    try:
        expected = _per_env_trajectories(reference, n, rounds, actions_for, mode, seed=2)
    finally:
        reference.close()
    envs = server(fns, True, autoreset_mode=mode, context="spawn")
    try:
        got = _per_env_trajectories(envs, n, rounds, actions_for, mode, seed=2)
    finally:
        envs.close()
    for i in range(n):
        length = min(len(expected[i]), len(got[i]))
        assert_same(expected[i][:length], got[i][:length], f"env {i}")


@pytest.mark.parametrize("alternating", [False, True], ids=["all", "alternating"])
def test_reset_seed_list_options_and_a_second_reset_reach_both_halves(alternating):
    reference = vecaccel.make_vec("CartPole-v1", 4, backend="serial")
    envs = vecaccel.make_vec(
        "CartPole-v1", 4, backend="action_server", device="cpu", alternating=alternating,
        num_workers=2,
    )  # fmt: skip
    try:
        for seed, options in (([5, 6, 7, 8], {"low": 0.2, "high": 0.3}), (11, None)):
            expected, _ = reference.reset(seed=seed, options=options)
            obs, infos = envs.reset(seed=seed, options=options)
            seen = {int(i): obs[p].numpy() for p, i in enumerate(infos["env_id"])}
            obs, rew, term, trunc, infos = envs.step(torch.zeros(obs.shape[0], dtype=torch.int64))
            if alternating:  # the other half's reset observation, with reward 0 and no flags
                assert not rew.any() and not term.any() and not trunc.any()
                seen.update({int(i): obs[p].numpy() for p, i in enumerate(infos["env_id"])})
            np.testing.assert_array_equal(np.stack([seen[i] for i in range(4)]), expected)
            for _ in range(3):  # run on, so the next reset comes with a half in flight
                obs, *_ = envs.step(torch.ones(obs.shape[0], dtype=torch.int64))
    finally:
        envs.close()
        reference.close()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_env_error_reaches_the_caller_reset_recovers_and_close_leaves_nothing(context, leak_check):
    # toy_envs' CounterEnv: a spawned worker need not import torch to unpickle it
    envs = server(counter_fns(4, {1: {"fault": "raise", "fault_step": 2}}), True, context=context)
    try:
        obs, _ = envs.reset(seed=0)
        with pytest.raises(vecaccel.WorkerError, match="ValueError.*boom in step 2") as err:
            for _ in range(8):
                obs, *_ = envs.step(torch.zeros(2, dtype=torch.int64))
        assert list(err.value.env_indices) == [1]
        obs, infos = envs.reset(seed=0)
        assert infos["env_id"].tolist() == [0, 2]
        for _ in range(4):
            obs, *_ = envs.step(torch.zeros(2, dtype=torch.int64))
    finally:
        envs.close()


def _numpy_pendulum_policy(obs: torch.Tensor):
    return (obs[:, :1] * 3).numpy(), {"value": obs.sum(-1).numpy()}


def _tensor_pendulum_policy(obs: torch.Tensor):
    return obs[:, :1] * 3, {"value": obs.sum(-1)}


@pytest.mark.parametrize("alternating", [False, True], ids=["all", "alternating"])
def test_sampler_numpy_policy_with_box_actions_on_the_action_server(alternating):
    """A NumPy policy is supported (the Sampler docstring; the Discrete case is tested), but on
    a tensor env with a Box action space ``_env_actions`` calls ``torch.clamp`` on the NumPy
    array: TypeError. The batch must equal serial's with the same (tensor) policy."""
    reference = vecaccel.make_vec([short_pendulum] * 4, backend="serial", autoreset_mode="SameStep")
    try:
        sampler = Sampler(reference, _tensor_pendulum_policy, horizon=5, seed=4)
        expected = [_snapshot(sampler.collect()) for _ in range(3)]
    finally:
        reference.close()
    envs = server([short_pendulum] * 4, alternating, autoreset_mode="SameStep")
    try:
        sampler = Sampler(envs, _numpy_pendulum_policy, horizon=5, seed=4)
        got = [_snapshot(sampler.collect()) for _ in range(3)]
    finally:
        envs.close()
    for batch in expected:  # the NumPy policy's actions are float32 too
        assert batch["actions"].dtype == torch.float32
    _assert_same_batches(expected, got)


@pytest.mark.parametrize("alternating", [False, True], ids=["all", "alternating"])
def test_second_step_async_without_step_wait_is_a_runtime_error(alternating):
    """README (Errors and faults): a second step_async before step_wait raises RuntimeError
    (shm does). The action server raises ValueError 'still stepping; recv() them first'."""
    envs = vecaccel.make_vec(
        "CartPole-v1", 4, backend="action_server", device="cpu", alternating=alternating,
        num_workers=2,
    )  # fmt: skip
    try:
        obs, _ = envs.reset(seed=0)
        actions = torch.zeros(obs.shape[0], dtype=torch.int64)
        envs.step_async(actions)
        with pytest.raises(RuntimeError):
            envs.step_async(actions)
        obs, *_ = envs.step_wait()  # the first step is still there
        assert obs.shape == (obs.shape[0], 4)
    finally:
        envs.close()


def test_alternating_step_wait_without_step_async_is_refused():
    """After reset() the caller holds half A; step_wait() with no step_async() pending must
    raise (shm: 'step_wait() called without a pending step_async()'). The alternating server
    instead returns half B and flips its turn, so half A never gets its action and the next
    step() fails with 'envs [0, 2] are neither ready nor stepping'."""
    envs = server([raising_cartpole] * 4, True)
    try:
        envs.reset(seed=0)
        with pytest.raises(RuntimeError):
            envs.step_wait(timeout=1.0)
    finally:
        envs.close()


@pytest.mark.parametrize("how", ["timeout", "ctrl-c"])
def test_a_step_given_up_does_not_block_the_next_step(how):
    """README: 'a step interrupted so [Ctrl-C] is finished and dropped by the next call'; and
    only a step that timed out is given up by a new step_async. The next step() works on the
    action server as on shm, rather than raising ValueError ('still stepping; recv() them
    first', and recv() is not part of its API) until the old step is waited for by hand."""
    fns = [functools.partial(slow_cartpole, 2, 1.0)] + [slow_cartpole] * 3
    reference = vecaccel.make_vec("CartPole-v1", 4, backend="serial")
    expected, _ = reference.reset(seed=0)
    for _ in range(3):  # step 1, the step given up, and the next one
        expected, *_ = reference.step(np.zeros(4, dtype=np.int64))
    reference.close()
    envs = server(fns, False)
    previous = signal.getsignal(signal.SIGALRM)
    try:
        obs, _ = envs.reset(seed=0)
        actions = torch.zeros(4, dtype=torch.int64)
        envs.step(actions)
        if how == "timeout":
            envs.step_async(actions)
            with pytest.raises(TimeoutError):
                envs.step_wait(timeout=0.05)
        else:

            def interrupt(*_):
                raise KeyboardInterrupt

            signal.signal(signal.SIGALRM, interrupt)
            signal.setitimer(signal.ITIMER_REAL, 0.1)
            with pytest.raises(KeyboardInterrupt):
                envs.step(actions)
            signal.setitimer(signal.ITIMER_REAL, 0)
        obs, *_ = envs.step(actions)
        np.testing.assert_allclose(obs.numpy(), expected)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        envs.close()


def _cartpole_next(obs: np.ndarray, action: int) -> np.ndarray:
    env = gym.make("CartPole-v1").unwrapped
    env.reset(seed=0)
    env.state = obs.astype(np.float64)
    return env.step(int(action))[0]


class InterruptOnce:
    """A deterministic policy that is interrupted (Ctrl-C) at its ``at``-th call."""

    def __init__(self, at: int) -> None:
        self.at, self.calls = at, 0

    def __call__(self, obs: torch.Tensor):
        self.calls += 1
        if self.calls == self.at:
            raise KeyboardInterrupt
        return (obs[:, 2] > 0).long(), {}


@pytest.mark.parametrize("alternating", [False, True], ids=["all", "alternating"])
def test_collect_after_an_interrupted_collect_pairs_each_obs_with_its_transition(alternating):
    """A collect() interrupted inside the policy (Ctrl-C, or a policy error the caller handles)
    leaves the env some steps further on: the next collect() must pair each observation with
    the transition that followed it, not write the observation the Sampler held before the
    interrupted collect into row 0 beside an action applied to another state (nor let
    alternating halves act on stale obs). Refusing with a RuntimeError until reset() would be
    correct too."""
    envs = server([raising_cartpole] * 4, alternating, autoreset_mode="SameStep")
    try:
        sampler = Sampler(envs, InterruptOnce(at=7), horizon=8, seed=3)
        with pytest.raises(KeyboardInterrupt):
            sampler.collect()
        try:
            batch = sampler.collect()
        except RuntimeError:
            return  # a clear refusal is a correct answer
    finally:
        envs.close()
    obs, actions = batch.obs.numpy(), batch.actions.numpy()
    done = (batch.terminated | batch.truncated).numpy()
    rows = np.concatenate([obs, batch.next_obs.numpy()[None]], 0)
    for b in range(4):
        for t in range(batch.horizon):
            if done[t, b]:
                continue
            np.testing.assert_allclose(
                _cartpole_next(rows[t, b], actions[t, b]), rows[t + 1, b], atol=1e-4,
                err_msg=f"env {b}: row {t} -> {t + 1} is not one CartPole step",
            )  # fmt: skip


def test_last_obs_after_sampler_reset_holds_every_envs_reset_obs_on_alternating_halves():
    """``Sampler.last_obs`` is documented as each env's latest observation; after
    ``reset(seed=...)`` serial gives every env's reset observation, but with alternating
    halves only the first half is updated and the second keeps its pre-reset observation."""
    results = {}
    for backend, options in (
        ("serial", {}),
        ("action_server", {"device": "cpu", "alternating": True, "num_workers": 2}),
    ):
        envs = vecaccel.make_vec([short_cartpole] * 4, backend=backend, **options)
        try:
            sampler = Sampler(envs, lambda o: ((o[:, 2] > 0).long(), {}), horizon=5, seed=3)
            sampler.collect()
            sampler.reset(seed=99)
            results[backend] = sampler.last_obs.clone()
        finally:
            envs.close()
    torch.testing.assert_close(results["action_server"], results["serial"], rtol=0, atol=0)


# ---------------------------------------------------------------------------------------------
# fresh tensors, and a timed-out step on alternating halves


@pytest.mark.parametrize("alternating", [False, True])
def test_action_server_tensors_are_fresh_and_any_action_kind_is_accepted(alternating):
    """Every returned tensor stays valid after later steps (no view into a reused buffer);
    NumPy, list and int32-tensor actions act as int64 tensors do."""
    n, steps, seed = 4, 12, 5
    table = np.random.default_rng(0).integers(0, 2, (n, steps + 2))
    reference = vecaccel.make_vec("CartPole-v1", n, backend="serial")
    obs, _ = reference.reset(seed=seed)
    expected = [obs]
    for t in range(steps + 1):
        expected.append(reference.step(table[:, t])[0])
    reference.close()
    expected = np.stack(expected, 1)  # [n, steps + 2, 4]

    envs = vecaccel.make_vec(
        "CartPole-v1", n, backend="action_server", device="cpu", alternating=alternating,
        num_workers=2,
    )  # fmt: skip
    kinds = [
        lambda a: torch.as_tensor(a),
        lambda a: np.asarray(a),
        lambda a: a.tolist(),
        lambda a: torch.as_tensor(a, dtype=torch.int32),
    ]
    kept: dict[int, list[torch.Tensor]] = {i: [] for i in range(n)}
    try:
        obs, infos = envs.reset(seed=seed)
        used = np.zeros(n, dtype=np.int64)
        for k in range(2 * steps if alternating else steps):  # steps per env
            ids = np.asarray(infos["env_id"])
            for position, i in enumerate(ids.tolist()):
                kept[i].append(obs[position])  # a view of the returned tensor, not a clone
            actions = table[ids, used[ids]]
            used[ids] += 1
            obs, rew, term, trunc, infos = envs.step(kinds[k % len(kinds)](actions))
            assert obs.dtype == torch.float32 and obs.device.type == "cpu"
            assert rew.dtype == torch.float64 and term.dtype == trunc.dtype == torch.bool
    finally:
        envs.close()
    for i in range(n):
        got = torch.stack(kept[i]).numpy()
        np.testing.assert_array_equal(got, expected[i, : len(got)])


def _slow_cartpole(sleep_at: int | None = None, seconds: float = 0.0) -> gym.Env:
    return SlowStep(gym.make("CartPole-v1"), sleep_at, seconds)


def test_alternating_action_server_drops_a_timed_out_step_and_stays_in_step_with_serial():
    """With alternating halves, the step given up is the *other* half's; the next step_async
    drops it and acts for that half, and every later batch is that half's true next state."""
    reference = vecaccel.make_vec("CartPole-v1", 4, backend="serial")
    states = [reference.reset(seed=0)[0]]
    for _ in range(4):
        states.append(reference.step(np.zeros(4, np.int64))[0])
    reference.close()
    fns = [functools.partial(_slow_cartpole, 2, 1.0)] + [_slow_cartpole] * 3
    # a worker per env: a half's envs never wait behind the sleeping env 0 in its worker
    envs = vecaccel.make_vec(
        fns, backend="action_server", device="cpu", alternating=True, num_workers=4
    )
    try:
        actions = torch.zeros(2, dtype=torch.int64)
        envs.reset(seed=0)
        expected_steps = [0, 1, 1]
        for steps in expected_steps:
            obs, *_, infos = envs.step(actions)
            np.testing.assert_allclose(obs.numpy(), states[steps][infos["env_id"]])
        envs.step_async(actions)  # half B's step 2; half A's (env 0 sleeps) is awaited
        with pytest.raises(TimeoutError):
            envs.step_wait(timeout=0.05)
        for steps, ids in ((2, [1, 3]), (3, [0, 2]), (3, [1, 3])):
            obs, *_, infos = envs.step(actions)
            assert infos["env_id"].tolist() == ids
            np.testing.assert_allclose(obs.numpy(), states[steps][ids])
    finally:
        envs.close()


# -- a floor, a ceiling and a deadline; policy versions -----------------------------------------


@pytest.mark.parametrize("serving", list(SERVING))
def test_each_answer_carries_the_policy_version_its_action_was_sent_under(serving):
    envs = server([make_cartpole] * 4, **SERVING[serving])
    try:
        _, infos = envs.reset(seed=0)
        assert "policy_version" not in infos  # stamps are the caller's choice
        envs.policy_version = 0
        _, infos = envs.reset(seed=0)
        assert (infos["policy_version"] == -1).all()  # no action since the reset
        sent_under = np.full(4, -1)
        for version in range(1, 13):
            ids = infos["env_id"]
            envs.policy_version = version
            sent_under[ids] = version
            *_, infos = envs.step(torch.zeros(len(ids), dtype=torch.int64))
            stamps = infos["policy_version"]
            np.testing.assert_array_equal(stamps, sent_under[infos["env_id"]])
        assert stamps.dtype == np.int64
    finally:
        envs.close()


@pytest.mark.parametrize("alternating", [False, True])
def test_fixed_batches_give_the_age_of_their_oldest_env_as_formed_ones_do(alternating):
    """All envs and fixed halves (``recv_ids``) stamp ``last_ready_age_s`` as a formed batch
    (``recv``) does: envs 0 and 1 return at once and wait about 50 ms for the slow envs 2 and 3
    that share their batch (each half holds one of each)."""
    fns = [SleepEnv] * 2 + [functools.partial(SleepEnv, 0.05)] * 2
    envs = server(fns, alternating=alternating)
    try:
        obs, _ = envs.reset(seed=0)
        for step in range(3):
            obs, *_ = envs.step(torch.zeros(len(obs), dtype=torch.int64))
            if step or not alternating:  # the first half returned only reset, a moment ago
                assert envs.last_ready_age_s >= 0.04, (step, envs.last_ready_age_s)
    finally:
        envs.close()


def test_a_formed_batch_step_given_up_is_dropped_and_its_envs_act_again():
    """A step that timed out under a floor: the next step_async waits for its envs, drops their
    results and sends them the new actions; the envs stepping apart from it are untouched."""
    fns = [functools.partial(SleepEnv, 0.0)] * 3 + [functools.partial(SleepEnv, 0.6)]
    envs = vecaccel.make_vec(
        fns, backend="action_server", min_batch_size=4, max_batch_size=4, num_workers=4
    )
    try:
        _, infos = envs.reset(seed=0)
        assert sorted(infos["env_id"].tolist()) == [0, 1, 2, 3]
        envs.step_async(torch.zeros(4, dtype=torch.int64))
        with pytest.raises(TimeoutError):
            envs.step_wait(timeout=0.05)  # env 3 sleeps
        obs, *_, infos = envs.step(torch.zeros(4, dtype=torch.int64))
        assert sorted(infos["env_id"].tolist()) == [0, 1, 2, 3]
        # the given-up step and this one: two steps in each env
        np.testing.assert_array_equal(obs.flatten().numpy(), [2.0, 2.0, 2.0, 2.0])
    finally:
        envs.close()


def test_formed_batches_are_refused_with_halves_and_by_the_sampler():
    with pytest.raises(ValueError, match="alternating=True serves fixed halves"):
        vecaccel.make_vec("CartPole-v1", 4, backend="action_server", alternating=True,
                          max_batch_size=2)  # fmt: skip
    with pytest.raises(ValueError, match="max_batch_size=5 is above num_envs=4"):
        vecaccel.make_vec("CartPole-v1", 4, backend="action_server", max_batch_size=5)
    with pytest.raises(TypeError, match="between min_batch_size and max_batch_size"):
        vecaccel.make_vec("CartPole-v1", 4, backend="action_server", batch_size=2)
    envs = server([make_cartpole] * 4, min_batch_size=2, max_batch_size=4)
    try:
        with pytest.raises(ValueError, match="needs a fixed batch"):
            Sampler(envs, lambda obs: (torch.zeros(len(obs), dtype=torch.int64), {}), horizon=4)
    finally:
        envs.close()


def test_the_sampler_keeps_each_rows_policy_version():
    envs = server([make_cartpole] * 4, alternating=True)
    try:
        sampler = Sampler(
            envs, lambda obs: (torch.zeros(len(obs), dtype=torch.int64), {}), horizon=3, seed=0
        )
        sampler.collect()
        assert sampler.policy_versions is None  # the env stamps nothing until asked
        envs.policy_version = 1
        sampler.collect()  # its first row's stash was acted on unstamped
        for version in (2, 3):
            envs.policy_version = version
            sampler.collect()
            versions = sampler.policy_versions
            assert versions is not None and versions.shape == (3, 4)
            # the half that finished first acted once more with the batch before's weights
            first = np.flatnonzero(versions[0] != version)
            assert versions[0, first].tolist() == [version - 1] * 2
            assert (versions[1:] == version).all()
    finally:
        envs.close()
