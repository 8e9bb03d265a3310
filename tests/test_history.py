"""Recommendation history and drift: every recommendation kept (table + files), written all or
nothing, `recommend diff` / `recommend history`, and the drift block (incumbent acceptance below
the 0.4 threshold, winner changed)."""

from __future__ import annotations

import errno
import json
import os
import stat
from pathlib import Path

import optuna
import pytest
from click.testing import CliRunner

from autotune.core import _files
from autotune.decide import _history
from autotune.decide._payload import SCHEMA, serve_args_for
from autotune.cli._main import main
from autotune.search import study_record
from autotune.search._space import canonical
from autotune.core._spec import load_spec
from autotune.core._store import Store

ROOT = Path(__file__).resolve().parent.parent
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 24, "suffix_decoding_max_tree_depth": 24,
          "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}


def _payload(decision="change", config=NGRAM, created="2026-11-28T02:00:00+00:00", speedup=2.5, drift=None):
    return {"schema": SCHEMA, "workload": "code", "decision": decision, "reason": f"{decision} because",
            "speculative_config": config, "created_at": created,
            "evidence": {"speedup": speedup, "speedup_ci": [speedup - 0.2, speedup + 0.2], "confidence": 0.95,
                         "statistic": "median", "baseline": {"tpot_ms": 30.0},
                         "winner": {"config": config, "tpot_ms": 30.0 / speedup}},
            "vllm_serve_args": serve_args_for(config), "expires_at": "2026-12-06T02:00:00+00:00",
            "study": {"name": "autotune-code-abc", "server_starts": 5}, "replay_set": {"digest": created[:10]},
            "valid_for": {"model": "/m", "vllm_version": "0.32.0"}, **({"drift": drift} if drift else {})}


@pytest.fixture
def store(tmp_path) -> Store:
    return Store(f"sqlite:///{tmp_path / 'a.db'}")


def test_every_recommendation_is_kept_in_table_and_files(tmp_path, store):
    recs = tmp_path / "recs"
    p1 = _history.write(_payload(), recs, store, run_id="r1")
    p2 = _history.write(_payload("change", SUFFIX, "2026-11-29T02:00:00+00:00", 3.0), recs, store)
    assert p1 == p2 == recs / "code.json"
    current = json.loads(p2.read_text())
    assert current["speculative_config"] == SUFFIX and current["id"]
    files = sorted((recs / "history" / "code").glob("*.json"))
    assert len(files) == 2 and files[-1].name == f"{current['id']}-change.json"
    assert json.loads(files[-1].read_text()) == current
    rows = store.recommendations("code")
    assert [r["method"] for r in rows] == ["suffix", "ngram"] and rows[1]["run_id"] == "r1"
    assert rows[0]["payload"] == current
    assert [h["id"] for h in _history.history("code", recs, store)] == [r["rec_id"] for r in rows]
    # without the table (another database, or none), the files still tell the history
    assert [h["id"] for h in _history.history("code", recs, None)] == [r["rec_id"] for r in rows]


@pytest.mark.parametrize("how", ["a_folder_there", "rename_fails_after_commit"])
def test_the_row_is_kept_only_with_the_file_it_describes(tmp_path, store, monkeypatch, how):
    """The table row commits just before the rename; a rename that cannot happen (a folder where
    the file goes) or that fails anyway leaves no row, no history copy: `recommend history`,
    `db report` and the exporter never list a recommendation that was not written."""
    recs = tmp_path / "recs"
    _history.write(_payload(), recs, store)
    hist_before = sorted(p.name for p in (recs / "history" / "code").iterdir())
    if how == "a_folder_there":
        (recs / "code.json").unlink()
        (recs / "code.json").mkdir()
        (recs / "code.json" / "keep").write_text("x")
    else:
        real_replace = os.replace

        def replace(src, dst, *a, **kw):
            if Path(dst) == recs / "code.json":
                raise OSError(errno.EIO, "Input/output error", str(dst))
            return real_replace(src, dst, *a, **kw)

        monkeypatch.setattr(_files.os, "replace", replace)
    with pytest.raises(OSError) as e:
        _history.write(_payload("keep", None, "2026-11-29T02:00:00+00:00"), recs, store)
    monkeypatch.undo()
    assert e.value.filename == str(recs / "code.json")
    assert [r["decision"] for r in store.recommendations("code")] == ["change"]  # the first one only
    assert sorted(p.name for p in (recs / "history" / "code").iterdir()) == hist_before
    assert [p.name for p in recs.iterdir() if p.name.startswith(".")] == []
    assert [h["decision"] for h in _history.history("code", recs, store)] == ["change"]


