"""One atomic write for every file (``core/_files.py``), and the permissions of what autotune
writes: 0600 for anything that may hold prompt text or credentials, 0640 for what SREs read;
whatever the umask, and also where a stale file with looser permissions was left behind."""

from __future__ import annotations

import json
import os
import stat
import sys
from pathlib import Path

import pytest

from autotune.core import _files
from autotune.core._files import PRIVATE, SHARED, AtomicFile, open_append, open_new, write_json, write_text

from test_preflight import setup  # noqa: F401,E402  (fixture: a spec on a fake engine)


@pytest.fixture(params=[0o000, 0o022, 0o077])
def umask(request):
    old = os.umask(request.param)
    yield request.param
    os.umask(old)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_write_json_sets_the_mode_it_is_given_whatever_the_umask(tmp_path, umask):
    for mode in (PRIVATE, SHARED):
        p = write_json(tmp_path / f"{mode:o}" / "a.json", {"a": 1}, mode)
        assert _mode(p) == mode and json.loads(p.read_text()) == {"a": 1}
        assert sorted(x.name for x in p.parent.iterdir()) == ["a.json"]  # no temp file left


def test_replacing_a_looser_file_tightens_it(tmp_path):
    p = tmp_path / "pool.jsonl"
    p.write_text("old\n")
    os.chmod(p, 0o666)
    write_text(p, "new\n", PRIVATE)
    assert p.read_text() == "new\n" and _mode(p) == PRIVATE


def test_the_temp_file_has_the_final_mode_before_any_byte_is_written(tmp_path, umask):
    f = AtomicFile(tmp_path / "replay.jsonl", PRIVATE)
    try:
        assert f.tmp.parent == tmp_path and f.tmp.name.startswith(".replay.jsonl.")
        assert _mode(f.tmp) == PRIVATE and f.tmp.stat().st_size == 0
    finally:
        f.abort()
    assert list(tmp_path.iterdir()) == []


def _record_fs_events(monkeypatch) -> list[str]:
    """The fsyncs (of a file or a folder) and renames ``_files`` makes, in order."""
    events: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append("fsync-dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync-file")
        real_fsync(fd)

    def replace(a, b):
        events.append("rename")
        real_replace(a, b)

    monkeypatch.setattr(_files.os, "fsync", fsync)
    monkeypatch.setattr(_files.os, "replace", replace)
    return events


def test_commit_fsyncs_the_file_then_renames_then_fsyncs_the_folder(tmp_path, monkeypatch):
    events = _record_fs_events(monkeypatch)
    write_json(tmp_path / "code.json", {"decision": "keep"}, SHARED)
    assert events == ["fsync-file", "rename", "fsync-dir"]


def test_before_replace_failing_keeps_the_old_file(tmp_path):
    p = write_json(tmp_path / "code.json", {"v": 1}, SHARED)

    def commit():
        raise RuntimeError("database went away")

    with pytest.raises(RuntimeError, match="went away"):
        write_json(p, {"v": 2}, SHARED, before_replace=commit)
    assert json.loads(p.read_text()) == {"v": 1}
    assert [x.name for x in tmp_path.iterdir()] == ["code.json"]


def test_open_new_and_open_append_tighten_an_existing_file(tmp_path, umask):
    log = tmp_path / "trial-0001.log"
    log.write_text("a prompt from yesterday\n")
    os.chmod(log, 0o644)
    with open_new(log, PRIVATE) as fh:
        fh.write(b"$ vllm serve\n")
    assert _mode(log) == PRIVATE and log.read_bytes() == b"$ vllm serve\n"
    checks = tmp_path / "checks.jsonl"
    with open_append(checks, SHARED) as fh:
        fh.write("{}\n")
    os.chmod(checks, 0o666)
    with open_append(checks, SHARED) as fh:
        fh.write("{}\n")
    assert _mode(checks) == SHARED and checks.read_text() == "{}\n{}\n"


