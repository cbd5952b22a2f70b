"""Training on multi-agent vector envs: rows of agents that are not active stay out of learning.

The masking is tested on :class:`AgentRowsVectorEnv`, a small vector env with one row per
``(env, agent)`` whose agents die one after another, as ``vecaccel.make_vec`` lays out a
PettingZoo env; the trainers then run end to end on real PettingZoo envs.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch
from gymnasium import spaces
from gymnasium.vector import AutoresetMode

import vecaccel
from vecaccel.trainers import A2C, DQN, PPO
from vecaccel.trainers.algos.on_policy.advantages import compute_gae, learning_rows
from vecaccel.trainers.replay.buffer import ReplayBuffer
from vecaccel.trainers.services.team_returns import TeamReturns


class AgentRowsVectorEnv(gym.vector.VectorEnv):
    """``num_envs`` envs of ``agents`` agents, one row each, env by env (``SAME_STEP``).

    Agent ``a`` of env ``k`` lives ``2 + a + k`` steps per episode (its last step terminates
    it), then its row is inactive (zero obs, reward 0, ``infos["active"]`` False) until every
    agent of the env is done and the env resets. A live agent observes ``[1 + t, 1 + a, 1 + k]``
    at its step ``t`` of the episode and gets reward ``0.1 * (a + 1)`` each step.
    """

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int = 2, agents: int = 3) -> None:
        self.agents_per_env = agents
        self.num_envs = num_envs * agents
        self.row_env = np.repeat(np.arange(num_envs), agents)
        self.row_agent = [f"agent_{a}" for _ in range(num_envs) for a in range(agents)]
        self.agent_index = np.tile(np.arange(agents), num_envs)
        self.lifetime = 2 + self.agent_index + self.row_env
        self.reward = 0.1 * (self.agent_index + 1)
        self.single_observation_space = spaces.Box(-100, 100, (3,), np.float32)
        self.single_action_space = spaces.Discrete(2)
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, self.num_envs
        )
        self.action_space = gym.vector.utils.batch_space(self.single_action_space, self.num_envs)
        self.t = np.zeros(self.num_envs, dtype=np.int64)

    def _obs(self, live: np.ndarray) -> np.ndarray:
        obs = np.stack([1 + self.t, 1 + self.agent_index, 1 + self.row_env], axis=1)
        return np.where(live[:, None], obs, 0.0).astype(np.float32)

    def reset(self, *, seed=None, options=None):
        self.t[:] = 0
        live = np.ones(self.num_envs, dtype=bool)
        return self._obs(live), {"active": live}

    def step(self, actions):
        live = self.t < self.lifetime
        reward = np.where(live, self.reward, 0.0)
        self.t = np.where(live, self.t + 1, self.t)
        terminated = live & (self.t == self.lifetime)
        obs = self._obs(self.t < self.lifetime)
        infos: dict = {"active": live.copy()}
        # an env whose agents are all done resets, its rows holding the new episode's obs
        over = np.bincount(self.row_env, weights=self.t >= self.lifetime) == self.agents_per_env
        rows = over[self.row_env]
        if rows.any():
            infos["final_obs"] = np.where(rows[:, None], obs, 0.0)
            self.t[rows] = 0
            obs = np.where(rows[:, None], self._obs(np.ones_like(rows)), obs).astype(np.float32)
        return obs, reward, terminated, np.zeros_like(terminated), infos


def agent_returns(env: AgentRowsVectorEnv) -> np.ndarray:
    """Each row's episode return: ``lifetime`` steps of its reward."""
    return env.lifetime * env.reward


def collect(agent, horizon: int = 12):
    sampler = vecaccel.Sampler(agent.envs, agent.model, horizon=horizon, seed=0)
    return sampler, sampler.collect()


def test_sampler_records_active_and_counts_live_steps():
    envs = AgentRowsVectorEnv()
    agent = PPO(envs, num_steps=12, seed=0, preset=None)
    sampler, batch = collect(agent)
    active = batch.active.numpy()
    # agent a of env k is live for rows t of each episode of length 2 + (agents - 1) + k
    for row in range(envs.num_envs):
        period = 2 + (envs.agents_per_env - 1) + envs.row_env[row]
        t = np.arange(12) % period
        np.testing.assert_array_equal(active[:, row], t < envs.lifetime[row])
    # inactive rows hold zeros; live rows never do
    obs = batch.obs.numpy()
    assert (obs[~active] == 0).all() and (obs[active] != 0).any(axis=-1).all()
    episodes = sampler.pop_episodes()
    lifetime = {round(float(r), 6): int(n) for r, n in zip(agent_returns(envs), envs.lifetime)}
    assert episodes.returns and all(
        lifetime[round(r, 6)] == n for r, n in zip(np.round(episodes.returns, 6), episodes.lengths)
    )
    assert learning_rows(batch) is not None
    agent.close()


