"""Every recommendation kept, and what changed between two of them.

The file SREs deploy (``recommendations/<workload>.json``) is always the latest; each one is
also copied to ``recommendations/history/<workload>/<id>-<decision>.json`` and inserted into
``autotune_recommendations``. The three are written as one: the table row is inserted in an
open transaction, the history copy and the new file's temp file are written and fsynced, the
transaction commits, and only then is the temp file renamed over the current file. Any failure
before the rename leaves the previous recommendation (file and table) as it was.

Drift has one meaning in autotune: production no longer looks like what the current
recommendation was measured on. ``autotune drift check`` (``trust._drift``) reads it from
traffic, telemetry and the engine before any server starts; a study measures it directly: the
nightly run replays the incumbent (the config currently recommended) on fresh traffic, and if its
acceptance rate (accepted / drafted tokens) falls below ``drift.min_acceptance_rate`` (0.4, the
threshold the source article gives for turning speculation off or falling back to n-gram), the
recommendation's ``drift`` block says ``drifted`` and why. A recommended config that differs from
the previous one is a change, not drift: ``winner_changed`` records it beside, and ``autotune
recommend diff`` explains both.
"""

from __future__ import annotations

import datetime as dt
import errno
import json
import uuid
from pathlib import Path

from autotune.core._inputs import read_input
from autotune.core._names import check_workload, child
from autotune.core._schedule import iso, parse_iso
from autotune.decide._decision import fmt_config  # noqa: F401 (callers read it here too)
from autotune.decide._payload import load, recommendation_path, write_atomic
from autotune.search._record import StudyRecord
from autotune.search._space import NONE, canonical
from autotune.search._trial import spec_counters