# ---- the files autotune writes -----------------------------------------------------------------
def test_replay_set_pool_and_manifest_are_private(tmp_path, umask):
    from autotune.traffic import _replayset
    from autotune.traffic._replayset import ReplayRequest

    reqs = [ReplayRequest(id=f"r{i}", endpoint="completions", body={"prompt": f"secret prompt {i}"}) for i in range(3)]
    stale = tmp_path / "replay.jsonl.tmp"  # what an older version left after a crash
    stale.write_text("x")
    os.chmod(stale, 0o666)
    p = _replayset.save(tmp_path / "replay.jsonl", reqs)
    assert _mode(p) == PRIVATE
    assert [x.name for x in tmp_path.iterdir() if x.name not in ("replay.jsonl", stale.name)] == []


def test_traffic_import_writes_private_pools(tmp_path, umask):
    from autotune.traffic import _traffic
    from autotune.traffic._workloads import Classifier

    log = tmp_path / "gw.jsonl"
    log.write_text(json.dumps({"body": {"model": "m", "prompt": "def f(x):\n    return x", "max_tokens": 8}}) + "\n")
    home = tmp_path / "home"
    _traffic.import_paths([str(log)], home, classifier=Classifier(force="code"))
    d = _traffic.traffic_dir(home)
    assert _mode(d) == 0o700
    files = sorted(p.name for p in d.iterdir() if not p.name.startswith("."))
    assert files == ["code.jsonl", "code.meta.json"]
    assert all(_mode(d / f) == PRIVATE for f in files)


def test_recommendation_and_history_are_group_readable_not_world(tmp_path, umask):
    from autotune.decide import _history

    payload = {"workload": "code", "decision": "keep", "reason": "r", "created_at": "2026-11-30T02:00:00+00:00"}
    path = _history.write(payload, tmp_path / "recs", None)
    (hist,) = (tmp_path / "recs" / "history" / "code").iterdir()
    assert _mode(path) == SHARED and _mode(hist) == SHARED


def test_server_log_and_pidfile_are_private(tmp_path, umask):
    from autotune.engines._engine import VllmServer, ServerStartError, build_argv, free_port

    script = tmp_path / "fails.py"
    script.write_text("print('a prompt the server logged', flush=True)\nraise SystemExit(1)\n")
    port = free_port()
    log = tmp_path / "logs" / "study" / "trial-0000.log"
    server = VllmServer(argv=build_argv([sys.executable, str(script)], "m", {}, None, port), port=port,
                        log_path=log, pid_dir=tmp_path / "servers", start_timeout_s=20)
    seen = {}
    real = _files.write_json

    def spy(path, data, mode=PRIVATE, **kw):
        out = real(path, data, mode, **kw)
        seen[Path(path).name] = _mode(out)
        return out

    import autotune.engines._recovery as rec

    orig = rec.write_json
    rec.write_json = spy
    try:
        with pytest.raises(ServerStartError):
            server.start()
    finally:
        rec.write_json = orig
    assert _mode(log) == PRIVATE and _mode(log.parent) == 0o700
    assert "a prompt the server logged" in log.read_text()
    assert list(seen.values()) == [PRIVATE]  # the pidfile, while the server ran


def test_a_folder_another_library_writes_is_swapped_in_whole_and_durable(tmp_path, monkeypatch, umask):
    """``commit_dir`` (the demo models): every file fsynced with the given mode, then the old
    folder replaced by the new one in one rename, then the parent fsynced."""
    old = tmp_path / "model"
    old.mkdir()
    (old / "stale.bin").write_text("old")
    tmp = _files.temp_path(old)
    tmp.mkdir()
    (tmp / "weights.bin").write_text("new")
    (tmp / "config.json").write_text("{}")
    events = _record_fs_events(monkeypatch)
    _files.commit_dir(tmp, old, _files.PUBLIC)
    assert events == ["fsync-file", "fsync-file", "fsync-dir", "rename", "fsync-dir"]
    assert sorted(p.name for p in old.iterdir()) == ["config.json", "weights.bin"]
    assert _mode(old / "weights.bin") == _files.PUBLIC and not tmp.exists()


