"""The torch-threads warning points at the user's line, wherever in vecaccel it is raised.

It is raised deep inside a backend's constructor (and, for the SB3 adapter, under SB3's own
``make_vec_env``); a warning that names ``vecaccel/make.py`` tells the user nothing about which
of their lines to change. The library's own tools set torch's threads and stay quiet.
"""

from __future__ import annotations

import inspect
import warnings

import pytest
import torch

import vecaccel
from vecaccel.worker import TorchThreadsWarning, usable_cpus


@pytest.fixture
def too_many_torch_threads():
    previous = torch.get_num_threads()
    torch.set_num_threads(usable_cpus() + 1)  # more than any worker count leaves free
    yield
    torch.set_num_threads(previous)


def _recorded(make) -> list[warnings.WarningMessage]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        envs = make()
        envs.close()
    return [w for w in caught if issubclass(w.category, TorchThreadsWarning)]


def test_the_action_server_warning_names_the_callers_line(too_many_torch_threads):
    line = inspect.currentframe().f_lineno + 2
    caught = _recorded(
        lambda: vecaccel.make_vec("CartPole-v1", 2, backend="action_server", num_workers=1)
    )
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert caught[0].filename == __file__
    assert caught[0].lineno == line
    assert issubclass(TorchThreadsWarning, RuntimeWarning)  # filters on RuntimeWarning still apply


def test_the_sb3_adapter_warning_names_the_line_that_called_sb3(too_many_torch_threads):
    pytest.importorskip("stable_baselines3")
    from stable_baselines3.common.env_util import make_vec_env

    import vecaccel.adapters.sb3

    line = inspect.currentframe().f_lineno + 2  # the line of the call
    caught = _recorded(
        lambda: make_vec_env(
            "CartPole-v1", n_envs=2, vec_env_cls=vecaccel.adapters.sb3.VecAccelEnv,
            vec_env_kwargs={"backend": "shm", "num_workers": 1},
        )
    )  # fmt: skip
    assert len(caught) == 1, [str(w.message) for w in caught]
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_tune_sets_torch_threads_for_the_action_server_and_says_nothing(too_many_torch_threads):
    from vecaccel.tune import Trial, measure_trial

    threads = torch.get_num_threads()
    with warnings.catch_warnings():
        warnings.simplefilter("error", TorchThreadsWarning)
        fns = [lambda: __import__("gymnasium").make("CartPole-v1")] * 2
        trial = Trial("action_server", 2, {"num_workers": 1})
        assert measure_trial(fns, trial, seconds=0.05) > 0
    assert torch.get_num_threads() == threads  # the caller's setting is back
