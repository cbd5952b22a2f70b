"""The trainers and their command line, as a PyTorch/CleanRL/SB3 user meets them.

Unit checks of the math against hand-computed values, and the command line with tiny budgets
(serial envs, one torch thread). Several docstrings describe what the code did before the fix
that each test holds it to (a review in session 9 found those defects).
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pytest
import torch

import vecaccel
import vecaccel.trainers.cli as trainers_cli
from vecaccel import get_plugin_manager
from vecaccel.cli import main
from vecaccel.sampler import SampleBatch
from vecaccel.trainers import A2C, C51, DQN, PPO
from vecaccel.trainers.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from vecaccel.trainers.models import NatureCNN
from vecaccel.trainers.replay import ReplayBuffer, ReplaySample

torch.set_num_threads(1)

CARTPOLE_OBS = gym.spaces.Box(-np.inf, np.inf, (4,), np.float32)
PENDULUM_OBS = gym.spaces.Box(-8.0, 8.0, (3,), np.float32)
PENDULUM_ACT = gym.spaces.Box(-2.0, 2.0, (1,), np.float32)
QUIET = ["--no-progress", "--no-tensorboard"]


@pytest.fixture(autouse=True)
def trainers_plugin():
    """Register the trainers' commands unless DEFAULT_PLUGINS already does."""
    pm = get_plugin_manager()
    registered_here = not pm.is_registered(trainers_cli)
    if registered_here:
        pm.register(trainers_cli, name="vecaccel.trainers.cli")
    yield
    if registered_here:
        pm.unregister(trainers_cli)


def run_cli(argv: list[str]) -> int:
    """The exit code of ``vecaccel ARGV``; an exception escaping ``main`` fails the test."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code or 0)
    except Exception as exc:  # noqa: BLE001 - the point is that none should escape
        pytest.fail(f"`vecaccel {' '.join(argv)}` raised {type(exc).__name__}: {exc}")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """Untrained checkpoints (a run directory each) of PPO on CartPole, PPO on Pendulum and DQN
    on CartPole, written through the Python API."""
    root = tmp_path_factory.mktemp("checkpoints")
    ppo = PPO(
        None,
        env_id="CartPole-v1",
        observation_space=CARTPOLE_OBS,
        action_space=gym.spaces.Discrete(2),
        backend="serial",
        num_envs=2,
        num_steps=4,
        torch_threads=1,
    )
    ppo.save(root / "ppo" / "checkpoint.pt")
    pendulum = PPO(
        None,
        env_id="Pendulum-v1",
        observation_space=PENDULUM_OBS,
        action_space=PENDULUM_ACT,
        backend="serial",
        num_envs=2,
        num_steps=4,
        torch_threads=1,
    )
    pendulum.save(root / "pendulum" / "checkpoint.pt")
    dqn = DQN("CartPole-v1", device="cpu", progress=False, tensorboard=False, torch_threads=1)
    dqn.save(root / "dqn" / "checkpoint.pt")
    dqn.close()
    return root


# -- command line: usage errors ---------------------------------------------------------------

TINY_PPO = ["--env", "CartPole-v1", "--backend", "serial", "--num-envs", "2", "--num-steps", "4"]


@pytest.mark.parametrize(
    "argv",
    [
        ["ppo", *TINY_PPO, "--lr-scaling", "bogus", "--total-steps", "8"],
        ["ppo", *TINY_PPO, "--activation", "bogus", "--total-steps", "8"],
        ["ppo", "--env", "CartPole-v1", "--backend", "nosuch", "--total-steps", "8"],
        [
            "ppo",
            "--env",
            "CartPole-v1",
            "--backend",
            "serial",
            "--num-envs",
            "0",
            "--total-steps",
            "8",
        ],
        ["ppo", *TINY_PPO, "--num-minibatches", "0", "--total-steps", "8"],
        ["ppo", *TINY_PPO, "--total-steps", "-5"],
        ["ppo", "--env", "NoSuchEnv-v9", "--backend", "serial", "--total-steps", "8"],
        ["dqn", "--env", "Pendulum-v1", "--total-steps", "8"],
        ["dqn", "--env", "CartPole-v1", "--loss", "bogus", "--total-steps", "8"],
    ],  # fmt: skip
    ids=[
        "lr-scaling",
        "activation",
        "backend",
        "num-envs-0",
        "num-minibatches-0",
        "negative-total-steps",
        "unknown-env",
        "dqn-on-box-actions",
        "dqn-loss",
    ],
)
def test_cli_bad_arguments_are_usage_errors(argv, tmp_path, capsys):
    """A bad value on the command line is a usage error: exit code 2 and a one-line message on
    stderr, not a Python traceback (exit 1) -- or, for a negative budget, a silent success."""
    code = run_cli(["train", *argv, "--run-dir", str(tmp_path / "run"), *QUIET,
                    "--torch-threads", "1"])  # fmt: skip
    assert code == 2
    assert "error" in capsys.readouterr().err.lower()


@pytest.mark.parametrize(
    "algo, source",
    [("a2c", "ppo"), ("dqn", "ppo"), ("ppo", "dqn"), ("c51", "dqn")],
    ids=["a2c-resumes-ppo", "dqn-resumes-ppo", "ppo-resumes-dqn", "c51-resumes-dqn"],
)
def test_cli_resume_of_another_algorithms_run_is_a_usage_error(
    algo, source, checkpoints, tmp_path, capsys
):
    """``vecaccel train ALGO --resume DIR`` where DIR holds another algorithm's run must say so
    (exit 2), not raise (CheckpointError, KeyError) or go on training the other algorithm under
    this one's name (C51 resuming a plain DQN run trains plain DQN)."""
    code = run_cli(["train", algo, "--resume", str(checkpoints / source), "--total-steps", "8",
                    "--run-dir", str(tmp_path / "run"), *QUIET])  # fmt: skip
    assert code == 2
    assert "error" in capsys.readouterr().err.lower()


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_cli_resume_on_an_env_with_other_spaces_is_a_usage_error(
    algo, checkpoints, tmp_path, capsys
):
    """``--resume DIR --env Acrobot-v1`` for a CartPole run: the network cannot act in Acrobot
    (6 observations, 3 actions). PPO silently ignores ``--env`` and trains CartPole again
    (exit 0); DQN raises a ValueError traceback. Expected: exit 2 with a message."""
    code = run_cli(["train", algo, "--resume", str(checkpoints / algo), "--env", "Acrobot-v1",
                    "--total-steps", "8", "--run-dir", str(tmp_path / "run"), *QUIET])  # fmt: skip
    assert code == 2
    assert "error" in capsys.readouterr().err.lower()


