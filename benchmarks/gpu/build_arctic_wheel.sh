#!/bin/bash
# Build the arctic-inference wheel that suffix decoding needs in vLLM's environment on the GPU machine
# (CPython 3.12, x86-64), on this machine. PyPI has arctic-inference 0.3.0 as an sdist only (binary
# wheels stop at 0.0.4), and its setup.py imports torch and builds CUDA ops besides; vLLM 0.25's
# suffix proposer imports only `arctic_inference.suffix_decoding` (SuffixDecodingCache, a C++ suffix
# tree bound with nanobind). So this builds that one extension with cmake and packs it with the
# package's Python files (the vLLM plugin entry point included: it does nothing unless
# ARCTIC_INFERENCE_ENABLED=1) into .whl/arctic_inference-0.3.0-cp312-cp312-linux_x86_64.whl.
#   usage: bash benchmarks/gpu/build_arctic_wheel.sh [PYTHON3.12]     (from the repo root; ~1 min)
# Needs: a CPython 3.12 with pip, cmake >= 3.18, a C++20 compiler; glibc no newer than the GPU
# machine's (2.36 here builds what runs there).
set -euo pipefail
PY=${1:-}
if [ -z "$PY" ]; then
  for c in python3.12 /root/.pyenv/versions/3.12*/bin/python3.12; do
    "$c" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null && PY=$c && break
  done
fi
[ -n "$PY" ] || { echo "no CPython 3.12 found; pass one" >&2; exit 1; }
DEST=$PWD/.whl
W=$(mktemp -d)
mkdir -p "$DEST"
# the sdist (ARCTIC_SDIST, or fetched: pip prepares its metadata, and its setup.py imports torch, so the
# fetching python3 needs torch)
if [ -n "${ARCTIC_SDIST:-}" ]; then cp "$ARCTIC_SDIST" "$W"/; else python3 -m pip download -q --no-deps arctic-inference==0.3.0 -d "$W"; fi
"$PY" -m pip install -q --target "$W/nb" nanobind==2.9.2
tar xzf "$W"/arctic_inference-0.3.0.tar.gz -C "$W"
S=$W/arctic_inference-0.3.0
mkdir -p "$W/build"
(cd "$W/build" && PYTHONPATH=$W/nb cmake "$S/csrc/suffix_decoding" -DPython_EXECUTABLE="$PY" \
   -DCMAKE_BUILD_TYPE=Release -DCMAKE_LIBRARY_OUTPUT_DIRECTORY="$W/build/out" >/dev/null \
 && PYTHONPATH=$W/nb cmake --build . -j2 >/dev/null)
mkdir -p "$W/wheel" && cd "$W/wheel"
cp -r "$S/arctic_inference" . && rm -rf arctic_inference/embedding arctic_inference/dynasor arctic_inference/server
cp "$W"/build/out/_C.cpython-312-*.so arctic_inference/suffix_decoding/
find . -name __pycache__ -prune -exec rm -rf {} +
D=arctic_inference-0.3.0.dist-info
mkdir $D && cp "$S/PKG-INFO" $D/METADATA && cp "$S/LICENSE" $D/ && echo arctic_inference > $D/top_level.txt
printf '[vllm.general_plugins]\narctic_inference = arctic_inference.vllm.plugin:arctic_inference_plugin\n' > $D/entry_points.txt
printf 'Wheel-Version: 1.0\nGenerator: build_arctic_wheel.sh (suffix_decoding extension only)\nRoot-Is-Purelib: false\nTag: cp312-cp312-linux_x86_64\n' > $D/WHEEL
"$PY" - <<'EOF'
import base64, hashlib, os
rows = []
for root, _, files in os.walk("."):
    for f in files:
        p = os.path.join(root, f)[2:]
        h = base64.urlsafe_b64encode(hashlib.sha256(open(p, "rb").read()).digest()).rstrip(b"=").decode()
        rows.append(f"{p},sha256={h},{os.path.getsize(p)}")
rows.append("arctic_inference-0.3.0.dist-info/RECORD,,")
open("arctic_inference-0.3.0.dist-info/RECORD", "w").write("\n".join(rows) + "\n")
EOF
rm -f "$DEST"/arctic_inference-*.whl
"$PY" -m zipfile -c "$DEST/arctic_inference-0.3.0-cp312-cp312-linux_x86_64.whl" arctic_inference $D
rm -rf "$W"
ls -la "$DEST"/arctic_inference-*.whl
