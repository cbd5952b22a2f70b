"""Data-parallel training on gloo ranks started in this test: a K-rank step against one big batch.

Each test starts a gloo process group of two ranks itself (two ``multiprocessing`` processes on
the loopback address, one torch thread each) and calls the trainers' functions directly on fixed
data, so that a K-rank step can be compared with one big-batch step in this process: the updates
of both families, the normalisation statistics the ranks merge, the ranks' seeds and random
streams across a resume, and an error on one rank.
``SCALE_OUT_START_METHOD`` picks their start method (default ``fork``, the quicker to start).
"""

from __future__ import annotations

import argparse
import gc
import multiprocessing
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

torch.set_num_threads(1)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


START_METHOD = os.environ.get("SCALE_OUT_START_METHOD", "fork")

RANK_TIMEOUT_S = 60.0


def _rank_entry(
    target: Callable[..., Any],
    rank: int,
    world: int,
    port: int,
    results: Any,
    args: tuple,
    timeout_s: float,
) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_WORLD_SIZE=str(world),
        VECACCEL_DIST_TIMEOUT=str(timeout_s),
        OMP_NUM_THREADS="1",
    )
    torch.set_num_threads(1)
    try:
        payload = target(rank, world, *args)
        results.put((rank, True, payload))
    except BaseException:  # noqa: BLE001 - every outcome of a rank goes back to the test
        results.put((rank, False, traceback.format_exc()))
    finally:
        gc.collect()  # DDP models go before their process group
        from vecaccel.trainers.services import distributed

        try:
            distributed.cleanup()
        except Exception:  # noqa: BLE001 - a rank that failed may have no group left
            pass


def _run_ranks(
    target: Callable[..., Any],
    *args: Any,
    world: int = 2,
    method: str | None = None,
    timeout_s: float = 30.0,
    daemon: bool = True,
) -> dict[int, Any]:
    """Run ``target(rank, world, *args)`` on ``world`` gloo ranks; every rank's return value.
    ``daemon=False`` for ranks that start processes of their own (killed here all the same)."""
    ctx = multiprocessing.get_context(method or START_METHOD)
    results = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(
            target=_rank_entry,
            args=(target, r, world, port, results, args, timeout_s),
            daemon=daemon,
        )
        for r in range(world)
    ]
    for proc in procs:
        proc.start()
    out: dict[int, Any] = {}
    errors: list[str] = []
    try:
        deadline = time.monotonic() + RANK_TIMEOUT_S
        while len(out) + len(errors) < world:
            try:
                rank, ok, payload = results.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                errors.append("timed out waiting for the ranks")
                break
            if ok:
                out[rank] = payload
            else:
                errors.append(f"rank {rank}:\n{payload}")
    finally:
        for proc in procs:
            proc.join(timeout=15)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        results.close()
        results.cancel_join_thread()
    assert not errors, "\n".join(errors)
    return out


# -- fixed data --------------------------------------------------------------------------------

OBS_DIM = 4


def _spaces() -> tuple[Any, Any]:
    import gymnasium as gym

    return gym.spaces.Box(-5.0, 5.0, (OBS_DIM,), np.float32), gym.spaces.Discrete(2)


def _rollout(T: int, B: int, seed: int) -> Any:
    """A fixed ``[T, B]`` rollout of random data (no truncations)."""
    from vecaccel.sampler import SampleBatch

    g = torch.Generator().manual_seed(seed)
    return SampleBatch(
        obs=torch.randn(T, B, OBS_DIM, generator=g),
        actions=torch.randint(0, 2, (T, B), generator=g),
        rewards=torch.rand(T, B, generator=g),
        terminated=torch.rand(T, B, generator=g) < 0.15,
        truncated=torch.zeros(T, B, dtype=torch.bool),
        valid=torch.ones(T, B, dtype=torch.bool),
        extras={
            "value": torch.randn(T, B, generator=g),
            "log_prob": -torch.rand(T, B, generator=g),
            "max_q": torch.randn(T, B, generator=g),
        },
        next_obs=torch.randn(B, OBS_DIM, generator=g),
        final_obs=torch.zeros(0, OBS_DIM),
        final_index=torch.zeros(0, 2, dtype=torch.int64),
    )


