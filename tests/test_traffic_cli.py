"""`autotune traffic import` + `autotune traffic sample` end to end through the click CLI."""

from __future__ import annotations

import json
import stat
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from _traffic_logs import RULES_YAML, T0, chat_rows, gateway_lines, write_gz, write_jsonl
from click.testing import CliRunner

from autotune.traffic import _replayset
from autotune.cli._main import main

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def env(tmp_path, monkeypatch) -> Path:
    """A studies folder with a code spec (rules, replay path in tmp) and a home in tmp."""
    for var in ("AUTOTUNE__STORAGE", "AUTOTUNE__VLLM_COMMAND", "AUTOTUNE__VLLM_PYTHON",
                "AUTOTUNE__RECOMMENDATIONS_DIR"):
        monkeypatch.delenv(var, raising=False)
    studies = tmp_path / "studies"
    studies.mkdir()
    data = yaml.safe_load((ROOT / "studies" / "code.yaml").read_text())
    data.update(yaml.safe_load(RULES_YAML))
    data["model"] = str(tmp_path / "model")  # no tokenizer there: estimates
    data["replay"]["path"] = "../replay/code.jsonl"
    (studies / "code.yaml").write_text(yaml.safe_dump(data))
    monkeypatch.setenv("AUTOTUNE__STUDIES_DIR", str(studies))
    monkeypatch.setenv("AUTOTUNE__HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args], catch_exceptions=False)


def test_import_then_sample(env):
    lines, _ = gateway_lines()
    gw = write_gz(env / "logs" / "gw-1.jsonl.gz", lines)
    more = chat_rows(80, start=T0 + timedelta(hours=1), step=timedelta(minutes=9))
    more.append(dict(more[0], timestamp=(T0 + timedelta(hours=2)).isoformat()))  # a repeated prompt
    write_gz(env / "logs" / "gw-2.jsonl.gz", [json.dumps(r) for r in more])

    r = _run("-v", "traffic", "import", str(env / "logs" / "gw-*.jsonl.gz"))
    assert r.exit_code == 0, r.output
    out = r.output
    assert f"{gw}: 12 lines, 6 imported (6 new, openai 6), 4 malformed, 2 skipped" in out
    for ln in (4, 8, 9, 11):
        assert f"  {gw}:{ln}: " in out
    assert "workload code: 84 imported (1 by default, 1 by rule, 82 by tag), 84 new" in out
    assert "workload billing: 1 imported (1 by rule)" in out
    assert "SECRET" not in out  # neither stdout nor the -v logs hold prompt text

    r = _run("traffic", "sample", "--workload", "code", "--n", 40, "--seed", 3)
    assert r.exit_code == 0, r.output
    replay = env / "replay" / "code.jsonl"
    assert f"wrote {replay}" in r.output and "sampled 40 of 83 eligible" in r.output
    assert "skipped: duplicate 1" in r.output
    rs = _replayset.load(replay)
    assert len(rs.requests) == 40
    manifest = env / "replay" / "code.jsonl.manifest.json"
    m = json.loads(manifest.read_text())
    assert m["seed"] == 3 and m["content_hash"] == rs.digest and m["counts"]["sampled"] == 40
    for p in (replay, manifest, env / "home" / "traffic" / "code.jsonl"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600

    r = _run("traffic", "list")
    assert r.exit_code == 0 and "code" in r.output and "84 requests" in r.output


def test_import_nothing_usable_exits_2(env):
    bad = write_jsonl(env / "bad.jsonl", ["nope", "[1]"])
    r = _run("traffic", "import", bad)
    assert r.exit_code == 2
    assert "error: nothing usable in 1 file(s): 2 lines read, 2 malformed" in r.output
    assert f"{bad}:1: not JSON" in r.output and f"{bad}:2: expected a JSON object" in r.output
    trace = write_jsonl(env / "trace.jsonl", [{"timestamp": 0, "input_length": 10, "output_length": 2}])
    r = _run("traffic", "import", trace)
    assert r.exit_code == 2 and "--synthesize" in r.output
    r = _run("traffic", "import", "--synthesize", "--workload", "trace", trace)
    assert r.exit_code == 0 and "acceptance_measurable false" in r.output
    r = _run("traffic", "sample", "--workload", "trace", "--out", env / "t.jsonl")
    assert r.exit_code == 0 and "synthetic prompts" in r.output


def test_sample_bad_input_exits_2(env):
    r = _run("traffic", "sample", "--workload", "code")
    assert r.exit_code == 2 and "no traffic pool for workload 'code'" in r.output
    r = _run("traffic", "sample", "--workload", "nosuch")
    assert r.exit_code == 2 and "no study spec for workload 'nosuch'" in r.output
    r = _run("traffic", "sample", "--workload", "code", "--since", "yesterday")
    assert r.exit_code == 2 and "cannot read time 'yesterday'" in r.output
    r = _run("traffic", "import", "--redact", "(", write_jsonl(env / "x.jsonl", chat_rows(1)))
    assert r.exit_code == 2 and "invalid --redact regex" in r.output


@pytest.mark.parametrize("n", ["0", "-2"])
def test_sample_of_no_requests_is_refused_and_leaves_the_replay_set(env, n):
    """``--n 0`` used to mean "the spec's default" and rewrote the replay set."""
    assert _run("traffic", "import", write_jsonl(env / "a.jsonl", chat_rows(30))).exit_code == 0
    assert _run("traffic", "sample", "--workload", "code", "--n", 10).exit_code == 0
    replay = env / "replay" / "code.jsonl"
    before = (replay.read_bytes(), (env / "replay" / "code.jsonl.manifest.json").read_bytes())
    r = CliRunner().invoke(main, ["traffic", "sample", "--workload", "code", "--n", n, "--seed", "5"])
    assert (r.exit_code, type(r.exception)) == (2, SystemExit), r.output
    assert "Invalid value for '--n'" in r.output
    assert (replay.read_bytes(), (env / "replay" / "code.jsonl.manifest.json").read_bytes()) == before


# ---- write faults: exit 4, the pools as they were --------------------------------------------
def _traffic_files(home: Path) -> dict[str, bytes]:
    d = home / "traffic"
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())} if d.is_dir() else {}


