"""Preallocated replay buffers for the DQN family: uniform sampling, n-step, frame-once.

Prioritized replay builds on this buffer in ``prioritized_replay``.

Layout. Storage is time-major ``[T, B, ...]``: column ``b`` is a ring of ``T`` slots written only by
env ``b``, each column with its own cursor. A slot holds the observation an action was taken from,
that action, its reward and whether the episode terminated or was truncated right after it. When an
episode ends, the next slot of that column holds the episode's *final* observation (the one
Gymnasium returns in ``infos["final_obs"]`` under ``AutoresetMode.SAME_STEP``) and is flagged so
that it is never sampled as a starting point. The observation that an n-step target bootstraps from
is then always ``k`` slots further down the same column, ``k <= n``, whether or not the episode
ended in between, and nothing is stored twice.

n-step targets are computed when a batch is sampled: the window stops at the first episode end;
termination stops the bootstrap (``discount = 0``), truncation does not (it bootstraps from the
stored final observation).

Frame-once storage. With ``frame_stack=F`` the observations are assumed to be stacks of the last
``F`` frames along axis 0 (Gymnasium's ``FrameStackObservation`` with ``padding_type="reset"``, as
in the Atari set-up). Only the newest frame of each observation is stored and the stack is rebuilt
when sampling, repeating the first frame of an episode where the stack would reach back past the
episode start, exactly as the wrapper pads after a reset. This takes ``F`` times less memory; the
buffer checks now and then that the stacks it rebuilds equal the observations it was given.

Shared memory. Every piece of state, cursors and counters included, lives in arrays made by
``array_factory`` (``np.zeros`` by default), so a buffer can live in shared memory; see
:attr:`ReplayBuffer.arrays`.

Example:
    >>> import numpy as np
    >>> from gymnasium.spaces import Box, Discrete
    >>> buffer = ReplayBuffer(Box(-1, 1, (2,)), Discrete(2), capacity=64, num_envs=2, n_step=2,
    ...                       gamma=0.5, seed=0)
    >>> obs = np.zeros((2, 2), dtype=np.float32)
    >>> for step in range(5):
    ...     buffer.add(obs + step, np.array([0, 1]), np.ones(2), np.zeros(2, bool), np.zeros(2, bool))
    >>> batch = buffer.sample(4)
    >>> batch.obs.shape, batch.reward.tolist(), batch.discount.tolist()
    ((4, 2), [1.5, 1.5, 1.5, 1.5], [0.25, 0.25, 0.25, 0.25])
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np
from gymnasium import spaces

from vecaccel.trainers.replay.sumtree import ArrayFactory

__all__ = [
    "ArrayFactory",
    "ReplayBuffer",
    "ReplayMemoryError",
    "ReplaySample",
    "available_memory",
    "replay_buffer_kwargs",
]


class ReplayMemoryError(MemoryError):
    """The replay buffer would need more memory than the machine has available.

    Attributes:
        required: bytes the buffer needs.
        available: bytes that were available when it was checked.
    """

    def __init__(self, message: str, required: int, available: int) -> None:
        super().__init__(message)
        self.required = required
        self.available = available


class ReplaySample(NamedTuple):
    """One sampled batch; index ``i`` of every field belongs to the same transition.

    Attributes:
        obs: observations the actions were taken from, ``[batch, *obs_shape]``.
        action: the actions taken.
        reward: n-step discounted returns (float32).
        next_obs: observations to bootstrap from.
        discount: ``gamma ** k`` for a window of ``k`` steps, 0 where the episode terminated inside
            the window, so the target is ``reward + discount * value(next_obs)``.
        indices: flat slot indices, for :meth:`PrioritizedReplayBuffer.update_priorities`.
        weights: importance-sampling weights (all ones for uniform sampling), float32.
    """

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray
    discount: np.ndarray
    indices: np.ndarray
    weights: np.ndarray


def available_memory() -> int | None:
    """Bytes of memory available to new allocations, or ``None`` when it cannot be told.

    Uses ``psutil`` when installed, else ``MemAvailable`` from ``/proc/meminfo``.
    """
    try:
        import psutil

        return int(psutil.virtual_memory().available)
    except ImportError:
        pass
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


def _space_layout(space: spaces.Space) -> tuple[tuple[int, ...], np.dtype]:
    if isinstance(space, spaces.Discrete):
        return (), np.dtype(np.int64)
    if isinstance(space, (spaces.Box, spaces.MultiDiscrete, spaces.MultiBinary)):
        return tuple(space.shape), np.dtype(space.dtype)
    raise TypeError(
        f"replay buffers store Box, Discrete, MultiDiscrete or MultiBinary spaces, got {space}"
    )


class ReplayBuffer:
    """Uniform replay over ``[T, B]`` preallocated storage, with n-step returns and frame-once stacks.

    Args:
        observation_space: the space of one env's observation.
        action_space: the space of one env's action.
        capacity: slots in total (``T = ceil(capacity / num_envs)`` per env). Each episode also
            takes one slot for its final observation.
        num_envs: how many envs add a transition at each :meth:`add`.
        n_step: length of the return window.
        gamma: discount factor.
        frame_stack: ``F > 1`` stores only the newest of the ``F`` frames stacked on axis 0 of each
            observation and rebuilds the stack when sampling.
        array_factory: allocator called like ``np.zeros(shape, dtype)`` for every array.
        seed: seed of the sampling generator.
        check_memory: raise :class:`ReplayMemoryError` before allocating when :attr:`nbytes`
            exceeds the memory available.

    Raises:
        ReplayMemoryError: the buffer does not fit in available memory.
        ValueError: inconsistent sizes.
    """

    #: how often (in :meth:`add` calls) rebuilt frame stacks are compared with the real ones
    validate_period = 1000

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        capacity: int,
        num_envs: int = 1,
        *,
        n_step: int = 1,
        gamma: float = 0.99,
        frame_stack: int = 1,
        array_factory: ArrayFactory | None = None,
        seed: int | None = None,
        check_memory: bool = True,
    ) -> None:
        layout = self._layout(
            observation_space, action_space, capacity, num_envs, n_step, frame_stack
        )
        self.observation_space = observation_space
        self.action_space = action_space
        self.num_envs = int(num_envs)
        self.T = layout["T"]
        self.capacity = self.T * self.num_envs
        self.n_step = int(n_step)
        self.gamma = float(gamma)
        self.frame_stack = int(frame_stack)
        self.obs_shape: tuple[int, ...] = layout["obs_shape"]
        self.frame_shape: tuple[int, ...] = layout["frame_shape"]
        self.obs_dtype: np.dtype = layout["obs_dtype"]
        self.action_shape: tuple[int, ...] = layout["action_shape"]
        self.action_dtype: np.dtype = layout["action_dtype"]
        self.nbytes = (
            self.estimate_nbytes(
                observation_space,
                action_space,
                capacity,
                num_envs,
                n_step=n_step,
                frame_stack=frame_stack,
            )
            + self._extra_nbytes()
        )
        if check_memory:
            self.check_memory(self.nbytes)
        factory: Callable[..., np.ndarray] = array_factory or np.zeros
        self._factory = factory
        T, B = self.T, self.num_envs
        self.frames = factory((T, B, *self.frame_shape), self.obs_dtype)
        self.actions = factory((T, B, *self.action_shape), self.action_dtype)
        self.rewards = factory((T, B), np.dtype(np.float32))
        self.terminated = factory((T, B), np.dtype(np.bool_))
        self.truncated = factory((T, B), np.dtype(np.bool_))
        self.episode_start = factory((T, B), np.dtype(np.bool_))
        self.is_final = factory((T, B), np.dtype(np.bool_))
        self.cursor = factory((B,), np.dtype(np.int64))
        self.filled = factory((B,), np.dtype(np.int64))
        # next add starts an episode in that column; the very first add always does
        self.pending_start = factory((B,), np.dtype(np.bool_))
        self.pending_start[:] = True
        # [number of add() calls, transitions added]
        self.counters = factory((2,), np.dtype(np.int64))
        self.rng = np.random.default_rng(seed)
        self._env_ids = np.arange(B)

    # -- sizes ------------------------------------------------------------------------------

    @staticmethod
    def _layout(
        observation_space: spaces.Space,
        action_space: spaces.Space,
        capacity: int,
        num_envs: int,
        n_step: int,
        frame_stack: int,
    ) -> dict[str, Any]:
        if num_envs < 1:
            raise ValueError(f"num_envs must be positive, got {num_envs}")
        if n_step < 1:
            raise ValueError(f"n_step must be at least 1, got {n_step}")
        if frame_stack < 1:
            raise ValueError(f"frame_stack must be at least 1, got {frame_stack}")
        obs_shape, obs_dtype = _space_layout(observation_space)
        action_shape, action_dtype = _space_layout(action_space)
        if frame_stack > 1:
            if len(obs_shape) < 1 or obs_shape[0] != frame_stack:
                raise ValueError(
                    f"frame_stack={frame_stack} needs observations stacked on axis 0 with "
                    f"{frame_stack} frames, got observation shape {obs_shape}"
                )
            frame_shape = obs_shape[1:]
        else:
            frame_shape = obs_shape
        T = math.ceil(capacity / num_envs)
        if T < n_step + frame_stack + 1:
            raise ValueError(
                f"capacity={capacity} gives {T} slots per env for {num_envs} envs; n_step={n_step} "
                f"and frame_stack={frame_stack} need at least {n_step + frame_stack + 1}"
            )
        return {
            "T": T,
            "obs_shape": obs_shape,
            "frame_shape": frame_shape,
            "obs_dtype": obs_dtype,
            "action_shape": action_shape,
            "action_dtype": action_dtype,
        }

    @classmethod
    def estimate_nbytes(
        cls,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        capacity: int,
        num_envs: int = 1,
        *,
        n_step: int = 1,
        frame_stack: int = 1,
    ) -> int:
        """Bytes a buffer with these arguments allocates, before allocating anything.

        Example:
            >>> from gymnasium.spaces import Box, Discrete
            >>> atari = Box(0, 255, (4, 84, 84), dtype="uint8")
            >>> nbytes = ReplayBuffer.estimate_nbytes(atari, Discrete(6), 1_000_000, 8, frame_stack=4)
            >>> round(nbytes / 2**30, 1)  # GiB: one 84x84 frame per step, not four
            6.6
        """
        layout = cls._layout(
            observation_space, action_space, capacity, num_envs, n_step, frame_stack
        )
        slots = layout["T"] * num_envs
        frame = int(np.prod(layout["frame_shape"], dtype=np.int64)) * layout["obs_dtype"].itemsize
        action = (
            int(np.prod(layout["action_shape"], dtype=np.int64)) * layout["action_dtype"].itemsize
        )
        per_slot = frame + action + 4 + 4  # float32 reward, four bool flags
        return slots * per_slot + num_envs * (8 + 8 + 1) + 16

    def _extra_nbytes(self) -> int:
        return 0

    @staticmethod
    def check_memory(required: int, available: int | None = None) -> None:
        """Raise :class:`ReplayMemoryError` when ``required`` bytes exceed available memory.

        Args:
            required: bytes needed.
            available: bytes available; read from the system when ``None`` (no check happens
                when the system cannot tell).
        """
        if available is None:
            available = available_memory()
        if available is not None and required > available:
            raise ReplayMemoryError(
                f"the replay buffer needs {_format_bytes(required)} but only "
                f"{_format_bytes(available)} of memory is available; lower the buffer size "
                "(buffer_size), use frame_stack to store each frame once, or free memory",
                required,
                available,
            )

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """Every array holding the buffer's state, by name (to place or copy them elsewhere)."""
        return {
            "frames": self.frames,
            "actions": self.actions,
            "rewards": self.rewards,
            "terminated": self.terminated,
            "truncated": self.truncated,
            "episode_start": self.episode_start,
            "is_final": self.is_final,
            "cursor": self.cursor,
            "filled": self.filled,
            "pending_start": self.pending_start,
            "counters": self.counters,
        }

    def state_dict(self) -> dict[str, Any]:
        """Copies of every array and the sampling generator's state, for checkpoints."""
        state: dict[str, Any] = {name: array.copy() for name, array in self.arrays.items()}
        state["rng"] = self.rng.bit_generator.state
        # the arrays do not depend on n_step but a prioritized tree does (see restored())
        state["n_step"] = self.n_step
        state["alpha"] = getattr(self, "alpha", None)  # a prioritized tree depends on it too
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (into the existing arrays)."""
        for name, array in self.arrays.items():
            if state[name].shape != array.shape:
                raise ValueError(f"{name}: saved shape {state[name].shape} != {array.shape}")
            array[...] = state[name]
        self.rng.bit_generator.state = state["rng"]
        self.restored(state.get("n_step"), state.get("alpha"))

    def restored(self, saved_n_step: int | None = None, saved_alpha: float | None = None) -> None:
        """Called after :attr:`arrays` were overwritten from a checkpoint.

        The stored transitions do not depend on ``n_step`` (targets are computed when sampling),
        so a buffer may be refilled from one saved under another ``n_step``; only state derived
        from which slots are valid needs fixing, and a uniform buffer keeps none.

        Args:
            saved_n_step: the ``n_step`` of the buffer that was saved (``None``: not known).
            saved_alpha: the saved buffer's prioritization exponent (``None``: not known or
                not prioritized); a uniform buffer ignores it.
        """

    @property
    def steps_added(self) -> int:
        """Transitions added so far (one per env per :meth:`add`)."""
        return int(self.counters[1])

    def __len__(self) -> int:
        """How many transitions can be sampled now (an O(capacity) count)."""
        return int(self._valid_mask().sum())

    # -- writing ----------------------------------------------------------------------------

    def _frames_of(self, obs: np.ndarray) -> np.ndarray:
        return obs[:, -1] if self.frame_stack > 1 else obs

    def add(
        self,
        obs: np.ndarray,
        action: np.ndarray,
        reward: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        final_obs: Any = None,
        active: Any = None,
    ) -> None:
        """Store one step of every env.

        Args:
            obs: ``[num_envs, *obs_shape]`` observations the actions were taken from.
            action: ``[num_envs, *action_shape]``.
            reward: ``[num_envs]``.
            terminated: ``[num_envs]`` bool.
            truncated: ``[num_envs]`` bool.
            final_obs: the final observations of the envs whose episode ended at this step, as in
                ``infos["final_obs"]`` (indexable by env; other entries are ignored). Required when
                an episode is truncated; for terminated episodes it may be omitted.
            active: ``[num_envs]`` bool ``infos["active"]`` of a multi-agent env, or ``None``:
                the rows whose agent was not live store nothing (their columns stand still).

        Raises:
            ValueError: an episode was truncated and ``final_obs`` is missing, or the rebuilt frame
                stacks disagree with the observations (``frame_stack`` does not fit the env).
        """
        B = self.num_envs
        obs = np.asarray(obs)
        if obs.shape != (B, *self.obs_shape):
            raise ValueError(f"obs must have shape {(B, *self.obs_shape)}, got {obs.shape}")
        terminated = np.asarray(terminated, dtype=np.bool_).reshape(B)
        truncated = np.asarray(truncated, dtype=np.bool_).reshape(B)
        action = np.asarray(action).reshape(B, *self.action_shape)
        reward = np.asarray(reward, dtype=np.float32).reshape(B)
        env_ids = self._env_ids
        if active is not None:
            live = np.asarray(active, dtype=np.bool_).reshape(B)
            if not live.all():
                env_ids = np.flatnonzero(live)
                obs, action, reward = obs[env_ids], action[env_ids], reward[env_ids]
                terminated, truncated = terminated[env_ids], truncated[env_ids]
                if final_obs is not None:
                    final_obs = [final_obs[i] for i in env_ids]
        done = terminated | truncated
        slots = self.cursor[env_ids]
        self.frames[slots, env_ids] = self._frames_of(obs)
        self.actions[slots, env_ids] = action
        self.rewards[slots, env_ids] = reward
        self.terminated[slots, env_ids] = terminated
        self.truncated[slots, env_ids] = truncated
        self.episode_start[slots, env_ids] = self.pending_start[env_ids]
        self.is_final[slots, env_ids] = False
        self._advance(env_ids, slots)
        self.counters[0] += 1
        self.counters[1] += len(env_ids)
        if self.frame_stack > 1 and (
            self.counters[0] <= 4 * self.frame_stack or self.counters[0] % self.validate_period == 0
        ):
            self._validate_stacks(slots, obs, env_ids)
        if done.any():
            ended = np.flatnonzero(done)
            self._write_final(ended, final_obs, truncated, env_ids)
        self.pending_start[env_ids] = done

    def _write_final(
        self, ended: np.ndarray, final_obs: Any, truncated: np.ndarray, env_ids: np.ndarray
    ) -> None:
        """Write the final observations of entries ``ended`` (positions in ``env_ids``)."""
        if final_obs is None:
            if truncated[ended].any():
                raise ValueError(
                    "an episode was truncated but final_obs was not given: step the envs with "
                    "autoreset_mode=AutoresetMode.SAME_STEP and pass infos['final_obs'], so the "
                    "target can bootstrap from the true final observation"
                )
            final = np.zeros((len(ended), *self.obs_shape), dtype=self.obs_dtype)
        else:
            final = np.stack([np.asarray(final_obs[i], dtype=self.obs_dtype) for i in ended])
            if final.shape[1:] != self.obs_shape:
                raise ValueError(
                    f"final_obs entries must have shape {self.obs_shape}, got {final.shape[1:]}"
                )
        columns = env_ids[ended]
        slots = self.cursor[columns]
        self.frames[slots, columns] = self._frames_of(final)
        self.actions[slots, columns] = 0
        self.rewards[slots, columns] = 0.0
        self.terminated[slots, columns] = False
        self.truncated[slots, columns] = False
        self.episode_start[slots, columns] = False
        self.is_final[slots, columns] = True
        self._advance(columns, slots)

    def _advance(self, env_ids: np.ndarray, slots: np.ndarray) -> None:
        self.cursor[env_ids] = (slots + 1) % self.T
        self.filled[env_ids] = np.minimum(self.filled[env_ids] + 1, self.T)
        self._on_write(env_ids, slots)

    def _on_write(self, env_ids: np.ndarray, slots: np.ndarray) -> None:
        """Called after ``slots`` of columns ``env_ids`` were written (a hook for priorities)."""

    def _on_invalidate(self, env_ids: np.ndarray, slots: np.ndarray) -> None:
        """Called after ``slots`` of columns ``env_ids`` stopped being sampleable."""

    def end_episodes(self) -> None:
        """Close the episodes still open, before the envs are reset in the middle of them.

        The last observation stored in each open episode becomes that episode's final
        observation (its action is dropped), and the transition before it is marked truncated,
        so no n-step window or frame stack runs on into the next episode. The next :meth:`add`
        starts new episodes in every column.
        """
        open_columns = np.flatnonzero((self.filled > 0) & ~self.pending_start)
        if len(open_columns):
            last = (self.cursor[open_columns] - 1) % self.T
            continues = ~self.episode_start[last, open_columns]
            previous = (last[continues] - 1) % self.T
            self.truncated[previous, open_columns[continues]] = True
            self.is_final[last, open_columns] = True
            self.terminated[last, open_columns] = False
            self.truncated[last, open_columns] = False
            self._on_invalidate(open_columns, last)
        self.pending_start[:] = True

    def _validate_stacks(self, slots: np.ndarray, obs: np.ndarray, env_ids: np.ndarray) -> None:
        rebuilt = self._stack(slots, env_ids)
        if not np.array_equal(rebuilt, obs):
            raise ValueError(
                f"frame_stack={self.frame_stack}: the observations are not stacks of the last "
                f"{self.frame_stack} frames on axis 0 padded with the reset frame "
                "(FrameStackObservation(padding_type='reset')); use frame_stack=1 for this env"
            )

    # -- reading ----------------------------------------------------------------------------

    def _valid(self, slots: np.ndarray, env_ids: np.ndarray) -> np.ndarray:
        """Whether the transitions at ``(slots, env_ids)`` can be sampled now.

        A slot is valid when it is written and not a final observation, its n-step window has been
        written in full (``age >= n_step``), and, when frames are stacked, the frames it stacks
        have not been overwritten (``age <= filled - frame_stack``).
        """
        age = (self.cursor[env_ids] - 1 - slots) % self.T
        filled = self.filled[env_ids]
        return (
            (age >= self.n_step)
            & (age <= filled - self.frame_stack)
            & ~self.is_final[slots, env_ids]
        )

    def _valid_mask(self) -> np.ndarray:
        slots = np.arange(self.T)[:, None]
        env_ids = self._env_ids[None, :]
        return self._valid(slots, env_ids)

    def _stack(self, slots: np.ndarray, env_ids: np.ndarray) -> np.ndarray:
        if self.frame_stack == 1:
            return self.frames[slots, env_ids]
        out = np.empty((len(slots), self.frame_stack, *self.frame_shape), dtype=self.obs_dtype)
        source = np.asarray(slots).copy()
        out[:, -1] = self.frames[source, env_ids]
        for j in range(2, self.frame_stack + 1):
            # step back one frame unless the frame in hand starts its episode (then repeat it)
            source = np.where(self.episode_start[source, env_ids], source, (source - 1) % self.T)
            out[:, -j] = self.frames[source, env_ids]
        return out

    def get(self, indices: np.ndarray) -> ReplaySample:
        """The transitions at flat slot ``indices`` (``slot * num_envs + env``), n-step targets included.

        The caller is responsible for asking only for valid indices (those :meth:`sample` draws).
        """
        indices = np.asarray(indices, dtype=np.int64)
        slots, env_ids = np.divmod(indices, self.num_envs)
        batch = len(indices)
        returns = np.zeros(batch, dtype=np.float64)
        steps = np.zeros(batch, dtype=np.int64)
        alive = np.ones(batch, dtype=np.bool_)
        terminated = np.zeros(batch, dtype=np.bool_)
        for j in range(self.n_step):
            slot = (slots + j) % self.T
            returns += np.where(alive, self.gamma**j * self.rewards[slot, env_ids], 0.0)
            steps += alive
            term = self.terminated[slot, env_ids]
            terminated |= alive & term
            alive &= ~(term | self.truncated[slot, env_ids])
        next_slots = (slots + steps) % self.T
        discount = np.where(terminated, 0.0, self.gamma**steps)
        return ReplaySample(
            obs=self._stack(slots, env_ids),
            action=self.actions[slots, env_ids],
            reward=returns.astype(np.float32),
            next_obs=self._stack(next_slots, env_ids),
            discount=discount.astype(np.float32),
            indices=indices,
            weights=np.ones(batch, dtype=np.float32),
        )

    def _no_data_error(self) -> ValueError:
        return ValueError(
            f"the replay buffer holds no transition that can be sampled yet ({self.steps_added} "
            f"added; each needs {self.n_step} later steps and {self.frame_stack - 1} earlier "
            "frames stored)"
        )

    def sample(self, batch_size: int) -> ReplaySample:
        """Draw ``batch_size`` transitions uniformly (with replacement) among the valid ones.

        Raises:
            ValueError: no transition can be sampled yet.
        """
        B = self.num_envs
        high = int(self.filled.max()) * B
        if high == 0:
            raise self._no_data_error()
        chosen = np.empty(0, dtype=np.int64)
        # rejection sampling: invalid slots are a small fraction once the buffer has some data
        for _ in range(32):
            candidates = self.rng.integers(0, high, size=2 * batch_size + 16)
            slots, env_ids = np.divmod(candidates, B)
            chosen = np.concatenate([chosen, candidates[self._valid(slots, env_ids)]])
            if len(chosen) >= batch_size:
                return self.get(chosen[:batch_size])
        valid = np.flatnonzero(self._valid_mask().reshape(-1))
        if len(valid) == 0:
            raise self._no_data_error()
        return self.get(self.rng.choice(valid, size=batch_size))


def replay_buffer_kwargs(
    config: Any, observation_space: spaces.Space, num_envs: int
) -> dict[str, Any]:
    """The buffer arguments a DQN-family config asks for, for ``num_envs`` envs.

    ``frame_stack=0`` in the config detects the stack: ``F`` for uint8 ``[F, H, W]``
    observations (images stacked by the Atari set-up; ``F`` smaller than ``H`` and ``W``), else
    1 (colour images ``[H, W, C]`` among them). The capacity holds at least a few
    n-step windows per env, whatever ``buffer_size`` says.
    """
    frame_stack = config.frame_stack
    if frame_stack <= 0:
        space = observation_space
        image = isinstance(space, spaces.Box) and space.dtype == np.uint8
        stacked = image and len(space.shape) == 3 and space.shape[0] < min(space.shape[1:])
        frame_stack = int(space.shape[0]) if stacked else 1
    kwargs: dict[str, Any] = dict(
        capacity=max(config.buffer_size, num_envs * (config.n_step + frame_stack + 8)),
        num_envs=num_envs,
        n_step=config.n_step,
        gamma=config.gamma,
        frame_stack=frame_stack,
        seed=config.seed,
    )
    if config.prioritized:
        kwargs.update(alpha=config.priority_alpha, eps=config.priority_eps)
    return kwargs
