"""The async backend, the action server, the Sampler, the plugin manager and the CLI, checked
against what the documentation (or Gymnasium's and EnvPool's semantics) promises; several
docstrings say what the code did before the fix each test holds it to (a review, session 9).
Env functions are module level or ``functools.partial`` of module-level callables, so they
pickle by reference under ``spawn``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from gymnasium.wrappers.vector import RecordEpisodeStatistics

import vecaccel
from tests.async_envs import counter
from tests.helpers_envs import make_cartpole
from vecaccel.manager import _reset_plugin_manager
from vecaccel.sampler import Sampler

torch.set_num_threads(1)


def short_cartpole(max_episode_steps: int = 6) -> gym.Env:
    return gym.make("CartPole-v1", max_episode_steps=max_episode_steps)


def counter_fns(num_envs: int, **kwargs) -> list:
    return [functools.partial(counter, tag, **kwargs) for tag in range(num_envs)]


class SeededPolicy:
    """Random actions from its own generator; extras that depend on the observation."""

    def __init__(self, seed: int = 0, high: int = 2) -> None:
        self.generator = torch.Generator().manual_seed(seed)
        self.high = high

    def __call__(self, obs: torch.Tensor):
        actions = torch.randint(0, self.high, (obs.shape[0],), generator=self.generator)
        return actions, {"value": obs.float().sum(-1)}


def observation_policy(obs: torch.Tensor):
    """Acts on the observation alone, so the order envs are served in does not matter."""
    return (obs[:, 2] > 0).long(), {"value": obs.sum(-1)}


def numpy_policy(obs: torch.Tensor):
    """A policy written with NumPy: actions and extras are arrays, not tensors."""
    array = np.asarray(obs)
    return (array[:, 2] > 0).astype(np.int64), {"value": array.sum(-1)}


def snapshot(batch) -> dict[str, torch.Tensor]:
    fields = {name: getattr(batch, name).clone() for name in batch._fields if name != "extras"}
    fields.update({f"extras.{key}": value.clone() for key, value in batch.extras.items()})
    return fields


def assert_same_batches(expected: list[dict], got: list[dict]) -> None:
    for index, (a, b) in enumerate(zip(expected, got, strict=True)):
        assert a.keys() == b.keys()
        for key in a:
            assert torch.equal(a[key], b[key]), (index, key)


@pytest.fixture
def fresh_plugin_manager() -> Iterator[None]:
    _reset_plugin_manager()
    yield
    _reset_plugin_manager()


# ---------------------------------------------------------------------------------------------
# async: send/recv bookkeeping


def test_async_send_refuses_envs_whose_result_was_not_received():
    """After ``reset`` returns envs 0 and 1, envs 2 and 3 are ready but not received yet: their
    reset observations are still to come. Sending them actions now used to be accepted: the
    reset observation was lost and the same step result came back twice."""
    envs = vecaccel.make_vec(counter_fns(4), backend="async", batch_size=2, num_workers=2)
    try:
        _, infos = envs.reset()
        assert infos["env_id"].tolist() == [0, 1]
        with pytest.raises(ValueError):
            envs.send(np.array([1, 1]), [2, 3])
        # whatever send did, every env's first result must be its reset observation
        obs, rew, *_ = envs.recv()
        assert obs[:, 1].tolist() == [0.0, 0.0] and rew.tolist() == [0.0, 0.0]
    finally:
        envs.close()


def test_async_recv_refuses_when_stepping_envs_cannot_fill_a_batch():
    """One env stepping and none ready can never make a batch of two: ``recv`` must say so
    (as it does when nothing steps) instead of blocking forever."""
    envs = vecaccel.make_vec(counter_fns(4), backend="async", batch_size=2, num_workers=2)
    try:
        envs.reset()
        envs.send(np.array([1]), [0])
        assert sorted(envs.recv()[4]["env_id"].tolist()) == [2, 3]  # the ready ones
        with pytest.raises(RuntimeError):
            envs.recv(timeout=2.0)  # without the timeout this call never returns
    finally:
        envs.close()


def test_async_recv_ids_refuses_a_negative_id_instead_of_waiting_for_it():
    """``recv_ids([-1])`` while env 3 steps looked up ``_in_flight[-1]`` (env 3), then waited
    for an env ``-1`` that never arrives (forever without a timeout)."""
    envs = vecaccel.make_vec(counter_fns(4), backend="async", batch_size=2, num_workers=2)
    try:
        envs.reset()
        envs.step(np.zeros(2, dtype=np.int64))  # sends 0, 1; returns 2, 3 (ready)
        envs.send(np.zeros(2, dtype=np.int64), [2, 3])  # every env is stepping now
        with pytest.raises(ValueError):
            envs.recv_ids([-1], timeout=2.0)
    finally:
        envs.close()


def test_async_recv_ids_refuses_duplicates_and_out_of_range_ids_like_send():
    envs = vecaccel.make_vec(counter_fns(4), backend="async", batch_size=2, num_workers=2)
    try:
        envs.reset()
        with pytest.raises(ValueError):
            envs.recv_ids([2, 2], timeout=2.0)  # returned env 2 twice
        with pytest.raises(ValueError):
            envs.recv_ids([9], timeout=2.0)  # a bare numpy IndexError
    finally:
        envs.close()


def test_async_send_and_recv_argument_errors():
    envs = vecaccel.make_vec(counter_fns(4), backend="async", batch_size=4, num_workers=2)
    try:
        with pytest.raises(RuntimeError, match="reset"):
            envs.step(np.zeros(4, dtype=np.int64))
        _, infos = envs.reset()
        assert infos["env_id"].tolist() == [0, 1, 2, 3]
        with pytest.raises(RuntimeError, match="send\\(\\) actions first"):
            envs.recv()  # nothing stepping, nothing ready
        for ids, match in (([-1], "lie in"), ([4], "lie in"), ([1, 1], "duplicates")):
            with pytest.raises(ValueError, match=match):
                envs.send(np.zeros(len(ids), dtype=np.int64), ids)
        with pytest.raises(ValueError, match="shape"):
            envs.send(np.zeros(3, dtype=np.int64), [0, 1])
        envs.send(np.zeros(0, dtype=np.int64), [])  # nothing to do
        assert not envs._in_flight.any()
        obs, rew, _, _, infos = envs.step(np.array([0, 1, 2, 0]))  # still usable
        assert sorted(infos["env_id"].tolist()) == [0, 1, 2, 3] and obs.shape == (4, 2)
        assert obs[:, 1].tolist() == [1.0] * 4
    finally:
        envs.close()


@pytest.mark.parametrize("mode", ["SameStep", "NextStep"])
def test_async_flags_and_infos_per_env_equal_serial(mode):
    """Partial batches carry each env's own flags and infos (``final_obs``/``final_info`` in
    SAME_STEP, ``_key`` masks over the batch), exactly as the serial backend gives them."""
    n = 4
    fns = [functools.partial(make_cartpole, 5, True)] * n

    def per_env(infos, position):
        out = {}
        for key, value in infos.items():
            if key.startswith("_") or key == "env_id":
                continue
            if not infos[f"_{key}"][position]:
                continue
            if isinstance(value, dict):
                out[key] = {k: v[position] for k, v in value.items() if not k.startswith("_")}
            else:
                out[key] = value[position]
        return out

    envs = vecaccel.make_vec(fns, backend="async", batch_size=2, num_workers=2, autoreset_mode=mode)
    got: dict[int, list] = {i: [] for i in range(n)}
    try:
        _, infos = envs.reset(seed=3)
        first = set(infos["env_id"].tolist())
        # until every env has 8 steps: which envs come back first is up to the scheduler
        for _ in range(1000):
            if min(len(v) for v in got.values()) >= 8:
                break
            obs, rew, term, trunc, infos = envs.step(np.zeros(2, dtype=np.int64))
            for position, i in enumerate(infos["env_id"].tolist()):
                if i not in first:
                    first.add(i)  # its reset observation: the serial reference starts after it
                    continue
                got[i].append((obs[position], rew[position], term[position], trunc[position],
                               per_env(infos, position)))  # fmt: skip
    finally:
        envs.close()
    reference = vecaccel.make_vec(fns, backend="serial", autoreset_mode=mode)
    try:
        reference.reset(seed=3)
        steps = min(len(v) for v in got.values())
        assert steps >= 8  # episodes of 5 steps: at least one autoreset per env
        for s in range(steps):
            obs, rew, term, trunc, infos = reference.step(np.zeros(n, dtype=np.int64))
            for i in range(n):
                g_obs, g_rew, g_term, g_trunc, g_info = got[i][s]
                np.testing.assert_array_equal(g_obs, obs[i])
                assert (g_rew, g_term, g_trunc) == (rew[i], term[i], trunc[i]), (i, s)
                e_info = per_env(infos, i)
                assert g_info.keys() == e_info.keys(), (i, s)
                for key in e_info:
                    if isinstance(e_info[key], dict):
                        assert g_info[key].keys() == e_info[key].keys()
                        for k in e_info[key]:
                            np.testing.assert_array_equal(g_info[key][k], e_info[key][k])
                    else:
                        np.testing.assert_array_equal(g_info[key], e_info[key])
    finally:
        reference.close()


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_async_reset_while_envs_step_reseeds_every_env(context):
    envs = vecaccel.make_vec(
        "CartPole-v1", 4, backend="async", batch_size=2, num_workers=2, context=context
    )
    twins = [gym.make("CartPole-v1") for _ in range(4)]
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(2, dtype=np.int64))  # 0 and 1 step; 2 and 3 come back
        envs.send(np.ones(2, dtype=np.int64), [2, 3])  # now every env is stepping
        obs, infos = envs.reset(seed=10)
        expected = np.stack([twin.reset(seed=10 + i)[0] for i, twin in enumerate(twins)])
        assert infos["env_id"].tolist() == [0, 1]
        np.testing.assert_array_equal(obs, expected[[0, 1]])
        # the other two come back with their reset observation, never a stale step result
        obs, rew, term, trunc, infos = envs.step(np.zeros(2, dtype=np.int64))
        assert infos["env_id"].tolist() == [2, 3]
        np.testing.assert_array_equal(obs, expected[[2, 3]])
        assert rew.tolist() == [0.0, 0.0] and not term.any() and not trunc.any()
        obs, rew, term, trunc, infos = envs.step(np.zeros(2, dtype=np.int64))
        after_one_step = np.stack([twin.step(0)[0] for twin in twins])
        ids = infos["env_id"]
        np.testing.assert_array_equal(obs, after_one_step[ids])
        assert rew.tolist() == [1.0, 1.0]
    finally:
        envs.close()
        for twin in twins:
            twin.close()


def test_async_close_with_envs_in_flight_leaves_nothing(leak_check):
    envs = vecaccel.make_vec(
        counter_fns(4, sleep_on={1: 1.0}), backend="async", batch_size=2, num_workers=2
    )
    envs.reset()
    envs.send(np.zeros(2, dtype=np.int64), [0, 1])
    envs.close()
    assert envs.closed
    with pytest.raises(vecaccel.ClosedEnvError):
        envs.recv()
    envs.close()  # idempotent


# ---------------------------------------------------------------------------------------------
# action server


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


# ---------------------------------------------------------------------------------------------
# Sampler


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "views"])
@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_sampler_matches_a_sync_vector_env_loop(mode, copy):
    """Step by step against Gymnasium's ``SyncVectorEnv`` on the same seeds and actions: obs,
    rewards, flags, validity, and the final observation of every truncated episode.

    With ``copy=False`` (views, valid until the next step, as README documents) the Sampler
    kept a view as the final observation, which the next step (NEXT_STEP) or its own masked
    reset (DISABLED) overwrote.
    """
    B, T, seed = 3, 14, 4
    envs = vecaccel.make_vec([short_cartpole] * B, backend="serial", autoreset_mode=mode, copy=copy)
    try:
        sampler = Sampler(envs, SeededPolicy(1), horizon=T, seed=seed, episode_stats="rewards")
        batches = [snapshot(sampler.collect()) for _ in range(2)]
    finally:
        envs.close()

    reference = gym.vector.SyncVectorEnv([short_cartpole] * B, autoreset_mode=AutoresetMode(mode))
    try:
        obs, _ = reference.reset(seed=seed)
        pending = np.zeros(B, dtype=bool)
        truncations = 0
        for batch in batches:
            finals = []
            for t in range(T):
                np.testing.assert_array_equal(batch["obs"][t].numpy(), obs, err_msg=f"t={t}")
                obs, rew, term, trunc, infos = reference.step(batch["actions"][t].numpy())
                np.testing.assert_array_equal(batch["rewards"][t].numpy(), rew.astype(np.float32))
                np.testing.assert_array_equal(batch["terminated"][t].numpy(), term)
                np.testing.assert_array_equal(batch["truncated"][t].numpy(), trunc)
                valid = ~pending if mode == "NextStep" else np.ones(B, dtype=bool)
                np.testing.assert_array_equal(batch["valid"][t].numpy(), valid)
                for b in np.flatnonzero(trunc & ~term & valid):
                    final = infos["final_obs"][b] if mode == "SameStep" else obs[b]
                    finals.append(((t, int(b)), np.array(final)))
                done = (term | trunc) & valid
                if mode == "NextStep":
                    pending = done
                if mode == "Disabled" and done.any():
                    obs, _ = reference.reset(options={"reset_mask": done})
            np.testing.assert_array_equal(batch["next_obs"].numpy(), obs)
            finals.sort(key=lambda item: item[0])
            assert batch["final_index"].tolist() == [list(index) for index, _ in finals]
            for k, (index, final) in enumerate(finals):
                np.testing.assert_array_equal(batch["final_obs"][k].numpy(), final, str(index))
            truncations += len(finals)
        assert truncations >= 3
    finally:
        reference.close()


@pytest.mark.parametrize("episode_stats", ["infos", "auto"])
@pytest.mark.parametrize("mode", ["NextStep", "SameStep", "Disabled"])
def test_sampler_episode_stats_from_gymnasiums_vector_record_episode_statistics(
    mode, episode_stats
):
    """``RecordEpisodeStatistics`` as a vector wrapper (Gymnasium's for vector envs) puts
    ``info["episode"]`` at the top level in every mode, with ``info["_episode"]`` the wrapper's
    own ``prev_dones`` array. The Sampler looked for it only in ``final_info`` under SAME_STEP,
    and under DISABLED read the mask after its masked reset had cleared that very array."""
    results = {}
    for source in ("rewards", episode_stats):
        envs = RecordEpisodeStatistics(
            vecaccel.make_vec(
                [functools.partial(short_cartpole, 12)] * 3, backend="serial", autoreset_mode=mode
            )
        )
        try:
            sampler = Sampler(envs, observation_policy, horizon=30, seed=0, episode_stats=source)
            sampler.collect()
            results[source] = sampler.pop_episodes()
        finally:
            envs.close()
    assert len(results["rewards"].returns) >= 6
    assert results[episode_stats] == results["rewards"]


def test_sampler_on_async_keeps_each_env_in_its_own_column():
    """``async`` with ``batch_size == num_envs`` (its default) returns all envs, in the order
    they finished (``info["env_id"]``). The Sampler accepted it and wrote rows by position, so a
    column mixed several envs' trajectories. It must place rows by env id, or refuse the env."""
    fns = [functools.partial(counter, 0, sleep_on={1: 0.2})] + [
        functools.partial(counter, tag) for tag in range(1, 4)
    ]
    envs = vecaccel.make_vec(fns, backend="async", num_workers=2)
    try:
        try:
            sampler = Sampler(envs, SeededPolicy(0, high=3), horizon=4, seed=0)
        except ValueError:
            return  # refusing an env that returns envs out of order is a correct answer
        batch = sampler.collect()
    finally:
        envs.close()
    tags = batch.obs[..., 0]  # CounterEnv observes [its tag, its step count]
    expected = torch.arange(4, dtype=tags.dtype).expand_as(tags)
    assert torch.equal(tags, expected), tags
    assert torch.equal(batch.next_obs[:, 0], torch.arange(4, dtype=tags.dtype))


def test_sampler_accepts_a_numpy_policy_on_the_alternating_action_server():
    """NumPy actions and extras work on every backend (``_store_policy_output`` converts them)
    except the alternating action server, whose stash called ``actions.clone()``."""
    results = {}
    for backend, options in (
        ("serial", {}),
        ("action_server", {"device": "cpu", "alternating": True, "num_workers": 2}),
    ):
        envs = vecaccel.make_vec([short_cartpole] * 4, backend=backend, **options)
        try:
            sampler = Sampler(envs, numpy_policy, horizon=3, seed=2)
            results[backend] = [snapshot(sampler.collect()) for _ in range(2)]
        finally:
            envs.close()
    assert_same_batches(results["serial"], results["action_server"])


@pytest.mark.parametrize("horizon", [1, 3])
@pytest.mark.parametrize("mode", ["SameStep", "NextStep"])
def test_sampler_short_horizons_on_the_alternating_action_server_equal_serial(mode, horizon):
    """Horizon 1 and an odd horizon: the half that finishes first acts once more and that
    action becomes its row 0 of the next batch; every batch still equals serial's."""
    results = {}
    for backend, options in (
        ("serial", {}),
        ("action_server", {"device": "cpu", "alternating": True, "num_workers": 2}),
    ):
        envs = vecaccel.make_vec(
            [functools.partial(short_cartpole, 4)] * 4,
            backend=backend,
            autoreset_mode=mode,
            **options,
        )
        try:
            sampler = Sampler(envs, observation_policy, horizon=horizon, seed=1)
            batches = [snapshot(sampler.collect()) for _ in range(8 // horizon + 1)]
            results[backend] = (batches, sampler.pop_episodes())
        finally:
            envs.close()
    assert_same_batches(results["serial"][0], results["action_server"][0])
    assert sorted(results["serial"][1].returns) == sorted(results["action_server"][1].returns)
    assert results["serial"][1].returns  # episodes of 4 steps did end


# ---------------------------------------------------------------------------------------------
# plugin manager


class NoArgumentPlugin:
    """A valid pluggy plugin: a hookimpl may take any subset of the spec's arguments."""

    def __init__(self) -> None:
        self.calls = 0

    @vecaccel.hookimpl
    def vecaccel_register_backends(self) -> None:
        self.calls += 1


def test_register_backends_hookimpl_taking_no_arguments_is_called_as_pluggy_calls_it(
    fresh_plugin_manager: None,
):
    pm = vecaccel.get_plugin_manager()
    plugin = NoArgumentPlugin()
    assert pm.register(plugin, name="review-no-arguments") == "review-no-arguments"
    pm.hook.vecaccel_register_backends(registry=vecaccel.BackendRegistry())  # pluggy: fine
    assert plugin.calls == 1
    try:
        # vecaccel called impl.function(registry=registry): TypeError
        backends = vecaccel.list_backends()
    finally:
        pm.unregister(plugin)
    assert "serial" in backends and plugin.calls == 2


class FailingFactoryPlugin:
    @staticmethod
    def factory(env_fns, **options):
        raise LookupError(f"cannot build {len(env_fns)} envs with {sorted(options)}")

    @vecaccel.hookimpl
    def vecaccel_register_backends(self, registry) -> None:
        registry.add("review-failing", self.factory, "always fails")


def test_a_failing_backend_factory_reaches_the_caller_and_leaves_the_others_usable(
    fresh_plugin_manager: None,
):
    pm = vecaccel.get_plugin_manager()
    plugin = FailingFactoryPlugin()
    pm.register(plugin, name="review-failing-plugin")
    try:
        assert vecaccel.list_backends()["review-failing"]["plugin"] == "review-failing-plugin"
        with pytest.raises(LookupError, match=r"cannot build 2 envs with \['autoreset_mode'"):
            vecaccel.make_vec("CartPole-v1", 2, backend="review-failing")
        with pytest.raises(ValueError, match="review-failing") as info:
            vecaccel.make_vec("CartPole-v1", 2, backend="review-missing")
        assert "serial" in str(info.value)
        with vecaccel.make_vec("CartPole-v1", 2, backend="serial") as envs:
            assert envs.reset(seed=0)[0].shape == (2, 4)
    finally:
        pm.unregister(plugin)
    assert "review-failing" not in vecaccel.list_backends()


# ---------------------------------------------------------------------------------------------
# command line: tune and bench


def _run_cli(argv: list[str]) -> int:
    from vecaccel.cli import main

    try:
        return main(argv)
    except SystemExit as exc:  # argparse's usage errors
        return int(exc.code or 0)


def test_tune_with_no_configuration_to_try_is_an_error_not_a_crash(capsys):
    # hybrid needs fewer workers than envs: with one env there is nothing to try
    code = _run_cli(
        ["tune", "CartPole-v1", "--num-envs", "1", "--backends", "hybrid", "--seconds", "0.01"]
    )  # raised IndexError (trials[0] of an empty list)
    assert code in (1, 2)
    assert "best:" not in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ["tune", "NoSuchReviewEnv-v0", "--num-envs", "2", "--backends", "serial"],
        ["tune", "CartPole-v1", "--num-envs", "2", "--backends", "no-such-backend"],
        ["tune", "CartPole-v1", "--num-envs", "0", "--backends", "serial"],
    ],
    ids=["unknown-env", "unknown-backend", "zero-envs"],
)
def test_tune_usage_errors_exit_2_like_bench(argv, capsys):
    """``vecaccel bench`` turns bad arguments into exit code 2 and a one-line message; ``tune``
    raised a traceback (unknown env or backend) or reported a failed run as the best one
    (``--num-envs 0``: "best: serial with 0 envs", exit 0)."""
    code = _run_cli([*argv, "--seconds", "0.01"])
    assert code == 2
    assert "best:" not in capsys.readouterr().out


class BrokenStepEnv(gym.Env):
    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return np.zeros(2, np.float32), {}

    def step(self, action):
        raise RuntimeError("this env cannot step")


def test_tune_never_reports_a_failed_configuration_as_the_best(capsys):
    env_id = "VecaccelReviewBrokenStep-v0"
    gym.register(env_id, entry_point=BrokenStepEnv)
    try:
        code = _run_cli(
            ["tune", env_id, "--num-envs", "2", "--backends", "serial", "--seconds", "0.01"]
        )
    finally:
        del gym.registry[env_id]
    out = capsys.readouterr().out
    assert "failed: " in out  # the trial's own line
    assert "best:" not in out and "reproduce with" not in out
    assert code != 0


@pytest.mark.parametrize(
    "backend,options",
    [
        ("async", {"batch_size": 2, "num_workers": 1}),
        ("action_server", {"alternating": True, "num_workers": 1}),
    ],
    ids=["async-batch_size-2", "action_server-alternating"],
)
def test_bench_measures_backends_that_return_part_of_the_envs(backend, options):
    """``vecaccel bench`` sampled ``num_envs`` actions per step whatever the backend, so every
    configuration returning fewer envs per step failed (``-o async.batch_size=2``), and its
    rate would count ``num_envs`` steps per call instead of the batch returned."""
    from vecaccel.bench import run_benchmark

    results = run_benchmark(
        "CartPole-v1",
        [4],
        backends=[backend],
        peers=[],
        seconds=0.05,
        warmup=0.0,
        backend_options={backend: options},
    )
    (entry,) = results
    assert entry["status"] == "ok", entry["reason"]
    assert entry["steps_per_s"] > 0
