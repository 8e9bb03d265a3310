"""No output carries the database password: a whole run (`study start`'s orchestration, with a
synthetic engine in place of `vllm serve`) on a real PostgreSQL reached through a role whose
password appears nowhere else, then every artifact is searched for it: the files it wrote
(recommendation, history copy, logs, caches), every row of every table (autotune's and Optuna's,
the ``payload`` column included), the command output of the run and of `study list`, `study
show`, `db migrate`, `db report`, `recommend history`, the log records, and the Prometheus
metrics. The end-to-end version with real vLLM servers is
``tests/test_reliability_vllm.py::test_two_workers_on_postgresql_share_one_study_without_duplicates``."""

from __future__ import annotations

import logging
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from click.testing import CliRunner

from _pg import pg_secret_url  # noqa: F401  (fixture)
from _synthetic import Workload
from test_search_study import RATES, fake_measure, make_spec
from autotune.cli._main import main
from autotune.core import _store
from autotune.core._settings import Settings
from autotune.engines import _probe
from autotune.engines._probe import Capabilities
from autotune.ops import _exporter, _runner
from autotune.search import _study


def _all_rows(url: str) -> str:
    eng = sa.create_engine(url)
    try:
        with eng.connect() as c:
            out = []
            for table in sa.inspect(c).get_table_names():
                out += [repr(tuple(r)) for r in c.execute(sa.text(f'SELECT * FROM "{table}"'))]
        return "\n".join(out)
    finally:
        eng.dispose()


def _all_files(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_no_artifact_of_a_postgresql_run_holds_the_password(pg_secret_url, tmp_path, monkeypatch, caplog):
    url, password = pg_secret_url
    masked = _store.safe_url(url)
    assert password not in masked and ":***@" in masked
    make_spec(tmp_path)  # writes tmp_path/syn.yaml; its own storage is a SQLite file we do not use
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=["method", "num_speculative_tokens",
                        "prompt_lookup_min", "prompt_lookup_max"], arctic_inference=False)
    monkeypatch.setattr(_probe, "probe", lambda *a, **k: caps)
    monkeypatch.setattr(_study, "measure", fake_measure(Workload(rates=RATES)))
    for k in ("AUTOTUNE__STORAGE", "AUTOTUNE__RECOMMENDATIONS_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AUTOTUNE__STUDIES_DIR", str(tmp_path))
    monkeypatch.setenv("AUTOTUNE__HOME", str(tmp_path / "home"))
    caplog.set_level(logging.DEBUG)
    printed: list[str] = []
    code = _runner.run(_runner.RunRequest(workload="syn", spec_path=str(tmp_path / "syn.yaml"), storage=url),
                       settings=Settings(), echo=lambda msg, err=False: printed.append(msg))
    assert code == 0, printed
    rec_file = tmp_path / "rec" / "syn.json"
    assert rec_file.exists() and masked in rec_file.read_text()  # the storage is named, masked
    cli = CliRunner()
    for args in (["study", "list", "--storage", url], ["study", "show", "syn", "--storage", url],
                 ["db", "migrate", "--storage", url], ["recommend", "history", "syn", "--storage", url],
                 *(["db", "report", name, "--storage", url] for name in _store.reports()),
                 ["db", "report", "no_such", "--storage", url]):
        res = cli.invoke(main, args, catch_exceptions=False)
        printed.append(res.output)
    assert masked in "\n".join(printed)  # `study list` / `study show` / `db migrate` name the database
    unreachable = url.replace(":55432/", ":1/") if ":55432/" in url else url + "x"
    try:
        _store.migrate(unreachable)
    except _store.StoreError as e:
        printed.append(str(e))
    srv, _ = _exporter.serve([url, unreachable], port=0)
    try:
        metrics = httpx.get(f"http://127.0.0.1:{srv.server_port}/metrics").text
    finally:
        srv.shutdown()
    assert f'autotune_store_up{{storage="{masked}"}} 1.0' in metrics

    files, rows = _all_files(tmp_path), _all_rows(url)
    # what is searched is all there: the run's files, rows and lines
    names = {Path(p).name for p in files}
    assert "syn.json" in names and any(n.endswith("-change.json") or n.endswith("-keep.json") for n in names)
    assert masked in rows and len(caplog.records) > 0 and len(printed) > 10
    leaks = [f"output: {line[:200]}" for line in printed if password in line]
    leaks += [f"log: {r.getMessage()[:200]}" for r in caplog.records if password in r.getMessage()]
    leaks += [f"file: {p}" for p, data in files.items() if password.encode() in data]
    leaks += ["database row"] if password in rows else []
    leaks += ["metrics"] if password in metrics else []
    assert leaks == []
    with sa.create_engine(url).connect() as c:
        payload = c.execute(sa.text("SELECT payload FROM autotune_recommendations")).scalar_one()
    assert masked in payload