def test_a_file_another_library_writes_gets_its_mode_and_a_fresh_temp_name(tmp_path, umask):
    dst = tmp_path / "draft.gguf"
    tmp = _files.temp_path(dst)
    tmp.write_bytes(b"left from a crash")
    assert _files.temp_path(dst) == tmp and not tmp.exists()  # a leftover temp file is removed
    tmp.write_bytes(b"gguf")
    _files.commit_file(tmp, dst, _files.PUBLIC)
    assert dst.read_bytes() == b"gguf" and _mode(dst) == _files.PUBLIC and not tmp.exists()


def test_the_demo_gateway_log_holds_prompt_text_and_is_private(tmp_path, umask):
    from autotune.demo import _codetraffic

    p = _codetraffic.write_log(tmp_path / "gateway.jsonl.gz", "code", 4)
    assert _mode(p) == PRIVATE and p.stat().st_size > 0
    assert [x.name for x in tmp_path.iterdir()] == ["gateway.jsonl.gz"]  # no temp file left


def _modes(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): _mode(p) for p in [root, *root.rglob("*")] if p.is_dir()}


def test_every_folder_autotune_makes_has_its_mode_whatever_the_umask(tmp_path, umask):
    """Under umask 000 the home, logs, recommendations, history and servers folders were 0777:
    anyone on the host could plant a recommendation."""
    from autotune.core._lock import private_lock_dir
    from autotune.core._settings import Settings
    from autotune.decide import _history
    from autotune.ops._runner import storage_for

    _history.write({"workload": "code", "decision": "keep", "reason": "r",
                    "created_at": "2026-11-30T02:00:00+00:00"}, tmp_path / "a" / "recs", None)
    assert _modes(tmp_path / "a") == {".": 0o750, "recs": 0o750, "recs/history": 0o750, "recs/history/code": 0o750}
    _files.private_dir(tmp_path / "b" / "logs" / "study")
    write_json(tmp_path / "c" / "gpu-0.servers" / "1.json", {}, PRIVATE)
    storage_for(None, None, Settings(home=str(tmp_path / "d" / "home")))
    private_lock_dir(tmp_path / "e" / "run" / "locks")
    for top in "bcde":
        assert set(_modes(tmp_path / top).values()) == {0o700}, (top, _modes(tmp_path / top))
    open_append(tmp_path / "f" / "history" / "checks.jsonl", SHARED).close()
    assert set(_modes(tmp_path / "f").values()) == {0o750}


def test_an_existing_shared_folder_is_left_as_it_is_and_new_ones_keep_its_group_bit(tmp_path, umask):
    recs = tmp_path / "recs"
    recs.mkdir()
    os.chmod(recs, 0o2770)  # an SRE group's folder: setgid, group-writable by choice
    write_json(recs / "history" / "code" / "x.json", {}, SHARED)
    assert _mode(recs) == 0o2770
    assert _mode(recs / "history") == _mode(recs / "history" / "code") == 0o2750


def test_a_study_under_umask_000_makes_no_folder_others_may_write(setup):
    """End to end on a fake engine: home, logs, locks, database folder."""
    import subprocess

    import yaml

    root = setup["dir"]
    spec = root / "code.yaml"
    spec.write_text(yaml.safe_dump(setup["data"], sort_keys=False))
    env = {**setup["env"], "AUTOTUNE__LOCK_DIR": str(root / "run" / "autotune")}
    before = set(_modes(root))
    r = subprocess.run([sys.executable, "-m", "autotune", "study", "start", "--workload", "code", "--spec",
                        str(spec)], capture_output=True, text=True, env=env, timeout=120,
                       preexec_fn=lambda: os.umask(0))
    assert r.returncode == 3, r.stderr  # the fake baseline fails, after making its folders
    made = {k: v for k, v in _modes(root).items() if k not in before}
    assert {"home", "home/logs", "run", "run/autotune"} <= set(made), made
    assert all(m & 0o022 == 0 for m in made.values()), made
    assert made["home"] == made["home/logs"] == made["run/autotune"] == 0o700, made
