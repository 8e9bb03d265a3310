"""The `vllm serve` lifecycle: start on a free loopback port, wait for /health, stop for good.

Server starts are the expensive unit of a study, and a leaked server keeps the GPU (or here both
CPU cores) busy for every trial after it. So the server runs in its own process group, every
stop kills that whole group (SIGTERM, then SIGKILL) and waits until the port is free again, and
a failed start reports vLLM's own error line instead of a timeout.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from autotune.core._files import PRIVATE, open_new, private_dir
from autotune.engines import _affinity, _recovery, _serverlog

log = logging.getLogger(__name__)

_ERROR_PATTERNS = (
    re.compile(r"(\w+Error|\w+Exception): (.+)"),
    re.compile(r"\bERROR\b.*?\] (.+)"),
)
# vLLM V1 ends a failed engine-core start with generic wrapper lines after the real cause (the
# engine core's, and since 0.32 the worker process's).
_NOISE = ("Traceback", "raise ", "File \"", "^^^^", "See root cause above", "See stack trace for root cause",
          "EngineCore failed to start.", "WorkerProc failed to start.")
# "(APIServer pid=42) " and "ERROR 05-01 12:00:00 [core.py:708] ", which vLLM puts before each line
_LINE_PREFIX = re.compile(r"^\s*(?:\([^)]*pid=\d+\)\s*)?(?:[A-Z]+ \d\d-\d\d [\d:.]+ \[[^\]]*\]\s?)?")


class ServerStartError(RuntimeError):
    """vLLM did not come up; ``reason`` is vLLM's own error line when one was found."""

    def __init__(self, reason: str, log_path: Path | None, returncode: int | None = None):
        super().__init__(reason)
        self.reason = reason
        self.log_path = log_path
        self.returncode = returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_is_free(port: int) -> bool:
    """Whether a server could listen on the port now (TIME_WAIT connections do not count)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def serve_args_to_argv(args: dict[str, Any]) -> list[str]:
    """``{"max_model_len": 512, "enforce_eager": True, "enable_prefix_caching": False}`` ->
    ``--max-model-len 512 --enforce-eager --no-enable-prefix-caching``; dicts become JSON."""
    argv: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            argv.append(flag)
        elif value is False:
            argv.append("--no-" + key.replace("_", "-"))
        elif value is None:
            continue
        elif isinstance(value, (dict, list)):
            argv += [flag, json.dumps(value)]
        else:
            argv += [flag, str(value)]
    return argv


def build_argv(command: list[str], model: str, serve_args: dict[str, Any],
               speculative_config: dict | None, port: int, served_model_name: str | None = None) -> list[str]:
    """The exact argv of one trial's server. The recommendation records the speculative part."""
    argv = [*command, model, "--host", "127.0.0.1", "--port", str(port)]
    if served_model_name:
        argv += ["--served-model-name", served_model_name]
    argv += serve_args_to_argv(serve_args)
    if speculative_config:
        argv += ["--speculative-config", json.dumps(speculative_config, sort_keys=True)]
    return argv


def error_line(log_text: str) -> str | None:
    """vLLM's own reason for a failed start: the last exception line of its log."""
    found = None
    lines = [ln[:_serverlog.LINE_CAP] for ln in log_text.splitlines()]
    for i, line in enumerate(lines):
        if any(n in line for n in _NOISE):
            continue
        if _LINE_PREFIX.sub("", line).lstrip().startswith(("Value error, ", "For further information")):
            continue  # a pydantic error's detail lines, already read with its first line
        if "validation error" in line and "ValidationError" in line:
            rest = [_LINE_PREFIX.sub("", ln).strip() for ln in lines[i + 1:i + 4]]
            detail = next((ln.removeprefix("Value error, ") for ln in rest
                           if ln and not ln.startswith("For further")), "")
            found = f"{line[line.index('ValidationError'):].strip()}: {detail.split(' [type=')[0]}"
            continue
        for pat in _ERROR_PATTERNS:
            m = pat.search(line)
            if m and pat is _ERROR_PATTERNS[1] and m.group(1).startswith(" "):
                break  # an indented traceback line that vLLM logged at ERROR: code, not a reason
            if m:
                found = m.group(0).strip() if pat is _ERROR_PATTERNS[0] else m.group(1).strip()
                break
    return found


