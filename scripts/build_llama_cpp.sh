#!/usr/bin/env bash
# Build llama-cpp-python for the CPU once per (version, flags), cache the wheel, install it into PYTHON's environment,
# and extract the sdist's llama.cpp tree (convert_hf_to_gguf.py) under build/. Used by `make ggml`.
#
#   scripts/build_llama_cpp.sh PYTHON VERSION
#
# The sdist and the wheel are cached in $ROPELAB_WHEEL_CACHE (default build/wheels; the Makefile passes a cache
# outside the checkout) under a key of the version and the CMake flags,
# and reused while both are unchanged: the compile is the slow part (see the Makefile's `ggml` target). The flags make
# a portable, minimal build: GGML_NATIVE=OFF (the machine that runs the tests may not be the one that built it), no
# BLAS, CUDA or OpenMP, no llamafile sgemm, no multimodal library (mtmd), no tests, examples, tools or server, and
# no llama-common (see below).
set -euo pipefail
PY=${1:?usage: scripts/build_llama_cpp.sh PYTHON VERSION}
VERSION=${2:?usage: scripts/build_llama_cpp.sh PYTHON VERSION}
CACHE=${ROPELAB_WHEEL_CACHE:-build/wheels}
FLAGS="-DGGML_NATIVE=OFF -DGGML_BLAS=OFF -DGGML_CUDA=OFF -DGGML_OPENMP=OFF -DGGML_LLAMAFILE=OFF -DLLAVA_BUILD=OFF"
FLAGS+=" -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
FLAGS+=" -DGGML_BUILD_TESTS=OFF -DGGML_BUILD_EXAMPLES=OFF"
COMMON_ON='set(LLAMA_BUILD_COMMON ON CACHE BOOL'
KEY=$(printf '%s\n%s\n%s\n' "$VERSION" "$FLAGS" "$COMMON_ON -> OFF" | sha256sum | cut -c1-12)
WHEELS="$CACHE/llama_cpp_python-$VERSION-$KEY"
SDIST="$CACHE/llama_cpp_python-$VERSION.tar.gz"

if [ ! -f "$SDIST" ]; then
	mkdir -p "$CACHE"
	"$PY" -m pip download -q --disable-pip-version-check --no-binary :all: --no-deps -d "$CACHE" \
		"llama-cpp-python==$VERSION"
fi
if [ ! -f "build/llama_cpp_python-$VERSION/vendor/llama.cpp/convert_hf_to_gguf.py" ]; then
	mkdir -p build
	tar -xzf "$SDIST" -C build
fi
if ! ls "$WHEELS"/llama_cpp_python-"$VERSION"-*.whl >/dev/null 2>&1; then
	echo "Building llama-cpp-python $VERSION for the CPU into $WHEELS (flags: $FLAGS; without llama-common)"
	SRC=$(mktemp -d)
	trap 'rm -rf "$SRC"' EXIT
	tar -xzf "$SDIST" -C "$SRC"
	# llama-cpp-python's CMakeLists forces llama.cpp's common library on, though the wheel's llama_cpp package never
	# loads it (it ships libllama and libggml* in llama_cpp/lib): half the compile. Turn it off, loudly if the line moved.
	LISTS="$SRC/llama_cpp_python-$VERSION/CMakeLists.txt"
	grep -q "$COMMON_ON" "$LISTS" || { echo "build_llama_cpp.sh: '$COMMON_ON' not in $LISTS; update the patch" >&2; exit 1; }
	sed -i "s/$COMMON_ON/${COMMON_ON/ ON / OFF }/" "$LISTS"
	mkdir -p "$WHEELS"
	CMAKE_ARGS="$FLAGS" CMAKE_BUILD_PARALLEL_LEVEL="${JOBS:-2}" \
		"$PY" -m pip wheel -q --disable-pip-version-check --no-deps -w "$WHEELS" "$SRC/llama_cpp_python-$VERSION"
fi
"$PY" -m pip install -q --disable-pip-version-check "$WHEELS"/llama_cpp_python-"$VERSION"-*.whl
