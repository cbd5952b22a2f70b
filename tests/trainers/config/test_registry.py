"""The registry of algorithms: the one list that the lazy exports, the command line, ``vecaccel
eval`` and the env-to-preset map read, and what each entry promises of its class."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

pytest.importorskip("torch")

import vecaccel.trainers
from vecaccel.cli import build_parser
from vecaccel.trainers.config import registry
from vecaccel.trainers.config.presets import ATARI, ENV_PRESETS, MINATAR, preset_for_env

NAMES = registry.names()


def test_the_bundled_algorithms() -> None:
    assert NAMES == ["a2c", "ppo", "dqn", "c51", "rainbow", "pqn"]


@pytest.mark.parametrize("name", NAMES)
def test_an_entry_names_its_class_config_and_presets(name: str) -> None:
    info = registry.get(name)
    cls = info.load_class()
    assert cls.__name__ == info.class_name
    assert cls.algo_name == name  # the name checkpoints record, which eval looks up
    assert cls.config_cls is registry.load(info.config)
    assert dataclasses.is_dataclass(cls.config_cls)
    assert cls.presets == info.load_presets()  # the class applies the presets listed here
    assert info.summary and info.summary == info.summary.strip().rstrip(".")
    for preset, env_ids in info.made_for.items():
        assert preset in cls.presets, (name, preset)
        assert env_ids and all(isinstance(env_id, str) for env_id in env_ids)


@pytest.mark.parametrize("name", NAMES)
def test_the_lazy_exports_are_the_registrys(name: str) -> None:
    info = registry.get(name)
    assert getattr(vecaccel.trainers, info.class_name) is info.load_class()
    assert getattr(vecaccel.trainers, info.config_name) is registry.load(info.config)
    assert info.class_name in vecaccel.trainers.__all__


def test_every_export_is_listed_once_in_all() -> None:
    assert vecaccel.trainers.__all__ == sorted(registry.exports())
    assert vecaccel.trainers.SyncRunner.__name__ == "SyncRunner"
    with pytest.raises(AttributeError, match="no attribute 'NoSuchThing'"):
        vecaccel.trainers.NoSuchThing  # noqa: B018


def test_the_command_line_offers_one_sub_command_per_entry_with_its_summary(capsys) -> None:
    train = build_parser()._subparsers._group_actions[0].choices["train"]
    algos = train._subparsers._group_actions[0]
    assert list(algos.choices) == NAMES
    helps = {action.dest: action.help for action in algos._choices_actions}
    assert helps == {name: registry.get(name).summary for name in NAMES}


def test_the_env_to_preset_map_is_the_registrys() -> None:
    assert ENV_PRESETS == {name: dict(registry.get(name).made_for) for name in NAMES}
    # an id of each kind a preset may be made for
    example = {ATARI: "ALE/Pong-v5", MINATAR: "MinAtar/Breakout-v0"}
    for name in NAMES:
        for preset, env_ids in registry.get(name).made_for.items():
            for env_id in env_ids:
                assert preset_for_env(name, example.get(env_id, env_id)) == preset, (name, env_id)


def test_an_unknown_algorithm_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="did you mean 'rainbow'.*a2c, ppo, dqn, c51, rainbow"):
        registry.get("rainbo")
    with pytest.raises(ValueError, match="not 'module:attribute'"):
        registry.AlgorithmInfo("x", "no.colon", "a:B", "a summary")


def test_reading_the_registry_imports_no_torch() -> None:
    """The command line's plugin reads the registry while ``vecaccel --help`` is built, and the
    presets with it: none of it may import torch or an algorithm."""
    code = (
        "import sys\n"
        "from vecaccel.trainers.config import registry, presets\n"
        "[info.load_presets() for info in registry.ALGORITHMS.values()]\n"
        "presets.preset_for_env('ppo', 'CartPole-v1')\n"
        "print(sorted(m for m in sys.modules if m == 'torch' or '.algos' in m))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
