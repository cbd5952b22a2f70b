"""``vecaccel.bench.seeds``: each run of a benchmark in a child process of its own (or here),
its failures named by call, the runs a benchmark stored read instead of run, and the arms
rotated."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import pytest

from vecaccel.bench import ChildRunError, run_in_child, run_seeds
from vecaccel.bench.seeds import start_elsewhere
from vecaccel.testing.leaks import wait_until


def test_a_failing_run_names_its_call_and_error(tmp_path):
    script = tmp_path / "broken.py"
    script.write_text("def run(seed):\n    raise RuntimeError(f'diverged at seed {seed}')\n")
    with pytest.raises(ChildRunError, match=r"broken\.py:run\(\{'seed': 4\}\)(.|\n)*diverged"):
        run_in_child(script, "run", {"seed": 4})
    with pytest.raises(ChildRunError, match="ran past 0.5 s"):
        script.write_text("import time\n\ndef run(seed):\n    time.sleep(30)\n")
        run_in_child(script, "run", {"seed": 4}, timeout_s=0.5)


def test_each_run_gets_its_own_process_and_the_settings_stay_out_of_the_records(tmp_path):
    script = tmp_path / "runs.py"
    script.write_text(
        "import os\n\n"
        "def run(library, seed, budget):\n"
        "    return {'pid': os.getpid(), 'budget': budget}\n\n"
        "if __name__ == '__main__':\n"
        "    raise SystemExit('the script is loaded, not run')\n"
    )
    seen = []
    runs = run_seeds(
        script,
        "run",
        [1, 2],
        [{"library": "vecaccel"}, {"library": "sb3"}],
        common={"budget": 7},
        on_run=seen.append,
    )
    assert [(r["library"], r["seed"]) for r in runs] == [
        ("vecaccel", 1),
        ("sb3", 1),
        ("vecaccel", 2),
        ("sb3", 2),
    ]
    assert seen == runs and all(r["budget"] == 7 and "load_before" in r for r in runs)
    assert len({r["pid"] for r in runs}) == 4
    assert all(set(r) == {"pid", "budget", "library", "seed", "load_before"} for r in runs)


def test_in_process_runs_call_the_script_here(tmp_path):
    script = tmp_path / "here_bench.py"
    script.write_text("import os\n\ndef run(arm, seed):\n    return {'pid': os.getpid()}\n")
    runs = run_seeds(script, "run", [1, 2], [{"arm": "a"}, {"arm": "b"}], in_process=True)
    assert [(r["arm"], r["seed"], r["pid"]) for r in runs] == [
        ("a", 1, os.getpid()),
        ("b", 1, os.getpid()),
        ("a", 2, os.getpid()),
        ("b", 2, os.getpid()),
    ]


def test_stored_runs_are_read_not_run_and_alternate_rotates_the_arms(tmp_path):
    """A benchmark resumes: the runs its ``stored`` returns stand for themselves (no call,
    no ``on_run``), the rest run; with ``alternate``, each arm goes first in turn."""
    script = tmp_path / "resume_bench.py"
    script.write_text("def run(arm, seed):\n    return {'made': 'now'}\n")
    kept = {("b", 2): {"made": "before", "arm": "b", "seed": 2}}
    seen = []
    runs = run_seeds(
        script, "run", [1, 2, 3], [{"arm": "a"}, {"arm": "b"}, {"arm": "c"}], alternate=True,
        in_process=True, stored=lambda arm, seed: kept.get((arm["arm"], seed)), on_run=seen.append,
    )  # fmt: skip
    assert [(r["arm"], r["seed"]) for r in runs] == [
        ("a", 1), ("b", 1), ("c", 1), ("b", 2), ("c", 2), ("a", 2), ("c", 3), ("a", 3), ("b", 3),
    ]  # fmt: skip
    assert runs[3] == kept[("b", 2)] and len(seen) == 8 and kept[("b", 2)] not in seen
    assert all(r["made"] == "now" for r in seen)


def test_a_run_may_start_spawned_workers_that_import_its_script(tmp_path):
    """The script is imported under its own name in the child, so its functions pickle by
    reference into processes started with spawn, as they do when it runs as a script."""
    script = tmp_path / "spawning_bench.py"
    script.write_text(
        "import multiprocessing\n\n"
        "def square(x):\n"
        "    return x * x\n\n"
        "def run(seed):\n"
        "    with multiprocessing.get_context('spawn').Pool(1) as pool:\n"
        "        return {'value': pool.apply(square, (seed,))}\n"
    )
    assert run_in_child(script, "run", {"seed": 3}, timeout_s=120) == {"value": 9}


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads /proc")
def test_a_process_started_elsewhere_is_not_a_child_and_takes_its_nice():
    pid = start_elsewhere([sys.executable, "-c", "import time; time.sleep(60)"], nice=5)
    try:
        # the pid is the shell's job until it has exec'd nice, then the sleeper
        cmdline = Path(f"/proc/{pid}/cmdline")
        assert wait_until(lambda: cmdline.read_text().split("\0")[0] == sys.executable)
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(fields[1]) != os.getpid()  # its parent
        assert int(fields[16]) == os.getpriority(os.PRIO_PROCESS, 0) + 5  # its nice value
    finally:
        os.kill(pid, signal.SIGKILL)
