"""Training on batched simulators: ``--vectorized`` (a Gymnasium ``vector_entry_point``, one
vector env per worker) and ``--env-source envpool`` (Atari frames from EnvPool with the ALE
route's preprocessing, or EnvPool's twins of the MuJoCo tasks), both ``NextStep`` autoreset."""

from __future__ import annotations

import csv
import importlib.util

import numpy as np
import pytest
import torch
from gymnasium.vector import AutoresetMode
from helpers import run_main

from vecaccel.trainers import DQN, PPO
from vecaccel.trainers.checkpoints.format import load_checkpoint
from vecaccel.trainers.envs.batched import (
    EntryPointVectorFn,
    batched_env_fn,
    envpool_mujoco_fn,
    envpool_task_id,
)
from vecaccel.trainers.envs.make import make_env_for_training

torch.set_num_threads(1)

pytestmark = pytest.mark.usefixtures("trainers_plugin")

HAS_ALE = importlib.util.find_spec("ale_py") is not None
HAS_ENVPOOL = importlib.util.find_spec("envpool") is not None
needs_envpool = pytest.mark.skipif(
    not HAS_ENVPOOL, reason="the EnvPool route needs envpool (pip install 'vecaccel[envpool]')"
)


def train(*argv: str) -> int:
    return run_main(["train", *argv, "--no-progress", "--torch-threads", "1"])


def test_help_shows_the_batched_and_backend_option_flags(capsys):
    assert run_main(["train", "ppo", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "--vectorized" in text and "vector_entry_point" in text
    assert "--env-source ENV_SOURCE" in text and "envpool" in text
    assert "--backend-option KEY=VALUE" in text and "num_shards=4" in text


def test_cli_trains_ppo_on_vectorized_cartpole_and_resumes_alike(tmp_path):
    run_dir = tmp_path / "run"
    argv = ["--env", "CartPole-v1", "--num-envs", "16", "--num-steps", "16", "--vectorized"]
    argv += ["--backend", "shm", "--num-workers", "2", "--run-dir", str(run_dir)]
    assert train("ppo", *argv, "--total-timesteps", "512") == 0
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["config"]["vectorized"] is True and state["global_step"] == 512
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    assert len(rows) > 1 and "charts/episodic_return" in rows[0]
    # the resumed run builds the same batched envs from the checkpoint's config
    assert train("ppo", "--resume", str(run_dir), "--total-timesteps", "768") == 0
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["config"]["vectorized"] is True and state["global_step"] == 768


def test_python_ppo_on_vectorized_cartpole_samples_next_step_slices(tmp_path):
    agent = PPO(
        "CartPole-v1",
        vectorized=True,
        backend="shm",
        num_workers=2,
        num_envs=8,
        num_steps=32,
        seed=3,
        torch_threads=1,
        run_dir=tmp_path,
        tensorboard=False,
    )
    try:
        assert agent.envs.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
        agent.learn(total_timesteps=8 * 32 * 2)
        assert agent.global_step == 512
        assert all(torch.isfinite(p).all() for p in agent.model.parameters())
    finally:
        agent.close()
    # random CartPole episodes end within 64 steps: their scores reached the metrics
    with open(tmp_path / "metrics.csv") as rows:
        returns = [row["charts/episodic_return"] for row in csv.DictReader(rows)]
    assert any(returns) and all(float(r) >= 1 for r in returns if r)


def test_vectorized_episodes_are_scored_from_the_vector_env_infos():
    envs = make_env_for_training("CartPole-v1", 4, backend="serial", seed=0, vectorized=True)
    try:
        assert envs.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
        envs.reset(seed=0)
        rewards = np.zeros(4)
        scores: list[float] = []
        pending = np.zeros(4, dtype=bool)  # NextStep: the step after an end is a reset step
        for _ in range(200):
            _, reward, terminated, truncated, infos = envs.step(np.ones(4, dtype=np.int64))
            rewards += np.where(pending, 0.0, reward)
            ended = (terminated | truncated) & ~pending
            if "episode" in infos:
                scores += list(infos["episode"]["r"][infos["_episode"]])
                np.testing.assert_array_equal(infos["_episode"], ended)
                np.testing.assert_allclose(infos["episode"]["r"][ended], rewards[ended])
            rewards[ended] = 0.0
            pending = ended
        assert scores and all(score >= 1 for score in scores)
    finally:
        envs.close()


def test_dqn_family_refuses_batched_sources_with_the_reason(capsys):
    for setting in ({"vectorized": True}, {"env_source": "envpool"}):
        with pytest.raises(ValueError, match="NextStep.*SameStep"):
            DQN(None, env_id="CartPole-v1", **setting)
    code = train("dqn", "--env", "CartPole-v1", "--vectorized", "--total-timesteps", "64")
    assert code == 2
    assert "hands its steps over as SameStep transitions" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--env", "Acrobot-v1", "--vectorized"], "has no vector_entry_point"),
        (["--env", "CartPole-v1", "--env-source", "envpol"], "env_source must be one of"),
        (
            ["--env", "pettingzoo.butterfly.pistonball_v6", "--vectorized"],
            "PettingZoo env",
        ),
    ],
)
def test_a_source_the_env_cannot_have_is_a_usage_error(tmp_path, capsys, argv, message):
    code = train("ppo", *argv, "--total-timesteps", "64", "--run-dir", str(tmp_path / "run"))
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "run" / "checkpoint.pt").exists()


