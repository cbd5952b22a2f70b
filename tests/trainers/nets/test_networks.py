"""The trainers' models: observation encoders, image scaling, the Gaussian policy head."""

from __future__ import annotations

import math

import pytest
import torch
from helpers import pendulum_agent

from vecaccel.trainers import DQN, PPO
from vecaccel.trainers.nets.networks import NatureCNN

torch.set_num_threads(1)

# -- continuous actions -----------------------------------------------------------------------


def test_gaussian_log_prob_and_entropy_match_torch_normal():
    """The hand-written diagonal Gaussian equals ``torch.distributions.Normal``."""
    agent = pendulum_agent(mean=0.3, log_std=-0.4)
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


def _vector(env_cls: type, same_step: bool):
    import gymnasium as gym

    mode = gym.vector.AutoresetMode.SAME_STEP if same_step else gym.vector.AutoresetMode.NEXT_STEP
    return gym.vector.SyncVectorEnv([env_cls, env_cls], autoreset_mode=mode)


@pytest.mark.parametrize("cls", [PPO, DQN])
@pytest.mark.parametrize("env_name", ["TextObsEnv", "TextActionEnv"])
def test_a_space_with_no_fixed_size_is_refused_naming_it_and_the_backends(cls, env_name):
    """Every backend steps Text, Graph, Sequence and OneOf spaces; the trainers need tensors,
    and say so when they get the env, before any training step."""
    import toy_envs

    envs = _vector(getattr(toy_envs, env_name), same_step=cls is DQN)
    try:
        with pytest.raises(TypeError) as caught:
            cls(envs, device="cpu")
    finally:
        envs.close()
    message = str(caught.value)
    role = "observation" if env_name == "TextObsEnv" else "action"
    assert f"{cls.__name__} needs tensors, but the {role} space Text(" in message
    assert "backend='serial', 'shm', 'hybrid' or 'async'" in message


@pytest.mark.parametrize("cls", [PPO, DQN])
def test_a_nested_part_with_no_fixed_size_is_named(cls):
    import gymnasium as gym

    sequence = gym.spaces.Sequence(gym.spaces.Box(0, 1, (2,)))
    observation_space = gym.spaces.Dict(
        pos=gym.spaces.Box(0, 1, (3,)), history=gym.spaces.Tuple((gym.spaces.Discrete(2), sequence))
    )
    with pytest.raises(TypeError, match=r"no fixed size at obs\['history'\]\[1\]: Sequence\(Box"):
        if cls is DQN:  # the asynchronous runner's way in: spaces without envs
            DQN(env=None, device="cpu").attach_spaces(observation_space, gym.spaces.Discrete(2))
        else:
            PPO(None, observation_space=observation_space, action_space=gym.spaces.Discrete(2))


def test_cnn_scales_only_uint8_images():
    """``nets/networks.py`` says uint8 images are scaled by 1/255 in the network; NatureCNN divides
    every input by 255, so a float image already in [0, 1] (``network="cnn"`` on a float Box)
    reaches the convolutions 255 times too small. SB3 scales uint8 image spaces only."""
    cnn = NatureCNN(4, 84)
    images = torch.randint(0, 256, (2, 4, 84, 84), generator=torch.Generator().manual_seed(0))
    as_uint8 = images.to(torch.uint8)
    as_unit_float = images.float() / 255.0
    torch.testing.assert_close(cnn(as_unit_float), cnn(as_uint8))


