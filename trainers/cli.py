"""``vecaccel train`` and ``vecaccel eval``, contributed to the command line through the hook.

The plugin manager imports this module when it is built, so nothing here imports torch or an
algorithm at module level: each algorithm's flags are generated from its config dataclass (the
field docstrings are the ``--help`` text) only when that algorithm's sub-command is parsed.

Example:
    >>> import argparse
    >>> parser = argparse.ArgumentParser(prog="vecaccel")
    >>> vecaccel_add_commands(parser.add_subparsers())
    >>> args = parser.parse_args(["train", "ppo", "--env", "CartPole-v1", "--num-steps", "64"])
    >>> args.algo, args.env, args.config["num_steps"]
    ('ppo', 'CartPole-v1', 64)
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import inspect
import sys
import time
import types
import typing
from pathlib import Path
from typing import Any

from vecaccel import hookimpl

__all__ = ["ALGORITHMS", "eval_command", "train_command", "vecaccel_add_commands"]

#: algorithm name -> (module, class); DQN-family modules are another helper's and load lazily.
ALGORITHMS: dict[str, tuple[str, str]] = {
    "a2c": ("vecaccel.trainers.a2c", "A2C"),
    "ppo": ("vecaccel.trainers.ppo", "PPO"),
    "dqn": ("vecaccel.trainers.dqn", "DQN"),
    "c51": ("vecaccel.trainers.dqn", "C51"),
    "rainbow": ("vecaccel.trainers.dqn", "Rainbow"),
}

#: config fields that have a common flag of their own
_COMMON_FIELDS = {"env_id", "num_envs", "backend", "seed", "device"}
CHECKPOINT_NAME = "checkpoint.pt"


# -- resolving an algorithm lazily ------------------------------------------------------------


def _algorithm_class(algo: str) -> type:
    module_path, class_name = ALGORITHMS[algo]
    return getattr(importlib.import_module(module_path), class_name)


def _config_class(algo: str) -> type:
    return _algorithm_class(algo).config_cls


def _presets(algo: str) -> dict[str, dict[str, Any]]:
    return dict(getattr(importlib.import_module(ALGORITHMS[algo][0]), "PRESETS", {}))


def _aliases(config_cls: type) -> dict[str, str]:
    """Earlier flag spellings of ``config_cls``'s settings: old name -> current field.

    They are the config's renamed settings (``ALIASES``) and the keywords its constructor takes
    beside its fields (``InitVar`` spellings converted on the way in).
    """
    fields = {field.name for field in dataclasses.fields(config_cls)}
    aliases = dict(getattr(config_cls, "ALIASES", {}))
    for name in inspect.signature(config_cls).parameters:
        if name not in fields and name not in aliases:
            aliases[name] = name
    return aliases


def _field_docs(config_cls: type) -> dict[str, str]:
    from vecaccel.trainers.config import config_help

    return config_help(config_cls)


# -- flag types from annotations --------------------------------------------------------------


def _parse_bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")


def _optional(parse: Any) -> Any:
    def parse_optional(text: str) -> Any:
        if text.strip().lower() in ("none", "auto", "null", ""):
            return None
        return parse(text)

    parse_optional.__name__ = getattr(parse, "__name__", "value")
    return parse_optional


def _int_tuple(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(part) for part in text.replace(" ", "").split(",") if part)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}"
        ) from None


def _flag_spec(annotation: Any) -> dict[str, Any]:
    """argparse keyword arguments for a dataclass field annotation."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType) and type(None) in args:
        inner = [a for a in args if a is not type(None)]
        spec = _flag_spec(inner[0]) if len(inner) == 1 else {"type": str}
        if spec.get("action") is argparse.BooleanOptionalAction:
            return {"type": _optional(_parse_bool), "metavar": "{true,false,auto}"}
        spec["type"] = _optional(spec.get("type", str))
        return spec
    if annotation is bool:
        return {"action": argparse.BooleanOptionalAction}
    if annotation in (int, float, str):
        return {"type": annotation}
    if origin in (tuple, list) and args and args[0] is int:
        return {"type": _int_tuple, "metavar": "N,N,..."}
    return {"type": str}


