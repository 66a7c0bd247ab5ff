#!/usr/bin/env bash
# Sets up .venv-train, the training integrations' venv: torch==2.13.0 (CPU build), Ray Train,
# TorchTitan and TorchRec with every package they need pinned (tests/train/requirements.txt,
# installed with --no-deps), and
# torch_tpu installed editable from this checkout (its C++ core is the one scripts/build.sh built).
# Idempotent: does nothing when the venv already has what the pins ask for. Expects
# scripts/setup.sh to have run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pinned_venv.sh
pinned_venv .venv-train tests/train/requirements.txt
