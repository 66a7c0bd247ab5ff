#!/usr/bin/env bash
# Regenerates docs/OP_COVERAGE.md: the lowered-op table, then the OpInfo parity
# tables (float32 with gradients, bfloat16, int64, bool, uint8, int8, int16; 2
# samples per entry), the extremal reference inputs (float32, bfloat16; 3 per
# entry) and the error inputs.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export TORCH_TPU_CACHE_DIR=""
{
  $PY tools/op_coverage.py --markdown
  echo
  $PY tests/ops/opinfo_parity.py --samples 2 --grad --markdown
  for dt in bfloat16 int64 bool uint8 int8 int16; do
    echo
    $PY tests/ops/opinfo_parity.py --samples 2 --dtype "$dt" --markdown
  done
  for dt in float32 bfloat16; do
    echo
    $PY tests/ops/opinfo_parity.py --reference --samples 3 --dtype "$dt" --markdown
  done
  echo
  $PY tests/ops/opinfo_parity.py --errors --markdown
} 2>/dev/null > docs/OP_COVERAGE.md.tmp
mv docs/OP_COVERAGE.md.tmp docs/OP_COVERAGE.md
