"""The `vllm serve` lifecycle, exercised with small fake servers (python scripts), never vLLM."""

from __future__ import annotations

import json
import os
import stat
import sys
import textwrap
import time
from pathlib import Path

import pytest

from autotune.engines._engine import (
    ServerStartError,
    VllmServer,
    build_argv,
    error_line,
    free_port,
    port_is_free,
    serve_args_to_argv,
)

# --------------------------------------------------------------------------- argv


def test_serve_args_to_argv():
    argv = serve_args_to_argv({
        "max_model_len": 512,
        "enforce_eager": True,
        "enable_prefix_caching": False,
        "seed": 0,                      # falsy but not False: a value, not a --no- flag
        "served_model_name": None,      # skipped
        "compilation_config": {"level": 0, "cudagraph_mode": "NONE"},
        "dtype": "float32",
    })
    assert argv == [
        "--max-model-len", "512",
        "--enforce-eager",
        "--no-enable-prefix-caching",
        "--seed", "0",
        "--compilation-config", json.dumps({"level": 0, "cudagraph_mode": "NONE"}),
        "--dtype", "float32",
    ]
    assert json.loads(argv[argv.index("--compilation-config") + 1]) == {"level": 0, "cudagraph_mode": "NONE"}
    assert serve_args_to_argv({}) == []


def test_build_argv_with_speculative_config():
    spec = {"num_speculative_tokens": 3, "method": "ngram", "prompt_lookup_max": 4, "prompt_lookup_min": 2}
    argv = build_argv(["/venv/bin/vllm", "serve"], "/models/target", {"dtype": "float32", "enforce_eager": True},
                      spec, 8123, served_model_name="target")
    assert argv == [
        "/venv/bin/vllm", "serve", "/models/target",
        "--host", "127.0.0.1", "--port", "8123",
        "--served-model-name", "target",
        "--dtype", "float32", "--enforce-eager",
        "--speculative-config",
        '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}',
    ]


def test_build_argv_without_speculation():
    argv = build_argv(["vllm", "serve"], "m", {}, None, 9000)
    assert argv == ["vllm", "serve", "m", "--host", "127.0.0.1", "--port", "9000"]
    assert "--speculative-config" not in build_argv(["vllm", "serve"], "m", {}, {}, 9000)


# --------------------------------------------------------------------------- error_line

PYDANTIC_LOG = textwrap.dedent("""\
    $ /venv/bin/vllm serve /models/target --host 127.0.0.1 --port 41234 --speculative-config {"method": "suffix"}
    INFO 05-01 12:00:00 [__init__.py:241] Automatically detected platform cpu.
    (APIServer pid=4242) INFO 05-01 12:00:02 [api_server.py:1805] vLLM API server version 0.25.1
    (APIServer pid=4242) INFO 05-01 12:00:02 [utils.py:326] non-default args: {'model': '/models/target'}
    (APIServer pid=4242) WARNING 05-01 12:00:03 [cpu.py:120] Environment variable VLLM_CPU_KVCACHE_SPACE not set.
    (APIServer pid=4242) Traceback (most recent call last):
    (APIServer pid=4242)   File "/venv/bin/vllm", line 10, in <module>
    (APIServer pid=4242)     sys.exit(main())
    (APIServer pid=4242)              ^^^^^^
    (APIServer pid=4242)   File "/venv/lib/python3.12/site-packages/vllm/engine/arg_utils.py", line 1090, in create_engine_config
    (APIServer pid=4242)     config = VllmConfig(
    (APIServer pid=4242)              ^^^^^^^^^^^
    (APIServer pid=4242)   File "/venv/lib/python3.12/site-packages/pydantic/_internal/_dataclasses.py", line 123, in __init__
    (APIServer pid=4242)     s.__pydantic_validator__.validate_python(ArgsKwargs(args, kwargs), self_instance=s)
    (APIServer pid=4242) pydantic_core._pydantic_core.ValidationError: 1 validation error for VllmConfig
    (APIServer pid=4242)   Value error, Arctic Inference is required for suffix decoding. Install via `pip install arctic-inference`. [type=value_error, input_value=ArgsKwargs((), {'model_co...}), input_type=ArgsKwargs]
    (APIServer pid=4242)     For further information visit https://errors.pydantic.dev/2.11/v/value_error
    """)