def test_deploy_files_keep_the_database_password_out_of_unit_and_cron_files():
    import re

    root = Path(__file__).resolve().parent.parent / "deploy"
    with_password = re.compile(r"AUTOTUNE__STORAGE=\S*://[^:/@\s]+:[^@\s]+@")
    for p in sorted(root.glob("*.service")) + sorted(root.glob("*.cron")):
        assert not with_password.search(p.read_text()), f"{p.name}: a storage URL with a password"
    assert with_password.search((root / "autotune.env.example").read_text())  # where it belongs


@pytest.mark.parametrize("unit", ["autotune-daemon.service", "autotune-worker@.service"])
def test_units_require_the_env_file_and_are_hardened(unit):
    import re

    text = (Path(__file__).resolve().parent.parent / "deploy" / unit).read_text()
    # required: no "-" prefix, so a missing file stops the unit instead of falling back to SQLite
    assert re.findall(r"^EnvironmentFile=(.*)$", text, re.M) == ["/etc/autotune/autotune.env"]
    for line in ("NoNewPrivileges=yes", "PrivateTmp=yes", "ProtectSystem=full", "UMask=0077"):
        assert re.search(rf"^{line}$", text, re.M), f"{unit}: {line}"


def test_cron_runs_nothing_without_the_env_file(tmp_path):
    import re
    import subprocess

    cron = (Path(__file__).resolve().parent.parent / "deploy" / "autotune.cron").read_text()
    jobs = [ln.split(None, 6)[6] for ln in cron.splitlines()
            if ln and not ln.startswith("#") and not re.match(r"[A-Z_]+=", ln)]
    assert len(jobs) == 2
    for job in jobs:
        env_file = tmp_path / "autotune.env"
        cmd = (job.replace("/etc/autotune/autotune.env", str(env_file))
               .replace("/opt/autotune/.venv/bin/autotune", "echo RAN; echo")
               .replace("/var/log/autotune/", f"{tmp_path}/"))
        r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
        assert r.returncode == 2 and "RAN" not in r.stdout and "autotune.env is missing" in r.stderr
        env_file.write_text("AUTOTUNE__STORAGE=sqlite:////var/lib/autotune/autotune.db\n")
        r = subprocess.run(["bash", "-c", cmd], capture_output=True, text=True)
        assert r.returncode == 0 and "RAN" in r.stdout + "".join(p.read_text() for p in tmp_path.glob("*.log"))
        env_file.unlink()


@pytest.mark.parametrize("url,secret", [
    ("postgresql+psycopg://autotune:s3cret-pw@db-host:port/autotune", "s3cret-pw"),  # SQLAlchemy cannot parse it
    ("postgresql://autotune:p@ss-w0rd@db-host/autotune", "ss-w0rd"),  # an unescaped @: SQLAlchemy keeps half
    ("postgresql://autotune:pa/ss-w0rd@db-host/autotune", "ss-w0rd"),
    ("autotune:s3cret-pw@db-host", "s3cret-pw"),
    ("host=db-host user=autotune password=s3cret-pw", "s3cret-pw"),
])
def test_every_url_is_masked_in_the_exporter_label_and_log(url, secret, caplog):
    assert secret not in _store.safe_url(url) and "***" in _store.safe_url(url)
    caplog.set_level(logging.DEBUG)
    srv, _ = _exporter.serve([url], port=0)
    try:
        metrics = httpx.get(f"http://127.0.0.1:{srv.server_port}/metrics").text
    finally:
        srv.shutdown()
    assert f'autotune_store_up{{storage="{_store.safe_url(url)}"}} 0.0' in metrics
    assert secret not in metrics
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "exporter cannot read" in logged and secret not in logged
