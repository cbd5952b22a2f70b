"""``vecaccel eval --stochastic`` samples for every algorithm, and says how it acted; an agent
trained with normalised observations is evaluated with its statistics, which stay as they are."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from vecaccel.cli import main
from vecaccel.trainers.config import registry

torch.set_num_threads(1)

pytestmark = pytest.mark.usefixtures("trainers_plugin")

FIXTURES = Path(__file__).parents[2] / "data" / "checkpoints" / "version2"


def evaluate(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    assert main(["eval", *argv, "--episodes", "4"]) == 0
    return capsys.readouterr().out.strip().splitlines()[-1]


@pytest.mark.parametrize("algo", registry.names())
def test_stochastic_evaluation_samples(algo: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The fixtures' checkpoints predate ``--epsilon``; the DQN family's have eval_epsilon 0,
    which a stochastic evaluation replaces by 0.05."""
    checkpoint = str(FIXTURES / algo)
    greedy = evaluate(capsys, checkpoint)
    assert greedy.endswith("(deterministic)") and greedy == evaluate(capsys, checkpoint)
    sampled = evaluate(capsys, checkpoint, "--stochastic")
    if algo in ("a2c", "ppo"):
        assert sampled.endswith("(stochastic: actions sampled from the policy)")
    else:
        assert sampled.endswith("(stochastic: ε-greedy, ε=0.05)")
        # every action random: the episodes are not the greedy ones
        uniform = evaluate(capsys, checkpoint, "--stochastic", "--epsilon", "1")
        assert uniform.endswith("(stochastic: ε-greedy, ε=1)")
        assert _numbers(uniform) != _numbers(greedy)


def test_sampled_episodes_differ_from_greedy_ones(capsys: pytest.CaptureFixture[str]) -> None:
    checkpoint = str(FIXTURES / "ppo")
    assert _numbers(evaluate(capsys, checkpoint, "--stochastic")) != _numbers(
        evaluate(capsys, checkpoint)
    )


def test_epsilon_must_be_a_probability(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["eval", str(FIXTURES / "dqn"), "--stochastic", "--epsilon", "1.5"])
    assert "must be from 0 to 1" in capsys.readouterr().err


def test_eval_normalises_with_the_saved_statistics_and_counts_nothing(tmp_path, capsys) -> None:
    import gymnasium as gym
    import numpy as np

    from vecaccel.trainers import PPO
    from vecaccel.trainers.cli.evaluate import evaluate_agent

    agent = PPO("Pendulum-v1", backend="serial", num_envs=2, num_steps=64, norm_obs=True,
                norm_reward=True, torch_threads=1, seed=0)  # fmt: skip
    agent.learn(256)
    agent.save(tmp_path / "run" / "checkpoint.pt")
    agent.close()
    loaded = PPO.load(tmp_path / "run")
    statistics = [loaded.normalizer.obs.data.copy(), loaded.normalizer.returns.data.copy()]
    returns, _ = evaluate_agent(loaded, "Pendulum-v1", episodes=2, seed=0)

    def play(normalize: bool) -> list[float]:
        env, totals = gym.make("Pendulum-v1"), []
        for episode in range(2):
            obs, _ = env.reset(seed=episode)
            total, done = 0.0, False
            while not done:
                batch = obs[None]
                if normalize:
                    batch = loaded.normalizer.normalize_obs(batch)
                action = loaded.act_for_predict(batch, deterministic=True)[0]
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                done = terminated or truncated
            totals.append(total)
        env.close()
        return totals

    assert returns == play(normalize=True) and returns != play(normalize=False)
    # frozen: the observations evaluated on are not counted, and no reward is scaled
    np.testing.assert_array_equal(loaded.normalizer.obs.data, statistics[0])
    np.testing.assert_array_equal(loaded.normalizer.returns.data, statistics[1])
    line = evaluate(capsys, str(tmp_path / "run"), "--seed", "0")
    mean = np.mean(evaluate_agent(PPO.load(tmp_path / "run"), "Pendulum-v1", episodes=4)[0])
    assert f"return {mean:.2f} " in line


def _numbers(line: str) -> list[str]:
    return re.findall(r"-?\d+\.\d+", line)


def test_a_minatar_video_shows_the_game(tmp_path, capsys: pytest.CaptureFixture[str]) -> None:
    """MinAtar renders float frames in [0, 1] of 10x10 cells; the video holds them on 0..255,
    enlarged to 160x160 pixels."""
    pytest.importorskip("minatar")
    from moviepy import VideoFileClip

    from vecaccel.trainers import PPO

    agent = PPO("MinAtar/Breakout-v1", backend="serial", num_envs=2, num_steps=4,
                num_minibatches=1, update_epochs=1, torch_threads=1, seed=0)  # fmt: skip
    agent.learn(8)
    agent.save(tmp_path / "run" / "checkpoint.pt")
    agent.close()
    video = tmp_path / "breakout.mp4"
    assert main(["eval", str(tmp_path / "run"), "--episodes", "1", "--video", str(video)]) == 0
    out, err = capsys.readouterr()
    assert f"video: {video}" in out and "Warning" not in err
    clip = VideoFileClip(str(video))
    try:
        frames = list(clip.iter_frames())
    finally:
        clip.close()
    assert frames and frames[0].shape == (160, 160, 3)
    # every frame shows the paddle, the ball and the bricks in their colours
    assert all(frame.max() > 150 for frame in frames)
    assert min(int((frame.max(axis=2) > 60).sum()) for frame in frames) >= 10 * 16 * 16