PLAIN_LOG = textwrap.dedent("""\
    $ vllm serve m --port 1
    INFO 05-01 12:00:02 [api_server.py:1805] vLLM API server version 0.25.1
    Traceback (most recent call last):
      File "/venv/lib/python3.12/site-packages/vllm/config/speculative.py", line 301, in __post_init__
        raise ValueError(
    ValueError: num_speculative_tokens must be > 0, got -1
    """)

ENGINE_CORE_LOG = textwrap.dedent("""\
    (EngineCore_DP0 pid=3709) ERROR 05-01 12:00:09 [core.py:708] EngineCore failed to start.
    (EngineCore_DP0 pid=3709) ERROR 05-01 12:00:09 [core.py:708] Traceback (most recent call last):
    (EngineCore_DP0 pid=3709) ERROR 05-01 12:00:09 [core.py:708]   File "/venv/vllm/v1/engine/core.py", line 699, in run_engine_core
    (EngineCore_DP0 pid=3709) ERROR 05-01 12:00:09 [core.py:708] ValueError: No available memory for the cache blocks. Try increasing `VLLM_CPU_KVCACHE_SPACE`.
    (EngineCore_DP0 pid=3709) Process EngineCore_DP0:
    (EngineCore_DP0 pid=3709) Traceback (most recent call last):
    (EngineCore_DP0 pid=3709) ValueError: No available memory for the cache blocks. Try increasing `VLLM_CPU_KVCACHE_SPACE`.
    (APIServer pid=3653) Traceback (most recent call last):
    (APIServer pid=3653)   File "/venv/vllm/v1/engine/utils.py", line 782, in wait_for_engine_startup
    (APIServer pid=3653)     raise RuntimeError("Engine core initialization failed. "
    (APIServer pid=3653) RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
    """)


@pytest.mark.parametrize("prefix", ["(APIServer pid=4242) ", "", "(EngineCore_DP0 pid=7) ERROR 05-01 12:00:09 [core.py:708] "])
def test_error_line_pydantic_validation_error(prefix):
    log = PYDANTIC_LOG.replace("(APIServer pid=4242) ", prefix)
    assert error_line(log) == (
        "ValidationError: 1 validation error for VllmConfig: Arctic Inference is required for suffix decoding. "
        "Install via `pip install arctic-inference`.")


def test_error_line_plain_value_error():
    assert error_line(PLAIN_LOG) == "ValueError: num_speculative_tokens must be > 0, got -1"


def test_error_line_engine_core_failure_reports_root_cause_not_wrapper():
    assert error_line(ENGINE_CORE_LOG) == (
        "ValueError: No available memory for the cache blocks. Try increasing `VLLM_CPU_KVCACHE_SPACE`.")


WORKER_LOG = textwrap.dedent("""\
    (Worker pid=18494) ERROR 12-04 14:03:04 [multiproc_executor.py:953] WorkerProc failed to start.
    (Worker pid=18494) ERROR 12-04 14:03:04 [multiproc_executor.py:953] Traceback (most recent call last):
    (Worker pid=18494) ERROR 12-04 14:03:04 [multiproc_executor.py:953] RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; no pinned memory allocator is available on this system.
    (EngineCore pid=18473) ERROR 12-04 14:03:06 [core.py:1510] EngineCore failed to start.
    (EngineCore pid=18473) ERROR 12-04 14:03:06 [core.py:1510]     self.workers = WorkerProc.wait_for_ready(unready_workers)
    (EngineCore pid=18473) ERROR 12-04 14:03:06 [core.py:1510] Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.
    Exception: WorkerProc initialization failed due to an exception in a background process. See stack trace for root cause.
        raise RuntimeError(
    RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}
    """)