class ConfigAction(argparse.Action):
    """Store a config field's value under ``namespace.config[field]``."""

    def __init__(self, option_strings: list[str], dest: str, field: str = "", **kwargs: Any):
        self.field = field
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        config = getattr(namespace, "config", None)
        if config is None:
            config = {}
            namespace.config = config
        if self.nargs == 0:
            values = not (option_string or "").startswith("--no-")
        config[self.field] = values


class AlgorithmParser(argparse.ArgumentParser):
    """An algorithm's sub-parser whose config flags are added when it is first used.

    Importing an algorithm imports torch; deferring it keeps ``vecaccel --help`` and every other
    command free of torch.
    """

    def __init__(self, *args: Any, algo: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.algo = algo
        self._populated = False

    def _populate(self) -> None:
        if self._populated or not self.algo:
            return
        self._populated = True
        try:
            config_cls = _config_class(self.algo)
        except ImportError as exc:
            self.epilog = f"(the {self.algo} trainer cannot be imported: {exc})"
            return
        docs = _field_docs(config_cls)
        hints = typing.get_type_hints(config_cls)
        presets = _presets(self.algo)
        if presets:
            self.add_argument(
                "--preset",
                choices=sorted(presets),
                help="start from a named configuration (explicit flags override it)",
            )
        group = self.add_argument_group(f"{self.algo} configuration")
        class_defaults = _algorithm_class(self.algo).defaults
        for field in dataclasses.fields(config_cls):
            flag = "--" + field.name.replace("_", "-")
            negative = "--no-" + field.name.replace("_", "-")
            taken = self._option_string_actions
            if field.name in _COMMON_FIELDS or flag in taken or negative in taken:
                continue
            spec = _flag_spec(hints.get(field.name, str))
            default = field.default if field.default is not dataclasses.MISSING else None
            if field.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
                default = field.default_factory()  # type: ignore[misc]
            default = class_defaults.get(field.name, default)
            help_text = docs.get(field.name, "").replace("%", "%%")
            help_text = f"{help_text} (default: {default!r})".strip()
            if spec.get("action") is argparse.BooleanOptionalAction:
                group.add_argument(
                    flag,
                    negative,
                    action=ConfigAction,
                    field=field.name,
                    nargs=0,
                    dest="_unused_" + field.name,
                    default=argparse.SUPPRESS,
                    help=help_text,
                )
            else:
                group.add_argument(
                    flag,
                    action=ConfigAction,
                    field=field.name,
                    dest="_unused_" + field.name,
                    default=argparse.SUPPRESS,
                    type=spec.get("type", str),
                    metavar=spec.get("metavar", field.name.upper()),
                    help=help_text,
                )

        for old, new in _aliases(config_cls).items():
            flag = "--" + old.replace("_", "-")
            if flag in self._option_string_actions:
                continue
            hint = hints.get(new, str)
            spec = _flag_spec(getattr(hint, "type", hint))  # an InitVar holds its type
            if new == old:  # a keyword converted on the way in: its own docstring says how
                help_text = docs.get(old, "").replace("%", "%%")
            else:
                help_text = f"the earlier spelling of --{new.replace('_', '-')}"
            group.add_argument(
                flag,
                action=ConfigAction,
                field=old,
                dest="_unused_" + old,
                default=argparse.SUPPRESS,
                type=spec.get("type", str),
                metavar=spec.get("metavar", new.upper()),
                help=help_text,
            )

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[override]
        self._populate()
        return super().parse_known_args(args, namespace)

    def format_help(self) -> str:
        self._populate()
        return super().format_help()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _setup_errors() -> tuple[type[BaseException], ...]:
    """What a bad flag, env or checkpoint raises while a trainer is set up: reported as a
    usage error (exit 2, one line), not a traceback. Errors once training runs are not."""
    import gymnasium as gym

    from vecaccel.errors import WorkerError
    from vecaccel.trainers.checkpoint import CheckpointError

    return (ValueError, TypeError, CheckpointError, WorkerError, gym.error.Error)


#: What a replay-file error tells a Python caller to do, and its command-line equivalent.
_REPLAY_HINT = ("load with load_replay=False", "pass --no-replay")


def _usage_error(exc: BaseException) -> int:
    print(f"error: {str(exc).replace(*_REPLAY_HINT)}", file=sys.stderr)
    return 2


# -- the hook ---------------------------------------------------------------------------------


@hookimpl
def vecaccel_add_commands(subparsers: argparse._SubParsersAction) -> None:
    train = subparsers.add_parser(
        "train",
        help="train an agent (a2c, ppo, dqn, c51, rainbow) with a live progress bar",
        description=(
            "Train an agent on vecaccel's vector envs. Writes metrics.csv, TensorBoard event "
            "files, checkpoint.pt (atomically, every K updates) and learning_curve.png to the "
            "run directory. --resume DIR continues a run from its checkpoint."
        ),
    )
    algos = train.add_subparsers(
        title="algorithms", dest="algo", metavar="ALGO", parser_class=AlgorithmParser
    )
    algos.required = True
    summaries = {
        "a2c": "synchronous advantage actor-critic (large batch)",
        "ppo": "proximal policy optimization",
        "dqn": "DQN (double, dueling, n-step, prioritized replay)",
        "c51": "categorical DQN",
        "rainbow": "epsilon-Rainbow: C51 with every DQN extension but noisy nets",
    }
    for algo, summary in summaries.items():
        parser = algos.add_parser(
            algo,
            algo=algo,
            help=summary,
            description=f"Train {algo.upper()}: {summary}.",
        )
        parser.add_argument("--env", help="Gymnasium environment id (default: the config's)")
        parser.add_argument("--backend", help="vecaccel backend (default: the config's)")
        parser.add_argument("--num-envs", type=_positive_int, help="parallel environments")
        parser.add_argument(
            "--total-steps",
            type=_positive_int,
            help="environment steps to train (with --resume: the run's new total; "
            "default there: the budget the run was started with)",
        )
        parser.add_argument("--seed", type=int, help="seed of the run")
        parser.add_argument("--device", help="torch device: cpu, cuda, cuda:1...")
        parser.add_argument(
            "--run-dir",
            type=Path,
            help="directory for logs and checkpoints (default: runs/ALGO-ENV-SEED-TIME)",
        )
        parser.add_argument(
            "--resume",
            type=Path,
            metavar="DIR",
            help="continue the run in DIR from DIR/checkpoint.pt",
        )
        parser.add_argument(
            "--no-progress", action="store_true", help="no progress bar (e.g. in CI logs)"
        )
        parser.add_argument(
            "--no-tensorboard", action="store_true", help="no TensorBoard event files"
        )
        parser.add_argument(
            "--nproc",
            type=_positive_int,
            default=None,
            metavar="K",
            help="data-parallel training on K ranks of this machine: launches "
            "`torchrun --standalone --nproc_per_node K -m vecaccel train ...` (each rank its own "
            "envs, with --async its own sampler process, gradients all-reduced; --total-steps "
            "is the total over ranks)",
        )
        mode = parser.add_mutually_exclusive_group()
        if algo in ("dqn", "c51", "rainbow"):
            mode.add_argument(
                "--async",
                dest="async_mode",
                action="store_true",
                help="asynchronous mode: a sampler process steps the envs while this process "
                "trains from a shared-memory replay buffer, the replay ratio enforced by "
                "throttling both",
            )
            parser.add_argument(
                "--no-replay",
                dest="no_replay",
                action="store_true",
                help="with --resume: start with an empty replay buffer instead of the one saved "
                "with the checkpoint (when its replay file is missing or corrupt)",
            )
            parser.add_argument(
                "--async-fixed-lag",
                dest="async_fixed_lag",
                action=argparse.BooleanOptionalAction,
                default=None,
                help="with --async: the sampler collects chunks of half --async-max-lead env "
                "steps, each with the weights of two chunks before, and this process adds them "
                "to the replay buffer in order, so that a seeded run repeats (default: off; "
                "with --resume: as the run was trained)",
            )
        else:
            mode.add_argument(
                "--async",
                dest="async_mode",
                action="store_true",
                help="asynchronous mode: a rollout process collects the next batch into a "
                "shared-memory double buffer while this process trains on the last one "
                "(policy lag logged as charts/policy_lag)",
            )
            parser.add_argument(
                "--async-weight-sync-period",
                dest="async_weight_sync_period",
                type=_positive_int,
                default=None,
                metavar="K",
                help="with --async: updates between weight copies to the rollout process "
                "(default: 1; with --resume: the run's own)",
            )
            parser.add_argument(
                "--async-fixed-lag",
                dest="async_fixed_lag",
                action=argparse.BooleanOptionalAction,
                default=None,
                help="with --async: collect batch n with the weights of update n-1 exactly, so "
                "that a seeded run repeats (needs --async-weight-sync-period 1; default: off; "
                "with --resume: as the run was trained)",
            )
        mode.add_argument(
            "--sync",
            dest="sync_mode",
            action="store_true",
            help="synchronous mode, the default for a new run; with --resume: go on "
            "synchronously even if the run was trained with --async (by default a resumed run "
            "keeps the mode its checkpoint records)",
        )
        parser.set_defaults(handler=train_command, config=None, async_mode=False, sync_mode=False)

    evaluate = subparsers.add_parser(
        "eval",
        help="evaluate a saved agent for N episodes, optionally recording a video",
        description=(
            "Load a checkpoint (a file or a run directory) written by `vecaccel train` and play "
            "full episodes without the training-only wrappers (no reward clipping, no life-loss "
            "terminals). Prints the mean, std, min and max return."
        ),
    )
    evaluate.add_argument("checkpoint", type=Path, help="checkpoint file or run directory")
    evaluate.add_argument(
        "--episodes", type=_positive_int, default=10, help="episodes (default: 10)"
    )
    evaluate.add_argument("--video", type=Path, metavar="OUT.mp4", help="record the first episode")
    evaluate.add_argument("--seed", type=int, default=0, help="seed of the first episode")
    evaluate.add_argument(
        "--stochastic", action="store_true", help="sample actions instead of taking the mode"
    )
    evaluate.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    evaluate.add_argument("--env", help="environment id (default: the one the agent trained on)")
    evaluate.set_defaults(handler=eval_command)


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


def _env_id(args: argparse.Namespace, config_cls: type, *sources: dict[str, Any]) -> str | None:
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

    from vecaccel.trainers import distributed
    from vecaccel.trainers.signals import TrainingInterrupted

    nproc = getattr(args, "nproc", None)
    if nproc is not None and nproc > 1 and "LOCAL_RANK" not in os.environ:
        argv = getattr(args, "argv", None) or sys.argv[1:]
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
    cls = _algorithm_class(args.algo)
    explicit = _explicit_config(args)
    runtime = {"progress": not args.no_progress, "tensorboard": not args.no_tensorboard}
    if args.resume is not None:
        return _resume(args, cls, explicit, runtime, fixed_lag, weight_sync_period)
    if getattr(args, "no_replay", False):
        print("error: --no-replay only applies with --resume", file=sys.stderr)
        return 2
    preset_name = getattr(args, "preset", None)
    config = {**(_presets(args.algo)[preset_name] if preset_name else {}), **explicit}
    env_id = _env_id(args, cls.config_cls, config)
    config.pop("env_id", None)
    if env_id is None:
        print("error: --env is required", file=sys.stderr)
        return 2
    if args.total_steps is None:
        print("error: --total-steps is required (unless --resume)", file=sys.stderr)
        return 2
    run_dir = args.run_dir or _default_run_dir(args.algo, env_id, config, cls.config_cls)
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
    except _setup_errors() as exc:
        return _usage_error(exc)
    if args.async_mode:
        # under torchrun each rank runs its own sampler process; the optimisers are data-parallel
        from vecaccel.trainers import async_runner

        return async_runner.train_async(
            cls,
            env_id,
            args.total_steps,
            run_dir=str(run_dir),
            weight_sync_period=weight_sync_period,
            fixed_lag=fixed_lag,
            **runtime,
            **config,
        )
    try:
        agent = cls(env_id, run_dir=str(run_dir), **runtime, **config)
    except _setup_errors() as exc:
        return _usage_error(exc)
    try:
        agent.learn(args.total_steps)
    finally:
        agent.close()
    if agent.is_main and args.no_progress:
        _print_run_dir(Path(run_dir))
    return 0


def _resume(
    args: argparse.Namespace,
    cls: type,
    explicit: dict[str, Any],
    runtime: dict[str, Any],
    fixed_lag: bool | None,
    weight_sync_period: int | None,
) -> int:
    """``vecaccel train ALGO --resume DIR``: continue the run of DIR's checkpoint."""
    from vecaccel.trainers.checkpoint import CheckpointError, load_checkpoint

    run_dir = args.run_dir or (args.resume if args.resume.is_dir() else args.resume.parent)
    checkpoint = args.resume / CHECKPOINT_NAME if args.resume.is_dir() else args.resume
    try:
        state = load_checkpoint(checkpoint)
    except (CheckpointError, FileNotFoundError) as exc:
        print(f"error: cannot resume: {exc}", file=sys.stderr)
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
    except _setup_errors() as exc:
        return _usage_error(exc)
    # a run trained asynchronously goes on asynchronously (its checkpoint says so), unless
    # --sync asks otherwise; the DQN family's replay file is read by either mode
    wants_async = bool(args.async_mode or state.get("async", False))
    if wants_async and not args.sync_mode:
        from vecaccel.trainers import async_runner

        try:
            return async_runner.resume_async(
                cls,
                checkpoint,
                env_id,
                args.total_steps,
                weight_sync_period=weight_sync_period,
                fixed_lag=fixed_lag,
                **load_options,
                **explicit,
            )
        except CheckpointError as exc:  # a missing or corrupt replay file, say
            return _usage_error(exc)
    try:
        agent = cls.load(checkpoint, env=env_id, **load_options, **explicit)
    except _setup_errors() as exc:
        return _usage_error(exc)
    try:
        step = agent.global_step
        if agent.is_main:  # one line for the run, not one per rank
            print(f"resuming {args.algo} from {checkpoint} at step {step}", file=sys.stderr)
        if args.total_steps is not None:
            agent.set_target_steps(args.total_steps)
        if agent.target_steps is None:
            print("error: the checkpoint records no budget; pass --total-steps", file=sys.stderr)
            return 2
        if step >= agent.target_steps:
            print(
                f"the run is complete ({step} of {agent.target_steps} steps); pass a larger "
                "--total-steps to extend it",
                file=sys.stderr,
            )
            return 0
        agent.learn()
    finally:
        agent.close()
    return 0


def _default_run_dir(algo: str, env_id: str, config: dict[str, Any], config_cls: type) -> Path:
    """``runs/ALGO-ENV-SEED-TIME``; under torchrun the time is the launcher's run id, or each
    rank would stamp its own."""
    import os

    seed = config.get("seed", config_cls().seed)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    if os.environ.get("TORCHELASTIC_RUN_ID") and "RANK" in os.environ:
        stamp = os.environ["TORCHELASTIC_RUN_ID"]
    return Path("runs") / f"{algo}-{env_id.replace('/', '_')}-{seed}-{stamp}"


def _print_run_dir(run_dir: Path) -> None:
    curve = run_dir / "learning_curve.png"
    print(
        f"run directory: {run_dir}  checkpoint: {run_dir / CHECKPOINT_NAME}"
        + (f"  learning curve: {curve}" if curve.exists() else ""),
        file=sys.stderr,
    )


def _preflight(config_cls: type, env_id: str, config: dict[str, Any]) -> None:
    """Check what can be checked before any process starts (the async runners start theirs
    first): the config's values, the backend, and that the env id is registered."""
    import gymnasium as gym

    import vecaccel
    from vecaccel.manager import register_envs

    names = {field.name for field in dataclasses.fields(config_cls)}
    values = {key: value for key, value in config.items() if key in names}
    if "env_id" in names:
        values["env_id"] = env_id
    cfg = config_cls(**values)
    if cfg.backend not in vecaccel.list_backends():
        raise ValueError(
            f"unknown backend {cfg.backend!r}; registered: {', '.join(vecaccel.list_backends())}"
        )
    register_envs()
    gym.spec(env_id)  # gymnasium.error.Error naming the id (and close matches) if unknown


def eval_command(args: argparse.Namespace) -> int:
    """Handle ``vecaccel eval CHECKPOINT``; returns the exit code."""
    from vecaccel.trainers.checkpoint import CheckpointError, load_checkpoint

    path = args.checkpoint / CHECKPOINT_NAME if args.checkpoint.is_dir() else args.checkpoint
    try:
        state = load_checkpoint(path)
    except (CheckpointError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    algo = state.get("algo") or str(state.get("algorithm", "")).lower()
    if algo not in ALGORITHMS:
        print(f"error: {path} holds no known algorithm (algo={algo!r})", file=sys.stderr)
        return 2
    cls = _algorithm_class(algo)
    try:
        agent = cls.load(path, device=args.device)
    except _setup_errors() as exc:
        return _usage_error(exc)
    config = state.get("config", {})
    env_id = args.env or config.get("env_id") or state.get("env_id")
    if env_id is None:
        print("error: the checkpoint names no env; pass --env", file=sys.stderr)
        return 2
    from vecaccel.trainers.checkpoint import check_env_matches
    from vecaccel.trainers.envs import make_env_fn

    try:
        env = make_env_fn(env_id, config.get("atari"), training=False)()
        try:
            check_env_matches(
                env_id,
                env.observation_space,
                env.action_space,
                agent.observation_space,
                agent.action_space,
            )
        finally:
            env.close()
    except _setup_errors() as exc:
        return _usage_error(exc)
    try:
        returns, lengths = evaluate_agent(
            agent,
            env_id,
            episodes=args.episodes,
            seed=args.seed,
            deterministic=not args.stochastic,
            atari=config.get("atari"),
            video=args.video,
        )
    except RuntimeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    import numpy as np

    print(
        f"{algo} on {env_id}: {len(returns)} episodes, return {np.mean(returns):.2f} "
        f"+- {np.std(returns):.2f} (min {np.min(returns):.2f}, max {np.max(returns):.2f}), "
        f"mean length {np.mean(lengths):.1f}"
    )
    if args.video is not None:
        print(f"video: {args.video}")
    return 0


def evaluate_agent(
    agent: Any,
    env_id: str,
    episodes: int = 10,
    seed: int = 0,
    deterministic: bool = True,
    atari: bool | None = None,
    video: Path | None = None,
) -> tuple[list[float], list[int]]:
    """Play ``episodes`` full episodes with ``agent.predict``; returns (returns, lengths).

    The env is built without the training-only wrappers, so the returns are real scores.
    """
    import numpy as np

    from vecaccel.trainers.envs import make_env_fn

    env = make_env_fn(env_id, atari, training=False, render_mode="rgb_array" if video else None)()
    if video is not None:
        try:
            env.reset(seed=seed)
            env.render()
        except Exception as exc:  # e.g. pygame missing for the classic-control renderers
            env.close()
            raise RuntimeError(f"cannot record a video of {env_id}: {exc}") from exc
    frames: list[np.ndarray] = []
    returns: list[float] = []
    lengths: list[int] = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            total, length, done = 0.0, 0, False
            while not done:
                if video is not None and episode == 0:
                    frames.append(env.render())
                action, _ = agent.predict(np.asarray(obs), deterministic=deterministic)
                obs, reward, terminated, truncated, _ = env.step(action)
                total += float(reward)
                length += 1
                done = bool(terminated or truncated)
            returns.append(total)
            lengths.append(length)
        if video is not None and frames:
            _write_video(frames, video, fps=int(env.metadata.get("render_fps", 30) or 30))
    finally:
        env.close()
    return returns, lengths


def _write_video(frames: list[Any], path: Path, fps: int) -> None:
    from moviepy import ImageSequenceClip

    path.parent.mkdir(parents=True, exist_ok=True)
    clip = ImageSequenceClip(list(frames), fps=max(1, min(fps, 60)))
    clip.write_videofile(str(path), logger=None, audio=False)