def test_load_with_an_env_of_other_spaces_is_refused(checkpoints):
    """``PPO.load(path, env="Acrobot-v1")`` documents ``env`` as the env to continue training on,
    but an id is ignored: the agent builds the checkpoint's CartPole instead. An env the saved
    network cannot act in must be refused."""
    try:
        agent = PPO.load(checkpoints / "ppo", env="Acrobot-v1", backend="serial")
    except (ValueError, CheckpointError):
        return
    env_id = agent.config.env_id
    agent.close()
    pytest.fail(f"loaded onto Acrobot-v1 without complaint; the agent trains on {env_id}")


@pytest.mark.parametrize(
    "extra", [["--env", "CartPole-v1"], ["--episodes", "0"]], ids=["other-env", "zero-episodes"]
)
def test_cli_eval_bad_arguments_are_usage_errors(extra, checkpoints, capsys):
    """``vecaccel eval`` of a Pendulum agent with ``--env CartPole-v1`` raises an IndexError from
    the network, and ``--episodes 0`` a ValueError from ``np.min``; both should be exit 2."""
    code = run_cli(["eval", str(checkpoints / "pendulum"), *extra])
    assert code == 2
    assert "error" in capsys.readouterr().err.lower()


def test_cli_resume_of_an_unfinished_dqn_run_finishes_its_budget(tmp_path, capsys):
    """``--total-steps`` says: "with --resume: ... default there: the budget the run was started
    with", and PPO/A2C do so; the DQN family answers "error: pass --total-steps" (exit 2) although
    its checkpoint records the run's budget (``loop["horizon"]``) and ``learn()`` finishes it."""
    run_dir = tmp_path / "dqn"
    agent = DQN("CartPole-v1", learning_starts=32, batch_size=8, buffer_size=300,
                replay_ratio=1.0, run_dir=str(run_dir), progress=False, tensorboard=False,
                torch_threads=1, device="cpu", seed=0)  # fmt: skip
    agent.learn(160, callback=lambda a: a.global_step < 80)  # stopped half way: a checkpoint
    agent.close()
    assert load_checkpoint(run_dir / "checkpoint.pt")["global_step"] == 80
    code = run_cli(["train", "dqn", "--resume", str(run_dir), *QUIET])
    assert code == 0, capsys.readouterr().err
    assert load_checkpoint(run_dir / "checkpoint.pt")["global_step"] == 160


