"""The ``ray`` backend on one machine, loopback only: a simulated two-node cluster
(``ray.cluster_utils.Cluster``, both nodes at 127.0.0.1) inside a network namespace whose only
interface is ``lo`` where the machine allows it. One local Ray and one cluster serve the whole
module: starting Ray costs seconds, and every shard actor is a Ray worker process of its own."""

from __future__ import annotations

import functools
import os
import signal
import time

import gymnasium as gym
import numpy as np
import pytest

import vecaccel
from tests.support.helpers import assert_same
from tests.support.ray_cluster import (
    RAY_NODE_ARGS,
    connected_cluster,
    is_loopback,
    listening_addresses,
    loopback_ray,
)
from tests.support.toy_vector_envs import sync_info_cartpole
from vecaccel.testing import check_backend
from vecaccel.testing.contract_envs import make_dict_tuple
from vecaccel.testing.envs import CounterEnv, IntervalEnv, most_inside_at_once
from vecaccel.testing.leaks import descendants, wait_until

ray = pytest.importorskip("ray")

NODE_CPUS = 2
MODES = ["NextStep", "SameStep", "Disabled"]


@pytest.fixture(scope="module")
def loopback_net():
    """The module's network: a namespace with only ``lo`` (where allowed); Ray stats off, and
    no idle workers started for the first driver (each shard actor gets a worker of its own)."""
    with pytest.MonkeyPatch.context() as patch, loopback_ray() as isolated:
        patch.setenv("RAY_prestart_worker_first_driver", "0")
        yield isolated


@pytest.fixture(scope="module")
def cluster(loopback_net):
    """A head node and one more node, each with ``NODE_CPUS`` CPUs, this process connected."""
    with connected_cluster(2, NODE_CPUS) as cluster:
        yield cluster


def _worker_node(cluster):
    return [node for node in cluster.list_all_nodes() if node is not cluster.head_node][0]


def _two_idle_nodes(cluster) -> None:
    """Two nodes, their CPUs free (actors killed by a test before release them shortly after),
    so that ``SPREAD`` has both to choose from."""
    if len(cluster.list_all_nodes()) < 2:
        cluster.add_node(num_cpus=NODE_CPUS, **RAY_NODE_ARGS)
        cluster.wait_for_nodes()
    assert wait_until(lambda: ray.available_resources().get("CPU", 0) >= 2 * NODE_CPUS, 60)


def _dead(actor) -> bool:
    """Whether a call on ``actor`` fails because the actor is gone."""
    try:
        ray.get(actor.current_obs.remote(), timeout=30)
    except ray.exceptions.RayActorError:
        return True
    return False


def _dict_tuple_fns(num_envs: int) -> list:
    return [functools.partial(make_dict_tuple, 7, "rgb_array")] * num_envs


def test_local_ray_is_loopback_only_and_stopped_at_close(loopback_net):
    """With no address and no Ray running, the backend starts one bound to 127.0.0.1 that
    listens on loopback only, and stops it at close()."""
    assert not ray.is_initialized()
    handler = signal.getsignal(signal.SIGTERM)
    # one shard: its worker process listens as every other Ray worker would
    envs = vecaccel.make_vec("CartPole-v1", 4, backend="ray", num_shards=1, num_workers=1)
    try:
        assert ray.is_initialized()
        obs, _ = envs.reset(seed=0)
        assert obs.shape == (4, 4)
        listening = listening_addresses(descendants(os.getpid()) | {os.getpid()})
        assert listening, "found no Ray process listening"
        outside = {pid: a for pid, a in listening.items() if not all(map(is_loopback, a))}
        assert not outside, f"Ray listens beyond loopback: {outside}"
    finally:
        envs.close()
    envs.close()  # idempotent
    assert not ray.is_initialized()
    # ray.init replaced the SIGTERM handler while Ray ran; the caller's is back
    assert signal.getsignal(signal.SIGTERM) is handler