@pytest.mark.parametrize("cls", [PPO, DQN])
def test_a_dict_observation_is_refused_naming_the_wrapper_that_flattens_it(cls):
    """A Dict observation has no feature axis: the refusal names Gymnasium's
    ``FlattenObservation``, and the env so wrapped is taken."""
    import gymnasium as gym
    import toy_envs

    mode = gym.vector.AutoresetMode.SAME_STEP if cls is DQN else gym.vector.AutoresetMode.NEXT_STEP
    envs = gym.vector.SyncVectorEnv([toy_envs.DictObsEnv] * 2, autoreset_mode=mode)
    try:
        with pytest.raises(TypeError) as caught:
            cls(envs, device="cpu")
    finally:
        envs.close()
    message = str(caught.value)
    assert "got Dict(" in message and "gymnasium.wrappers.FlattenObservation" in message

    def flat():
        return gym.wrappers.FlattenObservation(toy_envs.DictObsEnv())

    small = {"buffer_size": 64, "learning_starts": 16, "batch_size": 4} if cls is DQN else {}
    agent = cls(gym.vector.SyncVectorEnv([flat] * 2, autoreset_mode=mode), device="cpu", **small)
    try:
        assert agent.envs.single_observation_space.shape == (8,)
    finally:
        agent.close()


# -- LayerNorm ----------------------------------------------------------------------------------


def test_channel_layer_norm_normalises_each_position_over_its_channels():
    """As a LayerNorm over the last axis of the ``[N, H, W, C]`` map (flax's, in purejaxql),
    on the ``[N, C, H, W]`` map torch's convolutions give, in either memory format."""
    from vecaccel.trainers.nets.networks import ChannelLayerNorm

    norm = ChannelLayerNorm(6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
        norm.bias.uniform_(-1.0, 1.0)
    x = torch.randn(3, 6, 5, 4, generator=torch.Generator().manual_seed(1))
    reference = torch.nn.functional.layer_norm(
        x.permute(0, 2, 3, 1), (6,), norm.weight, norm.bias, eps=norm.eps
    ).permute(0, 3, 1, 2)
    torch.testing.assert_close(norm(x), reference)
    torch.testing.assert_close(norm(x.to(memory_format=torch.channels_last)), reference)


@pytest.mark.parametrize(
    ("shape", "dtype", "network", "norms"),
    [
        ((4,), torch.float32, "mlp", 2),  # after each of the two hidden layers
        ((10, 10, 4), torch.bool, "minatar", 2),  # after the convolution and the hidden layer
        ((4, 84, 84), torch.uint8, "cnn", 4),  # after each convolution and the hidden layer
    ],
)
def test_layer_norm_goes_after_every_hidden_layer_and_leaves_the_plain_torsos_as_they_were(
    shape, dtype, network, norms
):
    """``layer_norm=True`` adds a LayerNorm after each hidden layer of each torso, before its
    activation; without it a torso's parameters keep their names, so saved checkpoints load."""
    import gymnasium as gym
    import numpy as np

    from vecaccel.trainers.nets.networks import QNetwork

    low, high, np_dtype = (0, 255, np.uint8) if dtype == torch.uint8 else (0, 1, np.float32)
    if dtype == torch.bool:
        np_dtype = np.bool_
    space = gym.spaces.Box(low, high, shape, np_dtype)
    plain = QNetwork(space, 3, network=network, hidden_sizes=(16, 8))
    normed = QNetwork(space, 3, network=network, hidden_sizes=(16, 8), layer_norm=True)
    layers = [m for m in normed.body.modules() if isinstance(m, torch.nn.LayerNorm)]
    assert len(layers) == norms
    assert not any(isinstance(m, torch.nn.LayerNorm) for m in plain.modules())
    weights = {name for name in plain.state_dict() if not name.startswith("advantage_head")}
    expected = {
        "mlp": {"body.body.1.weight", "body.body.1.bias", "body.body.3.weight", "body.body.3.bias"},
        "minatar": {"body.conv.0.weight", "body.conv.0.bias", "body.linear.0.weight",
                    "body.linear.0.bias"},
        "cnn": {f"body.convs.{i}.{p}" for i in (0, 2, 4) for p in ("weight", "bias")}
        | {"body.linear.0.weight", "body.linear.0.bias"},
    }[network]  # fmt: skip
    assert weights == expected
    obs = torch.zeros(2, *shape, dtype=dtype)
    assert normed(obs).shape == plain(obs).shape == (2, 3)
