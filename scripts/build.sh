#!/usr/bin/env bash
# Configures and builds the C++ core, the extension and the C++ tests into build/
# (ccache, at most 2 parallel jobs). Expects .venv to exist (see scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
# ccache hits across clones in other folders (CI builds in a fresh clone)
export CCACHE_BASEDIR="$(pwd)" CCACHE_NOHASHDIR=1
# the build must not autoload a stale torch_tpu through `import torch`
export TORCH_DEVICE_BACKEND_AUTOLOAD=0
TORCH_PREFIX=$($PY -c 'import torch; print(torch.utils.cmake_prefix_path)')
PLUGIN=$($PY -c 'import lammps_jax_pjrt_cpu as p; print(p.PLUGIN_PATH)' 2>/dev/null || true)
GEN=()
command -v ninja >/dev/null && GEN=(-G Ninja)
cmake -S . -B build "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DCMAKE_PREFIX_PATH="$TORCH_PREFIX" \
  -DPython3_EXECUTABLE="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")" -DTT_TEST_PLUGIN="$PLUGIN" \
  ${TT_CMAKE_ARGS:-} >/dev/null
cmake --build build -j "${TT_JOBS:-2}"