@pytest.mark.parametrize("mode", MODES)
def test_trajectories_equal_sync_vector_env(cluster, mode):
    """Shards on different nodes step exactly as ``SyncVectorEnv``: observations, rewards,
    flags and batched infos; returned arrays are not rewritten by the next step."""
    num_envs, backend = 6, ("shm" if mode == "NextStep" else "serial")
    _two_idle_nodes(cluster)
    envs = vecaccel.make_vec(
        _dict_tuple_fns(num_envs),
        backend="ray",
        autoreset_mode=mode,
        num_shards=2,
        num_workers=1,
        shard_backend=backend,
    )
    reference = gym.vector.SyncVectorEnv(_dict_tuple_fns(num_envs), autoreset_mode=mode)
    try:
        assert len(set(envs.shard_nodes)) == 2, envs.shard_nodes  # SPREAD
        assert envs.single_observation_space == reference.single_observation_space
        assert_same(envs.reset(seed=5), reference.reset(seed=5))
        envs.action_space.seed(1)
        kept = []
        for t in range(20):
            actions = envs.action_space.sample()
            result = envs.step(actions)
            assert_same(result, reference.step(actions))
            kept.append((result[0]["position"], result[0]["position"].copy()))
            if mode == "Disabled" and (result[2] | result[3]).any():
                mask = result[2] | result[3]
                assert_same(
                    envs.reset(options={"reset_mask": mask}),
                    reference.reset(options={"reset_mask": mask}),
                )
            if t == 10:
                mask = np.array([True, False, False, False, True, False])
                assert_same(
                    envs.reset(seed=9, options={"reset_mask": mask}),
                    reference.reset(seed=9, options={"reset_mask": mask}),
                )
        for returned, copy in kept:
            np.testing.assert_array_equal(returned, copy)
        assert envs.get_attr("value") == reference.get_attr("value")
        envs.set_attr("value", [1, 2, 3, 4, 5, 6])
        assert envs.call("add", 10) == (11, 12, 13, 14, 15, 16)
        assert envs.call_indices("add", [5, 0], 1) == (7, 2)
        if mode == "NextStep":
            frames = envs.render()
            assert len(frames) == num_envs and frames[0].ndim == 3
    finally:
        envs.close()
        reference.close()


def test_send_recv_returns_whole_shards_first_ready(cluster):
    """``batch_size`` envs at a time, in whole shards, the faster shard first."""
    slow = [functools.partial(CounterEnv, sleep_step=1, sleep_seconds=3.0)] * 2
    fast = [CounterEnv] * 2
    envs = vecaccel.make_vec(
        slow + fast, backend="ray", num_shards=2, batch_size=2, shard_backend="serial"
    )
    zeros = np.zeros(2, dtype=np.int64)
    try:
        obs, infos = envs.reset(seed=0)
        assert obs.shape == (2, 1) and infos["env_id"].tolist() == [0, 1]
        with pytest.raises(ValueError, match="whole shards"):
            envs.send(np.zeros(1, dtype=np.int64), [0])
        envs.send(zeros, infos["env_id"])  # shard 0's first step sleeps
        obs, rew, term, trunc, infos = envs.recv()  # shard 1, ready since the reset
        assert infos["env_id"].tolist() == [2, 3] and obs[:, 0].tolist() == [0, 0]
        envs.send(zeros, [2, 3])
        obs, rew, term, trunc, infos = envs.recv()  # shard 1 again, long before shard 0
        assert infos["env_id"].tolist() == [2, 3] and obs[:, 0].tolist() == [1, 1]
        obs, rew, term, trunc, infos = envs.recv()  # shard 0, once its step is done
        assert infos["env_id"].tolist() == [0, 1] and obs[:, 0].tolist() == [1, 1]
        obs, rew, term, trunc, infos = envs.step(zeros)  # the batch held: shard 0
        assert infos["env_id"].tolist() == [0, 1] and obs[:, 0].tolist() == [2, 2]
    finally:
        envs.close()


