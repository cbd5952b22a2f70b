"""Asynchronous sampling and optimisation (``vecaccel train ALGO --async``), on one rank or several.

Two processes run at the same time:

- the **sampler** (a child process) steps the envs with the latest weights it has and hands the
  experience over: the DQN family writes every transition into a replay buffer, A2C and PPO
  write whole ``[T, B]`` rollouts into a double buffer;
- the **optimiser** (the calling process) trains on that experience.

Everything they share lives in shared memory: the replay buffer (``replay.py`` builds every array,
cursors and counters included, with an ``array_factory``; here it allocates torch shared tensors)
or the rollout slots, the weights the sampler acts with, and a few counters. A lock guards the
replay buffer (``add`` in the sampler, ``sample`` and ``update_priorities`` in the optimiser);
another guards the weights. The optimiser publishes its weights every
``async_weight_sync_period`` updates (a setting: rlpyt's users saw results change 3x with how
rarely weights were sent). The DQN sampler never waits for either lock in steady state: steps it
collects while the optimiser samples (holding the buffer's lock for the whole batch) are kept
and added with the next step that finds the lock free, and weights being published are picked up
at the next step instead of waited for. With automatic torch threads the optimiser leaves the
sampler's cores to it.

The replay ratio (``updates × batch / env steps`` after ``learning_starts``) is **enforced by
throttling** both sides, which rlpyt's async mode did not do (its issue #138: 1.43 measured for 8
set): the optimiser waits while it is ahead (no update is due yet), and the sampler waits while it
is more than ``async_max_lead`` env steps ahead of what the updates done so far allow. The measured
ratio, the fraction of time each side waited and the policy lag (updates the sampler's weights are
behind) are logged.

With ``fixed_lag=True`` either family repeats a seeded run exactly: the DQN sampler collects
chunks into a shared double buffer that the optimiser adds to the replay buffer itself, in order,
and A2C/PPO batches are collected with the weights of the update before, exactly (see
:func:`learn_async` and :func:`learn_async_on_policy`).

**Several ranks** (``--nproc K`` or ``torchrun``): every rank is one such pair, an optimiser with
its own sampler process, envs seeded by rank, and its own replay buffer or rollout double buffer.
The optimisers are data-parallel: the agent's model is wrapped in ``DistributedDataParallel``
(``distributed.py``: gloo on CPUs, NCCL with one GPU per rank), so each update's gradients are
averaged over ranks and the parameters stay identical. Every update is therefore a collective and
the ranks update in lockstep; each rank enforces the replay ratio on its own sampler, which makes
it the same ratio globally. Step budgets, ``learning_starts`` and the exploration schedule count
env steps over all ranks (each rank collects ``1/K`` of them). The ranks meet for their metrics
and to agree on a stop (SIGINT/SIGTERM) at points fixed by the update count (DQN: every few
updates, A2C/PPO: every update), so they always call the same collectives in the same order; rank
0 logs the reduced metrics and writes the checkpoints.

A sampler process that dies is reported at once: the optimiser checks it at every turn of its
loop and raises :class:`SamplerError` with the child's exit code and traceback (and rank), which
ends that rank; the other ranks then fail at their next collective (gloo sees the closed
connection; every collective also has a timeout) and ``torchrun`` stops the job. The sampler
exits when its optimiser's process goes away.

Example:
    >>> import torch; torch.set_num_threads(1)
    >>> from vecaccel.trainers.dqn import DQN
    >>> agent = make_async_agent(DQN, "CartPole-v1", learning_starts=64, batch_size=16,
    ...                          buffer_size=500, progress=False, tensorboard=False)
    >>> stats = learn_async(agent, "CartPole-v1", 400)
    >>> stats.env_steps, abs(stats.replay_ratio - agent.config.replay_ratio) < 0.5
    (400, True)
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import queue
import signal
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = [
    "AsyncStats",
    "SamplerError",
    "learn_async",
    "learn_async_on_policy",
    "make_async_agent",
    "make_async_on_policy_agent",
    "train_async_dqn",
    "train_async_on_policy",
]

# slots of the shared int64 counters
_STEPS, _UPDATES, _STOP, _VERSION, _SAMPLER_VERSION, _READY = range(6)
# slots of the on-policy shared counters: per slot i, _SLOT_STATE + i is 0 (free) or 1 (full),
# _SLOT_K + i the number of final observations, _SLOT_VERSION + i the weights that collected it
_SLOT_STATE, _SLOT_K, _SLOT_VERSION = 8, 10, 12
# set once the optimiser has the slots: they travel as file descriptors that the rollout
# process itself hands over, so it must not exit before (a run of two batches could)
_SLOTS_TAKEN = 14
# with a fixed lag: how many batches' weights the rollout process has pulled so far
_PULLS = 6
# with a fixed lag (DQN): how many chunks the optimiser has trained on and published after
_CHUNKS = 7
# the key that derives a sampler process's own seed (its torch sampling) from the run's seed
_CHILD_SEED_KEY = 0xA5
# slots of the shared float64 timers (seconds)
_SAMPLER_WAIT, _SAMPLER_BUSY = range(2)
# DQN ranks meet at least every this many updates (to agree on a stop and reduce metrics)
_MAX_UPDATES_BETWEEN_MEETINGS = 16


class SamplerError(RuntimeError):
    """The asynchronous sampler process died or raised.

    Attributes:
        exitcode: the process's exit code (negative: killed by that signal), if it has exited.
        remote_traceback: the traceback the sampler sent before dying, if any.
    """

    def __init__(self, message: str, exitcode: int | None, remote_traceback: str = "") -> None:
        super().__init__(message + (f"\n{remote_traceback}" if remote_traceback else ""))
        self.exitcode = exitcode
        self.remote_traceback = remote_traceback


@dataclass
class AsyncStats:
    """What an asynchronous run did, measured by the optimiser (of this rank).

    Attributes:
        env_steps: transitions collected, over all ranks.
        updates: gradient updates done (each one over all ranks' batches).
        replay_ratio: ``updates × batch / (env_steps - learning_starts)`` as measured.
        seconds: wall-clock of the run.
        sampling_rate: env steps per second over the run, over all ranks.
        update_rate: updates per second over the run.
        optimizer_wait_fraction: fraction of the run this rank's optimiser waited for data.
        sampler_wait_fraction: fraction of the run this rank's sampler waited for the optimiser.
        mean_policy_lag: mean number of updates the sampler's weights were behind.
    """

    env_steps: int
    updates: int
    replay_ratio: float
    seconds: float
    sampling_rate: float
    update_rate: float
    optimizer_wait_fraction: float
    sampler_wait_fraction: float
    mean_policy_lag: float

    @classmethod
    def measured(
        cls,
        env_steps: int,
        updates: int,
        replay_ratio: float,
        seconds: float,
        optimizer_wait: float,
        sampler_wait: float,
        lag_sum: float,
        lag_count: int,
    ) -> AsyncStats:
        """The stats of a run from its counters (waits and lags as sums, rates per second)."""
        return cls(
            env_steps=env_steps,
            updates=updates,
            replay_ratio=replay_ratio,
            seconds=seconds,
            sampling_rate=env_steps / seconds,
            update_rate=updates / seconds,
            optimizer_wait_fraction=optimizer_wait / seconds,
            sampler_wait_fraction=sampler_wait / seconds,
            mean_policy_lag=lag_sum / lag_count if lag_count else 0.0,
        )


# -- shared memory ---------------------------------------------------------------------------


def _torch_dtype(dtype: np.dtype) -> torch.dtype:
    return torch.from_numpy(np.zeros(0, dtype=dtype)).dtype


class _SharedFactory:
    """An ``array_factory`` that allocates torch shared-memory tensors and remembers them in order."""

    def __init__(self) -> None:
        self.tensors: list[torch.Tensor] = []

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        tensor = torch.zeros(tuple(shape), dtype=_torch_dtype(np.dtype(dtype))).share_memory_()
        self.tensors.append(tensor)
        return tensor.numpy()


class _ReplayFactory:
    """An ``array_factory`` handing out, in order, tensors another process allocated."""

    def __init__(self, tensors: list[torch.Tensor]) -> None:
        self.tensors = list(tensors)
        self.position = 0

    def __call__(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        tensor = self.tensors[self.position]
        self.position += 1
        array = tensor.numpy()
        if array.shape != tuple(shape) or array.dtype != np.dtype(dtype):
            raise RuntimeError(
                f"shared replay array {self.position - 1} is {array.shape} {array.dtype}, "
                f"expected {tuple(shape)} {np.dtype(dtype)}"
            )
        return array


class _GuardedLock:
    """A cross-process lock acquired in bounded waits, checking between them that the other
    process lives: a process killed while holding a lock never releases it."""

    def __init__(self, lock: Any, check: Callable[[], None] | None = None) -> None:
        self.lock = lock
        self.check = check

    def __enter__(self) -> None:
        while not self.lock.acquire(timeout=0.25):
            if self.check is not None:
                self.check()

    def __exit__(self, *exc_info: Any) -> None:
        self.lock.release()

    def try_acquire(self) -> bool:
        """Take the lock if it is free; never waits (release it with :meth:`release`)."""
        return bool(self.lock.acquire(block=False))

    def release(self) -> None:
        self.lock.release()


class _LockedBuffer:
    """The optimiser's view of the shared buffer: sampling and priority updates take the lock."""

    def __init__(self, buffer: Any, lock: Any, check: Callable[[], None]) -> None:
        self._buffer = buffer
        self._lock = _GuardedLock(lock, check)

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._buffer.sample(*args, **kwargs)

    def update_priorities(self, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            self._buffer.update_priorities(*args, **kwargs)

    @contextlib.contextmanager
    def held(self) -> Iterator[Any]:
        """The buffer itself, with the lock held (the sampler adds nothing meanwhile)."""
        with self._lock:
            yield self._buffer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._buffer, name)


def _buffer_spec(agent: Any, num_envs: int) -> dict[str, Any]:
    return {"prioritized": agent.config.prioritized, "kwargs": agent._buffer_kwargs(num_envs)}


def _build_buffer(
    spec: dict[str, Any], observation_space: Any, action_space: Any, factory: Any
) -> Any:
    from vecaccel.trainers.replay import PrioritizedReplayBuffer, ReplayBuffer

    cls = PrioritizedReplayBuffer if spec["prioritized"] else ReplayBuffer
    return cls(observation_space, action_space, array_factory=factory, **spec["kwargs"])


# -- the two ends of a sampler process -------------------------------------------------------


class _OptimiserGone(Exception):
    """Raised in a sampler process whose optimiser's process has exited."""


def _child_main(loop: Callable[[dict[str, Any]], None], spec: dict[str, Any]) -> None:
    """Entry point of a sampler process: run ``loop(spec)``, reporting what it raises."""
    try:
        loop(spec)
    except _OptimiserGone:
        return
    except BaseException as exc:  # report everything, KeyboardInterrupt included
        try:
            spec["errors"].put(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        except Exception:
            pass
        raise


class _ChildLink:
    """The sampler process's end: set-up, shared counters, liveness of the optimiser, waits and
    weight pulls.

    The counters and timers are NumPy views of the shared tensors (a scalar read or write costs
    far less than on the torch tensors).
    """

    def __init__(self, spec: dict[str, Any]) -> None:
        # the optimiser handles SIGINT and SIGTERM and stops this process through _STOP;
        # torchrun sends SIGTERM to each rank's whole process group, this process included
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        if spec["affinity"]:
            os.sched_setaffinity(0, spec["affinity"])
        torch.set_num_threads(int(spec["torch_threads"]))
        self.counters: np.ndarray = spec["counters"].numpy()
        self.timers: np.ndarray = spec["timers"].numpy()
        self.version = -1
        self._parent = spec["parent_pid"]
        self._poll = spec["poll_interval"]
        self._shared_weights: list[torch.Tensor] = spec["weights"]
        self._weights_lock = _GuardedLock(spec["weights_lock"], self.check_optimiser)

    def check_optimiser(self) -> None:
        """Raise :class:`_OptimiserGone` if the optimiser's process has exited (this process was
        re-parented), perhaps holding a lock."""
        if os.getppid() != self._parent:
            raise _OptimiserGone

    @property
    def stopped(self) -> bool:
        """Whether the optimiser asked this process to stop."""
        return bool(self.counters[_STOP])

    def wait_while(self, blocked: Callable[[], bool]) -> None:
        """Sleep while ``blocked()`` holds (and no stop is asked), counted as waiting time."""
        if not blocked():
            return
        started = time.perf_counter()
        while blocked() and not self.counters[_STOP]:
            self.check_optimiser()
            time.sleep(self._poll)
        self.timers[_SAMPLER_WAIT] += time.perf_counter() - started

    def pull_weights(self, params: Sequence[torch.Tensor], wait: bool = True) -> int:
        """Copy the published weights into ``params`` if they are newer; returns their version.

        With ``wait=False`` weights being published right now are left for the next call (the
        current ones are at most an update older) rather than waited for.
        """
        if int(self.counters[_VERSION]) == self.version:
            return self.version
        if wait:
            self._weights_lock.__enter__()
        elif not self._weights_lock.try_acquire():
            return self.version
        try:
            self.version = int(self.counters[_VERSION])
            for mine, shared in zip(params, self._shared_weights):
                mine.copy_(shared)
        finally:
            self._weights_lock.release()
        self.counters[_SAMPLER_VERSION] = self.version
        return self.version


class _SamplerHandle:
    """The optimiser's end of a sampler process: shared counters and weights, start, publish,
    liveness check, stop.

    Args:
        ctx: the multiprocessing context.
        role: ``sampler`` or ``rollout`` (in messages and the process's name).
        model: the module whose weights are published (its ``state_dict`` tensors share storage
            with the parameters, so the list taken here stays current).
        finished: given the process's exit code, whether its exit is the run's normal end.
    """

    def __init__(
        self, ctx: Any, role: str, model: torch.nn.Module, finished: Callable[[int | None], bool]
    ) -> None:
        self.role = role
        self.ctx = ctx
        self.shared_counters = torch.zeros(16, dtype=torch.int64).share_memory_()
        self.shared_timers = torch.zeros(4, dtype=torch.float64).share_memory_()
        self.counters: np.ndarray = self.shared_counters.numpy()
        self.timers: np.ndarray = self.shared_timers.numpy()
        self._state = list(model.state_dict().values())
        self._shared_weights = [t.detach().cpu().clone().share_memory_() for t in self._state]
        self.weights_lock = ctx.Lock()
        self._weights_lock = _GuardedLock(self.weights_lock, self.check)
        self.errors = ctx.Queue()
        self.process: Any = None
        self._finished = finished

    def spec(self, poll_interval: float, threads: int, affinity: set[int] | None) -> dict[str, Any]:
        """The entries of the process's spec that :class:`_ChildLink` reads."""
        return dict(
            counters=self.shared_counters,
            timers=self.shared_timers,
            weights=self._shared_weights,
            weights_lock=self.weights_lock,
            errors=self.errors,
            parent_pid=os.getpid(),
            poll_interval=poll_interval,
            torch_threads=threads,
            affinity=set(affinity) if affinity else None,
        )

    def publish(self, version: int) -> None:
        """Copy the model's weights to shared memory as ``version``."""
        with self._weights_lock:
            for shared, tensor in zip(self._shared_weights, self._state):
                shared.copy_(tensor)
            self.counters[_VERSION] = version

    def start(self, loop: Callable[[dict[str, Any]], None], spec: dict[str, Any]) -> None:
        self.process = self.ctx.Process(
            target=_child_main, args=(loop, spec), name=f"vecaccel-async-{self.role}"
        )
        self.process.start()

    def check(self) -> None:
        """Raise :class:`SamplerError` if the process died before the run's normal end."""
        process = self.process
        if process is None or process.is_alive():
            return
        process.join(timeout=1.0)
        if self.counters[_STOP] or self._finished(process.exitcode):
            return
        remote = ""
        try:
            remote = self.errors.get(timeout=0.2)
        except (queue.Empty, OSError, EOFError):
            pass
        from vecaccel.trainers import distributed

        where = f" of rank {distributed.rank()}" if distributed.is_distributed() else ""
        raise SamplerError(
            f"the asynchronous {self.role} process{where} (pid {process.pid}) died with exit "
            f"code {process.exitcode} after {int(self.counters[_STEPS])} env steps",
            process.exitcode,
            remote,
        )

    def finish(self, drain: Callable[[], None], timeout: float = 10.0) -> None:
        """Wait for the process to end by itself (its budget done), calling ``drain`` meanwhile.

        What it queued last is certain to have arrived only once it has exited: a queue's feeder
        thread sends it, and the process joins that thread on exit, which needs the pipe read.
        """
        process = self.process
        deadline = time.monotonic() + timeout
        while process is not None and process.is_alive() and time.monotonic() < deadline:
            drain()
            process.join(0.02)
        drain()

    def stop(self, *channels: Any) -> None:
        """Ask the process to stop, wait for it (killing it if it does not), close ``channels``."""
        self.counters[_STOP] = 1
        process = self.process
        if process is not None:
            process.join(timeout=10.0)
            if process.is_alive():  # it ignores SIGTERM: end it with SIGKILL
                process.kill()
                process.join(timeout=5.0)
        for channel in (self.errors, *channels):
            channel.close()
            channel.cancel_join_thread()


def _drain(channel: Any) -> list[Any]:
    """Everything waiting in the queue ``channel``, without blocking."""
    items = []
    while True:
        try:
            items.append(channel.get_nowait())
        except queue.Empty:
            return items


def _leave_cores_to_sampler(cfg: Any, sampler_threads: int) -> None:
    """With automatic torch threads (``torch_threads=0``), leave the sampler process (and its
    env workers) their cores: torch's default of one thread per core would make the optimiser's
    OpenMP threads spin on them. Ranks on one machine share its cores."""
    if getattr(cfg, "torch_threads", 0) > 0:
        return
    from vecaccel.worker import usable_cpus

    cpus = usable_cpus() // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    workers = 0
    if cfg.backend != "serial":
        workers = getattr(cfg, "num_workers", 0) or min(cfg.num_envs, cpus)
    torch.set_num_threads(max(1, cpus - sampler_threads - workers))


def _poll_until(ready: Callable[[], bool], check: Callable[[], None], interval: float) -> float:
    """Poll every ``interval`` seconds until ``ready()``, calling ``check()`` (which raises if the
    other side died or a stop was asked) in between; the seconds waited (the optimiser's wait)."""
    waited = time.perf_counter()
    while not ready():
        check()
        time.sleep(interval)
    return time.perf_counter() - waited


def _stop_requested(guard: Any, world: int) -> bool:
    """Whether to stop now outside a meeting of the ranks: on one rank at once, on several only
    where the ranks agree (a rank cannot leave while the others wait for it)."""
    return world == 1 and guard.requested


def _reduce(
    metrics: dict[str, float | None],
    episodes: int,
    stop: bool,
    sums: Sequence[str],
    device: Any,
) -> tuple[dict[str, float | None], bool]:
    """Reduce one meeting's metrics over the ranks (identity on one rank) and agree on a stop.

    Episodic returns and lengths are weighted by the episodes behind them; ``sums`` are summed.
    """
    from vecaccel.trainers import distributed

    world = distributed.world_size()
    if world == 1:
        return metrics, stop
    metrics = {**metrics, "charts/episodes": float(episodes), "_stop": 1.0 if stop else 0.0}
    reduced = distributed.reduce_metrics(
        metrics,
        weights={"charts/episodic_return": episodes, "charts/episodic_length": episodes},
        sums=("charts/episodes", "_stop", *sums),
        device=device,
    )
    stop = bool(reduced.pop("_stop") or 0.0)
    reduced["charts/world_size"] = float(world)
    return reduced, stop


# -- DQN: the sampler process ----------------------------------------------------------------

# vector steps the sampler may hold back while the optimiser holds the replay buffer's lock
_MAX_PENDING_STEPS = 32


class _Actor:
    """The DQN sampler's envs: ε-greedy steps with the weights last pulled, episodes counted."""

    def __init__(self, spec: dict[str, Any], link: _ChildLink) -> None:
        from vecaccel.trainers.common import (
            action_start,
            make_env_for_training,
            seed_everything,
            split_seed,
        )

        # its own draws (e.g. noisy nets' noise), new ones for a resumed run
        seed_everything(
            split_seed(int(spec["env_seed"]), _CHILD_SEED_KEY, spec["updates_at_start"])
        )
        self.link = link
        self.network: torch.nn.Module = spec["network"]
        self.support: torch.Tensor | None = spec["support"]
        self.params = list(self.network.state_dict().values())
        cfg = spec["config"]
        self.epsilon = (cfg["start_epsilon"], cfg["end_epsilon"], spec["exploration_steps"])
        self.envs = make_env_for_training(
            spec["env_id"],
            spec["num_envs"],
            backend=cfg["backend"],
            seed=cfg["seed"],
            autoreset_mode="SameStep",
        )
        self.num_envs = self.envs.num_envs
        self.rng = np.random.default_rng(spec["env_seed"] + 1)
        self.num_actions = int(spec["action_space"].n)
        # a Discrete(n, start) env acts in start..start+n-1, the network's outputs are 0..n-1:
        # the env and the replay buffer get the env's actions (as in DQN._act), and
        # DQN.train_step moves them back before indexing the Q-values
        self.action_start = action_start(spec["action_space"])
        self.obs, _ = self.envs.reset(seed=spec["env_seed"])
        self.episode_return = np.zeros(self.num_envs)
        self.episode_length = np.zeros(self.num_envs, dtype=np.int64)

    def step(self, steps: int) -> tuple[tuple[Any, ...], list[tuple[float, int]]]:
        """One ε-greedy step of every env, ``steps`` env steps into the run: the transition
        ``(obs, actions, reward, terminated, truncated, final_obs)`` and the episodes it ended."""
        from vecaccel.trainers.dqn import linear_schedule

        num_envs = self.num_envs
        epsilon = linear_schedule(*self.epsilon, steps)
        explore = self.rng.random(num_envs) < epsilon
        actions = self.rng.integers(0, self.num_actions, size=num_envs)
        obs = self.obs
        if not explore.all():
            with torch.no_grad():
                out = self.network(torch.as_tensor(obs))
                support = self.support
                q = out if support is None else (torch.softmax(out, -1) * support).sum(-1)
            actions = np.where(explore, actions, q.argmax(dim=1).numpy())
        actions = actions + self.action_start
        next_obs, reward, terminated, truncated, infos = self.envs.step(actions)
        transition = (obs, actions, reward, terminated, truncated, infos.get("final_obs"))
        self.obs = next_obs
        done = terminated | truncated
        self.episode_return += reward
        self.episode_length += 1
        finished: list[tuple[float, int]] = []
        if done.any():
            final_info = infos.get("final_info", {})
            stats = final_info.get("episode") if isinstance(final_info, dict) else None
            for i in np.flatnonzero(done):
                if stats is not None:
                    finished.append((float(stats["r"][i]), int(stats["l"][i])))
                else:
                    finished.append((float(self.episode_return[i]), int(self.episode_length[i])))
            self.episode_return[done] = 0.0
            self.episode_length[done] = 0
        return transition, finished

    def close(self) -> None:
        self.envs.close()


def _sampler_loop(spec: dict[str, Any]) -> None:
    """The DQN sampler: ε-greedy steps with the latest weights into the shared replay buffer."""
    link = _ChildLink(spec)
    counters, timers = link.counters, link.timers
    buffer = _build_buffer(
        spec["buffer"],
        spec["observation_space"],
        spec["action_space"],
        _ReplayFactory(spec["buffer_tensors"]),
    )
    buffer_lock = _GuardedLock(spec["buffer_lock"], link.check_optimiser)
    episodes = spec["episodes"]
    cfg = spec["config"]
    total, learn_from, lead = spec["total_steps"], spec["learn_from"], spec["lead"]
    updates_at_start = spec["updates_at_start"]
    steps_per_update = cfg["batch_size"] / cfg["replay_ratio"]

    actor = _Actor(spec, link)
    try:
        num_envs = actor.num_envs
        steps = 0
        # steps collected while the optimiser samples (holding the buffer's lock) wait here
        # instead of stalling the envs, and go in with the next step that finds the lock free
        pending: list[tuple[Any, ...]] = []

        def add(transition: tuple[Any, ...]) -> None:
            if len(pending) >= _MAX_PENDING_STEPS:
                buffer_lock.__enter__()
            elif not buffer_lock.try_acquire():
                # the envs may reuse their arrays at the next step: keep copies
                pending.append(tuple(None if x is None else np.array(x) for x in transition))
                return
            try:
                for waiting in pending:
                    buffer.add(*waiting)
                buffer.add(*transition)
            finally:
                buffer_lock.release()
            pending.clear()

        def too_far_ahead() -> bool:  # the throttle: stay within `lead` steps of the updates
            updates = int(counters[_UPDATES]) - updates_at_start
            allowed = learn_from + updates * steps_per_update + lead
            return steps + num_envs > allowed

        counters[_READY] = 1
        start = time.perf_counter()
        while not link.stopped:
            steps = int(counters[_STEPS])
            if steps >= total:
                break
            if steps >= learn_from:
                link.wait_while(too_far_ahead)
            link.pull_weights(actor.params, wait=False)
            transition, finished = actor.step(steps)
            add(transition)
            counters[_STEPS] += num_envs
            if finished:
                episodes.put((steps + num_envs, finished))
            link.check_optimiser()
        if pending:
            with buffer_lock:
                for waiting in pending:
                    buffer.add(*waiting)
        timers[_SAMPLER_BUSY] = time.perf_counter() - start
    finally:
        actor.close()


def _chunk_slots(
    observation_space: Any, num_envs: int, chunk_steps: int
) -> list[dict[str, torch.Tensor]]:
    """The two shared slots of a fixed-lag DQN run, ``chunk_steps`` vector steps each."""
    obs_dtype = _torch_dtype(np.dtype(observation_space.dtype))
    shape = (chunk_steps, num_envs)

    def slot() -> dict[str, torch.Tensor]:
        tensors = {
            "obs": torch.zeros((*shape, *observation_space.shape), dtype=obs_dtype),
            "final_obs": torch.zeros((*shape, *observation_space.shape), dtype=obs_dtype),
            "actions": torch.zeros(shape, dtype=torch.int64),
            "rewards": torch.zeros(shape, dtype=torch.float64),
            "terminated": torch.zeros(shape, dtype=torch.bool),
            "truncated": torch.zeros(shape, dtype=torch.bool),
        }
        return {key: value.share_memory_() for key, value in tensors.items()}

    return [slot(), slot()]


def _chunk_sampler_loop(spec: dict[str, Any]) -> None:
    """The DQN sampler with a fixed lag: chunk ``n`` into slot ``n % 2`` with the weights
    published once the optimiser has trained on chunk ``n - 2``; the optimiser adds the chunks
    to the replay buffer itself, in order, so the run repeats exactly."""
    link = _ChildLink(spec)
    counters, timers = link.counters, link.timers
    slots = [{key: value.numpy() for key, value in slot.items()} for slot in spec["slots"]]
    episodes = spec["episodes"]
    steps = spec["start_steps"]
    actor = _Actor(spec, link)
    try:
        counters[_READY] = 1
        start = time.perf_counter()
        chunk_steps, vector_steps = spec["chunk_steps"], spec["vector_steps"]
        for n in range(math.ceil(vector_steps / chunk_steps)):
            length = min(chunk_steps, vector_steps - n * chunk_steps)
            # the weights after chunk n - 2: waited for, and the optimiser publishes no newer
            # ones before they are pulled
            wanted = max(0, n - 1)
            link.wait_while(lambda wanted=wanted: int(counters[_CHUNKS]) < wanted)
            full = _SLOT_STATE + n % 2
            link.wait_while(lambda full=full: bool(counters[full]))
            if link.stopped:
                break
            version = link.pull_weights(actor.params)
            counters[_PULLS] = n + 1
            slot = slots[n % 2]
            ended: list[tuple[float, int]] = []
            for t in range(length):
                transition, finished = actor.step(steps)
                obs, actions, reward, terminated, truncated, final_obs = transition
                slot["obs"][t] = obs
                slot["actions"][t] = actions
                slot["rewards"][t] = reward
                slot["terminated"][t] = terminated
                slot["truncated"][t] = truncated
                for i in np.flatnonzero(terminated | truncated):
                    if final_obs is not None and final_obs[i] is not None:
                        slot["final_obs"][t, i] = final_obs[i]
                steps += actor.num_envs
                ended.extend(finished)
                link.check_optimiser()
            episodes.put(ended)  # before the slot is marked full: one item per chunk
            counters[_SLOT_VERSION + n % 2] = version
            counters[_SLOT_K + n % 2] = length
            counters[full] = 1
            counters[_STEPS] = steps
        timers[_SAMPLER_BUSY] = time.perf_counter() - start
    finally:
        actor.close()


# -- DQN: the optimiser ----------------------------------------------------------------------


def make_async_agent(cls: type, env_id: str, **config: Any) -> Any:
    """A DQN-family agent with networks built for ``env_id`` but no envs (the sampler has them).

    Under ``torchrun`` the agent joins the process group (its model is then data-parallel).
    """
    from vecaccel.trainers.common import make_env_fn

    agent = cls(env=None, **config)
    env = make_env_fn(env_id)()
    try:
        agent.observation_space = env.observation_space
        agent.action_space = env.action_space
    finally:
        env.close()
    agent.env_id = env_id
    agent._build_networks()
    return agent


def learn_async(
    agent: Any,
    env_id: str,
    total_steps: int,
    *,
    reset_num_timesteps: bool = True,
    fixed_lag: bool = False,
    context: str = "spawn",
    poll_interval: float = 0.0005,
    sampler_threads: int = 1,
    sampler_affinity: set[int] | None = None,
) -> AsyncStats:
    """Train ``agent`` (a DQN-family agent) asynchronously for ``total_steps`` env steps.

    By default the sampler adds each step to the shared replay buffer as it goes, acting with
    the newest weights, and the replay ratio is enforced by throttling: which updates sample
    which transitions, and which weights act, depend on how the two processes are scheduled,
    so two runs with the same seed differ. With ``fixed_lag=True`` the sampler collects chunks
    of ``async_max_lead / 2`` env steps (rounded up to whole vector steps) into a shared double
    buffer; the optimiser adds each chunk to the replay buffer itself, makes the updates then
    due, and chunk ``n`` is acted on with the weights published after chunk ``n - 2``'s
    updates, exactly. Sampling and training still overlap (chunk ``n + 1`` is collected while
    chunk ``n`` is trained on) and a seeded run repeats exactly; weights are published once a
    chunk (``async_weight_sync_period`` does not apply).

    Under a process group (``torchrun``) every rank calls this: each runs its own sampler
    process and replay buffer, collects ``1/K`` of ``total_steps``, and its updates are
    data-parallel with the other ranks' (see the module docstring).

    Checkpoints (``run_dir``: every ``checkpoint_period`` updates, and when training ends or is
    stopped) hold the replay buffer with ``checkpoint_replay``, as synchronous ones do. An agent
    loaded from one (``DQN.load(path)``) continues its run with ``reset_num_timesteps=False``:
    counters, schedules and the replay buffer go on from the checkpoint, and the envs start
    new episodes (env state cannot be saved, so the run does not repeat bit for bit).

    Args:
        agent: from :func:`make_async_agent` (or any DQN with built networks), or loaded from
            a checkpoint; its ``config.num_envs`` envs of ``config.backend`` run in the
            sampler process.
        env_id: the Gymnasium id the sampler builds.
        total_steps: env steps to collect in this call (over all ranks).
        reset_num_timesteps: start the step and update counts (and so the ε and β schedules
            and ``learning_starts``) from zero, as SB3 does; ``False`` continues them.
        fixed_lag: chunks with a fixed policy lag instead of throttling (reproducible runs).
        context: multiprocessing start method of the sampler process.
        poll_interval: seconds between checks while one side waits for the other.
        sampler_threads: torch threads of the sampler process.
        sampler_affinity: CPUs to pin the sampler process to (``None``: those of this process).

    Returns:
        The measured :class:`AsyncStats` (also logged to ``run_dir``).

    Raises:
        SamplerError: the sampler process died or raised.
        TrainingInterrupted: SIGINT or SIGTERM arrived (a checkpoint was written first).
    """
    import torch.multiprocessing as mp

    from vecaccel.trainers.common import RunLogger, SignalCheckpoint, TrainingInterrupted

    cfg = agent.config
    world = int(getattr(agent, "world_size", 1))
    _leave_cores_to_sampler(cfg, sampler_threads)
    num_envs = cfg.num_envs
    if reset_num_timesteps:
        agent.global_step, agent.num_updates = 0, 0
    start_global, updates_at_start = int(agent.global_step), int(agent.num_updates)
    horizon = start_global + int(total_steps)
    # budgets count env steps over all ranks; each rank collects its share
    local_start = start_global // world
    local_total = math.ceil(horizon / world)
    ctx = mp.get_context(context)
    factory = _SharedFactory()
    buffer_spec = _buffer_spec(agent, num_envs)
    buffer = _build_buffer(buffer_spec, agent.observation_space, agent.action_space, factory)
    restored = agent._pending_replay is not None
    if restored:  # the replay buffer of the checkpoint the agent was loaded from
        agent._read_replay_into(buffer, *agent._pending_replay)
        agent._pending_replay = None
    buffer.end_episodes()  # the sampler's envs start new episodes
    buffer_lock = ctx.Lock()
    # updates start once the buffer holds learning_starts steps (and enough to sample)
    warmup = math.ceil(cfg.learning_starts / world) if reset_num_timesteps or not restored else 0
    learn_from = local_start + max(warmup, num_envs * (cfg.n_step + buffer.frame_stack + 1))
    steps_per_update = cfg.batch_size / cfg.replay_ratio
    lead = cfg.async_max_lead or max(num_envs, int(math.ceil(16 * steps_per_update)))
    # fixed lag: chunks of half the lead (whole vector steps), the last one cut to the budget
    chunk_steps = max(1, math.ceil(lead / 2 / num_envs))
    vector_steps = max(0, math.ceil((local_total - local_start) / num_envs))
    # the target network follows every target_update_period env steps' worth of updates:
    # counted in updates, it moves at the same update on every rank
    updates_per_step = cfg.replay_ratio / (cfg.batch_size * world)
    target_every = max(1, round(cfg.target_update_period * updates_per_step))
    meet_every = max(
        1, min(_MAX_UPDATES_BETWEEN_MEETINGS, math.ceil(cfg.log_interval * updates_per_step))
    )
    exploration = cfg.exploration_steps or int(cfg.exploration_fraction * horizon)

    def sampler_finished(exitcode: int | None) -> bool:
        return exitcode == 0 and int(sampler.counters[_STEPS]) >= local_total

    sampler = _SamplerHandle(ctx, "sampler", agent.q_network, sampler_finished)
    counters, timers = sampler.counters, sampler.timers
    agent.buffer = _LockedBuffer(buffer, buffer_lock, sampler.check)
    episodes = ctx.Queue()
    spec = dict(
        sampler.spec(poll_interval, sampler_threads, sampler_affinity),
        env_id=env_id,
        num_envs=num_envs,
        config={
            key: getattr(cfg, key)
            for key in (
                "backend",
                "seed",
                "batch_size",
                "replay_ratio",
                "start_epsilon",
                "end_epsilon",
            )
        },
        # a continued run restarts its envs at a seed of its own, not the first episodes again
        env_seed=cfg.seed if start_global == 0 else agent._restart_seed(),
        network=copy.deepcopy(agent.q_network).cpu(),
        support=None if agent.support is None else agent.support.cpu(),
        buffer=buffer_spec,
        buffer_tensors=factory.tensors,
        observation_space=agent.observation_space,
        action_space=agent.action_space,
        buffer_lock=buffer_lock,
        episodes=episodes,
        total_steps=local_total,
        learn_from=learn_from,
        updates_at_start=updates_at_start,
        lead=lead,
        exploration_steps=math.ceil(exploration / world),
        start_steps=local_start,
        chunk_steps=chunk_steps,
        vector_steps=vector_steps,
        slots=_chunk_slots(agent.observation_space, num_envs, chunk_steps) if fixed_lag else None,
    )
    main = agent.is_main
    # before the sampler starts: a run directory that cannot be made (or any other error of the
    # logger) must not leave a sampler process running outside the try/finally that stops it
    logger = RunLogger(
        cfg.run_dir if main else None,  # rank 0 alone logs and checkpoints
        horizon,
        use_tensorboard=cfg.tensorboard and main,
        progress=cfg.progress and main,
        resume_step=None if reset_num_timesteps else start_global,
    )
    agent.logger = logger
    counters[_STEPS] = local_start
    counters[_UPDATES] = updates_at_start
    sampler.publish(updates_at_start)
    sampler.start(_chunk_sampler_loop if fixed_lag else _sampler_loop, spec)
    # recorded in checkpoints: `vecaccel train --resume` goes on async, with the same options
    agent.async_run = True
    agent.async_options = {"fixed_lag": bool(fixed_lag)}

    def write_checkpoint() -> None:  # with the buffer's lock held
        locked, agent.buffer = agent.buffer, buffer
        try:
            agent._checkpoint(replay=cfg.checkpoint_replay)
        finally:
            agent.buffer = locked

    def checkpoint() -> None:
        with agent.buffer.held():  # the buffer as it is between two of the sampler's adds
            write_checkpoint()

    guard = SignalCheckpoint()
    start = time.perf_counter()
    optimizer_wait = 0.0
    lag_sum, lag_count = 0.0, 0
    recent_losses: list[dict[str, float]] = []
    finished: list[tuple[float, int]] = []
    next_log = (start_global // cfg.log_interval + 1) * cfg.log_interval
    steps = local_start
    complete = False
    next_drain = 0.0
    end: float | None = None
    every_rank_here = False

    def due_at(steps: int) -> int:
        """The update count due once ``steps`` env steps (of this rank) were collected."""
        if steps <= learn_from:
            return updates_at_start
        return updates_at_start + int(cfg.replay_ratio * (steps - learn_from) // cfg.batch_size)

    def update_once(steps: int, behaviour: int | None) -> None:
        """One update (a collective on K ranks); ``behaviour``: the weights that collected the
        chunk (fixed lag), else the sampler's current ones (and they are published here)."""
        nonlocal lag_sum, lag_count
        _, batch = agent.sample_batch(steps / local_total)
        recent_losses.append(agent.train_step(batch))
        agent.num_updates += 1
        counters[_UPDATES] = agent.num_updates
        if behaviour is None:
            if agent.num_updates % cfg.async_weight_sync_period == 0:
                sampler.publish(agent.num_updates)
            behaviour = int(counters[_SAMPLER_VERSION])
        lag_sum += agent.num_updates - behaviour
        lag_count += 1
        if agent.num_updates % target_every == 0:
            agent._update_target()
        if cfg.checkpoint_period and agent.num_updates % cfg.checkpoint_period == 0:
            if cfg.run_dir is not None:
                checkpoint()

    def check() -> None:
        sampler.check()
        if _stop_requested(guard, world):
            raise TrainingInterrupted(guard.signal_name, agent.global_step)

    def wait_until(ready: Callable[[], bool]) -> None:
        nonlocal optimizer_wait
        optimizer_wait += _poll_until(ready, check, poll_interval)

    def chunk_episodes() -> list[tuple[float, int]]:
        """The episodes the chunk just taken ended (sent before its slot was marked full)."""
        while True:
            try:
                return episodes.get(timeout=0.2)
            except queue.Empty:
                sampler.check()

    def drain_episodes() -> None:
        for _, ended in _drain(episodes):
            finished.extend(ended)
            agent.episode_log.extend((steps * world, r, n) for r, n in ended)

    def meet() -> bool:
        """Log (rank 0) the metrics reduced over ranks if a row is due; whether to stop."""
        nonlocal next_log, finished, recent_losses
        elapsed = max(time.perf_counter() - start, 1e-9)
        metrics: dict[str, float | None] = {
            "charts/SPS": (steps - local_start) / elapsed,
            "charts/UPS": (agent.num_updates - updates_at_start) / elapsed,
            "charts/updates": agent.num_updates,
            "charts/replay_ratio_setting": cfg.replay_ratio,
            "charts/learning_rate": agent.learning_rate,
            "charts/lr_scale": agent.lr_scale,
            "charts/optimizer_wait_fraction": optimizer_wait / elapsed,
            "charts/sampler_wait_fraction": float(timers[_SAMPLER_WAIT]) / elapsed,
            "charts/policy_lag": lag_sum / lag_count if lag_count else None,
            "charts/episodic_return": float(np.mean([r for r, _ in finished]))
            if finished
            else None,
            "charts/episodic_length": float(np.mean([n for _, n in finished]))
            if finished
            else None,
            "_steps": steps,
            "_learned": max(0, steps - learn_from),
        }
        for key in recent_losses[0] if recent_losses else ():
            metrics[key] = float(np.mean([m[key] for m in recent_losses]))
        metrics, stop = _reduce(
            metrics,
            len(finished),
            guard.requested,
            ("charts/SPS", "_steps", "_learned"),
            agent.device,
        )
        global_steps, learned = int(metrics.pop("_steps") or 0), metrics.pop("_learned") or 0
        if global_steps >= next_log or complete:
            next_log = (global_steps // cfg.log_interval + 1) * cfg.log_interval
            metrics["charts/replay_ratio"] = (
                (agent.num_updates - updates_at_start) * cfg.batch_size * world / learned
                if learned > 0
                else None
            )
            if finished and world == 1:
                metrics["charts/episodes"] = len(finished)
            logger.log(global_steps, metrics)
            finished, recent_losses = [], []
        return stop

    try:
        with guard:
            while not counters[_READY]:  # rates are timed from the sampler's first step
                sampler.check()
                time.sleep(poll_interval)
                if _stop_requested(guard, world):
                    raise TrainingInterrupted(guard.signal_name, 0)
            start = time.perf_counter()
            if fixed_lag:
                num_chunks = math.ceil(vector_steps / chunk_steps)
                views = [
                    {key: value.numpy() for key, value in slot.items()} for slot in spec["slots"]
                ]
                for m in range(num_chunks):
                    full = _SLOT_STATE + m % 2
                    wait_until(lambda full=full: bool(counters[full]))
                    shared, length = views[m % 2], int(counters[_SLOT_K + m % 2])
                    behaviour = int(counters[_SLOT_VERSION + m % 2])
                    with agent.buffer.held() as held:  # in order: the run repeats exactly
                        for t in range(length):
                            held.add(
                                shared["obs"][t],
                                shared["actions"][t],
                                shared["rewards"][t],
                                shared["terminated"][t],
                                shared["truncated"][t],
                                shared["final_obs"][t],
                            )
                    counters[full] = 0  # the slot may be refilled now
                    steps += length * num_envs
                    agent.global_step = steps * world
                    ended = chunk_episodes()
                    finished.extend(ended)
                    agent.episode_log.extend((steps * world, r, n) for r, n in ended)
                    while agent.num_updates < due_at(steps):
                        update_once(steps, behaviour)
                    # not before chunk m + 1 has taken the weights after chunk m - 1
                    wait_until(lambda m=m: counters[_PULLS] >= min(m + 2, num_chunks))
                    sampler.publish(agent.num_updates)
                    counters[_CHUNKS] = m + 1
                    complete = m == num_chunks - 1
                    # every rank meets after every chunk, at the same update count
                    meeting = complete or world > 1 or guard.requested or steps >= next_log
                    if meeting and meet() and not complete:
                        raise TrainingInterrupted(guard.signal_name or "SIGTERM", agent.global_step)
            while not fixed_lag:
                sampler.check()
                steps = int(counters[_STEPS])
                agent.global_step = steps * world
                updated = False
                if agent.num_updates < due_at(steps):
                    update_once(steps, None)
                    updated = True
                elif steps >= local_total:
                    complete = True
                    # the episodes of the last steps may still be on their way: the sampler
                    # counts a step before its queue's feeder thread has sent them
                    sampler.finish(drain_episodes)
                else:
                    waited = time.perf_counter()
                    time.sleep(poll_interval)
                    optimizer_wait += time.perf_counter() - waited
                now = time.perf_counter()
                if world == 1:
                    meeting = complete or guard.requested or steps >= next_log
                else:  # at the same update on every rank, so the collectives pair up
                    meeting = complete or (updated and agent.num_updates % meet_every == 0)
                if now >= next_drain or meeting:
                    next_drain = now + 0.02  # polling the queue's pipe costs ~0.2 ms a time
                    drain_episodes()
                if meeting and meet() and not complete:
                    raise TrainingInterrupted(guard.signal_name or "SIGTERM", agent.global_step)
                if complete:
                    break
        end = time.perf_counter()  # the run's rates exclude stopping the sampler process
        every_rank_here = True
        agent._measured_replay_ratio = (
            (agent.num_updates - updates_at_start) * cfg.batch_size / max(1, steps - learn_from)
        )
    except TrainingInterrupted:
        every_rank_here = True  # the ranks agreed on the stop
        if cfg.run_dir is not None and main:
            logger.write(
                f"{guard.signal_name or 'SIGTERM'}: checkpoint saved to "
                f"{Path(cfg.run_dir) / 'checkpoint.pt'} at step {agent.global_step}"
            )
        raise
    finally:
        if end is None:
            end = time.perf_counter()
        sampler.stop(episodes)
        elapsed = max(end - start, 1e-9)
        # on several ranks the checkpoint is a collective (each rank writes its replay buffer):
        # after an error the other ranks may never come, and the last checkpoint stays; so it
        # does after an error before any step (a sampler that could not start)
        progressed = agent.global_step > start_global
        if cfg.run_dir is not None and (every_rank_here or (world == 1 and progressed)):
            _final_checkpoint(buffer_lock, write_checkpoint, world, agent.device, logger)
        logger.close()
    return AsyncStats.measured(
        env_steps=agent.global_step - start_global,
        updates=agent.num_updates - updates_at_start,
        replay_ratio=agent._measured_replay_ratio,
        seconds=elapsed,
        optimizer_wait=optimizer_wait,
        sampler_wait=float(timers[_SAMPLER_WAIT]),
        lag_sum=lag_sum,
        lag_count=lag_count,
    )


def _final_checkpoint(
    lock: Any, write: Callable[[], None], world: int, device: Any, logger: Any
) -> None:
    """Write the checkpoint at the end of an async run, the sampler stopped.

    A lock the sampler still holds means that it died in the middle of an add and left the
    buffer torn (on any rank): then nothing is written and the last checkpoint stays the
    restart point.
    """
    from vecaccel.trainers import distributed

    held = bool(lock.acquire(block=False))
    try:
        torn = distributed.all_reduce_any(not held, device=device) if world > 1 else not held
        if not torn:
            write()
        else:
            logger.write(
                "the sampler stopped in the middle of a replay buffer write: no checkpoint "
                "written now, the last one is kept"
            )
    finally:
        if held:
            lock.release()


def train_async_dqn(
    cls: type,
    env_id: str,
    total_steps: int,
    run_dir: str | None = None,
    progress: bool = True,
    tensorboard: bool = True,
    fixed_lag: bool = False,
    **config: Any,
) -> int:
    """``vecaccel train dqn|c51|rainbow --async``: build the agent, train, report; the exit code."""
    agent = make_async_agent(
        cls, env_id, run_dir=run_dir, progress=progress, tensorboard=tensorboard, **config
    )
    _report(agent, learn_async(agent, env_id, total_steps, fixed_lag=fixed_lag))
    return 0


def _report(agent: Any, stats: AsyncStats) -> None:
    """The line ``vecaccel train --async`` ends with (on rank 0)."""
    import sys

    if not getattr(agent, "is_main", True):
        return
    world = int(getattr(agent, "world_size", 1))
    ranks = f" on {world} ranks" if world > 1 else ""
    rates = f"{stats.env_steps} env steps ({stats.sampling_rate:.0f}/s), {stats.updates} updates"
    if hasattr(agent, "num_updates"):  # the DQN family
        rates += (
            f" ({stats.update_rate:.1f}/s), replay ratio {stats.replay_ratio:.2f} "
            f"(setting {agent.config.replay_ratio}),"
        )
    else:
        rates += ", mean"
    print(
        f"async {type(agent).__name__}{ranks}: {rates} policy lag "
        f"{stats.mean_policy_lag:.2f} updates; run directory: {_run_dir_of(agent)}",
        file=sys.stderr,
    )


def _run_dir_of(agent: Any) -> Any:
    run_dir = getattr(agent, "run_dir", None)
    return run_dir if run_dir is not None else getattr(agent.config, "run_dir", None)


def resume_async(
    cls: type,
    checkpoint: str | os.PathLike[str],
    env_id: str,
    total_steps: int | None,
    *,
    weight_sync_period: int | None = None,
    fixed_lag: bool | None = None,
    **load_kwargs: Any,
) -> int:
    """``vecaccel train ALGO --resume DIR`` of a run trained with ``--async``: the exit code.

    The agent is loaded without envs (the sampler process builds them) and goes on from the
    checkpoint's counters (and, for the DQN family, its replay buffer) to ``total_steps``, the
    run's new total; A2C and PPO may leave it out to finish the run's own budget.
    ``fixed_lag`` (see :func:`learn_async` and :func:`learn_async_on_policy`) and, for A2C and
    PPO, ``weight_sync_period``: ``None`` keeps what the checkpoint records (``False`` and 1
    for a run trained synchronously until now).
    """
    import sys

    from vecaccel.trainers.common import apply_runtime_settings

    agent = cls.load(checkpoint, env=None, **load_kwargs)
    runtime = ("progress", "tensorboard")
    apply_runtime_settings(agent, {k: v for k, v in load_kwargs.items() if k in runtime})
    step = int(agent.global_step)
    on_policy = not hasattr(agent, "num_updates")
    if on_policy and total_steps is not None:
        agent.set_target_steps(total_steps)
    target = agent.target_steps if on_policy else total_steps
    if target is None:
        print("error: pass --total-steps to resume this trainer", file=sys.stderr)
        return 2
    if step >= target:
        print(
            f"the run is complete ({step} of {target} steps); pass a larger --total-steps to "
            "extend it",
            file=sys.stderr,
        )
        return 0
    recorded = agent.async_options  # empty after synchronous training
    if fixed_lag is None:
        fixed_lag = bool(recorded.get("fixed_lag", False))
    options = ", fixed lag" if fixed_lag else ""
    if on_policy:
        if weight_sync_period is None:
            weight_sync_period = int(recorded.get("weight_sync_period", 1))
        if fixed_lag and weight_sync_period != 1:
            print(
                "error: a fixed lag needs a weight-sync period of 1, got "
                f"{weight_sync_period} (pass --async-weight-sync-period 1 or "
                "--no-async-fixed-lag)",
                file=sys.stderr,
            )
            return 2
        options = f", weight sync period {weight_sync_period}{options}"
    if getattr(agent, "is_main", True):
        print(
            f"resuming {cls.__name__} (async{options}) from {checkpoint} at step {step}",
            file=sys.stderr,
        )
    if on_policy:
        stats = learn_async_on_policy(
            agent, None, weight_sync_period=weight_sync_period, fixed_lag=fixed_lag
        )
    else:
        stats = learn_async(
            agent, env_id, target - step, reset_num_timesteps=False, fixed_lag=fixed_lag
        )
    _report(agent, stats)
    return 0


# -- A2C and PPO: a double buffer of rollouts ------------------------------------------------


def _share_like(batch: Any) -> dict[str, Any]:
    T, B = batch.rewards.shape
    final_shape = (T * B, *batch.next_obs.shape[1:])

    def like(tensor: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(tensor, device="cpu").share_memory_()

    return {
        "obs": like(batch.obs),
        "actions": like(batch.actions),
        "rewards": like(batch.rewards),
        "terminated": like(batch.terminated),
        "truncated": like(batch.truncated),
        "valid": like(batch.valid),
        "extras": {key: like(value) for key, value in batch.extras.items()},
        "next_obs": like(batch.next_obs),
        "final_obs": torch.zeros(final_shape, dtype=batch.next_obs.dtype).share_memory_(),
        "final_index": torch.zeros((T * B, 2), dtype=torch.int64).share_memory_(),
    }


def _rollout_loop(spec: dict[str, Any]) -> None:
    """The on-policy sampler: ``[T, B]`` rollouts into the two shared slots in turn."""
    import vecaccel
    from vecaccel.trainers.common import (
        _ShiftedDiscretePolicy,
        make_env_for_training,
        seed_everything,
        split_seed,
    )

    link = _ChildLink(spec)
    counters = link.counters
    model: torch.nn.Module = spec["model"]
    cfg = spec["config"]
    action_start = int(spec.get("action_start", 0))
    first_version = int(counters[_VERSION])  # published before this process started
    # the policy's action sampling, new draws for a resumed run
    seed_everything(split_seed(int(cfg["seed"]), _CHILD_SEED_KEY, first_version))
    options: dict[str, Any] = {}
    if cfg["num_workers"] > 0 and cfg["backend"] != "serial":
        options["num_workers"] = cfg["num_workers"]
    env = make_env_for_training(
        cfg["env_id"],
        cfg["num_envs"],
        backend=cfg["backend"],
        seed=cfg["seed"],
        atari=cfg["atari"],
        autoreset_mode=cfg["autoreset_mode"],
        **options,
    )
    try:
        model.eval()
        params = list(model.state_dict().values())
        # a Discrete(n, start) env gets the model's actions 0..n-1 moved to start..start+n-1
        # (as the synchronous sampler's policy does); the optimiser moves the batch's back
        policy = model if action_start == 0 else _ShiftedDiscretePolicy(model, action_start)
        sampler = vecaccel.Sampler(
            env, policy, horizon=cfg["num_steps"], seed=cfg["seed"], episode_stats="infos"
        )
        slots: list[dict[str, Any]] | None = None
        slot = 0
        for n in range(spec["num_batches"]):
            if link.stopped:
                break
            if spec["fixed_lag"]:
                # batch n is collected with the weights of update n - 1 exactly: waited for,
                # and the optimiser publishes no newer ones before they are pulled
                wanted = first_version + max(0, n - 1)
                link.wait_while(lambda wanted=wanted: int(counters[_VERSION]) < wanted)
                if link.stopped:
                    break
                version = link.pull_weights(params)
                counters[_PULLS] = n + 1
            else:
                version = link.pull_weights(params)
            batch = sampler.collect()
            if slots is None:
                slots = [_share_like(batch), _share_like(batch)]
                spec["slots"].put(slots)
            link.wait_while(lambda full=_SLOT_STATE + slot: bool(counters[full]))
            target = slots[slot]
            for key in ("obs", "actions", "rewards", "terminated", "truncated", "valid"):
                target[key].copy_(getattr(batch, key))
            for key, value in batch.extras.items():
                target["extras"][key].copy_(value)
            target["next_obs"].copy_(batch.next_obs)
            k = len(batch.final_obs)
            if k:
                target["final_obs"][:k].copy_(batch.final_obs)
                target["final_index"][:k].copy_(batch.final_index)
            counters[_SLOT_K + slot] = k
            counters[_SLOT_VERSION + slot] = version
            episodes = sampler.pop_episodes()
            spec["episodes"].put((list(episodes.returns), list(episodes.lengths)))
            counters[_SLOT_STATE + slot] = 1
            counters[_STEPS] += batch.rewards.numel()
            slot ^= 1
        if slots is not None:
            link.wait_while(lambda: not counters[_SLOTS_TAKEN])
    finally:
        env.close()


def make_async_on_policy_agent(cls: type, env_id: str, **config: Any) -> Any:
    """An A2C or PPO agent for ``env_id`` without envs (the rollout process has them)."""
    return cls(None, env_id=env_id, **config)


def learn_async_on_policy(
    agent: Any,
    total_steps: int | None,
    *,
    weight_sync_period: int = 1,
    fixed_lag: bool = False,
    context: str = "spawn",
    poll_interval: float = 0.0005,
    sampler_threads: int = 1,
    sampler_affinity: set[int] | None = None,
) -> AsyncStats:
    """Train an A2C or PPO agent with sampling overlapped with optimisation.

    A rollout process collects ``[T, B]`` batches with the weights it last received into two
    shared-memory slots, in turn (a double buffer), while this process updates on the other
    slot. Each batch remembers which update's weights collected it; the **policy lag** (updates
    between those weights and the ones being trained) is logged as ``charts/policy_lag``, 1 with
    ``weight_sync_period=1`` in steady state, but which update's weights a batch gets depends on
    how the two processes happen to be scheduled, so two runs with the same seed differ. With
    ``fixed_lag=True`` batch ``n`` is always collected with the weights of update ``n - 1``
    (the rollout process waits for them; the optimiser publishes no newer ones before they are
    taken): the lag is exactly 1 after the first batch and a seeded run repeats exactly. It
    costs no throughput when one side is clearly the slower, as each side then waits anyway.
    PPO's importance ratio uses the stored behaviour log-probabilities, so the lag is corrected
    up to the clipping; A2C's gradient is biased by it.
    Under a process group every rank runs its own rollout process and double buffer; the
    updates are data-parallel and the ranks reduce their metrics (and agree on a stop) after
    every update, as synchronous training does.

    An agent loaded from a checkpoint (``PPO.load(path)``) goes on from its step and update
    counts; ``total_steps=None`` finishes its run's budget with the learning-rate schedule it
    had. Its envs start new episodes (env state cannot be saved).

    Args:
        agent: an A2C or PPO agent (e.g. from :func:`make_async_on_policy_agent`, or loaded).
        total_steps: env steps to collect, over all ranks (rounded up to whole batches);
            ``None``: those the loaded run has left.
        weight_sync_period: updates between weight copies to the rollout process.
        fixed_lag: collect batch ``n`` with the weights of update ``n - 1`` exactly
            (reproducible runs); needs ``weight_sync_period=1``.
        context: multiprocessing start method of the rollout process.
        poll_interval: seconds between checks while one side waits.
        sampler_threads: torch threads of the rollout process.
        sampler_affinity: CPUs to pin the rollout process to.

    Returns:
        The measured :class:`AsyncStats` (``replay_ratio`` is 1: each batch is used once).

    Raises:
        SamplerError: the rollout process died or raised.
        TrainingInterrupted: SIGINT or SIGTERM arrived (a checkpoint was written first).
    """
    import torch.multiprocessing as mp

    from vecaccel.sampler import SampleBatch
    from vecaccel.trainers.common import (
        CHECKPOINT_NAME,
        RunLogger,
        SignalCheckpoint,
        TrainingInterrupted,
        mean_or_none,
    )

    if weight_sync_period < 1:
        raise ValueError(f"weight_sync_period must be at least 1, got {weight_sync_period}")
    if fixed_lag and weight_sync_period != 1:
        raise ValueError(
            f"fixed_lag=True needs weight_sync_period=1 (every update's weights are the next "
            f"batch's), got weight_sync_period={weight_sync_period}"
        )
    cfg = agent.config
    world = int(getattr(agent, "world_size", 1))
    main = bool(getattr(agent, "is_main", True))
    _leave_cores_to_sampler(cfg, sampler_threads)
    ctx = mp.get_context(context)
    # agent.batch_size is the batch over all ranks, so every rank makes the same updates
    if total_steps is None:  # the rest of a loaded run, on its own schedule
        agent.set_budget(None)
        num_batches = max(1, math.ceil((agent.target_steps - agent.global_step) / agent.batch_size))
    else:
        num_batches = max(1, math.ceil(int(total_steps) / agent.batch_size))
        agent.set_budget(num_batches * agent.batch_size)
    agent.target_steps = agent.global_step + num_batches * agent.batch_size
    # recorded in checkpoints: `vecaccel train --resume` goes on async, with these options
    agent.async_run = True
    agent.async_options = {
        "weight_sync_period": int(weight_sync_period),
        "fixed_lag": bool(fixed_lag),
    }

    def rollouts_finished(exitcode: int | None) -> bool:
        if exitcode != 0:
            return False
        if counters[_SLOT_STATE] or counters[_SLOT_STATE + 1]:
            return True  # its last batches are still to train on
        return agent.global_step >= agent.target_steps

    rollouts = _SamplerHandle(ctx, "rollout", agent.model, rollouts_finished)
    counters, timers = rollouts.counters, rollouts.timers
    slots_queue, episodes = ctx.Queue(), ctx.Queue()
    spec = dict(
        rollouts.spec(poll_interval, sampler_threads, sampler_affinity),
        config={
            key: getattr(cfg, key)
            for key in (
                "env_id",
                "num_envs",
                "backend",
                "num_workers",
                "seed",
                "atari",
                "autoreset_mode",
                "num_steps",
            )
        },  # fmt: skip
        model=copy.deepcopy(agent.model).cpu(),
        action_start=int(agent._action_start),
        slots=slots_queue,
        episodes=episodes,
        num_batches=num_batches,
        fixed_lag=bool(fixed_lag),
    )
    run_dir = agent.run_dir if main else None  # rank 0 alone logs and checkpoints
    # before the rollout process starts: an error here (a run directory that cannot be made)
    # must not leave it running outside the try/finally that stops it
    logger = RunLogger(
        run_dir,
        agent.target_steps,
        use_tensorboard=agent.tensorboard and main,
        progress=agent.progress and main,
        resume_step=agent.global_step if agent.global_step > 0 else None,
    )
    agent.logger = logger
    rollouts.publish(agent.update_index)
    rollouts.start(_rollout_loop, spec)
    guard = SignalCheckpoint()
    optimizer_wait = 0.0
    lag_sum, lag_count = 0.0, 0
    start_step, updates_at_start = agent.global_step, agent.update_index
    start = time.perf_counter()
    end: float | None = None
    every_rank_here = False  # the run ended or stopped on every rank, not in an error
    in_update = False  # between an update's first optimizer step and its counters

    def check() -> None:
        rollouts.check()
        if _stop_requested(guard, world):
            raise TrainingInterrupted(guard.signal_name, agent.global_step)

    def wait_until(ready: Callable[[], bool]) -> None:
        nonlocal optimizer_wait
        optimizer_wait += _poll_until(ready, check, poll_interval)

    try:
        with guard:
            slots = None
            while slots is None:
                check()
                try:
                    slots = slots_queue.get(timeout=0.2)
                except queue.Empty:
                    pass
            counters[_SLOTS_TAKEN] = 1
            start = time.perf_counter()  # rates are timed from the first batch
            slot = 0
            while agent.global_step < agent.target_steps:
                wait_until(lambda full=_SLOT_STATE + slot: bool(counters[full]))
                shared = slots[slot]
                k = int(counters[_SLOT_K + slot])
                device = agent.device
                batch = SampleBatch(
                    obs=shared["obs"].to(device),
                    actions=shared["actions"].to(device),
                    rewards=shared["rewards"].to(device),
                    terminated=shared["terminated"].to(device),
                    truncated=shared["truncated"].to(device),
                    valid=shared["valid"].to(device),
                    extras={key: value.to(device) for key, value in shared["extras"].items()},
                    next_obs=shared["next_obs"].to(device),
                    final_obs=shared["final_obs"][:k].to(device),
                    final_index=shared["final_index"][:k].to(device),
                )
                batch = agent._model_actions(batch)
                lag = agent.update_index - int(counters[_SLOT_VERSION + slot])
                done_updates = agent.update_index - agent.schedule_start_update
                progress_remaining = max(0.0, 1.0 - done_updates / agent.schedule_updates)
                lr_now = agent.learning_rate * (progress_remaining if cfg.anneal_lr else 1.0)
                for group in agent.optimizer.param_groups:
                    group["lr"] = lr_now
                agent.model.train()
                in_update = True
                metrics = agent.update(batch, progress_remaining)  # a collective on K ranks
                counters[_SLOT_STATE + slot] = 0  # the slot may be refilled now
                agent.update_index += 1
                agent.global_step += agent.batch_size
                in_update = False
                if fixed_lag:  # not before batch m has taken update m - 1's weights
                    pulled = min(agent.update_index - updates_at_start + 1, num_batches)
                    wait_until(lambda pulled=pulled: counters[_PULLS] >= pulled)
                if agent.update_index % weight_sync_period == 0:
                    rollouts.publish(agent.update_index)
                lag_sum += lag
                lag_count += 1
                slot ^= 1
                returns: list[float] = []
                lengths: list[int] = []
                for batch_returns, batch_lengths in _drain(episodes):
                    returns.extend(batch_returns)
                    lengths.extend(batch_lengths)
                elapsed = max(time.perf_counter() - start, 1e-9)
                metrics.update(
                    {
                        "charts/episodic_return": mean_or_none(returns),
                        "charts/episodic_length": mean_or_none(lengths),
                        "charts/SPS": (agent.global_step - start_step) / elapsed,
                        "charts/learning_rate": lr_now,
                        "charts/lr_scale": agent.lr_scale,
                        "charts/updates": agent.update_index,
                        "charts/policy_lag": float(lag),
                        "charts/optimizer_wait_fraction": optimizer_wait / elapsed,
                        "charts/sampler_wait_fraction": float(timers[_SAMPLER_WAIT]) / elapsed,
                    }
                )
                # every rank meets after every update (a collective cannot be skipped)
                metrics, stop = _reduce(metrics, len(returns), guard.requested, (), agent.device)
                if (
                    agent.update_index % max(1, cfg.log_every) == 0
                    or metrics.get("charts/episodic_return") is not None
                    or agent.global_step >= agent.target_steps
                ):
                    logger.log(agent.global_step, metrics)
                if stop and agent.global_step < agent.target_steps:
                    raise TrainingInterrupted(guard.signal_name or "SIGTERM", agent.global_step)
        end = time.perf_counter()  # the run's rates exclude stopping the rollout process
        every_rank_here = True
    except TrainingInterrupted:
        every_rank_here = True  # the ranks agreed on the stop
        if run_dir is not None:
            logger.write(
                f"{guard.signal_name or 'SIGTERM'}: checkpoint saved to "
                f"{run_dir / CHECKPOINT_NAME} at step {agent.global_step}"
            )
        raise
    finally:
        if end is None:
            end = time.perf_counter()
        rollouts.stop(slots_queue, episodes)
        elapsed = max(end - start, 1e-9)
        # after an error on several ranks rank 0 may be part-way through an update the others
        # never finished (a collective that failed): the last checkpoint stays, as async DQN's;
        # so it does after an error before any update (a resume whose rollout process could not
        # start must not record its options in the run's checkpoint), and after an error inside
        # an update (a FloatingPointError after some minibatches stepped: weights part-way
        # through an update that the counters do not count)
        progressed = agent.global_step > start_step
        if every_rank_here or (world == 1 and progressed and not in_update):  # a collective
            agent._checkpoint(run_dir)
        agent.elapsed_before = logger.elapsed
        logger.close()
    updates = agent.update_index - updates_at_start
    return AsyncStats.measured(
        env_steps=agent.global_step - start_step,
        updates=updates,
        replay_ratio=1.0,
        seconds=elapsed,
        optimizer_wait=optimizer_wait,
        sampler_wait=float(timers[_SAMPLER_WAIT]),
        lag_sum=lag_sum,
        lag_count=lag_count,
    )


def train_async_on_policy(
    cls: type,
    env_id: str,
    total_steps: int,
    run_dir: str | None = None,
    progress: bool = True,
    tensorboard: bool = True,
    weight_sync_period: int = 1,
    fixed_lag: bool = False,
    **config: Any,
) -> int:
    """``vecaccel train a2c|ppo --async``: build the agent, train, report; the exit code."""
    agent = make_async_on_policy_agent(
        cls, env_id, run_dir=run_dir, progress=progress, tensorboard=tensorboard, **config
    )
    stats = learn_async_on_policy(
        agent, total_steps, weight_sync_period=weight_sync_period, fixed_lag=fixed_lag
    )
    _report(agent, stats)
    return 0
