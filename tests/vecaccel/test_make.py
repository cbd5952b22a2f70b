"""``vecaccel.make_vec``: a NumPy integer count, Atari ids without ``gym.register_envs`` in fresh
workers, and vector env functions told apart from env functions that return a vector env.
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
# vector env functions


def _vector(n: int) -> gym.vector.VectorEnv:
    return gym.make_vec("CartPole-v1", n, vectorization_mode="vector_entry_point")


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
