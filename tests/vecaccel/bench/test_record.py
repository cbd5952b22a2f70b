"""``vecaccel.bench.record`` and ``vecaccel.bench.seeds``: the one result format, the reading of
older result files, the child process per run; and the layout of ``benchmarks/`` they serve."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.bench import (
    RESULT_FORMAT,
    ChildRunError,
    RunRecord,
    check_output_path,
    load_result,
    run_in_child,
    run_seeds,
)

ROOT = Path(__file__).resolve().parents[3]
BENCHMARKS = ROOT / "benchmarks"
SUBJECTS = ("throughput", "waiting", "learning", "scale_out", "reliability", "gpu")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.floats(allow_nan=False, allow_infinity=False, width=32),
    st.text(max_size=8),
)
rows = st.lists(st.dictionaries(st.text(min_size=1, max_size=6), scalars, max_size=4), max_size=4)


@settings(max_examples=25, deadline=None)
@given(results=rows, summary=st.one_of(st.none(), scalars), seconds=st.integers(0, 100))
def test_a_written_result_reads_back_as_written(tmp_path_factory, results, summary, seconds):
    path = tmp_path_factory.mktemp("record") / "sub" / "result.json"
    record = RunRecord("python benchmarks/waiting/spin_vs_block.py --seconds 3")
    record.add_ceiling("CartPole-v1", 1000.0, 2, trial=0)
    written = record.write(path, results, summary=summary, seconds=seconds)
    loaded = load_result(path)
    assert loaded == written
    assert loaded["results"] == results
    assert ("summary" in loaded) == (summary is not None)
    meta = loaded["meta"]
    assert meta["format"] == RESULT_FORMAT and meta["seconds"] == seconds
    assert meta["benchmark"] == "waiting/spin_vs_block"
    assert meta["command"] == "python benchmarks/waiting/spin_vs_block.py --seconds 3"
    assert meta["ceilings"] == [
        {"env": "CartPole-v1", "steps_per_s": 1000.0, "processes": 2, "trial": 0}
    ]
    for key in ("date", "usable_cpus", "versions", "load_average", "load_average_after"):
        assert key in meta, key


def test_a_file_not_of_the_format_is_refused_by_name(tmp_path):
    path = tmp_path / "flat.json"
    path.write_text(json.dumps({"rate": 1.0}))
    with pytest.raises(ValueError, match=r"flat\.json: no meta object"):
        load_result(path)
    path.write_text(json.dumps({"meta": {"format": 1}, "runs": [{"seed": 1}]}))
    with pytest.raises(ValueError, match=r"flat\.json: no rows"):
        load_result(path)
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match=r"flat\.json: a result file holds a JSON object"):
        load_result(path)


@pytest.mark.parametrize("result", sorted((BENCHMARKS / "results").glob("*.json")), ids=str)
def test_every_committed_result_reads_as_the_format(result):
    loaded = load_result(result)
    assert isinstance(loaded["meta"], dict) and loaded["meta"]["format"] in (0, RESULT_FORMAT)
    assert isinstance(loaded["results"], list) and loaded["results"]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="CPU affinity is Linux's")
def test_the_record_counts_the_cpus_usable_when_the_run_started(tmp_path):
    """A benchmark that pins itself to one CPU after it starts still records the machine's."""
    before = os.sched_getaffinity(0)
    record = RunRecord("python benchmarks/scale_out/async_dqn_overlap.py")
    try:
        os.sched_setaffinity(0, {min(before)})
        written = record.write(tmp_path / "result.json", [{"x": 1}])
    finally:
        os.sched_setaffinity(0, before)
    assert written["meta"]["usable_cpus"] == len(before)


def test_an_unwritable_output_is_refused_before_running(tmp_path):
    with pytest.raises(ValueError, match="--out .*: is a folder"):
        check_output_path(tmp_path, "--out")
    with pytest.raises(ValueError, match="does not exist"):
        check_output_path(tmp_path / "missing" / "out.json")
    check_output_path(tmp_path / "out.json")


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


# -- the layout of benchmarks/ ---------------------------------------------------------------


SCRIPTS = sorted(BENCHMARKS.glob("**/*.py"))


def test_every_script_lives_in_a_subject_folder():
    assert SCRIPTS
    for script in SCRIPTS:
        subject = script.relative_to(BENCHMARKS).parts
        assert len(subject) == 2 and subject[0] in SUBJECTS, script


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_a_benchmark_stands_on_the_library_alone(script):
    text = script.read_text()
    assert not re.search(r"sys\.path", text), f"{script} edits sys.path"
    assert not re.search(r"^\s*(from|import) tests\b", text, re.M), f"{script} imports tests/"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_every_script_is_documented_with_its_command(script):
    path = script.relative_to(ROOT).as_posix()
    pages = "".join(page.read_text() for page in (ROOT / "docs" / "benchmarks").glob("*.md"))
    assert f"python {path}" in pages, f"no page of docs/benchmarks/ gives the command of {path}"
    readme = (BENCHMARKS / "README.md").read_text()
    assert f"`{script.name}`" in readme, f"benchmarks/README.md does not list {path}"


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_every_script_writes_the_one_result_format(script):
    text = script.read_text()
    assert "RunRecord(" in text, f"{script} does not record its run with vecaccel.bench.RunRecord"
    assert "write_json" not in text, f"{script} writes JSON of its own layout"
