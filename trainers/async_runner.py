"""Asynchronous sampling and optimisation for the DQN family (``vecaccel train dqn --async``).

Two processes run at the same time:

- the **sampler** (a child process) steps the envs with the latest weights it has, ε-greedy,
  and writes every transition into the replay buffer;
- the **optimiser** (the calling process) samples batches from that buffer and trains.

Everything they share lives in shared memory: the replay buffer (``replay.py`` builds every array,
cursors and counters included, with an ``array_factory``; here it allocates torch shared tensors),
the weights the sampler acts with, and a few counters. A lock guards the buffer (``add`` in the
sampler, ``sample`` and ``update_priorities`` in the optimiser); another guards the weights. The
optimiser publishes its weights every ``async_weight_sync_period`` updates (a setting: rlpyt's users
saw results change 3x with how rarely weights were sent).

The replay ratio (``updates × batch / env steps`` after ``learning_starts``) is **enforced by
throttling** both sides, which rlpyt's async mode did not do (its issue #138: 1.43 measured for 8
set): the optimiser waits while it is ahead (no update is due yet), and the sampler waits while it
is more than ``async_max_lead`` env steps ahead of what the updates done so far allow. The measured
ratio, the fraction of time each side waited and the policy lag (updates the sampler's weights are
behind) are logged.

A sampler process that dies is reported at once: the optimiser checks it at every turn of its
loop and raises :class:`SamplerError` with the child's exit code and traceback. The sampler exits
when the optimiser's process goes away.

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

import copy
import math
import os
import queue
import time
import traceback
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
# slots of the shared float64 timers (seconds)
_SAMPLER_WAIT, _SAMPLER_BUSY = range(2)


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
    """What an asynchronous run did, measured by the optimiser.

    Attributes:
        env_steps: transitions the sampler collected.
        updates: gradient updates done.
        replay_ratio: ``updates × batch / (env_steps - learning_starts)`` as measured.
        seconds: wall-clock of the run.
        sampling_rate: env steps per second over the run.
        update_rate: updates per second over the run.
        optimizer_wait_fraction: fraction of the run the optimiser waited for data.
        sampler_wait_fraction: fraction of the run the sampler waited for the optimiser.
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

    def __init__(self, lock: Any, check: Any = None) -> None:
        self.lock = lock
        self.check = check

    def __enter__(self) -> None:
        while not self.lock.acquire(timeout=0.25):
            if self.check is not None:
                self.check()

    def __exit__(self, *exc_info: Any) -> None:
        self.lock.release()


class _LockedBuffer:
    """The optimiser's view of the shared buffer: sampling and priority updates take the lock."""

    def __init__(self, buffer: Any, lock: Any) -> None:
        self._buffer = buffer
        self._lock = _GuardedLock(lock)

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        with self._lock:
            return self._buffer.sample(*args, **kwargs)

    def update_priorities(self, *args: Any, **kwargs: Any) -> None:
        with self._lock:
            self._buffer.update_priorities(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._buffer, name)


def _buffer_spec(agent: Any, num_envs: int) -> dict[str, Any]:
    cfg = agent.config
    frame_stack = agent._frame_stack()
    kwargs: dict[str, Any] = dict(
        capacity=max(cfg.buffer_size, num_envs * (cfg.n_step + frame_stack + 8)),
        num_envs=num_envs,
        n_step=cfg.n_step,
        gamma=cfg.gamma,
        frame_stack=frame_stack,
        seed=cfg.seed,
    )
    if cfg.prioritized:
        kwargs.update(alpha=cfg.priority_alpha, eps=cfg.priority_eps)
    return {"prioritized": cfg.prioritized, "kwargs": kwargs}


def _build_buffer(
    spec: dict[str, Any], observation_space: Any, action_space: Any, factory: Any
) -> Any:
    from vecaccel.trainers.replay import PrioritizedReplayBuffer, ReplayBuffer

    cls = PrioritizedReplayBuffer if spec["prioritized"] else ReplayBuffer
    return cls(observation_space, action_space, array_factory=factory, **spec["kwargs"])


# -- the sampler process ---------------------------------------------------------------------


