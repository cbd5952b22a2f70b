"""EnvPool as a vector env function: the adapter against EnvPool alone, and EnvPool slices in
vecaccel's workers against one EnvPool of all the envs (EnvPool seeds env ``i`` with
``seed + i``, so slices reset with ``seed + start`` reproduce it)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from backend_matrix import options_for, select

envpool = pytest.importorskip(
    "envpool", reason="EnvPool is not installed (pip install 'vecaccel[envpool]', Linux only)"
)

import vecaccel  # noqa: E402
from vecaccel.adapters.envpool import EnvPoolVectorEnv, envpool_vector_fn  # noqa: E402

N = 8


def envpool_alone(task_id: str, num_envs: int, seed: int, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return envpool.make_gymnasium(task_id, num_envs=num_envs, seed=seed, **kwargs)


def test_adapter_steps_as_envpool_alone():
    adapter = EnvPoolVectorEnv("CartPole-v1", N)
    alone = envpool_alone("CartPole-v1", N, seed=4)
    rng = np.random.default_rng(0)
    try:
        obs, infos = adapter.reset(seed=4)
        np.testing.assert_array_equal(obs, alone.reset()[0])
        assert infos["_elapsed_step"].all() and "env_id" not in infos
        for _ in range(100):
            actions = rng.integers(0, 2, N)
            got, want = adapter.step(actions), alone.step(actions)
            for a, b in zip(got[:4], want[:4]):
                np.testing.assert_array_equal(a, b)
            np.testing.assert_array_equal(got[4]["elapsed_step"], want[4]["elapsed_step"])
    finally:
        adapter.close()
        alone.close()


def test_adapter_partial_reset_returns_every_env():
    adapter = EnvPoolVectorEnv("CartPole-v1", 4)
    try:
        before, _ = adapter.reset(seed=0)
        adapter.step(np.ones(4, dtype=np.int64))
        stepped = adapter.step(np.ones(4, dtype=np.int64))[0]
        mask = np.array([False, True, False, False])
        obs, infos = adapter.reset(options={"reset_mask": mask})
        np.testing.assert_array_equal(obs[~mask], stepped[~mask])
        assert not np.array_equal(obs[1], stepped[1])
        assert infos["_elapsed_step"].tolist() == mask.tolist()
        with pytest.raises(ValueError, match="no options but reset_mask"):
            adapter.reset(options={"other": 1})
    finally:
        adapter.close()


@pytest.mark.parametrize("backend", select(tensors=False))
def test_envpool_slices_equal_one_envpool_of_all_envs(backend):
    envs = vecaccel.make_vec(
        envpool_vector_fn("CartPole-v1", num_threads=1),
        N,
        backend=backend,
        vectorized=True,
        **options_for(backend),
    )
    alone = envpool_alone("CartPole-v1", N, seed=9)
    rng = np.random.default_rng(1)
    try:
        obs, infos = envs.reset(seed=9)
        ids = np.asarray(infos.get("env_id", np.arange(N)))
        np.testing.assert_array_equal(obs[np.argsort(ids)], alone.reset()[0])
        ended = 0
        for _ in range(150):
            actions = rng.integers(0, 2, N)
            obs, rew, term, trunc, infos = envs.step(actions[ids])
            want = alone.step(actions)
            ids = np.asarray(infos.get("env_id", np.arange(N)))
            order = np.argsort(ids)
            for got, expected in zip((obs, rew, term, trunc), want[:4]):
                np.testing.assert_array_equal(np.asarray(got)[order], expected)
            ended += int(want[2].sum())
        assert ended > 0
    finally:
        envs.close()
        alone.close()


def test_pong_slices_equal_one_envpool():
    envs = vecaccel.make_vec(
        envpool_vector_fn("Pong-v5", num_threads=1),
        4,
        backend="shm",
        num_workers=2,
        vectorized=True,
    )
    alone = envpool_alone("Pong-v5", 4, seed=3, num_threads=1)
    rng = np.random.default_rng(2)
    try:
        obs, _ = envs.reset(seed=3)
        assert obs.shape == (4, 4, 84, 84) and obs.dtype == np.uint8
        np.testing.assert_array_equal(obs, alone.reset()[0])
        for _ in range(20):
            actions = rng.integers(0, 6, 4)
            obs, rew, term, trunc, infos = envs.step(actions)
            want = alone.step(actions)
            np.testing.assert_array_equal(obs, want[0])
            np.testing.assert_array_equal(infos["lives"], want[4]["lives"])
    finally:
        envs.close()
        alone.close()


def test_envpool_vector_fn_refuses_vecaccels_own_options():
    with pytest.raises(ValueError, match="num_envs and batch_size are vecaccel's"):
        envpool_vector_fn("CartPole-v1", num_envs=4)


def test_episode_scores_are_whole_games_of_unclipped_rewards():
    """Pong with life-loss terminals and clipped rewards: the scores sum EnvPool's unclipped
    ``info["reward"]`` over whole games, as the ALE route's ``RecordEpisodeStatistics`` does."""
    fn = envpool_vector_fn(
        "Pong-v5",
        num_threads=1,
        episode_scores=True,
        reward_clip=True,
        episodic_life=True,
        max_episode_steps=300,
    )
    envs = fn(2)
    alone = envpool_alone(
        "Pong-v5",
        2,
        seed=0,
        num_threads=1,
        reward_clip=True,
        episodic_life=True,
        max_episode_steps=300,
    )
    try:
        envs.reset(seed=0)
        alone.reset()
        raw_returns = np.zeros(2)
        seen = []
        for _ in range(700):
            actions = np.zeros(2, dtype=np.int64)
            *_, infos = envs.step(actions)
            _, _, term, trunc, info = alone.step(actions)
            counted = info["elapsed_step"] > 0
            raw_returns += np.where(counted, info["reward"], 0.0)
            ended = (info["terminated"].astype(bool) | trunc) & counted
            np.testing.assert_array_equal(infos["_episode"], ended)
            for i in np.flatnonzero(ended):
                assert infos["episode"]["r"][i] == raw_returns[i]
                seen.append(raw_returns[i])
                raw_returns[i] = 0.0
        assert seen  # games ended (truncated at 300 steps)
    finally:
        envs.close()
        alone.close()
