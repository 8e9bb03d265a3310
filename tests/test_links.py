"""Links inside autotune's folders are never written through: a checks log, a history folder or
a deploy mark replaced by a link to somewhere else is refused with its name, and the link's
target is left as it was. The recommendations folder itself may be a link (a shared volume)."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from autotune.cli._main import main
from autotune.core._files import LinkRefused, open_append, open_new, refuse_links, write_json
from autotune.decide import _history

from test_drift import workload  # noqa: F401  (fixture: a spec, its replay set, a recommendation)


def _payload(decision="keep"):
    return {"workload": "code", "decision": decision, "reason": "r", "created_at": "2026-12-07T02:00:00+00:00"}


def test_a_linked_checks_log_is_refused_and_its_target_unchanged(workload):
    outside = workload / "elsewhere.txt"
    outside.write_text("an operator's file\n")
    hist = workload / "rec" / "history" / "code"
    hist.mkdir(parents=True)
    (hist / "checks.jsonl").symlink_to(outside)
    r = CliRunner().invoke(main, ["drift", "check", "code", "--spec", str(workload / "code.yaml")])
    assert r.exit_code == 4, r.output  # not writable, as a read-only folder: nothing was changed
    assert f"{hist / 'checks.jsonl'}" in r.output and "link" in r.output, r.output
    assert outside.read_text() == "an operator's file\n"


def test_a_linked_history_folder_is_refused_and_the_recommendation_kept(tmp_path):
    recs = tmp_path / "recs"
    first = _history.write(_payload("keep"), recs, None)
    before = first.read_text()
    outside = tmp_path / "outside"
    outside.mkdir()
    hist = recs / "history" / "code"
    for f in hist.iterdir():
        f.unlink()
    hist.rmdir()
    hist.symlink_to(outside)
    with pytest.raises(LinkRefused, match="a link .* inside"):
        _history.write(_payload("change"), recs, None)
    assert list(outside.iterdir()) == []  # nothing written through the link
    assert first.read_text() == before  # the previous recommendation intact


def test_the_recommendations_folder_itself_may_be_a_link(tmp_path):
    real = tmp_path / "volume" / "recs"
    real.mkdir(parents=True)
    (tmp_path / "recs").symlink_to(real)
    path = _history.write(_payload(), tmp_path / "recs", None)
    assert json.loads((real / "code.json").read_text())["decision"] == "keep" and path.exists()
    assert len(list((real / "history" / "code").iterdir())) == 1


def test_appends_and_fresh_files_never_follow_a_final_link(tmp_path):
    target = tmp_path / "target"
    target.write_text("kept\n")
    (tmp_path / "log").symlink_to(target)
    with pytest.raises(LinkRefused, match="a link"):
        open_append(tmp_path / "log")
    with pytest.raises(LinkRefused, match="a link"):
        open_new(tmp_path / "log")
    assert target.read_text() == "kept\n"
    # a link in a folder below the root, for any atomic write; outside the root is refused too
    (tmp_path / "root").mkdir()
    (tmp_path / "root" / "sub").symlink_to(tmp_path)
    with pytest.raises(LinkRefused, match="sub"):
        write_json(tmp_path / "root" / "sub" / "x.json", {}, root=tmp_path / "root")
    with pytest.raises(LinkRefused, match="not inside"):
        refuse_links(tmp_path / "x.json", tmp_path / "root")
    assert not (tmp_path / "x.json").exists()
    assert refuse_links(tmp_path / "root" / "a" / "b.json", tmp_path / "root")  # missing folders are fine
