#!/bin/bash
# One GPU round of the H200 benchmark: CUDA vLLM 0.25.0, Qwen3-8B-shaped target, Qwen3-0.6B-shaped
# draft, dummy weights, synthetic acceptance from the study specs' `benchmark` block.
#
# Run ON THE GPU MACHINE from the repo root, after the three transfers of ../shared/gpu/README.md
# (vLLM's pieces, its dependencies) and with .gpu/autotune-deps/*.whl (autotune's own dependencies,
# see benchmarks/gpu/README.md) sent along once:
#     . .gpu/setup-device.sh && bash benchmarks/gpu/round.sh STEP [STEP...]
# Steps, run in order; each writes as it goes under /tmp/h200/results, which a background loop
# copies to $OUT every few seconds as results.tgz plus round.log, points.jsonl, trials.jsonl/.txt
# (a command killed at its time limit still returns its rows):
#   setup                       autotune deps, model folders, replay set, vLLM version, probe
#   study:WORKLOAD:SECONDS[:STARTS]
#                               `autotune study start` on benchmarks/gpu/WORKLOAD.yaml with
#                               `--pause-after-minutes` (SECONDS - 20 s: it begins only the starts
#                               its earlier starts say will end in time, then pauses; the next call
#                               resumes), SIGINT after SECONDS as the backstop, then trials exported;
#                               STARTS: `--pause-after-starts` for this call (at most STARTS server
#                               starts; a method's first start is estimated at 1.5 x the study's
#                               longest, so the first step of a study is best sized by hand);
#                               STUDY_ARGS in the environment: more options (`--nightly --study-name X`)
#   points:WORKLOAD:LABEL:JSON  measure the speculative configs of JSON (a list) once each, in order (a
#                               config listed twice is started twice); DEADLINE_S=N in the environment:
#                               begin a start only when the step's longest start so far fits in N s;
#                               WINDOWS=N: N steady windows per start (measure_points.py --windows);
#                               EQUIVALENCE=1: the greedy equivalence replays too (judge_points.py)
#   grid:WORKLOAD:SECONDS:ITEMS[:STARTS]
#                               measure grid points not measured yet (ITEMS: none,ngram=1/2/4,...),
#                               ending within SECONDS: a point begins only when the step's longest
#                               start so far (150 s before one) fits; keep SECONDS + setup under the
#                               command's limit, or the machine goes cold after the kill
#                               (neither in this round's rows nor in benchmarks/results/h200-*.jsonl);
#                               with STARTS (default 1), until each point has that many measured
#                               starts there, every point's first start before any second one;
#                               PROTOCOL=window-filled in the environment: count only rows measured
#                               with filled steady windows (round 5 on); ROUND_ONLY=1: count only this
#                               round's rows (repeats on one machine: its own start-to-start noise)
#   models                      the other methods' inputs: arctic-inference from .whl/*.whl (suffix
#                               decoding) into vLLM's /tmp/site, the EAGLE-3 head and the MiMo-7B-shaped
#                               MTP target (make_method_models.py); forgets the cached vLLM probe
#   smollm2                     the real SmolLM2-135M: autotune deps, arctic-inference from .whl/ (suffix),
#                               the target and its 8-layer draft from the GGUF pieces .gpu/g*/gguf-*
#                               (make_smollm2.py), the real replay sets of .gpu/replay/ (make_real_replay.py)
#   patch / unpatch             drafter CUDA-graph experiment (patch_drafter_cudagraph.py)
#   sleep:N                     wait (lets the machine finish writing)
set -u
T0=$(date +%s)
R=/tmp/h200
mkdir -p $R/results $R/home $R/logs
OUT=${OUT:-$R/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD:${PYTHONPATH:-}:/tmp/atsite
export AUTOTUNE__HOME=$R/home AUTOTUNE__LOCK_DIR=$R/locks VLLM_USE_FLASHINFER_SAMPLER=0
# the machine returns at most 8 files per command: one tarball of everything plus the key rows
sync_out() {
  tar czf "$OUT"/partial.tgz -C $R/results . 2>/dev/null && mv "$OUT"/partial.tgz "$OUT"/results.tgz
  for f in round.log points.jsonl trials.jsonl trials.txt; do [ -f $R/results/$f ] && cp $R/results/$f "$OUT"/; done
}
( while sleep 5; do sync_out; done ) &
SYNC=$!
trap 'sync_out; kill $SYNC 2>/dev/null' EXIT
log() { echo "[round +$(( $(date +%s) - T0 ))s] $*" | tee -a $R/results/round.log; }

export_trials() {
  # every study storage of the round (the specs name their own: autotune.db, autotune-smollm2.db)
  : > $R/results/trials.jsonl; : > $R/results/trials.txt
  for db in $R/autotune*.db; do
    [ -f "$db" ] || continue
    python3 benchmarks/gpu/export_study.py sqlite:///$db $R/results/trials-part.jsonl >> $R/results/trials.txt 2>&1
    cat $R/results/trials-part.jsonl >> $R/results/trials.jsonl 2>/dev/null; rm -f $R/results/trials-part.jsonl
    cp "$db" $R/results/ 2>/dev/null
  done
  mkdir -p $R/results/recommendations && cp $R/recommendations/*.json $R/results/recommendations/ 2>/dev/null
  # each trial's server log: the lines on CUDA graphs, compile, drafter, fallbacks, errors; whole logs gzipped
  mkdir -p $R/results/logs
  for f in $(find $R/home/logs $R/logs -name '*.log' 2>/dev/null); do
    n=$(echo "$f" | sed "s#$R/##; s#/#_#g")
    grep -iE 'cuda ?graph|cudagraph|eager|fall(ing)? ?back|draft|async sched|model runner|compil|Capturing|speculative|error|warning' "$f" | cut -c1-400 | head -200 > $R/results/logs/$n.grep
    gzip -c "$f" > $R/results/logs/$n.gz
  done
}

for step in "$@"; do
  IFS=: read -r what a b c <<< "$step"   # c: the rest (points' JSON has colons)
  d=; [ "$what" = grid ] && IFS=: read -r c d <<< "$c"
  log "step $step"
  case $what in
    setup)
      if [ ! -f /tmp/atsite/.ok ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/atsite .gpu/autotune-deps/*.whl 2>&1 | tail -2
        touch /tmp/atsite/.ok
      fi
      [ -d /tmp/models/qwen3-8b ] || python3 .gpu/make_models.py /tmp/models | tail -2
      [ -f $R/replay.jsonl ] && [ "$(wc -l < $R/replay.jsonl)" -ge 400 ] || python3 benchmarks/gpu/make_replay.py $R/replay.jsonl --n 400
      { vllm --version; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; } > $R/results/setup.txt 2>&1
      AUTOTUNE__STUDIES_DIR=benchmarks/gpu python3 -m autotune probe --workload code-h200 > $R/results/probe.txt 2>&1
      python3 -c "import optuna, sqlalchemy, vllm; print('optuna', optuna.__version__, 'vllm', vllm.__version__)" >> $R/results/setup.txt 2>&1
      cat $R/results/setup.txt; tail -5 $R/results/probe.txt ;;
    study)
      # the study pauses itself before a start not expected to end 20 s before the limit; SIGINT is the backstop
      timeout -s INT "$b" python3 -m autotune -v study start --workload "$a" --spec benchmarks/gpu/"$a".yaml \
        --pause-after-minutes "$(awk "BEGIN{print ($b - 20) / 60}")" ${c:+--pause-after-starts "$c"} ${STUDY_ARGS:-} \
        > >(tee -a $R/results/study-"$a".out) 2>&1
      log "study $a exit $?"
      export_trials; tail -20 $R/results/trials.txt ;;
    points)
      python3 benchmarks/gpu/measure_points.py benchmarks/gpu/"$a".yaml --label "$b" --configs "$c" \
        ${DEADLINE_S:+--deadline-s "$DEADLINE_S"} ${WINDOWS:+--windows "$WINDOWS"} ${EQUIVALENCE:+--equivalence} \
        --out $R/results/points.jsonl --log-dir $R/logs 2>&1 | tee -a $R/results/points.out
      export_trials ;;
    grid)
      earlier=$(ls benchmarks/results/h200-{trials,points,methods}-*.jsonl)
      [ -n "${ROUND_ONLY:-}" ] && earlier=
      python3 benchmarks/gpu/measure_points.py benchmarks/gpu/"$a".yaml --deadline-s "$b" --starts "${d:-1}" \
        ${PROTOCOL:+--protocol "$PROTOCOL"} \
        --grid $(echo "$c" | tr ',' ' ' | tr '=' ':' | tr '/' ',') --out $R/results/points.jsonl \
        --done $R/results/trials.jsonl $earlier \
        --log-dir $R/logs 2>&1 | tee -a $R/results/points.out
      export_trials ;;
    models)
      if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
      fi
      python3 benchmarks/gpu/make_method_models.py /tmp/models | tee -a $R/results/round.log
      rm -f $R/home/cache/probe-*.json
      python3 -c "import arctic_inference.suffix_decoding as s, vllm; print('arctic_inference', s.__file__)" 2>&1 \
        | tail -1 | tee -a $R/results/setup.txt ;;
    smollm2)
      if [ ! -f /tmp/atsite/.ok ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/atsite .gpu/autotune-deps/*.whl 2>&1 | tail -2
        touch /tmp/atsite/.ok
      fi
      if ls .whl/*.whl >/dev/null 2>&1 && [ ! -d /tmp/site/arctic_inference ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl 2>&1 | tail -2
        rm -f $R/home/cache/probe-*.json
      fi
      mkdir -p /tmp/gguf && cp .gpu/g*/* /tmp/gguf/ 2>/dev/null
      [ -f /tmp/models/smollm2-135m-draft-8l/model.safetensors ] || python3 benchmarks/gpu/make_smollm2.py /tmp/models \
        --pieces /tmp/gguf --drafts 8 2>&1 | tail -4 | tee -a $R/results/round.log
      for f in .gpu/replay/*.jsonl; do cp "$f" $R/replay-"$(basename "$f")"; done
      { vllm --version; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; \
        python3 -c "import optuna, transformers, vllm; print('optuna', optuna.__version__, 'transformers', transformers.__version__, 'vllm', vllm.__version__)"; \
        python3 -c "import arctic_inference.suffix_decoding as s; print('arctic_inference', s.__file__)"; \
        wc -l $R/replay-*.jsonl; } > $R/results/setup.txt 2>&1
      cat $R/results/setup.txt ;;
    patch)   python3 benchmarks/gpu/patch_drafter_cudagraph.py /tmp/site/vllm | tee -a $R/results/round.log ;;
    unpatch) python3 benchmarks/gpu/patch_drafter_cudagraph.py /tmp/site/vllm --revert | tee -a $R/results/round.log ;;
    sleep)   sleep "$a" ;;
    *) log "unknown step $step" ;;
  esac
done
log "done"