def column_gae(batch, column: int, next_value, gamma: float, lam: float):
    """GAE of one column with its inactive rows taken out, as if they were never stepped."""
    keep = batch.active[:, column]
    values = batch.extras["value"][keep, column : column + 1]
    advantages, _ = compute_gae(
        batch.rewards[keep, column : column + 1],
        values,
        next_value[column : column + 1],
        batch.terminated[keep, column : column + 1],
        batch.truncated[keep, column : column + 1],
        values[:0, 0],
        torch.zeros((0, 2), dtype=torch.int64),
        gamma,
        lam,
    )
    return advantages[:, 0]


def test_advantages_of_active_rows_are_those_of_the_active_rows_alone():
    envs = AgentRowsVectorEnv()
    agent = PPO(envs, num_steps=12, seed=0, preset=None)
    _, batch = collect(agent)
    with torch.no_grad():
        next_value = agent.model.value(batch.next_obs)
    advantages, _ = compute_gae(
        batch.rewards,
        batch.extras["value"],
        next_value,
        batch.terminated,
        batch.truncated,
        next_value[:0],
        batch.final_index,
        0.99,
        0.95,
        active=batch.active,
    )
    for column in range(envs.num_envs):
        alone = column_gae(batch, column, next_value, 0.99, 0.95)
        torch.testing.assert_close(advantages[batch.active[:, column], column], alone)
    agent.close()


def scrambled(batch):
    """``batch`` with noise in every entry of the inactive rows."""
    generator = torch.Generator().manual_seed(1)
    inactive = ~batch.active

    def noise(x):
        x = x.clone()
        fill = torch.randn(x.shape, generator=generator).to(x.dtype) * 50
        mask = inactive.reshape(*inactive.shape, *([1] * (x.dim() - 2)))
        return torch.where(mask, fill, x)

    return batch._replace(
        obs=noise(batch.obs),
        rewards=noise(batch.rewards),
        extras={key: noise(value) for key, value in batch.extras.items()},
        actions=torch.where(inactive, 1 - batch.actions, batch.actions),
    )


@pytest.mark.parametrize("algo", [PPO, A2C])
def test_updates_ignore_what_inactive_rows_hold(algo):
    envs = AgentRowsVectorEnv()
    agent = algo(envs, num_steps=12, seed=0, preset=None)
    _, batch = collect(agent)
    batch = batch._replace(
        **{name: getattr(batch, name).clone() for name in ("obs", "actions", "rewards")},
        extras={key: value.clone() for key, value in batch.extras.items()},
    )
    twin = algo(AgentRowsVectorEnv(), num_steps=12, seed=0, preset=None)
    torch.manual_seed(3)
    metrics = agent.update(batch)
    torch.manual_seed(3)
    twin_metrics = twin.update(scrambled(batch))
    assert metrics == twin_metrics
    for mine, theirs in zip(agent.model.parameters(), twin.model.parameters()):
        assert torch.equal(mine, theirs)
    agent.close()
    twin.close()


@pytest.mark.parametrize("algo", [PPO, A2C])
def test_an_inactive_column_changes_nothing(algo):
    """A batch with an extra column that is never active updates as the batch without it."""
    envs = AgentRowsVectorEnv()
    options = dict(num_steps=12, seed=0, preset=None)
    if algo is PPO:
        options.update(num_minibatches=1, update_epochs=2)
    agent = algo(envs, **options)
    _, batch = collect(agent)
    narrow = batch._replace(
        obs=batch.obs[:, :-1].clone(),
        actions=batch.actions[:, :-1].clone(),
        rewards=batch.rewards[:, :-1].clone(),
        terminated=batch.terminated[:, :-1].clone(),
        truncated=batch.truncated[:, :-1].clone(),
        valid=batch.valid[:, :-1].clone(),
        extras={key: value[:, :-1].clone() for key, value in batch.extras.items()},
        next_obs=batch.next_obs[:-1].clone(),
        active=batch.active[:, :-1].clone(),
    )
    wide = batch._replace(
        active=torch.cat([narrow.active, torch.zeros_like(narrow.active[:, :1])], dim=1)
    )
    assert len(batch.final_index) == 0  # the toy env terminates its agents, never truncates
    twin = algo(AgentRowsVectorEnv(), **options)
    metrics = agent.update(wide)
    twin_metrics = twin.update(narrow)
    for key in metrics:
        assert metrics[key] == pytest.approx(twin_metrics[key], rel=1e-5, abs=1e-7), key
    for mine, theirs in zip(agent.model.parameters(), twin.model.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6)
    agent.close()
    twin.close()