# -- checkpoints ------------------------------------------------------------------------------


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_load_on_cpu_of_a_checkpoint_trained_on_cuda(algo, checkpoints, tmp_path):
    """A checkpoint written by a run with ``device="cuda"`` (here: the CartPole checkpoint with
    its recorded device changed, as such a run records it) cannot be loaded on a machine
    without CUDA: ``load`` maps the tensors to the CPU but then builds the network on the
    recorded device ("Torch not compiled with CUDA enabled"). SB3's ``load`` uses
    ``device="auto"``; the trainers should fall back to a device that exists."""
    state = load_checkpoint(checkpoints / algo / "checkpoint.pt")
    state["config"]["device"] = "cuda:0"
    path = save_checkpoint(tmp_path / "checkpoint.pt", state)
    cls = PPO if algo == "ppo" else DQN
    agent = cls.load(path)
    actions, _ = agent.predict(np.zeros(4, dtype=np.float32), deterministic=True)
    assert int(actions) in (0, 1)


# -- continuous actions -----------------------------------------------------------------------


def _pendulum_agent(mean: float, log_std: float) -> PPO:
    agent = PPO(None, env_id="Pendulum-v1", observation_space=PENDULUM_OBS,
                action_space=PENDULUM_ACT, backend="serial", torch_threads=1)  # fmt: skip
    with torch.no_grad():
        agent.model.actor_head.weight.zero_()
        agent.model.actor_head.bias.fill_(mean)
        agent.model.log_std.fill_(log_std)
    return agent


def test_predict_clips_box_actions_to_the_action_space():
    """SB3's ``predict`` clips Box actions to the action space; vecaccel's returns the raw
    Gaussian mean (here 10 for Pendulum's [-2, 2]) and raw samples."""
    agent = _pendulum_agent(mean=10.0, log_std=2.0)
    obs = np.zeros((64, 3), dtype=np.float32)
    for deterministic in (True, False):
        actions, _ = agent.predict(obs, deterministic=deterministic)
        assert actions.shape == (64, 1)
        assert np.all(actions >= -2.0) and np.all(actions <= 2.0), (deterministic, actions.max())


_SEEN_ACTIONS: list[np.ndarray] = []