def test_env_error_names_envs_and_carries_traceback(cluster):
    fns = [CounterEnv] * 3 + [functools.partial(CounterEnv, fault_step=2)]
    envs = vecaccel.make_vec(fns, backend="ray", num_shards=2, num_workers=1)
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        with pytest.raises(vecaccel.WorkerError, match="shard 1") as caught:
            envs.step(np.zeros(4, dtype=np.int64))
        assert caught.value.env_indices == (3,)
        assert caught.value.original_type == "ValueError"
        assert "boom in step 2" in caught.value.remote_traceback
        with pytest.raises(vecaccel.WorkerError, match="reset") as caught:
            envs.step(np.zeros(4, dtype=np.int64))  # until a reset, the failed env is refused
        assert caught.value.env_indices == (3,)
        envs.reset(seed=1)  # the failed env starts over
        envs.step(np.zeros(4, dtype=np.int64))
    finally:
        envs.close()


def test_stuck_shard_times_out(cluster):
    fns = [CounterEnv] * 2 + [functools.partial(CounterEnv, sleep_step=2, sleep_seconds=60)] * 2
    envs = vecaccel.make_vec(
        fns, backend="ray", num_shards=2, shard_backend="serial", step_timeout_s=1.0
    )
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        began = time.monotonic()
        with pytest.raises(vecaccel.WorkerError, match="overran step_timeout_s") as caught:
            envs.step(np.zeros(4, dtype=np.int64))
        assert time.monotonic() - began < 30  # a bound against a hang, not a speed figure
        assert caught.value.env_indices == (2, 3)
        assert "node 127.0.0.1" in str(caught.value)
        with pytest.raises(vecaccel.WorkerError, match="cannot continue"):
            envs.step(np.zeros(4, dtype=np.int64))
    finally:
        envs.close()


