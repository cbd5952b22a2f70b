"""``check_backend``: the vector-env contract, checked on any registered backend.

Gymnasium checks one env with ``check_env``, PettingZoo one parallel env with
``parallel_api_test``; :func:`check_backend` does the same for a vecaccel backend. It builds the
backend by name (so it goes through the plugin registry and ``make_vec``'s option checks, as a
user's code does), runs it on the kit's own small envs (:mod:`vecaccel.testing.contract_envs`)
beside ``gymnasium.vector.SyncVectorEnv``, and raises an ``AssertionError`` at the first property
that breaks, naming the property, the env index and the step, and saying how to fix it.

A backend that returns every env in index order is compared batch against batch with a
``SyncVectorEnv`` of :data:`NUM_ENVS` envs; one that returns some envs per step, in the order
they finish (``infos["env_id"]``, as the ``async`` backend with ``batch_size < num_envs``), is
compared env by env with one ``SyncVectorEnv`` per env, each given the seeds and actions that env
was given.
"""

from __future__ import annotations

import copy
import functools
import gc
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv
from gymnasium.vector.utils import batch_space, concatenate, create_empty_array

from vecaccel.errors import WorkerError
from vecaccel.make import make_vec
from vecaccel.manager import get_backend
from vecaccel.testing.api_methods import missing_methods
from vecaccel.testing.batch_former import check_declared_batch_former
from vecaccel.testing.compare import (
    batch_size_of,
    describe,
    difference,
    item_of,
    leaf_problems,
    unbatch_info,
)
from vecaccel.testing.contract_envs import (
    SyncVectorEnvFn,
    env_value,
    make_cartpole,
    make_dict_tuple,
)
from vecaccel.testing.leaks import LeakBaseline
from vecaccel.testing.writable import read_only_arrays
from vecaccel.vec_env import VecEnv

__all__ = ["CONTRACT_ENVS", "NUM_ENVS", "STEPS", "check_backend"]

#: How many envs each vector env under check holds (an ``async`` ``batch_size`` must fit).
NUM_ENVS = 4

#: Steps per trajectory: enough for every env to pass through several autoresets.
STEPS = 24

#: The envs every trajectory is checked on: a ``Box`` observation with irregular infos, and
#: nested ``Dict``/``Tuple`` spaces of every fixed-size leaf type with nested infos.
CONTRACT_ENVS: dict[str, Callable[[], gym.Env]] = {
    "cartpole": functools.partial(make_cartpole, max_episode_steps=8),
    "dict_tuple": functools.partial(make_dict_tuple, max_episode_steps=6),
}

_RESET_SEED = 123
_MASKED_RESET_SEED = 77
_FIX_AUTORESET = (
    "step each env as gymnasium.vector.SyncVectorEnv does in this mode (vecaccel.vec_env.EnvRunner "
    "does); if the backend does not implement the mode, leave it out of "
    "registry.add(..., autoreset_modes=...)"
)


