#!/bin/bash
# One command of a night-then-cuts round, the same command each time until the time runs out:
# begin or resume the night with the start-up cut (code-smollm2-night-fast) while it has no
# recommendation, on a machine whose compile caches are fresh (as any night's first starts are);
# then the cut against no cut: the night's two configurations started with the default spec
# (code-smollm2-night, D) and with the cut (code-smollm2-night-fast, F) in a mirrored order,
# D F F D for ngram K=10 then for no speculation, then the same with the arms swapped, one start
# a `points:` step (label cuts-ab), each begun only while a start still fits the command's LIMIT.
# Every row keeps its timeline (where its start's seconds went); cuts_ab.py turns the rows into
# the cut's effect on TPOT and on the start, and the nights' GPU minutes and decisions.
# NIGHT=0: the mirrored starts without the night first (where device time allows only them).
# K10_ONLY=1: ngram K=10 alone, in eight mirrored pairs (D F F D F D D F, twice).
# CUT names the cut's spec (default code-smollm2-night-fast, the fork cut; code-smollm2-night-preload: the
# preloaded API process).
#   . .gpu/setup-device.sh && CUT=code-smollm2-night-preload bash benchmarks/gpu/night_then_cuts.sh 570
set -u
LIMIT=$1; W=${CUT:-code-smollm2-night-fast}; R=/tmp/h200
export PYTHONPATH=$PWD:${PYTHONPATH:-}:/tmp/atsite
left() { echo $(( LIMIT - SECONDS )); }
if [ "${NIGHT:-1}" = 0 ]; then
  echo "night-then-cuts: NIGHT=0, the mirrored starts only"
elif [ ! -f $R/recommendations/$W.json ]; then
  s=$(left); [ "$s" -gt 150 ] && bash benchmarks/gpu/round.sh "study:$W:$s"
  AUTOTUNE__STUDIES_DIR=benchmarks/gpu AUTOTUNE__HOME=$R/home python3 -m autotune study show $W \
    > $R/results/study-show-$W.txt 2>&1
fi
[ "${NIGHT:-1}" = 0 ] || [ -f $R/recommendations/$W.json ] || { echo "night-then-cuts: no recommendation yet"; exit 0; }
K10='{"method":"ngram","num_speculative_tokens":10,"prompt_lookup_min":2,"prompt_lookup_max":4}'
D=code-smollm2-night; F=$W
ORDER=("$D $K10" "$F $K10" "$F $K10" "$D $K10" "$D null" "$F null" "$F null" "$D null"
       "$F $K10" "$D $K10" "$D $K10" "$F $K10" "$F null" "$D null" "$D null" "$F null")
WARM="[$K10,null]"
if [ "${K10_ONLY:-0}" = 1 ]; then  # ngram K=10 alone, eight mirrored pairs: where a cut's verdict is open
  ORDER=(); for _ in 1 2; do ORDER+=("$D $K10" "$F $K10" "$F $K10" "$D $K10" "$F $K10" "$D $K10" "$D $K10" "$F $K10"); done
  WARM="[$K10]"
fi
done_n=$(grep -c '"label": "cuts-ab"' $R/results/points.jsonl 2>/dev/null); done_n=${done_n:-0}
longest=75
if [ "${NIGHT:-1}" = 0 ] && ! grep -q '"label": "warm"' $R/results/points.jsonl 2>/dev/null; then
  # no night before: one start of each configuration fills its compile cache, as the night's would
  bash benchmarks/gpu/round.sh "points:$D:warm:$WARM"
fi
for ((i = done_n; i < ${#ORDER[@]}; i++)); do
  read -r spec cfg <<< "${ORDER[$i]}"
  [ "$(left)" -gt $(( longest + 15 )) ] || { echo "night-then-cuts: $(left) s left, start $i not begun"; break; }
  t=$SECONDS
  bash benchmarks/gpu/round.sh "points:$spec:cuts-ab:[$cfg]"
  [ $(( SECONDS - t )) -gt $longest ] && longest=$(( SECONDS - t ))
done
python3 benchmarks/gpu/cuts_ab.py $R/results/points.jsonl --trials $R/results/trials.jsonl --cut-workload $F \
  --json $R/results/cuts-ab.json | tee -a $R/results/round.log
cp $R/results/cuts-ab.json "${OUT:-/tmp}"/ 2>/dev/null
echo "night-then-cuts: done at $SECONDS s"
