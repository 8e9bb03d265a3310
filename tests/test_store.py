"""autotune's own tables (sql/ at the top level): migrations applied once and all-or-nothing, the claims that keep
workers from measuring a configuration twice, and the SRE report queries, on SQLite and on a
real PostgreSQL server (`.ci/run` starts one; see the ``pg_url`` fixture)."""

from __future__ import annotations

import json
import multiprocessing as mp
import shutil
import sqlite3
import subprocess
from pathlib import Path

import pytest
import sqlalchemy as sa

from autotune.core import _store
from autotune.core._store import Store, StoreError, migrate, migrations

ROOT = Path(__file__).resolve().parent.parent
TABLES = {"autotune_schema_migrations", "autotune_studies", "autotune_runs", "autotune_trials",
          "autotune_recommendations", "autotune_claims"}


@pytest.fixture(params=["sqlite", "postgresql"])
def url(request, tmp_path):
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'a.db'}"
    return request.getfixturevalue("pg_url")


def _tables(url: str) -> set[str]:
    return set(sa.inspect(sa.create_engine(url)).get_table_names())


def test_migrations_are_numbered_files():
    ms = migrations()
    assert ms and ms[0].version == 1 and ms[0].path.parent == ROOT / "sql" / "migrations"
    assert [m.version for m in ms] == sorted(m.version for m in ms)
    assert any("CREATE TABLE autotune_runs" in s for s in ms[0].statements())


def test_migrate_twice_is_a_no_op(url):
    assert migrate(url) == [m.version for m in migrations()]
    assert TABLES <= _tables(url)
    assert migrate(url) == []
    rows = Store(url).query("SELECT version, name FROM autotune_schema_migrations")
    assert [(r["version"], r["name"]) for r in rows] == [(m.version, m.name) for m in migrations()]


def test_failing_migration_leaves_nothing_behind(url, tmp_path):
    sql = tmp_path / "sql"
    shutil.copytree(ROOT / "sql", sql)
    (sql / "migrations" / "0002_broken.sql").write_text(
        "CREATE TABLE autotune_half (x INTEGER);\nINSERT INTO no_such_table VALUES (1);\n")
    with pytest.raises(StoreError) as ei:
        migrate(url, sql_dir=sql)
    assert "cannot migrate" in str(ei.value) and "no_such_table" in str(ei.value)
    assert "autotune_half" not in _tables(url)
    assert not (TABLES - {"autotune_schema_migrations"}) & _tables(url)  # 0001 rolled back with it
    (sql / "migrations" / "0002_broken.sql").unlink()
    assert migrate(url, sql_dir=sql) == [1]


def _migrate_in_child(url: str, q) -> None:
    _store._engines.clear()
    q.put(migrate(url))


def test_concurrent_first_starts_apply_each_migration_once(url):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_migrate_in_child, args=(url, q)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    results = sorted(q.get(timeout=5) for _ in procs)
    assert results == [[], [], [1]]


def _claim_in_child(url: str, n: int, q) -> None:
    _store._engines.clear()
    Store._migrated.clear()
    ok, holder = Store(url).claim("autotune-code-x", '{"method": "ngram"}', n, lambda h: False)
    q.put((n, ok))


