#!/usr/bin/env bash
# Runs every test: the C++ unit tests (CTest) and the Python tests (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
(cd build && ctest --output-on-failure -j 2)
.venv/bin/python -m pytest -q tests/python tests/ops "$@"