def test_error_line_worker_failure_reports_root_cause_not_wrappers():
    """vllm-cpu 0.32 starting ngram_gpu: the worker's error, under the wrapper lines and a traceback line logged at ERROR."""
    assert error_line(WORKER_LOG) == ("RuntimeError: pin_memory=True requires a CUDA or other accelerator backend; "
                                      "no pinned memory allocator is available on this system.")


def test_error_line_logged_error_without_exception():
    log = "INFO 05-01 [x.py:1] starting\nERROR 05-01 12:00:00 [launcher.py:80] address already in use\n"
    assert error_line(log) == "address already in use"


def test_error_line_none_for_clean_log():
    assert error_line("INFO 05-01 [api_server.py:1] Starting vLLM API server\nWARNING something slow\n") is None
    assert error_line("") is None


# --------------------------------------------------------------------------- VllmServer with fake servers


def _script(tmp_path: Path, name: str, body: str) -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(body))
    return p


def _server(tmp_path: Path, script: Path, **kw) -> VllmServer:
    port = free_port()
    argv = build_argv([sys.executable, str(script)], "fake-model", {}, None, port)
    return VllmServer(argv=argv, port=port, log_path=tmp_path / "logs" / "server.log", **kw)


def test_start_failure_reports_the_servers_error_line(tmp_path):
    script = _script(tmp_path, "fails.py", """\
        import sys
        print("INFO starting fake vllm", flush=True)
        print("ValueError: bad config for speculative decoding", flush=True)
        sys.exit(1)
    """)
    server = _server(tmp_path, script, start_timeout_s=20)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as ei:
        server.start()
    assert time.monotonic() - t0 < server.start_timeout_s / 2  # reported on exit, not after the start timeout
    e = ei.value
    assert "bad config" in e.reason and e.reason == str(e)
    assert e.returncode == 1
    assert e.log_path == server.log_path and e.log_path.exists()
    text = e.log_path.read_text()
    assert text.startswith("$ " + sys.executable)  # the argv heads the log
    assert "ValueError: bad config" in text
    assert server.proc is None  # stopped


def test_start_failure_without_error_line_reports_status(tmp_path):
    script = _script(tmp_path, "quiet.py", "import sys\nsys.exit(7)\n")
    with pytest.raises(ServerStartError) as ei:
        _server(tmp_path, script, start_timeout_s=20).start()
    assert ei.value.returncode == 7
    assert "status 7" in ei.value.reason


def test_start_times_out_without_health(tmp_path):
    script = _script(tmp_path, "hangs.py", "import time\nprint('loading', flush=True)\ntime.sleep(600)\n")
    server = _server(tmp_path, script, start_timeout_s=2, stop_timeout_s=5)
    t0 = time.monotonic()
    with pytest.raises(ServerStartError) as ei:
        server.start()
    elapsed = time.monotonic() - t0
    assert 2 <= elapsed < 60  # gave up at the timeout, not after the script's 600 s
    assert "no /health within 2s" in ei.value.reason
    assert ei.value.log_path.exists()
    assert server.proc is None


HEALTHY = """\
    import http.server, os, subprocess, sys, time

    port = int(sys.argv[sys.argv.index("--port") + 1])
    pidfile = __file__ + ".child"

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", port), H)
    # a worker that ignores SIGTERM and holds the listening socket too, like an engine-core process
    child = subprocess.Popen([sys.executable, "-c",
        "import os, signal, sys, time\\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\\n"
        "open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid()))\\n"
        "os.replace(sys.argv[1] + '.tmp', sys.argv[1])\\n"
        "time.sleep(600)\\n", pidfile], pass_fds=(srv.fileno(),))
    while not os.path.exists(pidfile):
        time.sleep(0.02)
    srv.serve_forever()
"""


