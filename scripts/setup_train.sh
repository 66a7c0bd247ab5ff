#!/usr/bin/env bash
# Sets up .venv-train, the training integrations' venv: torch==2.13.0 (CPU build), Ray Train and
# every package it needs pinned (tests/train/requirements.txt, installed with --no-deps), and
# torch_tpu installed editable from this checkout (its C++ core is the one scripts/build.sh built).
# Idempotent: does nothing when the venv already has what the pins ask for. Expects
# scripts/setup.sh to have run.
set -euo pipefail
cd "$(dirname "$0")/.."
V=.venv-train
PIP=(--disable-pip-version-check -q)
STAMP="$V/.torch_tpu-setup"
WANT="$(cat tests/train/requirements.txt pyproject.toml | sha1sum | cut -c1-16)"
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ]; then exit 0; fi
[ -x "$V/bin/python" ] || ${PYTHON_BIN:-python3} -m venv "$V"
"$V/bin/pip" install "${PIP[@]}" torch==2.13.0
"$V/bin/pip" install "${PIP[@]}" --no-deps -r tests/train/requirements.txt
"$V/bin/pip" install "${PIP[@]}" --no-deps --no-build-isolation -e .
echo "$WANT" > "$STAMP"