def test_replay_buffer_stores_no_inactive_row():
    envs = AgentRowsVectorEnv()
    buffer = ReplayBuffer(
        envs.single_observation_space, envs.single_action_space, 600, envs.num_envs, n_step=2
    )
    obs, infos = envs.reset(seed=0)
    live_steps = np.zeros(envs.num_envs, dtype=np.int64)
    for _ in range(40):
        actions = envs.action_space.sample()
        next_obs, reward, terminated, truncated, infos = envs.step(actions)
        buffer.add(
            obs,
            actions,
            reward,
            terminated,
            truncated,
            infos.get("final_obs"),
            active=infos["active"],
        )
        live_steps += infos["active"]
        obs = next_obs
    assert buffer.steps_added == live_steps.sum()
    # each column holds its live steps and one final observation per episode, nothing else
    episodes = buffer.is_final.sum(axis=0)
    np.testing.assert_array_equal(buffer.filled, live_steps + episodes)
    stored = np.arange(buffer.T)[:, None] < buffer.filled  # no column has wrapped around
    written = buffer.frames[stored & ~buffer.is_final]
    assert (written != 0).any(axis=-1).all()
    sample = buffer.sample(256)
    assert (sample.obs != 0).any(axis=-1).all()
    # a transition's n-step window stays in the agent's own episode
    expected = np.array([0.1, 0.2, 0.3, 0.1 + 0.099, 0.2 + 0.198, 0.3 + 0.297])
    assert np.isclose(sample.reward[:, None], expected[None], atol=1e-5).any(axis=1).all()


def test_team_returns_sum_each_envs_agents():
    envs = AgentRowsVectorEnv()
    agent = PPO(envs, num_steps=16, seed=0, preset=None, log_every_steps=0)
    rows: list = []
    agent.learn(
        total_timesteps=16 * envs.num_envs * 3, callback=lambda a, m: rows.append(m) or True
    )
    returns = agent_returns(envs)
    team = {round(float(returns[envs.row_env == k].sum()), 6) for k in range(2)}
    logged = [m["charts/team_episodic_return"] for m in rows if "charts/team_episodic_return" in m]
    assert logged and all(min(team) - 1e-6 <= value <= max(team) + 1e-6 for value in logged)
    agent_logged = [m["charts/episodic_return"] for m in rows if m["charts/episodic_return"]]
    assert agent_logged and max(agent_logged) <= returns.max() + 1e-6
    agent.close()


def test_team_returns_wait_for_every_agent():
    team = TeamReturns([0, 0, 0])
    first, second, third = np.eye(3, dtype=bool)
    # the agents end one after another; a row already done is inactive, with reward 0
    assert team.record(np.ones(3), first, np.ones(3, bool)) == []
    assert team.record(np.array([0.0, 1.0, 1.0]), second, ~first) == []
    assert team.record(np.array([0.0, 0.0, 1.0]), third, third) == [6.0]
    assert team.record(np.ones(3), np.zeros(3, bool), np.ones(3, bool)) == []


def test_dqn_trains_on_agent_rows():
    envs = AgentRowsVectorEnv()
    agent = DQN(
        envs,
        learning_starts=32,
        batch_size=16,
        buffer_size=2000,
        seed=0,
        preset=None,
        log_every_steps=0,
    )
    rows: list = []
    agent.learn(total_timesteps=400, callback=lambda a, m: rows.append(m) or True)
    buffer = agent.buffer
    assert buffer.steps_added < agent.global_step  # inactive rows were left out
    written = buffer.frames[~buffer.is_final & (np.arange(buffer.T)[:, None] < buffer.filled)]
    assert (written != 0).any(axis=-1).all()
    assert any("charts/team_episodic_return" in m for m in rows)
    agent.close()


# -- end to end on PettingZoo envs -------------------------------------------------------------

SPREAD = "mpe2.simple_spread_v3"


def train(*argv: str) -> int:
    from vecaccel.cli import main

    return main(["train", *argv, "--no-progress", "--no-tensorboard", "--torch-threads", "1"])


def metric_columns(run_dir) -> list[str]:
    import csv

    with open(run_dir / "metrics.csv") as file:
        return next(csv.reader(file))


@pytest.mark.parametrize(
    ("algo", "extra"),
    [
        ("ppo", ["--num-steps", "32"]),
        ("a2c", ["--num-steps", "8"]),
        ("dqn", ["--learning-starts", "64", "--batch-size", "32"]),
    ],
)
def test_train_on_simple_spread_then_eval(algo, extra, tmp_path, capsys):
    """Three agents per env, one shared policy; episodes end by truncation after 25 cycles."""
    from vecaccel.cli import main

    run_dir = tmp_path / algo
    argv = [algo, "--env", SPREAD, "--num-envs", "2", "--backend", "serial"]
    assert (
        train(*argv, "--total-timesteps", "384", "--seed", "0", "--run-dir", str(run_dir), *extra)
        == 0
    )
    columns = metric_columns(run_dir)
    assert "charts/team_episodic_return" in columns and "charts/episodic_return" in columns
    capsys.readouterr()
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    out = capsys.readouterr().out
    assert f"{algo} on {SPREAD}: 2 episodes, team return" in out
    for name in ("agent_0", "agent_1", "agent_2"):
        assert f"  {name}: return" in out


