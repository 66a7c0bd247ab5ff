#!/usr/bin/env bash
# Runs every test: the C++ unit tests (CTest) and the Python tests (pytest).
set -euo pipefail
cd "$(dirname "$0")/.."
(cd build && ctest --output-on-failure -j 2)
# both cores (pytest-xdist): a file's tests, or one OpInfo sweep's (a class), share a worker
PAR=(-n "${TT_TEST_JOBS:-2}" --dist loadscope)
.venv/bin/python -m pytest -q "${PAR[@]}" tests/python tests/ops tests/models "$@"
# the trace cache's contract: replayed programs equal the text their ops build
# (a mismatch raises in verify mode)
TORCH_TPU_TRACE_CACHE=verify .venv/bin/python -m pytest -q "${PAR[@]}" tests/python/test_fuzz_modes.py tests/python/test_ops.py \
  tests/python/test_trace.py "$@"
# vLLM on tpu (torch_tpu/vllm): its own venv with vLLM 0.32.0 pinned (scripts/setup_vllm.sh)
bash scripts/setup_vllm.sh
.venv-vllm/bin/python -m pytest -q tests/vllm
# the training integrations (Ray Train, TorchTitan, TorchRec): their own venv, every package pinned (scripts/setup_train.sh)
bash scripts/setup_train.sh
.venv-train/bin/python -m pytest -q tests/train