@pytest.mark.parametrize("how", ["disk_full", "history_not_a_dir", "db_commit"])
def test_failed_write_changes_nothing(tmp_path, store, monkeypatch, how):
    recs = tmp_path / "recs"
    _history.write(_payload(), recs, store)
    before = (recs / "code.json").read_bytes()
    hist_before = sorted(p.name for p in (recs / "history" / "code").iterdir())
    if how == "disk_full":
        calls = []

        real_fsync = os.fsync

        def fsync(fd):
            if stat.S_ISREG(os.fstat(fd).st_mode):
                calls.append(fd)
                if len(calls) == 2:  # the history copy fits, the current file does not
                    raise OSError(errno.ENOSPC, "No space left on device")
            real_fsync(fd)

        monkeypatch.setattr(_files.os, "fsync", fsync)
        exc = OSError
    elif how == "history_not_a_dir":
        (recs / "history").rename(tmp_path / "moved")
        (recs / "history").write_text("not a folder")
        exc = OSError
    else:
        def commit_fails(self):
            raise RuntimeError("database went away")

        import sqlalchemy.engine.base as base

        monkeypatch.setattr(base.RootTransaction, "commit", commit_fails)
        exc = RuntimeError
    with pytest.raises(exc):
        _history.write(_payload("keep", None, "2026-11-29T02:00:00+00:00"), recs, store)
    monkeypatch.undo()
    assert (recs / "code.json").read_bytes() == before
    assert [p.name for p in recs.iterdir() if p.name.startswith(".")] == []  # no temp file left
    if how != "history_not_a_dir":
        assert sorted(p.name for p in (recs / "history" / "code").iterdir()) == hist_before
    assert len(store.recommendations("code")) == 1


# ---- drift --------------------------------------------------------------------------------
class _Study:
    trials = __import__("autotune.search._study", fromlist=["Study"]).Study.trials

    def __init__(self, spec, frozen):
        self.spec = spec
        self.study = optuna.create_study()
        for t in frozen:
            self.study.add_trial(t)


def _trial(config, accepted, draft_tokens, drafts):
    return optuna.trial.create_trial(value=10.0, user_attrs={
        "role": "search", "config": config, "config_key": canonical(config),
        "measurement": {"spec_delta": {"drafts": drafts, "accepted_tokens": accepted, "draft_tokens": draft_tokens}}})


def _spec(incumbent):
    return load_spec(ROOT / "studies" / "code.yaml").model_copy(update={"incumbent": incumbent})


def test_drift_when_incumbent_acceptance_falls_below_threshold():
    st = _Study(_spec(NGRAM), [_trial(NGRAM, accepted=30, draft_tokens=100, drafts=25)])
    d = _history.drift_block(study_record(st), _payload(config=NGRAM), _payload(config=NGRAM), threshold=0.4)
    assert d["incumbent_acceptance_rate"] == pytest.approx(0.3)
    assert d["incumbent_acceptance_length"] == pytest.approx(2.2)
    assert d["acceptance_below_threshold"] and d["drifted"] and not d["winner_changed"]
    assert "accepts 0.30 of drafted tokens" in d["notes"][0] and "0.40 threshold" in d["notes"][0]


def test_no_drift_when_incumbent_still_accepts_and_winner_is_the_same():
    st = _Study(_spec(NGRAM), [_trial(NGRAM, accepted=70, draft_tokens=100, drafts=25)])
    d = _history.drift_block(study_record(st), _payload(config=NGRAM), _payload(config=NGRAM), threshold=0.4)
    assert not d["drifted"] and d["notes"] == [] and d["previous"]["speculative_config"] == NGRAM


def test_drift_when_the_winner_changes():
    st = _Study(_spec(NGRAM), [_trial(NGRAM, accepted=70, draft_tokens=100, drafts=25)])
    d = _history.drift_block(study_record(st), _payload(config=SUFFIX), _payload(config=NGRAM), threshold=0.4)
    assert d["winner_changed"] and not d["drifted"] and not d["acceptance_below_threshold"]  # a change, not drift
    assert d["notes"] == ["recommended config changed: ngram K=4 w=2-4 -> suffix K=24 (decision change -> change)"]


def test_unmeasured_incumbent_is_said():
    d = _history.drift_block(study_record(_Study(_spec(NGRAM), [])), _payload(), None, threshold=0.4)
    assert d["incumbent_acceptance_rate"] is None and not d["drifted"]
    assert "was not measured" in d["notes"][0]


