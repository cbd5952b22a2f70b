"""How ``make test`` spreads the suite over its workers (``tests/conftest.py``): the tests of a
file with a module-scoped set-up stay together, every other test goes alone."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import _has_module_fixture

TESTS = Path(__file__).parents[1]


def test_files_with_a_module_scoped_fixture_are_found(tmp_path) -> None:
    for name in (
        "benchmarks/gpu/test_gpu_run.py",
        "plugins/ray/test_vec_env.py",
        "trainers/services/test_distributed.py",
    ):
        assert _has_module_fixture(TESTS / name), name
    assert not _has_module_fixture(TESTS / "contract" / "test_faults.py")
    path = tmp_path / "test_example.py"
    path.write_text('import pytest\n\n@pytest.fixture(scope="module", autouse=True)\ndef s():\n')
    assert _has_module_fixture(path)
    assert not _has_module_fixture(tmp_path / "test_missing.py")