HEALTH_POLL_S = 0.1
"""How often a starting server's /health is asked: the start's time is measured to the first 200,
so a coarse poll adds half its interval to every start (0.25 s at 0.5 s; a refused connection
costs the starting server nothing)."""

COMPILE_CACHE_MODES = ("per-config", "shared")


def check_compile_cache(mode: str) -> str:
    """``AUTOTUNE__VLLM_COMPILE_CACHE``'s value, or the error that names the setting."""
    if mode not in COMPILE_CACHE_MODES:
        raise ValueError(f"AUTOTUNE__VLLM_COMPILE_CACHE: {mode!r}; use {' or '.join(COMPILE_CACHE_MODES)}")
    return mode


def compile_cache_env(config: dict | None, env: dict, home: Path, mode: str = "per-config") -> dict:
    """vLLM's compile cache for one configuration: ``VLLM_CACHE_ROOT`` of its own per
    speculative config (``mode`` "per-config", ``AUTOTUNE__VLLM_COMPILE_CACHE``), under the
    spec's ``VLLM_CACHE_ROOT`` if it sets one, else under autotune's home.

    vLLM 0.25 keys its AOT-compiled functions by a hash that leaves ``num_speculative_tokens``
    out, and the GPU n-gram proposer's kernel bakes K in: a study that started ngram_gpu at K=8
    first then loaded K=8's kernel for every other K (K=9 and 10 accepted nothing past position
    8; with the cache off, K=10 accepted at 9 and 10). A cache per configuration keeps what a
    repeated start of the same configuration may reuse and nothing else. "shared": vLLM's own
    default, one cache for every start (faster first starts, the risk above)."""
    if check_compile_cache(mode) == "shared":
        return {}
    key = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16] if config else "none"
    parent = Path(env["VLLM_CACHE_ROOT"]) if env.get("VLLM_CACHE_ROOT") else Path(home).absolute() / "vllm-cache"
    return {"VLLM_CACHE_ROOT": str(parent / key)}


