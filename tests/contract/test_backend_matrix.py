"""The tests pick backends by what each declares (``tests/support/backend_matrix.py``): each
property read from a backend's options must hold for the backend running."""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
from backend_matrix import SETUPS, backends, options_for, partial_batch_options, select

import vecaccel
from vecaccel.manager import get_backend
from vecaccel.testing.envs import counter_fns, env_pid
from vecaccel.vec_env import Capabilities

NUM_ENVS = 4


def _as_numpy(x):
    return x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x)


def _zeros(envs, n: int):
    actions = np.zeros(n, dtype=np.int64)
    if getattr(envs, "device", None) is not None:
        import torch

        return torch.as_tensor(actions)
    return actions


def test_the_table_names_registered_backends_and_their_own_options():
    registered = vecaccel.list_backends()
    for name, setup in SETUPS.items():
        if name not in registered:
            continue  # a built-in whose optional dependency is missing here
        declared = get_backend(name).options
        if setup.options:
            assert declared is not None, f"{name} declares no options"
            declared.from_kwargs(name, dict(setup.options))  # a misspelled option raises


def test_options_for_refuses_an_option_no_backend_takes():
    with pytest.raises(TypeError, match="num_wrokers"):
        options_for("serial", num_wrokers=2)


@pytest.mark.parametrize("name", select())
def test_declared_properties_hold_for_the_running_backend(name, no_leaks):
    backend = next(b for b in backends() if b.name == name)
    envs = vecaccel.make_vec(counter_fns(NUM_ENVS), backend=name, **options_for(name))
    with contextlib.closing(envs):
        obs, infos = envs.reset(seed=0)
        ids = infos.get("env_id", np.arange(NUM_ENVS))
        obs, *_ = envs.step(_zeros(envs, len(ids)))
        pids = envs.call(env_pid)
        in_caller = [pid == os.getpid() for pid in pids]
        assert backend.worker_processes == (not all(in_caller)), (name, pids)
        assert backend.envs_in_workers == (not any(in_caller)), (name, pids)
        assert backend.tensors == (not isinstance(obs, np.ndarray)), (name, type(obs))
        if backend.lockstep:
            assert envs.capabilities == Capabilities(NUM_ENVS, True, False)
    if backend.partial_batches:
        options = {**options_for(name), **partial_batch_options(name, NUM_ENVS)}
        envs = vecaccel.make_vec(counter_fns(NUM_ENVS), backend=name, **options)
        with contextlib.closing(envs):
            _, infos = envs.reset(seed=0)
            assert envs.capabilities.batch_size == NUM_ENVS // 2
            assert len(_as_numpy(infos["env_id"])) == NUM_ENVS // 2