def test_stop_kills_the_whole_process_group_and_frees_the_port(tmp_path):
    script = _script(tmp_path, "healthy.py", HEALTHY)
    server = _server(tmp_path, script, start_timeout_s=20, stop_timeout_s=1)
    with server:
        assert server.start_seconds is not None and server.start_seconds < 20
        pgid = server.proc.pid
        child = int(Path(str(script) + ".child").read_text())
        assert child != pgid
        assert os.getpgid(child) == pgid  # same group, own session
        assert os.getpgid(pgid) == pgid != os.getpgid(0)
        assert not port_is_free(server.port)
        import httpx

        assert httpx.get(f"{server.base_url}/health", trust_env=False).status_code == 200
    assert server.proc is None
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)
    assert port_is_free(server.port)
    server.stop()  # idempotent


def test_nonexistent_executable(tmp_path):
    missing = tmp_path / "no-such-vllm"
    port = free_port()
    server = VllmServer(argv=build_argv([str(missing), "serve"], "m", {}, None, port), port=port,
                        log_path=tmp_path / "server.log", start_timeout_s=5)
    with pytest.raises(ServerStartError) as ei:
        server.start()
    assert str(missing) in ei.value.reason
    assert "No such file" in ei.value.reason
    assert server.proc is None


def test_stop_before_start_is_a_no_op(tmp_path):
    VllmServer(argv=["true"], port=free_port(), log_path=tmp_path / "x.log").stop()



# --------------------------------------------------------------------------- probe cache
def _fake_vllm(site: Path, version: str) -> None:
    """A vllm package and its distribution metadata, as `pip install vllm==VERSION` leaves them."""
    import shutil

    for old in site.glob("vllm-*.dist-info"):
        shutil.rmtree(old)
    (site / "vllm" / "config").mkdir(parents=True, exist_ok=True)
    (site / "vllm" / "__init__.py").write_text(
        "import importlib.metadata, os\n__version__ = importlib.metadata.version('vllm')\n"
        "open(os.environ['PROBE_COUNT'], 'a').write('x')\n")
    (site / "vllm" / "config" / "__init__.py").write_text("")
    fields = '    method: str = "ngram"\n    num_speculative_tokens: int = 1\n'
    if version >= "0.2":
        fields += "    enable_adaptive_verification: bool = False\n"
    (site / "vllm" / "config" / "speculative.py").write_text(
        "import dataclasses, typing\nSpeculativeMethod = typing.Literal['ngram']\n"
        f"@dataclasses.dataclass\nclass SpeculativeConfig:\n{fields}")
    dist = site / f"vllm-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")


def test_probe_cache_notices_a_vllm_upgrade(tmp_path):
    from autotune.engines._probe import probe

    site, cache, count = tmp_path / "site", tmp_path / "cache", tmp_path / "imports"
    site.mkdir()
    env = {"PYTHONPATH": str(site), "PROBE_COUNT": str(count)}
    _fake_vllm(site, "0.1.0")
    first = probe(sys.executable, env, cache_dir=cache)
    again = probe(sys.executable, env, cache_dir=cache)
    assert first.version == again.version == "0.1.0"
    assert count.read_text() == "x"  # the second answer came from the cache: vLLM imported once
    interpreter_mtime = os.stat(sys.executable).st_mtime
    _fake_vllm(site, "0.2.0")  # `pip install -U vllm`: the interpreter is untouched
    assert os.stat(sys.executable).st_mtime == interpreter_mtime
    upgraded = probe(sys.executable, env, cache_dir=cache)
    assert upgraded.version == "0.2.0" and "enable_adaptive_verification" in upgraded.fields
    assert count.read_text() == "xx"
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in cache.glob("probe-*.json"))


def test_probe_without_distribution_metadata_is_not_cached(tmp_path):
    from autotune.engines._probe import probe

    fake = tmp_path / "python"  # a probe that answers but has no importlib.metadata view of vLLM
    fake.write_text("#!/bin/sh\necho 'AUTOTUNE_PROBE {\"version\": \"9.9\", \"methods\": [], \"fields\": [], "
                    "\"arctic_inference\": false}'\n")
    fake.chmod(0o755)
    assert probe(str(fake), {}, cache_dir=tmp_path / "cache").version == "9.9"
    assert list(tmp_path.glob("cache/probe-*.json")) == []