def test_batched_env_fn_names_the_missing_piece():
    assert isinstance(batched_env_fn("CartPole-v1", None, True, "gymnasium"), EntryPointVectorFn)
    with pytest.raises(ValueError, match="env-source envpool"):
        batched_env_fn("PongNoFrameskip-v4", True, True, "gymnasium")
    with pytest.raises(ValueError, match="CartPole-v1 is neither"):
        batched_env_fn("CartPole-v1", False, True, "envpool")


def test_envpool_takes_the_mujoco_tasks_by_their_gymnasium_ids():
    if HAS_ENVPOOL:
        assert repr(batched_env_fn("Hopper-v5", None, True, "envpool")) == repr(
            envpool_mujoco_fn("Hopper-v5")
        )
    else:
        with pytest.raises(ValueError, match=r"EnvPool is not installed: pip install"):
            batched_env_fn("Hopper-v5", None, True, "envpool")


@pytest.mark.parametrize(
    ("env_id", "task"),
    [
        ("ALE/Pong-v5", "Pong-v5"),
        ("PongNoFrameskip-v4", "Pong-v5"),
        ("SpaceInvadersDeterministic-v4", "SpaceInvaders-v5"),
        ("ALE/MontezumaRevenge-v5", "MontezumaRevenge-v5"),
    ],
)
def test_envpool_task_ids_of_gymnasium_ale_ids(env_id, task):
    assert envpool_task_id(env_id) == task


def _play(env_id: str, env_source: str, steps: int, seed: int = 0) -> dict:
    """Random play on 4 envs: frames, rewards, ends (life losses in training) and the whole
    games' scores the envs report."""
    envs = make_env_for_training(
        env_id, 4, backend="shm", seed=seed, env_source=env_source, num_workers=2
    )
    try:
        obs, _ = envs.reset(seed=seed)
        first = obs.copy()
        rng = np.random.default_rng(seed)
        n = int(envs.single_action_space.n)
        rewards, ends, games = [], 0, []
        for _ in range(steps):
            obs, reward, terminated, truncated, infos = envs.step(rng.integers(0, n, 4))
            rewards.append(np.asarray(reward, dtype=np.float64))
            ends += int(np.sum(terminated | truncated))
            source = infos if "episode" in infos else infos.get("final_info", {})
            if "episode" in source:
                mask = np.asarray(source["_episode"])
                games += list(zip(source["episode"]["r"][mask], source["episode"]["l"][mask]))
        return {
            "space": (envs.single_observation_space, envs.single_action_space),
            "first": first,
            "obs": obs,
            "rewards": np.array(rewards),
            "ends": ends,
            "games": games,
        }
    finally:
        envs.close()


@pytest.mark.skipif(
    not HAS_ALE, reason="the ALE route needs ale-py (pip install 'vecaccel[atari]')"
)
@needs_envpool
def test_envpool_source_matches_the_ale_route_on_breakout():
    # Breakout: random play loses all five lives within a few hundred steps, so whole games
    # end inside the test; Pong's take a thousand
    ale = _play("ALE/Breakout-v5", "gymnasium", 400)
    pool = _play("ALE/Breakout-v5", "envpool", 400)
    assert ale["space"] == pool["space"]
    for route in (ale, pool):
        assert route["obs"].shape == (4, 4, 84, 84) and route["obs"].dtype == np.uint8
        # frame stacking from a reset: the first observation's four frames are one frame
        assert all((frames == frames[0]).all() for frames in route["first"])
        # clipped rewards in training; Breakout's bricks score 1 to 7
        assert set(np.unique(route["rewards"])) <= {0.0, 1.0}
        # grey levels of the same screen: the mean pixel within a few levels
    assert abs(float(ale["obs"].mean()) - float(pool["obs"].mean())) < 8.0
    for route in (ale, pool):
        assert route["games"], "no whole game ended in 400 steps"
        # a game is several lives: more ends (life-loss terminals) than games reported
        assert route["ends"] > len(route["games"])
        # true scores of whole games: a random Breakout game scores 0 to ~10
        assert all(0 <= score <= 15 for score, _ in route["games"])
    # a whole game lasts over 100 agent steps; the ALE route counts emulator frames (its
    # episode statistics sit under the frame skip of 4), EnvPool agent steps
    assert all(length >= 400 for _, length in ale["games"])
    assert all(100 <= length <= 400 for _, length in pool["games"])
    mean_ale = np.mean([score for score, _ in ale["games"]])
    mean_pool = np.mean([score for score, _ in pool["games"]])
    assert abs(mean_ale - mean_pool) < 3.0


