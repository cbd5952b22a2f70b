"""Networks for the bundled trainers: Nature-CNN, MinAtar and MLP actor-critics and Q-networks.

Every layer is orthogonally initialised (gain sqrt(2) in the body, 0.01 for policy logits, 1 for
values), as in the baselines, SB3 and CleanRL. Image observations (uint8, ``[C, H, W]``) are
scaled by 1/255 inside the network, so buffers stay uint8. Images laid out ``[H, W, C]`` (the
renders PettingZoo envs such as pistonball observe) go to the same CNN, which reads them in
place as NHWC. MinAtar's ``bool`` ``[10, 10, C]`` grids go to the MinAtar paper's network
(:class:`MinAtarNet`), which turns them into float channels-first tensors on the device. Every
torso takes ``layer_norm``: a LayerNorm after each hidden layer, before its activation (PQN's
networks, Gallici et al., 2025), over the channels at each position after a convolution.

Example:
    >>> import gymnasium as gym, torch
    >>> model = ActorCritic(gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))
    >>> actions, extras = model(torch.zeros(3, 4))
    >>> actions.shape, sorted(extras)
    (torch.Size([3]), ['log_prob', 'value'])
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from vecaccel.trainers.config.settings import NETWORKS

__all__ = [
    "ActorCritic",
    "ChannelLayerNorm",
    "MLP",
    "MinAtarNet",
    "NatureCNN",
    "QNetwork",
    "TwinMLP",
    "bf16_autocast_helps",
    "use_bf16",
    "layer_init",
    "make_encoder",
]


def layer_init(layer: nn.Module, std: float = math.sqrt(2), bias: float = 0.0) -> nn.Module:
    """Orthogonal weights with gain ``std`` and constant bias, in place; returns the layer."""
    nn.init.orthogonal_(layer.weight, std)
    nn.init.constant_(layer.bias, bias)
    return layer


#: the LayerNorms' epsilon: flax's, which purejaxql's PQN networks use (torch's default is 1e-5)
LAYER_NORM_EPS = 1e-6


class ChannelLayerNorm(nn.LayerNorm):
    """LayerNorm over the channels of an ``[N, C, H, W]`` map, at each position on its own: what
    a LayerNorm over the last axis does to an ``[N, H, W, C]`` one (flax's, after a convolution
    in purejaxql's PQN networks).

    Example:
        >>> norm = ChannelLayerNorm(3)
        >>> out = norm(torch.randn(2, 3, 5, 5))
        >>> out.shape, bool(out.mean(dim=1).abs().max() < 1e-5)
        (torch.Size([2, 3, 5, 5]), True)
    """

    def __init__(self, channels: int) -> None:
        super().__init__(channels, eps=LAYER_NORM_EPS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # a view either way: NHWC is the channels_last layout of NCHW
        return super().forward(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)


def _norm(layer_norm: bool, features: int, channels: bool = False) -> list[nn.Module]:
    """The normalisation a torso puts after a layer of ``features`` outputs: none, or a
    LayerNorm (over the channels of a convolution's map)."""
    if not layer_norm:
        return []
    return [ChannelLayerNorm(features) if channels else nn.LayerNorm(features, eps=LAYER_NORM_EPS)]


def bf16_autocast_helps(device: str | torch.device = "cpu") -> bool:
    """Whether bfloat16 autocast is likely to speed up convolutions on ``device``.

    On CPUs it pays with native bf16 matrix units (AMX, or AVX512-BF16); on CUDA with
    compute capability 8.0 or newer. With AVX512-BF16 alone, PPO on Pong (Nature CNN,
    channels_last) trains about 1.6x faster end to end than in float32 (see the benchmark
    pages), and its updates stay within rounding of float32's
    (``tests/trainers/nets/test_networks_bf16.py``).
    """
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if device.type == "cpu":
        cpu = getattr(torch, "cpu", None)
        for probe in ("_is_amx_tile_supported", "_is_avx512_bf16_supported"):
            check = getattr(cpu, probe, None)
            if check is not None and check():
                return True
    return False


def use_bf16(setting: str, device: str | torch.device, observation_space: gym.Space) -> bool:
    """Whether a torso runs under bf16 autocast for a config's ``bf16`` setting (one of
    :data:`~vecaccel.trainers.config.settings.BF16_SETTINGS`, checked with the config): ``"on"``
    always, ``"auto"`` for image-like ``[H, W, C]``/``[C, H, W]`` observations (a convolutional
    torso) on a device where :func:`bf16_autocast_helps`, ``"off"`` never.

    Example:
        >>> use_bf16("auto", "cpu", gym.spaces.Box(-1, 1, (4,)))
        False
    """
    if setting == "auto":
        shape = getattr(observation_space, "shape", None) or ()
        return len(shape) == 3 and bf16_autocast_helps(device)
    return setting == "on"


def check_observation_space(space: gym.Space) -> None:
    """Raise ``TypeError`` unless observations of ``space`` are arrays with a feature axis
    (Box, MultiBinary, MultiDiscrete): the networks take ``[N, ...]`` float tensors."""
    shape = getattr(space, "shape", None)
    if (
        not isinstance(space, (gym.spaces.Box, gym.spaces.MultiBinary, gym.spaces.MultiDiscrete))
        or not shape
    ):
        raise TypeError(
            f"the trainers' networks take array observations (Box, MultiBinary, "
            f"MultiDiscrete with at least one axis), got {space}; wrap the env in "
            "gymnasium.wrappers.FlattenObservation, which turns a Dict, Tuple or Discrete "
            "observation into one flat Box (a Discrete one one-hot encoded)"
        )


def _is_image_space(space: gym.Space) -> bool:
    return isinstance(space, gym.spaces.Box) and space.dtype == np.uint8 and len(space.shape) == 3


def _is_minatar_space(space: gym.Space) -> bool:
    """MinAtar's observation: a ``bool`` ``Box`` of shape ``[10, 10, C]``."""
    return (
        isinstance(space, gym.spaces.Box)
        and space.dtype == np.bool_
        and len(space.shape) == 3
        and space.shape[:2] == (10, 10)
    )


class NatureCNN(nn.Module):
    """The DQN Nature paper's convolutional torso: 3 convs and a 512-unit linear layer.

    Args:
        in_channels: stacked frames (4 for the standard Atari set-up), or colour channels.
        image_size: height and width of a square input, or ``(height, width)``.
        features: output width.
        channels_last: keep the convolutions in NHWC memory format (faster on CPUs).
        bf16: run the torso under bfloat16 autocast; outputs are cast back to float32.
        channels_last_input: observations come as ``[N, H, W, C]`` (else ``[N, C, H, W]``).
        layer_norm: a LayerNorm after each convolution (over its channels) and after the
            linear layer, before their ReLUs.
    """

    def __init__(
        self,
        in_channels: int = 4,
        image_size: int | tuple[int, int] = 84,
        features: int = 512,
        channels_last: bool = False,
        bf16: bool = False,
        channels_last_input: bool = False,
        layer_norm: bool = False,
    ) -> None:
        super().__init__()
        height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
        layers: list[nn.Module] = []
        channels = in_channels
        for out, kernel, stride in ((32, 8, 4), (64, 4, 2), (64, 3, 1)):
            layers += [layer_init(nn.Conv2d(channels, out, kernel, stride=stride))]
            layers += [*_norm(layer_norm, out, channels=True), nn.ReLU()]
            channels = out
        self.convs = nn.Sequential(*layers, nn.Flatten())
        with torch.no_grad():
            flat = self.convs(torch.zeros(1, in_channels, height, width)).shape[1]
        self.linear = nn.Sequential(
            layer_init(nn.Linear(flat, features)), *_norm(layer_norm, features), nn.ReLU()
        )
        self.out_features = features
        self.channels_last = channels_last
        self.bf16 = bf16
        self.channels_last_input = channels_last_input
        if channels_last:
            self.convs.to(memory_format=torch.channels_last)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        # One conversion pass straight to the convolutions' dtype and memory format, then an
        # in-place division, instead of float32 conversion, division, re-layout and autocast's
        # cast to bfloat16 (a quarter of a bf16 training step in torch.profiler). Bit for bit
        # the same result (tests/trainers/nets/test_networks_bf16.py): 0..255 are
        # exact in bfloat16, and bfloat16 division rounds the float32 quotient once, as
        # autocast's cast of it does.
        if self.channels_last_input:  # a view: NHWC memory is the channels_last layout of NCHW
            obs = obs.permute(0, 3, 1, 2)
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        dtype = torch.bfloat16 if self.bf16 and obs.dtype == torch.uint8 else torch.float32
        x = obs.to(dtype=dtype, memory_format=memory_format, copy=True)
        if obs.dtype == torch.uint8:  # pixels 0..255; float images are taken as they come
            x = x.div_(255.0)
        context = (
            torch.autocast(device_type=x.device.type, dtype=torch.bfloat16)
            if self.bf16
            else contextlib.nullcontext()
        )
        with context:
            x = self.linear(self.convs(x))
        return x.float()


class MinAtarNet(nn.Module):
    """The torso of the MinAtar paper (Young & Tian, 2019): one 3x3 convolution of 16 channels,
    stride 1, ReLU, then a 128-unit linear layer with ReLU; the heads go on top.

    Observations come as MinAtar gives them, ``[N, H, W, C]`` (``bool`` or any number type), and
    are read as NCHW floats on the device; ``channels_last_input=False`` takes ``[N, C, H, W]``.

    Args:
        in_channels: the game's channels (Breakout 4, Freeway 7, Seaquest 10...).
        image_size: height and width of a square input, or ``(height, width)`` (MinAtar: 10).
        features: output width (128 in the paper).
        channels_last_input: observations come as ``[N, H, W, C]`` (else ``[N, C, H, W]``).
        bf16: run the torso under bfloat16 autocast; outputs are cast back to float32.
        layer_norm: a LayerNorm after the convolution (over its 16 channels, at each position)
            and after the linear layer, before their ReLUs: purejaxql's PQN network for MinAtar.

    Example:
        >>> net = MinAtarNet(4)
        >>> net(torch.zeros(2, 10, 10, 4, dtype=torch.bool)).shape
        torch.Size([2, 128])
    """

    def __init__(
        self,
        in_channels: int,
        image_size: int | tuple[int, int] = 10,
        features: int = 128,
        channels_last_input: bool = True,
        bf16: bool = False,
        layer_norm: bool = False,
    ) -> None:
        super().__init__()
        height, width = (image_size, image_size) if isinstance(image_size, int) else image_size
        self.conv = nn.Sequential(
            layer_init(nn.Conv2d(in_channels, 16, 3, stride=1)),
            *_norm(layer_norm, 16, channels=True),
            nn.ReLU(),
            nn.Flatten(),
        )
        flat = 16 * (height - 2) * (width - 2)
        self.linear = nn.Sequential(
            layer_init(nn.Linear(flat, features)), *_norm(layer_norm, features), nn.ReLU()
        )
        self.out_features = features
        self.channels_last_input = channels_last_input
        self.bf16 = bf16

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if self.channels_last_input:
            obs = obs.permute(0, 3, 1, 2)
        if not self.bf16:
            return self.linear(self.conv(obs.to(torch.float32)))
        # booleans (0 and 1) are exact in bfloat16: one cast, straight to the convolution's dtype
        x = obs.to(torch.bfloat16 if obs.dtype == torch.bool else torch.float32)
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
            x = self.linear(self.conv(x))
        return x.float()


class MLP(nn.Module):
    """A multilayer perceptron torso over flattened observations.

    Args:
        in_features: flattened observation size.
        hidden_sizes: widths of the hidden layers.
        activation: ``"tanh"`` or ``"relu"``.
        layer_norm: a LayerNorm after each hidden layer, before its activation.
    """

    def __init__(
        self,
        in_features: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        layer_norm: bool = False,
    ) -> None:
        super().__init__()
        activations = {"tanh": nn.Tanh, "relu": nn.ReLU}
        if activation not in activations:
            raise ValueError(f"activation must be one of {sorted(activations)}, got {activation!r}")
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for size in hidden_sizes:
            layers += [layer_init(nn.Linear(width, size)), *_norm(layer_norm, size)]
            layers += [activations[activation]()]
            width = size
        self.body = nn.Sequential(*layers)
        self.out_features = width

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.body(obs.float())


def make_encoder(
    observation_space: gym.Space,
    network: str = "auto",
    hidden_sizes: Sequence[int] = (64, 64),
    activation: str = "tanh",
    channels_last: bool = False,
    bf16: bool = False,
    layer_norm: bool = False,
) -> nn.Module:
    """The torso ``network`` names (:data:`NETWORKS`); ``auto``: a Nature-CNN for uint8 images,
    the MinAtar network for MinAtar's boolean ``[10, 10, C]`` grids, an MLP otherwise;
    ``layer_norm``: with a LayerNorm after each of its hidden layers."""
    check_observation_space(observation_space)
    if network not in NETWORKS:
        raise ValueError(f"network must be one of {', '.join(NETWORKS)}, got {network!r}")
    if network == "minatar" or (network == "auto" and _is_minatar_space(observation_space)):
        shape = observation_space.shape
        if shape is None or len(shape) != 3 or min(shape) < 3:
            raise ValueError(
                "the MinAtar network needs [H, W, C] grids of at least 3x3 (MinAtar's "
                f"[10, 10, C]), got shape {shape}"
            )
        return MinAtarNet(shape[2], (shape[0], shape[1]), bf16=bf16, layer_norm=layer_norm)
    if network == "cnn" or (network == "auto" and _is_image_space(observation_space)):
        shape = observation_space.shape
        if shape is None or len(shape) != 3:
            raise ValueError(
                f"the Nature CNN needs [C, H, W] or [H, W, C] observations, got shape {shape}"
            )
        # a colour image [H, W, C] (C <= 4 channels, H and W larger), else stacked frames first
        last = shape[2] <= 4 < min(shape[0], shape[1])
        channels, height, width = (shape[2], shape[0], shape[1]) if last else shape
        if min(height, width) < 36:
            raise ValueError(
                f"the Nature CNN needs images of at least 36x36 pixels, got shape {shape}"
            )
        return NatureCNN(
            channels,
            (height, width),
            channels_last=channels_last,
            bf16=bf16,
            channels_last_input=last,
            layer_norm=layer_norm,
        )
    in_features = int(np.prod(observation_space.shape or (1,)))
    return MLP(in_features, hidden_sizes, activation, layer_norm)


class TwinMLP(nn.Module):
    """``copies`` MLPs of the same shape over the same input, evaluated together.

    Each layer is one batched matrix multiply (``baddbmm``) over a ``[copies, in, out]`` weight
    instead of ``copies`` separate ``Linear`` calls, which halves the kernel launches of SB3's
    separate actor and critic MLPs; mathematically it is exactly ``copies`` independent MLPs
    (each slice is initialised orthogonally, like :func:`layer_init`).

    Args:
        in_features: flattened observation size.
        hidden_sizes: widths of the hidden layers.
        activation: ``"tanh"`` or ``"relu"``.
        copies: how many MLPs.
    """

    def __init__(
        self,
        in_features: int,
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        copies: int = 2,
    ) -> None:
        super().__init__()
        activations = {"tanh": torch.tanh, "relu": torch.relu}
        if activation not in activations:
            raise ValueError(f"activation must be one of {sorted(activations)}, got {activation!r}")
        if not hidden_sizes:
            raise ValueError(
                "hidden_sizes must hold at least one layer width (MLP networks), got "
                f"{tuple(hidden_sizes)!r}"
            )
        self.activation = activations[activation]
        self.copies = copies
        self.weights = nn.ParameterList()
        self.biases = nn.ParameterList()
        width = in_features
        for size in hidden_sizes:
            weight = torch.empty(copies, width, size)
            for copy in range(copies):
                # orthogonal over (out, in) as nn.Linear stores it, then transposed for bmm
                nn.init.orthogonal_(weight[copy].T, math.sqrt(2))
            self.weights.append(nn.Parameter(weight))
            self.biases.append(nn.Parameter(torch.zeros(copies, 1, size)))
            width = size
        self.out_features = width

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """``[copies, N, out_features]`` features of each MLP."""
        x = obs.float().flatten(1).expand(self.copies, -1, -1)
        for weight, bias in zip(self.weights, self.biases):
            x = self.activation(torch.baddbmm(bias, x, weight))
        return x


class ActorCritic(nn.Module):
    """Policy and value function for A2C and PPO, callable as a :class:`vecaccel.Sampler` policy.

    Image observations share one Nature-CNN torso between the policy and value heads (as in
    the paper and CleanRL's Atari scripts), MinAtar grids one :class:`MinAtarNet`; vector observations get separate actor and critic
    MLPs (SB3's default ``MlpPolicy``), run together as a :class:`TwinMLP`. Discrete actions use
    a categorical distribution, Box actions a diagonal Gaussian with a state-independent log
    standard deviation.

    Args:
        observation_space: the single-env observation space.
        action_space: the single-env action space (``Discrete`` or ``Box``).
        network: ``"auto"``, ``"cnn"`` or ``"mlp"``.
        hidden_sizes: MLP widths.
        activation: MLP activation.
        channels_last: NHWC convolutions.
        bf16: bfloat16 autocast in the convolutional torso (Nature CNN or MinAtar's).
        log_std_init: the Gaussian's initial log standard deviation (Box actions).
    """

    def __init__(
        self,
        observation_space: gym.Space,
        action_space: gym.Space,
        network: str = "auto",
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "tanh",
        channels_last: bool = False,
        bf16: bool = False,
        log_std_init: float = 0.0,
    ) -> None:
        super().__init__()
        self.observation_space = observation_space
        self.action_space = action_space
        encoder = make_encoder(
            observation_space, network, hidden_sizes, activation, channels_last, bf16
        )
        self.shared = isinstance(encoder, (NatureCNN, MinAtarNet))
        if not self.shared:
            in_features = int(np.prod(observation_space.shape or (1,)))
            encoder = TwinMLP(in_features, hidden_sizes, activation, copies=2)
        self.encoder = encoder
        width = encoder.out_features
        if isinstance(action_space, gym.spaces.Discrete):
            self.continuous = False
            self.actor_head = layer_init(nn.Linear(width, int(action_space.n)), std=0.01)
        elif isinstance(action_space, gym.spaces.Box):
            self.continuous = True
            # the Gaussian is over the flattened action; actions leave with the space's shape
            # (SB3 reshapes the same way), so a Box(2, 2) env gets [2, 2] actions
            self.action_shape = tuple(action_space.shape)
            action_dim = int(np.prod(action_space.shape))
            self.actor_head = layer_init(nn.Linear(width, action_dim), std=0.01)
            self.log_std = nn.Parameter(torch.full((action_dim,), float(log_std_init)))
        else:
            raise TypeError(
                f"ActorCritic supports Discrete and Box action spaces, got {action_space}"
            )
        self.critic_head = layer_init(nn.Linear(width, 1), std=1.0)

    def _features(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.encoder(obs)
        if self.shared:
            return features, features
        return features[0], features[1]

    def _heads(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        actor_features, critic_features = self._features(obs)
        return self.actor_head(actor_features), self.critic_head(critic_features).squeeze(-1)

    def value(self, obs: torch.Tensor) -> torch.Tensor:
        """``V(obs)``, shape ``[N]``."""
        return self.critic_head(self._features(obs)[1]).squeeze(-1)

    # Categorical and Gaussian written out: torch.distributions' objects cost more per call
    # (argument validation, lazy properties) than the arithmetic itself on small batches.

    def _log_prob_entropy(
        self, logits: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.continuous:
            actions = actions.reshape(logits.shape)  # [N, *action_shape] to the flat Gaussian's
            log_std = self.log_std.expand_as(logits)
            z = (actions - logits) / log_std.exp()
            log_prob = (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)
            entropy = (0.5 + 0.5 * math.log(2 * math.pi) + log_std).sum(-1)
            return log_prob, entropy
        log_probs = logits.log_softmax(-1)
        log_prob = log_probs.gather(-1, actions.long().unsqueeze(-1)).squeeze(-1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return log_prob, entropy

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if self.continuous:
            std = self.log_std.exp().expand_as(logits)
            actions = logits + std * torch.randn_like(logits)
            log_prob = self._log_prob_entropy(logits, actions)[0]
            return self._shaped(actions), log_prob
        # inverse-CDF sampling: a few elementwise ops, cheaper than torch.multinomial
        log_probs = logits.log_softmax(-1)
        cdf = log_probs.exp().cumsum(-1)
        uniform = torch.rand(cdf.shape[:-1] + (1,), device=cdf.device, dtype=cdf.dtype)
        actions = (cdf < uniform).sum(-1).clamp_(max=logits.shape[-1] - 1)
        return actions, log_probs.gather(-1, actions.unsqueeze(-1)).squeeze(-1)

    def _shaped(self, actions: torch.Tensor) -> torch.Tensor:
        """Flat Gaussian actions ``[N, prod(shape)]`` as ``[N, *action_space.shape]``."""
        return actions.reshape(actions.shape[0], *self.action_shape)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Sample actions: ``(actions, {"log_prob": ..., "value": ...})``; Box actions have the
        shape ``[N, *action_space.shape]``."""
        logits, value = self._heads(obs)
        actions, log_prob = self._sample(logits)
        return actions, {"log_prob": log_prob, "value": value}

    def evaluate(
        self, obs: torch.Tensor, actions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(log_prob, entropy, value)`` of ``actions`` at ``obs``, with gradients.

        Box actions may come as ``[N, *action_space.shape]`` or flattened, ``[N, prod(shape)]``.
        """
        logits, value = self._heads(obs)
        log_prob, entropy = self._log_prob_entropy(logits, actions)
        return log_prob, entropy, value

    @torch.no_grad()
    def act(self, obs: torch.Tensor, deterministic: bool = False) -> torch.Tensor:
        """Actions only: the mode when ``deterministic``, else a sample (shaped as
        :meth:`forward`'s)."""
        logits = self.actor_head(self._features(obs)[0])
        if not deterministic:
            return self._sample(logits)[0]
        return self._shaped(logits) if self.continuous else logits.argmax(-1)


class QNetwork(nn.Module):
    """Q-values (or return distributions) over discrete actions, optionally dueling.

    Args:
        observation_space: the single-env observation space.
        num_actions: number of discrete actions.
        network: ``"auto"``, ``"cnn"`` or ``"mlp"``.
        hidden_sizes: MLP widths.
        activation: MLP activation (``"relu"`` is the DQN default).
        dueling: separate value and advantage streams (Wang et al., 2016).
        num_atoms: 1 for expected Q-values; more for a categorical (C51) distribution, in which
            case ``forward`` returns logits of shape ``[N, num_actions, num_atoms]``.
        channels_last: NHWC convolutions.
        bf16: bfloat16 autocast in the convolutional torso (Nature CNN or MinAtar's).
        layer_norm: a LayerNorm after each hidden layer of the torso (PQN's networks).
    """

    def __init__(
        self,
        observation_space: gym.Space,
        num_actions: int,
        network: str = "auto",
        hidden_sizes: Sequence[int] = (64, 64),
        activation: str = "relu",
        dueling: bool = False,
        num_atoms: int = 1,
        channels_last: bool = False,
        bf16: bool = False,
        layer_norm: bool = False,
    ) -> None:
        super().__init__()
        self.num_actions = int(num_actions)
        self.num_atoms = int(num_atoms)
        self.dueling = dueling
        self.body = make_encoder(
            observation_space, network, hidden_sizes, activation, channels_last, bf16, layer_norm
        )
        width = self.body.out_features
        self.advantage_head = layer_init(nn.Linear(width, self.num_actions * self.num_atoms), 1.0)
        self.value_head = layer_init(nn.Linear(width, self.num_atoms), 1.0) if dueling else None

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Q-values ``[N, A]``, or logits ``[N, A, num_atoms]`` when ``num_atoms > 1``."""
        features = self.body(obs)
        out = self.advantage_head(features).view(-1, self.num_actions, self.num_atoms)
        if self.value_head is not None:
            value = self.value_head(features).view(-1, 1, self.num_atoms)
            out = value + out - out.mean(dim=1, keepdim=True)
        return out.squeeze(-1) if self.num_atoms == 1 else out
