#!/usr/bin/env bash
# Bring the GPU benchmark's optional peers into .whl/ (git-ignored) on a machine with network, for a GPU
# machine without one (Python 3.12 there). Run from anywhere; then scripts/gpu_check.sh uses them.
#   - liger-kernel: a pure-Python wheel (py3-none-any), installed on the GPU machine with --no-deps into a
#     temporary --target (its needs, torch and triton, are already there).
#   - flash-attn: only its Triton rotary, flash_attn/ops/triton/rotary.py, extracted from the sdist (the
#     package itself needs a CUDA build); the benchmark imports that one file by path. Never vendored.
set -euo pipefail
cd "$(dirname "$0")/.."
LIGER=${LIGER_VERSION:-0.8.5}
FLASH=${FLASH_ATTN_VERSION:-2.8.3.post2}
PY=${PYTHON:-python3}
mkdir -p .whl
"$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
    -d .whl "liger-kernel==$LIGER"
tmp=$(mktemp -d)
# pip prepares the sdist's metadata, which imports torch: skip flash-attn's CUDA build and use this env's torch.
FLASH_ATTENTION_SKIP_CUDA_BUILD=TRUE "$PY" -m pip download --no-deps --no-binary=:all: --no-build-isolation \
    -d "$tmp" "flash-attn==$FLASH"
tar -xzf "$tmp"/flash_attn-"$FLASH".tar.gz -C .whl \
    "flash_attn-$FLASH/flash_attn/ops/triton/rotary.py" "flash_attn-$FLASH/LICENSE"
rm -rf "$tmp"
ls -la .whl .whl/flash_attn-"$FLASH"/flash_attn/ops/triton
