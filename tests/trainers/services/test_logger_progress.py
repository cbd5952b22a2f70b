"""The progress bar of a run from Python: shown where a person watches (a terminal), not in a
pipe or a log, unless the config says otherwise."""

from __future__ import annotations

import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios

import pytest

from vecaccel.trainers.services.logger import is_interactive

SCRIPT = """
import torch
torch.set_num_threads(1)
from vecaccel.trainers import PPO
agent = PPO("CartPole-v1", backend="serial", num_envs=2, num_steps=16, tensorboard=False, {extra})
agent.learn(64)
agent.close()
"""


def _stderr_of(extra: str, terminal: bool) -> str:
    """What a ``learn()`` from a script writes on stderr, stderr a terminal or a pipe."""
    command = [sys.executable, "-c", SCRIPT.format(extra=extra)]
    if not terminal:
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stderr
    parent, child = pty.openpty()
    # a terminal 100 columns wide (a new pseudo-terminal has none, and a bar fits in none)
    fcntl.ioctl(child, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=child)
    os.close(child)
    chunks = []
    while True:
        try:
            chunk = os.read(parent, 4096)
        except OSError:  # the terminal closed with the process
            break
        if not chunk:
            break
        chunks.append(chunk)
    os.close(parent)
    assert process.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode(errors="replace")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="opens a pseudo-terminal")
def test_learn_shows_progress_in_a_terminal_and_not_in_a_pipe():
    assert "100%|" in _stderr_of("", terminal=True)
    assert "100%|" not in _stderr_of("", terminal=False)


def test_the_config_decides_where_it_says_and_a_test_run_is_not_interactive():
    from vecaccel.trainers import PPO

    assert is_interactive() is False  # pytest captures stderr
    agent = PPO("CartPole-v1", backend="serial", num_envs=1)
    try:
        assert agent.config.progress is None and agent.progress is False
        agent.progress = True
        assert agent.progress is True and agent.config.progress is True
        agent.progress = None
        assert agent.progress is False
    finally:
        agent.close()
