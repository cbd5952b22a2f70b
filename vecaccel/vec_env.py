"""What every vecaccel backend shares: the ``VecEnv`` contract on top of Gymnasium's ``VectorEnv``.

One :class:`EnvRunner` steps a single environment under an autoreset mode exactly as
``gymnasium.vector.SyncVectorEnv`` does; the serial backend runs them in-process and the worker
processes of the shared-memory backends run the very same class, so every backend shares one
definition of the semantics.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, SupportsFloat, TypeAlias

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from vecaccel.errors import ClosedEnvError, env_error
from vecaccel.spaces import check_actions
from vecaccel.stats import RunStats, StepClock

if TYPE_CHECKING:
    from typing_extensions import Self

#: The ``seed`` that ``reset`` takes, as Gymnasium's ``VectorEnv.reset``: one seed for the
#: envs (``seed + i`` for env ``i``), one per env (``None`` leaves that env unseeded), or none.
Seed: TypeAlias = "int | list[int | None] | None"
#: What ``reset`` returns: the batched observations and the infos dict.
ResetReturn: TypeAlias = "tuple[Any, dict[str, Any]]"
#: What ``step`` and ``step_wait`` return, as Gymnasium's ``VectorEnv.step``: observations,
#: rewards, terminations, truncations (arrays, or tensors on the action server) and infos.
StepReturn: TypeAlias = "tuple[Any, Any, Any, Any, dict[str, Any]]"

__all__ = [
    "AutoresetMode",
    "EnvRunner",
    "VecEnv",
    "AsyncState",
    "Capabilities",
    "ResetReturn",
    "Seed",
    "StepReturn",
    "add_info",
    "batch_infos",
    "check_env_spaces",
    "check_reset_mask_held",
    "make_env",
    "normalize_seeds",
    "reset_mask_only",
    "snapshot",
    "split_reset_mask",
]


class AsyncState(enum.Enum):
    """Where the ``step_async``/``step_wait`` state machine stands."""

    DEFAULT = "default"
    WAITING_RESET = "reset"
    WAITING_STEP = "step"
    WAITING_CALL = "call"


def normalize_seeds(seed: int | Sequence[int | None] | None, num_envs: int) -> list[int | None]:
    """Expand ``seed`` as Gymnasium does: ``None``, ``int`` (``seed + i``) or one per env.

    Example:
        >>> normalize_seeds(3, 2)
        [3, 4]
    """
    if seed is None:
        return [None] * num_envs
    if isinstance(seed, (int, np.integer)):
        return [int(seed) + i for i in range(num_envs)]
    seeds = list(seed)
    if len(seeds) != num_envs:
        raise ValueError(
            f"If seeds are passed as a list the length must match num_envs={num_envs} "
            f"but got length={len(seeds)}."
        )
    return seeds


def make_env(env_fn: Callable[[], gym.Env], index: int) -> gym.Env:
    """Call env function ``index``; if it raises, raise :class:`WorkerError` naming the env,
    as a worker process does, so a construction error has one type wherever the env is built."""
    try:
        env = env_fn()
    except Exception as exc:
        raise env_error(exc, index, "make") from exc
    if isinstance(env, gym.vector.VectorEnv):
        env.close()
        raise TypeError(
            f"env function {index} returned a {type(env).__name__}, a vector env, where one "
            "gymnasium.Env per env function is expected: pass a vector env function "
            "fn(n) -> VectorEnv with vectorized=True (make_vec(fn, num_envs, vectorized=True))"
        )
    return env


def check_env_spaces(
    env: gym.Env[Any, Any],
    index: int,
    observation_space: gym.Space[Any],
    action_space: gym.Space[Any],
) -> None:
    """Raise ``RuntimeError`` naming env ``index`` if its spaces differ from env 0's, as
    ``SyncVectorEnv`` does: batching needs one observation and one action space for all."""
    for kind, expected, found in (
        ("observation", observation_space, env.observation_space),
        ("action", action_space, env.action_space),
    ):
        if found != expected:
            raise RuntimeError(
                f"env {index} has {kind} space {found}, but env 0 has {expected}: all "
                f"sub-environments of a vector env must have the same {kind} space"
            )


def snapshot(value: Any) -> Any:
    """A copy of ``value``'s arrays, dicts and tuples, down to their leaves (other objects are
    shared, as Gymnasium's info batching shares them).

    A backend that hands an env's info dict to the caller as it is (``per_env_infos``) keeps a
    snapshot: the env may change its dicts and arrays in place later.

    Example:
        >>> info = {"pos": np.zeros(2)}
        >>> copy = snapshot(info)
        >>> info["pos"][0] = 1.0
        >>> copy["pos"].tolist()
        [0.0, 0.0]
    """
    if isinstance(value, np.ndarray):
        return value.copy()
    if isinstance(value, dict):
        return {key: snapshot(item) for key, item in value.items()}
    if isinstance(value, tuple):
        items = [snapshot(item) for item in value]
        return type(value)(*items) if hasattr(value, "_fields") else tuple(items)  # NamedTuple
    return value


class EnvRunner:
    """Steps one ``gymnasium.Env`` under an autoreset mode, as ``SyncVectorEnv`` does for each env.

    ``step`` returns ``(obs, reward, terminated, truncated, info)`` where ``info`` is the dict
    to merge into the batched infos for this env (``final_obs``/``final_info`` included in
    SAME_STEP mode).
    """

    def __init__(self, env: gym.Env, autoreset_mode: AutoresetMode, index: int = 0) -> None:
        self.env = env
        self.autoreset_mode = autoreset_mode
        self.index = index
        self.needs_reset = False

    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        self.needs_reset = False
        return obs, info

    def step(self, action: Any) -> tuple[Any, SupportsFloat, bool, bool, dict[str, Any]]:
        mode = self.autoreset_mode
        if mode is AutoresetMode.NEXT_STEP and self.needs_reset:
            obs, info = self.env.reset()
            reward: SupportsFloat = 0.0
            terminated, truncated = False, False
        else:
            if mode is AutoresetMode.DISABLED and self.needs_reset:
                raise RuntimeError(
                    f"env {self.index} ended its episode and autoreset_mode is DISABLED: reset it "
                    "with reset(options={'reset_mask': mask}) before stepping it again"
                )
            obs, reward, terminated, truncated, info = self.env.step(action)
            if mode is AutoresetMode.SAME_STEP and (terminated or truncated):
                # the env may update its obs array or info dict in place when it resets
                final = {"final_obs": snapshot(obs), "final_info": snapshot(info)}
                obs, reset_info = self.env.reset()
                info = {**final, **reset_info}
        self.needs_reset = bool(terminated or truncated)
        return obs, reward, terminated, truncated, info

    def call(
        self, name: str | Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        if callable(name):  # a function applied to the env itself (picklable under spawn)
            return name(self.env, *args, **kwargs)
        attribute = self.env.get_wrapper_attr(name)
        if callable(attribute):
            return attribute(*args, **kwargs)
        return attribute

    def set_attr(self, name: str, value: Any) -> None:
        self.env.set_wrapper_attr(name, value)


def parse_autoreset_mode(mode: str | AutoresetMode) -> AutoresetMode:
    if isinstance(mode, AutoresetMode):
        return mode
    try:
        return AutoresetMode(mode)
    except ValueError:
        valid = ", ".join(m.value for m in AutoresetMode)
        raise ValueError(f"unknown autoreset_mode {mode!r}; valid: {valid}") from None


class _ResetMaskOnly(dict[str, Any]):
    """Reset options holding a ``reset_mask`` and nothing else for the envs (see
    :func:`reset_mask_only`); a ``dict`` still, for backends that do not know it."""


def reset_mask_only(reset_mask: np.ndarray) -> dict[str, Any]:
    """``options`` for ``reset`` that reset the envs in ``reset_mask`` with ``options=None``.

    ``reset(options={"reset_mask": mask})`` passes what is left of the dict, ``{}``, to the
    envs, as ``SyncVectorEnv`` does; adapters whose contract is ``env.reset()`` (SB3's
    ``DummyVecEnv``) use this instead, so that an env reading its options whenever they are not
    ``None`` sees none. Every backend that splits its options with :func:`split_reset_mask`
    honours it; others see a plain ``{"reset_mask": mask}``.

    Example:
        >>> split_reset_mask(reset_mask_only(np.array([True, False])), 2)
        (array([ True, False]), None)
        >>> split_reset_mask({"reset_mask": np.array([True, False])}, 2)
        (array([ True, False]), {})
    """
    return _ResetMaskOnly(reset_mask=reset_mask)


def check_reset_mask_held(reset_mask: np.ndarray, held: np.ndarray | None) -> None:
    """Refuse a masked reset of envs the caller does not hold, on a backend that returns some
    envs per step: ``held`` is the batch last returned (its ``info["env_id"]``), ``None``
    before the first full reset.

    Raises:
        RuntimeError: before the first full reset.
        ValueError: naming the envs outside ``held``.

    Example:
        >>> check_reset_mask_held(np.array([True, False, False]), np.array([0, 2]))
        >>> check_reset_mask_held(np.array([False, True, False]), np.array([0, 2]))
        Traceback (most recent call last):
        ...
        ValueError: reset_mask names envs [1], which are not in the batch last returned ...
    """
    if held is None:
        raise RuntimeError("call reset() without a reset_mask before resetting some envs")
    outside = np.setdiff1d(np.flatnonzero(reset_mask), held)
    if outside.size:
        raise ValueError(
            f"reset_mask names envs {outside.tolist()}, which are not in the batch last "
            f"returned (info['env_id'] {held.tolist()}); a masked reset may only reset envs "
            "the caller holds"
        )


def split_reset_mask(
    options: dict[str, Any] | None, num_envs: int
) -> tuple[np.ndarray | None, dict[str, Any] | None]:
    """Pop and validate ``options['reset_mask']`` exactly as ``SyncVectorEnv`` does.

    Returns:
        ``(reset_mask, options for the envs)``: the options left, ``{}`` when only the mask was
        given, as ``SyncVectorEnv`` passes them on; ``None`` for :func:`reset_mask_only`.
    """
    if options is None or "reset_mask" not in options:
        return None, options
    mask_only = isinstance(options, _ResetMaskOnly)
    options = dict(options)
    reset_mask = options.pop("reset_mask")
    if not isinstance(reset_mask, np.ndarray):
        raise TypeError(f"`options['reset_mask']` must be a numpy array, got {type(reset_mask)}")
    if reset_mask.shape != (num_envs,):
        raise ValueError(
            f"`options['reset_mask']` must have shape `({num_envs},)`, got {reset_mask.shape}"
        )
    if reset_mask.dtype != np.bool_:
        raise TypeError(
            f"`options['reset_mask']` must have `dtype=np.bool_`, got {reset_mask.dtype}"
        )
    if not np.any(reset_mask):
        raise ValueError(
            "`options['reset_mask']` must contain a boolean array with at least one True value, "
            f"got reset_mask={reset_mask}"
        )
    return reset_mask, None if mask_only and not options else options


def add_info(infos: dict[str, Any], info: dict[str, Any], index: int, size: int) -> dict[str, Any]:
    """Gymnasium's info batching (``VectorEnv._add_info``) over a batch of ``size`` rows: each
    key of ``info`` goes to row ``index`` of an array of ``size`` (``final_obs`` and unknown
    types: object arrays; nested dicts: recursively), with a ``_key`` mask beside it.

    Backends that return a subset of their envs (asynchronous stepping, Ray shards, agent rows)
    batch over what they return, not over ``num_envs``.

    Example:
        >>> infos = add_info({}, {"lives": 3}, 1, size=2)
        >>> infos["lives"].tolist(), infos["_lives"].tolist()
        ([0, 3], [False, True])
    """
    for key, value in info.items():
        if key == "final_obs":  # kept as the objects they are, for users who read them one by one
            array = infos["final_obs"] if "final_obs" in infos else np.full(size, None, object)
            array[index] = value
        elif isinstance(value, dict):
            array = add_info(infos.get(key, {}), value, index, size)
        else:
            if key in infos:
                array = infos[key]
            elif type(value) in (int, float, bool) or isinstance(value, np.number):
                array = np.zeros(size, dtype=type(value))
            elif isinstance(value, np.ndarray):
                array = np.zeros((size, *value.shape), dtype=value.dtype)
            else:
                array = np.full(size, None, dtype=object)
            array[index] = value
        mask = infos.get(f"_{key}", np.zeros(size, dtype=np.bool_))
        mask[index] = True
        infos[key], infos[f"_{key}"] = array, mask
    return infos


def batch_infos(pairs: Sequence[tuple[int, dict[str, Any]]], size: int) -> dict[str, Any]:
    """The infos of ``(row, info)`` pairs batched over ``size`` rows (:func:`add_info`)."""
    infos: dict[str, Any] = {}
    for index, info in pairs:
        if info:
            infos = add_info(infos, info, index, size)
    return infos


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """What each step of a vector env returns, as the Sampler and the adapters need to know.

    Example:
        >>> Capabilities.of(gym.vector.SyncVectorEnv([lambda: gym.make("CartPole-v1")] * 2))
        Capabilities(batch_size=2, in_index_order=True, alternating=False, min_batch_size=None)
    """

    batch_size: int
    """Envs each step returns (every env, unless the backend returns them as they finish); the
    most it returns where batches vary."""
    in_index_order: bool
    """Whether they come in index order (``False``: in the order they finish)."""
    alternating: bool
    """Whether two fixed halves of the envs take turns (the action server's ``alternating``)."""
    min_batch_size: int | None = None
    """The fewest envs a step returns where batches vary (a floor below the ceiling);
    ``None``: every step returns ``batch_size``."""

    @property
    def fixed_batch(self) -> bool:
        """Whether every step returns ``batch_size`` envs."""
        return self.min_batch_size in (None, self.batch_size)

    @classmethod
    def of(cls, env: Any) -> Capabilities:
        """A vecaccel backend's own (:attr:`VecEnv.capabilities`); any other vector env (a
        Gymnasium one, an adapter's) returns every env in index order each step."""
        if isinstance(env, VecEnv):
            return env.capabilities
        return cls(int(env.num_envs), True, False)


class VecEnv(VectorEnv[Any, Any, Any]):
    """Base class of every vecaccel backend: a ``gymnasium.vector.VectorEnv``.

    Subclasses implement ``reset``, ``step_async``, ``step_wait``, ``call`` and ``set_attr``
    (plus ``close_extras``); this class provides spaces, metadata, action checking, info
    batching and the async state bookkeeping. A backend that returns part of its envs each
    step, or returns them out of order, says so in the three attributes below, which
    :attr:`capabilities` reads.
    """

    #: Envs each step returns (``None``: every env).
    batch_size: int | None = None
    #: Whether each step returns its envs in index order (``False``: in the order they finish).
    returns_envs_in_order: bool = True
    #: Whether two fixed halves of the envs take turns.
    alternating: bool = False
    #: The fewest envs a step returns where batches vary (``None``: always ``batch_size``).
    min_batch_size: int | None = None

    @property
    def capabilities(self) -> Capabilities:
        """What each step returns (:class:`Capabilities`)."""
        batch_size = int(self.batch_size or self.num_envs)
        floor = self.min_batch_size
        return Capabilities(
            batch_size=batch_size,
            in_index_order=bool(self.returns_envs_in_order),
            alternating=bool(self.alternating),
            min_batch_size=None if floor in (None, batch_size) else int(floor),
        )

    def __init__(
        self,
        env_fns: Sequence[Callable[[], gym.Env]],
        *,
        autoreset_mode: str | AutoresetMode = AutoresetMode.NEXT_STEP,
        copy: bool = True,
        probe_env: gym.Env | None = None,
    ) -> None:
        if len(env_fns) == 0:
            raise ValueError("a vector env needs at least one env function")
        self.env_fns = list(env_fns)
        self.num_envs = len(self.env_fns)
        self.autoreset_mode = parse_autoreset_mode(autoreset_mode)
        self.copy = copy
        owns_probe = probe_env is None
        probe = probe_env if probe_env is not None else make_env(self.env_fns[0], 0)
        try:
            self.single_observation_space = probe.observation_space
            self.single_action_space = probe.action_space
            self.metadata = dict(getattr(probe, "metadata", {}) or {})
            self.render_mode = probe.render_mode
            self.spec = probe.spec
        finally:
            if owns_probe:
                probe.close()
        self.metadata["autoreset_mode"] = self.autoreset_mode
        self.observation_space = batch_space(self.single_observation_space, self.num_envs)
        self.action_space = batch_space(self.single_action_space, self.num_envs)
        self._state = AsyncState.DEFAULT
        self.closed = False

    @property
    def _clock(self) -> StepClock:
        """The step clock, made at first use: adapters that subclass ``VecEnv`` without calling
        its ``__init__`` get one too."""
        clock = self.__dict__.get("_step_clock")
        if clock is None:
            clock = self.__dict__["_step_clock"] = StepClock(self._env_busy_s)
        return clock

    def _env_busy_s(self) -> np.ndarray | None:
        """Cumulative seconds inside the envs, one per lane (a worker, the caller's own envs),
        for :meth:`stats`; ``None`` where the backend cannot tell."""
        return None

    def stats(self) -> RunStats:
        """Where this vector env's steps spent their time: in the envs, in the transport, and
        in the caller between steps (its policy), cumulative, per step and for the last step,
        with the verdict (``"env-bound"``, ``"policy-bound"``, ``"transport-bound"``); see
        :mod:`vecaccel.stats`.

        Example:
            >>> import vecaccel, numpy as np
            >>> envs = vecaccel.make_vec("CartPole-v1", 2, backend="serial")
            >>> _ = envs.reset(seed=0)
            >>> _ = envs.step(np.zeros(2, dtype=np.int64))
            >>> stats = envs.stats()
            >>> stats.steps, stats.verdict in ("env-bound", "policy-bound", "transport-bound")
            (1, True)
            >>> envs.close()
        """
        return self._clock.stats()

    # -- shared helpers ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self.closed:
            raise ClosedEnvError(f"{type(self).__name__} is closed; create a new one")

    def _check_actions(self, actions: Any, env_ids: Any = None) -> Any:
        n = self.num_envs if env_ids is None else len(env_ids)
        return check_actions(self.single_action_space, actions, n, env_ids)

    #: Backends whose every ``step``/``reset`` builds its infos with ``_batch_infos`` set this,
    #: and then honour :attr:`per_env_infos`.
    supports_per_env_infos = False
    #: When true (only where ``supports_per_env_infos``), ``step``/``reset`` return an empty
    #: infos dict and leave the envs' info dicts, as ``(env index, info)`` pairs (envs without
    #: an info may be missing), in :attr:`last_infos`: for adapters that want one dict per env
    #: (SB3's list), which would otherwise batch Gymnasium-style and split again. The dicts
    #: are the caller's to keep and change: copies of what the envs returned, never the envs'
    #: own objects (an env may update its info dict or arrays in place on its next step).
    per_env_infos = False
    #: The ``(env index, info)`` pairs of the last ``step``/``reset`` made with
    #: :attr:`per_env_infos`; empty after one made without.
    last_infos: list[tuple[int, dict[str, Any]]] = []

    def _add_info(
        self, vector_infos: dict[str, Any], env_info: dict[str, Any], env_num: int
    ) -> dict[str, Any]:
        return add_info(vector_infos, env_info, env_num, self.num_envs)

    def _batch_infos(
        self, pairs: Sequence[tuple[int, dict[str, Any]]], size: int | None = None
    ) -> dict[str, Any]:
        """The infos of ``(row, info)`` pairs, batched over ``size`` rows (default: every env),
        or kept in :attr:`last_infos` with :attr:`per_env_infos`."""
        if self.per_env_infos:
            self.last_infos = list(pairs)
            return {}
        # never stale: a caller that switches per_env_infos on and off reads no old pairs
        self.last_infos = []
        return batch_infos(pairs, self.num_envs if size is None else size)

    if TYPE_CHECKING:  # every backend defines both; the base class holds no placeholder

        def step_async(self, actions: Any) -> None:
            """Send ``actions`` to the envs and return at once; ``step_wait`` collects the step."""

        def step_wait(self, timeout: float | None = None) -> StepReturn:
            """Wait (at most ``timeout`` seconds, ``None``: no limit) for the step that
            ``step_async`` started, and return it as ``step`` does."""

    def step(self, actions: Any) -> StepReturn:
        """Step every env with ``actions`` (``step_async`` then ``step_wait``)."""
        clock = self._clock
        clock.begin()
        try:
            self.step_async(actions)
            result = self.step_wait()
        except BaseException:
            clock.cancel()
            raise
        clock.end()
        return result

    def call(self, name: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        """Call method ``name`` (or read attribute ``name``) of every sub-environment."""
        return self.call_indices(name, range(self.num_envs), *args, **kwargs)

    def call_indices(
        self, name: str | Callable[..., Any], indices: Sequence[int], *args: Any, **kwargs: Any
    ) -> tuple[Any, ...]:
        """Like :meth:`call`, for the sub-environments at ``indices`` only (in that order).

        ``name`` may also be a function, called as ``name(env, *args, **kwargs)`` on each env
        (it must be picklable for process backends under spawn).
        """
        raise TypeError(f"{type(self).__name__} does not implement this method")

    def get_attr(self, name: str) -> tuple[Any, ...]:
        """Attribute ``name`` of every sub-environment (searched through its wrappers)."""
        return self.call(name)

    def set_attr(self, name: str, values: Any) -> None:
        """Set attribute ``name`` on every sub-environment (one value each, or one for all)."""
        self.set_attr_indices(name, values, range(self.num_envs))

    def set_attr_indices(self, name: str, values: Any, indices: Sequence[int]) -> None:
        """Set attribute ``name`` on the sub-environments at ``indices``."""
        raise TypeError(f"{type(self).__name__} does not implement this method")

    def _normalize_indices(self, indices: Sequence[int] | None) -> list[int]:
        if indices is None:
            return list(range(self.num_envs))
        if isinstance(indices, (int, np.integer)):
            indices = [int(indices)]
        out = []
        for index in indices:
            index = int(index)
            if not -self.num_envs <= index < self.num_envs:
                raise IndexError(f"env index {index} out of range for {self.num_envs} envs")
            out.append(index % self.num_envs)
        return out

    def _values_for(self, values: Any, count: int) -> list[Any]:
        if not isinstance(values, (list, tuple)):
            return [values] * count
        if len(values) != count:
            raise ValueError(
                f"values must be a list or tuple of length {count} (one per env), "
                f"got length {len(values)}"
            )
        return list(values)

    @property
    def np_random_seed(self) -> tuple[int | None, ...]:  # type: ignore[override]
        """The sub-environments' seeds, one per env (as ``SyncVectorEnv``)."""
        return self.get_attr("np_random_seed")

    @property  # type: ignore[misc]  # read-only, as SyncVectorEnv's
    def np_random(self) -> tuple[np.random.Generator, ...]:  # type: ignore[override]
        """The sub-environments' random generators, one per env (as ``SyncVectorEnv``)."""
        return self.get_attr("np_random")

    def render(self) -> tuple[Any, ...] | None:
        return self.call("render")

    def close(self, **kwargs: Any) -> None:
        if self.closed:
            return
        try:
            self.close_extras(**kwargs)
        finally:
            self.closed = True

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> Literal[False]:
        self.close()
        return False

    def __del__(self) -> None:
        if not getattr(self, "closed", True):
            try:
                self.close(terminate=True)
            except Exception:  # noqa: BLE001 - close at interpreter exit must not raise
                pass

    def __repr__(self) -> str:
        return f"{type(self).__name__}(num_envs={getattr(self, 'num_envs', '?')})"
