"""The sentences that help with an env id Gymnasium cannot resolve: the package to install for
a known namespace, the namespaced id a bare one stands for, and the registration line an env
function's missing namespace needs."""

from __future__ import annotations

import gymnasium as gym
import pytest
from gymnasium.error import NamespaceNotFound

from vecaccel.envs.unknown_ids import (
    env_error_message,
    env_id_hint,
    namespace_hint,
    unknown_env_id_message,
)


def _missing(module: str) -> bool:
    return False


def _present(module: str) -> bool:
    return True


@pytest.mark.parametrize("namespace", ["ALE", "ale", "MinAtar", "minatar"])
def test_a_known_namespace_names_its_package_in_any_letter_case(namespace: str) -> None:
    hint = env_id_hint(f"{namespace}/Pong-v5", installed=_missing)
    assert hint is not None and "pip install 'vecaccel[" in hint


def test_no_hint_for_an_installed_or_unknown_namespace() -> None:
    assert env_id_hint("ALE/Pong-v5", installed=_present) is None
    assert env_id_hint("Nobody/Pong-v5", installed=_missing) is None
    assert env_id_hint("NoSuchEnvAtAll-v0") is None


def test_the_message_keeps_gymnasiums_words_and_adds_the_hint() -> None:
    try:
        gym.make("CartPol-v1")
    except gym.error.Error as exc:
        error = exc
    message = unknown_env_id_message("CartPol-v1", error)
    assert message.startswith("unknown environment id 'CartPol-v1': ")
    assert str(error).rstrip(".") in message


def test_a_namespace_error_of_an_env_function_says_how_to_register() -> None:
    error = NamespaceNotFound("Namespace Acme not found. Have you installed the proper package?")
    assert "vecaccel_register_envs" in namespace_hint(error, installed=_missing)
    ale = NamespaceNotFound("Namespace ALE not found.")
    assert "gymnasium.register_envs(ale_py)" in namespace_hint(ale, installed=_present)
    assert "pip install 'vecaccel[atari]'" in namespace_hint(ale, installed=_missing)
    assert env_error_message(error).startswith("Namespace Acme not found")
    assert "vecaccel_register_envs" in env_error_message(error)
    assert env_error_message(RuntimeError("Namespace Acme not found")) == (
        "Namespace Acme not found"
    )