def _env_slice(batch: Any, lo: int, hi: int) -> Any:
    """The envs ``lo:hi`` of a rollout (what one rank of several would have collected)."""
    return type(batch)(
        obs=batch.obs[:, lo:hi],
        actions=batch.actions[:, lo:hi],
        rewards=batch.rewards[:, lo:hi],
        terminated=batch.terminated[:, lo:hi],
        truncated=batch.truncated[:, lo:hi],
        valid=batch.valid[:, lo:hi],
        extras={key: value[:, lo:hi] for key, value in batch.extras.items()},
        next_obs=batch.next_obs[lo:hi],
        final_obs=batch.final_obs,
        final_index=batch.final_index,
    )


def _replay_sample(n: int, seed: int) -> Any:
    from vecaccel.trainers.replay.buffer import ReplaySample

    rng = np.random.default_rng(seed)
    return ReplaySample(
        obs=rng.normal(size=(n, OBS_DIM)).astype(np.float32),
        action=rng.integers(0, 2, n),
        reward=rng.random(n).astype(np.float32),
        next_obs=rng.normal(size=(n, OBS_DIM)).astype(np.float32),
        discount=np.full(n, 0.99, np.float32),
        indices=np.arange(n),
        weights=np.ones(n, np.float32),
    )


def _rows(sample: Any, lo: int, hi: int) -> Any:
    return type(sample)(*[field[lo:hi] for field in sample])


def _flat(params: Any) -> np.ndarray:
    return torch.cat([p.detach().reshape(-1) for p in params]).numpy().copy()


def _flat_grad(params: Any) -> np.ndarray:
    return torch.cat([p.grad.detach().reshape(-1) for p in params]).numpy().copy()


# -- A2C / PPO / PQN: a 2-rank update equals one big-batch update ---------------------------

T_STEPS, ENVS = 4, 4

ON_POLICY = {
    "a2c": dict(norm_adv=False, lr_scaling="linear", base_batch_size=T_STEPS * ENVS),
    "ppo": dict(
        norm_adv=False,
        num_minibatches=1,
        update_epochs=2,
        lr_scaling="sqrt",
        base_batch_size=T_STEPS * ENVS // 2,
    ),
    # one minibatch: the rows in order on every rank, as in the big batch
    "pqn": dict(
        num_minibatches=1,
        update_epochs=2,
        hidden_sizes=(16,),
        lr_scaling="sqrt",
        base_batch_size=T_STEPS * ENVS // 2,
    ),
}


def _on_policy_agent(algo: str, num_envs: int, **extra: Any) -> Any:
    from vecaccel.trainers import A2C, PPO, PQN

    obs_space, act_space = _spaces()
    cls = {"a2c": A2C, "ppo": PPO, "pqn": PQN}[algo]
    return cls(
        None,
        env_id="CartPole-v1",
        observation_space=obs_space,
        action_space=act_space,
        num_envs=num_envs,
        num_steps=T_STEPS,
        torch_threads=1,
        seed=5,
        tensorboard=False,
        **ON_POLICY[algo],
        **extra,
    )


