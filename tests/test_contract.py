"""The VecEnv contract, checked step by step for every registered backend.

Each backend runs in lockstep with Gymnasium's ``SyncVectorEnv`` and with vecaccel's ``serial``
reference: the same seeds and actions must give identical observations, rewards, flags and
infos (``final_obs``/``final_info`` and the ``_key`` masks included) through autoresets, in all
three autoreset modes.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from functools import partial

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from helpers_envs import assert_same, env_value, make_cartpole, make_dict_tuple

import vecaccel

NUM_ENVS = 3
STEPS = 24

ENV_FNS = {
    "cartpole": partial(make_cartpole, max_episode_steps=8),
    "dict_tuple": partial(make_dict_tuple, max_episode_steps=6),
}


@contextlib.contextmanager
def lockstep(backend, options, env_fn, mode=AutoresetMode.NEXT_STEP, num_envs=NUM_ENVS, **extra):
    """Yield ``(sync, serial, candidate)`` vector envs over ``num_envs`` copies of ``env_fn``."""
    fns = [env_fn] * num_envs
    with contextlib.ExitStack() as stack:
        envs = []
        for make in (
            lambda: SyncVectorEnv(fns, autoreset_mode=mode, **extra),
            lambda: vecaccel.make_vec(fns, backend="serial", autoreset_mode=mode, **extra),
            lambda: vecaccel.make_vec(
                fns, backend=backend, autoreset_mode=mode, **options, **extra
            ),
        ):
            env = make()
            stack.callback(env.close)
            envs.append(env)
        yield tuple(envs)


def assert_results(results, what):
    reference = results[0]
    for name, result in zip(("serial", "candidate"), results[1:]):
        assert_same(result, reference, f"{what} ({name} vs SyncVectorEnv)")


@pytest.mark.parametrize("mode", list(AutoresetMode), ids=lambda m: m.value)
@pytest.mark.parametrize("env_name", list(ENV_FNS))
def test_same_trajectories(backend, backend_options, env_name, mode):
    with lockstep(backend, backend_options, ENV_FNS[env_name], mode) as envs:
        for env in envs[1:]:
            assert env.metadata["autoreset_mode"] is mode
        assert_results([env.reset(seed=123) for env in envs], "reset")
        action_space = envs[0].action_space
        action_space.seed(7)
        episodes_ended = 0
        for t in range(STEPS):
            if t == STEPS // 3:  # a masked reset, in every mode
                mask = np.array([True, False, True])
                resets = [env.reset(seed=77, options={"reset_mask": mask.copy()}) for env in envs]
                assert_results(resets, f"masked reset {t}")
            if t == STEPS // 2:  # a reset with one seed per env, in the middle
                seeds = [5, None, 9]
                assert_results([env.reset(seed=list(seeds)) for env in envs], f"reset {t}")
            actions = action_space.sample()
            results = [env.step(actions) for env in envs]
            assert_results(results, f"step {t}")
            done = results[0][2] | results[0][3]
            episodes_ended += int(done.sum())
            if mode is AutoresetMode.SAME_STEP and done.any():
                assert "final_obs" in results[2][4] and "_final_info" in results[2][4]
            if mode is AutoresetMode.DISABLED and done.any():
                resets = [env.reset(options={"reset_mask": done.copy(), "tag": t}) for env in envs]
                assert_results(resets, f"masked reset after step {t}")
        assert episodes_ended >= 2 * NUM_ENVS, "the trajectory should pass through autoresets"


@pytest.mark.parametrize("env_name", list(ENV_FNS))
def test_spaces_and_metadata(backend, backend_options, env_name):
    with lockstep(backend, backend_options, ENV_FNS[env_name]) as (sync, serial, env):
        assert isinstance(env, gym.vector.VectorEnv)
        assert env.num_envs == NUM_ENVS
        for name in ("single_observation_space", "single_action_space"):
            assert getattr(env, name) == getattr(sync, name), name
        for name in ("observation_space", "action_space"):
            assert getattr(env, name) == getattr(sync, name), name
        assert env.metadata["autoreset_mode"] is AutoresetMode.NEXT_STEP
        obs, _ = env.reset(seed=0)
        assert env.observation_space.contains(obs)
        assert env.action_space.contains(env.action_space.sample())


def test_autoreset_mode_as_string(backend, backend_options):
    fns = [ENV_FNS["cartpole"]] * 2
    env = vecaccel.make_vec(fns, backend=backend, autoreset_mode="SameStep", **backend_options)
    with contextlib.closing(env):
        assert env.metadata["autoreset_mode"] is AutoresetMode.SAME_STEP


def test_call_get_attr_set_attr(backend, backend_options):
    with lockstep(backend, backend_options, ENV_FNS["dict_tuple"]) as (sync, serial, env):
        for vec in (sync, env):
            vec.reset(seed=1)
        assert env.get_attr("value") == (0, 0, 0)
        env.set_attr("value", [1, 2, 3])
        assert env.get_attr("value") == (1, 2, 3)
        assert env.call("add", 10) == (11, 12, 13)
        assert env.call("add", x=1) == (2, 3, 4)
        env.set_attr("value", 5)  # one value for all
        assert env.get_attr("value") == (5, 5, 5)
        env.set_attr_indices("value", [7, 8], [2, 0])
        assert env.get_attr("value") == (8, 5, 7)
        assert env.call_indices("add", [2, 0], 100) == (107, 108)
        assert env.call_indices("add", [-1], 0) == (7,)
        assert env.call_indices(env_value, [1, 2], offset=1) == (6, 8)
        # a lambda too (process backends send it with cloudpickle)
        assert env.call(lambda e, k: e.get_wrapper_attr("value") * k, 2) == (16, 10, 14)
        with pytest.raises(ValueError):
            env.set_attr("value", [1, 2])  # wrong number of values
        with pytest.raises(IndexError):
            env.call_indices("add", [NUM_ENVS], 0)
        # attributes that are not callables come back as they are
        assert env.get_attr("np_random_seed") == sync.get_attr("np_random_seed")
        assert env.get_attr("render_mode") == (None,) * NUM_ENVS
        # an error inside call is a WorkerError naming the env
        with pytest.raises(vecaccel.WorkerError) as info:
            env.call_indices("add", [1], "not a number")
        assert info.value.env_indices == (1,)
        assert "TypeError" in str(info.value)
        # the env is still usable
        assert env.get_attr("value") == (8, 5, 7)
        env.step(env.action_space.sample())


def test_render_rgb_array(backend, backend_options):
    env_fn = partial(make_dict_tuple, render_mode="rgb_array")
    with lockstep(backend, backend_options, env_fn) as envs:
        for env in envs:
            env.reset(seed=3)
        envs[0].action_space.seed(0)
        for _ in range(3):
            actions = envs[0].action_space.sample()
            for env in envs:
                env.step(actions)
        assert envs[2].render_mode == "rgb_array"
        frames = [env.render() for env in envs]
        assert_results(frames, "render")
        assert len(frames[2]) == NUM_ENVS and frames[2][0].shape == (6, 4, 3)


def test_copy_false_returns_views(backend, backend_options):
    fns = [ENV_FNS["cartpole"]] * NUM_ENVS
    sync = SyncVectorEnv(fns)
    env = vecaccel.make_vec(fns, backend=backend, copy=False, **backend_options)
    with contextlib.closing(env), contextlib.closing(sync):
        first, _ = env.reset(seed=0)
        sync.reset(seed=0)
        actions = np.array([0, 1, 1])
        second = env.step(actions)[0]
        expected = sync.step(actions)[0]
        np.testing.assert_array_equal(second, expected)
        # both calls returned the same buffer, now holding the latest observation
        assert np.shares_memory(first, second)
        np.testing.assert_array_equal(first, expected)


def test_copy_true_returns_copies(backend, backend_options):
    fns = [ENV_FNS["dict_tuple"]] * NUM_ENVS
    env = vecaccel.make_vec(fns, backend=backend, **backend_options)
    with contextlib.closing(env):
        obs, _ = env.reset(seed=0)
        kept = gym.vector.utils.create_empty_array(env.single_observation_space, NUM_ENVS)
        kept = gym.vector.utils.concatenate(
            env.single_observation_space,
            list(gym.vector.utils.iterate(env.observation_space, obs)),
            kept,
        )
        step_obs, rewards, *_ = env.step(env.action_space.sample())
        env.step(env.action_space.sample())
        assert_same(obs, kept, "reset obs after later steps")
        assert rewards.dtype == np.float64


def test_step_async_step_wait(backend, backend_options):
    with lockstep(backend, backend_options, ENV_FNS["cartpole"]) as (sync, serial, env):
        results = [vec.reset(seed=11) for vec in (sync, serial, env)]
        assert_results(results, "reset")
        rng = np.random.default_rng(0)
        for t in range(12):
            actions = rng.integers(0, 2, size=NUM_ENVS)
            expected = sync.step(actions)
            outs = []
            for vec in (serial, env):
                vec.step_async(actions)
                outs.append(vec.step_wait())
            assert_results([expected, *outs], f"step_async/step_wait {t}")
        with pytest.raises(RuntimeError):
            env.step_wait()  # nothing pending


def test_closed_env_raises(backend, backend_options):
    env = vecaccel.make_vec([ENV_FNS["cartpole"]] * 2, backend=backend, **backend_options)
    env.reset(seed=0)
    env.close()
    env.close()  # idempotent
    assert env.closed
    with pytest.raises(vecaccel.ClosedEnvError):
        env.step(np.zeros(2, dtype=np.int64))
    with pytest.raises(vecaccel.ClosedEnvError):
        env.reset()


# ---------------------------------------------------------------------------------------------
# Gymnasium's vector wrappers on top


def _without_times(infos):
    infos = dict(infos)
    if "episode" in infos:
        infos["episode"] = {k: v for k, v in infos["episode"].items() if k != "t"}
    return infos


@pytest.mark.parametrize("mode", [AutoresetMode.NEXT_STEP, AutoresetMode.SAME_STEP])
def test_record_episode_statistics(backend, backend_options, mode):
    from gymnasium.wrappers.vector import RecordEpisodeStatistics

    with lockstep(backend, backend_options, ENV_FNS["cartpole"], mode) as (sync, _, env):
        wrapped = [RecordEpisodeStatistics(vec) for vec in (sync, env)]
        assert_results([w.reset(seed=4) for w in wrapped], "reset")
        rng = np.random.default_rng(1)
        for t in range(20):
            actions = rng.integers(0, 2, size=NUM_ENVS)
            obs, rew, term, trunc, infos = zip(*(w.step(actions) for w in wrapped))
            assert_same(obs[1], obs[0], f"obs {t}")
            assert_same(_without_times(infos[1]), _without_times(infos[0]), f"infos {t}")
        assert wrapped[1].episode_count == wrapped[0].episode_count > 0
        assert list(wrapped[1].return_queue) == list(wrapped[0].return_queue)


def test_normalize_observation(backend, backend_options):
    from gymnasium.wrappers.vector import NormalizeObservation

    with lockstep(backend, backend_options, ENV_FNS["cartpole"]) as (sync, _, env):
        wrapped = [NormalizeObservation(vec) for vec in (sync, env)]
        assert_same(wrapped[1].reset(seed=2), wrapped[0].reset(seed=2), "reset")
        rng = np.random.default_rng(2)
        for t in range(10):
            actions = rng.integers(0, 2, size=NUM_ENVS)
            assert_same(wrapped[1].step(actions), wrapped[0].step(actions), f"step {t}")


def test_numpy_to_torch(backend, backend_options):
    torch = pytest.importorskip("torch")
    from gymnasium.wrappers.vector import NumpyToTorch

    # (plain CartPole: the wrapper cannot convert object-dtype infos such as strings)
    env_fn = partial(make_cartpole, max_episode_steps=8, infos=False)
    with lockstep(backend, backend_options, env_fn) as (sync, _, env):
        torch_env = NumpyToTorch(env)
        obs, _ = torch_env.reset(seed=5)
        expected, _ = sync.reset(seed=5)
        assert isinstance(obs, torch.Tensor)
        np.testing.assert_array_equal(obs.numpy(), expected)
        for t in range(8):
            actions = torch.tensor([t % 2, 1, 0])
            obs, rew, term, trunc, _ = torch_env.step(actions)
            expected = sync.step(actions.numpy())
            np.testing.assert_array_equal(obs.numpy(), expected[0])
            np.testing.assert_array_equal(rew.numpy(), expected[1])
            np.testing.assert_array_equal(term.numpy(), expected[2])
            np.testing.assert_array_equal(trunc.numpy(), expected[3])


def test_torch_actions_accepted(backend, backend_options):
    torch = pytest.importorskip("torch")
    env = vecaccel.make_vec([ENV_FNS["cartpole"]] * 2, backend=backend, **backend_options)
    with contextlib.closing(env):
        env.reset(seed=0)
        env.step(torch.tensor([0, 1]))


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