class _BoundedActionEnv(gym.Env):
    """Actions in [-1, 1]; records every action it is given (a physics env that does not clip)."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)

    def __init__(self) -> None:
        self.t = 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        _SEEN_ACTIONS.append(np.array(action, dtype=np.float64))
        self.t += 1
        return np.zeros(2, np.float32), -float(np.square(action).sum()), False, self.t >= 5, {}


def test_sampled_box_actions_reach_the_env_clipped_to_its_bounds():
    """CleanRL (``ClipAction``) and SB3 (``np.clip`` before ``env.step``) hand the env actions
    within its Box, while the buffer keeps the unclipped sample for the log-probability.
    vecaccel steps the env with the raw Gaussian sample: with std e^1 most actions are outside
    [-1, 1], so an env that does not clip (or charges a control cost on the action) sees them."""
    _SEEN_ACTIONS.clear()
    envs = vecaccel.make_vec([_BoundedActionEnv] * 2, backend="serial", autoreset_mode="SameStep")
    agent = PPO(envs, backend="serial", num_envs=2, num_steps=8, update_epochs=1,
                torch_threads=1, seed=0)  # fmt: skip
    with torch.no_grad():
        agent.model.log_std.fill_(1.0)
    try:
        agent.learn(16)
    finally:
        envs.close()
    seen = np.concatenate(_SEEN_ACTIONS)
    assert len(seen) == 16
    assert np.all(seen >= -1.0) and np.all(seen <= 1.0), seen.max()


def test_gaussian_log_prob_and_entropy_match_torch_normal():
    """The hand-written diagonal Gaussian equals ``torch.distributions.Normal``."""
    agent = _pendulum_agent(mean=0.3, log_std=-0.4)
    obs = torch.randn(5, 3, generator=torch.Generator().manual_seed(0))
    actions = torch.tensor([[-3.0], [-1.0], [0.0], [0.5], [2.5]])
    log_prob, entropy, _ = agent.model.evaluate(obs, actions)
    normal = torch.distributions.Normal(torch.full((5, 1), 0.3), math.exp(-0.4))
    torch.testing.assert_close(log_prob, normal.log_prob(actions).sum(-1))
    torch.testing.assert_close(entropy, normal.entropy().sum(-1))


# -- observations -----------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
def test_discrete_observation_space_is_supported_or_refused_clearly(algo):
    """FrozenLake's observation is a Discrete integer. SB3 one-hot encodes it; vecaccel builds
    the agent, then fails inside the first rollout with ``IndexError: Dimension out of range``
    from the MLP's ``flatten(1)``. Either train, or refuse at construction naming the space."""
    try:
        if algo == "ppo":
            agent = PPO("FrozenLake-v1", backend="serial", num_envs=2, num_steps=4,
                        update_epochs=1, torch_threads=1, tensorboard=False)  # fmt: skip
        else:
            agent = DQN("FrozenLake-v1", learning_starts=16, batch_size=4, buffer_size=64,
                        replay_ratio=1.0, device="cpu", progress=False, tensorboard=False,
                        torch_threads=1)  # fmt: skip
    except (TypeError, ValueError) as exc:
        assert "Discrete" in str(exc)
        return
    try:
        agent.learn(32)
    finally:
        agent.close()


def test_cnn_scales_only_uint8_images():
    """``models.py`` says uint8 images are scaled by 1/255 in the network; NatureCNN divides
    every input by 255, so a float image already in [0, 1] (``network="cnn"`` on a float Box)
    reaches the convolutions 255 times too small. SB3 scales uint8 image spaces only."""
    cnn = NatureCNN(4, 84)
    images = torch.randint(0, 256, (2, 4, 84, 84), generator=torch.Generator().manual_seed(0))
    as_uint8 = images.to(torch.uint8)
    as_unit_float = images.float() / 255.0
    torch.testing.assert_close(cnn(as_unit_float), cnn(as_uint8))


# -- DQN family: targets, loss, priorities, schedules (hand-computed) -------------------------


class _RecordingBuffer:
    def __init__(self) -> None:
        self.calls: list[tuple[np.ndarray, np.ndarray]] = []

    def update_priorities(self, indices, priorities) -> None:
        self.calls.append((np.asarray(indices), np.asarray(priorities)))


