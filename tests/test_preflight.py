"""Bad input fails at once, names its cause (file, field, line), and writes nothing: no study,
no trial, no recommendation, no server start. Also the GPU lock (exit 75) and `--if-stale`.

No vLLM here: the engine is a fake probe (a script that prints what a vLLM would) and a
`vllm serve` that must never be started (it would leave a marker file)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml

from autotune.traffic import _replayset
from autotune.core._lock import FileLock, LockDirError, default_lock_dir, gpu_lock_path, lead_lock_path
from autotune.traffic._replayset import ReplayRequest
from autotune.core._store import Store

ROOT = Path(__file__).resolve().parent.parent
FIELDS_032 = ["method", "num_speculative_tokens", "model", "prompt_lookup_min", "prompt_lookup_max",
              "suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob"]


def _fake_probe(path: Path, version: str, fields: list[str]) -> Path:
    info = {"version": version, "methods": ["ngram", "suffix", "draft_model"], "fields": fields,
            "serve_fields": [], "arctic_inference": True}
    path.write_text(f"#!/bin/sh\necho 'AUTOTUNE_PROBE {json.dumps(info)}'\n")
    path.chmod(0o755)
    return path


@pytest.fixture
def setup(tmp_path):
    """A spec whose model, replay set and engine are all local fakes; returns (spec path, env, paths)."""
    (tmp_path / "models" / "target").mkdir(parents=True)
    (tmp_path / "models" / "draft").mkdir(parents=True)
    reqs = [ReplayRequest(id=f"r{i}", endpoint="completions", body={"prompt": f"p{i}", "max_tokens": 8,
                                                                     "temperature": 0}) for i in range(40)]
    _replayset.save(tmp_path / "replay.jsonl", reqs)
    marker = tmp_path / "SERVER_STARTED"
    serve = tmp_path / "vllm"
    serve.write_text(f"#!/bin/sh\ntouch {marker}\nexit 1\n")
    serve.chmod(0o755)
    data = yaml.safe_load((ROOT / "studies" / "code.yaml").read_text())
    data.update(model="./models/target", storage=f"sqlite:///{tmp_path / 'db.sqlite'}",
                recommendations_dir="./recs")
    data["replay"]["path"] = "./replay.jsonl"
    data["space"]["draft_models"] = ["./models/draft"]
    data["engine"]["command"] = [str(serve), "serve"]
    data["engine"]["python"] = str(_fake_probe(tmp_path / "probe-python", "0.32.0", FIELDS_032))
    data["engine"]["env"] = {}
    env = {**os.environ, "AUTOTUNE__HOME": str(tmp_path / "home"), "AUTOTUNE__GPU": "7"}
    for k in ("AUTOTUNE__STORAGE", "AUTOTUNE__RECOMMENDATIONS_DIR", "AUTOTUNE__VLLM_COMMAND", "AUTOTUNE__VLLM_PYTHON"):
        env.pop(k, None)
    return {"dir": tmp_path, "data": data, "env": env, "marker": marker}


def _write(setup, data=None, text_edit=None) -> Path:
    p = setup["dir"] / "code.yaml"
    text = yaml.safe_dump(data or setup["data"], sort_keys=False)
    if text_edit:
        text = text_edit(text)
    p.write_text(text)
    return p


def _start(setup, spec: Path, *args, timeout=60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autotune", "study", "start", "--workload", "code",
                           "--spec", str(spec), *args], capture_output=True, text=True, env=setup["env"],
                          timeout=timeout)


def _nothing_written(setup) -> None:
    assert not setup["marker"].exists(), "a vllm serve was started"
    assert not (setup["dir"] / "recs").exists()
    db = setup["dir"] / "db.sqlite"
    if db.exists():
        import optuna

        assert optuna.get_all_study_summaries(f"sqlite:///{db}") == []


def _line(path: Path, needle: str) -> int:
    return next(i + 1 for i, ln in enumerate(path.read_text().splitlines()) if needle in ln)


def test_missing_model_path_names_the_model_field(setup):
    setup["data"]["model"] = "./models/nosuch"
    spec = _write(setup)
    r = _start(setup, spec)
    assert r.returncode == 2, r.stderr
    assert f"{spec}:{_line(spec, 'model: ./models/nosuch')}: field 'model': no such file or directory: " \
           f"{setup['dir'] / 'models' / 'nosuch'}" in r.stderr
    _nothing_written(setup)
    assert not (setup["dir"] / "db.sqlite").exists()  # failed before the database was opened


def test_missing_draft_model_path_names_its_list_entry(setup):
    setup["data"]["space"]["draft_models"] = ["./models/draft", "./models/gone"]
    spec = _write(setup)
    r = _start(setup, spec)
    assert r.returncode == 2
    assert f"{spec}:{_line(spec, './models/gone')}: field 'space.draft_models.1': no such file or directory" in r.stderr
    _nothing_written(setup)


def test_hub_ids_are_not_checked_as_paths(setup):
    setup["data"]["model"] = "org/some-model"
    setup["data"]["space"]["methods"] = ["ngram"]
    spec = _write(setup)
    r = _start(setup, spec)
    assert "no such file" not in r.stderr  # it gets as far as the (fake, failing) baseline start
    assert r.returncode == 3 and setup["marker"].exists()


def test_a_name_no_method_has_names_field_and_line(setup):
    setup["data"]["space"]["methods"] = ["ngram", "Medusa-2"]
    spec = _write(setup)
    r = _start(setup, spec)
    assert r.returncode == 2
    assert f"{spec}:{_line(spec, 'methods:')}: field 'space.methods': method 'Medusa-2' is not a method name" \
        in r.stderr
    _nothing_written(setup)


def test_a_knob_the_installed_vllm_lacks_names_field_and_line(setup):
    # the stand-in probe is a vLLM 0.32 without enable_adaptive_verification in SpeculativeConfig
    setup["data"]["space"]["methods"] = ["ngram"]
    setup["data"]["space"]["entries"] = {"ngram": {"knobs": {"prompt_lookup_min": [2, 3],
                                                             "enable_adaptive_verification": [False, True]}}}
    spec = _write(setup)
    r = _start(setup, spec)
    assert r.returncode == 2
    line = _line(spec, "enable_adaptive_verification:")
    assert (f"{spec}:{line}: field 'space.entries.ngram.knobs.enable_adaptive_verification': vLLM 0.32.0 has no "
            "SpeculativeConfig field 'enable_adaptive_verification'") in r.stderr
    _nothing_written(setup)


def test_invalid_cron_names_field_and_line(setup):
    setup["data"]["schedule"] = {"cron": "0 25 * * *"}
    spec = _write(setup)
    r = _start(setup, spec)
    assert r.returncode == 2
    assert f"{spec}:{_line(spec, 'schedule:')}: field 'schedule': invalid cron '0 25 * * *'" in r.stderr


def test_vllm_too_old_for_a_requested_field_fails_before_any_server_start(setup):
    old = _fake_probe(setup["dir"] / "old-python", "0.25.0",
                      ["method", "num_speculative_tokens", "model", "prompt_lookup_min", "prompt_lookup_max",
                       "suffix_decoding_max_tree_depth"])
    setup["data"]["engine"]["python"] = str(old)
    spec = _write(setup)
    r = _start(setup, spec)
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{spec}:{_line(spec, 'suffix:')}: field 'space.suffix.max_spec_factor': method suffix needs " \
           "SpeculativeConfig field 'suffix_decoding_max_spec_factor', which vLLM 0.25.0 does not have" in r.stderr
    _nothing_written(setup)
    (run,) = Store(f"sqlite:///{setup['dir'] / 'db.sqlite'}").report("failures")  # one complete record of it
    assert run["what"] == "run" and run["code"] == 2 and "0.25.0" in run["reason"]


def test_incumbent_field_this_vllm_lacks(setup):
    setup["data"]["space"]["methods"] = ["ngram"]
    setup["data"]["incumbent"] = {"method": "ngram", "num_speculative_tokens": 4, "enable_adaptive_verification": True}
    spec = _write(setup)
    r = _start(setup, spec)
    assert r.returncode == 2
    assert "field 'incumbent.enable_adaptive_verification': vLLM 0.32.0 has no SpeculativeConfig field" in r.stderr
    _nothing_written(setup)


def test_unreadable_replay_set_names_file_and_line(setup):
    bad = setup["dir"] / "replay.jsonl"
    lines = bad.read_text().splitlines()
    lines[6] = '{"id": "x", "endpoint": "completions", "body": {"prompt": "p"'
    bad.write_text("\n".join(lines) + "\n")
    r = _start(setup, _write(setup))
    assert r.returncode == 2
    assert f"{bad}:7: not JSON" in r.stderr
    _nothing_written(setup)


def test_too_few_requests_for_the_concurrency(setup):
    setup["data"]["replay"]["warmup"] = 38
    r = _start(setup, _write(setup))
    assert r.returncode == 2 and "fewer than the concurrency 4" in r.stderr
    _nothing_written(setup)


def test_unreadable_traffic_pool_in_a_nightly_run(setup):
    pool = setup["dir"] / "home" / "traffic" / "code.jsonl"
    pool.parent.mkdir(parents=True)
    pool.write_text("this is not json\n")
    r = _start(setup, _write(setup), "--nightly")
    assert r.returncode == 2, r.stdout + r.stderr
    assert "traffic for code:" in r.stderr
    _nothing_written(setup)


# ---- the GPU lock ---------------------------------------------------------------------------
@pytest.mark.parametrize("held", ["gpu", "lead"])
def test_gpu_busy_exits_75_naming_the_holder_and_writes_nothing(setup, held):
    """The GPU's own lock held, or the workload's lead lock held by a study on this GPU (the same
    workload again on the same GPU): either way the GPU is busy, and its lock is named."""
    locks = os.environ["AUTOTUNE__LOCK_DIR"]
    if held == "gpu":
        lock = FileLock(gpu_lock_path(locks, "7")).acquire(what="daemon study of chat")
    else:
        lock = FileLock(lead_lock_path(locks, "code")).acquire(what="daemon study of chat on GPU 7", gpu="7")
    try:
        r = _start(setup, _write(setup))
    finally:
        lock.release()
    assert r.returncode == 75, r.stderr
    assert f"GPU 7 is busy: held by pid {os.getpid()}" in r.stderr and "daemon study of chat" in r.stderr
    assert "pass --wait" in r.stderr and "gpu-7.lock" in r.stderr
    _nothing_written(setup)
    assert not (setup["dir"] / "db.sqlite").exists()


def test_wait_waits_for_the_gpu_then_runs(setup):
    setup["data"]["space"]["methods"] = ["ngram"]
    spec = _write(setup)
    lock = FileLock(gpu_lock_path(os.environ["AUTOTUNE__LOCK_DIR"], "7")).acquire(what="another study")
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "study", "start", "--workload", "code", "--spec",
                             str(spec), "--wait"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=setup["env"])
    try:
        first = proc.stdout.readline()  # blocks until it reports that it waits
        assert "GPU 7 is busy" in first and "waiting" in first, first
        time.sleep(1)
        assert proc.poll() is None and not setup["marker"].exists()  # waiting, nothing started
    finally:
        lock.release()
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3 and setup["marker"].exists()  # then it ran (the fake baseline fails)


def test_lock_is_released_when_its_holder_is_killed(tmp_path):
    path = tmp_path / "gpu-0.lock"
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import time
        from autotune.core._lock import FileLock
        FileLock({str(path)!r}).acquire(what="victim")
        print("held", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(Exception) as ei:
        FileLock(path).acquire(what="second")
    assert f"pid {holder.pid}" in str(ei.value) and "victim" in str(ei.value)
    holder.kill()
    holder.wait()
    FileLock(path).acquire(what="after kill -9").release()  # no stale lock to clean up


def test_a_second_leader_of_one_workload_exits_75_naming_the_first(setup):
    """Two GPUs, one workload: the second `study start` would lead the same study (confirm,
    decide, write) a second time; it exits 75 and points at `autotune worker` instead."""
    lead = FileLock(lead_lock_path(os.environ["AUTOTUNE__LOCK_DIR"], "code")).acquire(
        what="manual study of code on GPU 0")
    try:
        r = _start(setup, _write(setup))  # on GPU 7: its own GPU lock is free
    finally:
        lead.release()
    assert r.returncode == 75, r.stderr
    assert f"workload code is being studied already: held by pid {os.getpid()}" in r.stderr
    assert "on GPU 0" in r.stderr and "autotune worker --workload code" in r.stderr
    _nothing_written(setup)
    assert not (setup["dir"] / "db.sqlite").exists()


# ---- the lock folder: private, never through a symlink ----------------------------------------
def test_default_lock_dir_is_private_to_the_user(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(tmp_path / "run"))
    (tmp_path / "run").mkdir()
    assert default_lock_dir(tmp_path / "home") == tmp_path / "run" / "autotune"
    monkeypatch.delenv("XDG_RUNTIME_DIR")
    assert default_lock_dir(tmp_path / "home") == tmp_path / "home" / "locks"
    assert "/tmp/autotune-locks" not in str(default_lock_dir())
    lock = FileLock(gpu_lock_path(tmp_path / "home" / "locks", "0")).acquire(what="t")
    try:
        assert stat.S_IMODE((tmp_path / "home" / "locks").stat().st_mode) == 0o700
        assert stat.S_IMODE((tmp_path / "home" / "locks" / "gpu-0.lock").stat().st_mode) == 0o600
    finally:
        lock.release()


def test_a_planted_symlink_is_refused_and_its_target_untouched(setup, tmp_path):
    locks = tmp_path / "locks"
    locks.mkdir(mode=0o700)
    victim = tmp_path / "precious.txt"
    victim.write_text("keep me\n")
    (locks / "gpu-7.lock").symlink_to(victim)
    r = _start({**setup, "env": {**setup["env"], "AUTOTUNE__LOCK_DIR": str(locks)}}, _write(setup))
    assert r.returncode == 2, r.stderr
    assert f"error: lock file {locks / 'gpu-7.lock'} is a symlink: refused (not followed)" in r.stderr
    assert victim.read_text() == "keep me\n"
    _nothing_written(setup)


def test_a_lock_dir_that_is_a_symlink_or_anothers_is_refused(tmp_path):
    real = tmp_path / "real"
    real.mkdir(mode=0o700)
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(LockDirError, match="is not a folder \\(a symlink or a file\\): refused"):
        FileLock(tmp_path / "link" / "gpu-0.lock").acquire(what="t")
    if os.geteuid() == 0:
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(LockDirError, match="belongs to uid 65534, not to you"):
            FileLock(theirs / "gpu-0.lock").acquire(what="t")
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    FileLock(loose / "gpu-0.lock").acquire(what="t").release()
    assert stat.S_IMODE(loose.stat().st_mode) == 0o700  # ours, merely loose: tightened


# ---- --if-stale -----------------------------------------------------------------------------
def test_if_stale_is_idempotent(setup):
    spec = _write(setup)
    store = Store(f"sqlite:///{setup['dir'] / 'db.sqlite'}")
    rid = store.start_run("code", "cron", "7")
    store.finish_run(rid, "ok", 0, decision="keep")
    for _ in range(2):
        r = _start(setup, spec, "--if-stale", "20h")
        assert r.returncode == 0, r.stderr
        assert "code: fresh (last successful run finished" in r.stdout and "nothing to do" in r.stdout
    assert not setup["marker"].exists()
    assert len(store.query("SELECT * FROM autotune_runs")) == 1
    # older than the age given: it runs (here up to the fake baseline, which fails)
    store._write("UPDATE autotune_runs SET finished_at = '2020-01-01T00:00:00Z'")
    setup["data"]["space"]["methods"] = ["ngram"]
    r = _start(setup, _write(setup), "--if-stale", "20h")
    assert r.returncode == 3 and setup["marker"].exists()


def test_if_stale_rejects_a_bad_duration(setup):
    r = _start(setup, _write(setup), "--if-stale", "soon")
    assert r.returncode == 2 and "--if-stale: invalid duration 'soon'" in r.stderr


def test_nightly_samples_fresh_traffic_from_the_pool_first(setup):
    from _traffic_logs import chat_rows, write_jsonl

    from autotune.traffic._traffic import import_paths
    from autotune.traffic._workloads import Classifier

    f = write_jsonl(setup["dir"] / "logs" / "code.jsonl", chat_rows(80))
    import_paths([str(f)], setup["dir"] / "home", classifier=Classifier(force="code"))
    setup["data"]["space"]["methods"] = ["ngram"]
    replay = setup["dir"] / "replay.jsonl"
    before = replay.read_text()
    r = _start(setup, _write(setup), "--nightly")
    assert "fresh traffic: sampled" in r.stdout and str(replay) in r.stdout, r.stdout + r.stderr
    assert replay.read_text() != before and '"endpoint": "chat"' in replay.read_text()
    assert r.returncode == 3 and setup["marker"].exists()  # then the study ran on it (fake engine)