def test_sampler_sb3_adapter_and_same_step_infos_over_ray(cluster):
    """The sampler and the SB3 adapter over Ray. What the shards send comes out of Ray's object
    store read-only; every array the caller gets, ``infos["final_obs"]`` included, is writable
    and its own, as on ``shm``."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("stable_baselines3")
    from vecaccel.adapters.sb3 import to_sb3

    # one shard: its arrays reach the caller straight from the object store, never concatenated
    # with another's, the strictest case for the writable check
    envs = vecaccel.make_vec(
        "CartPole-v1",
        4,
        backend="ray",
        num_shards=1,
        shard_backend="serial",
        autoreset_mode="SameStep",
    )
    try:

        def policy(obs):
            return torch.zeros(obs.shape[0], dtype=torch.int64), {}

        batch = vecaccel.Sampler(envs, policy, horizon=8, seed=0).collect()
        assert batch.obs.shape == (8, 4, 4) and batch.rewards.shape == (8, 4)
        venv = to_sb3(envs)
        venv.seed(0)
        venv.reset()
        ended = []
        # pushing left, every CartPole ends within 8 to 10 steps
        for _ in range(20):
            obs, rewards, dones, infos = venv.step(np.zeros(4, dtype=np.int64))
            ended += [info for info, done in zip(infos, dones) if done]
        assert ended and all(info["terminal_observation"].shape == (4,) for info in ended)

        envs.reset(seed=0)
        finals = []
        for _ in range(20):
            obs, rewards, terminated, truncated, infos = envs.step(np.zeros(4, dtype=np.int64))
            assert all(a.flags.writeable for a in (obs, rewards, terminated, truncated))
            if "final_obs" in infos:
                finals += [x for x, ended in zip(infos["final_obs"], infos["_final_obs"]) if ended]
        assert finals, "no episode ended"
        for final in finals:
            assert final.flags.writeable and final.flags.owndata, final.flags
            final += 1.0  # a caller normalising in place
    finally:
        envs.close()


def test_ppo_and_dqn_train_over_ray(cluster):
    torch = pytest.importorskip("torch")
    from vecaccel.trainers import DQN, PPO

    torch.set_num_threads(1)
    _two_idle_nodes(cluster)
    agent = PPO(
        "CartPole-v1",
        backend="ray",
        num_envs=4,
        num_steps=8,
        num_workers=1,
        backend_options={"num_shards": 1},  # training over Ray, not the shards, is checked here
        seed=0,
        torch_threads=1,
        tensorboard=False,
    )
    try:
        agent.learn(total_timesteps=64)
    finally:
        agent.close()
    assert agent.global_step == 64
    agent = DQN(
        "CartPole-v1",
        backend="ray",
        num_envs=4,
        num_workers=1,
        backend_options={"num_shards": 1},
        learning_starts=32,
        batch_size=16,
        buffer_size=256,
        hidden_sizes=(16,),
        progress=False,
        tensorboard=False,
    )
    try:
        agent.learn(96)
    finally:
        agent.close()
    assert agent.global_step == 96


def test_the_backend_kit_passes_over_ray_returning_the_first_ready_shards(cluster):
    """The kit in the mode that returns whole shards as they finish, env by env against
    ``SyncVectorEnv``; lock-step batches over Ray are compared with it in
    ``test_trajectories_equal_sync_vector_env``, in every autoreset mode."""
    _two_idle_nodes(cluster)
    check_backend("ray", num_shards=2, shard_backend="serial", batch_size=2)


def test_train_command_passes_backend_options_to_ray(cluster, tmp_path, capsys, trainers_plugin):
    pytest.importorskip("torch")
    from helpers import run_main

    from vecaccel.trainers.checkpoints.format import load_checkpoint

    _two_idle_nodes(cluster)
    run_dir = tmp_path / "run"
    argv = ["train", "ppo", "--env", "CartPole-v1", "--backend", "ray", "--num-envs", "4"]
    # num_shards=1: not the default of one shard per node, so the option is seen to arrive
    argv += ["--num-steps", "8", "--num-workers", "1", "--backend-option", "num_shards=1"]
    argv += ["--no-progress", "--torch-threads", "1", "--no-tensorboard"]
    assert run_main([*argv, "--total-timesteps", "32", "--run-dir", str(run_dir)]) == 0
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["config"]["backend_options"] == {"num_shards": 1}
    assert state["global_step"] == 32
    capsys.readouterr()
    bad = [*argv, "--backend-option", "num_shard=2", "--total-timesteps", "8"]
    assert run_main([*bad, "--run-dir", str(tmp_path / "bad")]) == 2
    assert "did you mean 'num_shards'?" in capsys.readouterr().err


def test_max_concurrency_caps_the_envs_of_every_shard_together(cluster):
    """A cap of 3 over 2 shards: shares of 2 and 1, so at most 3 envs inside at once, whatever
    each shard's workers."""
    fns = [functools.partial(IntervalEnv, 0.004)] * 8
    envs = vecaccel.make_vec(
        fns, backend="ray", num_shards=2, num_workers=4, max_concurrency=3, shard_backend="shm"
    )
    intervals: list[tuple[float, float]] = []
    by_shard: list[list[tuple[float, float]]] = [[], []]

    def take(infos) -> None:
        for i in np.flatnonzero(infos["_entered"]):  # every env, in index order
            interval = (float(infos["entered"][i]), float(infos["left"][i]))
            intervals.append(interval)
            by_shard[i // 4].append(interval)

    try:
        _, infos = envs.reset(seed=0)
        take(infos)
        for _ in range(12):
            *_, infos = envs.step(np.zeros(8, dtype=np.int64))
            take(infos)
    finally:
        envs.close()
    assert len(intervals) == 8 * 13
    assert most_inside_at_once(by_shard[0]) <= 2 and most_inside_at_once(by_shard[1]) <= 1
    assert most_inside_at_once(intervals) <= 3
    with pytest.raises(ValueError, match="max_concurrency=1 is below num_shards=2"):
        vecaccel.make_vec(fns, backend="ray", num_shards=2, max_concurrency=1)


def test_max_concurrency_needs_a_shard_backend_that_takes_it() -> None:
    with pytest.raises(ValueError, match="shard_backend='serial' takes no max_concurrency"):
        vecaccel.make_vec([CounterEnv] * 2, backend="ray", max_concurrency=2,
                          shard_backend="serial")  # fmt: skip
    with pytest.raises(ValueError, match="max_concurrency is given twice"):
        vecaccel.make_vec([CounterEnv] * 2, backend="ray", max_concurrency=2,
                          shard_options={"max_concurrency": 1})  # fmt: skip


@pytest.mark.parametrize(("mode", "shard_backend"), [("NextStep", "shm"), ("SameStep", "serial")])
def test_ray_shards_of_slices_equal_one_sync_vector_env(cluster, mode, shard_backend):
    """Vectorized slices: each shard's local backend builds one vector env per worker from the
    shard's block of slice env functions; together they step as one ``SyncVectorEnv``."""
    n = 8
    fn = functools.partial(sync_info_cartpole, mode=mode)
    envs = vecaccel.make_vec(
        fn,
        n,
        backend="ray",
        vectorized=True,
        autoreset_mode=mode,
        num_shards=2,
        shard_backend=shard_backend,
        num_workers=1,
    )
    alone = sync_info_cartpole(n, mode)
    rng = np.random.default_rng(0)
    try:
        obs, _ = envs.reset(seed=7)
        np.testing.assert_array_equal(obs, alone.reset(seed=7)[0])
        for _ in range(30):  # about 9 episodes end: autoresets in every slice
            actions = rng.integers(0, 2, n)
            got, want = envs.step(actions), alone.step(actions)
            for a, b in zip(got[:4], want[:4]):
                np.testing.assert_array_equal(a, b)
            assert_same(got[4], want[4])
    finally:
        envs.close()
        alone.close()


# Every Ray error of a shard call takes one path to ``"raise"``'s WorkerError, so a removed node
# is raised as a killed actor is; it is lost and restarted in ``restart-remove_node``. That case
# runs last in the module: nothing after it needs the node back.
@pytest.mark.parametrize(
    ("policy", "fault"),
    [("raise", "kill_actor"), ("restart", "kill_actor"), ("restart", "remove_node")],
)
def test_lost_shard(cluster, fault, policy):
    """A killed actor or a removed node: raised naming the shard under ``"raise"``; under
    ``"restart"`` the shard starts again elsewhere, its episodes end truncated."""
    _two_idle_nodes(cluster)
    envs = vecaccel.make_vec(
        "CartPole-v1",
        4,
        backend="ray",
        num_shards=2,
        num_workers=1,
        on_worker_failure=policy,
        step_timeout_s=60,
    )
    actors = envs.shard_actors
    try:
        envs.reset(seed=0)
        envs.step(np.zeros(4, dtype=np.int64))
        worker_node = _worker_node(cluster)
        lost = [k for k, node in enumerate(envs.shard_nodes) if worker_node.node_id[:8] in node]
        assert len(lost) == 1, envs.shard_nodes
        lost_envs = [2 * lost[0], 2 * lost[0] + 1]
        if fault == "kill_actor":
            ray.kill(envs.shard_actors[lost[0]], no_restart=True)
            # the kill is asynchronous: a step sent before the actor is gone still completes
            assert wait_until(lambda: _dead(envs.shard_actors[lost[0]]), 60, interval=0.1)
        else:
            cluster.remove_node(worker_node)
        if policy == "raise":
            with pytest.raises(vecaccel.WorkerError, match=f"shard {lost[0]}") as caught:
                envs.step(np.zeros(4, dtype=np.int64))
            assert list(caught.value.env_indices) == lost_envs
            return
        obs, rew, term, trunc, infos = envs.step(np.zeros(4, dtype=np.int64))
        assert (
            trunc[lost_envs].all() and not trunc[[i for i in range(4) if i not in lost_envs]].any()
        )
        assert infos["worker_restarted"][lost_envs].all()
        assert envs.failures == 1
        obs, rew, term, trunc, infos = envs.step(np.zeros(4, dtype=np.int64))
        assert (rew[lost_envs] == 0).all() and not trunc[lost_envs].any()  # NextStep's reset
        for _ in range(3):
            envs.step(np.zeros(4, dtype=np.int64))
    finally:
        envs.close()
    # close() leaves no actor and no placement group behind
    assert all(_dead(actor) for actor in actors)
    assert all(pg["state"] == "REMOVED" for pg in ray.util.placement_group_table().values())
