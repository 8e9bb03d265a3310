"""A non-editable install is what it claims: the wheel ships the schema migrations and the
report queries, and `autotune db migrate` / `autotune db report` / `autotune --help` work from a
fresh venv that has only the wheel (its dependencies come from this environment, so nothing is
downloaded), run outside the source tree."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _run(cmd, **kw):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, **kw)
    assert out.returncode == 0, f"{cmd}: {out.returncode}\n{out.stdout}\n{out.stderr}"
    return out


def test_the_wheel_installs_into_a_fresh_venv_and_migrates(tmp_path):
    src = tmp_path / "src"  # build from a copy: the build leaves nothing in the source tree
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "autotune", src / "autotune", ignore=shutil.ignore_patterns("__pycache__"))
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", str(tmp_path / "dist"), str(src)])
    (wheel,) = (tmp_path / "dist").glob("autotune-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    migrations = sorted((ROOT / "autotune" / "core" / "sql" / "migrations").glob("*.sql"))
    reports = sorted((ROOT / "autotune" / "core" / "sql" / "reports").glob("*.sql"))
    assert migrations and reports
    for p in migrations + reports:
        assert f"autotune/core/sql/{p.parent.name}/{p.name}" in names

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    py = venv / "bin" / "python"
    site = Path(_run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    # the dependencies (and pip) of this environment, after the venv's own site-packages
    (site / "_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _run([str(py), "-m", "pip", "install", "--no-deps", "--no-index", "-q", str(wheel)])

    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTOTUNE") and k != "PYTHONPATH"}
    work = tmp_path / "elsewhere"
    work.mkdir()
    where = _run([str(py), "-c", "import autotune, autotune.core._store as s; print(autotune.__file__); "
                  "print(s.SQL_DIR)"], cwd=work, env=env).stdout.split()
    assert all(Path(p).is_relative_to(site) for p in where), where  # the installed copy, not the source tree
    exe = venv / "bin" / "autotune"
    assert "Usage:" in _run([str(exe), "--help"], cwd=work, env=env).stdout
    db = tmp_path / "a.db"
    out = _run([str(exe), "db", "migrate", "--storage", f"sqlite:///{db}"], cwd=work, env=env).stdout
    assert out.strip() == f"sqlite:///{db}: applied " + ", ".join(str(int(p.name[:4])) for p in migrations)
    tables = {r[0] for r in sqlite3.connect(db).execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"autotune_runs", "autotune_recommendations", "autotune_claims"} <= tables
    out = _run([str(exe), "db", "report", "runs", "--storage", f"sqlite:///{db}"], cwd=work, env=env).stdout
    assert out.strip() == "(no rows)"


def test_requires_python_covers_what_the_code_uses():
    """The replay client uses asyncio.timeout (3.11+): a declared 3.10 would install and then fail
    every request."""
    import re
    import tomllib

    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    m = re.fullmatch(r">=\s*3\.(\d+)", declared.strip())
    assert m, declared
    uses_311 = [str(p.relative_to(ROOT)) for p in (ROOT / "autotune").rglob("*.py")
                if re.search(r"asyncio\.timeout\(|asyncio\.TaskGroup|\bexcept\*|\btomllib\b", p.read_text())]
    assert not uses_311 or int(m.group(1)) >= 11, f"requires-python {declared}, but {uses_311} need 3.11"
    assert sys.version_info >= (3, int(m.group(1)))  # this interpreter is a supported one
