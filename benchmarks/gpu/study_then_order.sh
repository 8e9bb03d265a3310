#!/bin/bash
# One command of a study-then-order round, the same command each time until the time runs out:
# begin or resume the study while it has no recommendation (LOSSY=JSON in the environment: after
# its first FIRST_STARTS starts, default 2, one start of that lossy configuration with the greedy
# equivalence replays, judged against the study's baseline by judge_points.py), then the
# after-study starts of order_after_study.py (none, the winner, the runner-up in A B C C B A A B C
# C B A), each with its equivalence replays, until LIMIT seconds of this command have passed.
#   . .gpu/setup-device.sh && [LOSSY='{...}'] bash benchmarks/gpu/study_then_order.sh 570 [WORKLOAD]
set -u
LIMIT=$1; W=${2:-code-smollm2-gpu}; R=/tmp/h200
export PYTHONPATH=$PWD:${PYTHONPATH:-}:/tmp/atsite   # autotune and its dependencies (round.sh sets its own)
left() { echo $(( LIMIT - SECONDS )); }
lossy_left() { [ -n "${LOSSY:-}" ] && ! grep -q '"label": "lossy"' $R/results/points.jsonl 2>/dev/null; }
if [ ! -f $R/recommendations/$W.json ]; then
  # with LOSSY: the study's first FIRST_STARTS starts (the baseline and a candidate: what the lossy
  # start is judged against), then the lossy start, then the rest of the study
  if lossy_left; then
    s=$(left); [ "$s" -gt 150 ] && bash benchmarks/gpu/round.sh "study:$W:$s:${FIRST_STARTS:-2}"
    [ "$(left)" -gt 160 ] && EQUIVALENCE=1 DEADLINE_S=$(( $(left) - 10 )) bash benchmarks/gpu/round.sh "points:$W:lossy:[$LOSSY]"
  fi
  s=$(left); [ "$s" -gt 150 ] && bash benchmarks/gpu/round.sh "study:$W:$s"
fi
if lossy_left && [ "$(left)" -gt 160 ]; then
  EQUIVALENCE=1 DEADLINE_S=$(( $(left) - 10 )) bash benchmarks/gpu/round.sh "points:$W:lossy:[$LOSSY]"
fi
if [ -f $R/results/points.jsonl ] && grep -q '"outputs"' $R/results/points.jsonl; then
  python3 benchmarks/gpu/judge_points.py --trials $R/results/trials.jsonl --points $R/results/points.jsonl \
    --json $R/results/verdicts.json | tee -a $R/results/round.log
fi
# where the study's time went, as an operator reads it (`study show`: each start's phases, the night's sums)
AUTOTUNE__STUDIES_DIR=benchmarks/gpu AUTOTUNE__HOME=$R/home python3 -m autotune study show $W > $R/results/study-show.txt 2>&1
[ -f $R/recommendations/$W.json ] || { echo "study-then-order: no recommendation yet"; exit 0; }
order=$(python3 benchmarks/gpu/order_after_study.py --rec $R/recommendations/$W.json \
  --trials $R/results/trials.jsonl --points $R/results/points.jsonl --label after-study)
echo "study-then-order: left $(left) s, order $order"
[ -n "$order" ] && [ "$(left)" -gt 90 ] && \
  EQUIVALENCE=1 DEADLINE_S=$(( $(left) - 10 )) bash benchmarks/gpu/round.sh "points:$W:after-study:$order"
[ -f $R/results/points.jsonl ] && python3 benchmarks/gpu/judge_points.py --trials $R/results/trials.jsonl \
  --points $R/results/points.jsonl --json $R/results/verdicts.json > /dev/null && cp $R/results/verdicts.json "${OUT:-/tmp}"/ 2>/dev/null
echo "study-then-order: done at $SECONDS s"
