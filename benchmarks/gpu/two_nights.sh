#!/bin/bash
# One command of a two-nights round, the same command each time until both nights have a
# recommendation: the code-smollm2 night as any night runs (night 1: no recommendation before it,
# the full search), then the next night as the scheduler runs it (`--nightly`: the incumbent is
# night 1's recommendation, and objective.carry_search carries night 1's search where tonight's
# baseline and winner starts agree with it). Same spec, same machine, one after the other; each
# night's GPU minutes (first server start to recommendation), starts and decision side by side in
# two-nights.json (two_nights.py).
#   . .gpu/setup-device.sh && bash benchmarks/gpu/two_nights.sh 570
set -u
LIMIT=$1; W=code-smollm2-night-carry; R=/tmp/h200
export PYTHONPATH=$PWD:${PYTHONPATH:-}:/tmp/atsite
left() { echo $(( LIMIT - SECONDS )); }
show() {  # the night's study as `study show` prints it (the per-start time lines)
  AUTOTUNE__STUDIES_DIR=benchmarks/gpu AUTOTUNE__HOME=$R/home python3 -m autotune study show $W ${1:+--study-name "$1"} \
    > $R/results/study-show-$W${2:-}.txt 2>&1
}
if [ ! -f $R/results/night-1.json ]; then
  s=$(left); [ "$s" -gt 150 ] && bash benchmarks/gpu/round.sh "study:$W:$s"
  if [ -f $R/recommendations/$W.json ]; then
    cp $R/recommendations/$W.json $R/results/night-1.json; show "" -1
  fi
fi
if [ -f $R/results/night-1.json ] && [ ! -f $R/results/night-2.json ]; then
  s=$(left)
  if [ "$s" -gt 150 ]; then
    STUDY_ARGS="--nightly --study-name autotune-$W-night-2" bash benchmarks/gpu/round.sh "study:$W:$s"
    # the recommendation is night 2's once it names night 2's study
    grep -q "autotune-$W-night-2" $R/recommendations/$W.json 2>/dev/null && \
      cp $R/recommendations/$W.json $R/results/night-2.json && show autotune-$W-night-2 -2
  fi
fi
if [ -f $R/results/night-2.json ]; then
  python3 benchmarks/gpu/two_nights.py $R/results/trials.jsonl $R/results/night-1.json $R/results/night-2.json \
    --json $R/results/two-nights.json | tee -a $R/results/round.log
fi
# what round.sh's own copy to $OUT ended before (the nights' files, written after its last step), within
# the 8 files a command returns: the tarball again, and the nights' three
if [ -n "${OUT:-}" ]; then
  tar czf "$OUT"/partial.tgz -C $R/results . && mv "$OUT"/partial.tgz "$OUT"/results.tgz
  for f in night-1.json night-2.json two-nights.json trials.jsonl; do cp $R/results/$f "$OUT"/ 2>/dev/null; done
fi
echo "two-nights: done at $SECONDS s"
