"""Code-editing traffic from real source: the Python standard library that ships with the
interpreter, written as a gateway log.

Each request hands the model one real function (10-40 lines, its docstring removed) and asks
for one small edit with the whole function back: rename a local variable, add a docstring,
change a constant. That is what an editor's assistant sends, and the answer copies most of the
prompt, so n-gram drafting has something real to find (unlike the tiny models, whose acceptance
is designed). Requests are chat messages (the model's chat template applies), greedy, with a
short ``max_tokens`` so a 135M model on two CPU cores answers in seconds.

The log is gateway-shaped JSONL (timestamp, workload tag, request body, usage), so the demo
turns it into a replay set through ``autotune traffic import`` and ``sample`` like a user's
logs. Everything is derived from the stdlib files in a fixed order with a seeded generator: the
same interpreter and seed give the same log, byte for byte.
"""

from __future__ import annotations

import ast
import functools
import gzip
import importlib.util
import io
import json
import random
import textwrap
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from autotune.core import _files

# Pure-Python stdlib modules with many short functions; a module missing from an interpreter
# is skipped (the generator fails only when too few functions are left).
MODULES = ("textwrap", "shlex", "fnmatch", "difflib", "calendar", "heapq", "bisect", "statistics",
           "string", "glob", "posixpath", "ntpath", "base64", "quopri", "csv", "gettext", "tokenize",
           "argparse", "configparser", "json.decoder", "json.encoder", "email.utils", "urllib.parse",
           "http.cookies", "pprint", "reprlib", "fractions", "colorsys", "locale", "mimetypes",
           "netrc", "platform", "shutil", "tarfile", "zipfile", "smtplib", "ftplib", "imaplib",
           "dataclasses", "inspect", "ipaddress", "optparse", "pathlib", "random", "sysconfig")
MIN_LINES, MAX_LINES, MAX_CHARS = 10, 40, 1400
EDITS = ("rename", "docstring", "constant")
SYSTEM = "You are a coding assistant. Reply with the complete edited function in one Python code block."
LOG_MODEL = "smollm2-135m-instruct"
T0 = datetime(2026, 11, 30, 8, 0, tzinfo=UTC)


class TrafficGenError(ValueError):
    pass


@dataclass(frozen=True)
class Function:
    module: str
    name: str
    source: str  # dedented, docstring removed
    locals: tuple[str, ...]  # assigned local names and arguments, in order of first use
    constants: tuple[int, ...]  # integer literals, in source order

    @property
    def key(self) -> str:
        return f"{self.module}.{self.name}"


def _module_file(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    origin = getattr(spec, "origin", None) if spec else None
    return Path(origin) if origin and origin.endswith(".py") else None


def _strip_docstring(node: ast.FunctionDef, lines: list[str]) -> list[str]:
    """The function's lines without its docstring (when it stands on lines of its own)."""
    body = node.body
    first = node.lineno - 1
    seg = lines[first:node.end_lineno]
    if (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str) and len(body) > 1):
        d = body[0]
        seg = lines[first:d.lineno - 1] + lines[d.end_lineno:node.end_lineno]
    return seg


def _names(node: ast.FunctionDef) -> tuple[str, ...]:
    seen: list[str] = []
    args = node.args
    for a in args.posonlyargs + args.args + args.kwonlyargs:
        if a.arg not in ("self", "cls") and a.arg not in seen:
            seen.append(a.arg)
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id not in seen and len(n.id) > 1:
            seen.append(n.id)
    return tuple(seen)


def _constants(node: ast.FunctionDef) -> tuple[int, ...]:
    return tuple(n.value for n in ast.walk(node) if isinstance(n, ast.Constant)
                 and type(n.value) is int and n.value not in (0, 1, -1))


def functions_in(module: str, path: Path) -> list[Function]:
    """Top-level functions and methods of one source file that fit a short prompt."""
    text = path.read_text(encoding="utf-8")
    lines = text.splitlines()
    out = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.FunctionDef) or node.decorator_list:
            continue
        seg = _strip_docstring(node, lines)
        src = textwrap.dedent("\n".join(seg)).rstrip() + "\n"
        n_lines = src.count("\n")
        if not (MIN_LINES <= n_lines <= MAX_LINES and len(src) <= MAX_CHARS) or "\t" in src:
            continue
        out.append(Function(module, node.name, src, _names(node), _constants(node)))
    return out