def new_rec_id() -> str:
    """Sortable: a microsecond UTC timestamp, then a random suffix."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ") + "-" + uuid.uuid4().hex[:6]


def history_dir(recommendations_dir: str | Path, workload: str) -> Path:
    return child(Path(recommendations_dir) / "history", check_workload(workload))


# ---- drift ----------------------------------------------------------------------------------
def drift_block(study: StudyRecord, payload: dict, previous: dict | None, threshold: float) -> dict:
    incumbent = study.spec.incumbent
    acc = spec_counters(study.trials(config_key=canonical(incumbent))) if incumbent else \
        {"acceptance_rate": None, "acceptance_length": None, "trials": 0}
    acc = {"rate": acc["acceptance_rate"], "length": acc["acceptance_length"], "trials": acc["trials"]}
    notes = []
    below = acc["rate"] is not None and acc["rate"] < threshold
    if below:
        notes.append(f"incumbent {fmt_config(incumbent)} accepts {acc['rate']:.2f} of drafted tokens on this "
                     f"traffic, below the {threshold:.2f} threshold: the traffic no longer suits it")
    elif incumbent and acc["trials"] == 0:
        notes.append(f"incumbent {fmt_config(incumbent)} was not measured in this study (outside its space "
                     "or budget): its acceptance is unknown")
    prev_cfg = previous.get("speculative_config") if previous else None
    changed = previous is not None and canonical(prev_cfg) != canonical(payload.get("speculative_config"))
    if changed:
        notes.append(f"recommended config changed: {fmt_config(prev_cfg)} -> "
                     f"{fmt_config(payload.get('speculative_config'))} "
                     f"(decision {previous.get('decision')} -> {payload.get('decision')})")
    return {
        "incumbent": incumbent,
        "incumbent_acceptance_rate": acc["rate"],
        "incumbent_acceptance_length": acc["length"],
        "min_acceptance_rate": threshold,
        "acceptance_below_threshold": below,
        "winner_changed": changed,
        "previous": None if previous is None else {
            "id": previous.get("id"), "created_at": previous.get("created_at"),
            "decision": previous.get("decision"), "speculative_config": prev_cfg},
        "drifted": below,
        "notes": notes,
    }


# ---- reading ----------------------------------------------------------------------------------
def history(workload: str, recommendations_dir: str | Path, store=None) -> list[dict]:
    """Every recommendation of a workload, newest first: from the table, else the history files."""
    if store is not None:
        rows = store.recommendations(workload)
        if rows:
            return [r["payload"] for r in rows]
    files = sorted(history_dir(recommendations_dir, workload).glob("*.json"), reverse=True)
    out = []
    for p in files:
        try:
            rec = json.loads(read_input(p, "recommendation"))
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(rec, dict):  # a copy edited into something else is no recommendation
            out.append(rec)
    return out


def previous(workload: str, recommendations_dir: str | Path, store=None) -> dict | None:
    h = history(workload, recommendations_dir, store)
    if h:
        return h[0]
    try:
        return load(recommendations_dir, workload)
    except (OSError, ValueError):  # none, or not one autotune wrote: no previous recommendation
        return None


# ---- writing --------------------------------------------------------------------------------
def write(payload: dict, recommendations_dir: str | Path, store=None, run_id: str | None = None) -> Path:
    """Table row + history copy + current file, all or nothing (see the module doc)."""
    rec_id = new_rec_id()
    payload = {**payload, "id": rec_id}
    workload = payload["workload"]
    path = recommendation_path(recommendations_dir, workload)
    hist = history_dir(recommendations_dir, workload) / f"{rec_id}-{payload['decision']}.json"
    ev = payload.get("evidence") or {}
    cfg = payload.get("speculative_config") or (ev.get("winner") or {}).get("config") or {}
    drift = payload.get("drift") or {}
    row = {"rec_id": rec_id, "workload": workload, "created_at": _iso_z(payload.get("created_at")),
           "run_id": run_id, "study_name": (payload.get("study") or {}).get("name"),
           "decision": payload["decision"], "method": cfg.get("method") if cfg else NONE,
           "k": cfg.get("num_speculative_tokens") if cfg else None, "speedup": ev.get("speedup"),
           "speedup_ci_low": (ev.get("speedup_ci") or [None, None])[0],
           "speedup_ci_high": (ev.get("speedup_ci") or [None, None])[1],
           "incumbent_acceptance_rate": drift.get("incumbent_acceptance_rate"),
           "drift": int(bool(drift.get("drifted"))), "winner_changed": int(bool(drift.get("winner_changed"))),
           "reason": payload.get("reason", ""), "history_path": str(hist),
           "payload": json.dumps(payload, default=str)}
    refuse_to_replace(path)
    conn = store.engine.connect() if store is not None else None
    trans = conn.begin() if conn is not None else None
    committed = False

    def commit() -> None:
        nonlocal committed
        refuse_to_replace(path)  # what the rename would refuse, found while the row can still roll back
        if trans is not None:
            trans.commit()
            committed = True

    try:
        if conn is not None:
            store.add_recommendation(conn, row)
        try:
            write_atomic(hist, payload, root=recommendations_dir)
            write_atomic(path, payload, before_replace=commit, root=recommendations_dir)
        except BaseException:
            hist.unlink(missing_ok=True)
            if committed:  # the rename failed after the commit: the row goes too
                store.remove_recommendation(rec_id)
            raise
    finally:
        if conn is not None:
            if trans.is_active:
                trans.rollback()
            conn.close()
    return path


def refuse_to_replace(path: Path) -> None:
    """A folder (or a FIFO, a device) where the recommendation file goes is no file to replace:
    an OSError naming it, so the write fails before anything is committed."""
    if (path.exists() or path.is_symlink()) and not path.is_file():
        kind = "a folder" if path.is_dir() else "not a regular file"
        raise IsADirectoryError(errno.EISDIR, f"{kind}, not a recommendation file; move it away", str(path))


def _iso_z(created_at: str | None) -> str:
    return iso(parse_iso(created_at)) if created_at else iso()


# ---- diff -------------------------------------------------------------------------------------
def diff_lines(old: dict, new: dict) -> list[str]:
    """What changed from ``old`` to ``new``, and why (the new one's reason and drift notes)."""
    out = [f"{new.get('workload')}: {old.get('created_at')} -> {new.get('created_at')}"]
    if old.get("decision") != new.get("decision"):
        out.append(f"  decision: {old.get('decision')} -> {new.get('decision')}")
    else:
        out.append(f"  decision: {new.get('decision')} (unchanged)")
    a, b = old.get("speculative_config") or {}, new.get("speculative_config") or {}
    if canonical(a or None) == canonical(b or None):
        out.append(f"  speculative_config: unchanged ({fmt_config(b or None)})")
    else:
        out.append(f"  speculative_config: {fmt_config(a or None)} -> {fmt_config(b or None)}")
        for k in sorted(set(a) | set(b)):
            if k not in a:
                out.append(f"    + {k}: {json.dumps(b[k])}")
            elif k not in b:
                out.append(f"    - {k}: {json.dumps(a[k])}")
            elif a[k] != b[k]:
                out.append(f"    ~ {k}: {json.dumps(a[k])} -> {json.dumps(b[k])}")
    ea, eb = old.get("evidence") or {}, new.get("evidence") or {}
    if ea.get("speedup") is not None or eb.get("speedup") is not None:
        out.append(f"  speedup: {_x(ea.get('speedup'))} -> {_x(eb.get('speedup'))} "
                   f"(CI {_ci(ea)} -> {_ci(eb)})")
    da, db = old.get("drift") or {}, new.get("drift") or {}
    ra, rb = da.get("incumbent_acceptance_rate"), db.get("incumbent_acceptance_rate")
    if ra is not None or rb is not None:
        flag = "  BELOW THRESHOLD" if db.get("acceptance_below_threshold") else ""
        out.append(f"  incumbent acceptance rate: {_f(ra)} -> {_f(rb)} "
                   f"(threshold {_f(db.get('min_acceptance_rate'))}){flag}")
    for label, key in (("replay set", ("replay_set", "digest")), ("vLLM", ("valid_for", "vllm_version")),
                       ("model", ("valid_for", "model")), ("study", ("study", "name"))):
        va, vb = (old.get(key[0]) or {}).get(key[1]), (new.get(key[0]) or {}).get(key[1])
        if va != vb:
            out.append(f"  {label}: {va} -> {vb}")
    out.append(f"  why: {new.get('reason')}")
    for note in db.get("notes") or []:
        out.append(f"  drift: {note}")
    return out


def _x(v) -> str:
    return f"{v:.2f}x" if isinstance(v, (int, float)) else "-"


def _f(v) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "-"


def _ci(ev: dict) -> str:
    ci = ev.get("speedup_ci")
    return f"{ci[0]:.2f}-{ci[1]:.2f}" if ci and None not in ci else "-"