def check_backend(name: str, /, **options: Any) -> None:
    """Check that backend ``name`` keeps the vector-env contract; raise at the first breach.

    Checked, for each autoreset mode the backend declares (``registry.add(...,
    autoreset_modes=...)``, all three by default) on each of :data:`CONTRACT_ENVS`:

    - trajectories (observations, rewards, ``terminated``, ``truncated`` and infos, with
      ``final_obs``/``final_info`` and the ``_key`` masks) equal to ``SyncVectorEnv``'s for the
      same seeds and actions, through autoresets, masked resets (``options["reset_mask"]``) and
      the ``step_async``/``step_wait`` pair;
    - reset seeding: ``reset(seed=int)`` seeds env ``i`` with ``seed + i``, a list gives one seed
      per env (``None`` in it, or ``reset(seed=None)``, lets the env's generator run on);
    - ``metadata["autoreset_mode"]``, the single spaces, and dtypes and shapes of what every
      call returns as the spaces say (rewards ``float64``, flags ``bool``), and all of them,
      with ``infos["final_obs"]``, writable;
    - returned arrays are not overwritten by the next call (checked with ``copy=True`` when
      the options ask for ``copy=False``);
    - actions of the wrong batch size, shape or out of range raise ``ValueError`` or
      ``TypeError`` in the caller, and no env steps;
    - ``call``, ``get_attr``, ``set_attr`` (and ``call_indices``/``set_attr_indices`` where the
      backend has them), an error inside ``call`` raised as :class:`vecaccel.WorkerError`;
    - ``close()`` twice is fine, a closed env refuses ``step`` and ``reset`` with
      ``gymnasium.error.ClosedEnvironmentError``, and no child process or ``/dev/shm`` entry
      is left behind;
    - on a backend that declares a batch former (options ``min_batch_size``,
      ``max_batch_size``, ``batch_wait_s``): its floor, ceiling and deadline
      (:func:`vecaccel.testing.batch_former.check_batch_former`).

    It takes a few seconds, and runs from any test suite: a failure is an ``AssertionError``,
    which pytest reports with its message.

    Args:
        name: the registered backend name, as passed to ``make_vec(..., backend=name)``.
        **options: backend options, passed to ``make_vec`` as given (``num_workers=2``,
            ``batch_size=2``...). The vector envs hold :data:`NUM_ENVS` envs.

    Raises:
        AssertionError: naming the property that broke, the env index and the step, and how
            to fix it.
        ValueError: if no backend is registered as ``name``.
        TypeError: if an option is not one of the backend's.

    Example:
        >>> from vecaccel.testing import check_backend
        >>> check_backend("serial")
        >>> check_backend("shm", num_workers=2)
    """
    info = get_backend(name)  # an unknown name is a ValueError listing the registered ones
    baseline = LeakBaseline()
    for mode in info.autoreset_modes:
        for env_name, env_fn in CONTRACT_ENVS.items():
            # the extra checks run once each, on the first mode the backend implements
            first = mode is info.autoreset_modes[0]
            _Trajectory(name, options, env_name, env_fn, mode).run(
                check_actions=first and env_name == "cartpole",
                check_attributes=first and env_name == "dict_tuple",
            )
    if options.get("copy", True) is False:  # views are documented: check copies elsewhere
        mode = info.autoreset_modes[0]
        trajectory = _Trajectory(
            name, {**options, "copy": True}, "cartpole", CONTRACT_ENVS["cartpole"], mode
        )
        trajectory.run(steps=4, check_episodes=False)
    check_declared_batch_former(name, options)
    # multiprocessing unlinks a spawn-context lock's semaphore when the lock object is
    # collected: collect the closed vector envs' cycles before counting what is left
    gc.collect()
    try:
        baseline.check()
    except AssertionError as exc:
        raise AssertionError(
            f"check_backend({name!r}): close() left something behind: {exc}. How to fix: "
            "close() must stop and join every worker process and unlink every shared-memory "
            "segment the backend created"
        ) from None


def _implements(envs: Any, method: str) -> bool:
    """Whether ``envs`` has ``method``, beyond ``VecEnv``'s placeholder that raises."""
    found = getattr(type(envs), method, None)
    return found is not None and found is not getattr(VecEnv, method)


# ---------------------------------------------------------------------------------------------
# one trajectory


