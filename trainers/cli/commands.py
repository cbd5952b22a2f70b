"""``vecaccel train`` and ``vecaccel eval``, contributed to the command line through the hook.

The plugin manager imports this module when it is built, so nothing here imports torch or an
algorithm at module level: the algorithms and their summaries come from
:mod:`vecaccel.trainers.config.registry`, and each algorithm's flags (:mod:`.flags`) are generated from
its config dataclass only when that algorithm's sub-command is parsed.

Example:
    >>> from vecaccel.cli import ArgumentParser, Commands
    >>> parser = ArgumentParser(prog="vecaccel")
    >>> vecaccel_add_commands(Commands(parser.add_subparsers()))
    >>> args = parser.parse_args(["train", "ppo", "--env", "CartPole-v1", "--num-steps", "64"])
    >>> args.algo, args.env, args.config["num_steps"]
    ('ppo', 'CartPole-v1', 64)
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

from vecaccel import hookimpl
from vecaccel.cli import Commands
from vecaccel.trainers.checkpoints.format import CHECKPOINT_NAME, checkpoint_file
from vecaccel.trainers.cli.errors import read_checkpoint, setup_errors, usage_error
from vecaccel.trainers.cli.evaluate import DEFAULT_EVAL_EPSILON, eval_command, probability
from vecaccel.trainers.cli.flags import (
    AlgorithmParser,
    add_common_flags,
    add_mode_flags,
    algorithm_class,
    positive_int,
    presets,
)
from vecaccel.trainers.config.registry import ALGORITHMS, algorithms
from vecaccel.trainers.services.logger import refuse_used_run_dir, unused_run_dir

__all__ = [
    "eval_command",
    "train_command",
    "vecaccel_add_commands",
    "vecaccel_register_algorithms",
]


@hookimpl
def vecaccel_register_algorithms(registry: MutableMapping[str, Any]) -> None:
    """Register the bundled algorithms, as a plugin registers its own."""
    for name, info in ALGORITHMS.items():
        registry[name] = info


@hookimpl
def vecaccel_add_commands(commands: Commands) -> None:
    """Add ``vecaccel train ALGO`` (one sub-command per registered algorithm) and
    ``vecaccel eval``."""
    registered = algorithms()
    train = commands.add(
        "train",
        train_command,
        help=f"train an agent ({', '.join(registered)}) with a live progress bar",
        description=(
            "Train an agent on vecaccel's vector envs. Writes metrics.csv, TensorBoard event "
            "files, checkpoint.pt (atomically, every K updates) and learning_curve.png to the "
            "run directory. --resume DIR continues a run from its checkpoint."
        ),
        epilog="Example: vecaccel train ppo --env CartPole-v1 --total-timesteps 100000. Each "
        "algorithm's own flags: vecaccel train ALGO --help.",
    )
    algos = train.add_subparsers(
        title="algorithms", dest="algo", metavar="ALGO", parser_class=AlgorithmParser
    )
    algos.required = True
    for algo, info in registered.items():
        parser = algos.add_parser(
            algo,
            algo=algo,
            add_class_flags=add_mode_flags,
            help=info.summary,
            description=f"Train {info.class_name}: {info.summary}.",
        )
        add_common_flags(parser)
        parser.set_defaults(handler=train_command, config=None, async_mode=False, sync_mode=False)

    evaluate = commands.add(
        "eval",
        eval_command,
        help="evaluate a saved agent for N episodes, optionally recording a video",
        description=(
            "Load a checkpoint (a file or a run directory) written by `vecaccel train` and play "
            "full episodes without the training-only wrappers (no reward clipping, no life-loss "
            "terminals). Prints the mean, std, min and max return."
        ),
    )
    evaluate.add_argument("checkpoint", type=Path, help="checkpoint file or run directory")
    evaluate.add_argument(
        "--episodes", type=positive_int, default=10, help="episodes (default: 10)"
    )
    evaluate.add_argument("--video", type=Path, metavar="OUT.mp4", help="record the first episode")
    evaluate.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    evaluate.add_argument(
        "--stochastic",
        action="store_true",
        help="sample actions instead of taking the most likely one (A2C, PPO: from the policy; "
        "the DQN family: ε-greedy, see --epsilon)",
    )
    evaluate.add_argument(
        "--epsilon",
        type=probability,
        metavar="EPS",
        help="the DQN family's ε with --stochastic (default: the agent's eval_epsilon, or "
        f"{DEFAULT_EVAL_EPSILON} where that is 0)",
    )
    evaluate.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    evaluate.add_argument("--env", help="environment id (default: the one the agent trained on)")


# -- handlers ---------------------------------------------------------------------------------


def _explicit_config(args: argparse.Namespace) -> dict[str, Any]:
    """The config values given on the command line (the common flags among them)."""
    config = dict(args.config or {})
    common = {
        "num_envs": args.num_envs,
        "backend": args.backend,
        "seed": args.seed,
        "device": args.device,
    }
    config.update({key: value for key, value in common.items() if value is not None})
    return config


def _env_id(
    args: argparse.Namespace, config_cls: type[Any], *sources: dict[str, Any]
) -> str | None:
    if args.env:
        return args.env
    for source in sources:
        if source.get("env_id"):
            return source["env_id"]
    default = next((f for f in dataclasses.fields(config_cls) if f.name == "env_id"), None)
    return None if default is None else default.default


def train_command(args: argparse.Namespace) -> int:
    """Handle ``vecaccel train ALGO ...``; returns the exit code."""
    import os

    from vecaccel.trainers.services import distributed
    from vecaccel.trainers.services.signals import TrainingInterrupted

    nproc = getattr(args, "nproc", None)
    if nproc is not None and nproc > 1 and "LOCAL_RANK" not in os.environ:
        argv = getattr(args, "argv", None) or sys.argv[1:]
        if refused := _run_dir_refusal(args):  # refused before any rank starts
            print(refused, file=sys.stderr)
            return 2
        return distributed.launch_torchrun(nproc, distributed.strip_nproc(argv))
    # the ranks meet at a barrier before leaving the process group only when they all got here
    # the same way (done, or stopped by a signal every rank saw); after an error on this rank the
    # others wait in a collective of theirs, and leaving at once makes it fail at once
    every_rank_ends = False
    try:
        code = _train(args)
        every_rank_ends = True
        return code
    except TrainingInterrupted as exc:
        every_rank_ends = True
        print(f"interrupted by {exc.signal_name} at step {exc.step}", file=sys.stderr)
        return exc.exit_code
    finally:
        distributed.cleanup(barrier=every_rank_ends)


def _train(args: argparse.Namespace) -> int:
    # None where not given: a new run takes the defaults, a resumed one what it recorded
    fixed_lag = getattr(args, "async_fixed_lag", None)
    weight_sync_period = getattr(args, "async_weight_sync_period", None)
    cls = algorithm_class(args.algo)
    explicit = _explicit_config(args)
    runtime = {"progress": not args.no_progress, "tensorboard": not args.no_tensorboard}
    if getattr(args, "config_file", None) is not None:
        try:
            explicit = _from_config_file(args, explicit)
        except ValueError as exc:
            return usage_error(exc)
    if args.resume is not None:
        return _resume(args, cls, explicit, runtime, fixed_lag, weight_sync_period)
    if getattr(args, "no_replay", False):
        print("error: --no-replay only applies with --resume", file=sys.stderr)
        return 2
    try:
        config = _with_preset(args, cls, explicit)
    except ValueError as exc:  # a preset made for other envs
        return usage_error(exc)
    env_id = _env_id(args, cls.config_cls, config)
    config.pop("env_id", None)
    if env_id is None:
        print("error: --env is required", file=sys.stderr)
        return 2
    if args.total_timesteps is None:
        print("error: --total-timesteps is required (unless --resume)", file=sys.stderr)
        return 2
    run_dir = args.run_dir or unused_run_dir(
        _default_run_dir(args.algo, env_id, config, cls.config_cls)
    )
    if refused := refuse_used_run_dir(run_dir, args.overwrite):
        print(refused, file=sys.stderr)
        return 2
    fixed_lag = bool(fixed_lag)
    if fixed_lag and weight_sync_period not in (None, 1):
        print(
            "error: --async-fixed-lag needs --async-weight-sync-period 1, got "
            f"{weight_sync_period}",
            file=sys.stderr,
        )
        return 2
    try:
        _preflight(cls.config_cls, env_id, config)
    except setup_errors() as exc:
        return usage_error(exc)
    _announce_preset(args, config["preset"])
    if args.async_mode:
        from vecaccel.envs.source import EnvSource

        if EnvSource.is_module_path(env_id):
            print(
                f"error: --async trains Gymnasium envs; {env_id} is a PettingZoo env (train it "
                "synchronously)",
                file=sys.stderr,
            )
            return 2
        # under torchrun each rank runs its own collector process; the optimisers are data-parallel
        from vecaccel.trainers.cli import async_flags

        code = async_flags.train(
            cls,
            env_id,
            args.total_timesteps,
            run_dir=str(run_dir),
            weight_sync_period=weight_sync_period,
            fixed_lag=fixed_lag,
            **runtime,
            **config,
        )
        if _is_first_rank():
            _print_run_dir(Path(run_dir))
        return code
    try:
        agent = cls(env_id, run_dir=str(run_dir), **runtime, **config)
    except setup_errors() as exc:
        return usage_error(exc)
    try:
        agent.learn(args.total_timesteps)
    finally:
        agent.close()
    if agent.is_main and args.no_progress:
        _print_run_dir(Path(run_dir))
    return 0


#: what a config file records of the run it came from but a new run decides for itself
_RUN_OWN_FIELDS = ("run_dir", "progress", "tensorboard")


def _from_config_file(args: argparse.Namespace, explicit: dict[str, Any]) -> dict[str, Any]:
    """The config of ``--config FILE`` under the flags given (``explicit``); sets the preset
    and the step total the file records where the flags give none."""
    from vecaccel.trainers.config.presets import NONE
    from vecaccel.trainers.services.run_config import config_values, read_run_config

    if args.resume is not None:
        raise ValueError("--config starts a new run; --resume continues one (give one of them)")
    saved = read_run_config(args.config_file)
    if saved.algorithm != args.algo:
        raise ValueError(
            f"{args.config_file} is the config of a {saved.algorithm} run; train it with "
            f"`vecaccel train {saved.algorithm} --config {args.config_file}`"
        )
    config = {k: v for k, v in saved.config.items() if k not in _RUN_OWN_FIELDS}
    config = config_values(config, algorithm_class(args.algo).config_cls)
    preset = config.pop("preset", None)
    if getattr(args, "preset", None) is None:
        # the file holds the preset's values already; applying none keeps them as they are
        args.preset = NONE
        explicit = {**explicit, "preset": preset}
    if args.total_timesteps is None:
        args.total_timesteps = saved.total_timesteps
    return {**config, **explicit}


def _resumed_dir(resume: Path) -> Path:
    """The run directory of ``--resume`` (a run directory or a checkpoint file)."""
    return resume if resume.is_dir() else resume.parent


def _run_dir_refusal(args: argparse.Namespace) -> str | None:
    """The ``error:`` line for a run given a ``--run-dir`` that holds another run (``None``:
    it may go on; with ``--overwrite``, once that run's files are removed). A run continued in
    another directory (``--resume DIR --run-dir OTHER``) gets the check a new run gets."""
    if args.run_dir is None and (args.resume is None or not args.overwrite):
        return None
    if args.resume is None:
        return refuse_used_run_dir(args.run_dir, args.overwrite)
    source = _resumed_dir(args.resume)
    if args.run_dir is not None and Path(args.run_dir).resolve() != source.resolve():
        return refuse_used_run_dir(args.run_dir, args.overwrite)
    if args.overwrite:
        return (
            f"error: --overwrite replaces the run in a new run's --run-dir; --resume continues "
            f"the run of {source} in place (give --run-dir to continue it in another directory)"
        )
    return None


def _resume(
    args: argparse.Namespace,
    cls: type[Any],
    explicit: dict[str, Any],
    runtime: dict[str, Any],
    fixed_lag: bool | None,
    weight_sync_period: int | None,
) -> int:
    """``vecaccel train ALGO --resume DIR``: continue the run of DIR's checkpoint."""
    from vecaccel.trainers.checkpoints.format import CheckpointError

    if getattr(args, "preset", None) is not None:
        print(
            "error: --preset applies to a new run; a resumed run keeps the settings its "
            "checkpoint records (pass flags to change some)",
            file=sys.stderr,
        )
        return 2
    if refused := _run_dir_refusal(args):
        print(refused, file=sys.stderr)
        return 2
    run_dir = args.run_dir or _resumed_dir(args.resume)
    checkpoint = checkpoint_file(args.resume)
    state = read_checkpoint(checkpoint, "cannot resume: ")
    if state is None:
        return 2
    env_id = _env_id(args, cls.config_cls, state.get("config", {}), state)
    if env_id is None:
        print("error: the checkpoint names no env; pass --env", file=sys.stderr)
        return 2
    load_options: dict[str, Any] = {"run_dir": str(run_dir), **runtime}
    if getattr(args, "no_replay", False):
        load_options["load_replay"] = False
    # the checks a new run gets, on the config the resumed run will have: a bad flag
    # (--backend nosuch) is refused here, before a rollout process starts and fails in it
    try:
        _preflight(cls.config_cls, env_id, {**state.get("config", {}), **explicit})
    except setup_errors() as exc:
        return usage_error(exc)
    # a run trained asynchronously goes on asynchronously (its checkpoint says so), unless
    # --sync asks otherwise; the DQN family's replay file is read by either mode
    wants_async = bool(args.async_mode or state.get("async", False))
    if wants_async and not args.sync_mode:
        from vecaccel.trainers.cli import async_flags

        try:
            code = async_flags.resume_async(
                cls,
                checkpoint,
                env_id,
                args.total_timesteps,
                weight_sync_period=weight_sync_period,
                fixed_lag=fixed_lag,
                **load_options,
                **explicit,
            )
        except CheckpointError as exc:  # a missing or corrupt replay file, say
            return usage_error(exc)
        if code == 0 and _is_first_rank():
            _print_run_dir(Path(run_dir))
        return code
    try:
        agent = cls.load(checkpoint, env=env_id, **load_options, **explicit)
    except setup_errors() as exc:
        return usage_error(exc)
    try:
        step = agent.global_step
        if agent.is_main:  # one line for the run, not one per rank
            print(f"resuming {args.algo} from {checkpoint} at step {step}", file=sys.stderr)
        if args.total_timesteps is not None:
            agent.set_target_steps(args.total_timesteps)
        if agent.target_steps is None:
            print(
                "error: the checkpoint records no budget; pass --total-timesteps", file=sys.stderr
            )
            return 2
        if step >= agent.target_steps:
            print(
                f"the run is complete ({step} of {agent.target_steps} steps); pass a larger "
                "--total-timesteps to extend it",
                file=sys.stderr,
            )
            return 0
        agent.learn()
    finally:
        agent.close()
    if agent.is_main and args.no_progress:  # with a progress bar, the runner says it
        _print_run_dir(Path(run_dir))
    return 0


def _with_preset(
    args: argparse.Namespace, cls: type[Any], explicit: dict[str, Any]
) -> dict[str, Any]:
    """The config of a new run: its preset's values (``--preset``, or else the one made for the
    env trained on), then the flags given; the preset's name under ``"preset"``."""
    from vecaccel.trainers.config.presets import AUTO, resolve_preset

    named = presets(args.algo)
    chosen = getattr(args, "preset", None)
    # a named preset is checked against the env given (its own env_id fits it)
    given = args.env or explicit.get("env_id")
    env_id = _env_id(args, cls.config_cls, explicit) if chosen is None else given
    name = resolve_preset(args.algo, named, AUTO if chosen is None else chosen, env_id)
    # a config file's record of the preset its values came from stays (its values hold it)
    config = {**(named[name] if name is not None else {}), **explicit}
    config["preset"] = explicit.get("preset", name)
    return config


def _announce_preset(args: argparse.Namespace, name: str | None) -> None:
    """Say in one line, on the first rank only, which preset a run took without ``--preset``:
    once the flags, the backend and the env id have passed their checks, so that the line
    never stands above an error that has nothing to do with it."""
    from vecaccel.trainers.config.presets import ATARI, MINATAR, suited_env_ids

    if getattr(args, "preset", None) is not None or name is None or not _is_first_rank():
        return
    families = {ATARI: "Atari games", MINATAR: "MinAtar games"}
    suits = ", ".join(families.get(env, env) for env in suited_env_ids(args.algo, name))
    print(
        f"preset: {name}, made for {suits} (flags given override it; --preset none for the "
        "plain defaults)",
        file=sys.stderr,
    )


def _default_run_dir(algo: str, env_id: str, config: dict[str, Any], config_cls: type[Any]) -> Path:
    """``runs/ALGO-ENV-SEED-TIME``; under torchrun the time is the launcher's run id, or each
    rank would stamp its own."""
    import os

    seed = config.get("seed", config_cls().seed)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if os.environ.get("TORCHELASTIC_RUN_ID") and "RANK" in os.environ:
        stamp = os.environ["TORCHELASTIC_RUN_ID"]
    return Path("runs") / f"{algo}-{env_id.replace('/', '_')}-{seed}-{stamp}"


def _is_first_rank() -> bool:
    """Whether this process is the only one or rank 0 of a ``torchrun`` launch."""
    import os

    return os.environ.get("RANK", "0") == "0"


def _print_run_dir(run_dir: Path) -> None:
    """The line a run ends with: where its run directory, checkpoint and plot are."""
    curve = run_dir / "learning_curve.png"
    print(
        f"run directory: {run_dir}  checkpoint: {run_dir / CHECKPOINT_NAME}"
        + (f"  learning curve: {curve}" if curve.exists() else ""),
        file=sys.stderr,
    )


def _preflight(config_cls: type[Any], env_id: str, config: dict[str, Any]) -> None:
    """Check what can be checked before any process starts (the async runners start theirs
    first): the config's values, wandb where the run is tracked, the backend, and that the
    env id is registered."""
    import vecaccel
    from vecaccel.manager import unknown_backend_message

    names = {field.name for field in dataclasses.fields(config_cls)}
    values = {key: value for key, value in config.items() if key in names}
    if "env_id" in names:
        values["env_id"] = env_id
    cfg = config_cls(**values)
    if getattr(cfg, "track", False):
        from vecaccel.trainers.services.tracking import wandb_missing, wandb_not_logged_in

        if problem := wandb_missing("--track") or wandb_not_logged_in("--track"):
            raise ValueError(problem)
    registered = vecaccel.list_backends()
    if cfg.backend not in registered:
        raise ValueError(unknown_backend_message(cfg.backend, registered))
    from vecaccel.manager import get_backend
    from vecaccel.trainers.envs.make import backend_options_of, training_vector_fn

    options_cls = get_backend(cfg.backend).options
    if options_cls is not None:  # a misspelled --backend-option: TypeError suggesting the name
        options_cls.from_kwargs(cfg.backend, backend_options_of(cfg))
    # an unknown env id (naming close matches and a missing package), and a source the env
    # cannot have, refused before a process starts
    training_vector_fn(
        env_id,
        getattr(cfg, "atari", None),
        vectorized=getattr(cfg, "vectorized", False),
        env_source=getattr(cfg, "env_source", "gymnasium"),
    )
