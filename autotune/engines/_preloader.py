"""A `vllm serve` process that did its imports before it was asked to serve.

Run as ``<vLLM's python> _preloader.py VLLM_SCRIPT``, with no autotune on its path: it imports
vLLM's CLI and the API server's modules (12 s on a 2-core CPU host, 15-24 s on an H100 host, all
before vLLM logs its first line), says ``ready`` on stdout, and waits. One JSON line on stdin
(``argv``, ``env``, ``log``, ``cwd``) then turns it into that server: the environment replaced,
stdout and stderr appended to the log, stdin from /dev/null, ``sys.argv`` set, and vLLM's own
``main()`` run, in this process, so the caller's handle (pid, process group, exit status) is the
server's. End of input instead of a line: it exits.

Nothing else differs from a plain start: the engine core is still a fresh spawned process with
its own imports, only the API process skipped the wait. It stays standard library only until it
is told to import, because multiprocessing's spawn re-imports this file as ``__mp_main__`` in
every child vLLM starts.
"""

import importlib
import json
import os
import sys

MODULES = (
    "vllm.entrypoints.cli.main",
    "vllm.entrypoints.cli.serve",
    "vllm.entrypoints.openai.api_server",
    "vllm.entrypoints.cli.openai",
    "vllm.entrypoints.cli.benchmark.main",
    "vllm.entrypoints.cli.collect_env",
    "vllm.entrypoints.cli.run_batch",
)
"""What ``vllm serve`` imports before its first log line; the first is required, the others are
best effort (a vLLM without one still starts, only later)."""


def _say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def main() -> int:
    script = sys.argv[1] if len(sys.argv) > 1 else "vllm"
    # as the console script would run: its own folder first on the path, not this file's
    sys.path[0] = os.path.dirname(os.path.abspath(script))
    try:
        cli = importlib.import_module(MODULES[0])
    except BaseException as e:  # noqa: BLE001 - any failure means: start the plain way
        _say(f"error {type(e).__name__}: {e}")
        return 3
    for name in MODULES[1:]:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001
            pass
    _say("ready")
    line = sys.stdin.readline()
    if not line.strip():
        return 0
    go = json.loads(line)
    fd = os.open(go["log"], os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    os.environ.clear()
    os.environ.update(go["env"])
    os.chdir(go["cwd"])
    sys.argv = list(go["argv"])
    sys.argv[0] = script
    return cli.main() or 0


if __name__ == "__main__":
    sys.exit(main())
