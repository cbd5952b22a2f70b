# Quick start: `make run` runs the main job, `make test` runs the whole test suite.
# Each target sets itself up: a .venv, the installs, and a CPU build of torch where no GPU is present.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.vecaccel-installed
# The CPU wheel of this release lies on the project's machines; a bare `torch` would pull a CUDA build.
TORCH_CPU_SPEC ?= torch==2.13.0
PYTEST_ARGS ?=
# test worker processes (pytest-xdist): one per core and one more, since many tests wait on the
# processes they start (at most 8); 0 runs the tests in this process
TEST_WORKERS ?= $(shell n=$$(nproc 2>/dev/null || echo 1); echo $$(( n < 8 ? n + 1 : 8 )))
# `make bench` rewrites the throughput results that docs/benchmarks/throughput.md shows.
BENCH_RESULTS ?= benchmarks/results

.PHONY: setup run test test-learning lint typecheck docs bench dist clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip setuptools wheel
	@if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		echo "GPU found: installing the default torch build"; \
	else \
		echo "no GPU: installing the CPU build $(TORCH_CPU_SPEC)"; \
		$(BIN)/python -m pip install -q "$(TORCH_CPU_SPEC)"; \
	fi
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $(STAMP)

run: $(STAMP)
	$(BIN)/vecaccel train ppo --preset cartpole --env CartPole-v1 --backend shm --num-envs 8 --total-timesteps 100000 --seed 1

# how the tests are spread over the workers: tests/conftest.py, pytest_xdist_make_scheduler
# The suite starts hundreds of interpreters (spawn workers, command lines, torchrun ranks): the
# sources are compiled once first, since where PYTHONDONTWRITEBYTECODE is set no interpreter
# writes its bytecode and each would compile them again.
test: $(STAMP)
	$(BIN)/python -m compileall -q -j 0 vecaccel trainers plugins tests examples benchmarks
	$(BIN)/python -m pytest -n $(TEST_WORKERS) $(PYTEST_ARGS)

# the learning runs: a few tiny trainings that must reach a score (minutes)
test-learning: $(STAMP)
	$(BIN)/python -m pytest -m slow tests $(PYTEST_ARGS)

LINT_PATHS := vecaccel plugins trainers tests examples benchmarks docs

lint: $(STAMP)
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(MAKE) --no-print-directory typecheck
	$(MAKE) --no-print-directory docs

# mypy over the package as installed: plugins/ and trainers/ are vecaccel.plugins and
# vecaccel.trainers there, so it reads a tree of links that has that layout; its report names
# the files in the checkout
TYPECHECK_TREE := build/typecheck
typecheck: $(STAMP)
	rm -rf $(TYPECHECK_TREE) && mkdir -p $(TYPECHECK_TREE)/vecaccel
	for f in vecaccel/*; do ln -s "$(CURDIR)/$$f" $(TYPECHECK_TREE)/$$f; done
	ln -s "$(CURDIR)/plugins" $(TYPECHECK_TREE)/vecaccel/plugins
	ln -s "$(CURDIR)/trainers" $(TYPECHECK_TREE)/vecaccel/trainers
	cd $(TYPECHECK_TREE) && "$(abspath $(BIN))/mypy" --config-file "$(CURDIR)/pyproject.toml" \
		--cache-dir "$(CURDIR)/.mypy_cache" -p vecaccel > report.txt; status=$$?; \
		sed -e 's#^vecaccel/plugins/#plugins/#' -e 's#^vecaccel/trainers/#trainers/#' report.txt; \
		exit $$status

bench: $(STAMP)
	-$(BIN)/python -m pip install -q envpool
	$(BIN)/vecaccel bench --env CartPole-v1 --num-envs 16,64,256 --seconds 2 --repeat 3 \
		--json $(BENCH_RESULTS)/vecaccel_bench_cartpole.json --plot $(BENCH_RESULTS)/vecaccel_bench_cartpole.png
	$(BIN)/vecaccel bench --env pong --num-envs 8,16 --seconds 3 --repeat 3 \
		--json $(BENCH_RESULTS)/vecaccel_bench_pong.json --plot $(BENCH_RESULTS)/vecaccel_bench_pong.png

# the documentation site (mkdocs.yml) in site/, built strictly: a broken link or reference, or a
# public name without a docstring (docs/hooks.py), fails it
docs: $(STAMP)
	@$(BIN)/python -c "import mkdocs, material, mkdocstrings_handlers.python" 2>/dev/null || { \
		echo "make docs needs the docs extra (mkdocs, mkdocs-material, mkdocstrings[python]):" \
			"pip install -e '.[docs]', or make setup, which installs the dev extra" >&2; exit 2; }
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# the sdist and the wheel in dist/, checked by twine (tests/package/test_wheel.py installs them)
dist: $(STAMP)
	rm -rf dist
	$(BIN)/python -m build --no-isolation --outdir dist .
	$(BIN)/twine check --strict dist/*

clean:
	rm -rf $(VENV) build dist site *.egg-info .pytest_cache .mypy_cache .hypothesis
