"""``vecaccel eval --stochastic`` samples for every algorithm, and says how it acted."""

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
