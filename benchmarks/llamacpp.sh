#!/usr/bin/env bash
# The llama.cpp benchmarks of docs/notes/2026-12-01-llamacpp-smollm2.md: per
# workload (code-llamacpp, chat-llamacpp) the exhaustive grid (2 fresh starts per configuration,
# raw rows in benchmarks/results/grid-<workload>.jsonl; a rerun skips the starts recorded), then
# one study with the shipped spec (its recommendation copied to benchmarks/results/study-<workload>.json).
# Needs `make llamacpp`. On a shared machine run it under the server lock:
#   bash benchmarks/llamacpp.sh
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
work=${LLAMACPP_BENCH_DIR:-$(mktemp -d)}
for w in ${WORKLOADS:-code-llamacpp chat-llamacpp}; do
  "$py" benchmarks/grid.py "studies/$w.yaml" --k "${KS:-2,4,8}" --starts "${STARTS:-2}"
  AUTOTUNE__STORAGE="sqlite:///$work/studies.db" AUTOTUNE__RECOMMENDATIONS_DIR="$work/recommendations" \
  AUTOTUNE__HOME="$work/home" "$py" -m autotune study start --workload "$w" | tee "$work/$w.log"
  cp "$work/recommendations/$w.json" "benchmarks/results/study-$w.json"
  cp "$work/$w.log" "benchmarks/results/study-$w.log"
done
