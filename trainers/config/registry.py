"""The one list of algorithms: the bundled ones and those plugins register, by name.

Everything that needs to know which algorithms exist reads :func:`algorithms` (or :func:`get`):
``vecaccel train ALGO`` (its sub-commands and their ``--help``), ``vecaccel eval`` (which class
loads a checkpoint). It asks every plugin's ``vecaccel_register_algorithms`` hook (see
:mod:`vecaccel.hookspecs`); the bundled algorithms of :data:`ALGORITHMS` are registered through
that hook too, by :mod:`vecaccel.trainers.cli.commands`, as a third party's are through its
entry point. Classes and presets are named by module path and imported only when asked for, so
reading the registry imports neither torch nor an algorithm: the command line's plugin reads it
while ``vecaccel --help`` is built. The lazy exports of :mod:`vecaccel.trainers` and the map from
env ids to presets (:mod:`vecaccel.trainers.config.presets`) read the bundled ones alone.

A new algorithm is one module (config dataclass, loss, ``update``, on a family's base) and an
:class:`AlgorithmInfo` registered by a plugin (see ``docs/writing-an-algorithm.md`` and
``examples/vecaccel-example-algorithm``).

Example:
    >>> names()
    ['a2c', 'ppo', 'dqn', 'c51', 'rainbow', 'pqn']
    >>> get("ppo").summary
    'proximal policy optimization'
    >>> get("ppo").load_class().__name__, sorted(get("c51").load_presets())[:2]
    ('PPO', ['atari-c51', 'atari-dqn'])
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ALGORITHMS",
    "ATARI",
    "EXPORTS",
    "MINATAR",
    "MUJOCO_LOCOMOTION",
    "AlgorithmInfo",
    "AlgorithmRegistry",
    "algorithms",
    "exports",
    "get",
    "load",
    "names",
]

#: Stands for every ALE game id in an algorithm's ``made_for`` (``ALE/Pong-v5``,
#: ``PongNoFrameskip-v4``...), as :func:`~vecaccel.trainers.envs.make.is_atari_id` decides.
ATARI = "<every ALE id>"
#: Gymnasium's MuJoCo locomotion tasks, the ones the ``mujoco`` presets are made for
MUJOCO_LOCOMOTION = ("HalfCheetah-v5", "Hopper-v5", "Walker2d-v5", "Ant-v5", "Humanoid-v5")
#: Stands for every MinAtar game id in an algorithm's ``made_for`` (``MinAtar/Breakout-v0``...),
#: as :func:`~vecaccel.trainers.envs.make.is_minatar_id` decides.
MINATAR = "<every MinAtar id>"


def load(path: str) -> Any:
    """The object a ``"module:attribute"`` path names, importing the module.

    Example:
        >>> load("vecaccel.trainers.config.registry:ATARI")
        '<every ALE id>'
    """
    module_path, sep, attribute = path.partition(":")
    if not sep or not module_path or not attribute:
        raise ValueError(f"expected 'module:attribute', got {path!r}")
    return getattr(importlib.import_module(module_path), attribute)


@dataclass(frozen=True)
class AlgorithmInfo:
    """One algorithm, as the command line, ``vecaccel eval`` and the lazy imports see it.

    Example:
        >>> info = get("dqn")
        >>> info.class_name, info.config_name, info.made_for["cartpole"]
        ('DQN', 'DQNConfig', ('CartPole-v1',))
    """

    name: str
    """The name on the command line (``vecaccel train NAME``) and in checkpoints."""
    cls: str
    """``"module:Class"`` of the algorithm."""
    config: str
    """``"module:Class"`` of its config dataclass."""
    summary: str
    """One line for ``vecaccel train --help``, lower case, no final full stop."""
    presets: str | None = None
    """``"module:DICT"`` of its named settings (preset name -> config values), or ``None``."""
    made_for: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    """Preset name -> the env ids it is made for (:data:`ATARI`: every ALE game, :data:`MINATAR`:
    every MinAtar game), in order: a
    run on such an id that names no preset starts from the first that suits it. A preset left
    out here (``atari-large``) is only ever applied by name."""

    @property
    def class_name(self) -> str:
        """The class's name, as :mod:`vecaccel.trainers` exports it."""
        return self.cls.partition(":")[2]

    @property
    def config_name(self) -> str:
        """The config class's name, as :mod:`vecaccel.trainers` exports it."""
        return self.config.partition(":")[2]

    def load_class(self) -> type[Any]:
        """Import and return the algorithm's class (this imports torch)."""
        return load(self.cls)

    def load_presets(self) -> dict[str, dict[str, Any]]:
        """Its named settings (imports the module that holds them)."""
        return {} if self.presets is None else dict(load(self.presets))

    def __post_init__(self) -> None:
        for path in (self.cls, self.config, *([self.presets] if self.presets else [])):
            if ":" not in path:
                raise ValueError(f"algorithm {self.name!r}: {path!r} is not 'module:attribute'")


_ALGOS = "vecaccel.trainers.algos"
_PRESETS = "vecaccel.trainers.config.presets"