@pytest.mark.parametrize(
    "double, loss, expected_td",
    [(True, "mse", [9.0, 1.0]), (False, "mse", [18.0, 1.0]), (True, "huber", [9.0, 1.0])],
)
def test_dqn_target_loss_and_priorities_by_hand(double, loss, expected_td):
    """Linear Q-networks with known weights: the (double) target, the terminal cut, the
    importance-weighted loss and the priorities handed to the buffer, computed by hand."""
    agent = DQN(None, double=double, loss=loss, prioritized=True, device="cpu",
                torch_threads=1, max_grad_norm=0.0)  # fmt: skip
    online = torch.nn.Linear(4, 2, bias=False)
    target = torch.nn.Linear(4, 2, bias=False)
    with torch.no_grad():
        # rows are actions: Q(s, a) = W[a] . s
        online.weight.copy_(torch.tensor([[1.0, 0.5, 3.0, 0.0], [0.0, 2.0, 1.0, 0.0]]))
        target.weight.copy_(torch.tensor([[0.0, 0.0, 10.0, 0.0], [0.0, 0.0, 20.0, 0.0]]))
    agent.q_network = agent.train_network = online
    agent.target_network = target
    agent.optimizer = torch.optim.SGD(online.parameters(), lr=0.0)
    agent.support = None
    agent.buffer = _RecordingBuffer()
    eye = np.eye(4, dtype=np.float32)
    batch = ReplaySample(
        obs=eye[[0, 1]],  # Q(s0, 0) = 1, Q(s1, 1) = 2
        action=np.array([0, 1]),
        reward=np.array([1.0, 3.0], np.float32),
        next_obs=eye[[2, 3]],  # online argmax at s0' is 0, target's is 1; s1' is terminal
        discount=np.array([0.9, 0.0], np.float32),
        indices=np.array([7, 11]),
        weights=np.array([1.0, 0.5], np.float32),
    )
    # double: 1 + 0.9 * Q_target(s0', argmax_online = 0) = 10; plain: 1 + 0.9 * max = 19
    metrics = agent.train_step(batch)
    td = np.array(expected_td)
    per_sample = td**2 if loss == "mse" else np.where(td <= 1, 0.5 * td**2, td - 0.5)
    assert metrics["losses/td_loss"] == pytest.approx(np.mean([1.0, 0.5] * per_sample))
    assert metrics["losses/q_values"] == pytest.approx(1.5)
    (indices, priorities), = agent.buffer.calls  # fmt: skip
    np.testing.assert_array_equal(indices, [7, 11])
    np.testing.assert_allclose(priorities, td, rtol=1e-6)


class _LinearDistributions(torch.nn.Module):
    """Logits ``[N, actions, atoms]`` linear in the observation."""

    def __init__(self, actions: int, atoms: int) -> None:
        super().__init__()
        self.actions, self.atoms = actions, atoms
        self.linear = torch.nn.Linear(4, actions * atoms, bias=False)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.linear(obs).view(-1, self.actions, self.atoms)


def test_c51_update_targets_by_hand():
    """C51's train step on 5 atoms over [-2, 2]: a terminal transition puts all the target mass
    on the reward's atom; a uniform next distribution with r = 0.5 and discount 0.5 projects to
    [0, .1, .4, .4, .1]. The loss (and the priorities) are the cross-entropies to these."""
    agent = C51(None, v_min=-2.0, v_max=2.0, num_atoms=5, prioritized=True, device="cpu",
                torch_threads=1, max_grad_norm=0.0)  # fmt: skip
    online, target = _LinearDistributions(2, 5), _LinearDistributions(2, 5)
    with torch.no_grad():
        online.linear.weight.copy_(torch.randn(10, 4, generator=torch.Generator().manual_seed(0)))
        target.linear.weight.zero_()  # uniform next distributions
    agent.q_network = agent.train_network = online
    agent.target_network = target
    agent.optimizer = torch.optim.SGD(online.parameters(), lr=0.0)
    agent.support = torch.linspace(-2.0, 2.0, 5)
    agent.buffer = _RecordingBuffer()
    eye = np.eye(4, dtype=np.float32)
    batch = ReplaySample(
        obs=eye[[0, 1]],
        action=np.array([1, 0]),
        reward=np.array([1.0, 0.5], np.float32),
        next_obs=eye[[2, 3]],
        discount=np.array([0.0, 0.5], np.float32),
        indices=np.array([3, 4]),
        weights=np.ones(2, np.float32),
    )
    metrics = agent.train_step(batch)
    targets = torch.tensor([[0.0, 0.0, 0.0, 1.0, 0.0], [0.0, 0.1, 0.4, 0.4, 0.1]])
    with torch.no_grad():
        log_probs = torch.log_softmax(online(torch.as_tensor(eye[[0, 1]])), -1)
    cross_entropy = -(targets * log_probs[[0, 1], [1, 0]]).sum(-1)
    assert metrics["losses/td_loss"] == pytest.approx(float(cross_entropy.mean()), rel=1e-5)
    (indices, priorities), = agent.buffer.calls  # fmt: skip
    np.testing.assert_allclose(priorities, cross_entropy.numpy(), rtol=1e-5)


