"""The GPU path in one run: action-server checks and speed, PPO on Pong, DQN update rates.

Four parts, each timed, with its peak GPU memory (``torch.cuda.max_memory_allocated``) and the
GPU's busy share (NVML's utilisation, sampled every 0.2 s through ``torch.cuda.utilization``,
or ``nvidia-smi`` where NVML's Python binding is missing; null on the CPU), as
``vecaccel.bench.device_usage.DeviceUsage`` records them:

``check``
    ``vecaccel.testing.action_server.check_action_server`` on Pong (tensors on the device,
    pinned staging, each alternating half exact against ``serial``), then rollout speed with
    the Nature-CNN actor-critic on the device, with and without alternation
    (``examples/gpu_check.py`` runs the same).
``action_server``
    Pong on ``--workers`` CPU workers with the same policy on the device: ``shm`` (arrays
    copied to the device and back each step), ``action_server`` and ``action_server`` with
    alternating halves, in one run; steps/s and alternation's gain over ``shm``.
``dqn``
    Gradient updates per second of the DQN family (``--dqn-preset``, C51 by default) on Pong
    transitions from a replay buffer filled first, at each of ``--dqn-batch-sizes``: as a
    training loop runs them (replay sampling on the CPU, the copy to the device, the update),
    and the update alone on a batch already on the device.
``ppo``
    PPO on Pong (``atari-large`` preset) on ``action_server`` with the networks on the device,
    bf16 autocast and channels_last, ``--ppo-envs`` envs with the learning rate scaled from
    its 1,024-sample base (``--ppo-lr-scaling``), for ``--ppo-seconds`` of wall-clock: SPS,
    the share of time in updates, and the return curve against wall-clock seconds and agent
    steps (the running mean of the last ``--return-window`` episodes). It runs last, so that a
    run stopped during its fixed wall-clock still leaves the other parts' figures.

Everything goes to ``OUT/gpu_run.json`` (in the one result format of ``vecaccel.bench.record``:
one row per part, with the machine and the command in ``meta``) and ``OUT/gpu_run.png``; the
kept figures live in ``benchmarks/results/``. A part that fails is recorded with its error and the others still run;
the exit code is then 1. SIGTERM (as ``timeout`` sends) stops the run like Ctrl-C: the part
running is recorded as interrupted, with what it had, and the plot is drawn. With the defaults
the run takes about 7.5 minutes on one GPU and 16 CPU cores. ``--smoke`` runs every part on
the CPU with tiny sizes in well under a minute::

    python benchmarks/gpu/gpu_run.py benchmarks/results   # on a machine with CUDA
    python benchmarks/gpu/gpu_run.py --smoke OUT          # anywhere
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import signal
import sys
import time
import traceback
from collections import deque
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

import vecaccel
from vecaccel.bench import RunRecord, command_line
from vecaccel.bench.device_usage import DeviceUsage
from vecaccel.bench.policy_loop import policy_steps_per_second
from vecaccel.testing.action_server import check_action_server
from vecaccel.trainers import DQN, PPO
from vecaccel.trainers.envs.make import make_env_fn
from vecaccel.trainers.nets.networks import ActorCritic

#: the short parts first, so that a run stopped during PPO's fixed wall-clock still leaves them
PARTS = ("check", "action_server", "dqn", "ppo")

#: the full run on one GPU with 16 CPU cores; ``--smoke`` swaps in :data:`SMOKE`
FULL: dict[str, Any] = dict(
    device="cuda",
    workers=16,
    seconds=5.0,
    check_envs=16,
    server_envs=64,
    ppo_envs=128,
    ppo_steps=128,
    ppo_minibatch=1024,
    ppo_seconds=360.0,
    ppo_anneal_steps=8_000_000,
    dqn_fill=16_384,
    dqn_batch_sizes=[32, 2048],
)
SMOKE: dict[str, Any] = dict(
    device="cpu",
    workers=1,
    seconds=0.3,
    check_envs=4,
    server_envs=4,
    ppo_envs=4,
    ppo_steps=16,
    ppo_minibatch=32,
    ppo_seconds=2.0,
    ppo_anneal_steps=100_000,
    dqn_fill=256,
    dqn_batch_sizes=[8, 32],
)

#: what each sized setting means (``--help``)
MEANING: dict[str, str] = dict(
    device="torch device of the policies and learners",
    workers="env worker processes (CPU cores for the envs)",
    seconds="measuring time of each rollout variant and of each DQN rate",
    check_envs="envs of the check part's speed (its exactness check uses up to 8)",
    server_envs="envs of the action_server part",
    ppo_envs="PPO's envs",
    ppo_steps="PPO's steps per env per update",
    ppo_minibatch="PPO's minibatch size (the batch is split into as many as fit)",
    ppo_seconds="PPO's wall-clock budget; it stops at the first update past it",
    ppo_anneal_steps="agent steps over which PPO's learning rate would anneal to 0",
    dqn_fill="transitions collected into the DQN's replay buffer before its updates are timed",
    dqn_batch_sizes="DQN batch sizes whose update rates are measured",
)

# -- what every part records -------------------------------------------------------------------


class Report:
    """The run's JSON in the one result format (one row per part), rewritten after every part
    (and as PPO goes), so that a run stopped part-way still leaves what it measured.

    Args:
        path: the JSON file.
        run_record: the run's command, machine and start, from before the first part.
        **settings: the run's own fields of ``meta`` (device, versions, options).
    """

    def __init__(self, path: Path, run_record: RunRecord, **settings: Any) -> None:
        self.path = path
        self.run_record = run_record
        self.settings = settings
        self.records: list[dict[str, Any]] = []
        self.started = time.perf_counter()

    def save(self, complete: bool = False) -> None:
        """Write every record so far; ``complete`` once every part has run."""
        seconds = round(time.perf_counter() - self.started, 1)
        self.run_record.write(
            self.path, self.records, complete=complete, total_seconds=seconds, **self.settings
        )


#: a part's body: ``body(args, progress)``; ``progress(fields)`` records partial results
PartBody = Callable[[argparse.Namespace, Callable[[dict[str, Any]], None]], dict[str, Any]]


def run_part(name: str, body: PartBody, args: argparse.Namespace, report: Report) -> dict[str, Any]:
    """Run one part into ``report``: its record with status, seconds, peak GPU memory and GPU
    busy share. An exception is recorded; Ctrl-C or SIGTERM is recorded and raised again."""
    print(f"[{name}] ...", file=sys.stderr, flush=True)
    record: dict[str, Any] = {"part": name, "status": "running"}
    report.records.append(record)
    report.save()

    def progress(fields: dict[str, Any]) -> None:
        record.update(fields)
        report.save()

    usage = DeviceUsage(args.device)
    start = time.perf_counter()
    try:
        with usage:
            record.update(body(args, progress))
        record["status"] = "ok"
    except BaseException as exc:  # recorded; after an Exception the other parts still run
        record["status"] = "error" if isinstance(exc, Exception) else "interrupted"
        record["error"] = f"{type(exc).__name__}: {exc}"
        record["traceback"] = traceback.format_exc().splitlines()[-12:]
        traceback.print_exc()
        if not isinstance(exc, Exception):
            raise
    finally:
        record["seconds"] = round(time.perf_counter() - start, 2)
        record.update(usage.summary())
        with contextlib.suppress(OSError):
            record["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
        report.save()
    print(f"[{name}] {record['status']} in {record['seconds']} s", file=sys.stderr, flush=True)
    return record


@contextlib.contextmanager
def torch_threads(count: int) -> Iterator[None]:
    """torch's intra-op threads set to ``count`` within the block: a policy that only launches
    kernels, or runs beside env workers on every core, must not spin a thread per core."""
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        yield
    finally:
        torch.set_num_threads(before)


# -- the parts ---------------------------------------------------------------------------------


def nature_cnn_policy(env_id: str, device: torch.device) -> torch.nn.Module:
    """The trainers' actor-critic (Nature-CNN torso) for ``env_id``'s Atari set-up, on
    ``device``."""
    probe = make_env_fn(env_id, atari=True, training=False)()
    try:
        policy = ActorCritic(probe.observation_space, probe.action_space, network="cnn")
    finally:
        probe.close()
    return policy.to(device).eval()


def rollout_rate(
    env_id: str,
    num_envs: int,
    backend: str,
    policy: torch.nn.Module,
    args: argparse.Namespace,
    device: str | None = None,
    **options: Any,
) -> float:
    """Steps/s of Pong on ``backend`` with ``policy`` in the loop, ``args.workers`` workers,
    the policy on ``device`` (default ``args.device``)."""
    device = str(args.device) if device is None else device
    if backend == "action_server":
        options["device"] = device
    envs = vecaccel.make_vec(
        [make_env_fn(env_id, atari=True, training=False)] * num_envs,
        backend=backend,
        num_workers=min(args.workers, num_envs),
        **options,
    )
    try:
        return policy_steps_per_second(envs, policy, args.seconds, device=device)
    finally:
        envs.close()


def part_check(
    args: argparse.Namespace, progress: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """The action-server checks, then the check's speed with and without alternation."""
    factory = make_env_fn(args.env, atari=True, training=False)
    policy = nature_cnn_policy(args.env, args.device)
    with torch_threads(1):
        report = check_action_server(
            [factory] * min(args.check_envs, 8),
            str(args.device),
            num_workers=min(args.workers, 8),
        )
        progress({"checks": report})
        rates = {
            f"alternating={alternating}": rollout_rate(
                args.env, args.check_envs, "action_server", policy, args, alternating=alternating
            )
            for alternating in (False, True)
        }
    return {"checks": report, "num_envs": args.check_envs, "steps_per_s": rates}