#: The bundled algorithms by name, in the order ``vecaccel train --help`` lists them (plugins'
#: come after them).
ALGORITHMS: dict[str, AlgorithmInfo] = {
    info.name: info
    for info in (
        AlgorithmInfo(
            "a2c",
            f"{_ALGOS}.a2c:A2C",
            f"{_ALGOS}.a2c:A2CConfig",
            "synchronous advantage actor-critic (large batch)",
            f"{_PRESETS}:A2C_PRESETS",
            {
                "cartpole": ("CartPole-v1",),
                "atari": (ATARI,),
                "minatar": (MINATAR,),
                "mujoco": MUJOCO_LOCOMOTION,
            },
        ),
        AlgorithmInfo(
            "ppo",
            f"{_ALGOS}.ppo:PPO",
            f"{_ALGOS}.ppo:PPOConfig",
            "proximal policy optimization",
            f"{_PRESETS}:PPO_PRESETS",
            {
                "cartpole": ("CartPole-v1",),
                "atari": (ATARI,),
                "minatar": (MINATAR,),
                "mujoco": MUJOCO_LOCOMOTION,
            },
        ),
        AlgorithmInfo(
            "dqn",
            f"{_ALGOS}.dqn:DQN",
            f"{_ALGOS}.dqn:DQNConfig",
            "DQN (double, dueling, n-step, prioritized replay)",
            f"{_PRESETS}:DQN_PRESETS",
            {
                "cartpole": ("CartPole-v1",),
                "atari-dqn": (ATARI,),
                "minatar-dqn": (MINATAR,),
            },
        ),
        AlgorithmInfo(
            "c51",
            f"{_ALGOS}.dqn:C51",
            f"{_ALGOS}.dqn:DQNConfig",
            "categorical DQN",
            f"{_PRESETS}:DQN_PRESETS",
            {
                "cartpole-c51": ("CartPole-v1",),
                "atari-c51": (ATARI,),
                "minatar-c51": (MINATAR,),
            },
        ),
        AlgorithmInfo(
            "rainbow",
            f"{_ALGOS}.dqn:Rainbow",
            f"{_ALGOS}.dqn:DQNConfig",
            "epsilon-Rainbow: C51 with every DQN extension but noisy nets",
            f"{_PRESETS}:DQN_PRESETS",
            {
                "cartpole-rainbow": ("CartPole-v1",),
                "atari-rainbow": (ATARI,),
                "minatar-rainbow": (MINATAR,),
            },
        ),
        AlgorithmInfo(
            "pqn",
            f"{_ALGOS}.pqn:PQN",
            f"{_ALGOS}.pqn:PQNConfig",
            "parallelised Q-learning: lambda-returns of large rollouts, no replay or target network",
            f"{_PRESETS}:PQN_PRESETS",
            {"minatar": (MINATAR,)},
        ),
    )
}

#: What :mod:`vecaccel.trainers` exports besides the algorithms and their configs: name ->
#: ``"module:attribute"``.
EXPORTS: dict[str, str] = {
    "Algorithm": f"{_ALGOS}.base:Algorithm",
    "RunConfig": "vecaccel.trainers.config.settings:RunConfig",
    "SyncRunner": "vecaccel.trainers.runners.sync:SyncRunner",
    "AsyncRunner": "vecaccel.trainers.runners.asynchronous.runner:AsyncRunner",
}


class AlgorithmRegistry(dict[str, AlgorithmInfo]):
    """What ``vecaccel_register_algorithms`` fills: algorithm name -> :class:`AlgorithmInfo`.

    Example:
        >>> registry = AlgorithmRegistry()
        >>> registry["ppo"] = ALGORITHMS["ppo"]
        >>> registry["ppo"] = ALGORITHMS["ppo"]
        Traceback (most recent call last):
        ...
        ValueError: algorithm 'ppo' is registered twice
    """

    def __setitem__(self, name: str, info: AlgorithmInfo) -> None:
        # by what it holds, not its class: the module may be imported under two names
        if not all(hasattr(info, key) for key in ("name", "cls", "config", "load_class")):
            raise TypeError(f"algorithm {name!r}: expected an AlgorithmInfo, got {info!r}")
        if info.name != name:
            raise ValueError(f"algorithm {name!r} is registered with info named {info.name!r}")
        if name in self:
            raise ValueError(f"algorithm {name!r} is registered twice")
        super().__setitem__(name, info)


def algorithms() -> dict[str, AlgorithmInfo]:
    """Every registered algorithm by name, the bundled ones first: what each plugin's
    ``vecaccel_register_algorithms`` registers, in registration order.

    Example:
        >>> list(algorithms())[:6]
        ['a2c', 'ppo', 'dqn', 'c51', 'rainbow', 'pqn']
    """
    from vecaccel import get_plugin_manager

    registry = AlgorithmRegistry()
    get_plugin_manager().hook.vecaccel_register_algorithms(registry=registry)
    return dict(registry)


def names() -> list[str]:
    """The registered algorithms' names, in :func:`algorithms`' order."""
    return list(algorithms())


def get(name: str) -> AlgorithmInfo:
    """The algorithm registered as ``name``.

    Raises:
        KeyError: naming the algorithms there are (and the closest, if one is close).

    Example:
        >>> get("ppo2")
        Traceback (most recent call last):
        ...
        KeyError: "unknown algorithm 'ppo2'; did you mean 'ppo'? (algorithms: a2c, ppo, dqn, c51, rainbow, pqn)"
    """
    registered = algorithms()
    try:
        return registered[name]
    except KeyError:
        from vecaccel.errors import did_you_mean

        hint = did_you_mean(str(name), list(registered)) or ";"
        raise KeyError(
            f"unknown algorithm {name!r}{hint} (algorithms: {', '.join(registered)})"
        ) from None


def exports() -> dict[str, str]:
    """Every name :mod:`vecaccel.trainers` exports -> its ``"module:attribute"``: each bundled
    algorithm's class and config, then :data:`EXPORTS`.

    Example:
        >>> exports()["PPO"], exports()["SyncRunner"]
        ('vecaccel.trainers.algos.ppo:PPO', 'vecaccel.trainers.runners.sync:SyncRunner')
    """
    table: dict[str, str] = {}
    for info in ALGORITHMS.values():
        table[info.class_name] = info.cls
        table[info.config_name] = info.config
    table.update(EXPORTS)
    return table
