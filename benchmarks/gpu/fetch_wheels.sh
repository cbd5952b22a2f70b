#!/usr/bin/env bash
# Fetch the wheels that gpu_run.py needs on a GPU machine that reaches no package registry.
#
# That machine has Python 3.12 with PyTorch (CUDA), NumPy, OpenCV, matplotlib, TensorBoard,
# pluggy and cloudpickle. This script puts Python 3.12 manylinux wheels of everything else into
# benchmarks/gpu/wheels/ (git-ignored; at most 64 MiB, checked): Gymnasium and its small
# dependencies, ale-py (which ships the Atari ROMs), NVML's Python binding (the GPU's busy
# share through torch.cuda.utilization) and vecaccel itself, built from this tree. Versions are
# those installed in the .venv that the tests run with.
#
# Usage (from the repository root, after `make setup`):
#     bash benchmarks/gpu/fetch_wheels.sh
# Then, on the GPU machine, from the repository root:
#     python -m pip install --no-index --no-deps --target /tmp/vecaccel-deps benchmarks/gpu/wheels/*.whl
#     PYTHONPATH=/tmp/vecaccel-deps python benchmarks/gpu/gpu_run.py OUT
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
python="${PYTHON:-$root/.venv/bin/python}"
dest="${WHEELS:-$here/wheels}"
limit_bytes=$((64 * 1024 * 1024))
nvml_version="${NVML_VERSION:-13.615.71}"
# another interpreter's wheels (e.g. 3.11, to try the procedure here on the .venv's Python)
py_version="${PY_VERSION:-3.12}"

version() { "$python" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$1"; }

rm -rf "$dest"
mkdir -p "$dest"
"$python" -m pip download --quiet --dest "$dest" \
    --python-version "$py_version" --platform manylinux_2_28_x86_64 --only-binary=:all: --no-deps \
    "gymnasium==$(version gymnasium)" \
    "ale-py==$(version ale-py)" \
    "farama-notifications==$(version farama-notifications)" \
    "typing-extensions==$(version typing-extensions)" \
    "nvidia-ml-py==$nvml_version"
# pure Python: one wheel serves every interpreter; built in a scratch copy so that the tree
# keeps no build/ or egg-info from it
scratch="$(mktemp -d)"
trap 'rm -rf "$scratch"' EXIT
git -C "$root" ls-files -z --cached --others --exclude-standard \
    | (cd "$root" && xargs -0 cp --parents -t "$scratch" 2>/dev/null || true)
"$python" -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir "$dest" "$scratch"

total=$(du -cb "$dest"/*.whl | tail -n 1 | cut -f 1)
ls -l "$dest"
echo "total: $total bytes (limit $limit_bytes)"
if [ "$total" -gt "$limit_bytes" ]; then
    echo "the wheels exceed 64 MiB: they cannot travel with the working tree" >&2
    exit 1
fi