def test_epsilon_and_beta_schedules_by_hand():
    agent = DQN(None, start_epsilon=1.0, end_epsilon=0.05, exploration_fraction=0.5,
                priority_beta_start=0.4, prioritized=True, device="cpu")  # fmt: skip
    assert agent.epsilon(0, 1000) == pytest.approx(1.0)
    assert agent.epsilon(250, 1000) == pytest.approx(0.525)
    assert agent.epsilon(500, 1000) == pytest.approx(0.05)
    assert agent.epsilon(900, 1000) == pytest.approx(0.05)
    steps = DQN(None, exploration_steps=100, device="cpu")
    assert steps.epsilon(50, 10_000) == pytest.approx(0.525)

    class Buffer:
        def sample(self, batch_size, beta):
            return beta

    agent.buffer = Buffer()
    for progress, expected in ((0.0, 0.4), (0.5, 0.7), (1.0, 1.0), (1.5, 1.0)):
        beta, sampled_with = agent.sample_batch(progress)
        assert beta == pytest.approx(expected) and sampled_with == pytest.approx(expected)


def test_n_step_returns_stop_at_truncation_and_termination_by_hand():
    """One env, n = 3, gamma = 0.5: an episode truncated after 3 steps (final obs 99), one
    terminated after 2 steps, then a running one. Targets and discounts by hand."""
    buffer = ReplayBuffer(gym.spaces.Box(-1e3, 1e3, (1,), np.float32), gym.spaces.Discrete(2),
                          capacity=32, n_step=3, gamma=0.5, seed=0)  # fmt: skip

    def add(obs, reward, terminated=False, truncated=False, final=None):
        buffer.add(np.array([[obs]], np.float32), np.array([1]), np.array([reward]),
                   np.array([terminated]), np.array([truncated]),
                   None if final is None else np.array([[final]], np.float32))  # fmt: skip

    add(0, 1.0)
    add(1, 2.0)
    add(2, 4.0, truncated=True, final=99)  # slot 3 holds 99
    add(10, 8.0)
    add(11, 16.0, terminated=True)  # slot 6 holds a zero final obs
    for k, obs in enumerate((12, 13, 14, 15, 16)):
        add(obs, 32.0 * 2**k)
    # slot -> (obs, n-step return, discount, bootstrap obs)
    expected = {
        0: (0, 1 + 0.5 * 2 + 0.25 * 4, 0.125, 99),
        1: (1, 2 + 0.5 * 4, 0.25, 99),
        2: (2, 4, 0.5, 99),
        4: (10, 8 + 0.5 * 16, 0.0, None),
        5: (11, 16, 0.0, None),
        7: (12, 32 + 0.5 * 64 + 0.25 * 128, 0.125, 15),
        8: (13, 64 + 0.5 * 128 + 0.25 * 256, 0.125, 16),
    }
    valid = set(np.flatnonzero(buffer._valid_mask().reshape(-1)).tolist())
    assert valid == set(expected)
    sample = buffer.get(np.array(sorted(expected)))
    for row, slot in enumerate(sorted(expected)):
        obs, ret, discount, bootstrap = expected[slot]
        assert sample.obs[row, 0] == obs
        assert sample.reward[row] == pytest.approx(ret)
        assert sample.discount[row] == pytest.approx(discount)
        if bootstrap is not None:
            assert sample.next_obs[row, 0] == bootstrap


# -- PPO: clipped surrogate and clipped value loss (hand-computed) ----------------------------


