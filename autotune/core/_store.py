"""autotune's own tables (the repository's ``sql/migrations``), beside Optuna's, in the same SQLite or PostgreSQL.

Optuna keeps the trials; these tables keep what SREs and the daemon ask about without Optuna:
runs (who ran what, how it ended), per-trial headline measurements, every recommendation, and
the claims that stop two workers from measuring one configuration twice. The schema is plain,
portable SQL in ``sql/migrations/NNNN_name.sql`` (installed as the package ``autotune._sql``: a wheel
ships them; ``AUTOTUNE_SQL_DIR`` points elsewhere), applied in order at startup inside one
transaction under a lock (``BEGIN IMMEDIATE`` on SQLite, an advisory lock on PostgreSQL), so
concurrent starts on several hosts apply each migration exactly once and a failing migration
leaves nothing behind. The report queries in ``sql/reports`` run as they are in sqlite3 or psql.
"""

from __future__ import annotations

import importlib.resources
import json
import os
import re
import socket
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

from autotune.core._files import ensure_private_file
from autotune.core._lock import FileLock
from autotune.core._schedule import iso


def shipped_sql_dir() -> Path:
    """The folder of autotune's SQL files: the checkout's top-level ``sql/`` when autotune runs
    from a source tree (this tree's copy, even where another checkout is installed), else the
    installed package ``autotune._sql`` (pyproject maps ``sql/`` to it, so a wheel or an editable
    install carries the same files). A missing one is reported by ``migrations()``, naming it."""
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "sql" / "migrations").is_dir():
        return checkout / "sql"
    try:
        return Path(str(importlib.resources.files("autotune._sql")))
    except ModuleNotFoundError:
        return Path(__file__).resolve().parent.parent / "_sql"


SQL_DIR = Path(os.environ.get("AUTOTUNE_SQL_DIR") or shipped_sql_dir())
_MIGRATION = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
_REPORT_NAME = re.compile(r"^[a-z0-9_]+$")
_PG_LOCK_KEY = 7_274_883_001  # arbitrary, constant: serialises migrations across hosts

_engines: dict[str, object] = {}
_engines_lock = threading.Lock()