@dataclass
class VllmServer:
    """One `vllm serve` process group. Use as a context manager; always stopped on exit."""

    argv: list[str]
    port: int
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    start_timeout_s: float = 600.0
    stop_timeout_s: float = 30.0
    proc: subprocess.Popen | None = None
    start_seconds: float | None = None
    launched_at: float | None = None
    """epoch seconds at the spawn: the server log's timestamps are wall-clock (``_startup``)."""
    pid_dir: Path | None = None
    """Where to leave a pidfile while the server runs, so a restart can kill it if we die (_recovery)."""
    pidfile: Path | None = None
    name: str = "vllm serve"
    """the server in messages (``llama-server`` for llama.cpp: the class runs any engine's server)."""
    error_line: Callable[[str], str | None] | None = None
    """the engine's reader of its own error line in a failed start's log (default: vLLM's)."""
    cpus: frozenset[int] | None = None
    """the CPUs the server and its workers run on (``AUTOTUNE__SERVER_CPUS``; None: wherever the OS puts them)."""
    preloaded: Any = None
    """a ``_preload.Preloaded`` that becomes this server instead of a new process (``engine.preload``)"""
    preloaded_start: bool = False
    """whether the running server is a preloaded process (a dead preloader falls back to a plain start)"""

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "VllmServer":
        private_dir(self.log_path.parent)  # server logs may hold prompt text
        pre, self.preloaded = self.preloaded, None
        token = pre.token if pre is not None else uuid.uuid4().hex
        env = {**os.environ, **self.env, _recovery.TOKEN_ENV: token}
        t0 = time.monotonic()
        self.launched_at = time.time()
        with open_new(self.log_path, PRIVATE) as fh:
            fh.write(("$ " + " ".join(self.argv) + "\n").encode())
            fh.flush()
            if pre is not None:
                try:
                    self.proc = pre.hand_over(self.argv, env, self.log_path)
                except OSError as e:  # it died since it said ready: start the plain way
                    log.warning("preloaded %s gone (%s): starting it the plain way", self.name, e)
                    pre.close()
                    pre = None
            try:
                if self.proc is None:
                    self.proc = subprocess.Popen(self.argv, stdout=fh, stderr=subprocess.STDOUT, env=env,
                                                 stdin=subprocess.DEVNULL, start_new_session=True,
                                                 preexec_fn=_affinity.pinner(self.cpus))
            except OSError as e:
                raise ServerStartError(f"cannot run {self.argv[0]!r}: {e.strerror}", self.log_path) from None
        self.preloaded_start = pre is not None
        log.info("%s started (pid %s, port %s%s), log %s", self.name, self.proc.pid, self.port,
                 ", preloaded" if pre is not None else "", self.log_path)
        try:
            if self.pid_dir is not None:
                self.pidfile = _recovery.write_pidfile(self.pid_dir, self.proc.pid, self.port, token, self.argv,
                                                       self.log_path)
            self._wait_healthy(t0)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - t0
        return self

    def _wait_healthy(self, t0: float) -> None:
        import httpx

        deadline = t0 + self.start_timeout_s
        with httpx.Client(trust_env=False, timeout=5.0) as client:
            while True:
                rc = self.proc.poll()
                if rc is not None:
                    text = _serverlog.tail(self.log_path)
                    reason = (self.error_line or error_line)(text) or f"{self.name} exited with status {rc} (see log)"
                    raise ServerStartError(reason, self.log_path, rc)
                try:
                    if client.get(f"{self.base_url}/health").status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                if time.monotonic() > deadline:
                    raise ServerStartError(f"no /health within {self.start_timeout_s:.0f}s", self.log_path)
                time.sleep(HEALTH_POLL_S)

    def stop(self) -> None:
        """Kill the whole process group and wait until the port is free. Idempotent."""
        if self.proc is None:
            return
        pgid = self.proc.pid
        for sig, wait in ((signal.SIGTERM, self.stop_timeout_s), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                break
            try:
                self.proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
            if not _group_alive(pgid):
                break
            deadline = time.monotonic() + wait
            while _group_alive(pgid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if not _group_alive(pgid):
                break
        deadline = time.monotonic() + 15
        while not port_is_free(self.port) and time.monotonic() < deadline:
            time.sleep(0.2)
        if not port_is_free(self.port):
            log.warning("port %s still busy after stopping %s", self.port, self.name)
        if self.pidfile is not None and not _group_alive(pgid):
            self.pidfile.unlink(missing_ok=True)
            self.pidfile = None
        self.proc = None

    def death(self, grace_s: float = 0.0) -> str | None:
        """None while the server runs; else how it ended, with vLLM's own error line if it logged one.

        ``grace_s``: how long to wait for an exit. A client sees its connections reset while the
        kernel is still tearing a killed server down, before ``waitpid`` reports it, so a caller
        asking after a failed replay gives it a moment.
        """
        if self.proc is None:
            return None
        try:
            rc = self.proc.wait(timeout=grace_s) if grace_s > 0 else self.proc.poll()
        except subprocess.TimeoutExpired:
            rc = None
        if rc is None:
            return None
        try:
            how = f"killed by {signal.Signals(-rc).name}" if rc < 0 else f"exit status {rc}"
        except ValueError:
            how = f"exit status {rc}"
        try:
            line = (self.error_line or error_line)(_serverlog.tail(self.log_path))
        except OSError:
            line = None
        return how + (f": {line}" if line else "")

    def __enter__(self) -> "VllmServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