def test_full_disk_during_import_exits_4_and_changes_no_pool(env, monkeypatch):
    from _faults import full_disk_after

    from autotune.traffic import _traffic

    assert _run("traffic", "import", write_jsonl(env / "a.jsonl", chat_rows(5))).exit_code == 0
    before = _traffic_files(env / "home")
    monkeypatch.setattr(_traffic, "AtomicFile", full_disk_after(3000))  # fills while the new lines go in
    r = CliRunner().invoke(main, ["traffic", "import", str(write_jsonl(env / "b.jsonl", chat_rows(20, prefix="b")))])
    assert r.exit_code == 4, r.output
    assert "error: cannot write the traffic pools: " in r.output and "No space left on device" in r.output
    assert "the pools are unchanged" in r.output and "malformed" not in r.output
    assert _traffic_files(env / "home") == before  # no torn line, no temp file left


def test_a_failure_at_the_second_pools_commit_leaves_every_pool_as_it_was(env, monkeypatch):
    """Two workloads in one import: the disk fills at the second pool's rename. Both pools and
    both metadata files stay the old ones, so "the pools are unchanged" is true."""
    import os

    rows = chat_rows(4, workload="code") + chat_rows(4, workload="chat", prefix="c")
    assert _run("traffic", "import", write_jsonl(env / "a.jsonl", rows)).exit_code == 0
    before = _traffic_files(env / "home")
    assert {"code.jsonl", "chat.jsonl", "code.meta.json", "chat.meta.json"} <= set(before)
    real_replace, pools_renamed = os.replace, []

    def replace(src, dst, *a, **kw):
        dst = Path(dst)
        if dst.suffix == ".jsonl" and not dst.name.startswith("."):
            pools_renamed.append(dst.name)
            if len(pools_renamed) == 2:
                raise OSError(28, "No space left on device", str(src))
        return real_replace(src, dst, *a, **kw)

    monkeypatch.setattr(os, "replace", replace)
    more = chat_rows(3, workload="code", prefix="x") + chat_rows(3, workload="chat", prefix="y")
    r = CliRunner().invoke(main, ["traffic", "import", str(write_jsonl(env / "b.jsonl", more))])
    monkeypatch.setattr(os, "replace", real_replace)
    assert len(pools_renamed) >= 2, pools_renamed  # the first pool was renamed before the failure
    assert r.exit_code == 4, r.output
    assert "No space left on device" in r.output and "the pools are unchanged" in r.output
    assert _traffic_files(env / "home") == before  # both pools and metas as they were, no temp file


