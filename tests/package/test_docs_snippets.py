"""The code users copy from the README and the docs pages, run as they would run it.

Every Markdown page users read is covered: ``README.md``, every page under ``docs/``, and the
README of each folder under ``benchmarks/`` and ``examples/``.

Each Python block is found by a marker (a line it contains, in exactly one block), written to a
file in a temporary directory and run there with ``python snippet.py`` in a fresh process, as a
user who pastes it into a script would: a missing import, an undefined name or a missing
``if __name__ == "__main__":`` guard (for code that starts processes with ``spawn``) fails here.
Long budgets are cut with exact substitutions, each of which must match the block, so a changed
snippet is noticed rather than silently no longer tested. Every snippet defines what it uses
(a ``policy`` included), so that it runs as pasted; a preamble only adapts the machine (an
optional package's absence, torch's threads on the CPU).

A snippet must also run quietly: a warning on its stderr fails it (on a 2-core machine torch's
threads and the env workers compete, and the examples set torch's threads as the prose advises).

The cheap ``vecaccel ...`` command lines of the bash blocks are run too, in order, in one folder
(``COMMAND_RUNS``: the README's train, resume and ``eval --video`` lines, with budgets cut), with
no warning and no ``error:`` line allowed. ``test_docs_lines.py`` parses every command line and
checks the benchmarks' flags, the ``make`` targets and the links.

Every block of every page is either run here or named with the reason it is not: Python blocks
in ``NOT_RUN``, command lines in ``NOT_RUN_COMMANDS``, other blocks (sample output, TOML) in
``NOT_RUN_BLOCKS``, so a new snippet cannot go untested by accident. Only cheap snippets are
run: learning runs and benchmarks of minutes are cut to a few steps or not run.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from doc_blocks import BLOCKS, COMMANDS, block


def _run_python(tmp_path: Path, code: str, timeout: float) -> None:
    script = tmp_path / "snippet.py"
    script.write_text(code)
    proc = subprocess.run(
        [sys.executable, str(script)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, (
        f"snippet exited with {proc.returncode}\n--- code ---\n{code}\n"
        f"--- stderr (tail) ---\n{proc.stderr[-3000:]}"
    )
    _assert_quiet(proc.stderr, "snippet")


#: Warnings about the machine, not the line: torch's threads adapt to the other processes that
#: keep cores busy (the suite's own workers, in parallel with it), and say so.
MACHINE_WARNINGS = ("TorchThreadsWarning: torch threads",)


def _assert_quiet(stderr: str, what: str) -> None:
    """No warning (``...Warning: ...``) and no ``error:`` line: what a user could not act on."""
    noise = [
        line
        for line in stderr.splitlines()
        if (re.search(r"\w+Warning: ", line) and not any(w in line for w in MACHINE_WARNINGS))
        or line.lower().startswith("error:")
    ]
    assert not noise, f"{what} printed {noise}\n--- stderr (tail) ---\n{stderr[-3000:]}"


# (id, doc, marker, substitutions {old: new} that must each match, preamble, epilogue, timeout)
PYTHON_SNIPPETS = [
    (
        "backends-batch-former",
        "docs/backends.md",
        "batch_wait_s=0.002,",
        {},
        "",
        "",
        60,
    ),
    ("backends-stats", "docs/backends.md", "stats = envs.stats()", {}, "", "", 60),
    (
        "docs-home-quick-start",
        "docs/index.md",
        'make_vec("CartPole-v1", 8, backend="shm")',
        {},
        "",
        "",
        60,
    ),
    (
        "readme-vectorized-envs",
        "README.md",
        'make_vec("CartPole-v1", 64, backend="shm")',
        {"range(1000)": "range(50)"},
        "",
        "",
        60,
    ),
    (
        "readme-async-stepping",
        "README.md",
        'backend="async", batch_size=16, num_workers=8',
        {
            "32, backend=": "8, backend=",
            "batch_size=16, num_workers=8": "batch_size=4, num_workers=2",
            "range(1000)": "range(20)",
        },
        "",
        "",
        90,
    ),
    (
        "readme-action-server",
        "README.md",
        'backend="action_server", device="cuda", alternating=True',
        {
            '"PongNoFrameskip-v4", 16,': '"PongNoFrameskip-v4", 4,',
            'device="cuda"': 'device="cpu"',
            "range(1000)": "range(10)",
        },
        # on the CPU, torch gets one thread and the workers the other cores, as the prose advises
        "import torch\ntorch.set_num_threads(1)\n",
        "",
        120,
    ),
    (
        "readme-sb3",
        "README.md",
        "vec_env_cls=vecaccel.sb3.VecAccelEnv",
        {
            'PPO("MlpPolicy", env).learn(100_000)': (
                'PPO("MlpPolicy", env, n_steps=32, batch_size=64, n_epochs=1).learn(512)'
            )
        },
        "",
        "",
        90,
    ),
    (
        "readme-trainers-python",
        "README.md",
        'agent = PPO("CartPole-v1", backend="shm")',
        {"agent.learn(100_000)": "agent.learn(512)"},  # two updates of the preset's 8 x 32
        "",
        "",
        90,
    ),
    (
        "backends-writing-a-backend",
        "docs/backends.md",
        "def vecaccel_register_backends(registry):",
        {},
        "",
        '\nassert "mine" in vecaccel.list_backends(), vecaccel.list_backends()\n',
        120,
    ),
    (
        "backends-check-backend",
        "docs/backends.md",
        "def test_async_keeps_the_contract(options):",
        {},
        "",
        '\nif __name__ == "__main__":\n    for options in ({}, {"batch_size": 2}):\n'
        "        test_async_keeps_the_contract(options)\n",
        120,
    ),
    (
        "backends-async-send-recv",
        "docs/backends.md",
        "envs.send(envs.action_space.sample()[:4], env_ids)",
        {},
        "",
        "",
        60,
    ),
    (
        "backends-auto",
        "docs/backends.md",
        'make_vec("CartPole-v1", 64, backend="auto")',
        {},
        "",
        "",
        60,
    ),
    (
        "backends-vectorized-slices",
        "docs/backends.md",
        "def cartpoles(n):",
        {"4096": "64"},
        "",
        "",
        60,
    ),
    (
        "backends-vectorized-envpool",
        "docs/backends.md",
        'envpool_vector_fn("Pong-v5", num_threads=1)',
        {"16, backend=": "4, backend="},
        "try:\n    import envpool\nexcept ImportError:\n    raise SystemExit(0)\n",
        "",
        90,
    ),
    (
        "backends-sampler",
        "docs/backends.md",
        "vecaccel.Sampler(envs, policy, horizon=16, seed=0)",
        {},
        "",
        "",
        90,
    ),
    (
        "sb3-atari",
        "docs/sb3.md",
        "vec_env_cls=vecaccel.sb3.VecAccelEnv,  # instead of SubprocVecEnv",
        {
            "n_envs=8,": "n_envs=2,",
            "n_steps=128, n_epochs=4, batch_size=256": "n_steps=16, n_epochs=1, batch_size=32",
            "model.learn(total_timesteps=1_000_000)": "model.learn(total_timesteps=32)",
        },
        "",
        "",
        120,
    ),
    (
        "sb3-to-sb3",
        "docs/sb3.md",
        "from vecaccel.sb3 import to_sb3",
        {},
        "",
        "",
        90,
    ),
    (
        "training-callbacks",
        "docs/training.md",
        "def stop_when_solved(agent, metrics):",
        {"agent.learn(50_000, stop_when_solved)": "agent.learn(600, stop_when_solved)"},
        "",
        "",
        90,
    ),
    (
        "training-presets",
        "docs/training.md",
        'plain = PPO("CartPole-v1", backend="serial", preset=None)',
        {},
        "",
        "",
        90,
    ),
    (
        "scale-out-learn-async",
        "docs/scale_out.md",
        "from vecaccel.trainers import DQN, AsyncRunner",
        # the preset learns from step 500: 1,000 steps make some 60 updates
        {"runner.run(20_000)": "runner.run(1_000)"},
        "",
        "",
        90,
    ),
    (
        "readme-multiagent",
        "README.md",
        "make_vec(pistonball_v6.parallel_env, 8",
        {"parallel_env, 8,": "parallel_env, 2,"},
        "",
        "",
        120,
    ),
    (
        "multiagent-rows",
        "docs/multiagent.md",
        'live = infos["active"]',
        {"range(200)": "range(20)"},
        "",
        "",
        120,
    ),
    (
        "backends-plugin-command",
        "docs/backends.md",
        'parser = commands.add("hello", say_hello, help="say hello")',
        {},
        "",
        "",
        60,
    ),
    (
        "multiagent-sb3",
        "docs/multiagent.md",
        'model = PPO("MlpPolicy", to_sb3(envs)',
        {"total_timesteps=20_000": "total_timesteps=256"},
        # one torch thread, as the README's SB3 snippet sets: the env workers take the other cores
        "import torch\ntorch.set_num_threads(1)\n",
        "",
        180,
    ),
]


# (doc, marker, why the block is not run here)
NOT_RUN = [
    (
        "docs/writing-an-algorithm.md",
        "def test_reinforce_keeps_the_trainers_contract",
        "needs the example installed; tests/package/test_example_algorithm.py runs its tests",
    ),
    (
        "docs/ray.md",
        'backend="ray", num_shards=2',
        "starts Ray; tests/plugins/ray/test_vec_env.py makes these calls on a loopback-only "
        "cluster",
    ),
    (
        "examples/vecaccel-example-plugin/README.md",
        'backend="example-threads"',
        "needs the example package installed; tests/vecaccel/test_manager.py installs it and runs "
        "this",
    ),
    (
        "examples/vecaccel-example-plugin/README.md",
        "def vecaccel_register_backends(registry):",
        "an excerpt of the package's module, which tests/vecaccel/test_manager.py imports",
    ),
    (
        "docs/training.md",
        "track=True, wandb_project_name=",
        "logs to Weights & Biases; tests/trainers/services/test_tracking.py trains a tracked run "
        "offline and reads it back",
    ),
]


def test_every_python_block_is_run_or_named():
    markers = [(s[1], s[2]) for s in PYTHON_SNIPPETS] + [(doc, m) for doc, m, _ in NOT_RUN]
    for doc, marker in markers:  # each marker names exactly one block
        block(doc, marker)
    unaccounted = [
        f"{doc}:{line}"
        for doc, line, lang, body in BLOCKS
        if lang == "python" and not any(d == doc and m in body for d, m in markers)
    ]
    assert not unaccounted, (
        f"Python blocks neither run nor named in NOT_RUN: {unaccounted}; add each to "
        "PYTHON_SNIPPETS (cut long budgets with substitutions) or, with the reason, to NOT_RUN"
    )


@pytest.mark.parametrize(
    "doc, marker, subs, preamble, epilogue, timeout",
    [pytest.param(*s[1:], id=s[0]) for s in PYTHON_SNIPPETS],
)
def test_python_snippet_runs(tmp_path, doc, marker, subs, preamble, epilogue, timeout):
    code = block(doc, marker)
    for old, new in subs.items():
        assert old in code, f"{old!r} is no longer in the snippet: update this test"
        code = code.replace(old, new)
    _run_python(tmp_path, preamble + code + epilogue, timeout)


# (id, doc, steps, timeout): each step is (marker of one command line of doc, substitutions
# {old: new} that must each match); the steps run in order in one folder, so a line can use the
# run directory an earlier line wrote
COMMAND_RUNS = [
    (
        "readme-train-resume-eval",
        "README.md",
        [
            (
                "vecaccel train ppo --env CartPole-v1 --total-timesteps 100000 --seed 1 --run-dir",
                {"--total-timesteps 100000": "--total-timesteps 512"},
            ),
            # the preset learns from step 500
            (
                "vecaccel train dqn --env CartPole-v1",
                {"--total-timesteps 30000": "--total-timesteps 600"},
            ),
            # fewer envs than the presets' 256 and 32: one update of 256 steps, not of 8,192 and
            # 2,048, on the presets' networks and settings otherwise
            (
                "vecaccel train ppo --env MinAtar/Breakout-v0",
                {"--total-timesteps 5000000": "--total-timesteps 256 --num-envs 8"},
            ),
            (
                "vecaccel train ppo --env Hopper-v5",
                {"--total-timesteps 1000000": "--total-timesteps 256 --num-envs 4"},
            ),
            (
                "vecaccel train ppo --resume runs/ppo-cartpole",
                {"--total-timesteps 200000": "--total-timesteps 1024"},
            ),
            ("vecaccel eval runs/ppo-cartpole/checkpoint.pt", {"--episodes 10": "--episodes 1"}),
        ],
        600,
    ),
    (
        "scale-out-async-dqn",
        "docs/scale_out.md",
        [
            (
                "vecaccel train dqn --async --preset cartpole --env CartPole-v1 --total-timesteps "
                "20000",
                {"--total-timesteps 20000": "--total-timesteps 1000"},
            )
        ],
        300,
    ),
]

# (doc, marker, why the command lines of doc holding marker are not run here)
NOT_RUN_COMMANDS = [
    (
        "docs/writing-an-algorithm.md",
        "reinforce",
        "needs the example installed; tests/package/test_example_algorithm.py trains it by name",
    ),
    (
        "benchmarks/README.md",
        "spin_vs_block.py --help",
        "prints a script's help; test_benchmark_help runs every script's --help",
    ),
    (
        "examples/vecaccel-example-plugin/README.md",
        "pytest examples/vecaccel-example-plugin/tests",
        "the example plugin's tests; tests/vecaccel/testing/test_contract.py runs them",
    ),
    (
        "README.md",
        "make run",
        "trains for about a minute; tests/trainers/services/test_logger_run_dir.py checks its line",
    ),
    ("README.md", "make test", "the whole test suite"),
    (
        "docs/minatar.md",
        "vecaccel train ppo --env MinAtar/Breakout-v0 --total-timesteps 5000000",
        "the README's MinAtar line, word for word; readme-train-resume-eval runs it",
    ),
    (
        "README.md",
        "PongNoFrameskip-v4 --total-timesteps 10000000",
        "an Atari run (minutes a preset update on CPU); tests/trainers/envs/test_make.py trains "
        "on Pong",
    ),
    ("README.md", "--help", "prints the help; tests/trainers/cli/test_commands.py checks it"),
    (
        "README.md",
        "--nproc 2",
        "two DDP ranks (two torch processes); tests/trainers/services/test_distributed.py runs "
        "them",
    ),
    ("README.md", "torchrun --nnodes 2", "needs a second machine (HOST)"),
    (
        "README.md",
        "vecaccel train dqn --async --preset cartpole --env CartPole-v1 --total-timesteps 20000",
        "docs/scale_out.md's async DQN line, which runs, less two flags",
    ),
    (
        "docs/scale_out.md",
        "--nproc",
        "several DDP ranks (torch processes each); tests/trainers/services/test_distributed.py "
        "runs them",
    ),
    (
        "docs/scale_out.md",
        "torchrun",
        "DDP ranks under torchrun; tests/trainers/services/test_distributed.py",
    ),
    (
        "docs/scale_out.md",
        "vecaccel train ppo --async --preset cartpole",
        "the same path as the async DQN line, which runs; "
        "tests/trainers/algos/on_policy/test_feed.py",
    ),
    (
        "docs/scale_out.md",
        "--resume runs/ppo-CartPole-v1-1-20260101-120000",
        "a time-stamped run name for the reader to replace; the README's resume line runs",
    ),
    (
        "docs/training.md",
        "--total-timesteps 100000              # the cartpole preset",
        "the README's first PPO line, which runs, less --seed and --run-dir; the page's sample "
        "output is checked on that run",
    ),
    (
        "docs/training.md",
        "--num-envs 4 # the preset, 4 envs",
        "the README's first PPO line, which runs, with --num-envs 4 for --seed and --run-dir",
    ),
    (
        "docs/training.md",
        "--preset none # the plain defaults",
        "the README's first PPO line, which runs, with the plain defaults; "
        "tests/trainers/config/test_presets.py",
    ),
    ("docs/training.md", "ALE/Breakout-v5", "an Atari run of the large-batch preset"),
    (
        "docs/training.md",
        "--env Pendulum-v1 --norm-obs --norm-reward",
        "a learning run; tests/trainers/cli/test_flags.py trains with these flags",
    ),
    (
        "docs/training.md",
        "--eval-every 10000 --eval-episodes 10",
        "a learning run; tests/trainers/cli/test_commands_config.py trains with these flags",
    ),
    (
        "docs/training.md",
        "vecaccel train ppo --config runs/ppo-CartPole-v1-1-20260101-120000/config.json",
        "a time-stamped run name for the reader to replace; "
        "tests/trainers/cli/test_commands_config.py starts runs from config files",
    ),
    (
        "docs/training.md",
        "--track --wandb-project-name cartpole",
        "logs to Weights & Biases; tests/trainers/services/test_tracking.py parses these flags and "
        "trains a tracked run offline",
    ),
    (
        "docs/training.md",
        "mpe2.simple_spread_v3 --num-envs 8",
        "a multi-agent learning run; tests/trainers/algos/on_policy/test_advantages_multiagent.py trains "
        "these envs",
    ),
    ("docs/training.md", "pistonball_v6", "a multi-agent learning run of image observations"),
    ("docs/training.md", "cooperative_pong_v6", "a multi-agent learning run"),
    (
        "docs/training.md",
        "vecaccel eval runs/ppo-mpe2.simple_spread_v3-1-20260101-120000",
        "a time-stamped run name for the reader to replace; the README's eval line runs",
    ),
    (
        "docs/backends.md",
        "vecaccel tune",
        "a minute of timing per line; tests/vecaccel/test_tune.py runs the command",
    ),
    (
        "docs/benchmarks/throughput.md",
        "vecaccel bench",
        "benchmarks of minutes; tests/vecaccel/bench/test_command.py",
    ),
    (
        "docs/benchmarks/mujoco-throughput.md",
        "benchmarks/",
        "a benchmark of minutes that needs EnvPool; its flags are checked against its --help here",
    ),
    (
        "docs/benchmarks/throughput.md",
        "make bench",
        "the benchmarks of minutes that rewrite results",
    ),
    (
        "docs/benchmarks/throughput.md",
        "benchmarks/",
        "benchmarks of minutes; their flags are checked against each script's --help here",
    ),
    (
        "docs/benchmarks/rollouts.md",
        "benchmarks/",
        "benchmarks of minutes; their flags are checked against each script's --help here",
    ),
    (
        "docs/benchmarks/async-batching.md",
        "benchmarks/",
        "benchmarks of a minute; tests/benchmarks/throughput/test_async_batch_former.py and "
        "test_max_concurrency.py run each with tiny settings",
    ),
    (
        "docs/benchmarks/async-batching.md",
        "benchmarks/throughput/action_server_deadline.py",
        "a benchmark of a minute and a half; "
        "tests/benchmarks/throughput/test_action_server_deadline.py runs it with tiny settings",
    ),
    (
        "docs/benchmarks/waits.md",
        "benchmarks/",
        "benchmarks of minutes; their flags are checked against each script's --help here",
    ),
    (
        "docs/benchmarks/learning.md",
        "benchmarks/",
        "benchmarks of minutes; their flags are checked against each script's --help here",
    ),
    (
        "docs/benchmarks/mujoco-learning.md",
        "benchmarks/",
        "learning runs of hours; their flags are checked against each script's --help here",
    ),
    (
        "docs/benchmarks/mujoco-race.md",
        "benchmarks/",
        "races of an hour; their flags are checked against each script's --help here",
    ),
    (
        "docs/benchmarks/scale-out.md",
        "benchmarks/",
        "benchmarks of minutes; their flags are checked against each script's --help here",
    ),
    (
        "docs/benchmarks/reliability.md",
        "benchmarks/",
        "benchmarks of minutes; their flags are checked against each script's --help here",
    ),
    (
        "docs/benchmarks/gpu.md",
        "benchmarks/",
        "benchmarks of minutes; their flags are checked against each script's --help here",
    ),
    (
        "docs/benchmarks/learning.md",
        "vecaccel train ppo --preset atari",
        "3 million Pong steps: the learning run the page reports",
    ),
    (
        "docs/soak.md",
        "benchmarks/reliability/soak.py",
        "a 30-minute soak; tests/benchmarks/reliability/test_soak.py runs a short one",
    ),
    ("docs/multiagent.md", "pip install", "installs from the network"),
    ("README.md", 'pip install "vecaccel[ray]"', "installs from the network"),
    (
        "README.md",
        "ray start",
        "starts a Ray cluster node; tests/plugins/ray/test_vec_env.py starts a local one",
    ),
    (
        "README.md",
        "RAY_ADDRESS=HEAD:6379",
        "needs a Ray cluster's head (HEAD) and Pong at scale; tests/plugins/ray/test_vec_env.py "
        "runs the backend",
    ),
    ("docs/ray.md", "pip install", "installs from the network"),
    ("docs/minatar.md", "pip install", "installs from the network"),
    (
        "docs/minatar.md",
        "benchmarks/learning/minatar_games.py",
        "hours of training; tests/benchmarks/learning/test_minatar_games.py runs and reports tiny "
        "runs",
    ),
    (
        "docs/ray.md",
        "ray start",
        "starts a Ray cluster node (HEAD_IP); tests/plugins/ray/test_auth.py runs these lines on "
        "127.0.0.1",
    ),
    (
        "docs/ray.md",
        "ray get-auth-token",
        "writes a token to ~/.ray; tests/plugins/ray/test_auth.py runs it in a temporary home",
    ),
    (
        "docs/ray.md",
        "--backend ray --num-envs 256",
        "256 Pong envs on a Ray cluster; tests/plugins/ray/test_vec_env.py runs a local one",
    ),
    ("examples/vecaccel-example-plugin/README.md", "pip install", "tests/vecaccel/test_manager.py"),
    (
        "examples/vecaccel-example-plugin/README.md",
        "vecaccel backends",
        "lists the example's backend once it is installed; tests/vecaccel/test_manager.py",
    ),
]

# (doc, language, marker, why the block is not run)
NOT_RUN_BLOCKS = [
    (
        "docs/writing-an-algorithm.md",
        "text",
        "vecaccel_example_algorithm/reinforce.py",
        "an include of the example's module, which its doctest and its tests run",
    ),
    (
        "docs/writing-an-algorithm.md",
        "text",
        "vecaccel_example_algorithm/__init__.py",
        "an include of the example's plugin module, which its tests register",
    ),
    (
        "docs/writing-an-algorithm.md",
        "toml",
        "[project.entry-points.vecaccel]",
        "an excerpt of the example's pyproject.toml, which "
        "tests/package/test_example_algorithm.py installs",
    ),
    (
        "docs/backends.md",
        "text",
        "AssertionError: check_backend('mine')",
        "a sample failure; tests/vecaccel/testing/test_contract.py checks the kit's messages on "
        "broken backends",
    ),
    (
        "docs/training.md",
        "text",
        "AlgorithmInfo(",
        "a registry entry, annotated; tests/trainers/config/test_registry.py checks the "
        "registry's entries",
    ),
    (
        "docs/backends.md",
        "text",
        "did not start within start_timeout_s=3 s",
        "sample output; tests/vecaccel/worker/test_pool_start.py checks that message",
    ),
    (
        "docs/training.md",
        "text",
        "preset: cartpole, made for CartPole-v1",
        "sample output, which test_command_lines_run checks on the README's first PPO line, the "
        "page's line with --seed and --run-dir",
    ),
    (
        "examples/vecaccel-example-plugin/README.md",
        "toml",
        "[project.entry-points.vecaccel]",
        "an excerpt of the example's pyproject.toml, which tests/vecaccel/test_manager.py installs",
    ),
]


def _command(doc: str, marker: str) -> str:
    hits = [c for where, c in COMMANDS if where.split(":")[0] == doc and marker in c]
    assert len(hits) == 1, (
        f"expected one command line of {doc} containing {marker!r}, found {len(hits)}: "
        "the page changed; update this test's marker"
    )
    return hits[0]


def test_every_command_line_and_block_is_run_or_named():
    run = {(doc, _command(doc, marker)) for _, doc, steps, _ in COMMAND_RUNS for marker, _ in steps}
    for doc, marker, _ in NOT_RUN_COMMANDS:  # each names at least one line, still there
        assert any(w.split(":")[0] == doc and marker in c for w, c in COMMANDS), (doc, marker)
    unaccounted = [
        f"{where}: {command.strip()}"
        for where, command in COMMANDS
        if (where.split(":")[0], command) not in run
        and not any(d == where.split(":")[0] and m in command for d, m, _ in NOT_RUN_COMMANDS)
    ]
    assert not unaccounted, (
        f"command lines neither run nor named in NOT_RUN_COMMANDS: {unaccounted}; add each to "
        "COMMAND_RUNS (cut long budgets with substitutions) or, with the reason, to "
        "NOT_RUN_COMMANDS"
    )
    for doc, lang, marker, _ in NOT_RUN_BLOCKS:
        block(doc, marker, lang)
    others = [
        f"{doc}:{line} ({lang})"
        for doc, line, lang, body in BLOCKS
        if lang not in ("python", "bash", "")
        and not any(d == doc and la == lang and m in body for d, la, m, _ in NOT_RUN_BLOCKS)
    ]
    assert not others, f"blocks neither run nor named in NOT_RUN_BLOCKS: {others}"


@pytest.mark.parametrize(
    "doc, steps, timeout", [pytest.param(*r[1:], id=r[0]) for r in COMMAND_RUNS]
)
def test_command_lines_run(tmp_path, doc, steps, timeout):
    """Each line as a user pastes it (``vecaccel`` is this interpreter's), quietly."""
    outputs = []
    for marker, subs in steps:
        command = _command(doc, marker)
        for old, new in subs.items():
            assert old in command, f"{old!r} is no longer in `{command}`: update this test"
            command = command.replace(old, new)
        argv = shlex.split(command, comments=True)
        assert argv[0] == "vecaccel", command
        proc = subprocess.run(
            [sys.executable, "-m", "vecaccel", *argv[1:]],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert proc.returncode == 0, f"`{command}` exited with {proc.returncode}:\n{proc.stderr}"
        _assert_quiet(proc.stderr, f"`{command}`")
        outputs.append(proc.stderr)
    if doc == "README.md":  # docs/training.md shows what this line prints, less two flags
        shown = block("docs/training.md", "preset: cartpole, made for CartPole-v1", "text").strip()
        assert shown in outputs[0], outputs[0]
