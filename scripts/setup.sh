#!/usr/bin/env bash
# Sets up a fresh machine: system packages (ccache, GoogleTest), .venv with
# torch==2.13.0 (CPU build), the XLA CPU PJRT plugin and the test dependencies,
# then builds the C++ core and the extension and installs torch_tpu (editable).
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v apt-get >/dev/null && { ! command -v ccache >/dev/null || [ ! -e /usr/include/gtest/gtest.h ]; }; then
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq >/dev/null
  $SUDO apt-get install -y -qq ccache libgtest-dev >/dev/null
fi
PY=${PYTHON_BIN:-python3}
[ -x .venv/bin/python ] || $PY -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -r requirements.txt
# the HuggingFace model suite's packages, every one pinned (tests/models/requirements.txt)
.venv/bin/pip install -q --disable-pip-version-check --no-deps -r tests/models/requirements.txt
bash scripts/build.sh
.venv/bin/pip install -q --disable-pip-version-check --no-build-isolation --no-deps -e .
