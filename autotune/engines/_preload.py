"""The next `vllm serve` imported while the current one starts (``engine.preload``).

Before `vllm serve` logs anything its API process imports torch, vLLM and the OpenAI server: 12 s
on a 2-core CPU host, 15-24 s of every start on an H100 host, on a night's repeated starts a third
of the time to a healthy server. None of it depends on the configuration. So while one server
starts, a second Python process (``_preloader.py``) does those imports and then waits, idle;
the next start hands it its argv, environment and log instead of running a new process.

What the server measures is unchanged by construction: the API process runs vLLM's own
``main()`` with the same argv and environment, and the engine core is still a fresh spawned
process. The one thing that could differ, the preloaded process importing while a server is
measured, is kept out: a measurement waits until the preloader is idle (``idle``) and one that
is still importing then is killed. A preloader is only ever used by a start whose environment
matches the one it imported under, except for the keys a configuration sets itself
(``PER_START``), read after the hand-over.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import select
import shlex
import shutil
import subprocess
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from autotune.engines import _affinity, _recovery

log = logging.getLogger(__name__)

SCRIPT = Path(__file__).with_name("_preloader.py")
PER_START = frozenset({"VLLM_CACHE_ROOT", _recovery.TOKEN_ENV})
"""environment keys a start may set differently from the preloader's (the per-configuration
compile cache is read by the engine core, spawned after the hand-over; the token is the
preloader's own)"""
IDLE_TIMEOUT_S = 120.0
"""how long a measurement waits for a preloader to finish its imports before killing it"""


def interpreter(argv0: str, env: dict[str, str]) -> tuple[str, str] | None:
    """(python, script) where ``argv0`` is vLLM's console script (``from
    vllm.entrypoints.cli.main import main``) run by a Python found here; else None (another engine,
    a container command, a shell wrapper: those start the plain way)."""
    script = shutil.which(argv0, path=env.get("PATH"))
    if script is None:
        return None
    try:
        with open(script, "rb") as fh:
            head = fh.read(4096).decode("utf-8", "replace")
    except OSError:
        return None
    if not head.startswith("#!") or "vllm.entrypoints.cli.main" not in head:
        return None
    words = shlex.split(head[2:].splitlines()[0])
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
        python = shutil.which(words[0], path=env.get("PATH")) if words else None
    else:
        python = words[0] if words else None
    if not python or "python" not in os.path.basename(python):
        return None
    return python, os.path.abspath(script)


@dataclass
class Preloaded:
    """One preloader process: importing, then idle until ``hand_over``."""

    proc: subprocess.Popen
    key: tuple
    token: str
    env: dict[str, str]
    state: str = "importing"
    """importing, ready, failed (imports broke: start plain), used"""
    said: list[str] = field(default_factory=list)

    def poll_ready(self, timeout_s: float = 0.0) -> str:
        """Read what it said within ``timeout_s``; its state after."""
        deadline = time.monotonic() + timeout_s
        while self.state == "importing":
            left = max(0.0, deadline - time.monotonic())
            r, _, _ = select.select([self.proc.stdout], [], [], left)
            if not r:
                break
            line = self.proc.stdout.readline().decode("utf-8", "replace").strip()
            if not line:  # it exited
                self.state = "failed"
                self.said.append(f"exited with status {self.proc.wait()}")
            elif line == "ready":
                self.state = "ready"
            else:
                self.said.append(line)
                if line.startswith("error"):
                    self.state = "failed"
        if self.state != "failed" and self.proc.poll() is not None:
            self.state = "failed"
        return self.state

    def hand_over(self, argv: list[str], env: dict[str, str], log_path: Path) -> subprocess.Popen:
        """Make it the server: its Popen is the server's from here on."""
        line = json.dumps({"argv": argv, "env": env, "log": str(log_path), "cwd": os.getcwd()}) + "\n"
        self.proc.stdin.write(line.encode())
        self.proc.stdin.close()
        self.proc.stdout.close()
        self.state = "used"
        return self.proc

    def close(self) -> None:
        """End an unused preloader (end of input; killed if it does not go)."""
        if self.state == "used" or self.proc.stdin.closed:
            return
        try:
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            _recovery.kill_group(self.proc.pid, grace_s=2.0)
            self.proc.wait()
        if self.proc.stdout and not self.proc.stdout.closed:
            self.proc.stdout.close()


def _key(python: str, script: str, env: dict[str, str], cpus) -> tuple:
    shared = tuple(sorted((k, v) for k, v in env.items() if k not in PER_START))
    return python, script, shared, tuple(sorted(cpus or ()))


class Pool:
    """At most one preloader, for the next start of the study running in this process."""

    def __init__(self) -> None:
        self.waiting: Preloaded | None = None

    def prime(self, argv0: str, env: dict[str, str], cpus=None) -> Preloaded | None:
        """Start a preloader for a later start whose environment (without ``PER_START``) is
        ``env`` (``os.environ`` and the spec's ``engine.env``). None where ``argv0`` is not vLLM's
        console script; one already waiting with the same key is kept."""
        found = interpreter(argv0, env)
        if found is None:
            return None
        key = _key(*found, env, cpus)
        if self.waiting is not None:
            if self.waiting.key == key and self.waiting.state in ("importing", "ready"):
                return self.waiting
            self.close()
        token = uuid.uuid4().hex
        penv = {**env, _recovery.TOKEN_ENV: token}
        proc = subprocess.Popen([found[0], str(SCRIPT), found[1]], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL, env=penv, start_new_session=True,
                                preexec_fn=_affinity.pinner(cpus))
        self.waiting = Preloaded(proc, key, token, penv)
        log.info("preloading the next vllm serve (pid %s)", proc.pid)
        return self.waiting

    def take(self, argv0: str, env: dict[str, str], cpus=None) -> Preloaded | None:
        """The waiting preloader if it fits a start with ``env`` (its full environment), removed
        from the pool, once it is ready (one still importing is waited for: a plain start would
        import as long); else None, and a misfit is ended."""
        pre, self.waiting = self.waiting, None
        if pre is None:
            return None
        found = interpreter(argv0, env)
        if found is None or pre.key != _key(*found, env, cpus) or pre.poll_ready(IDLE_TIMEOUT_S) != "ready":
            if pre.state == "failed":
                log.warning("preloader failed (%s): this start runs the plain way", "; ".join(pre.said[-3:]))
            pre.close()
            return None
        return pre

    def idle(self, timeout_s: float = IDLE_TIMEOUT_S) -> None:
        """Wait until the waiting preloader has finished importing, so it takes no CPU while a
        server is measured; one still importing after ``timeout_s`` is ended."""
        pre = self.waiting
        if pre is None:
            return
        state = pre.poll_ready(timeout_s)
        if state == "failed":
            log.warning("preloader failed (%s): the next start runs the plain way", "; ".join(pre.said[-3:]))
            self.close()
        elif state != "ready":
            log.warning("preloader still importing after %.0f s: ended before the measurement", timeout_s)
            self.close()

    def close(self) -> None:
        pre, self.waiting = self.waiting, None
        if pre is not None:
            pre.close()


POOL = Pool()
"""the process's pool: a study runs its starts one at a time"""
atexit.register(POOL.close)
