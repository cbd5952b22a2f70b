"""``vecaccel bench``: the command's handler and the parsing of its options."""

from __future__ import annotations

import ast
import importlib.util
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from vecaccel.bench.record import RunRecord, check_output_path
from vecaccel.bench.report import format_table, machine_info, plot_results
from vecaccel.bench.sweep import parse_list, run_benchmark
from vecaccel.bench.workloads import resolve_env

__all__ = ["bench_command", "parse_backend_options"]


def parse_backend_options(items: Sequence[str]) -> dict[str, dict[str, Any]]:
    """Parse ``BACKEND.KEY=VALUE`` items (``-o shm.num_workers=2``) into per-backend options.

    Values are Python literals when they parse as one, else strings.

    Example:
        >>> parse_backend_options(["shm.num_workers=2", "shm.context=spawn"])
        {'shm': {'num_workers': 2, 'context': 'spawn'}}
    """
    options: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        backend, dot, name = key.partition(".")
        if not sep or not dot or not backend or not name:
            raise ValueError(f"backend option {item!r} is not of the form BACKEND.KEY=VALUE")
        try:
            value: Any = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            value = raw
        options.setdefault(backend, {})[name] = value
    return options


def bench_command(args: Any) -> int:
    """Handler of ``vecaccel bench`` (see ``vecaccel bench --help``)."""
    try:
        num_envs_list = [int(part) for part in parse_list(args.num_envs) or []]
        backend_options = parse_backend_options(args.option or [])
    except ValueError as exc:
        print(f"vecaccel bench: {exc}", file=sys.stderr)
        return 2
    for flag, path in (("--json", args.json), ("--plot", args.plot)):
        try:
            if path:
                check_output_path(path, flag)
        except ValueError as exc:
            print(f"vecaccel bench: error: {exc}", file=sys.stderr)
            return 2
    if args.plot and importlib.util.find_spec("matplotlib") is None:
        print(
            "vecaccel bench: error: --plot needs matplotlib (pip install vecaccel[bench])",
            file=sys.stderr,
        )
        return 2
    peers = parse_list(args.peers)
    if peers is not None and peers in (["none"], ["-"]):
        peers = []

    def progress(line: str) -> None:
        if not args.quiet:
            print(line, file=sys.stderr, flush=True)

    vectorized = bool(getattr(args, "vectorized", False))
    run_record = RunRecord(
        shlex.join(["vecaccel", *getattr(args, "argv", sys.argv[1:])]), benchmark="vecaccel bench"
    )
    results: list[dict[str, Any]] = []
    try:
        targets = [resolve_env(env) for env in parse_list(args.env) or []]
        for target in targets:
            results += run_benchmark(
                target,
                num_envs_list,
                backends=parse_list(args.backends),
                peers=peers,
                seconds=args.seconds,
                warmup=args.warmup,
                repeat=args.repeat,
                seed=args.seed,
                backend_options=backend_options,
                progress=progress,
                vectorized=vectorized,
            )
    except ValueError as exc:
        print(f"vecaccel bench: {exc}", file=sys.stderr)
        return 2
    info = machine_info()
    print(
        f"\n{info['usable_cpus']} usable CPUs (load average {info['load_average']}), "
        f"Python {info['python']}, {args.seconds} s per measurement, median of {args.repeat}; "
        + (
            "ceiling: one process per usable CPU, each stepping its own native vector env "
            "(num_envs split among them), summed"
            if vectorized
            else "ceiling: one process per usable CPU, each stepping its own raw env, summed"
        )
    )
    print(format_table(results))
    if args.json:
        for row in results:
            if row["kind"] == "ceiling" and row["status"] == "ok" and row["steps_per_s"]:
                if vectorized:  # one native vector env per process, num_envs among them
                    processes = min(info["usable_cpus"], row["num_envs"])
                    extra = {"num_envs": row["num_envs"], "vector_env": True}
                else:  # the row's num_envs is the processes, one raw env each
                    processes, extra = row["num_envs"], {}
                run_record.add_ceiling(row["env"], row["steps_per_s"], processes, **extra)
        try:
            run_record.write(
                args.json,
                results,
                options={
                    "seconds": args.seconds,
                    "warmup": args.warmup,
                    "repeat": args.repeat,
                    "seed": args.seed,
                    "backend_options": backend_options,
                    "vectorized": vectorized,
                },
            )
        except OSError as exc:  # the table above still holds the results
            print(f"vecaccel bench: error: cannot write --json {args.json}: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.json}")
    if args.plot:
        try:
            plot_results(results, args.plot)
        except ImportError:
            print(
                "vecaccel bench: error: --plot needs matplotlib (pip install vecaccel[bench])",
                file=sys.stderr,
            )
            return 1
        except OSError as exc:
            print(f"vecaccel bench: error: cannot write --plot {args.plot}: {exc}", file=sys.stderr)
            return 1
        print(f"wrote {args.plot}")
    return 1 if any(r["status"] == "error" for r in results) else 0