def _on_policy_rank(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    per_rank = ENVS // world
    for algo in ON_POLICY:
        agent = _on_policy_agent(algo, per_rank)
        init = _flat(agent.model.parameters())
        grads = []
        for i in range(2):
            part = _env_slice(_rollout(T_STEPS, ENVS, i), rank * per_rank, (rank + 1) * per_rank)
            agent.update(part, 1.0)
            grads.append(_flat_grad(agent.model.parameters()))
        out[algo] = dict(
            init=init,
            params=_flat(agent.model.parameters()),
            grads=grads,
            lr_scale=agent.lr_scale,
            batch_size=agent.batch_size,
        )
        del agent
        gc.collect()
    return out


@pytest.fixture(scope="module")
def on_policy_ranks() -> tuple[dict[int, Any], dict[str, Any]]:
    """Each rank's results, and the one-process reference agents, built first: the forked ranks
    inherit what building them imported (torch's optimisers import ``torch._dynamo``)."""
    references = {algo: _on_policy_agent(algo, ENVS) for algo in ON_POLICY}
    return _run_ranks(_on_policy_rank), references


@pytest.mark.parametrize("algo", sorted(ON_POLICY))
def test_two_rank_on_policy_update_equals_one_big_batch_update(algo, on_policy_ranks) -> None:
    ranks, references = on_policy_ranks
    first, second = ranks[0][algo], ranks[1][algo]
    # every rank starts from rank 0's parameters and stays identical
    np.testing.assert_array_equal(first["init"], second["init"])
    np.testing.assert_array_equal(first["params"], second["params"])
    # the effective batch is the sum over ranks, and the lr scaling rule applies to it
    assert first["batch_size"] == T_STEPS * ENVS
    reference = references[algo]
    assert first["lr_scale"] == pytest.approx(reference.lr_scale)
    assert first["lr_scale"] == pytest.approx(1.0 if algo == "a2c" else 2**0.5)
    np.testing.assert_array_equal(first["init"], _flat(reference.model.parameters()))
    for i in range(2):
        reference.update(_rollout(T_STEPS, ENVS, i), 1.0)
        np.testing.assert_allclose(
            first["grads"][i], _flat_grad(reference.model.parameters()), rtol=1e-4, atol=1e-6
        )
    np.testing.assert_allclose(
        first["params"], _flat(reference.model.parameters()), rtol=1e-5, atol=1e-6
    )


# -- DQN family: the same, and the target network -------------------------------------------

DQN_BATCH = 8

DQN_FAMILY = ("DQN", "C51")


def _dqn_agent(name: str, batch_size: int, **extra: Any) -> Any:
    from vecaccel.trainers.algos import dqn

    obs_space, act_space = _spaces()
    agent = getattr(dqn, name)(
        env=None,
        batch_size=batch_size,
        hidden_sizes=(16,),
        torch_threads=1,
        seed=5,
        tensorboard=False,
        progress=False,
        lr_scaling="linear",
        base_batch_size=DQN_BATCH,
        **extra,
    )
    agent.observation_space, agent.action_space = obs_space, act_space
    agent.env_id = "CartPole-v1"
    agent.build_networks()
    return agent


def _dqn_rank(rank: int, world: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in DQN_FAMILY:
        agent = _dqn_agent(name, DQN_BATCH)
        entry: dict[str, Any] = dict(
            online=_flat(agent.q_network.parameters()),
            target=_flat(agent.target_network.parameters()),
            lr_scale=agent.lr_scale,
        )
        sample = _rows(
            _replay_sample(DQN_BATCH * world, 0), rank * DQN_BATCH, (rank + 1) * DQN_BATCH
        )
        agent.update(sample)
        entry["grad"] = _flat_grad(agent.q_network.parameters())
        entry["after"] = _flat(agent.q_network.parameters())
        out[name] = entry
        del agent
        gc.collect()
    return out


@pytest.fixture(scope="module")
def dqn_ranks() -> tuple[dict[int, Any], dict[str, Any]]:
    """Each rank's results, and the one-process reference agents, built first (see
    ``on_policy_ranks``)."""
    references = {name: _dqn_agent(name, 2 * DQN_BATCH) for name in DQN_FAMILY}
    return _run_ranks(_dqn_rank), references


@pytest.mark.parametrize("name", DQN_FAMILY)
def test_dqn_target_network_is_identical_on_every_rank(name, dqn_ranks) -> None:
    first, second = dqn_ranks[0][0][name], dqn_ranks[0][1][name]
    np.testing.assert_array_equal(first["online"], second["online"])
    # the target network must start as the (broadcast) online network on every rank, or the
    # ranks compute their TD targets with different networks
    np.testing.assert_array_equal(first["target"], second["target"])
    np.testing.assert_array_equal(second["target"], second["online"])


@pytest.mark.parametrize("name", DQN_FAMILY)
def test_two_rank_dqn_step_equals_one_big_batch_step(name, dqn_ranks) -> None:
    ranks, references = dqn_ranks
    first, second = ranks[0][name], ranks[1][name]
    np.testing.assert_array_equal(first["after"], second["after"])
    reference = references[name]
    assert first["lr_scale"] == pytest.approx(2.0) == pytest.approx(reference.lr_scale)
    np.testing.assert_array_equal(first["online"], _flat(reference.q_network.parameters()))
    reference.update(_replay_sample(2 * DQN_BATCH, 0))
    np.testing.assert_allclose(
        first["grad"], _flat_grad(reference.q_network.parameters()), rtol=1e-4, atol=1e-6
    )


# -- normalisation: the ranks' moments merged --------------------------------------------------

#: each rank's observation batches (of different sizes and spreads) and rewards, per sync
NORMALIZATION_SIZES = {0: [(5, 1.0), (3, 4.0)], 1: [(2, 10.0), (7, 0.5)]}


def _normalization_data(rank: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(100 + rank)
    return [
        (rng.normal(rank * 3.0, spread, (n, OBS_DIM)), rng.normal(0, spread, n))
        for n, spread in NORMALIZATION_SIZES[rank]
    ]


def _normalization_rank(rank: int, world: int) -> list[list[float]]:
    from vecaccel.trainers.nets.normalization import NormalizationSettings, Normalizer
    from vecaccel.trainers.services import distributed

    distributed.init_from_env("cpu")
    settings = NormalizationSettings(norm_obs=True, norm_reward=True, gamma=0.9)
    normalizer = Normalizer(settings, _spaces()[0], "defer")
    for obs, rewards in _normalization_data(rank):
        normalizer.observe_obs(obs)
        for reward in rewards:  # one env, one step after another
            normalizer.scale_rewards(np.array([reward]), np.array([False]))
        normalizer.sync()
    return [normalizer.obs.data.tolist(), normalizer.returns.data.tolist()]


def _discounted(rewards: np.ndarray, gamma: float) -> list[float]:
    returns, out = 0.0, []
    for reward in rewards:
        returns = returns * gamma + reward
        out.append(returns)
    return out


def test_synced_statistics_are_identical_on_every_rank_and_those_of_all_samples() -> None:
    """Two ranks observe batches of different sizes and sync after each: both hold the same
    statistics, bit for bit, and they are NumPy's over every rank's samples."""
    results = _run_ranks(_normalization_rank)
    assert results[0] == results[1]
    obs = np.concatenate([o for rank in (0, 1) for o, _ in _normalization_data(rank)])
    returns = np.array(
        [
            value
            for rank in (0, 1)
            for value in _discounted(np.concatenate([r for _, r in _normalization_data(rank)]), 0.9)
        ]
    )
    statistics, return_statistics = np.array(results[0][0]), np.array(results[0][1])
    np.testing.assert_allclose(statistics[:OBS_DIM], obs.mean(0), rtol=1e-10)
    np.testing.assert_allclose(statistics[OBS_DIM:-1], obs.var(0), rtol=1e-10)
    assert statistics[-1] == len(obs) and return_statistics[-1] == len(returns)
    np.testing.assert_allclose(return_statistics[:2], [returns.mean(), returns.var()], rtol=1e-10)


# -- seeds and random streams per rank --------------------------------------------------------


def _next_draws() -> dict[str, list[float]]:
    """What this process's torch and NumPy streams draw next, the streams left where they were."""
    from vecaccel.trainers.services.seeding import get_rng_state, set_rng_state

    state = get_rng_state()
    draws = dict(torch=torch.rand(8).tolist(), np=np.random.random(4).tolist())
    set_rng_state(state)
    return draws


def _resume_rank(rank: int, world: int, run_dir: str) -> dict[str, Any]:
    from vecaccel.trainers import PPO
    from vecaccel.trainers.services import distributed

    common = dict(
        num_envs=1,
        num_steps=8,
        num_minibatches=2,
        update_epochs=1,
        backend="serial",
        torch_threads=1,
        seed=3,
        tensorboard=False,
        checkpoint_every=0,
    )
    agent = PPO("CartPole-v1", run_dir=run_dir, **common)
    fresh = dict(seed=agent.config.seed, draws=torch.rand(8).tolist())
    agent.learn(32)
    # what this rank's streams draw next, from the state the final checkpoint recorded
    continued = _next_draws()
    agent.close()
    del agent
    gc.collect()
    distributed.barrier()  # rank 0 has written the checkpoint
    resumed = PPO.load(run_dir, env="CartPole-v1", run_dir=run_dir)
    out = dict(
        continued=continued,
        fresh=fresh,
        resumed_seed=resumed.config.seed,
        resumed_draws=torch.rand(8).tolist(),
        resumed_perm=torch.randperm(16).tolist(),
        resumed_np=np.random.random(4).tolist(),
    )
    resumed.close()
    del resumed
    return out


def test_ranks_keep_distinct_random_streams_after_a_resume(tmp_path: Path) -> None:
    out = _run_ranks(_resume_rank, str(tmp_path))
    # a new run: rank 0 keeps the seed, rank 1 gets another, and their draws differ
    assert out[0]["fresh"]["seed"] == 3
    assert out[1]["fresh"]["seed"] != 3
    assert out[0]["fresh"]["draws"] != out[1]["fresh"]["draws"]
    # a run resumed on as many ranks: still a seed per rank ...
    assert out[0]["resumed_seed"] == 3 and out[1]["resumed_seed"] == out[1]["fresh"]["seed"]
    # ... and its own random streams (action sampling, minibatch order), not rank 0's on all
    assert out[0]["resumed_draws"] != out[1]["resumed_draws"]
    assert out[0]["resumed_perm"] != out[1]["resumed_perm"]
    assert out[0]["resumed_np"] != out[1]["resumed_np"]
    # ... which are the streams each rank had when the checkpoint was written: the checkpoint
    # holds every rank's states, so the resumed run continues each rank exactly
    for rank in (0, 1):
        assert out[rank]["resumed_draws"] == out[rank]["continued"]["torch"], rank
        assert out[rank]["resumed_np"] == out[rank]["continued"]["np"], rank


def _identity_rank(rank: int, world: int) -> dict[str, Any]:
    from vecaccel.trainers.services import distributed

    assert distributed.init_from_env("cpu")
    if rank == 0:  # 3 episodes of mean return 10, loss 1
        metrics = {"charts/episodic_return": 10.0, "charts/episodes": 3.0, "losses/x": 1.0}
        episodes = 3.0
    else:  # 1 episode of return 30, loss 3
        metrics = {"charts/episodic_return": 30.0, "charts/episodes": 1.0, "losses/x": 3.0}
        episodes = 1.0
    reduced = distributed.reduce_metrics(
        metrics, weights={"charts/episodic_return": episodes}, sums=("charts/episodes",)
    )
    # a rank without episodes: its None counts for nothing
    partial = distributed.reduce_metrics(
        {"charts/episodic_return": None if rank == 0 else 8.0, "charts/episodes": None},
        weights={"charts/episodic_return": 0.0 if rank == 0 else 2.0},
        sums=("charts/episodes",),
    )
    return dict(
        rank=distributed.rank(),
        world=distributed.world_size(),
        main=distributed.is_main_process(),
        seeds=[distributed.rank_seed(s) for s in (0, 1, 7)],
        reduced=reduced,
        partial=partial,
        mean=distributed.all_reduce_mean([float(rank), 2.0 * rank]),
        any_=distributed.all_reduce_any(rank == 1),
        none_=distributed.all_reduce_any(False),
    )


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_rank_identity_seeds_and_metric_reduction(method: str) -> None:
    out = _run_ranks(_identity_rank, method=method)
    assert [out[r]["rank"] for r in (0, 1)] == [0, 1]
    assert out[0]["world"] == out[1]["world"] == 2
    assert out[0]["main"] and not out[1]["main"]
    # rank 0 keeps the seed, rank 1 gets distinct derived ones
    assert out[0]["seeds"] == [0, 1, 7]
    assert all(a != b for a, b in zip(out[0]["seeds"], out[1]["seeds"]))
    assert len(set(out[1]["seeds"])) == 3
    for rank in (0, 1):
        reduced = out[rank]["reduced"]
        # returns weighted by episodes, episodes summed, losses averaged
        assert reduced["charts/episodic_return"] == pytest.approx((3 * 10 + 30) / 4)
        assert reduced["charts/episodes"] == 4
        assert reduced["losses/x"] == pytest.approx(2.0)
        assert out[rank]["partial"]["charts/episodic_return"] == pytest.approx(8.0)
        assert out[rank]["partial"]["charts/episodes"] is None
        assert out[rank]["mean"] == pytest.approx([0.5, 1.0])
        assert out[rank]["any_"] is True and out[rank]["none_"] is False


def _dqn_resume_rank(rank: int, world: int, run_dir: str) -> dict[str, Any]:
    from vecaccel.trainers.algos.dqn import DQN
    from vecaccel.trainers.services import distributed

    common = dict(
        backend="serial", hidden_sizes=(16,), batch_size=8, buffer_size=400, learning_starts=32,
        torch_threads=1, seed=3, tensorboard=False, progress=False, checkpoint_replay=True,
    )  # fmt: skip
    agent = DQN("CartPole-v1", run_dir=run_dir, **common)
    agent.learn(96)
    continued = _next_draws()
    agent.close()
    del agent
    gc.collect()
    distributed.barrier()  # rank 0 has written the checkpoint
    resumed = DQN.load(run_dir, env="CartPole-v1", run_dir=run_dir)
    out = dict(continued=continued, torch=torch.rand(8).tolist(), np=np.random.random(4).tolist())
    resumed.close()
    del resumed
    return out


def test_dqn_ranks_continue_their_own_random_streams_after_a_resume(tmp_path: Path) -> None:
    """With replay checkpoints every rank's global RNG states are saved with its buffer: a run
    resumed on as many ranks continues each rank's torch and NumPy streams exactly."""
    out = _run_ranks(_dqn_resume_rank, str(tmp_path))
    assert out[0]["torch"] != out[1]["torch"]
    for rank in (0, 1):
        assert out[rank]["torch"] == out[rank]["continued"]["torch"], rank
        assert out[rank]["np"] == out[rank]["continued"]["np"], rank


# -- an error on one rank ---------------------------------------------------------------------

#: the collective timeout of the next test: a rank that waits this long failed the test
SHORT_TIMEOUT_S = 6.0


def _failing_rank(rank: int, world: int) -> dict[str, Any]:
    """``vecaccel train`` on two ranks where rank 1 raises (as a rank whose sampler died raises
    CollectorError) while rank 0 waits in a collective of the next update."""
    import argparse

    import torch.distributed as dist

    from vecaccel.trainers.cli import commands as cli
    from vecaccel.trainers.services import distributed

    assert distributed.init_from_env("cpu")

    def train(args: argparse.Namespace) -> int:
        if rank == 1:
            time.sleep(0.5)
            raise RuntimeError("the asynchronous collector process of rank 1 died")
        grads = torch.ones(16)
        dist.all_reduce(grads)  # rank 1 never comes
        return 0

    cli._train = train  # this rank process only
    try:
        code = cli.train_command(argparse.Namespace(nproc=None))
        return {"error": None, "code": code}
    except Exception as exc:  # noqa: BLE001 - the error is the result
        return {"error": f"{type(exc).__name__}: {exc}"}


def test_an_error_on_one_rank_fails_the_others_at_once_not_at_the_timeout() -> None:
    out = _run_ranks(_failing_rank, timeout_s=SHORT_TIMEOUT_S)
    assert "collector process of rank 1 died" in (out[1]["error"] or "")
    # rank 0 must learn that its peer is gone (gloo: "Connection closed by peer") when rank 1
    # leaves, not sit in its all-reduce until VECACCEL_DIST_TIMEOUT (120 s by default) runs
    # out while rank 1 waits in a barrier that no other rank will enter
    error = out[0]["error"] or ""
    assert error, out[0]
    assert "Timed out" not in error and "timeout" not in error.lower(), error


def _async_on_policy_failing_rank(rank: int, world: int, run_dir: str) -> dict[str, Any]:
    """Async PPO on two ranks; rank 1's second update raises, so rank 0's collective fails."""
    from vecaccel.trainers import PPO, AsyncRunner
    from vecaccel.trainers.services import distributed

    agent = PPO(
        None, env_id="CartPole-v1", num_envs=2, num_steps=8, num_minibatches=1, update_epochs=1,
        torch_threads=1, seed=4, tensorboard=False, progress=False, checkpoint_every=0,
        run_dir=run_dir,
    )  # fmt: skip
    update, calls = agent.update, []

    def failing_update(batch: Any, progress_remaining: float) -> dict[str, float]:
        calls.append(1)
        if rank == 1 and len(calls) == 2:
            raise RuntimeError("rank 1 failed in its second update")
        return update(batch, progress_remaining)

    agent.update = failing_update
    try:
        AsyncRunner(agent).run(2_000, context="fork")
        return {"error": None}
    except Exception as exc:  # noqa: BLE001 - the error is the result
        del agent, update
        gc.collect()
        distributed.cleanup(barrier=False)  # as `vecaccel train` leaves after an error
        return {"error": f"{type(exc).__name__}: {exc}"}


def test_async_on_policy_error_on_one_rank_writes_no_final_checkpoint(tmp_path: Path) -> None:
    """After an error on several ranks rank 0 may hold an update its peers never finished; as
    async DQN does, the run keeps its last checkpoint (here: none) rather than write that."""
    out = _run_ranks(
        _async_on_policy_failing_rank, str(tmp_path), timeout_s=SHORT_TIMEOUT_S, daemon=False
    )
    assert "rank 1 failed" in (out[1]["error"] or ""), out[1]
    assert out[0]["error"], out[0]
    assert not (tmp_path / "checkpoint.pt").exists(), "a checkpoint was written after the error"