def _sampler_main(spec: dict[str, Any]) -> None:
    """Entry point of the sampler process (see the module docstring)."""
    errors = spec["errors"]
    try:
        _sampler_loop(spec)
    except BaseException as exc:  # report everything, KeyboardInterrupt included
        try:
            errors.put(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        except Exception:
            pass
        raise


def _child_setup(spec: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """What the sampler and rollout processes do first; returns NumPy views of the shared
    counters and timers (a scalar read or write costs far less than on the torch tensors)."""
    import signal

    # the optimiser handles Ctrl-C and SIGTERM and then stops this process through _STOP
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if spec["affinity"]:
        os.sched_setaffinity(0, spec["affinity"])
    torch.set_num_threads(int(spec["torch_threads"]))
    return spec["counters"].numpy(), spec["timers"].numpy()


def _sampler_loop(spec: dict[str, Any]) -> None:

    from vecaccel.trainers.common import make_env_for_training
    from vecaccel.trainers.dqn import linear_schedule

    counters, timers = _child_setup(spec)
    network: torch.nn.Module = spec["network"]
    shared_weights: list[torch.Tensor] = spec["weights"]
    support: torch.Tensor | None = spec["support"]
    buffer = _build_buffer(
        spec["buffer"],
        spec["observation_space"],
        spec["action_space"],
        _ReplayFactory(spec["buffer_tensors"]),
    )
    parent = spec["parent_pid"]

    def parent_alive() -> None:
        if os.getppid() != parent:  # the optimiser died, perhaps holding a lock
            raise SystemExit(0)

    buffer_lock = _GuardedLock(spec["buffer_lock"], parent_alive)
    weights_lock = _GuardedLock(spec["weights_lock"], parent_alive)
    episodes = spec["episodes"]
    cfg = spec["config"]
    total, learn_from, lead = spec["total_steps"], spec["learn_from"], spec["lead"]
    steps_per_update = cfg["batch_size"] / cfg["replay_ratio"]
    poll = spec["poll_interval"]

    envs = make_env_for_training(
        spec["env_id"],
        spec["num_envs"],
        backend=cfg["backend"],
        seed=cfg["seed"],
        autoreset_mode="SameStep",
    )
    try:
        num_envs = envs.num_envs
        rng = np.random.default_rng(cfg["seed"] + 1)
        num_actions = int(spec["action_space"].n)
        duration = cfg["exploration_steps"] or int(cfg["exploration_fraction"] * total)
        obs, _ = envs.reset(seed=cfg["seed"])
        episode_return = np.zeros(num_envs)
        episode_length = np.zeros(num_envs, dtype=np.int64)
        local_version = -1
        params = list(network.state_dict().values())
        counters[_READY] = 1
        start = time.perf_counter()
        while not counters[_STOP]:
            steps = int(counters[_STEPS])
            if steps >= total:
                break
            if steps >= learn_from:  # throttle: stay within `lead` steps of what updates allow
                waited = time.perf_counter()
                while (
                    steps + num_envs
                    > learn_from + int(counters[_UPDATES]) * steps_per_update + lead
                    and not counters[_STOP]
                ):
                    if os.getppid() != parent:
                        return
                    time.sleep(poll)
                timers[_SAMPLER_WAIT] += time.perf_counter() - waited
            version = int(counters[_VERSION])
            if version != local_version:
                with weights_lock:
                    version = int(counters[_VERSION])
                    for mine, shared in zip(params, shared_weights):
                        mine.copy_(shared)
                local_version = version
                counters[_SAMPLER_VERSION] = version
            epsilon = linear_schedule(cfg["start_epsilon"], cfg["end_epsilon"], duration, steps)
            explore = rng.random(num_envs) < epsilon
            actions = rng.integers(0, num_actions, size=num_envs)
            if not explore.all():
                with torch.no_grad():
                    out = network(torch.as_tensor(obs))
                    q = out if support is None else (torch.softmax(out, -1) * support).sum(-1)
                actions = np.where(explore, actions, q.argmax(dim=1).numpy())
            next_obs, reward, terminated, truncated, infos = envs.step(actions)
            with buffer_lock:
                buffer.add(obs, actions, reward, terminated, truncated, infos.get("final_obs"))
            counters[_STEPS] += num_envs
            obs = next_obs
            done = terminated | truncated
            episode_return += reward
            episode_length += 1
            if done.any():
                final_info = infos.get("final_info", {})
                stats = final_info.get("episode") if isinstance(final_info, dict) else None
                finished = []
                for i in np.flatnonzero(done):
                    if stats is not None:
                        finished.append((float(stats["r"][i]), int(stats["l"][i])))
                    else:
                        finished.append((float(episode_return[i]), int(episode_length[i])))
                episodes.put((steps + num_envs, finished))
                episode_return[done] = 0.0
                episode_length[done] = 0
            if os.getppid() != parent:
                return
        timers[_SAMPLER_BUSY] = time.perf_counter() - start
    finally:
        envs.close()


# -- the optimiser ---------------------------------------------------------------------------


def make_async_agent(cls: type, env_id: str, **config: Any) -> Any:
    """A DQN-family agent with networks built for ``env_id`` but no envs (the sampler has them)."""
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
    context: str = "spawn",
    poll_interval: float = 0.0005,
    sampler_threads: int = 1,
    sampler_affinity: set[int] | None = None,
) -> AsyncStats:
    """Train ``agent`` (a DQN-family agent) asynchronously for ``total_steps`` env steps.

    Args:
        agent: from :func:`make_async_agent` (or any DQN with built networks); its
            ``config.num_envs`` envs of ``config.backend`` run in the sampler process.
        env_id: the Gymnasium id the sampler builds.
        total_steps: env steps to collect.
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
    num_envs = cfg.num_envs
    total_steps = int(total_steps)
    ctx = mp.get_context(context)
    factory = _SharedFactory()
    buffer_spec = _buffer_spec(agent, num_envs)
    buffer = _build_buffer(buffer_spec, agent.observation_space, agent.action_space, factory)
    buffer_lock, weights_lock = ctx.Lock(), ctx.Lock()
    agent.buffer = _LockedBuffer(buffer, buffer_lock)
    shared_counters = torch.zeros(8, dtype=torch.int64).share_memory_()
    shared_timers = torch.zeros(4, dtype=torch.float64).share_memory_()
    counters, timers = shared_counters.numpy(), shared_timers.numpy()
    state = agent.q_network.state_dict()
    shared_weights = [t.detach().cpu().clone().share_memory_() for t in state.values()]
    sampler_network = copy.deepcopy(agent.q_network).cpu()
    learn_from = max(cfg.learning_starts, num_envs * (cfg.n_step + buffer.frame_stack + 1))
    steps_per_update = cfg.batch_size / cfg.replay_ratio
    lead = cfg.async_max_lead or max(num_envs, int(math.ceil(16 * steps_per_update)))
    episodes, errors = ctx.Queue(), ctx.Queue()
    spec = dict(
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
                "exploration_fraction",
                "exploration_steps",
            )
        },
        counters=shared_counters,
        timers=shared_timers,
        network=sampler_network,
        weights=shared_weights,
        support=None if agent.support is None else agent.support.cpu(),
        buffer=buffer_spec,
        buffer_tensors=factory.tensors,
        observation_space=agent.observation_space,
        action_space=agent.action_space,
        buffer_lock=buffer_lock,
        weights_lock=weights_lock,
        episodes=episodes,
        errors=errors,
        total_steps=total_steps,
        learn_from=learn_from,
        lead=lead,
        parent_pid=os.getpid(),
        poll_interval=poll_interval,
        torch_threads=sampler_threads,
        affinity=set(sampler_affinity) if sampler_affinity else None,
    )

    # state_dict() tensors share storage with the parameters, so this list stays current
    online_weights = list(agent.q_network.state_dict().values())
    guarded_weights_lock = _GuardedLock(weights_lock)

    def publish() -> None:
        with guarded_weights_lock:
            for shared, tensor in zip(shared_weights, online_weights):
                shared.copy_(tensor)
            counters[_VERSION] = agent.num_updates

    publish()
    process = ctx.Process(target=_sampler_main, args=(spec,), name="vecaccel-async-sampler")
    process.start()

    def check_sampler() -> None:
        if process.is_alive():
            return
        process.join(timeout=1.0)
        remote = ""
        try:
            remote = errors.get(timeout=0.2)
        except (queue.Empty, OSError, EOFError):
            pass
        done = int(counters[_STEPS]) >= total_steps and process.exitcode == 0
        if not done and not counters[_STOP]:
            raise SamplerError(
                f"the asynchronous sampler process (pid {process.pid}) died with exit code "
                f"{process.exitcode} after {int(counters[_STEPS])} env steps",
                process.exitcode,
                remote,
            )

    # a sampler killed while holding a lock never releases it: wait for locks in bounded steps
    guarded_weights_lock.check = agent.buffer._lock.check = check_sampler
    logger = RunLogger(
        cfg.run_dir, total_steps, use_tensorboard=cfg.tensorboard, progress=cfg.progress
    )
    agent.logger = logger
    guard = SignalCheckpoint()
    start = time.perf_counter()
    optimizer_wait = 0.0
    lag_sum, lag_count = 0.0, 0
    recent_losses: list[dict[str, float]] = []
    finished: list[tuple[float, int]] = []
    next_log = cfg.log_interval
    last_target_update = 0
    agent.global_step, agent.num_updates = 0, 0
    beta = cfg.priority_beta_start
    complete = False
    next_drain = 0.0
    try:
        with guard:
            while not counters[_READY]:  # rates are timed from the sampler's first step
                check_sampler()
                time.sleep(poll_interval)
                if guard.requested:
                    raise TrainingInterrupted(guard.signal_name, 0)
            start = time.perf_counter()
            while True:
                check_sampler()
                steps = int(counters[_STEPS])
                agent.global_step = steps
                due = (
                    int(cfg.replay_ratio * (steps - learn_from) // cfg.batch_size)
                    if (steps > learn_from)
                    else 0
                )
                if agent.num_updates < due:
                    beta = cfg.priority_beta_start + (1.0 - cfg.priority_beta_start) * min(
                        1.0, steps / total_steps
                    )
                    batch = (
                        agent.buffer.sample(cfg.batch_size, beta=beta)
                        if cfg.prioritized
                        else agent.buffer.sample(cfg.batch_size)
                    )
                    recent_losses.append(agent.train_step(batch))
                    agent.num_updates += 1
                    counters[_UPDATES] = agent.num_updates
                    if agent.num_updates % max(1, cfg.async_weight_sync_period) == 0:
                        publish()
                    lag_sum += agent.num_updates - int(counters[_SAMPLER_VERSION])
                    lag_count += 1
                    if steps - last_target_update >= cfg.target_update_period:
                        last_target_update = steps
                        agent._update_target()
                    if cfg.checkpoint_period and agent.num_updates % cfg.checkpoint_period == 0:
                        if cfg.run_dir is not None:
                            agent._checkpoint()
                elif steps >= total_steps:
                    complete = True
                else:
                    waited = time.perf_counter()
                    time.sleep(poll_interval)
                    optimizer_wait += time.perf_counter() - waited
                if guard.requested:
                    raise TrainingInterrupted(guard.signal_name, agent.global_step)
                now = time.perf_counter()
                if now >= next_drain or steps >= next_log or complete:
                    next_drain = now + 0.02  # polling the queue's pipe costs ~0.2 ms a time
                    while True:
                        try:
                            _, ended = episodes.get_nowait()
                        except queue.Empty:
                            break
                        finished.extend(ended)
                        agent.episode_log.extend((steps, r, n) for r, n in ended)
                if steps >= next_log or complete:
                    next_log += cfg.log_interval
                    elapsed = max(time.perf_counter() - start, 1e-9)
                    learned = steps - learn_from
                    metrics: dict[str, float | None] = {
                        "charts/SPS": steps / elapsed,
                        "charts/UPS": agent.num_updates / elapsed,
                        "charts/updates": agent.num_updates,
                        "charts/replay_ratio": (
                            agent.num_updates * cfg.batch_size / learned if learned > 0 else None
                        ),
                        "charts/replay_ratio_setting": cfg.replay_ratio,
                        "charts/learning_rate": agent.learning_rate,
                        "charts/lr_scale": agent.lr_scale,
                        "charts/optimizer_wait_fraction": optimizer_wait / elapsed,
                        "charts/sampler_wait_fraction": float(timers[_SAMPLER_WAIT]) / elapsed,
                        "charts/policy_lag": lag_sum / lag_count if lag_count else None,
                    }
                    if finished:
                        metrics["charts/episodic_return"] = float(np.mean([r for r, _ in finished]))
                        metrics["charts/episodic_length"] = float(np.mean([n for _, n in finished]))
                        metrics["charts/episodes"] = len(finished)
                    if recent_losses:
                        for key in recent_losses[0]:
                            metrics[key] = float(np.mean([m[key] for m in recent_losses]))
                    logger.log(steps, metrics)
                    finished, recent_losses = [], []
                if complete:
                    break
        agent._measured_replay_ratio = (
            agent.num_updates * cfg.batch_size / max(1, agent.global_step - learn_from)
        )
    except TrainingInterrupted:
        if cfg.run_dir is not None:
            logger.write(
                f"{guard.signal_name}: checkpoint saved to {Path(cfg.run_dir) / 'checkpoint.pt'} "
                f"at step {agent.global_step}"
            )
        raise
    finally:
        counters[_STOP] = 1
        process.join(timeout=10.0)
        if process.is_alive():
            process.terminate()
            process.join(timeout=5.0)
        elapsed = max(time.perf_counter() - start, 1e-9)
        if cfg.run_dir is not None:
            agent._checkpoint()
        logger.close()
        for channel in (episodes, errors):
            channel.close()
            channel.cancel_join_thread()
    return AsyncStats(
        env_steps=agent.global_step,
        updates=agent.num_updates,
        replay_ratio=agent.num_updates * cfg.batch_size / max(1, agent.global_step - learn_from),
        seconds=elapsed,
        sampling_rate=agent.global_step / elapsed,
        update_rate=agent.num_updates / elapsed,
        optimizer_wait_fraction=optimizer_wait / elapsed,
        sampler_wait_fraction=float(timers[_SAMPLER_WAIT]) / elapsed,
        mean_policy_lag=lag_sum / lag_count if lag_count else 0.0,
    )


def train_async_dqn(
    cls: type,
    env_id: str,
    total_steps: int,
    run_dir: str | None = None,
    progress: bool = True,
    tensorboard: bool = True,
    **config: Any,
) -> int:
    """``vecaccel train dqn|c51|rainbow --async``: build the agent, train, report; the exit code."""
    import sys

    agent = make_async_agent(
        cls, env_id, run_dir=run_dir, progress=progress, tensorboard=tensorboard, **config
    )
    stats = learn_async(agent, env_id, total_steps)
    print(
        f"async {cls.__name__}: {stats.env_steps} env steps ({stats.sampling_rate:.0f}/s), "
        f"{stats.updates} updates ({stats.update_rate:.1f}/s), replay ratio "
        f"{stats.replay_ratio:.2f} (setting {agent.config.replay_ratio}), policy lag "
        f"{stats.mean_policy_lag:.2f} updates; run directory: {run_dir}",
        file=sys.stderr,
    )
    return 0


# -- A2C and PPO: a double buffer of rollouts ------------------------------------------------

# slots of the on-policy shared counters: per slot i, _SLOT_STATE + i is 0 (free) or 1 (full),
# _SLOT_K + i the number of final observations, _SLOT_VERSION + i the weights that collected it
_SLOT_STATE, _SLOT_K, _SLOT_VERSION = 8, 10, 12


def _rollout_main(spec: dict[str, Any]) -> None:
    """Entry point of the rollout sampler process of :func:`learn_async_on_policy`."""
    errors = spec["errors"]
    try:
        _rollout_loop(spec)
    except BaseException as exc:
        try:
            errors.put(f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        except Exception:
            pass
        raise


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

    import vecaccel
    from vecaccel.trainers.common import make_env_for_training

    counters, timers = _child_setup(spec)
    model: torch.nn.Module = spec["model"]
    shared_weights: list[torch.Tensor] = spec["weights"]
    parent, poll = spec["parent_pid"], spec["poll_interval"]

    def parent_alive() -> None:
        if os.getppid() != parent:  # the optimiser died, perhaps holding the lock
            raise SystemExit(0)

    weights_lock = _GuardedLock(spec["weights_lock"], parent_alive)
    cfg = spec["config"]
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
        sampler = vecaccel.Sampler(
            env, model, horizon=cfg["num_steps"], seed=cfg["seed"], episode_stats="infos"
        )
        slots: list[dict[str, Any]] | None = None
        local_version, slot = -1, 0
        for _ in range(spec["num_batches"]):
            if counters[_STOP]:
                break
            version = int(counters[_VERSION])
            if version != local_version:
                with weights_lock:
                    version = int(counters[_VERSION])
                    for mine, shared in zip(params, shared_weights):
                        mine.copy_(shared)
                local_version = version
            batch = sampler.collect()
            if slots is None:
                slots = [_share_like(batch), _share_like(batch)]
                spec["slots"].put(slots)
            waited = time.perf_counter()
            while counters[_SLOT_STATE + slot] and not counters[_STOP]:
                if os.getppid() != parent:
                    return
                time.sleep(poll)
            timers[_SAMPLER_WAIT] += time.perf_counter() - waited
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
            counters[_SLOT_VERSION + slot] = local_version
            episodes = sampler.pop_episodes()
            spec["episodes"].put((list(episodes.returns), list(episodes.lengths)))
            counters[_SLOT_STATE + slot] = 1
            counters[_STEPS] += batch.rewards.numel()
            slot ^= 1
    finally:
        env.close()


def make_async_on_policy_agent(cls: type, env_id: str, **config: Any) -> Any:
    """An A2C or PPO agent for ``env_id`` without envs (the rollout process has them)."""
    return cls(None, env_id=env_id, **config)


def learn_async_on_policy(
    agent: Any,
    total_steps: int,
    *,
    weight_sync_period: int = 1,
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
    ``weight_sync_period=1`` in steady state. PPO's importance ratio uses the stored behaviour
    log-probabilities, so the lag is corrected up to the clipping; A2C's gradient is biased by it.

    Args:
        agent: an A2C or PPO agent (e.g. from :func:`make_async_on_policy_agent`).
        total_steps: env steps to collect (rounded up to whole batches).
        weight_sync_period: updates between weight copies to the rollout process.
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

    cfg = agent.config
    ctx = mp.get_context(context)
    num_batches = max(1, math.ceil(int(total_steps) / agent.batch_size))
    agent.target_steps = agent.global_step + num_batches * agent.batch_size
    agent.schedule_start_update = agent.update_index
    agent.schedule_updates = num_batches
    shared_counters = torch.zeros(16, dtype=torch.int64).share_memory_()
    shared_timers = torch.zeros(4, dtype=torch.float64).share_memory_()
    counters, timers = shared_counters.numpy(), shared_timers.numpy()
    weights_lock = ctx.Lock()
    shared_weights = [
        t.detach().cpu().clone().share_memory_() for t in agent.model.state_dict().values()
    ]
    slots_queue, episodes, errors = ctx.Queue(), ctx.Queue(), ctx.Queue()
    spec = dict(
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
        counters=shared_counters,
        timers=shared_timers,
        model=copy.deepcopy(agent.model).cpu(),
        weights=shared_weights,
        weights_lock=weights_lock,
        slots=slots_queue,
        episodes=episodes,
        errors=errors,
        num_batches=num_batches,
        parent_pid=os.getpid(),
        poll_interval=poll_interval,
        torch_threads=sampler_threads,
        affinity=set(sampler_affinity) if sampler_affinity else None,
    )

    guarded_weights_lock = _GuardedLock(weights_lock)

    def publish() -> None:
        with guarded_weights_lock:
            for shared, tensor in zip(shared_weights, agent.model.state_dict().values()):
                shared.copy_(tensor)
            counters[_VERSION] = agent.update_index

    publish()
    process = ctx.Process(target=_rollout_main, args=(spec,), name="vecaccel-async-rollouts")
    process.start()

    def check_sampler() -> None:
        if process.is_alive():
            return
        process.join(timeout=1.0)
        if process.exitcode == 0 and not counters[_SLOT_STATE] and not counters[_SLOT_STATE + 1]:
            done = agent.global_step >= agent.target_steps
        else:
            done = process.exitcode == 0
        if not done:
            remote = ""
            try:
                remote = errors.get(timeout=0.2)
            except (queue.Empty, OSError, EOFError):
                pass
            raise SamplerError(
                f"the asynchronous rollout process (pid {process.pid}) died with exit code "
                f"{process.exitcode}",
                process.exitcode,
                remote,
            )

    guarded_weights_lock.check = check_sampler
    run_dir = agent.run_dir
    logger = RunLogger(
        run_dir,
        agent.target_steps,
        use_tensorboard=agent.tensorboard,
        progress=agent.progress,
        resume_step=agent.global_step if agent.global_step > 0 else None,
    )
    agent.logger = logger
    guard = SignalCheckpoint()
    optimizer_wait = 0.0
    lag_sum, lag_count = 0.0, 0
    start_step, updates_at_start = agent.global_step, agent.update_index
    start = time.perf_counter()
    try:
        with guard:
            slots = None
            while slots is None:
                check_sampler()
                try:
                    slots = slots_queue.get(timeout=0.2)
                except queue.Empty:
                    pass
                if guard.requested:
                    raise TrainingInterrupted(guard.signal_name, agent.global_step)
            start = time.perf_counter()  # rates are timed from the first batch
            slot = 0
            while agent.global_step < agent.target_steps:
                waited = time.perf_counter()
                while not counters[_SLOT_STATE + slot]:
                    check_sampler()
                    if guard.requested:
                        raise TrainingInterrupted(guard.signal_name, agent.global_step)
                    time.sleep(poll_interval)
                optimizer_wait += time.perf_counter() - waited
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
                lag = agent.update_index - int(counters[_SLOT_VERSION + slot])
                done_updates = agent.update_index - agent.schedule_start_update
                progress_remaining = max(0.0, 1.0 - done_updates / agent.schedule_updates)
                lr_now = agent.learning_rate * (progress_remaining if cfg.anneal_lr else 1.0)
                for group in agent.optimizer.param_groups:
                    group["lr"] = lr_now
                agent.model.train()
                metrics = agent.update(batch, progress_remaining)
                counters[_SLOT_STATE + slot] = 0  # the slot may be refilled now
                agent.update_index += 1
                agent.global_step += agent.batch_size
                if agent.update_index % max(1, weight_sync_period) == 0:
                    publish()
                lag_sum += lag
                lag_count += 1
                slot ^= 1
                returns: list[float] = []
                lengths: list[int] = []
                while True:
                    try:
                        batch_returns, batch_lengths = episodes.get_nowait()
                    except queue.Empty:
                        break
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
                if (
                    agent.update_index % max(1, cfg.log_every) == 0
                    or returns
                    or agent.global_step >= agent.target_steps
                ):
                    logger.log(agent.global_step, metrics)
    except TrainingInterrupted:
        if run_dir is not None:
            logger.write(
                f"{guard.signal_name}: checkpoint saved to {run_dir / CHECKPOINT_NAME} "
                f"at step {agent.global_step}"
            )
        raise
    finally:
        counters[_STOP] = 1
        process.join(timeout=10.0)
        if process.is_alive():
            process.terminate()
            process.join(timeout=5.0)
        elapsed = max(time.perf_counter() - start, 1e-9)
        if run_dir is not None:
            agent.save(run_dir / CHECKPOINT_NAME)
        agent.elapsed_before = logger.elapsed
        logger.close()
        for channel in (slots_queue, episodes, errors):
            channel.close()
            channel.cancel_join_thread()
    updates = agent.update_index - updates_at_start
    return AsyncStats(
        env_steps=agent.global_step - start_step,
        updates=updates,
        replay_ratio=1.0,
        seconds=elapsed,
        sampling_rate=(agent.global_step - start_step) / elapsed,
        update_rate=updates / elapsed,
        optimizer_wait_fraction=optimizer_wait / elapsed,
        sampler_wait_fraction=float(timers[_SAMPLER_WAIT]) / elapsed,
        mean_policy_lag=lag_sum / lag_count if lag_count else 0.0,
    )


def train_async_on_policy(
    cls: type,
    env_id: str,
    total_steps: int,
    run_dir: str | None = None,
    progress: bool = True,
    tensorboard: bool = True,
    weight_sync_period: int = 1,
    **config: Any,
) -> int:
    """``vecaccel train a2c|ppo --async``: build the agent, train, report; the exit code."""
    import sys

    agent = make_async_on_policy_agent(
        cls, env_id, run_dir=run_dir, progress=progress, tensorboard=tensorboard, **config
    )
    stats = learn_async_on_policy(agent, total_steps, weight_sync_period=weight_sync_period)
    print(
        f"async {cls.__name__}: {stats.env_steps} env steps ({stats.sampling_rate:.0f}/s), "
        f"{stats.updates} updates, mean policy lag {stats.mean_policy_lag:.2f} updates; "
        f"run directory: {run_dir}",
        file=sys.stderr,
    )
    return 0
