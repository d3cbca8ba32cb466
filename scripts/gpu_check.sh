#!/usr/bin/env bash
# GPU check (its run time on a GPU has not been measured yet): the Triton kernels' correctness tests on the GPU
# (the fused QK-norm+RoPE's among them), then `python -m ropelab.bench gpu` and `python -m ropelab.bench fused --device cuda`.
#   scripts/gpu_check.sh OUT_DIR        (run from the checkout; PYTHONPATH=. is set here)
# Optional peers come from .whl/ (scripts/fetch_wheels.sh, run beforehand where there is network).
# Every step's log and the benchmark JSON go to OUT_DIR (flat: no subfolders). To add a check, add one line
# to STEPS below: "name|timeout seconds|command".
set -uo pipefail
OUT=${1:?usage: scripts/gpu_check.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH=.${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
unset TRITON_INTERPRET  # the real GPU compiler, not the CPU interpreter

if compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/ropelab-site \
        .whl/*.whl && export PYTHONPATH=$PYTHONPATH:/tmp/ropelab-site
fi
FLASH_ROTARY=$(compgen -G ".whl/flash_attn-*/flash_attn/ops/triton/rotary.py" | head -1 || true)
export FLASH_ROTARY

STEPS=(
    "env|20|nvidia-smi; $PY -c 'import torch, triton; print(torch.__version__, triton.__version__, torch.cuda.get_device_name())'"
    "tests|120|$PY -m pytest tests/test_kernels_gpu.py -q -p no:cacheprovider -n 8 --timeout 110"
    "bench|200|$PY -m ropelab.bench gpu --out-dir $OUT"
    "fused|90|$PY -m ropelab.bench fused --device cuda --tokens 8192 --backends torch triton --repeats 50 --out $OUT/fused-gpu.json"
)

status=0
for step in "${STEPS[@]}"; do
    IFS='|' read -r name limit cmd <<<"$step"
    echo "=== $name (limit ${limit}s): $cmd"
    start=$(date +%s)
    timeout "$limit" bash -c "$cmd" 2>&1 | tee "$OUT/$name.log"
    rc=${PIPESTATUS[0]}
    echo "=== $name: exit $rc in $(( $(date +%s) - start ))s" | tee -a "$OUT/summary.txt"
    [ "$rc" -ne 0 ] && status=1
done
exit $status