def test_two_processes_claim_one_configuration_exactly_once(url):
    Store(url)  # migrated
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_claim_in_child, args=(url, n, q)) for n in (1, 2, 3, 4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    won = [n for n, ok in (q.get(timeout=5) for _ in procs) if ok]
    assert len(won) == 1
    rows = Store(url).query("SELECT trial_number FROM autotune_claims")
    assert [r["trial_number"] for r in rows] == won


def test_claim_takeover_is_a_compare_and_swap(url):
    s = Store(url)
    assert s.claim("st", "k", 1, lambda h: False) == (True, None)
    assert s.claim("st", "k", 2, lambda h: False) == (False, 1)  # holder alive: refused
    assert s.claim("st", "k", 1, lambda h: False) == (True, None)  # re-claim by the holder
    assert s.claim("st", "k", 3, lambda h: h == 1) == (True, None)  # holder gave up: moved
    assert s.claim("st", "k", 4, lambda h: h == 1) == (False, 3)  # the stale view loses


def _fill(s: Store) -> None:
    r1 = s.start_run("code", "daemon", "0")
    s.finish_run(r1, "ok", 0, decision="change", trials=5, server_starts=6, failed_trials=1)
    s.record_failed_run("chat", "cron", "0", 2, "studies/chat.yaml:3: field 'model': no such file")
    s.upsert_trial({"study_name": "autotune-code-1", "trial_number": 3, "workload": "code", "state": "FAIL",
                    "error": "vllm serve died during the replay (killed by SIGKILL)", "server_starts": 1})
    s.upsert_trial({"study_name": "autotune-code-1", "trial_number": 1, "workload": "code", "state": "COMPLETE",
                    "tpot_ms": 12.5, "server_starts": 1, "method": "ngram", "k": 4})
    with s.engine.begin() as c:
        for i, (dec, method) in enumerate((("keep", "none"), ("change", "ngram"))):
            s.add_recommendation(c, {
                "rec_id": f"2026112{i}T020000.000000Z-abc", "workload": "code", "created_at": f"2026-11-2{i}T02:00:00Z",
                "decision": dec, "method": method, "k": 4 if method == "ngram" else None, "speedup": 2.5,
                "drift": i, "winner_changed": i, "reason": f"night {i}", "payload": json.dumps({"n": i})})


def test_report_queries_run_on_both_databases(url):
    s = Store(url)
    _fill(s)
    assert set(_store.reports()) == {"latest_recommendations", "recommendation_history", "failures", "runs"}
    latest = s.report("latest_recommendations")
    assert [(r["workload"], r["decision"], r["method"], r["k"]) for r in latest] == [("code", "change", "ngram", 4)]
    hist = s.report("recommendation_history")
    assert [r["reason"] for r in hist] == ["night 1", "night 0"]
    fails = s.report("failures")
    assert {(f["what"], f["workload"]) for f in fails} == {("run", "chat"), ("trial", "code")}
    assert any("killed by SIGKILL" in (f["reason"] or "") for f in fails)
    runs = s.report("runs")
    assert {r["outcome"] for r in runs} == {"ok", "failed"}
    with pytest.raises(StoreError, match="no report 'nosuch'"):
        s.report("nosuch")


def test_report_files_run_in_the_sqlite3_shell_as_they_are(tmp_path):
    db = tmp_path / "a.db"
    _fill(Store(f"sqlite:///{db}"))
    for name in _store.reports():
        text = (ROOT / "sql" / "reports" / f"{name}.sql").read_text()
        rows = sqlite3.connect(db).execute(text).fetchall()  # what `sqlite3 db < file` runs
        assert rows, name
        if shutil.which("sqlite3"):
            out = subprocess.run(["sqlite3", str(db)], input=text, capture_output=True, text=True, check=True)
            assert out.stdout.strip() and not out.stderr


def test_report_files_run_in_psql_as_they_are(pg_url):
    if not shutil.which("psql"):
        pytest.skip("no psql client")
    _fill(Store(pg_url))
    plain = pg_url.replace("postgresql+psycopg://", "postgresql://")
    for name in _store.reports():
        out = subprocess.run(["psql", plain, "-v", "ON_ERROR_STOP=1", "-f", str(ROOT / "sql" / "reports" / f"{name}.sql")],
                             capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        assert "row" in out.stdout


def test_mark_dead_runs(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'a.db'}")
    rid = s.start_run("code", "daemon", "0")
    assert s.mark_dead_runs("elsewhere", lambda pid: False) == []  # other hosts are not ours to judge
    import socket

    assert s.mark_dead_runs(socket.gethostname(), lambda pid: True) == []
    dead = s.mark_dead_runs(socket.gethostname(), lambda pid: False)
    assert [r["run_id"] for r in dead] == [rid]
    (row,) = s.query("SELECT outcome, error FROM autotune_runs")
    assert row["outcome"] == "interrupted" and "died during the run" in row["error"]


def test_unreachable_database_is_a_store_error():
    with pytest.raises(StoreError) as ei:
        migrate("postgresql+psycopg://u:secret@127.0.0.1:1/none")
    assert "secret" not in str(ei.value) and "u:***@" in str(ei.value)


def _open_optuna_in_child(url: str, q) -> None:
    import optuna

    _store._engines.clear()
    storage = _store.open_optuna_storage(url)
    optuna.create_study(study_name="autotune-code-x", storage=storage, load_if_exists=True)
    q.put("ok")


def test_workers_creating_optunas_schema_at_once_do_not_collide(url):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_open_optuna_in_child, args=(url, q)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    assert [q.get(timeout=5) for _ in procs] == ["ok"] * 3


# ---- shipped SQL, report names, masking, file permissions ------------------------------------
def test_report_accepts_only_the_shipped_names(tmp_path):
    s = Store(f"sqlite:///{tmp_path / 'a.db'}")
    outside = tmp_path / "evil.sql"
    outside.write_text("SELECT 1 AS x")
    for name in ("../migrations/0001_initial", str(outside.with_suffix("")), "runs.sql", "Runs", "runs;--"):
        with pytest.raises(StoreError) as ei:
            s.report(name)
        msg = str(ei.value)
        assert f"no report {name!r}" in msg
        assert "the reports are: failures, latest_recommendations, recommendation_history, runs" in msg


def test_no_migrations_found_is_a_loud_error(tmp_path):
    empty = tmp_path / "sql"
    (empty / "migrations").mkdir(parents=True)
    url = f"sqlite:///{tmp_path / 'a.db'}"
    for d in (empty, tmp_path / "nowhere"):
        with pytest.raises(StoreError, match=r"no migrations in .*: autotune's SQL files are missing"):
            migrate(url, sql_dir=d)
    assert "autotune_schema_migrations" not in _tables(url)


def test_db_migrate_without_sql_files_exits_3_naming_the_folder(tmp_path):
    import os
    import sys

    env = {**os.environ, "AUTOTUNE_SQL_DIR": str(tmp_path / "missing"), "AUTOTUNE__STUDIES_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "autotune", "db", "migrate", "--storage",
                          f"sqlite:///{tmp_path / 'a.db'}"], capture_output=True, text=True, env=env)
    assert out.returncode == 3, out.stdout + out.stderr
    assert f"no migrations in {tmp_path / 'missing' / 'migrations'}" in out.stderr


@pytest.mark.parametrize("url,shown", [
    ("postgresql+psycopg://autotune:s3cr%40t@db-host:5432/autotune", "postgresql+psycopg://autotune:***@db-host:5432/autotune"),
    ("postgresql://u:pw@h/db?sslmode=require", "postgresql://u:***@h/db?sslmode=require"),
    ("postgresql://u@h/db?password=pw", "postgresql://u@h/db?password=***"),
    ("postgresql://u@h/db", "postgresql://u@h/db"),
    ("sqlite:////var/lib/autotune/autotune.db", "sqlite:////var/lib/autotune/autotune.db"),
    ("sqlite:///:memory:", "sqlite:///:memory:"),
    ("not a url://u:pw@h", "not a url://u:***@h"),
])
def test_safe_url_masks_every_form_of_password(url, shown):
    assert _store.safe_url(url) == shown


def test_sqlite_database_is_created_private_and_an_open_one_is_tightened(tmp_path):
    import os

    db = tmp_path / "a.db"
    Store(f"sqlite:///{db}").start_run("code", "manual", "0")
    assert db.stat().st_mode & 0o777 == 0o600
    loose = tmp_path / "b.db"
    sqlite3.connect(loose).execute("CREATE TABLE x (a)").connection.commit()
    os.chmod(loose, 0o644)
    _store.open_optuna_storage(f"sqlite:///{loose}")
    assert loose.stat().st_mode & 0o777 == 0o600
