"""``vecaccel.make_vec``: what it accepts as envs and ``num_envs``, and the errors that say what to
pass instead.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import gymnasium as gym
import numpy as np
import pytest

import vecaccel

# ---------------------------------------------------------------------------------------------
# vecaccel.make_vec


def test_make_vec_accepts_a_numpy_integer_num_envs():
    """``num_envs`` read from a NumPy array or config (np.int64) is accepted, as the async
    backend's batch_size accepts np.integer."""
    try:
        envs = vecaccel.make_vec("CartPole-v1", np.int64(2), backend="serial")
    except ValueError as exc:
        pytest.fail(f"expected np.int64(2) to make 2 envs, got ValueError: {exc}")
    with envs:
        assert envs.num_envs == 2


def test_make_vec_with_an_empty_env_list_is_a_clear_error():
    """``make_vec([], backend="serial")`` says "a vector env needs at least one env function",
    as ``shm`` does, not a bare IndexError ('list index out of range')."""
    try:
        vecaccel.make_vec([], backend="serial").close()
    except ValueError as exc:
        assert "at least one" in str(exc), str(exc)
    except Exception as exc:  # noqa: BLE001 - any other error fails the test with a message
        pytest.fail(
            "expected ValueError 'a vector env needs at least one env function' (as shm says), "
            f"got {type(exc).__name__}: {exc}"
        )
    else:
        pytest.fail("expected make_vec([]) to be refused, it made a vector env of 0 envs")


def test_make_vec_with_an_env_instance_says_what_to_pass():
    """Passing ``gym.make(...)`` (an instance) instead of an id or a function is an error that
    says what to pass, not "TypeError: 'TimeLimit' object is not iterable"."""
    env = gym.make("CartPole-v1")
    try:
        with pytest.raises((TypeError, ValueError)) as info:
            vecaccel.make_vec(env, 2, backend="serial")
    finally:
        env.close()
    message = str(info.value)
    assert "not iterable" not in message and ("callable" in message or "id" in message), (
        f"expected an error saying to pass an env id or env function, got {message!r}"
    )


@pytest.mark.parametrize(
    "env, expected",
    [(gym.spec("CartPole-v1"), "pass its id 'CartPole-v1'"), (3, "takes an env id")],
    ids=["env-spec", "not-iterable"],
)
def test_make_vec_with_neither_an_id_nor_functions_says_what_to_pass(env, expected):
    with pytest.raises(TypeError, match=expected):
        vecaccel.make_vec(env, 2, backend="serial")


@pytest.mark.parametrize("num_envs", [True, 2.0])
def test_make_vec_refuses_a_num_envs_that_is_not_an_integer(num_envs):
    with pytest.raises(TypeError, match="num_envs must be an integer"):
        vecaccel.make_vec("CartPole-v1", num_envs, backend="serial")


# ---------------------------------------------------------------------------------------------
# Atari ids without gym.register_envs(ale_py), in a fresh interpreter

ALE_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import gymnasium as gym
    import numpy as np
    import vecaccel

    def main():
        env_id, context = sys.argv[1], sys.argv[2]
        before = env_id in gym.registry
        envs = vecaccel.make_vec(env_id, 2, num_workers=2, context=context)
        try:
            obs, _ = envs.reset(seed=0)
            for _ in range(3):
                obs, rew, term, trunc, _ = envs.step(np.zeros(2, dtype=np.int64))
        finally:
            envs.close()
        print(json.dumps({"registered_before": before, "shape": list(obs.shape),
                          "dtype": str(obs.dtype)}))

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.parametrize(
    "env_id, context", [("ALE/Pong-v5", "spawn"), ("PongNoFrameskip-v4", "fork")]
)
def test_atari_ids_without_register_envs(env_id, context, tmp_path):
    pytest.importorskip("ale_py")
    script = tmp_path / "ale_check.py"
    script.write_text(ALE_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "VECACCEL_DISABLE_PLUGINS"}
    result = subprocess.run(
        [sys.executable, str(script), env_id, context],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["registered_before"] is False  # the check means something
    assert report["shape"] == [2, 210, 160, 3]
    assert report["dtype"] == "uint8"


# ---------------------------------------------------------------------------------------------
# per-env functions and vector env functions are not mixed up


def _per_env() -> gym.Env:
    return gym.make("CartPole-v1")


def _vector(n: int) -> gym.vector.VectorEnv:
    return gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")


def test_a_per_env_function_with_vectorized_is_refused_naming_fn_of_n():
    with pytest.raises(TypeError, match=r"vector env function fn\(n\) -> gymnasium.vector") as info:
        vecaccel.make_vec(_per_env, 4, backend="serial", vectorized=True)
    assert "_per_env takes no argument" in str(info.value)
    assert "without vectorized=True" in str(info.value)


@pytest.mark.parametrize("as_list", [False, True])
def test_a_vector_env_function_without_vectorized_is_refused_naming_the_flag(as_list):
    env = [_per_env, _vector] if as_list else _vector
    with pytest.raises(TypeError, match=r"_vector.* needs 1 argument.*pass vectorized=True"):
        vecaccel.make_vec(env, None if as_list else 4, backend="serial")


def test_a_function_returning_a_vector_env_is_refused_naming_the_flag():
    def builds_a_vector_env():
        return _vector(2)

    with pytest.raises(TypeError, match="returned a CartPoleVectorEnv, a vector env.*vectorized"):
        vecaccel.make_vec(builds_a_vector_env, 2, backend="serial")


def test_a_vector_env_function_with_an_optional_count_is_taken():
    def either(n: int = 1):
        return _vector(n)

    envs = vecaccel.make_vec(either, 4, backend="serial", vectorized=True)
    with envs:
        assert envs.num_envs == 4