@functools.lru_cache(maxsize=4)
def collect(modules: tuple[str, ...] = MODULES) -> tuple[Function, ...]:
    """Every usable function of ``modules``, in a fixed order (module list order, then source order)."""
    out: list[Function] = []
    for m in modules:
        path = _module_file(m)
        if path is not None:
            out.extend(functions_in(m, path))
    return tuple(out)


def _new_name(old: str, taken: set[str], rng: random.Random) -> str:
    for cand in (f"{old}_value", f"new_{old}", f"{old}2", f"the_{old}"):
        if cand not in taken:
            return cand
    return f"{old}_{rng.randrange(10, 99)}"


def edit_request(fn: Function, kind: str, rng: random.Random) -> str | None:
    """The user message asking for one edit of ``fn``, or None when that edit does not apply."""
    code = f"```python\n{fn.source}```"
    if kind == "rename":
        if not fn.locals:
            return None
        old = rng.choice(fn.locals)
        new = _new_name(old, set(fn.locals), rng)
        return f"Rename `{old}` to `{new}` in this function. Output the whole function.\n\n{code}"
    if kind == "docstring":
        return f"Add a docstring to `{fn.name}`. Output the whole function.\n\n{code}"
    if kind == "constant":
        if not fn.constants:
            return None
        old = rng.choice(fn.constants)
        return f"Change the constant `{old}` to `{old * 2}` in this function. Output the whole function.\n\n{code}"
    raise TrafficGenError(f"unknown edit {kind!r}; one of {', '.join(EDITS)}")


def requests(n: int, seed: int = 0, max_tokens: int = 96) -> list[dict]:
    """``n`` distinct chat request bodies (greedy), each a real function and one edit."""
    if n < 1:
        raise TrafficGenError(f"n must be at least 1, not {n}")
    pool = collect()
    if len(pool) < n:
        raise TrafficGenError(f"only {len(pool)} stdlib functions of {MIN_LINES}-{MAX_LINES} lines found "
                              f"in {len(MODULES)} modules; {n} requests need as many")
    rng = random.Random(f"code-traffic-{seed}")
    order = list(range(len(pool)))
    rng.shuffle(order)
    out: list[dict] = []
    for i in order:
        # the edits in turn, so each is about a third of the traffic; the next one when it does not apply
        j = len(out) % len(EDITS)
        kinds = EDITS[j:] + EDITS[:j]
        text = next((t for t in (edit_request(pool[i], k, rng) for k in kinds) if t), None)
        if text is None:
            continue
        out.append({"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}],
                    "max_tokens": max_tokens, "temperature": 0})
        if len(out) == n:
            return out
    raise TrafficGenError(f"only {len(out)} of the {n} requests could be made from {len(pool)} functions")


def log_lines(workload: str, bodies: list[dict], spacing_s: float = 37.0) -> list[str]:
    """Request bodies as gateway log lines: a timestamp ``spacing_s`` apart from a fixed start,
    the workload tag, the body under ``request.body``, the response status."""
    out = []
    for i, body in enumerate(bodies):
        ts = (T0 + timedelta(seconds=i * spacing_s)).isoformat().replace("+00:00", "Z")
        out.append(json.dumps({
            "timestamp": ts, "workload": workload, "request_id": f"{workload}-{i:05d}",
            "request": {"method": "POST", "url": "/v1/chat/completions", "body": {"model": LOG_MODEL, **body}},
            "response": {"status_code": 200}}, sort_keys=True))
    return out


def gateway_lines(workload: str, n: int, seed: int = 0, max_tokens: int = 96,
                  spacing_s: float = 37.0) -> list[str]:
    """The code-editing requests as gateway log lines (``log_lines``)."""
    return log_lines(workload, requests(n, seed, max_tokens), spacing_s)


def write_log(path: str | Path, workload: str, n: int, seed: int = 0, max_tokens: int = 96) -> Path:
    """Write the code-editing gateway log (``write_lines``)."""
    return write_lines(path, gateway_lines(workload, n, seed, max_tokens))


def write_lines(path: str | Path, lines: list[str]) -> Path:
    """Write gateway log lines, gzip without a timestamp in its header (same input, same bytes);
    an identical file is left alone."""
    path = Path(path)
    data = ("\n".join(lines) + "\n").encode()
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0, filename="") as gz:
        gz.write(data)
    blob = buf.getvalue()
    if path.is_file() and path.read_bytes() == blob:
        return path
    return _files.write_bytes(path, blob, _files.PRIVATE)  # prompt text, as a user's gateway log