@needs_envpool
def test_cli_trains_ppo_on_envpool_frames(tmp_path):
    state = _train_ppo_on_envpool(tmp_path / "run", "PongNoFrameskip-v4", 2, 16, 64)
    assert state["config"]["backend_options"] == {"num_workers": 2}


def _train_ppo_on_envpool(run_dir, env_id: str, num_envs: int, num_steps: int, total: int) -> dict:
    """``vecaccel train ppo`` on EnvPool's ``env_id`` in two ``shm`` workers, one epoch of two
    minibatches per update; returns the checkpoint, checked to be EnvPool's at ``total``."""
    argv = ["--env", env_id, "--env-source", "envpool", "--num-envs", str(num_envs)]
    argv += ["--num-steps", str(num_steps), "--num-minibatches", "2", "--update-epochs", "1"]
    argv += ["--backend", "shm", "--backend-option", "num_workers=2", "--run-dir", str(run_dir)]
    assert train("ppo", *argv, "--total-timesteps", str(total), "--checkpoint-every", "0") == 0
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["config"]["env_source"] == "envpool" and state["global_step"] == total
    return state


@needs_envpool
def test_envpool_mujoco_twins_match_gymnasium_s_envs():
    pytest.importorskip("mujoco")
    for env_id in ("Hopper-v5", "Walker2d-v5"):
        gym_route = _play_continuous(env_id, "gymnasium", 300)
        pool = _play_continuous(env_id, "envpool", 300)
        assert gym_route["shapes"] == pool["shapes"]
        for route in (gym_route, pool):
            # random play falls within a few dozen steps: terminations, scored episodes
            assert route["ends"] > 0 and route["episodes"]
            assert all(5 <= length <= 300 for _, length in route["episodes"])
        mean_gym = np.mean([score for score, _ in gym_route["episodes"]])
        mean_pool = np.mean([score for score, _ in pool["episodes"]])
        assert abs(mean_gym - mean_pool) < 0.5 * max(abs(mean_gym), 10.0), (mean_gym, mean_pool)


@needs_envpool
def test_envpool_mujoco_time_limit_is_a_truncation_after_1000_steps():
    envs = envpool_mujoco_fn("HalfCheetah-v5")(2)
    try:
        envs.reset(seed=0)
        for step in range(1, 1001):
            _, _, terminated, truncated, infos = envs.step(envs.action_space.sample())
            assert not terminated.any()
            assert truncated.all() == (step == 1000)
        assert infos["_episode"].all() and (infos["episode"]["l"] == 1000).all()
    finally:
        envs.close()


def _play_continuous(env_id: str, env_source: str, steps: int, seed: int = 0) -> dict:
    """Random play on 4 envs in 2 workers: the spaces' shapes, how many episodes ended, and
    the returns and lengths the envs report."""
    envs = make_env_for_training(
        env_id, 4, backend="shm", seed=seed, env_source=env_source, num_workers=2
    )
    try:
        envs.reset(seed=seed)
        space = envs.single_action_space
        rng = np.random.default_rng(seed)
        ends, episodes = 0, []
        for _ in range(steps):
            actions = rng.uniform(space.low, space.high, (4, *space.shape))
            _, _, terminated, truncated, infos = envs.step(actions.astype(space.dtype))
            ends += int(np.sum(terminated | truncated))
            source = infos if "episode" in infos else infos.get("final_info", {})
            if "episode" in source:
                mask = np.asarray(source["_episode"])
                episodes += list(zip(source["episode"]["r"][mask], source["episode"]["l"][mask]))
        shapes = (envs.single_observation_space.shape, envs.single_action_space.shape)
        return {"shapes": shapes, "ends": ends, "episodes": episodes}
    finally:
        envs.close()


@needs_envpool
def test_cli_trains_ppo_on_envpool_hopper_and_evals_it(tmp_path, capsys):
    pytest.importorskip("mujoco")
    run_dir = tmp_path / "run"
    state = _train_ppo_on_envpool(run_dir, "Hopper-v5", 4, 32, 256)
    # the preset's normalisation came with it, and eval plays with the saved statistics
    assert state["config"]["norm_obs"]
    capsys.readouterr()
    code = run_main(["eval", str(run_dir / "checkpoint.pt"), "--episodes", "1"])
    assert code == 0
    assert "ppo on Hopper-v5: 1 episodes" in capsys.readouterr().out
