"""``autotune`` in a process of its own with a stand-in engine, for faults that need a process to
die or a database to break while a study runs: the probe answers as vLLM 0.32 would and each
server start is the synthetic workload's measurement (``test_search_study.fake_measure``).

    python tests/_standin_study.py study start --workload syn --spec syn.yaml

``AUTOTUNE_STANDIN_FAULT`` picks the fault, at the start of the study's server start N (0: the
baseline), counted in this process:

- ``break-db-at:N``: the database becomes unusable. SQLite: the file is copied to ``<db>.saved``,
  then overwritten in place (copying ``.saved`` back is the database coming back). PostgreSQL:
  the database refuses connections and its sessions are ended, as a stopped server's would be
  (``reopen_database`` brings it back).
- ``hang-at:N``: ``<AUTOTUNE__HOME>/hung`` is written and the start never ends (a test kills it).

Every start made is appended to ``<AUTOTUNE__HOME>/starts.jsonl`` (its config), across processes.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _synthetic import Workload  # noqa: E402
from test_search_study import RATES, fake_measure  # noqa: E402

from autotune.cli._main import main  # noqa: E402
from autotune.engines import _probe  # noqa: E402
from autotune.engines._probe import Capabilities  # noqa: E402
from autotune.search import _study  # noqa: E402

CAPS = Capabilities(version="0.32.0", methods=["ngram"], fields=["method", "num_speculative_tokens",
                    "prompt_lookup_min", "prompt_lookup_max"], arctic_inference=False)


def _break(url: str) -> None:
    if url.startswith("sqlite:///"):
        db = Path(url.removeprefix("sqlite:///"))
        shutil.copy(db, db.with_name(db.name + ".saved"))
        with open(db, "r+b") as fh:
            fh.write(b"\0not a database" * 512)
        return
    _allow_connections(url, False)


def _allow_connections(url: str, allow: bool) -> None:
    """PostgreSQL: let the database of ``url`` take connections or not (ending its sessions)."""
    import sqlalchemy as sa

    name = sa.engine.make_url(url).database
    admin = sa.create_engine(url.rsplit("/", 1)[0] + "/postgres", isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as c:
            c.exec_driver_sql(f"ALTER DATABASE {name} ALLOW_CONNECTIONS {str(allow).lower()}")
            if not allow:
                c.exec_driver_sql(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = '{name}'")
    finally:
        admin.dispose()


def reopen_database(url: str) -> None:
    """The database ``break-db-at`` made unusable is back (SQLite: as it was at the fault)."""
    if url.startswith("sqlite:///"):
        db = Path(url.removeprefix("sqlite:///"))
        shutil.copy(db.with_name(db.name + ".saved"), db)
    else:
        _allow_connections(url, True)


def _standin():
    inner = fake_measure(Workload(rates=RATES))
    fault, _, at = os.environ.get("AUTOTUNE_STANDIN_FAULT", "").partition(":")
    home = Path(os.environ["AUTOTUNE__HOME"])

    def measure(spec, config, *a, **kw):
        n = len(inner.calls)
        if fault == "break-db-at" and n == int(at):
            _break(spec.storage)
        if fault == "hang-at" and n == int(at):
            (home / "hung").write_text(str(os.getpid()))
            while True:
                time.sleep(60)
        home.mkdir(parents=True, exist_ok=True)
        with open(home / "starts.jsonl", "a") as fh:
            fh.write(json.dumps(config) + "\n")
        return inner(spec, config, *a, **kw)

    return measure


if __name__ == "__main__":
    _probe.probe = lambda *a, **k: CAPS
    _study.measure = _standin()
    main(sys.argv[1:], prog_name="autotune")
