"""An install is what it claims. The wheel ships every package and the repository's top-level
`sql/` (the schema migrations and the report queries, installed as `autotune._sql`), and
`autotune db migrate` / `autotune db report` / `autotune --help` work from a fresh venv that has
only the wheel (its dependencies come from this environment, so nothing is downloaded), run
outside the source tree. An editable install (how the dev venv and CI install autotune) finds the
same `sql/` through the package mapping."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import tomllib
import zipfile
from pathlib import Path

from autotune.core import _store

ROOT = Path(__file__).resolve().parent.parent
SQL_FILES = sorted(p.relative_to(ROOT / "sql").as_posix() for p in (ROOT / "sql").rglob("*.sql"))


def _run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert out.returncode == 0, f"{cmd}: {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


def _venv(path: Path) -> tuple[Path, Path]:
    """A fresh venv whose own site-packages comes first, then this environment's (the dependencies
    and pip). Returns (python, its site-packages)."""
    _run([sys.executable, "-m", "venv", "--without-pip", str(path)])
    py = path / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (site / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return py, site


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE") and k != "PYTHONPATH"}


def test_the_top_level_is_the_documented_layout():
    top = {p.name for p in ROOT.iterdir()}
    assert {"pyproject.toml", "autotune", "studies", "sql", "tests", "README.md", "Makefile"} <= top
    assert (ROOT / "sql" / "README.md").is_file()  # how to run a report query by hand


def test_the_sql_lives_once_at_the_top_level():
    assert {"migrations/0001_initial.sql", "reports/runs.sql"} <= set(SQL_FILES)
    assert not [str(p) for p in (ROOT / "autotune").rglob("*.sql")]  # no second copy inside the package
    assert _store.SQL_DIR == ROOT / "sql"  # a source checkout reads its own sql/
    assert [m.path.parent for m in _store.migrations()][0] == ROOT / "sql" / "migrations"


def test_pyproject_lists_every_package_and_maps_sql():
    """The packages are listed by name (the sql/ mapping rules out discovery): a new package
    directory that is not listed would be missing from the wheel."""
    conf = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "autotune").rglob("__init__.py")}
    assert set(conf["packages"]) == on_disk | {"autotune._sql"}
    assert conf["package-dir"] == {"autotune._sql": "sql"}
    assert set(conf["package-data"]["autotune._sql"]) == {"migrations/*.sql", "reports/*.sql"}


def test_the_wheel_installs_into_a_fresh_venv_and_migrates(tmp_path):
    src = tmp_path / "src"  # build from a copy: the build leaves nothing in the source tree
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    for name in ("autotune", "sql"):
        shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", str(tmp_path / "dist"), str(src)])
    (wheel,) = (tmp_path / "dist").glob("autotune-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"autotune/_sql/{f}" for f in SQL_FILES} <= names
    modules = {p.relative_to(ROOT).as_posix() for p in (ROOT / "autotune").rglob("*.py")}
    assert modules <= names, sorted(modules - names)

    py, site = _venv(tmp_path / "venv")
    _run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)])

    env = _clean_env()
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _run([str(py), "-c", "import autotune, autotune.core._store as s; print(autotune.__file__); "
                  "print(s.SQL_DIR)"], cwd=work, env=env).stdout.split()
    assert all(Path(p).is_relative_to(site) for p in where), where  # the installed copy, not the source tree
    assert Path(where[1]) == site / "autotune" / "_sql"
    exe = py.parent / "autotune"
    assert "Usage:" in _run([str(exe), "--help"], cwd=work, env=env).stdout
    db = tmp_path / "a.db"
    url = f"sqlite:///{db}"
    out = _run([str(exe), "db", "migrate", "--storage", url], cwd=work, env=env).stdout
    migrations = [f for f in SQL_FILES if f.startswith("migrations/")]
    assert out.strip() == f"{url}: applied " + ", ".join(str(int(Path(f).name[:4])) for f in migrations)
    tables = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"autotune_runs", "autotune_recommendations", "autotune_claims"} <= tables
    assert _run([str(exe), "db", "migrate", "--storage", url], cwd=work, env=env).stdout.strip() == f"{url}: up to date"

    _run([str(py), "-c", "import sys; from autotune.core._store import Store; s = Store(sys.argv[1]); "
          "s.finish_run(s.start_run('code', 'manual', '0'), 'ok', 0, decision='change', trials=7)", url],
         cwd=work, env=env)
    lines = _run([str(exe), "db", "report", "runs", "--storage", url], cwd=work, env=env).stdout.splitlines()
    assert lines[0].split()[:3] == ["workload", "kind", "host"], lines
    (row,) = lines[1:]
    assert row.split()[:2] == ["code", "manual"] and " ok " in row and " change " in row, row


def test_an_editable_install_finds_the_sql_through_the_package_mapping(tmp_path):
    py, site = _venv(tmp_path / "venv")
    _run([str(py), "-m", "pip", "install", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-e", str(ROOT)])
    work = tmp_path / "elsewhere"
    work.mkdir()
    out = _run([str(py), "-c", "import importlib.resources, autotune, autotune.core._store as s; "
                "print(autotune.__file__); print(importlib.resources.files('autotune._sql')); print(s.SQL_DIR)"],
               cwd=work, env=_clean_env()).stdout.split()
    assert out == [str(ROOT / "autotune" / "__init__.py"), str(ROOT / "sql"), str(ROOT / "sql")]


def test_requires_python_covers_what_the_code_uses():
    """The replay client uses asyncio.timeout (3.11+): a declared 3.10 would install and then fail
    every request."""
    import re

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    m = re.fullmatch(r">=\s*3\.(\d+)", declared.strip())
    assert m, declared
    uses_311 = [str(p.relative_to(ROOT)) for p in (ROOT / "autotune").rglob("*.py")
                if re.search(r"asyncio\.timeout\(|asyncio\.TaskGroup|\bexcept\*|\btomllib\b", p.read_text())]
    assert not uses_311 or int(m.group(1)) >= 11, f"requires-python {declared}, but {uses_311} need 3.11"
    assert sys.version_info >= (3, int(m.group(1)))  # this interpreter is a supported one
