"""MinAtar as a source: its ids in make_vec and the trainers, its network, its presets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import vecaccel
from vecaccel.envs.unknown_ids import env_id_hint, unknown_env_id_message

pytest.importorskip("minatar")

GAMES = {"Asterix": 4, "Breakout": 4, "Freeway": 7, "Seaquest": 10, "SpaceInvaders": 6}


@pytest.mark.parametrize("context", ["fork", "spawn", "forkserver"])
def test_ids_work_in_workers_under_every_start_method(context, no_leaks):
    """The env plugin registers MinAtar's ids in the caller and in fresh interpreters, and
    shared memory carries the bool grids as they are."""
    envs = vecaccel.make_vec(
        "MinAtar/Breakout-v1", 4, backend="shm", num_workers=2, context=context
    )
    try:
        obs, _ = envs.reset(seed=3)
        assert obs.dtype == np.bool_ and obs.shape == (4, 10, 10, 4)
        assert envs.single_action_space.n == 3  # -v1: the minimal action set
        obs, rewards, terminated, truncated, _ = envs.step(np.zeros(4, dtype=np.int64))
        assert obs.dtype == np.bool_ and obs.any()
    finally:
        envs.close()


def test_the_caller_sees_what_one_env_steps():
    import gymnasium as gym

    serial = vecaccel.make_vec("MinAtar/Seaquest-v0", 2, backend="serial")
    try:
        obs, _ = serial.reset(seed=7)
        env = gym.make("MinAtar/Seaquest-v0")
        alone, _ = env.reset(seed=7)
        np.testing.assert_array_equal(obs[0], alone)
        assert serial.single_observation_space.shape == (10, 10, 10)
    finally:
        serial.close()


def test_an_id_names_the_extra_or_the_id_meant():
    hint = env_id_hint("minatar/Breakout-v0", installed=lambda module: module != "minatar")
    assert "pip install 'vecaccel[minatar]'" in hint
    assert env_id_hint("Breakout-v1") == "did you mean 'MinAtar/Breakout-v1'?"
    assert env_id_hint("spaceinvaders-v0") == "did you mean 'MinAtar/SpaceInvaders-v0'?"
    with pytest.raises(ValueError, match=r"did you mean 'MinAtar/Freeway-v1'\?"):
        vecaccel.make_vec("Freeway-v1", 2, backend="serial")
    with pytest.raises(ValueError, match="Did you mean: `Breakout`"):
        vecaccel.make_vec("MinAtar/Breakot-v1", 2, backend="serial")
    message = unknown_env_id_message("MinAtar/Pong-v0", RuntimeError("no such game."))
    assert message == "unknown environment id 'MinAtar/Pong-v0': no such game."


@pytest.mark.parametrize(("game", "channels"), sorted(GAMES.items()))
def test_the_minatar_network_is_picked_by_the_observation(game, channels):
    from vecaccel.trainers.nets.networks import ActorCritic, MinAtarNet, QNetwork, make_encoder

    envs = vecaccel.make_vec(f"MinAtar/{game}-v0", 2, backend="serial")
    try:
        space = envs.single_observation_space
        assert isinstance(make_encoder(space), MinAtarNet)
        obs, _ = envs.reset(seed=0)
        model = ActorCritic(space, envs.single_action_space)
        assert model.shared  # one torso, the policy and value heads on it
        actions, extras = model(torch.as_tensor(obs))
        assert actions.shape == (2,) and extras["value"].shape == (2,)
        q = QNetwork(space, 6, dueling=True, num_atoms=51)
        assert q(torch.as_tensor(obs)).shape == (2, 6, 51)
        conv = model.encoder.conv[0]
        assert (conv.in_channels, conv.out_channels, conv.kernel_size) == (channels, 16, (3, 3))
        assert model.encoder.linear[0].out_features == 128
    finally:
        envs.close()


def test_minatar_network_reads_channels_last_and_first_alike():
    from vecaccel.trainers.nets.networks import MinAtarNet

    torch.manual_seed(0)
    last = MinAtarNet(4)
    first = MinAtarNet(4, channels_last_input=False)
    first.load_state_dict(last.state_dict())
    grid = torch.rand(3, 10, 10, 4) > 0.7
    torch.testing.assert_close(last(grid), first(grid.permute(0, 3, 1, 2)))
    torch.testing.assert_close(last(grid), last(grid.float()))


def test_minatar_network_bf16_reads_booleans_exactly_and_answers_in_float32():
    """The bf16 torso casts the boolean grid straight to bfloat16 (0 and 1 are exact): bit for
    bit what float32 input under autocast gives, and float32 features out."""
    from vecaccel.trainers.nets.networks import MinAtarNet

    torch.manual_seed(0)
    net = MinAtarNet(4, bf16=True)
    grid = torch.rand(16, 10, 10, 4) > 0.7
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = net.linear(net.conv(grid.permute(0, 3, 1, 2).float())).float()
    features = net(grid)
    assert features.dtype == torch.float32
    assert torch.equal(features, expected)
    assert torch.equal(net(grid.float()), expected)  # float grids take autocast's own cast


def _minatar_ppo(**settings):
    from vecaccel.trainers import PPO

    return PPO(
        "MinAtar/Breakout-v0", preset="minatar", num_envs=8, num_steps=32, device="cpu",
        tensorboard=False, seed=3, **settings,
    )  # fmt: skip


def test_bf16_auto_follows_the_hardware_on_minatar():
    from vecaccel.trainers.nets.networks import bf16_autocast_helps

    agent = _minatar_ppo(bf16="auto")
    try:
        assert agent.model.encoder.bf16 == bf16_autocast_helps("cpu")
    finally:
        agent.close()
    agent = _minatar_ppo()  # the preset trains in float32
    try:
        assert agent.config.bf16 == "off" and agent.model.encoder.bf16 is False
    finally:
        agent.close()
    from vecaccel.trainers import DQN

    # the DQN family takes the same three values
    for setting, expected in (("auto", bf16_autocast_helps("cpu")), ("on", True), ("off", False)):
        dqn = DQN(
            "MinAtar/Breakout-v0", num_envs=2, buffer_size=1000, device="cpu", bf16=setting,
            tensorboard=False,
        )  # fmt: skip
        try:
            assert dqn.q_network.body.bf16 is expected, setting
        finally:
            dqn.close()


def test_bf16_ppo_update_on_minatar_matches_fp32_within_rounding():
    """One PPO update (4 epochs of 4 minibatches, the same shuffles) from the same weights on a
    real Breakout batch, in float32 and under bf16 autocast: the two updated policies are far
    closer to each other than to the policy they started from, and closer than two float32
    updates that differ only in how the minibatches were shuffled."""
    from vecaccel.trainers import PPO

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    agent = _minatar_ppo(bf16="off")
    try:
        assert not agent.model.encoder.bf16
        agent.sampler.reset(seed=0)
        for _ in range(3):  # past the first frames: a moving ball, some bricks gone
            batch = agent.sampler.collect()
        twin = PPO(
            None, observation_space=agent.observation_space, action_space=agent.action_space,
            **{**vars(agent.config), "bf16": "on", "tensorboard": False},
        )  # fmt: skip
        assert twin.model.encoder.bf16
        reshuffled = PPO(
            None, observation_space=agent.observation_space, action_space=agent.action_space,
            **{**vars(agent.config), "tensorboard": False},
        )  # fmt: skip
        for copy in (twin, reshuffled):
            copy.model.load_state_dict(agent.model.state_dict())
            copy.optimizer.load_state_dict(agent.optimizer.state_dict())
        obs = batch.obs.reshape(-1, *batch.obs.shape[2:])

        def logits(model):
            with torch.no_grad():
                return model._heads(obs)[0].log_softmax(-1)

        def kl(p, q):
            return float((p.exp() * (p - q)).sum(-1).mean())

        before = logits(agent.model)
        torch.manual_seed(7)
        metrics32 = agent.update(batch, 1.0)
        torch.manual_seed(7)
        metrics16 = twin.update(batch, 1.0)
        torch.manual_seed(8)
        reshuffled.update(batch, 1.0)
        after32, after16 = logits(agent.model), logits(twin.model)
        moved, apart = kl(before, after32), kl(after32, after16)
        shuffle_apart = kl(after32, logits(reshuffled.model))
        assert moved > 0
        # measured: apart is about 1e-4 of moved and 0.6 % of shuffle_apart
        assert apart < 0.01 * moved
        assert apart < 0.1 * shuffle_apart
        for key in ("losses/policy_loss", "losses/value_loss", "losses/entropy"):
            assert metrics16[key] == pytest.approx(metrics32[key], rel=0.05, abs=1e-3), key
    finally:
        agent.close()
        torch.set_num_threads(threads)


def test_bf16_dqn_updates_on_minatar_match_fp32_within_rounding():
    """Ten Double-DQN updates of the minatar-dqn preset (batch 512) from the same weights on the
    same replay batches of real Breakout play, in float32 and under bf16 autocast: the Q-values
    of the two results (both read in float32) are far closer to each other than to the Q-values
    the updates started from, and closer than float32 updates on the same batches in the
    reverse order."""
    import copy

    from vecaccel.trainers import DQN

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    agent = DQN(
        "MinAtar/Breakout-v0", preset="minatar-dqn", num_envs=8, learning_starts=1_000,
        buffer_size=5_000, bf16="off", device="cpu", seed=4, tensorboard=False,
    )  # fmt: skip
    try:
        agent.learn(2_000)  # a buffer of real play, and a network that has learned a little
        twin = DQN(
            None, observation_space=agent.observation_space, action_space=agent.action_space,
            **{**vars(agent.config), "bf16": "on", "tensorboard": False},
        )  # fmt: skip
        assert twin.q_network.body.bf16 and not agent.q_network.body.bf16
        reordered = DQN(
            None, observation_space=agent.observation_space, action_space=agent.action_space,
            **{**vars(agent.config), "tensorboard": False},
        )  # fmt: skip
        for copy_ in (twin, reordered):
            for name in ("q_network", "target_network", "optimizer"):
                getattr(copy_, name).load_state_dict(getattr(agent, name).state_dict())
        batches = [agent.buffer.sample(512) for _ in range(10)]
        probe = copy.deepcopy(agent.q_network)  # reads any weights in float32
        obs = torch.as_tensor(batches[0].obs)

        def q_values(network):
            probe.load_state_dict(network.state_dict())
            with torch.no_grad():
                return probe(obs)

        before = q_values(agent.q_network)
        for batch, other in zip(batches, reversed(batches)):
            agent.update(batch)
            twin.update(batch)
            reordered.update(other)
        after32, after16 = q_values(agent.q_network), q_values(twin.q_network)
        moved = float((after32 - before).abs().mean())
        apart = float((after16 - after32).abs().mean())
        order_apart = float((q_values(reordered.q_network) - after32).abs().mean())
        assert moved > 0
        # measured: apart is 3 % of moved and 63 % of order_apart (the test is deterministic:
        # fixed seeds, one thread)
        assert apart < 0.1 * moved
        assert apart < order_apart
    finally:
        agent.close()
        torch.set_num_threads(threads)


def test_network_minatar_by_name_refuses_other_shapes():
    import gymnasium as gym

    from vecaccel.trainers.nets.networks import make_encoder

    with pytest.raises(ValueError, match="MinAtar network needs"):
        make_encoder(gym.spaces.Box(0, 1, (4,)), network="minatar")
    with pytest.raises(ValueError, match="network must be one of"):
        make_encoder(gym.spaces.Box(0, 1, (4,)), network="resnet")


def test_presets_are_made_for_every_minatar_id_and_refused_elsewhere():
    from vecaccel.trainers.config.presets import check_preset_fits, preset_for_env

    for game in GAMES:
        for version in ("v0", "v1"):
            env_id = f"MinAtar/{game}-{version}"
            algos = ("ppo", "a2c", "dqn", "c51", "rainbow", "pqn")
            assert [preset_for_env(a, env_id) for a in algos] == [
                "minatar", "minatar", "minatar-dqn", "minatar-c51", "minatar-rainbow", "minatar",
            ]  # fmt: skip
    with pytest.raises(ValueError, match="'CartPole-v1' is not one: use the preset made for it"):
        check_preset_fits("ppo", "minatar", "CartPole-v1")
    from vecaccel.trainers import PPO

    with pytest.raises(ValueError, match="preset 'minatar' of ppo is made for MinAtar's games"):
        PPO(env=None, env_id="Pendulum-v1", preset="minatar", device="cpu")


SMOKE = {
    "a2c": dict(num_envs=8),
    "ppo": dict(num_envs=8, num_steps=16, num_minibatches=2, update_epochs=1),
    "dqn": dict(num_envs=4, batch_size=32, learning_starts=64, buffer_size=2_000),
    "c51": dict(num_envs=4, batch_size=32, learning_starts=64, buffer_size=2_000),
    "rainbow": dict(num_envs=4, batch_size=32, learning_starts=64, buffer_size=2_000),
    "pqn": dict(num_envs=8, num_steps=16, num_minibatches=4),
}


@pytest.mark.parametrize("algo", sorted(SMOKE))
def test_each_algorithm_trains_a_few_hundred_steps_with_its_preset(algo, tmp_path):
    from vecaccel.trainers.config import registry
    from vecaccel.trainers.nets.networks import MinAtarNet

    cls = registry.get(algo).load_class()
    agent = cls(
        "MinAtar/SpaceInvaders-v1", backend="serial", seed=2, device="cpu", tensorboard=False,
        run_dir=str(tmp_path), **SMOKE[algo],
    )  # fmt: skip
    try:
        assert agent.config.preset.startswith("minatar")
        network = agent.model if hasattr(agent, "model") else agent.q_network
        assert any(isinstance(module, MinAtarNet) for module in network.modules())
        agent.learn(400)
        assert agent.global_step >= 400 and agent.num_updates > 0
        obs, _ = agent.envs.reset(seed=0)
        actions, _ = agent.predict(obs, deterministic=True)
        assert actions.shape == (agent.envs.num_envs,)
    finally:
        agent.close()
    assert (tmp_path / "checkpoint.pt").exists()


def test_train_and_eval_on_the_command_line(tmp_path, capsys):
    from vecaccel.cli import main

    run_dir = tmp_path / "run"
    code = main(
        ["train", "ppo", "--env", "MinAtar/Breakout-v0", "--total-timesteps", "4096",
         "--backend", "serial", "--run-dir", str(run_dir), "--no-progress", "--device", "cpu"]
    )  # fmt: skip
    assert code == 0
    assert "preset: minatar, made for MinAtar games" in capsys.readouterr().err
    assert main(["eval", str(run_dir), "--episodes", "2"]) == 0
    code = main(
        ["train", "ppo", "--env", "CartPole-v1", "--preset", "minatar", "--total-timesteps", "64"]
    )
    assert code != 0
    assert "made for MinAtar's games" in capsys.readouterr().err