def test_ppo_clipped_surrogate_and_value_loss_by_hand():
    """One epoch, one minibatch, every step terminal (so returns = rewards): the policy and
    value losses equal CleanRL's formulas evaluated on the same numbers."""
    clip = 0.2
    agent = PPO(None, env_id="CartPole-v1", observation_space=CARTPOLE_OBS,
                action_space=gym.spaces.Discrete(2), update_epochs=1, num_minibatches=1,
                clip_coef=clip, clip_vloss=True, ent_coef=0.0, torch_threads=1,
                backend="serial", seed=0)  # fmt: skip
    B = 6
    generator = torch.Generator().manual_seed(0)
    obs = torch.randn(1, B, 4, generator=generator)
    actions = torch.tensor([[0, 1, 0, 1, 1, 0]])
    with torch.no_grad():
        new_logprob, _, new_value = agent.model.evaluate(obs[0], actions[0])
    # behaviour log-probs: ratios e^0.5, e^-0.5, 1, e^0.1, e^-0.3, e^0.25
    shifts = torch.tensor([-0.5, 0.5, 0.0, -0.1, 0.3, -0.25])
    old_logprob = (new_logprob - shifts)[None]
    # old values: some far from the current ones, so the value clip bites
    old_value = (new_value + torch.tensor([1.0, -1.0, 0.05, 0.0, 0.5, -0.3]))[None]
    rewards = torch.tensor([[1.0, -2.0, 0.5, 3.0, 0.0, -1.0]])
    batch = SampleBatch(
        obs=obs,
        actions=actions,
        rewards=rewards,
        terminated=torch.ones(1, B, dtype=torch.bool),
        truncated=torch.zeros(1, B, dtype=torch.bool),
        valid=torch.ones(1, B, dtype=torch.bool),
        extras={"log_prob": old_logprob, "value": old_value},
        next_obs=torch.zeros(B, 4),
        final_obs=torch.zeros(0, 4),
        final_index=torch.zeros(0, 2, dtype=torch.int64),
    )
    metrics = agent.update(batch, progress_remaining=1.0)

    returns = rewards[0].double()
    advantages = returns - old_value[0].double()
    advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    ratio = shifts.double().exp()
    pg = torch.max(-advantages * ratio, -advantages * ratio.clamp(1 - clip, 1 + clip)).mean()
    v_new, v_old = new_value.double(), old_value[0].double()
    v_clipped = v_old + (v_new - v_old).clamp(-clip, clip)
    v_loss = torch.max((v_new - returns) ** 2, (v_clipped - returns) ** 2).mean()
    assert metrics["losses/policy_loss"] == pytest.approx(float(pg), rel=1e-5, abs=1e-6)
    assert metrics["losses/value_loss"] == pytest.approx(float(v_loss), rel=1e-5)
    clipped = ((ratio - 1).abs() > clip).double().mean()
    assert metrics["losses/clipfrac"] == pytest.approx(float(clipped))


# -- seeding ----------------------------------------------------------------------------------


@pytest.mark.parametrize("algo", ["ppo-pendulum", "a2c", "rainbow"])
def test_seeded_runs_repeat(algo):
    def run() -> list[torch.Tensor]:
        if algo == "ppo-pendulum":
            agent = PPO("Pendulum-v1", backend="serial", num_envs=2, num_steps=8,
                        update_epochs=2, torch_threads=1, seed=5)  # fmt: skip
            agent.learn(32)
            params = agent.model.parameters()
        elif algo == "a2c":
            agent = A2C("CartPole-v1", backend="serial", num_envs=2, num_steps=5,
                        torch_threads=1, seed=5)  # fmt: skip
            agent.learn(40)
            params = agent.model.parameters()
        else:
            from vecaccel.trainers import Rainbow

            agent = Rainbow("CartPole-v1", v_min=0.0, v_max=50.0, learning_starts=32,
                            batch_size=8, buffer_size=200, replay_ratio=2.0, device="cpu",
                            progress=False, tensorboard=False, torch_threads=1, seed=5)  # fmt: skip
            agent.learn(96)
            params = agent.q_network.parameters()
        out = [p.detach().clone() for p in params]
        agent.close()
        return out

    first, second = run(), run()
    assert all(torch.equal(a, b) for a, b in zip(first, second))


def test_c51_class_defaults_survive_load(tmp_path):
    """A C51 agent saved and loaded stays categorical, with its support."""
    agent = C51(None, v_min=-5.0, v_max=5.0, num_atoms=11, device="cpu")
    agent.observation_space, agent.action_space = CARTPOLE_OBS, gym.spaces.Discrete(2)
    agent.build_networks()
    agent.save(tmp_path / "c51.pt")
    loaded = C51.load(tmp_path / "c51.pt")
    assert loaded.config.categorical and loaded.support.shape == (11,)
    obs = np.zeros((3, 4), np.float32)
    np.testing.assert_array_equal(loaded.predict(obs)[0], agent.predict(obs)[0])
