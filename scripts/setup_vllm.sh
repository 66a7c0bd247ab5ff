#!/usr/bin/env bash
# Sets up .venv-vllm: torch==2.13.0 (CPU build), vLLM 0.32.0 built from its sdist with no device
# kernels (VLLM_TARGET_DEVICE=empty: vLLM runs its torch paths on `tpu`), every dependency pinned
# (tests/vllm/requirements.txt), and torch_tpu installed editable from this checkout (its C++ core
# is the one scripts/build.sh built; both venvs use the same torch 2.13.0). Idempotent: does
# nothing when the venv already has what the pins ask for. Expects scripts/setup.sh to have run.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/pinned_venv.sh
# the sdist by URL and hash: built with VLLM_TARGET_DEVICE=empty its version reads 0.32.0+empty,
# which a plain `vllm==0.32.0` request refuses
VLLM_SDIST="https://files.pythonhosted.org/packages/d5/df/5471312c76e335eaa2b8333e87ea39f0d37bfe24f10a582620e34ff12e33/vllm-0.32.0.tar.gz#sha256=d2c957d5eee3d0985012151315ddc62cbe0cd368fc96a5fc3510438d9dddf2ad"
install_vllm() { VLLM_TARGET_DEVICE=empty "$1/bin/pip" install "${PINNED_PIP[@]}" --no-deps --no-build-isolation "vllm @ $VLLM_SDIST"; }
pinned_venv .venv-vllm tests/vllm/requirements.txt install_vllm