def part_action_server(
    args: argparse.Namespace, progress: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """``shm`` + the policy against ``action_server``, plain and alternating, in one run, and
    the two parts of a step alone: a lock-step env step, and a forward with the actions back."""
    policy = nature_cnn_policy(args.env, args.device)
    n = args.server_envs
    with torch_threads(1):
        rates = {
            "shm": rollout_rate(args.env, n, "shm", policy, args),
            "action_server": rollout_rate(args.env, n, "action_server", policy, args),
            "action_server_alternating": rollout_rate(
                args.env, n, "action_server", policy, args, alternating=True
            ),
        }
        progress({"steps_per_s": rates})
        # the env alone: shm with constant actions, no copy to the device
        alone = argparse.Namespace(**{**vars(args), "seconds": args.seconds / 2})
        env_rate = rollout_rate(args.env, n, "shm", _constant_actions, alone, device="cpu")
        # the policy alone, on observations already on the device, its actions copied back
        obs = torch.randint(0, 256, (n, *policy.observation_space.shape), dtype=torch.uint8)
        obs = obs.to(args.device)
        with torch.inference_mode():
            _, forward_rate = _calls_per_second(lambda: policy(obs)[0].cpu(), args.seconds / 2)
    step_s, forward_s = n / env_rate, 1.0 / forward_rate
    return {
        "num_envs": n,
        "num_workers": min(args.workers, n),
        "steps_per_s": rates,
        "alternating_vs_shm": rates["action_server_alternating"] / rates["shm"],
        "alternating_vs_plain": rates["action_server_alternating"] / rates["action_server"],
        "env_step_ms": step_s * 1e3,
        "forward_ms": forward_s * 1e3,
        # a loop that waits for each in turn, with no other cost; and one where the workers
        # simulate while the device computes, bound by the slower of the two
        "serial_bound_steps_per_s": n / (step_s + forward_s),
        "overlap_bound_steps_per_s": n / max(step_s, forward_s),
    }


def _constant_actions(obs: torch.Tensor) -> torch.Tensor:
    return torch.zeros(obs.shape[0], dtype=torch.int64)


class TimedPPO(PPO):
    """PPO that adds up the wall-clock seconds of its updates (the rest is collection)."""

    update_seconds = 0.0

    def update(self, batch: Any, progress_remaining: float = 1.0) -> dict[str, float]:
        start = time.perf_counter()
        # the metrics come back as Python floats, so the device is idle when this returns
        metrics = super().update(batch, progress_remaining)
        self.update_seconds += time.perf_counter() - start
        return metrics


def part_ppo(
    args: argparse.Namespace, progress: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """PPO on Pong for a fixed wall-clock: SPS, where the time went, and the return curve."""
    batch = args.ppo_envs * args.ppo_steps
    setup_start = time.perf_counter()
    agent = TimedPPO(
        args.env,
        preset="atari-large",
        backend="action_server",
        alternating=args.ppo_alternating,
        device=str(args.device),
        num_envs=args.ppo_envs,
        num_steps=args.ppo_steps,
        num_minibatches=max(1, batch // args.ppo_minibatch),
        lr_scaling=args.ppo_lr_scaling,
        base_batch_size=1024,
        bf16="on",
        channels_last=True,
        num_workers=min(args.workers, args.ppo_envs),
        seed=args.seed,
        run_dir=None,
        checkpoint_every=0,
        progress=False,
        tensorboard=False,
    )
    settings = {
        "num_envs": args.ppo_envs,
        "num_steps": args.ppo_steps,
        "batch_size": agent.batch_size,
        "num_minibatches": agent.config.num_minibatches,
        "learning_rate": agent.learning_rate,
        "lr_scaling": agent.config.lr_scaling,
        "lr_scale": agent.lr_scale,
        "alternating": agent.config.alternating,
        "num_workers": agent.envs.num_workers,
        "bf16": bool(agent.model.encoder.bf16),
        "channels_last": bool(agent.model.encoder.channels_last),
        "anneal_steps": args.ppo_anneal_steps,
    }
    result: dict[str, Any] = {
        "settings": settings,
        "setup_seconds": round(time.perf_counter() - setup_start, 2),
        "return_window": args.return_window,
        "return_target": args.return_target,
        "reached_target": None,
        "curve": [],
    }
    window: deque[float] = deque(maxlen=args.return_window)
    curve = result["curve"]
    saved = [-math.inf]  # the first update is saved, then one every 30 s
    start = time.perf_counter()
    cpu_start = os.times()

    def record(agent: TimedPPO, metrics: dict[str, Any]) -> bool:
        seconds = time.perf_counter() - start
        returns = [float(r) for r in agent.last_episodes.returns]
        window.extend(returns)
        running = float(np.mean(window)) if window else None
        curve.append(
            {
                "seconds": round(seconds, 2),
                "agent_steps": int(agent.global_step),
                "updates": int(agent.num_updates),
                "episodes": len(returns),
                "mean_return": float(np.mean(returns)) if returns else None,
                "running_mean_return": running,
                "sps": round(float(metrics["charts/SPS"]), 1),
            }
        )
        full = len(window) == window.maxlen
        if result["reached_target"] is None and full and running >= args.return_target:
            reached = {k: curve[-1][k] for k in ("seconds", "agent_steps", "updates")}
            result["reached_target"] = reached
        if seconds - saved[0] >= 30.0:  # a run stopped now keeps the curve so far
            saved[0] = seconds
            progress(result)
        return seconds < args.ppo_seconds

    try:
        agent.learn(total_timesteps=args.ppo_anneal_steps, callback=record)
    except KeyboardInterrupt:  # SIGTERM or Ctrl-C: the curve so far is kept, then re-raised
        progress(result)
        raise
    finally:
        seconds = time.perf_counter() - start
        steps, update_seconds = int(agent.global_step), agent.update_seconds
        agent.close()  # the workers are reaped here: their CPU time counts from now on
        cpu_end = os.times()
    final = next((p["running_mean_return"] for p in reversed(curve) if p["episodes"]), None)
    parent_cpu = cpu_end.user + cpu_end.system - cpu_start.user - cpu_start.system
    # the workers' CPU time is counted when close() reaps them, over their whole lives (their
    # start-up too); none when they are not this process's children (a forkserver's)
    workers_cpu = (
        cpu_end.children_user
        + cpu_end.children_system
        - cpu_start.children_user
        - cpu_start.children_system
    )
    result.update(
        train_seconds=round(seconds, 2),
        agent_steps=steps,
        sps=steps / seconds,
        update_share=update_seconds / seconds,
        # this process: sampler, policy and learner (1.0 is one core busy all along)
        parent_cpu_share=parent_cpu / seconds,
        # the env workers, as a share of the cores they had
        workers_cpu_share=workers_cpu / (seconds * settings["num_workers"]) or None,
        final_running_mean_return=final,
    )
    return result


def part_dqn(
    args: argparse.Namespace, progress: Callable[[dict[str, Any]], None]
) -> dict[str, Any]:
    """Updates/s of the DQN family at each batch size, on a replay buffer of Pong transitions.

    One agent (the preset's networks and learning rate) serves every batch size: the rate of
    an update does not depend on its learning rate.
    """
    cuda = args.device.type == "cuda"
    workers = min(args.workers, 16)
    fill = args.dqn_fill
    agent = DQN(
        args.env,
        preset=args.dqn_preset,
        backend="shm",
        num_envs=workers,
        num_workers=workers,
        device=str(args.device),
        buffer_size=fill,
        learning_starts=fill + workers,  # the fill collects only; the updates are timed below
        bf16="on" if cuda else "off",
        channels_last=cuda,
        seed=args.seed,
        checkpoint_every=0,
        checkpoint_replay=False,
        log_every_steps=fill,
        progress=False,
        tensorboard=False,
    )
    rows = []
    try:
        agent.learn(fill)
        for batch_size in args.dqn_batch_sizes:
            # as a training loop runs it: a batch drawn from the replay (on the CPU), copied to
            # the device, one update
            updates, rate = _calls_per_second(
                lambda size=batch_size: agent.update(agent.buffer.sample(size)), args.seconds
            )
            # the update alone, on one batch already on the device
            batch = agent.buffer.sample(batch_size)
            batch = batch._replace(
                **{
                    name: torch.as_tensor(getattr(batch, name), device=args.device)
                    for name in ("obs", "action", "reward", "next_obs", "discount", "weights")
                }
            )
            _, update_only = _calls_per_second(lambda b=batch: agent.update(b), args.seconds)
            rows.append(
                {
                    "batch_size": batch_size,
                    "updates": updates,
                    "updates_per_s": rate,
                    "samples_per_s": rate * batch_size,
                    "update_only_per_s": update_only,
                }
            )
            progress({"rates": rows})
        preset = agent.config
        described = {
            "categorical": preset.categorical,
            "double": preset.double,
            "dueling": preset.dueling,
            "bf16": preset.bf16,
            "channels_last": preset.channels_last,
        }
    finally:
        agent.close()
    return {
        "preset": args.dqn_preset,
        "settings": described,
        "replay_transitions": fill,
        "rates": rows,
        "samples_per_s_large_vs_small": rows[-1]["samples_per_s"] / rows[0]["samples_per_s"],
    }


def _calls_per_second(call: Callable[[], Any], seconds: float) -> tuple[int, float]:
    """``(calls, calls per second)`` of ``call`` repeated for ``seconds``, after 3 untimed calls
    (kernels chosen, the allocator grown). DQN's update returns Python floats, so each call
    ends with the device idle."""
    for _ in range(3):
        call()
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        call()
        calls += 1
    return calls, calls / (time.perf_counter() - start)


BODIES: dict[str, PartBody] = {
    "check": part_check,
    "action_server": part_action_server,
    "dqn": part_dqn,
    "ppo": part_ppo,
}


# -- the report --------------------------------------------------------------------------------


def plot(records: list[dict[str, Any]], path: Path, title: str) -> None:
    """One figure: PPO's return against seconds and agent steps, rollout rates, DQN update rates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    parts = {r["part"]: r for r in records if r["status"] == "ok"}
    # a PPO run stopped part-way keeps the curve it had saved
    ppo = next((r for r in records if r["part"] == "ppo" and r.get("curve")), None)
    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    (by_seconds, by_steps), (server, dqn) = axes
    points = [p for p in ppo["curve"] if p["running_mean_return"] is not None] if ppo else []
    for axis, key, label in (
        (by_seconds, "seconds", "wall-clock seconds of training"),
        (by_steps, "agent_steps", "agent steps"),
    ):
        if points:
            axis.plot([p[key] for p in points], [p["running_mean_return"] for p in points])
            axis.axhline(ppo["return_target"], color="gray", linestyle=":")
        else:
            empty = "no episode ended" if ppo else "not run"
            axis.text(0.5, 0.5, empty, ha="center", transform=axis.transAxes)
        axis.set_xlabel(label)
        axis.set_ylabel(f"PPO return (mean of last {ppo['return_window'] if ppo else '-'})")
        axis.grid(alpha=0.3)
    if ppo:
        last = ppo["curve"][-1]
        by_seconds.set_title(f"PPO on Pong: {last['agent_steps'] / last['seconds']:,.0f} SPS")
    if "action_server" in parts:
        rates = parts["action_server"]["steps_per_s"]
        server.bar(list(rates), list(rates.values()), color=["C0", "C1", "C2"])
        for key, style, label in (
            ("serial_bound_steps_per_s", ":", "env step + forward, in turn"),
            ("overlap_bound_steps_per_s", "--", "the slower of the two, overlapped"),
        ):
            server.axhline(parts["action_server"][key], color="gray", linestyle=style, label=label)
        server.legend(fontsize="small")
        server.set_title(
            f"rollout with the policy on the device, {parts['action_server']['num_envs']} envs"
        )
    server.set_ylabel("env steps / s")
    if "dqn" in parts:
        rows = parts["dqn"]["rates"]
        where = np.arange(len(rows))
        for shift, key, label in (
            (-0.2, "updates_per_s", "sampled from the replay, then updated"),
            (0.2, "update_only_per_s", "the update alone"),
        ):
            dqn.bar(where + shift, [r[key] for r in rows], width=0.4, label=label)
        dqn.set_xticks(where, [f"batch {r['batch_size']}" for r in rows])
        dqn.set_yscale("log")
        dqn.legend(fontsize="small")
        dqn.set_title(f"DQN family ({parts['dqn']['preset']}): updates / s")
    dqn.set_ylabel("updates / s")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="folder for gpu_run.json and gpu_run.png")
    parser.add_argument("--smoke", action="store_true", help="every part on the CPU, tiny sizes")
    parser.add_argument("--parts", default=",".join(PARTS), help=", ".join(PARTS))
    for name, value in FULL.items():
        flag = "--" + name.replace("_", "-")
        shown, smoke = (
            " ".join(map(str, v)) if isinstance(v, list) else v for v in (value, SMOKE[name])
        )
        meaning = f"{MEANING[name]} (default {shown}; with --smoke {smoke})"
        if isinstance(value, list):
            parser.add_argument(flag, type=int, nargs="+", default=None, help=meaning)
        else:
            parser.add_argument(flag, type=type(value), default=None, help=meaning)
    parser.add_argument(
        "--ppo-alternating",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="PPO's action server serves two alternating halves of its envs",
    )
    parser.add_argument(
        "--ppo-lr-scaling",
        default="sqrt",
        choices=["none", "linear", "sqrt"],
        help="PPO's learning rate scaled from its 1,024-sample base (default %(default)s)",
    )
    parser.add_argument(
        "--return-window", type=int, default=20, help="episodes in PPO's running mean return"
    )
    parser.add_argument(
        "--return-target",
        type=float,
        default=18.0,
        help="running mean return whose first crossing is recorded (default %(default)s)",
    )
    parser.add_argument(
        "--dqn-preset", default="atari-c51", help="DQN-family preset (default %(default)s)"
    )
    parser.add_argument(
        "--env", default="PongNoFrameskip-v4", help="ALE env id (default %(default)s)"
    )
    parser.add_argument(
        "--seed", type=int, default=1, help="seed of PPO and DQN (default %(default)s)"
    )
    args = parser.parse_args(argv)
    profile = SMOKE if args.smoke else FULL
    for name, value in profile.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    parts = args.parts.split(",")
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        parser.error(f"--parts: unknown {unknown}; choose from {', '.join(PARTS)}")
    args.parts = parts
    if args.check_envs < 2 or args.check_envs % 2 or args.server_envs % 2:
        parser.error("--check-envs and --server-envs must be even (alternating halves)")
    args.device = torch.device(args.device)
    if args.device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device here: use --smoke (or --device cpu) to run on the CPU")
    return args


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _interrupt)
    args.out.mkdir(parents=True, exist_ok=True)
    cuda = args.device.type == "cuda"
    device_name = torch.cuda.get_device_name(args.device) if cuda else "cpu"
    options = {
        k: str(v) if isinstance(v, (Path, torch.device)) else v for k, v in vars(args).items()
    }
    report = Report(
        args.out / "gpu_run.json",
        # as run from the repository root, wherever this run's working folder is
        RunRecord(command_line(argv, "benchmarks/gpu/gpu_run.py")),
        device=device_name,
        torch_version=torch.__version__,
        cuda_version=torch.version.cuda,
        options=options,
    )
    finished = False
    try:
        for name in args.parts:
            run_part(name, BODIES[name], args, report)
        finished = True
    finally:
        report.save(complete=finished)
        total = time.perf_counter() - report.started
        title = f"vecaccel on {device_name}, {total:.0f} s in all"
        plot(report.records, args.out / "gpu_run.png", title)
    failed = [r["part"] for r in report.records if r["status"] != "ok"]
    print(f"wrote {args.out / 'gpu_run.json'} and gpu_run.png in {total:.0f} s", file=sys.stderr)
    if failed:
        print(f"failed parts: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


# The guard matters: worker processes started with spawn or forkserver re-import this file.
if __name__ == "__main__":
    raise SystemExit(main())
