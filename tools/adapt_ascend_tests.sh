#!/usr/bin/env bash
# Prepares PyTorch's device-generic test files from the PrivateUse1 adaptation kept in
# the Ascend torch_npu repository (github.com/Ascend/pytorch, folder test/) for
# tools/run_pytorch_tests.py: copies the folder and makes the files device-neutral
# (drops the torch_npu imports, reads the "npu" device strings as "tpu", and maps a
# name torch 2.13 no longer has). Nothing is downloaded here.
#
#   bash tools/adapt_ascend_tests.sh <Ascend checkout>/test /tmp/pt_tests
#   .venv/bin/python tools/run_pytorch_tests.py /tmp/pt_tests --out /tmp/ptout
#
# A checkout without a work tree (a bare mirror) works too:
#   git -C <mirror> archive HEAD test | tar -x -C /tmp && bash tools/adapt_ascend_tests.sh /tmp/test /tmp/pt_tests
set -euo pipefail
src=$1 dest=$2
mkdir -p "$dest"
cp -r "$src"/. "$dest"/
for f in test_view_ops.py test_indexing.py test_binary_ufuncs.py test_unary_ufuncs.py test_reductions.py \
         test_shape_ops.py test_ops.py; do
  [ -f "$dest/$f" ] || continue
  sed -i -e '/^import torch_npu/d' -e '/^from torch_npu/d' -e 's/"npu"/"tpu"/g' -e "s/'npu'/'tpu'/g" -e 's/\.npu(/.tpu(/g' -e 's/\bis_npu\b/is_tpu/g' "$dest/$f"
done
[ -f "$dest/test_binary_ufuncs.py" ] && sed -i 's/binary_ufuncs_and_refs/binary_ufuncs/g' "$dest/test_binary_ufuncs.py"
echo "prepared $dest"