class StoreError(RuntimeError):
    """The database could not be opened or migrated; names the URL (without password)."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    path: Path

    def statements(self) -> list[str]:
        """Statements of the file, split on ``;`` at line ends (comments dropped)."""
        text = "\n".join(ln for ln in self.path.read_text().splitlines() if not ln.lstrip().startswith("--"))
        return [s.strip() for s in re.split(r";\s*(?:\n|$)", text) if s.strip()]


def migrations(sql_dir: Path = SQL_DIR) -> list[Migration]:
    d = Path(sql_dir) / "migrations"
    if not d.is_dir() or not any(d.glob("*.sql")):
        raise StoreError(f"no migrations in {d}: autotune's SQL files are missing (a broken install, or "
                         f"AUTOTUNE_SQL_DIR={os.environ.get('AUTOTUNE_SQL_DIR', '')!r} points to the wrong "
                         f"folder); reinstall autotune or fix AUTOTUNE_SQL_DIR")
    found = []
    for p in sorted(d.glob("*.sql")):
        m = _MIGRATION.match(p.name)
        if not m:
            raise StoreError(f"{p}: migration files are named NNNN_name.sql")
        found.append(Migration(int(m.group(1)), m.group(2), p))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise StoreError(f"{d}: two migrations share a version number")
    return found


_SECRET_QUERY_KEYS = ("password", "passwd", "pwd", "sslpassword", "secret", "token")
_SECRET_PARAM = re.compile(r"(?i)((?:^|[?&;\s])(?:" + "|".join(_SECRET_QUERY_KEYS) + r")=)[^&;\s]*")


def _userinfo(url: str) -> tuple[int, int] | None:
    """Where the password of ``scheme://user:password@host...`` (or ``user:password@host``) lies:
    after the user's ``:`` up to the last ``@`` before the query. A password may hold ``/``, ``@``
    or ``?`` unescaped; SQLAlchemy would take part of it for the host, so this reads the raw string."""
    head = url.find("://")
    begin = head + 3 if head >= 0 else 0
    if url.startswith("/", begin):  # sqlite:////path: no user, no host
        return None
    at = url.rfind("@", begin)
    if at < 0:
        return None
    colon = url.find(":", begin, at)
    return (colon + 1, at) if colon >= 0 else None


def safe_url(url: str) -> str:
    """The URL to show anywhere (files, tables, CLI, logs, metrics labels): password masked.

    The one masking function, for every URL autotune prints, parsable or not: whatever lies
    between ``user:`` and the last ``@`` of the authority, and password-like parameters
    (``?password=``, libpq's ``password=`` in a key/value string), become ``***``. Everything
    else is shown as given (sqlite paths stay readable)."""
    if url is None:
        return url
    s = _SECRET_PARAM.sub(r"\1***", str(url))
    span = _userinfo(s)
    if span is not None:
        s = s[:span[0]] + "***" + s[span[1]:]
    return s


def has_password(url: str | None) -> bool:
    """Whether ``url`` carries a secret that ``safe_url`` would mask."""
    return bool(url) and safe_url(url) != url


def scrub(text: str, url: str | None) -> str:
    """``text`` (an error message, a log line) with ``url`` and its password masked, for messages
    of libraries (SQLAlchemy, drivers) that quote the URL they were given."""
    if not url:
        return text
    text = text.replace(url, safe_url(url))
    span = _userinfo(url)
    secret = url[span[0]:span[1]] if span else ""
    # the whole password, then its pieces: a library that split it at an unescaped @ or / quotes
    # one piece as the host or the database
    for piece in sorted({secret, *re.split(r"[@/?#:]", secret)}, key=len, reverse=True):
        if len(piece) >= 3:
            text = text.replace(piece, "***")
    return _SECRET_PARAM.sub(r"\1***", text)


def _private_sqlite(url: str) -> None:
    """A SQLite database holds trial records, errors and paths: create it 0600 (its journal and
    WAL files inherit the database file's permissions), and tighten an existing one."""
    if url.startswith("sqlite:///") and ":memory:" not in url and "mode=memory" not in url:
        ensure_private_file(url.removeprefix("sqlite:///").split("?", 1)[0])


def engine_for(url: str):
    """One SQLAlchemy engine per URL per process (SQLite: 30 s busy timeout, like Optuna's).
    A URL that is no database URL, or whose driver is not installed, is a StoreError."""
    with _engines_lock:
        eng = _engines.get(url)
        if eng is None:
            eng = _engines[url] = _create_engine(url)
        return eng


def check_url(url: str) -> str:
    """``url`` if SQLAlchemy can parse it and its driver is installed, else StoreError."""
    engine_for(url)
    return url


def _create_engine(url: str):
    import sqlalchemy as sa

    try:
        u = sa.engine.make_url(url)
        u.port  # noqa: B018  (a port that is no number raises here, not at the first connection)
    except (sa.exc.ArgumentError, ValueError) as e:
        raise StoreError(f"storage {safe_url(url)} is not a database URL ({scrub(str(e), url)}); the form is "
                         f"sqlite:////path/to/autotune.db or postgresql+psycopg://user@host/db (a password in "
                         f"AUTOTUNE__STORAGE or --storage-file)") from None
    kw: dict = {"pool_pre_ping": True}
    if u.get_backend_name() == "sqlite":
        kw["connect_args"] = {"timeout": 30}
    try:
        _private_sqlite(url)
        return sa.create_engine(url, **kw)
    except (sa.exc.NoSuchModuleError, ImportError) as e:
        hint = (" (pip install 'autotune[postgres]' and use postgresql+psycopg://)"
                if u.get_backend_name() == "postgresql" else "")
        raise StoreError(f"storage {safe_url(url)}: its database driver is not installed "
                         f"({scrub(str(e), url)}){hint}") from None
    except (sa.exc.ArgumentError, TypeError, ValueError, OSError) as e:
        raise StoreError(f"storage {safe_url(url)} cannot be opened ({scrub(str(e), url)})") from None


def migrate(url: str, sql_dir: Path = SQL_DIR) -> list[int]:
    """Apply the migrations not applied yet; returns the versions applied now ([] = up to date)."""
    todo = migrations(sql_dir)
    eng = engine_for(url)
    sqlite = eng.dialect.name == "sqlite"
    applied_now: list[int] = []
    try:
        with eng.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.exec_driver_sql("BEGIN IMMEDIATE" if sqlite else "BEGIN")
            try:
                if not sqlite:
                    c.exec_driver_sql(f"SELECT pg_advisory_xact_lock({_PG_LOCK_KEY})")
                c.exec_driver_sql("CREATE TABLE IF NOT EXISTS autotune_schema_migrations ("
                                  "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)")
                done = {r[0] for r in c.exec_driver_sql("SELECT version FROM autotune_schema_migrations")}
                for m in todo:
                    if m.version in done:
                        continue
                    for stmt in m.statements():
                        c.exec_driver_sql(stmt)
                    _exec(c, "INSERT INTO autotune_schema_migrations (version, name, applied_at) "
                             "VALUES (:v, :n, :t)", v=m.version, n=m.name, t=iso())
                    applied_now.append(m.version)
                c.exec_driver_sql("COMMIT")
            except BaseException:
                c.exec_driver_sql("ROLLBACK")
                raise
    except StoreError:
        raise
    except Exception as e:
        raise StoreError(f"cannot migrate autotune's tables in {safe_url(url)}: {scrub(error_line(e), url)}") from e
    return applied_now


def error_line(e: BaseException) -> str:
    """A driver's error without SQLAlchemy's appended SQL and background link."""
    text = str(getattr(e, "orig", None) or e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def storage_fault(exc: BaseException) -> BaseException | None:
    """The database error behind ``exc``, None when there is none. Optuna wraps it in a
    StorageInternalError, and its own bookkeeping can fail on top of it (an UnboundLocalError from
    a ``finally`` whose context is the database's error), so the chain of causes is searched."""
    import sqlalchemy as sa

    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, sa.exc.SQLAlchemyError):
            return e
        e = e.__cause__ or e.__context__
    return None


def open_optuna_storage(url: str, **kw):
    """Optuna's RDBStorage, created under a cross-process lock.

    Optuna creates its schema on first use without a lock, and on PostgreSQL two workers doing
    that at once collide (``CREATE TYPE studydirection``: duplicate key). A session advisory
    lock on PostgreSQL (a file lock beside the database on SQLite) lets one create and the
    others find the tables.
    """
    import optuna

    if url.startswith("postgresql"):
        eng = engine_for(url)
        with eng.connect().execution_options(isolation_level="AUTOCOMMIT") as c:
            c.exec_driver_sql(f"SELECT pg_advisory_lock({_PG_LOCK_KEY + 1})")
            try:
                return optuna.storages.RDBStorage(url, **kw)
            finally:
                c.exec_driver_sql(f"SELECT pg_advisory_unlock({_PG_LOCK_KEY + 1})")
    if url.startswith("sqlite:///") and url != "sqlite:///:memory:":
        _private_sqlite(url)
        path = Path(url.removeprefix("sqlite:///"))
        init_lock = FileLock(path.with_name(path.name + ".init-lock"), private=False)
        with init_lock.acquire(what="optuna schema", wait=True, poll_s=0.1):
            return optuna.storages.RDBStorage(url, **kw)
    return optuna.storages.RDBStorage(url, **kw)


def _exec(conn, sql: str, **params):
    import sqlalchemy as sa

    return conn.execute(sa.text(sql), params)


class Store:
    """autotune's tables in one database. Opening it applies pending migrations."""

    _migrated: set[str] = set()

    def __init__(self, url: str):
        self.url = url
        if url not in Store._migrated:
            migrate(url)
            Store._migrated.add(url)
        self.engine = engine_for(url)

    # ---- writes -------------------------------------------------------------------------
    def _write(self, sql: str, **params) -> int:
        with self.engine.begin() as c:
            return _exec(c, sql, **params).rowcount

    def record_study(self, study_name: str, workload: str, fingerprint: str, model: str,
                     vllm_version: str | None, replay_path: str | None, replay_digest: str | None) -> None:
        import sqlalchemy as sa

        if self.query("SELECT 1 AS x FROM autotune_studies WHERE study_name = :s", s=study_name):
            return
        try:
            self._write("INSERT INTO autotune_studies (study_name, workload, fingerprint, model, vllm_version, "
                        "replay_path, replay_digest, created_at) VALUES (:s, :w, :f, :m, :v, :rp, :rd, :t)",
                        s=study_name, w=workload, f=fingerprint, m=model, v=vllm_version, rp=replay_path,
                        rd=replay_digest, t=iso())
        except sa.exc.IntegrityError:  # another worker recorded it a moment ago
            pass

    def start_run(self, workload: str, kind: str, gpu: str | None, study_name: str | None = None) -> str:
        run_id = uuid.uuid4().hex[:16]
        self._write("INSERT INTO autotune_runs (run_id, workload, study_name, kind, host, pid, gpu, started_at, "
                    "outcome) VALUES (:r, :w, :s, :k, :h, :p, :g, :t, 'running')",
                    r=run_id, w=workload, s=study_name, k=kind, h=socket.gethostname(), p=os.getpid(), g=gpu, t=iso())
        return run_id

    def set_run_study(self, run_id: str, study_name: str) -> None:
        self._write("UPDATE autotune_runs SET study_name = :s WHERE run_id = :r", s=study_name, r=run_id)

    def finish_run(self, run_id: str, outcome: str, exit_code: int, *, decision: str | None = None,
                   error: str | None = None, trials: int | None = None, server_starts: int | None = None,
                   failed_trials: int | None = None) -> None:
        self._write("UPDATE autotune_runs SET finished_at = :t, outcome = :o, exit_code = :c, decision = :d, "
                    "error = :e, trials = :n, server_starts = :ss, failed_trials = :f WHERE run_id = :r",
                    t=iso(), o=outcome, c=exit_code, d=decision, e=error and error[:2000], n=trials,
                    ss=server_starts, f=failed_trials, r=run_id)

    def record_failed_run(self, workload: str, kind: str, gpu: str | None, exit_code: int, error: str) -> str:
        """A run that failed before it started anything (bad input, engine unusable): one row."""
        run_id = uuid.uuid4().hex[:16]
        self._write("INSERT INTO autotune_runs (run_id, workload, kind, host, pid, gpu, started_at, finished_at, "
                    "outcome, exit_code, error) VALUES (:r, :w, :k, :h, :p, :g, :t, :t, 'failed', :c, :e)",
                    r=run_id, w=workload, k=kind, h=socket.gethostname(), p=os.getpid(), g=gpu, t=iso(),
                    c=exit_code, e=error[:2000])
        return run_id

    def upsert_trial(self, row: dict) -> None:
        cols = ["study_name", "trial_number", "run_id", "workload", "role", "config_key", "method", "k", "state",
                "tpot_ms", "acceptance_length", "acceptance_rate", "output_tok_s", "failed_requests",
                "server_starts", "start_seconds", "error", "host", "log_path", "finished_at"]
        params = {c: row.get(c) for c in cols}
        params["finished_at"] = params["finished_at"] or iso()
        updates = ", ".join(f"{c} = excluded.{c}" for c in cols[2:])
        self._write(f"INSERT INTO autotune_trials ({', '.join(cols)}) VALUES ({', '.join(':' + c for c in cols)}) "
                    f"ON CONFLICT (study_name, trial_number) DO UPDATE SET {updates}", **params)

    def claim(self, study_name: str, claim_key: str, trial_number: int, may_take_over) -> tuple[bool, int | None]:
        """Atomically make ``trial_number`` the one trial that measures ``claim_key``.

        Returns (True, None) when claimed, else (False, holder). ``may_take_over(holder)`` says
        whether the current holder gave up (failed, pruned, interrupted): the row is then moved
        with a compare-and-swap, so of two trials taking over one wins.
        """
        import sqlalchemy as sa

        try:
            self._write("INSERT INTO autotune_claims (study_name, claim_key, trial_number, host, claimed_at) "
                        "VALUES (:s, :k, :n, :h, :t)", s=study_name, k=claim_key, n=trial_number,
                        h=socket.gethostname(), t=iso())
            return True, None
        except sa.exc.IntegrityError:
            pass
        with self.engine.connect() as c:
            row = _exec(c, "SELECT trial_number FROM autotune_claims WHERE study_name = :s AND claim_key = :k",
                        s=study_name, k=claim_key).first()
        holder = int(row[0]) if row else None
        if holder == trial_number:
            return True, None
        if holder is not None and may_take_over(holder):
            moved = self._write("UPDATE autotune_claims SET trial_number = :n, host = :h, claimed_at = :t "
                                "WHERE study_name = :s AND claim_key = :k AND trial_number = :old",
                                n=trial_number, h=socket.gethostname(), t=iso(), s=study_name, k=claim_key,
                                old=holder)
            if moved == 1:
                return True, None
        return False, holder

    def add_recommendation(self, conn, row: dict) -> None:
        """Insert inside the caller's transaction (``with store.engine.begin() as conn``)."""
        cols = ["rec_id", "workload", "created_at", "run_id", "study_name", "decision", "method", "k", "speedup",
                "speedup_ci_low", "speedup_ci_high", "incumbent_acceptance_rate", "drift", "winner_changed",
                "reason", "history_path", "payload"]
        _exec(conn, f"INSERT INTO autotune_recommendations ({', '.join(cols)}) "
                    f"VALUES ({', '.join(':' + c for c in cols)})", **{c: row.get(c) for c in cols})

    def remove_recommendation(self, rec_id: str) -> None:
        """Undo a committed row whose file could not be made current (the rename after the commit
        failed): the table never lists a recommendation that was not written."""
        self._write("DELETE FROM autotune_recommendations WHERE rec_id = :rec_id", rec_id=rec_id)

    # ---- reads --------------------------------------------------------------------------
    def query(self, sql: str, **params) -> list[dict]:
        with self.engine.connect() as c:
            res = _exec(c, sql, **params)
            return [dict(r._mapping) for r in res]

    def recommendations(self, workload: str, limit: int | None = None) -> list[dict]:
        """Newest first, payload parsed."""
        rows = self.query("SELECT * FROM autotune_recommendations WHERE workload = :w ORDER BY rec_id DESC"
                          + (f" LIMIT {int(limit)}" if limit else ""), w=workload)
        for r in rows:
            r["payload"] = json.loads(r["payload"])
        return rows

    def last_run(self, workload: str, outcome: str | None = None) -> dict | None:
        rows = self.query("SELECT * FROM autotune_runs WHERE workload = :w"
                          + (" AND outcome = :o" if outcome else "") + " ORDER BY started_at DESC, run_id LIMIT 1",
                          w=workload, **({"o": outcome} if outcome else {}))
        return rows[0] if rows else None

    def running_runs(self, host: str | None = None) -> list[dict]:
        return self.query("SELECT * FROM autotune_runs WHERE outcome = 'running'"
                          + (" AND host = :h" if host else ""), **({"h": host} if host else {}))

    def mark_dead_runs(self, host: str, alive) -> list[dict]:
        """Runs still 'running' on ``host`` whose process is gone (killed -9): 'interrupted'."""
        dead = [r for r in self.running_runs(host) if not alive(r["pid"])]
        for r in dead:
            self._write("UPDATE autotune_runs SET outcome = 'interrupted', finished_at = :t, exit_code = :c, "
                        "error = :e WHERE run_id = :r AND outcome = 'running'", t=iso(), c=137,
                        e=f"process {r['pid']} on {host} died during the run", r=r["run_id"])
        return dead

    def report(self, name: str, sql_dir: Path = SQL_DIR) -> list[dict]:
        """Run the shipped report ``sql/reports/<name>.sql`` (the file SREs run with sqlite3 or
        psql). Only the shipped names are accepted: ``name`` is never a path."""
        known = reports(sql_dir)
        if name not in known:
            raise StoreError(f"no report {name!r}; the reports are: {', '.join(known) or '(none found in ' + str(Path(sql_dir) / 'reports') + ')'}")
        p = Path(sql_dir) / "reports" / f"{name}.sql"
        text = "\n".join(ln.split("--")[0] for ln in p.read_text().splitlines()).strip().rstrip(";")
        return self.query(text)


def reports(sql_dir: Path = SQL_DIR) -> list[str]:
    """The shipped report names (``sql/reports/*.sql``)."""
    return sorted(p.stem for p in (Path(sql_dir) / "reports").glob("*.sql") if _REPORT_NAME.match(p.stem))
