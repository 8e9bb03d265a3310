#!/bin/bash
# One command of a study-then-order round, the same command each time until the time runs out:
# begin or resume the study while it has no recommendation, then the after-study starts of
# order_after_study.py (none, the winner, the runner-up in A B C C B A A B C C B A) until LIMIT
# seconds of this command have passed.
#   . .gpu/setup-device.sh && bash benchmarks/gpu/study_then_order.sh 570 [WORKLOAD]
set -u
LIMIT=$1; W=${2:-code-smollm2-gpu}; R=/tmp/h200
export PYTHONPATH=$PWD:${PYTHONPATH:-}:/tmp/atsite   # autotune and its dependencies (round.sh sets its own)
left() { echo $(( LIMIT - SECONDS )); }
if [ ! -f $R/recommendations/$W.json ]; then
  s=$(left); [ "$s" -gt 150 ] && bash benchmarks/gpu/round.sh "study:$W:$s"
fi
[ -f $R/recommendations/$W.json ] || { echo "study-then-order: no recommendation yet"; exit 0; }
order=$(python3 benchmarks/gpu/order_after_study.py --rec $R/recommendations/$W.json \
  --trials $R/results/trials.jsonl --points $R/results/points.jsonl --label after-study)
echo "study-then-order: left $(left) s, order $order"
[ -n "$order" ] && [ "$(left)" -gt 90 ] && \
  DEADLINE_S=$(( $(left) - 10 )) bash benchmarks/gpu/round.sh "points:$W:after-study:$order"
echo "study-then-order: done at $SECONDS s"