class _Trajectory:
    """One backend vector env stepped beside ``SyncVectorEnv`` in one autoreset mode."""

    def __init__(
        self,
        name: str,
        options: dict[str, Any],
        env_name: str,
        env_fn: Callable[[], gym.Env],
        mode: AutoresetMode,
    ) -> None:
        self.name = name
        self.options = options
        self.env_name = env_name
        self.env_fn = env_fn
        self.mode = mode
        self.step_label = "construction"

    # -- failing ----------------------------------------------------------------------------

    def fail(self, prop: str, detail: str, fix: str, env: int | None = None) -> AssertionError:
        where = ", ".join(
            part for part in (None if env is None else f"env {env}", self.step_label) if part
        )
        options = ", ".join(f"{k}={v!r}" for k, v in self.options.items())
        return AssertionError(
            f"check_backend({self.name!r}{', ' + options if options else ''}): {prop} broke at "
            f"{where} (env {self.env_name!r}, autoreset_mode={self.mode.value}): {detail}. "
            f"How to fix: {fix}"
        )

    # -- the run ----------------------------------------------------------------------------

    def run(
        self,
        steps: int = STEPS,
        check_actions: bool = False,
        check_attributes: bool = False,
        check_episodes: bool = True,
    ) -> None:
        with self._opened() as envs:
            self._check_construction(envs)
            self.step_label = f"reset(seed={_RESET_SEED})"
            self.reset(envs, seed=_RESET_SEED)
            ended = 0
            previous: tuple[Any, Any] | None = None
            # a backend returning some envs per step steps each env less often
            steps *= -(-NUM_ENVS // len(self.held))
            for t in range(steps):
                if t == steps // 8:
                    self.step_label = f"masked reset before step {t}"
                    self.masked_reset(envs, self.held[::2], seed=_MASKED_RESET_SEED, tag=t)
                if t == steps // 2:
                    seeds = [5 + 2 * i if i % 3 != 1 else None for i in range(NUM_ENVS)]
                    self.step_label = f"reset(seed={seeds}) before step {t}"
                    self.reset(envs, seed=seeds)
                if t == 11 * steps // 12:
                    self.step_label = f"reset(seed=None) before step {t}"
                    self.reset(envs, seed=None)
                self.step_label = f"step {t}"
                if check_actions and t == 2:
                    self._check_bad_actions(envs)
                result = self.step(envs, use_async=t % 2 == 1)
                if previous is not None:
                    self._check_not_overwritten(*previous)
                if self.options.get("copy", True) is not False:
                    previous = (result, copy.deepcopy(result))
                done = result[2] | result[3]
                ended += int(done.sum())
                if self.mode is AutoresetMode.DISABLED and done.any():
                    self.step_label = f"masked reset of the envs that ended at step {t}"
                    self.masked_reset(envs, self.held[done], seed=None, tag=t)
            if check_episodes and ended < 2:
                raise self.fail(
                    "the trajectory",
                    f"only {ended} episodes ended in {steps} steps of {NUM_ENVS} envs",
                    "return every env the caller steps (episodes of these envs end within 8 "
                    "steps), and their terminated and truncated flags",
                )
            if check_attributes:
                self.step_label = "call/get_attr/set_attr after the trajectory"
                self._check_attributes(envs)
            if self.lockstep:  # recv() of a backend returning some envs may return others
                self._check_step_wait_without_step(envs)
            self._check_close(envs)

    @contextmanager
    def _opened(self) -> Iterator[gym.vector.VectorEnv]:
        with ExitStack() as stack:
            fns = [self.env_fn] * NUM_ENVS
            if self.options.get("vectorized"):  # one SyncVectorEnv of the env per worker slice
                source: Any = SyncVectorEnvFn(self.env_fn, self.mode)
                envs = make_vec(
                    source, NUM_ENVS, backend=self.name, autoreset_mode=self.mode, **self.options
                )
            else:
                envs = make_vec(fns, backend=self.name, autoreset_mode=self.mode, **self.options)
            stack.callback(envs.close)
            self.full = SyncVectorEnv(fns, autoreset_mode=self.mode)
            stack.callback(self.full.close)
            #: one SyncVectorEnv per env, given the seeds and actions that env is given
            self.references = [SyncVectorEnv([fn], autoreset_mode=self.mode) for fn in fns]
            for reference in self.references:
                stack.callback(reference.close)
            self.action_spaces = [copy.deepcopy(self.full.single_action_space) for _ in fns]
            for i, space in enumerate(self.action_spaces):
                space.seed(1000 + i)
            #: what each env shows the next time the backend returns it: (obs, reward,
            #: terminated, truncated, info), reward and flags None for a reset result
            self.pending: list[tuple[Any, ...] | None] = [None] * NUM_ENVS
            self.last_obs: list[Any] = [None] * NUM_ENVS
            self.ended = np.zeros(NUM_ENVS, dtype=np.bool_)
            self.held = np.arange(0)
            self.lockstep = True
            yield envs

    def _check_construction(self, envs: gym.vector.VectorEnv) -> None:
        if not isinstance(envs, gym.vector.VectorEnv):
            raise self.fail(
                "the vector env's type",
                f"the factory returned {type(envs).__name__}",
                "return a gymnasium.vector.VectorEnv (subclass vecaccel.VecEnv)",
            )
        missing = missing_methods(envs)
        if missing:
            raise self.fail(
                "the vector-env methods",
                f"{type(envs).__name__} has no "
                + ", ".join(f"{method}()" for method, _ in missing)
                + " (gymnasium.vector.VectorEnv declares none of step_async, step_wait, call, "
                "get_attr, set_attr)",
                "; ".join(f"{method}: {fix}" for method, fix in missing),
            )
        if getattr(envs, "num_envs", None) != NUM_ENVS:
            raise self.fail(
                "num_envs",
                f"num_envs is {getattr(envs, 'num_envs', None)!r} for {NUM_ENVS} env functions",
                "set num_envs to the number of env functions",
            )
        mode = envs.metadata.get("autoreset_mode")
        if mode is not self.mode:
            raise self.fail(
                'metadata["autoreset_mode"]',
                f"it is {mode!r}, the vector env was made with {self.mode!r}",
                "set metadata['autoreset_mode'] to the AutoresetMode the factory was given "
                "(vecaccel.VecEnv does)",
            )
        for attribute in ("single_observation_space", "single_action_space"):
            if getattr(envs, attribute, None) != getattr(self.full, attribute):
                raise self.fail(
                    attribute,
                    f"it is {getattr(envs, attribute, None)}, the envs' is "
                    f"{getattr(self.full, attribute)}",
                    "take the single spaces from the envs",
                )

    # -- resets and steps -------------------------------------------------------------------

    def _returned_ids(self, infos: Any, size: int) -> np.ndarray:
        if not isinstance(infos, dict):
            raise self.fail("infos", f"infos is {describe(infos)}", "return infos as a dict")
        ids = infos.get("env_id")
        if ids is None:
            return np.arange(size)
        ids = np.asarray(ids)
        if ids.shape != (size,) or len(set(ids.tolist())) != size:
            raise self.fail(
                'infos["env_id"]',
                f"it is {ids.tolist()} for a batch of {size}",
                "name each returned env once, in the order of the batch",
            )
        return ids

    def _check_types(self, envs: Any, result: tuple[Any, ...], size: int) -> None:
        problem = leaf_problems(envs.single_observation_space, result[0], size, "observation")
        for label, value, dtype in (
            ("rewards", result[1], np.float64),
            ("terminated", result[2], np.bool_),
            ("truncated", result[3], np.bool_),
        ):
            if problem or value is None:
                break
            if not isinstance(value, np.ndarray) or value.dtype != dtype or value.shape != (size,):
                problem = f"{label} is {describe(value)}, expected {np.dtype(dtype)} ({size},)"
        if problem:
            raise self.fail(
                "dtypes and shapes",
                problem,
                "return numpy arrays batched as gymnasium.vector.utils.batch_space says "
                "(create_empty_array); rewards float64 and flags bool, as SyncVectorEnv",
            )

    def _compare_envs(self, result: tuple[Any, ...], ids: np.ndarray, prop: str, fix: str) -> None:
        """Each returned env's part of ``result`` against what its reference gave."""
        obs, rewards, terminated, truncated, infos = result
        space = self.full.single_observation_space
        for position, index in enumerate(ids.tolist()):
            expected = self.pending[index]
            # infos first: a missing final_obs says more than the observation that follows
            parts = [("infos", unbatch_info(infos, position), expected[4])]
            parts.append(("observation", item_of(space, obs, position), expected[0]))
            if expected[1] is not None and rewards is not None:
                parts += [
                    ("reward", rewards[position], expected[1]),
                    ("terminated", terminated[position], expected[2]),
                    ("truncated", truncated[position], expected[3]),
                ]
            for label, got, want in parts:
                found = difference(got, want, label)
                if found:
                    if expected[1] is not None and self.ended[index]:
                        found += ", on the step after the env's episode ended"
                    if "final_obs" in expected[4] and "final_obs" not in parts[0][1]:
                        found += (
                            " (in SAME_STEP mode an env whose episode ends is reset in that "
                            "step, its last observation and info in infos['final_obs'] and "
                            "infos['final_info'])"
                        )
                    raise self.fail(prop, f"{found} (as SyncVectorEnv returns it)", fix, index)
            self.last_obs[index] = expected[0]
            self.ended[index] = expected[1] is not None and bool(expected[2] or expected[3])
            self.pending[index] = None

    def _compare_full(
        self, result: tuple[Any, ...], expected: tuple[Any, ...], prop: str, fix: str
    ) -> None:
        """The whole batch (masks and info dtypes included) against ``SyncVectorEnv``'s."""
        infos = {key: value for key, value in result[4].items() if key != "env_id"}
        found = difference((*result[:4], infos), expected, "the result")
        if found:
            raise self.fail(prop, f"{found} (in SyncVectorEnv's batch)", fix)

    def _after(
        self, envs: Any, result: tuple[Any, ...], prop: str, fix: str, full: Callable[[], Any]
    ) -> Any:
        size = batch_size_of(result[0])
        ids = self._returned_ids(result[-1], size)
        self._check_types(envs, result, size)
        if read_only := read_only_arrays(result):
            raise self.fail(
                "writable arrays",
                f"{', '.join(read_only)} are read-only",
                "copy a buffer received from elsewhere (a pickle-5 buffer, Ray's object "
                "store) into an array of the backend's own, as SyncVectorEnv returns",
            )
        for attribute, single in (
            ("observation_space", envs.single_observation_space),
            ("action_space", envs.single_action_space),
        ):
            if getattr(envs, attribute, None) != batch_space(single, size):
                raise self.fail(
                    attribute,
                    f"it is {getattr(envs, attribute, None)} for batches of {size} envs",
                    "batch the single space over the envs each call returns "
                    "(gymnasium.vector.utils.batch_space)",
                )
        self.lockstep = self.lockstep and size == NUM_ENVS and ids.tolist() == list(range(size))
        expected_full = full()
        self._compare_envs(result, ids, prop, fix)
        if self.lockstep:
            self._compare_full(result, expected_full, prop, fix)
        self.held = ids

    def reset(self, envs: Any, seed: int | list[Any] | None) -> None:
        seeds = (
            [seed + i for i in range(NUM_ENVS)]
            if isinstance(seed, int)
            else seed or [None] * NUM_ENVS
        )
        for index, reference in enumerate(self.references):
            obs, infos = reference.reset(seed=seeds[index])
            self.pending[index] = (item_of(reference.single_observation_space, obs, 0), None, None,
                                   None, unbatch_info(infos, 0))  # fmt: skip
        result = envs.reset(seed=seed)
        if not (isinstance(result, tuple) and len(result) == 2):
            raise self.fail("reset", f"reset returned {describe(result)}", "return (obs, infos)")
        self._after(
            envs,
            (result[0], None, None, None, result[1]),
            "reset seeding",
            "reset env i with seed + i for an int seed, seeds[i] for a list, and seed=None "
            "(the env's generator runs on) for None (vecaccel.vec_env.normalize_seeds)",
            lambda: self._full_reset(seed),
        )

    def _full_reset(self, seed: int | list[Any] | None) -> tuple[Any, ...]:
        obs, infos = self.full.reset(seed=seed)
        return (obs, None, None, None, infos)

    def masked_reset(self, envs: Any, indices: np.ndarray, seed: int | None, tag: int) -> None:
        """Reset the envs ``indices`` with ``options={"reset_mask": ..., "tag": tag}``: the
        envs are given ``{"tag": tag}`` (the dict-tuple env echoes it in its reset info)."""
        mask = np.zeros(NUM_ENVS, dtype=np.bool_)
        mask[indices] = True
        for index in self.held.tolist():
            if mask[index]:
                reference = self.references[index]
                env_seed = None if seed is None else seed + index
                obs, infos = reference.reset(
                    seed=env_seed, options={"reset_mask": np.ones(1, bool), "tag": tag}
                )
                self.pending[index] = (item_of(reference.single_observation_space, obs, 0), None,
                                       None, None, unbatch_info(infos, 0))  # fmt: skip
            else:
                self.pending[index] = (self.last_obs[index], None, None, None, {})
        result = envs.reset(seed=seed, options={"reset_mask": mask.copy(), "tag": tag})
        self._after(
            envs,
            (result[0], None, None, None, result[1]),
            "masked reset",
            "reset exactly the envs in options['reset_mask'] (with seed + i), pass the other "
            "options on to them, and return the other envs' last observations unchanged",
            lambda: self._full_masked_reset(seed, mask, tag),
        )

    def _full_masked_reset(self, seed: int | None, mask: np.ndarray, tag: int) -> tuple[Any, ...]:
        if not self.lockstep:
            return ()
        obs, infos = self.full.reset(seed=seed, options={"reset_mask": mask.copy(), "tag": tag})
        return (obs, None, None, None, infos)

    def step(self, envs: Any, use_async: bool) -> tuple[Any, ...]:
        held = self.held.tolist()
        items = [self.action_spaces[index].sample() for index in held]
        space = self.full.single_action_space
        actions = concatenate(space, items, create_empty_array(space, len(held)))  # type: ignore[arg-type]
        for index, action in zip(held, items):
            reference = self.references[index]
            batch = concatenate(space, [action], create_empty_array(space, 1))  # type: ignore[arg-type]
            obs, rewards, terminated, truncated, infos = reference.step(batch)
            self.pending[index] = (
                item_of(reference.single_observation_space, obs, 0),
                rewards[0],
                terminated[0],
                truncated[0],
                unbatch_info(infos, 0),
            )
        if use_async:
            envs.step_async(copy.deepcopy(actions))
            result = envs.step_wait()
        else:
            result = envs.step(copy.deepcopy(actions))
        if not (isinstance(result, tuple) and len(result) == 5):
            raise self.fail(
                "step",
                f"step returned {describe(result)}",
                "return (obs, rewards, terminated, truncated, infos)",
            )
        how = "step_async/step_wait" if use_async else "step"
        self._after(
            envs,
            result,
            f"the trajectory ({how})",
            _FIX_AUTORESET,
            lambda: self.full.step(copy.deepcopy(actions)) if self.lockstep else (),
        )
        return result

    # -- the other properties ---------------------------------------------------------------

    def _check_not_overwritten(self, returned: tuple[Any, ...], saved: tuple[Any, ...]) -> None:
        found = difference(returned, saved, "the previous step's result")
        if found:
            raise self.fail(
                "returned arrays not overwritten by the next step",
                f"{found}: it changed in place",
                "return copies of the buffers the backend writes into (copy=True is the "
                "default); hand out views only with copy=False, and document it",
            )

    def _check_bad_actions(self, envs: Any) -> None:
        size = len(self.held)
        counts = envs.get_attr("count")
        bad = {
            f"a batch of {size + 1} actions for {size} envs": np.zeros(size + 1, dtype=np.int64),
            f"actions of shape ({size}, 1)": np.zeros((size, 1), dtype=np.int64),
            "action 2 for Discrete(2)": np.array([0] * (size - 1) + [2], dtype=np.int64),
            "action -1 for Discrete(2)": np.array([-1] + [0] * (size - 1), dtype=np.int64),
        }
        for label, actions in bad.items():
            try:
                envs.step(actions)
            except (ValueError, TypeError):
                pass
            except Exception as exc:
                raise self.fail(
                    "the action checks",
                    f"{label} raised {type(exc).__name__}: {exc}",
                    "check actions in the caller (vecaccel.spaces.check_actions) and raise "
                    "ValueError or TypeError naming the env and the space",
                ) from exc
            else:
                raise self.fail(
                    "the action checks",
                    f"{label} was accepted",
                    "check actions in the caller before any env steps "
                    "(vecaccel.spaces.check_actions) and raise ValueError or TypeError",
                )
            after = envs.get_attr("count")
            if after != counts:
                changed = [i for i, (a, b) in enumerate(zip(after, counts)) if a != b]
                raise self.fail(
                    "the action checks",
                    f"{label} was refused, but envs {changed} stepped (step counts {counts} "
                    f"became {after})",
                    "check the whole batch of actions before sending any to an env "
                    "(vecaccel.VecEnv's _check_actions does; a plain gymnasium.vector.VectorEnv "
                    "steps the envs it can before it finds the bad action: subclass "
                    "vecaccel.VecEnv)",
                    changed[0],
                )

    def _check_attributes(self, envs: Any) -> None:
        fix = (
            "call/get_attr/set_attr act on every sub-env in index order and return a tuple "
            "(gymnasium.vector.VectorEnv's API)"
        )

        def expect(label: str, got: Any, want: Any) -> None:
            if got != want:
                raise self.fail("call/get_attr/set_attr", f"{label} is {got!r}, expected {want!r}",
                                fix)  # fmt: skip

        n = NUM_ENVS
        expect('get_attr("value")', envs.get_attr("value"), (0,) * n)
        envs.set_attr("value", list(range(1, n + 1)))
        expect('get_attr("value") after set_attr', envs.get_attr("value"), tuple(range(1, n + 1)))
        expect('call("add", 10)', envs.call("add", 10), tuple(range(11, n + 11)))
        expect('call("add", x=1)', envs.call("add", x=1), tuple(range(2, n + 2)))
        envs.set_attr("value", 5)
        expect("set_attr with one value for all", envs.get_attr("value"), (5,) * n)
        expect('get_attr("render_mode")', envs.get_attr("render_mode"), (None,) * n)
        expect(
            'get_attr("np_random_seed")',
            envs.get_attr("np_random_seed"),
            tuple(reference.get_attr("np_random_seed")[0] for reference in self.references),
        )
        try:
            envs.set_attr("value", [1, 2])
        except ValueError:
            pass
        else:
            raise self.fail(
                "call/get_attr/set_attr",
                f"set_attr with 2 values for {n} envs was accepted",
                "raise ValueError when the number of values is not num_envs",
            )
        if _implements(envs, "call_indices") and _implements(envs, "set_attr_indices"):
            envs.set_attr_indices("value", [7, 8], [2, 0])
            expect("set_attr_indices", envs.get_attr("value"), (8, 5, 7, 5))
            expect("call_indices", envs.call_indices("add", [2, 0], 100), (107, 108))
            expect("call_indices with a function", envs.call_indices(env_value, [1, 2], offset=1),
                   (6, 8))  # fmt: skip
            expect("call with a lambda", envs.call(lambda e, k: e.get_wrapper_attr("value") * k, 2),
                   (16, 10, 14, 10))  # fmt: skip
            try:
                envs.call_indices("add", [n], 0)
            except IndexError:
                pass
            else:
                raise self.fail(
                    "call/get_attr/set_attr",
                    f"call_indices with index {n} of {n} envs was accepted",
                    "raise IndexError for an env index out of range",
                )
        has_indices = _implements(envs, "call_indices")
        before = envs.get_attr("value")
        try:
            if has_indices:
                envs.call_indices("add", [1], "not a number")
            else:
                envs.call("add", "not a number")
        except WorkerError as exc:
            named = tuple(getattr(exc, "env_indices", None) or ())
            if (has_indices and named != (1,)) or not named:
                raise self.fail(
                    "errors inside call",
                    f"the WorkerError names envs {named!r}, the error was in env 1",
                    "build the error with vecaccel.errors.env_error(exc, index, 'call')",
                    1,
                ) from exc
        except Exception as exc:
            raise self.fail(
                "errors inside call",
                f"an env's TypeError came out as {type(exc).__name__}: {exc}",
                "raise vecaccel.WorkerError (vecaccel.errors.env_error) naming the env",
            ) from exc
        else:
            raise self.fail(
                "errors inside call",
                "an env's TypeError was swallowed",
                "raise it as vecaccel.WorkerError",
            )
        expect('get_attr("value") after a failed call', envs.get_attr("value"), before)
        self.step_label = "a step after a failed call"
        self.step(envs, use_async=False)

    def _check_step_wait_without_step(self, envs: Any) -> None:
        self.step_label = "step_wait() with no step pending"
        try:
            envs.step_wait()
        except (RuntimeError, gym.error.NoAsyncCallError):
            return
        raise self.fail(
            "the step_async/step_wait pair",
            "step_wait() returned with no step_async() before it",
            "raise RuntimeError (gymnasium.error.NoAsyncCallError) when nothing is pending",
        )

    def _check_close(self, envs: Any) -> None:
        self.step_label = "close()"
        envs.close()
        envs.close()
        if not getattr(envs, "closed", False):
            raise self.fail("close()", "closed is false after close()", "set closed = True")
        for label, call in (
            ("step", lambda: envs.step(envs.action_space.sample())),
            ("reset", lambda: envs.reset(seed=0)),
        ):
            try:
                call()  # type: ignore[no-untyped-call]
            except gym.error.ClosedEnvironmentError:
                continue
            except Exception as exc:
                raise self.fail(
                    "a closed env",
                    f"{label}() after close() raised {type(exc).__name__}: {exc}",
                    "raise vecaccel.ClosedEnvError (a gymnasium.error.ClosedEnvironmentError)",
                ) from exc
            raise self.fail(
                "a closed env",
                f"{label}() after close() returned",
                "raise vecaccel.ClosedEnvError (a gymnasium.error.ClosedEnvironmentError)",
            )