# ---- diff and the CLI -------------------------------------------------------------------------
def test_diff_lines_say_what_changed_and_why():
    old = _payload(config=NGRAM, drift={"incumbent_acceptance_rate": 0.62, "min_acceptance_rate": 0.4})
    new = _payload("change", SUFFIX, "2026-11-29T02:00:00+00:00", 3.0, drift={
        "incumbent_acceptance_rate": 0.31, "min_acceptance_rate": 0.4, "acceptance_below_threshold": True,
        "notes": ["incumbent ngram K=4 accepts 0.31 of drafted tokens"]})
    lines = _history.diff_lines(old, new)
    assert lines[0] == "code: 2026-11-28T02:00:00+00:00 -> 2026-11-29T02:00:00+00:00"
    assert "  decision: change (unchanged)" in lines
    assert "  speculative_config: ngram K=4 w=2-4 -> suffix K=24" in lines
    assert '    ~ method: "ngram" -> "suffix"' in lines and "    - prompt_lookup_min: 2" in lines
    assert "    + suffix_decoding_max_tree_depth: 24" in lines
    assert "  speedup: 2.50x -> 3.00x (CI 2.30-2.70 -> 2.80-3.20)" in lines
    assert "  incumbent acceptance rate: 0.62 -> 0.31 (threshold 0.40)  BELOW THRESHOLD" in lines
    assert "  replay set: 2026-11-28 -> 2026-11-29" in lines
    assert lines[-2:] == ["  why: change because", "  drift: incumbent ngram K=4 accepts 0.31 of drafted tokens"]


@pytest.fixture
def env(tmp_path, monkeypatch):
    recs = tmp_path / "recs"
    spec = (ROOT / "studies" / "code.yaml").read_text()
    studies = tmp_path / "studies"
    studies.mkdir()
    (studies / "code.yaml").write_text(spec.replace("storage: sqlite:///../.autotune/autotune.db",
                                                    f"storage: sqlite:///{tmp_path / 'a.db'}"))
    for k, v in {"AUTOTUNE__STUDIES_DIR": str(studies), "AUTOTUNE__RECOMMENDATIONS_DIR": str(recs),
                 "AUTOTUNE__HOME": str(tmp_path / "home")}.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AUTOTUNE__STORAGE", raising=False)
    return {"recs": recs, "store": Store(f"sqlite:///{tmp_path / 'a.db'}")}


def test_recommend_diff_and_history_commands(env):
    r = CliRunner().invoke(main, ["recommend", "diff", "code"])
    assert r.exit_code == 2 and "has 0 recommendation(s)" in r.output
    _history.write(_payload(config=NGRAM), env["recs"], env["store"])
    _history.write(_payload("disable", None, "2026-11-29T02:00:00+00:00", 0.9,
                            drift={"drifted": True, "notes": ["incumbent ngram K=4 accepts 0.20 of drafted tokens"]}),
                   env["recs"], env["store"])
    r = CliRunner().invoke(main, ["recommend", "diff", "code"])
    assert r.exit_code == 0, r.output
    assert "  decision: change -> disable" in r.output
    assert "  speculative_config: ngram K=4 w=2-4 -> no speculation" in r.output
    assert "  drift: incumbent ngram K=4 accepts 0.20 of drafted tokens" in r.output
    h = CliRunner().invoke(main, ["recommend", "history", "code"])
    lines = h.output.splitlines()
    assert len(lines) == 2 and "disable" in lines[0] and "DRIFT" in lines[0] and "ngram K=4" in lines[1]
    old_id = lines[1].split()[0]
    r = CliRunner().invoke(main, ["recommend", "diff", "code", "--from", old_id[:20], "--to", lines[0].split()[0]])
    assert r.exit_code == 0 and "change -> disable" in r.output
    show = CliRunner().invoke(main, ["recommend", "show", "code"])
    assert "  drift: incumbent ngram K=4 accepts 0.20" in show.output


def test_a_history_copy_edited_into_a_list_is_skipped(tmp_path):
    d = _history.history_dir(tmp_path, "code")
    d.mkdir(parents=True)
    (d / "2026-11-28T020000Z-a-change.json").write_text(json.dumps(_payload()))
    (d / "2026-11-29T020000Z-b-keep.json").write_text("[1, 2]")
    (d / "2026-11-30T020000Z-c-keep.json").write_text("[" * 100_000)
    assert _history.history("code", tmp_path) == [_payload()]


def test_db_report_command(env):
    _history.write(_payload(), env["recs"], env["store"])
    r = CliRunner().invoke(main, ["db", "report", "latest_recommendations"])
    assert r.exit_code == 0, r.output
    assert r.output.splitlines()[0].split()[:3] == ["workload", "created_at", "decision"]
    assert "ngram" in r.output
    r = CliRunner().invoke(main, ["db", "report", "runs", "--json"])
    assert r.exit_code == 0 and json.loads(r.output) == []
    r = CliRunner().invoke(main, ["db", "report", "nosuch"])
    assert r.exit_code == 2 and "no report 'nosuch'" in r.output
    r = CliRunner().invoke(main, ["db", "migrate"])
    assert r.exit_code == 0 and "up to date" in r.output