def test_ppo_counts_rows_in_its_batch():
    agent = PPO(SPREAD, num_envs=2, num_steps=8, backend="serial", seed=0, preset=None)
    assert agent.envs.num_envs == 6 and agent.batch_size == 6 * 8
    agent.learn(total_timesteps=96)
    assert agent.global_step == 96
    agent.close()


def test_eval_team_return_is_the_sum_of_the_agents():
    from vecaccel.trainers.cli.evaluate import evaluate_agents

    agent = PPO(SPREAD, num_envs=1, num_steps=8, backend="serial", seed=0, preset=None)
    result = evaluate_agents(agent, SPREAD, episodes=2, seed=3)
    assert list(result.agents) == ["agent_0", "agent_1", "agent_2"]
    sums = [sum(returns[i] for returns in result.agents.values()) for i in range(2)]
    np.testing.assert_allclose(result.team, sums)
    assert result.lengths == [25, 25]
    agent.close()


def test_pistonball_gets_a_cnn_over_its_hwc_images():
    from vecaccel.trainers.nets.networks import NatureCNN

    agent = PPO(
        "pettingzoo.butterfly.pistonball_v6",
        num_envs=1,
        num_steps=4,
        num_minibatches=2,
        update_epochs=1,
        backend="serial",
        seed=0,
        preset=None,
    )
    assert agent.envs.single_observation_space.shape == (457, 120, 3)
    assert any(isinstance(module, NatureCNN) for module in agent.model.modules())
    agent.learn(total_timesteps=agent.batch_size)
    assert agent.global_step == 20 * 4
    agent.close()


def test_atari_setup_is_refused_for_pettingzoo(tmp_path):
    assert (
        train(
            "ppo",
            "--env",
            SPREAD,
            "--atari",
            "true",
            "--total-timesteps",
            "64",
            "--run-dir",
            str(tmp_path),
        )
        == 2
    )
    assert (
        train(
            "dqn", "--env", SPREAD, "--async", "--total-timesteps", "64", "--run-dir", str(tmp_path)
        )
        == 2
    )


@pytest.mark.parametrize("backend", ["serial", "shm"])
def test_agents_dying_early_are_masked_on_a_real_pettingzoo_env(backend):
    """make_vec of PettingZoo envs whose agents die one after another: the sampler's mask says
    so, and PPO and DQN train on those rows alone."""
    import functools

    from tests.support.pettingzoo_envs import EchoAgentsEnv

    fns = [
        functools.partial(EchoAgentsEnv, tag=k, num_agents=3, lifetimes=(2, 5, 4), max_steps=6)
        for k in range(2)
    ]
    envs = vecaccel.make_vec(fns, backend=backend, autoreset_mode="SameStep")
    try:
        agent = PPO(envs, num_steps=12, num_minibatches=2, seed=0, preset=None)
        batch = agent.sampler.collect()
        # agent i is live for steps 0..lifetime-1 of each 5-step episode (all done at step 5)
        expected = np.arange(12)[:, None] % 5 < np.array([2, 5, 4] * 2)[None, :]
        np.testing.assert_array_equal(batch.active.numpy(), expected)
        obs = batch.obs.numpy()
        assert (obs[~expected] == 0).all()
        agent.update(agent.to_model_actions(batch))
        agent.learn(total_timesteps=72 * 2)
        agent.close()
        dqn = DQN(envs, learning_starts=24, batch_size=8, buffer_size=600, seed=0, preset=None)
        dqn.learn(total_timesteps=240)
        assert 0 < dqn.buffer.steps_added < dqn.global_step
        dqn.close()
    finally:
        envs.close()


def test_resume_a_pettingzoo_run(tmp_path, capsys):
    from vecaccel.trainers.checkpoints.format import load_checkpoint

    run_dir = tmp_path / "run"
    argv = ["ppo", "--env", SPREAD, "--num-envs", "2", "--backend", "serial", "--num-steps", "16"]
    assert train(*argv, "--total-timesteps", "96", "--run-dir", str(run_dir)) == 0
    assert train("ppo", "--resume", str(run_dir), "--total-timesteps", "192") == 0
    state = load_checkpoint(run_dir / "checkpoint.pt")
    assert state["global_step"] == 192 and state["num_updates"] == 2
    assert state["config"]["num_envs"] == 2  # envs, each 3 rows
