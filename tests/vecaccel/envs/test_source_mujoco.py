"""Gymnasium's MuJoCo envs as a source: their ids in make_vec and the trainers, in the caller
and in workers under every start method, and the extra named where mujoco is missing."""

from __future__ import annotations

import sys

import gymnasium as gym
import numpy as np
import pytest

import vecaccel
from vecaccel.envs.unknown_ids import missing_package_message, uses_mujoco

pytest.importorskip("mujoco")

#: the locomotion tasks of the learning benchmark: id -> (observation size, action size)
LOCOMOTION = {
    "HalfCheetah-v5": (17, 6),
    "Hopper-v5": (11, 3),
    "Walker2d-v5": (17, 6),
    "Ant-v5": (105, 8),
    "Humanoid-v5": (348, 17),
}
EXTRA = "pip install 'vecaccel[mujoco]'"


def alone(env_id: str, num_envs: int, seed: int) -> tuple[list[gym.Env], np.ndarray]:
    """``num_envs`` envs made and reset as ``make_vec`` seeds them (env ``i`` with ``seed + i``)."""
    envs = [gym.make(env_id) for _ in range(num_envs)]
    return envs, np.stack([env.reset(seed=seed + i)[0] for i, env in enumerate(envs)])


def steps_as_alone(envs, env_id: str, seed: int, steps: int = 5) -> None:
    """``envs`` reset with ``seed`` and stepped with random actions give what the same envs
    made one by one give, step for step."""
    twins, expected = alone(env_id, envs.num_envs, seed)
    try:
        obs, _ = envs.reset(seed=seed)
        np.testing.assert_array_equal(obs, expected)
        envs.single_action_space.seed(seed)
        for _ in range(steps):
            # the envs' own dtype (float32): the env casts nothing, so neither side rounds
            actions = np.stack([envs.single_action_space.sample() for _ in twins])
            obs, rewards, terminated, truncated, _ = envs.step(actions)
            results = [twin.step(action) for twin, action in zip(twins, actions)]
            np.testing.assert_array_equal(obs, np.stack([result[0] for result in results]))
            np.testing.assert_array_equal(rewards, [result[1] for result in results])
            np.testing.assert_array_equal(terminated, [result[2] for result in results])
    finally:
        for twin in twins:
            twin.close()


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_ids_work_in_workers_under_every_start_method(context, no_leaks):
    """Fresh interpreters (spawn, forkserver) make Gymnasium's MuJoCo envs as forked workers
    do, and their physics steps as the same envs stepped alone in the caller."""
    envs = vecaccel.make_vec("Hopper-v5", 4, backend="shm", num_workers=2, context=context)
    try:
        assert envs.single_observation_space.shape == (11,)
        steps_as_alone(envs, "Hopper-v5", seed=3)
    finally:
        envs.close()


@pytest.mark.parametrize("env_id", sorted(LOCOMOTION))
def test_every_locomotion_task_steps_as_gymnasium_alone(env_id):
    observation_size, action_size = LOCOMOTION[env_id]
    envs = vecaccel.make_vec(env_id, 2, backend="shm", num_workers=2)
    try:
        assert envs.single_observation_space.shape == (observation_size,)
        assert envs.single_action_space.shape == (action_size,)
        assert envs.observation_space.dtype == np.float64
        steps_as_alone(envs, env_id, seed=11, steps=3)
    finally:
        envs.close()


def test_mujoco_ids_are_told_apart_without_importing_mujoco():
    assert all(uses_mujoco(env_id) for env_id in LOCOMOTION)
    assert not uses_mujoco("CartPole-v1") and not uses_mujoco("NoSuchEnv-v0")
    assert missing_package_message("Hopper-v5") is None  # installed here
    told = missing_package_message("Ant-v5", installed=lambda module: module != "mujoco")
    assert told is not None and told.endswith(EXTRA)
    assert missing_package_message("CartPole-v1", installed=lambda module: False) is None


@pytest.fixture
def mujoco_hidden(monkeypatch):
    """This interpreter as one without mujoco: ``import mujoco`` fails and
    ``importlib.util.find_spec("mujoco")`` answers None, as where it was never installed."""
    monkeypatch.setitem(sys.modules, "mujoco", None)
    with pytest.raises(ImportError):
        import mujoco  # noqa: F401


@pytest.mark.parametrize("backend", ["shm", "serial"])
def test_without_mujoco_make_vec_names_the_extra_in_the_caller(mujoco_hidden, backend, no_leaks):
    """The caller refuses the id before any env is made: Gymnasium's MuJoCo ids are registered
    whether or not mujoco is installed, and without the check each worker would fail instead."""
    with pytest.raises(gym.error.DependencyNotInstalled) as raised:
        vecaccel.make_vec("HalfCheetah-v5", 2, backend=backend)
    assert str(raised.value) == (
        "HalfCheetah-v5 is one of Gymnasium's MuJoCo envs and needs the 'mujoco' package, which "
        f"is not installed: {EXTRA}"
    )


def test_without_mujoco_train_and_eval_name_the_extra_in_one_line(mujoco_hidden, tmp_path, capsys):
    pytest.importorskip("torch")
    from vecaccel.cli import main
    from vecaccel.trainers import PPO

    code = main(
        ["train", "ppo", "--env", "Walker2d-v5", "--total-timesteps", "64", "--backend", "shm",
         "--run-dir", str(tmp_path / "run"), "--no-progress", "--device", "cpu"]
    )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("error: Walker2d-v5 is one of Gymnasium's MuJoCo envs") and EXTRA in err
    assert not (tmp_path / "run").exists()
    # a checkpoint of a MuJoCo run, read where mujoco is missing: the spaces come from the file
    space = gym.spaces.Box(-np.inf, np.inf, (17,), np.float64)
    actions = gym.spaces.Box(-1.0, 1.0, (6,), np.float32)
    agent = PPO(None, env_id="Walker2d-v5", observation_space=space, action_space=actions,
                device="cpu", tensorboard=False)  # fmt: skip
    agent.save(tmp_path / "walker.pt")
    assert main(["eval", str(tmp_path / "walker.pt"), "--episodes", "1"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and EXTRA in err, err


def test_train_and_eval_on_the_command_line(tmp_path, capsys):
    """``vecaccel train`` in spawned workers (which import everything anew; the other start
    methods are ``test_ids_work_in_workers_under_every_start_method``'s), then ``vecaccel eval``."""
    pytest.importorskip("torch")
    from vecaccel.cli import main

    run_dir = tmp_path / "run"
    code = main(
        ["train", "ppo", "--env", "HalfCheetah-v5", "--total-timesteps", "128", "--num-envs",
         "2", "--num-steps", "64", "--backend", "shm", "--backend-option", "context=spawn",
         "--run-dir", str(run_dir), "--no-progress", "--no-tensorboard", "--device", "cpu"]
    )  # fmt: skip
    assert code == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "1"]) == 0
    # HalfCheetah never terminates: its one episode runs to the time limit's 1,000 steps
    out = capsys.readouterr().out
    assert "ppo on HalfCheetah-v5: 1 episodes" in out and "mean length 1000.0" in out, out
