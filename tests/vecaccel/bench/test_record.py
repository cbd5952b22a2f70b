"""``vecaccel.bench.record``: the one result format, the reading of older result files, and
output paths checked before a run."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vecaccel.bench import (
    RESULT_FORMAT,
    RunRecord,
    check_output_path,
    load_result,
)

ROOT = Path(__file__).resolve().parents[3]
BENCHMARKS = ROOT / "benchmarks"

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
