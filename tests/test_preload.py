"""engine.preload: the next `vllm serve` imported ahead, then handed its argv, environment and log.

These run a stand-in vLLM package (a ``vllm.entrypoints.cli.main`` that serves /health and writes
down what it was given), so the hand-over's plumbing is checked in a second; that a preloaded real
vLLM serves the same outputs is test_study_vllm's code study, which runs with preload on.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest

from autotune.engines import _preload, _recovery
from autotune.engines._engine import VllmServer, free_port

FAKE_MAIN = '''
import json, os, sys, http.server
IMPORTED_PID = os.getpid()
if os.environ.get("FAKE_VLLM_BREAK"):
    raise ImportError("no module named torch (stand-in)")

def main():
    port = int(sys.argv[sys.argv.index("--port") + 1])
    out = os.environ["FAKE_VLLM_OUT"]
    with open(out, "w") as fh:
        json.dump({"argv": sys.argv, "pid": os.getpid(), "imported_pid": IMPORTED_PID, "cwd": os.getcwd(),
                   "env": {k: os.environ.get(k) for k in ("VLLM_CACHE_ROOT", "SPEC_ENV", "AUTOTUNE_SERVER_TOKEN",
                                                          "STALE")}}, fh)
    print("INFO 12-07 10:00:00 [api_server.py:1] non-default args: stand-in", flush=True)
    print("to stderr", file=sys.stderr, flush=True)

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200); self.end_headers()
        def log_message(self, *a):
            pass
    http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
'''


@pytest.fixture
def fake_vllm(tmp_path, monkeypatch):
    """A `vllm` console script on PATH whose package is the stand-in; returns (script, out file)."""
    pkg = tmp_path / "site" / "vllm" / "entrypoints" / "cli"
    pkg.mkdir(parents=True)
    for d in (pkg.parent.parent, pkg.parent, pkg):
        (d / "__init__.py").write_text("")
    (pkg / "main.py").write_text(FAKE_MAIN)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    script = bindir / "vllm"
    script.write_text(f"#!{sys.executable}\nimport sys\nfrom vllm.entrypoints.cli.main import main\n"
                      "if __name__ == '__main__':\n    sys.exit(main())\n")
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "site"))
    out = tmp_path / "given.json"
    monkeypatch.setenv("FAKE_VLLM_OUT", str(out))
    pool = _preload.Pool()
    yield script, out, pool
    pool.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _gone(pid: int, within_s: float = 20.0) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_interpreter_is_the_console_scripts_python(fake_vllm, tmp_path):
    script, _, _ = fake_vllm
    env = dict(os.environ)
    assert _preload.interpreter("vllm", env) == (sys.executable, str(script))
    via_env = tmp_path / "bin" / "vllm-env"
    via_env.write_text("#!/usr/bin/env python3\nfrom vllm.entrypoints.cli.main import main\n")
    via_env.chmod(0o755)
    python, found = _preload.interpreter("vllm-env", env)
    assert os.path.basename(python).startswith("python3") and found == str(via_env)
    shell = tmp_path / "bin" / "vllm-sh"
    shell.write_text("#!/bin/sh\nexec python -m vllm.entrypoints.cli.main \"$@\"\n")
    shell.chmod(0o755)
    other = tmp_path / "bin" / "llama-server"
    other.write_text(f"#!{sys.executable}\nprint('not vllm')\n")
    other.chmod(0o755)
    # a shell wrapper, another engine, nothing at all: started the plain way
    assert _preload.interpreter("vllm-sh", env) is None
    assert _preload.interpreter("llama-server", env) is None
    assert _preload.interpreter("no-such-vllm", env) is None


def test_a_preloaded_process_becomes_the_server_with_the_starts_own_argv_env_and_log(fake_vllm, tmp_path):
    script, out, pool = fake_vllm
    shared = {**os.environ, "SPEC_ENV": "from-spec", "STALE": "x"}
    pre = pool.prime("vllm", shared)
    assert pre is not None and pool.prime("vllm", shared) is pre  # one waiting, kept while it fits
    pool.idle(timeout_s=60)
    assert pre.state == "ready"
    port = free_port()
    env = {"SPEC_ENV": "from-spec", "VLLM_CACHE_ROOT": str(tmp_path / "cache-k4")}
    taken = pool.take("vllm", {**shared, **env})
    assert taken is pre and pool.waiting is None
    server = VllmServer(argv=["vllm", "serve", "m", "--port", str(port)], port=port, log_path=tmp_path / "s.log",
                        env=env, start_timeout_s=60, preloaded=taken)
    with server:
        assert server.proc.pid == pre.proc.pid and server.preloaded_start
        given = json.loads(out.read_text())
    # the API process is the one that imported: nothing ran twice
    assert given["pid"] == given["imported_pid"] == pre.proc.pid
    assert given["argv"] == [str(script), "serve", "m", "--port", str(port)]
    assert given["env"]["VLLM_CACHE_ROOT"] == env["VLLM_CACHE_ROOT"]  # the start's own, set at the hand-over
    assert given["env"]["SPEC_ENV"] == "from-spec"
    assert given["env"]["AUTOTUNE_SERVER_TOKEN"] == pre.token  # what recovery finds in /proc/<pid>/environ
    assert f"{_recovery.TOKEN_ENV}={pre.token}".encode() in Path(f"/proc/{pre.proc.pid}/environ").read_bytes() \
        if _alive(pre.proc.pid) else True
    assert given["cwd"] == os.getcwd()
    log = (tmp_path / "s.log").read_text()
    assert log.startswith("$ vllm serve m") and "non-default args: stand-in" in log and "to stderr" in log
    assert _gone(pre.proc.pid)  # stopped with its process group


def test_a_start_whose_environment_differs_gets_no_preloaded_process(fake_vllm):
    _, _, pool = fake_vllm
    pre = pool.prime("vllm", {**os.environ, "SPEC_ENV": "a"})
    assert pool.take("vllm", {**os.environ, "SPEC_ENV": "b"}) is None
    assert _gone(pre.proc.pid)  # ended, not left waiting
    pre = pool.prime("vllm", {**os.environ, "SPEC_ENV": "a"}, cpus=None)
    assert pool.take("vllm", {**os.environ, "SPEC_ENV": "a"}, cpus=frozenset({0})) is None  # other CPUs
    assert _gone(pre.proc.pid)


def test_a_preloader_whose_imports_fail_leaves_the_start_to_the_plain_way(fake_vllm, tmp_path, monkeypatch):
    script, out, pool = fake_vllm
    shared = {**os.environ, "FAKE_VLLM_BREAK": "1"}
    pre = pool.prime("vllm", shared)
    pool.idle(timeout_s=60)
    assert pool.waiting is None and pre.state == "failed"
    assert any("no module named torch" in s for s in pre.said)
    pre = pool.prime("vllm", shared)
    assert pool.take("vllm", shared) is None  # failed by the time it is taken
    assert _gone(pre.proc.pid)


def test_an_unused_preloader_ends_when_closed_or_when_its_owner_goes(fake_vllm, tmp_path):
    _, _, pool = fake_vllm
    pre = pool.prime("vllm", dict(os.environ))
    pool.idle(timeout_s=60)
    pool.close()
    assert _gone(pre.proc.pid) and pool.waiting is None
    # its owner killed: end of input, it exits by itself
    import subprocess
    owner = subprocess.Popen([sys.executable, "-c", (
        "import os, sys, time; sys.path.insert(0, %r)\n"
        "from autotune.engines import _preload\n"
        "p = _preload.POOL.prime('vllm', dict(os.environ)); _preload.POOL.idle(60)\n"
        "print(p.proc.pid, flush=True); time.sleep(60)") % str(Path(__file__).resolve().parent.parent)],
        stdout=subprocess.PIPE, text=True)
    pid = int(owner.stdout.readline())
    assert _alive(pid)
    owner.kill()
    owner.wait()
    assert _gone(pid)


def test_a_preloader_dead_before_the_hand_over_is_replaced_by_a_plain_start(fake_vllm, tmp_path):
    script, out, pool = fake_vllm
    pre = pool.prime("vllm", dict(os.environ))
    pool.idle(timeout_s=60)
    taken = pool.take("vllm", dict(os.environ))
    taken.proc.kill()
    taken.proc.wait()
    port = free_port()
    with VllmServer(argv=["vllm", "serve", "m", "--port", str(port)], port=port, log_path=tmp_path / "s.log",
                    start_timeout_s=60, preloaded=taken) as server:
        assert server.proc.pid != pre.proc.pid and not server.preloaded_start
        assert json.loads(out.read_text())["pid"] == server.proc.pid


def test_the_spec_field_is_for_vllm_and_off_unless_asked(tmp_path):
    from autotune.core._spec import load_spec

    from test_spec import VALID, _spec_error, _write

    assert load_spec(_write(tmp_path, VALID)).engine.preload is False
    assert load_spec(_write(tmp_path, VALID + "engine:\n  preload: true\n")).engine.preload is True
    msg = _spec_error(_write(tmp_path, VALID + "engine:\n  kind: llamacpp\n  preload: true\n"))
    assert "preload: true is for vllm" in msg