def test_read_only_home_exits_4_without_a_traceback(env):
    import shutil
    import tempfile

    from _faults import as_other_user

    log = write_jsonl(env / "a.jsonl", chat_rows(3))
    os_home = Path(tempfile.mkdtemp(prefix="autotune-ro-home-"))  # under /tmp: another uid reaches it
    try:
        shutil.copy(log, os_home / "a.jsonl")
        (os_home / "home").mkdir()
        for p in (os_home, os_home / "a.jsonl"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        (os_home / "home").chmod(0o555)

        def import_as_user():
            r = CliRunner().invoke(main, ["traffic", "import", "--home", str(os_home / "home"),
                                          "--studies-dir", str(os_home), str(os_home / "a.jsonl")])
            return r.exit_code, r.output, repr(r.exception) if not isinstance(r.exception, SystemExit) else None

        code, out, exc = as_other_user(import_as_user)
        assert (code, exc) == (4, None), out
        assert f"error: cannot write the traffic pools: {os_home / 'home' / 'traffic'}: Permission denied" in out
        assert list((os_home / "home").iterdir()) == []
    finally:
        (os_home / "home").chmod(0o700)
        shutil.rmtree(os_home)


def test_a_symlink_planted_at_the_pool_lock_is_refused(env):
    victim = env / "precious.txt"
    victim.write_text("keep me\n")
    (env / "home" / "traffic").mkdir(parents=True)
    (env / "home" / "traffic" / ".lock").symlink_to(victim)
    r = CliRunner().invoke(main, ["traffic", "import", str(write_jsonl(env / "a.jsonl", chat_rows(3)))])
    assert (r.exit_code, type(r.exception)) == (4, SystemExit), r.output
    assert "is a symlink: refused (not followed)" in r.output and victim.read_text() == "keep me\n"
    assert sorted(p.name for p in (env / "home" / "traffic").iterdir()) == [".lock"]


def test_traffic_list_json_is_plain_json_of_the_pools(env):
    r = CliRunner().invoke(main, ["traffic", "list", "--json"])
    assert r.exit_code == 0 and json.loads(r.stdout) == []
    lines, _ = gateway_lines()
    write_gz(env / "logs" / "gw-1.jsonl.gz", lines)
    assert _run("traffic", "import", str(env / "logs" / "gw-1.jsonl.gz")).exit_code == 0
    plain = _run("traffic", "list").output.splitlines()
    r = CliRunner().invoke(main, ["traffic", "list", "--json"])
    assert r.exit_code == 0, r.output
    pools = json.loads(r.stdout)
    assert [p["workload"] for p in pools] == [ln.split()[0] for ln in plain]
    for p, ln in zip(pools, plain):
        assert f"{p['requests']:7d} requests  {p['first']} .. {p['last']}" in ln
        assert Path(p["path"]).exists() and p["synthetic"] == 0 and p["unreadable_lines"] == 0
