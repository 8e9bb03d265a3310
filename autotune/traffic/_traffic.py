"""Importing production request logs into per-workload traffic pools.

``autotune traffic import PATHS...`` reads JSONL logs (plain or gzip, detected by magic bytes;
paths may be globs, ``**`` included, or directories) in the registered formats:

``openai``
    OpenAI-compatible request logs as gateways and proxies write them: one JSON object per line
    holding the request body (``messages`` -> chat, ``prompt`` -> completions) at the top level or
    under ``request.body``, ``request``, ``body``, ``request_body``, ``payload`` (an embedded JSON
    string is decoded), e.g. OpenAI batch lines (``custom_id``, ``url``, ``body``); when the line
    itself is the body, only OpenAI and vLLM request fields are kept (``REQUEST_FIELDS``). Optional: a timestamp
    (``timestamp``, ``ts``, ``time``, ``created_at``, ``start_time``, ``startTime``, ``@timestamp``
    ...; ISO 8601 or epoch s/ms/us/ns), the model, a workload tag (see ``_workloads``), ``usage``
    (``prompt_tokens`` is kept for length estimates), a status (requests that failed in production,
    status >= 400 or an ``error``, are skipped) and a URL (non-completions endpoints are skipped).
``bench``
    vLLM bench custom JSONL: ``{"prompt": str, "output_tokens": int}``. Becomes a chat request
    with one user message (``vllm bench`` applies the chat template) and ``max_tokens``; it carries
    no sampling parameters, so the server's defaults apply.
``mooncake``
    Traces with only timestamps and lengths (``timestamp`` in ms from the trace start,
    ``input_length``, ``output_length``, ``hash_ids``). They hold no prompt text: they are skipped
    unless ``--synthesize`` is given; then they replay synthetic prompts of the given length
    (blocks of 512 words generated from ``hash_ids``, so shared prefixes stay shared) with
    ``max_tokens = output_length``, ``ignore_eos`` and temperature 0, and are flagged
    ``acceptance_measurable: false``: speculative acceptance on made-up text says nothing about
    production.

``--format auto`` (default) picks a format per line: ``mooncake`` if it has ``input_length`` and
``output_length`` and no prompt, ``bench`` if it has ``prompt`` and ``output_tokens`` (or only
``prompt``), else ``openai``. New formats register with ``@register_format(name, detect=...)``.

A line that cannot be used is counted as malformed (not JSON, not UTF-8, no request body, bad
timestamp, ...) and reported as ``file:line: reason``; lines deliberately left out (production
failures, trace rows without ``--synthesize``) are counted as skipped with their reason. Reasons
never quote the line, so reports and logs hold no prompt text. The import fails only when no line
at all is usable.

Pools: ``<home>/traffic/<workload>.jsonl`` (0600, in a 0700 folder, rewritten atomically under a
lock), one request per line: ``id``, ``endpoint``, ``body``, ``tag``, ``ts`` as in a replay set
(``body`` is the request as logged minus ``model``, ``stream`` and ``stream_options``, which the
replay client sets), plus ``src`` (``file:line``), ``format``, ``how`` (how the workload was
chosen), the logged ``model`` and ``prompt_tokens`` when known, and for synthetic rows
``synthetic`` (the trace lengths) and ``acceptance_measurable: false``. Ids are content hashes, so
importing the same log twice adds nothing. ``<workload>.meta.json`` beside it lists the imported
sources.
"""

from __future__ import annotations

import contextlib
import glob as _glob
import gzip
import hashlib
import json
import logging
import os
import random
import re
import zlib
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from autotune.core._files import PRIVATE, AtomicFile, commit_together, private_dir, write_json
from autotune.core._inputs import input_lines, open_input, read_input, read_lines
from autotune.core._lock import open_lock_file
from autotune.core._names import check_workload, child
from autotune.traffic._workloads import Classifier, explicit_tag, prompt_text

log = logging.getLogger("autotune.traffic")

REPLAY_OWNED = ("model", "stream", "stream_options")
REDACTED = "[REDACTED]"
SYNTHETIC_BLOCK = 512
MAX_REPORTED_MALFORMED = 10


class TrafficError(ValueError):
    """Nothing usable was imported, or an input is unusable as a whole."""


class PoolWriteError(OSError):
    """A pool could not be written (read-only home, full disk): the pools are as they were."""


class Malformed(Exception):
    """The line is not a usable request; ``str()`` is the reason (never the line's content)."""


class Skip(Exception):
    """The line is well-formed but deliberately not imported; ``str()`` is the reason."""


@dataclass
class Record:
    endpoint: str
    body: dict
    ts: float | None = None
    tag: str | None = None
    model: str | None = None
    prompt_tokens: int | None = None
    synthetic: dict | None = None


@dataclass(frozen=True)
class ImportOptions:
    synthesize: bool = False
    trace_start: float = 0.0
    """Epoch seconds added to Mooncake's relative timestamps."""


@dataclass(frozen=True)
class Format:
    name: str
    detect: Callable[[dict], bool]
    parse: Callable[[dict, ImportOptions], Record]
    priority: int


FORMATS: dict[str, Format] = {}


def register_format(name: str, *, detect: Callable[[dict], bool], priority: int = 100):
    """Register a log format: ``parse(obj, options) -> Record`` raising Malformed or Skip.
    Auto-detection tries formats by ascending ``priority``; the first whose ``detect`` is true wins."""

    def deco(parse: Callable[[dict, ImportOptions], Record]):
        FORMATS[name] = Format(name, detect, parse, priority)
        return parse

    return deco


def detect_format(obj: dict) -> Format:
    for f in sorted(FORMATS.values(), key=lambda f: f.priority):
        if f.detect(obj):
            return f
    raise Malformed("no known log format matches")


# --- field helpers ------------------------------------------------------------------------------

TS_FIELDS = ("timestamp", "ts", "time", "created_at", "createdAt", "start_time", "startTime",
             "request_time", "requested_at", "received_at", "@timestamp", "date")


def parse_ts(value: Any) -> float:
    """Epoch seconds from an ISO 8601 string (naive = UTC) or an epoch number in s, ms, us or ns."""
    if isinstance(value, bool):
        raise ValueError("boolean")
    if isinstance(value, str):
        s = value.strip()
        try:
            value = float(s)
        except ValueError:
            dt = datetime.fromisoformat(s[:-1] + "+00:00" if s.endswith(("Z", "z")) else s)
            if dt.tzinfo is None:
                dt = dt.replace(tzinfo=timezone.utc)
            return dt.timestamp()
    if isinstance(value, (int, float)):
        v = float(value)
        if v != v or v in (float("inf"), float("-inf")) or v < 0:
            raise ValueError("not a finite non-negative number")
        if v >= 1e17:
            return v / 1e9
        if v >= 1e14:
            return v / 1e6
        if v >= 1e11:
            return v / 1e3
        return v
    raise ValueError(f"{type(value).__name__}")


def _ts_of(*objects: Any) -> float | None:
    for obj in objects:
        if not isinstance(obj, dict):
            continue
        for k in TS_FIELDS:
            v = obj.get(k)
            if v in (None, ""):
                continue
            try:
                ts = parse_ts(v)
            except (ValueError, OverflowError):
                raise Malformed(f"unparseable timestamp in field '{k}'") from None
            if isinstance(v, (int, float)) and ts < 1e9:
                continue  # a small number (a duration?) is no wall-clock time: try the next field
            return ts
    return None


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def _decode_json_str(v: Any) -> Any:
    if isinstance(v, str) and v.lstrip().startswith("{"):
        try:
            return json.loads(v)
        except json.JSONDecodeError:
            return v
    return v


def clean_body(body: dict) -> dict:
    """The body as logged minus the fields the replay client sets."""
    return {k: v for k, v in body.items() if k not in REPLAY_OWNED}


def _check_prompt(endpoint: str, body: dict) -> None:
    if endpoint == "chat":
        msgs = body.get("messages")
        if not isinstance(msgs, list) or not msgs:
            raise Malformed("'messages' must be a non-empty list")
        for i, m in enumerate(msgs):
            if not isinstance(m, dict) or not isinstance(m.get("role"), str):
                raise Malformed(f"messages[{i}] has no 'role'")
        return
    p = body.get("prompt")
    if isinstance(p, str):
        if not p:
            raise Malformed("empty 'prompt'")
        return
    if isinstance(p, list) and p:
        if all(_int(x) is not None for x in p):
            return  # token ids
        if len(p) == 1 and (isinstance(p[0], str) and p[0] or
                            isinstance(p[0], list) and p[0] and all(_int(x) is not None for x in p[0])):
            return
        raise Malformed(f"batched completions prompt ({len(p)} prompts) is not supported")
    raise Malformed("'prompt' must be a string or token ids")


# --- formats ------------------------------------------------------------------------------------

_BODY_PATHS = (("request", "body"), ("request",), ("body",), ("request_body",), ("payload",), ())
_URL_FIELDS = ("url", "path", "endpoint", "request_path", "route")


def _url_of(obj: dict) -> str | None:
    for o in (obj, obj.get("request") if isinstance(obj.get("request"), dict) else None):
        if not o:
            continue
        for k in _URL_FIELDS:
            if isinstance(o.get(k), str) and "/" in o[k]:
                return o[k]
    return None


def _failed(obj: dict, resp: dict) -> str | None:
    """Why the request failed in production (HTTP status >= 400, a failure status, an error), or None."""
    for o in (obj, resp):
        for k in ("status", "status_code", "statusCode", "http_status"):
            v = o.get(k)
            if isinstance(v, str) and v.strip().isdigit():
                v = int(v)
            if _int(v) is not None and v >= 400:
                return f"status {v}"
            if isinstance(v, str) and v.strip().lower() in ("failure", "failed", "error"):
                return f"status {v.strip().lower()}"
        if o.get("error"):
            return "error logged"
    return None


def _detect_openai(obj: dict) -> bool:
    return True  # the catch-all: parse() says what is missing


@register_format("openai", detect=_detect_openai, priority=100)
def parse_openai(obj: dict, options: ImportOptions) -> Record:
    body, where = None, None
    for path in _BODY_PATHS:
        cand: Any = obj
        for k in path:
            cand = _decode_json_str(cand.get(k)) if isinstance(cand, dict) else None
        if isinstance(cand, dict) and ("messages" in cand or "prompt" in cand):
            body, where = cand, path
            break
    if body is None:
        raise Malformed("no request body with 'messages' or 'prompt'")
    url = _url_of(obj)
    if url is not None:
        u = url.split("?", 1)[0].rstrip("/")
        if u.endswith("chat/completions"):
            endpoint = "chat"
        elif u.endswith("completions"):
            endpoint = "completions"
        else:
            raise Skip(f"unsupported endpoint {u.rsplit('/', 1)[-1]!r}")
        if (endpoint == "chat") != ("messages" in body):
            raise Malformed(f"URL says {endpoint} but the body has {'messages' if 'messages' in body else 'prompt'}")
    else:
        endpoint = "chat" if "messages" in body else "completions"
    _check_prompt(endpoint, body)
    resp = _decode_json_str(obj.get("response"))
    resp = resp if isinstance(resp, dict) else {}
    failed = _failed(obj, resp)
    if failed:
        raise Skip(f"failed in production ({failed})")
    req = obj.get("request") if isinstance(obj.get("request"), dict) else {}
    ts = _ts_of(obj, req, body if where != () else None)
    if ts is None and _int(resp.get("created")) is not None:
        ts = float(resp["created"])
    model = next((m for m in (body.get("model"), obj.get("model"), resp.get("model")) if isinstance(m, str)), None)
    usage = next((u for u in (resp.get("usage"), obj.get("usage"),
                              (resp.get("body") or {}).get("usage") if isinstance(resp.get("body"), dict) else None)
                  if isinstance(u, dict)), {})
    tag = explicit_tag(obj, body)
    body = clean_body(body)
    if where == ():  # the log record is the body: leave out the log's own fields
        body = {k: v for k, v in body.items() if k in REQUEST_FIELDS}
    return Record(endpoint=endpoint, body=body, ts=ts, tag=tag, model=model,
                  prompt_tokens=_int(usage.get("prompt_tokens")))


# When the log record itself is the request body, log fields (timestamps, tags, usage, headers...)
# cannot be told from request fields by position: keep only the request fields of the OpenAI API
# and vLLM's extra sampling and chat parameters (not ``metadata``/``store``: at the top level of a
# log line those are usually the gateway's own).
REQUEST_FIELDS = frozenset("""
    messages prompt model frequency_penalty logit_bias logprobs top_logprobs max_tokens
    max_completion_tokens n presence_penalty response_format seed stop stream stream_options
    temperature top_p tools tool_choice parallel_tool_calls user reasoning_effort
    modalities prediction audio service_tier function_call functions best_of suffix echo
    web_search_options top_k min_p repetition_penalty length_penalty stop_token_ids
    include_stop_str_in_output ignore_eos min_tokens skip_special_tokens
    spaces_between_special_tokens truncate_prompt_tokens prompt_logprobs allowed_token_ids
    bad_words add_generation_prompt continue_final_message add_special_tokens documents
    chat_template chat_template_kwargs mm_processor_kwargs guided_json guided_regex guided_choice
    guided_grammar guided_decoding_backend guided_whitespace_pattern structural_tag
    structured_outputs priority use_beam_search return_tokens_as_token_ids return_token_ids
    cache_salt vllm_xargs thinking
""".split())


def _detect_bench(obj: dict) -> bool:
    return "prompt" in obj and ("output_tokens" in obj or set(obj) == {"prompt"})


@register_format("bench", detect=_detect_bench, priority=20)
def parse_bench(obj: dict, options: ImportOptions) -> Record:
    prompt = obj.get("prompt")
    if not isinstance(prompt, str) or not prompt:
        raise Malformed("'prompt' must be a non-empty string")
    out = obj.get("output_tokens")
    if isinstance(out, float) and out.is_integer():
        out = int(out)
    if "output_tokens" not in obj:
        raise Malformed("missing 'output_tokens'")
    if _int(out) is None or out < 1:
        raise Malformed("'output_tokens' must be a positive integer")
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": out}
    return Record(endpoint="chat", body=body, ts=_ts_of(obj), tag=explicit_tag(obj))


def _detect_mooncake(obj: dict) -> bool:
    return "input_length" in obj and "output_length" in obj and "prompt" not in obj and "messages" not in obj


@register_format("mooncake", detect=_detect_mooncake, priority=10)
def parse_mooncake(obj: dict, options: ImportOptions) -> Record:
    n_in, n_out = _int(obj.get("input_length")), _int(obj.get("output_length"))
    if n_in is None or n_in < 1:
        raise Malformed("'input_length' must be a positive integer")
    if n_out is None or n_out < 1:
        raise Malformed("'output_length' must be a positive integer")
    hash_ids = obj.get("hash_ids", [])
    if not isinstance(hash_ids, list) or not all(_int(h) is not None for h in hash_ids):
        raise Malformed("'hash_ids' must be a list of integers")
    t = obj.get("timestamp")
    if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or t < 0):
        raise Malformed("'timestamp' must be milliseconds since the trace start")
    if not options.synthesize:
        raise Skip("trace row has no prompt text (pass --synthesize for synthetic prompts; "
                   "acceptance is not measurable on them)")
    ts = options.trace_start + (t or 0) / 1000.0
    body = {"max_tokens": n_out, "ignore_eos": True, "temperature": 0}
    return Record(endpoint="completions", body=body, ts=ts, tag=explicit_tag(obj), prompt_tokens=n_in,
                  synthetic={"input_length": n_in, "output_length": n_out, "hash_ids": hash_ids,
                             "block_size": SYNTHETIC_BLOCK})


_VOCAB = ("the of and to in is was for on that with as by at from it his an were are which this be "
          "has had or not but their one its new after who they first have two been other all also "
          "time into more than some only over would when there can most about year between may such "
          "these city many under world during three known made where both through then while well "
          "school part used people later each state being including since team same music four "
          "number several around against early high before name second family show group life work "
          "history series area until game place home water small large left became north south east "
          "west river book light house paper market table window garden story system problem answer "
          "question letter summer winter morning evening country village forest island bridge road "
          "station music color number point line field court power energy value reason moment").split()


def synthetic_prompt(synthetic: dict) -> str:
    """Deterministic text of about ``input_length`` tokens (one common word each): block ``i`` is
    generated from ``hash_ids[i]``, so trace rows that share leading hash ids share a prefix."""
    n = synthetic["input_length"]
    block = synthetic.get("block_size", SYNTHETIC_BLOCK)
    words: list[str] = []
    for h in synthetic.get("hash_ids") or []:
        if len(words) >= n:
            break
        rng = random.Random(f"autotune-synthetic-block-{h}")
        words += [rng.choice(_VOCAB) for _ in range(block)]
    if len(words) < n:
        rng = random.Random(f"autotune-synthetic-tail-{n}-{synthetic.get('hash_ids')}")
        words += [rng.choice(_VOCAB) for _ in range(n - len(words))]
    return " ".join(words[:n])


# --- reading files ------------------------------------------------------------------------------

def expand_paths(patterns: Iterable[str]) -> tuple[list[Path], list[str]]:
    """Files named by paths, globs (``**`` recursive) and directories (their files), in order,
    without repeats; and the patterns that matched nothing."""
    files: list[Path] = []
    missing: list[str] = []
    seen: set[Path] = set()
    for pat in patterns:
        p = Path(os.path.expanduser(pat))
        if p.is_dir():
            found = sorted(x for x in p.iterdir() if x.is_file() and not x.name.startswith("."))
        elif p.is_file() or p.exists():  # a FIFO or a device named as such: refused when opened
            found = [p]
        elif _glob.has_magic(pat):
            found = sorted(Path(x) for x in _glob.glob(os.path.expanduser(pat), recursive=True) if os.path.isfile(x))
        else:
            found = []
        if not found:
            missing.append(pat)
        for f in found:
            key = f.resolve()
            if key not in seen:
                seen.add(key)
                files.append(f)
    return files, missing


def _open(path: Path):
    fh = open_input(path, "traffic log")
    magic = fh.read(2)
    fh.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=fh, mode="rb")
    return fh


def iter_lines(path: Path) -> Iterator[tuple[int, str | None, str | None]]:
    """``(line number, text, error)`` for every non-blank line; a truncated or corrupt gzip stream
    ends the file with one error line instead of failing the import. A file that is no regular
    file, or a line longer than ``LINE_LIMIT`` decompressed, is an InputError (exit 2): read in
    bounded chunks, so a compression bomb costs at most one line's cap of memory."""
    i = 0
    try:
        with _open(path) as fh:
            try:
                for i, raw in read_lines(fh, path):
                    if not raw.strip():
                        continue
                    try:
                        text = raw.decode("utf-8")
                    except UnicodeDecodeError as e:
                        yield i, None, f"not UTF-8 (byte {e.start + 1})"
                        continue
                    yield i, text, None
            except (EOFError, gzip.BadGzipFile, zlib.error) as e:
                yield i + 1, None, f"unreadable compressed data ({type(e).__name__}); rest of file skipped"
    except OSError as e:  # reading only: a write error of the caller's never lands here
        yield i + 1, None, f"cannot read ({e.strerror or e})"


# --- redaction ----------------------------------------------------------------------------------

class Redactor:
    """Replaces every match of the patterns with ``[REDACTED]`` in prompt text (a completions
    prompt, message contents and their text parts); counts replacements, never logs text."""

    def __init__(self, patterns: Iterable[str] = ()):
        self.patterns = []
        for p in dict.fromkeys(patterns):
            try:
                self.patterns.append(re.compile(p))
            except re.error as e:
                raise TrafficError(f"invalid --redact regex {p!r}: {e}") from None
        self.replaced = 0

    def __bool__(self) -> bool:
        return bool(self.patterns)

    def text(self, s: str) -> str:
        for p in self.patterns:
            s, k = p.subn(REDACTED, s)
            self.replaced += k
        return s

    def body(self, endpoint: str, body: dict) -> dict:
        if not self.patterns:
            return body
        body = dict(body)
        if endpoint == "completions":
            p = body.get("prompt")
            if isinstance(p, str):
                body["prompt"] = self.text(p)
            elif isinstance(p, list):
                body["prompt"] = [self.text(x) if isinstance(x, str) else x for x in p]
            return body
        msgs = []
        for m in body.get("messages") or []:
            if isinstance(m, dict):
                m = dict(m)
                c = m.get("content")
                if isinstance(c, str):
                    m["content"] = self.text(c)
                elif isinstance(c, list):
                    m["content"] = [dict(part, text=self.text(part["text"]))
                                    if isinstance(part, dict) and isinstance(part.get("text"), str) else part
                                    for part in c]
            msgs.append(m)
        body["messages"] = msgs
        return body


# --- pools --------------------------------------------------------------------------------------

def traffic_dir(home: str | Path) -> Path:
    return Path(home) / "traffic"


def pool_path(home: str | Path, workload: str) -> Path:
    return child(traffic_dir(home), f"{check_workload(workload)}.jsonl")


def meta_path(pool: Path) -> Path:
    return pool.with_name(pool.name.removesuffix(".jsonl") + ".meta.json")


def write_json_private(path: Path, data: Any) -> Path:
    """Pool metadata and manifests: ``_files.write_json`` at 0600 (atomic, fsynced)."""
    return write_json(path, data, PRIVATE, sort_keys=True)


def ensure_private_dir(d: Path) -> Path:
    return private_dir(d)


@contextlib.contextmanager
def pool_lock(home: str | Path, shared: bool = False):
    """Serializes imports (exclusive) against each other and against sampling (shared)."""
    d = ensure_private_dir(traffic_dir(home))
    fd = open_lock_file(d / ".lock", private=False)  # never through a symlink planted there
    try:
        try:
            import fcntl

            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        except ImportError:  # pragma: no cover - not POSIX
            pass
        yield
    finally:
        os.close(fd)


def request_id(endpoint: str, body: dict, ts: float | None, synthetic: dict | None) -> str:
    blob = json.dumps({"e": endpoint, "b": body, "t": ts, "s": synthetic}, sort_keys=True, default=str)
    return "r-" + hashlib.sha256(blob.encode()).hexdigest()[:16]


class _PoolWriter:
    """Per workload: a temp copy of the existing pool (unless replacing) plus the new lines; the
    temp files replace the pools only on commit."""

    def __init__(self, home: Path, replace: bool):
        self.dir = ensure_private_dir(traffic_dir(home))
        self.home = home
        self.replace = replace
        self.open: dict[str, tuple[Any, set[str], Path]] = {}
        self.existing: Counter = Counter()
        self.added: Counter = Counter()
        self.synthetic: Counter = Counter()

    def _get(self, workload: str):
        if workload not in self.open:
            pool = pool_path(self.home, workload)
            tmp = AtomicFile(pool, PRIVATE)
            fh = tmp.fh
            ids: set[str] = set()
            try:
                if pool.exists() and not self.replace:
                    for _, raw in input_lines(pool, "traffic pool"):
                        line = raw.decode("utf-8", errors="replace")
                        if not line.strip():
                            continue
                        fh.write(line if line.endswith("\n") else line + "\n")
                        with contextlib.suppress(json.JSONDecodeError, AttributeError, TypeError):
                            obj = json.loads(line)
                            ids.add(obj["id"])
                            self.synthetic[workload] += bool(obj.get("synthetic"))
                        self.existing[workload] += 1
            except BaseException:  # an unreadable pool: no temp file left behind
                tmp.abort()
                raise
            self.open[workload] = (fh, ids, tmp)
        return self.open[workload]

    def add(self, workload: str, line: dict) -> bool:
        fh, ids, _ = self._get(workload)
        if line["id"] in ids:
            return False
        ids.add(line["id"])
        fh.write(json.dumps(line, sort_keys=True, ensure_ascii=False) + "\n")
        self.added[workload] += 1
        self.synthetic[workload] += bool(line.get("synthetic"))
        return True

    def commit(self, sources: dict[str, dict]) -> dict[str, Path]:
        """Every pool and its metadata become current together, or none does (``commit_together``):
        a failure at the second workload's rename must not leave the first one replaced."""
        out = {}
        staged = []
        now = datetime.now(timezone.utc).isoformat(timespec="seconds")
        try:
            for workload, (_, _, tmp) in self.open.items():
                pool = tmp.path
                out[workload] = pool
                mp = meta_path(pool)
                meta: dict = {}
                if mp.exists() and not self.replace:
                    with contextlib.suppress(OSError, json.JSONDecodeError):
                        meta = json.loads(read_input(mp, "manifest"))
                srcs = meta.get("sources", {}) if isinstance(meta.get("sources"), dict) else {}
                for path, info in sources.items():
                    if info["workloads"].get(workload):
                        srcs[path] = {"imported_at": now, "requests": info["workloads"][workload],
                                      "formats": info["formats"]}
                total = self.existing[workload] + self.added[workload]
                meta_file = AtomicFile(mp, PRIVATE)
                staged += [tmp, meta_file]
                json.dump({
                    "workload": workload, "requests": total, "updated_at": now, "sources": srcs,
                    "synthetic_requests": self.synthetic[workload],
                    "acceptance_measurable": self.synthetic[workload] == 0,
                }, meta_file.fh, indent=2, sort_keys=True, default=str)
                meta_file.write("\n")
            commit_together(staged)
        finally:
            for f in staged:
                f.abort()  # the metadata temp files of a failed staging (the pools: abort())
        self.open.clear()
        return out

    def abort(self) -> None:
        for _, _, tmp in self.open.values():
            tmp.abort()
        self.open.clear()


# --- import -------------------------------------------------------------------------------------

@dataclass
class FileReport:
    path: str
    """as given (reports); ``abspath`` goes into pools and manifests"""
    abspath: str = ""
    lines: int = 0
    usable: int = 0
    new: int = 0
    formats: Counter = field(default_factory=Counter)
    malformed: list[tuple[int, str]] = field(default_factory=list)
    malformed_count: int = 0
    skipped: Counter = field(default_factory=Counter)
    workloads: Counter = field(default_factory=Counter)

    def where(self, line: int) -> str:
        return f"{self.path}:{line}"


@dataclass
class ImportReport:
    files: list[FileReport] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    workloads: dict[str, Counter] = field(default_factory=dict)
    """workload -> Counter of how it was chosen (tag, rule, default, forced) over usable lines."""
    new: Counter = field(default_factory=Counter)
    pools: dict[str, Path] = field(default_factory=dict)
    pool_sizes: dict[str, int] = field(default_factory=dict)
    redacted: int = 0
    synthetic: int = 0

    @property
    def lines(self) -> int:
        return sum(f.lines for f in self.files)

    @property
    def usable(self) -> int:
        return sum(f.usable for f in self.files)

    @property
    def malformed(self) -> int:
        return sum(f.malformed_count for f in self.files)

    @property
    def skipped(self) -> Counter:
        c: Counter = Counter()
        for f in self.files:
            c.update(f.skipped)
        return c


def import_paths(paths: Iterable[str], home: str | Path, *, fmt: str = "auto",
                 classifier: Classifier | None = None, redact: Iterable[str] = (),
                 options: ImportOptions = ImportOptions(), replace: bool = False,
                 on_file: Callable[[int, int, int], None] | None = None) -> ImportReport:
    """Read the logs, tag each usable request with a workload and merge it into that workload's
    pool. Raises TrafficError (pools untouched) when no line at all is usable. ``on_file(done,
    files, lines)`` after each file: files read of how many, lines read so far (a progress bar)."""
    if fmt != "auto" and fmt not in FORMATS:
        raise TrafficError(f"unknown format {fmt!r}; one of auto, {', '.join(sorted(FORMATS))}")
    classifier = classifier or Classifier()
    redactor = Redactor(redact)
    files, missing = expand_paths(paths)
    report = ImportReport(missing=missing)
    if not files:
        raise TrafficError(f"no log files match {', '.join(map(str, paths)) or '(nothing given)'}")
    home = Path(home)
    with _writing_pools(home), pool_lock(home):
        writer = _PoolWriter(home, replace)
        try:
            for done, path in enumerate(files, 1):
                report.files.append(_import_file(path, fmt, classifier, redactor, options, writer, report))
                if on_file is not None:
                    on_file(done, len(files), report.lines)
            if report.usable == 0:
                raise TrafficError(_nothing_usable(report))
            sources = {fr.abspath: {"formats": dict(fr.formats), "workloads": dict(fr.workloads)}
                       for fr in report.files}
            report.pools = writer.commit(sources)
        except BaseException:
            writer.abort()
            raise
        report.new = writer.added
        report.pool_sizes = {w: writer.existing[w] + writer.added[w] for w in report.pools}
    report.redacted = redactor.replaced
    log.info("traffic import: %d files, %d lines, %d usable, %d new, %d malformed, %d skipped; per workload: %s",
             len(report.files), report.lines, report.usable, sum(report.new.values()), report.malformed,
             sum(report.skipped.values()), {w: sum(c.values()) for w, c in report.workloads.items()})
    return report


@contextlib.contextmanager
def _writing_pools(home: Path):
    """A write that fails (the traffic folder cannot be made, a full disk while copying a pool,
    the commit) is a PoolWriteError naming the file: never counted as a malformed line, never a
    torn pool (every pool is a temp file until all of them are complete)."""
    try:
        yield
    except PoolWriteError:
        raise
    except OSError as e:
        where = e.filename or traffic_dir(home)
        raise PoolWriteError(e.errno, f"cannot write the traffic pools: {where}: {e.strerror or e}; "
                                      f"the pools are unchanged") from None


def _nothing_usable(report: ImportReport) -> str:
    parts = [f"nothing usable in {len(report.files)} file(s): {report.lines} lines read, "
             f"{report.malformed} malformed"]
    for reason, k in report.skipped.most_common():
        parts.append(f"{k} skipped: {reason}")
    shown = [fr.where(ln) + ": " + why for fr in report.files for ln, why in fr.malformed][:5]
    return "; ".join(parts) + ("\n  " + "\n  ".join(shown) if shown else "")


def _import_file(path: Path, fmt: str, classifier: Classifier, redactor: Redactor, options: ImportOptions,
                 writer: _PoolWriter, report: ImportReport) -> FileReport:
    fr = FileReport(path=str(path), abspath=os.path.abspath(path))
    forced = FORMATS.get(fmt)

    def bad(line: int, reason: str) -> None:
        fr.malformed_count += 1
        if len(fr.malformed) < MAX_REPORTED_MALFORMED:
            fr.malformed.append((line, reason))
        log.debug("%s: malformed: %s", fr.where(line), reason)

    for lineno, text, err in iter_lines(path):
        fr.lines += 1
        if err:
            bad(lineno, err)
            continue
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as e:
            bad(lineno, f"not JSON ({e.msg} at column {e.colno})")
            continue
        except (ValueError, RecursionError) as e:  # an integer of 5000 digits, nesting 1000 deep
            bad(lineno, f"not usable JSON ({type(e).__name__})")
            continue
        if not isinstance(obj, dict):
            bad(lineno, f"expected a JSON object, got {type(obj).__name__}")
            continue
        try:
            f = forced or detect_format(obj)
            rec = f.parse(obj, options)
        except Malformed as e:
            bad(lineno, str(e))
            continue
        except Skip as e:
            fr.skipped[str(e)] += 1
            continue
        fr.formats[f.name] += 1
        text_for_rules = "" if rec.synthetic else prompt_text(rec.endpoint, rec.body)
        workload, how = classifier.classify(tag=rec.tag, model=rec.model, text=text_for_rules)
        body = redactor.body(rec.endpoint, rec.body) if not rec.synthetic else rec.body
        line = {"id": request_id(rec.endpoint, body, rec.ts, rec.synthetic), "endpoint": rec.endpoint,
                "body": body, "tag": workload, "ts": rec.ts, "src": f"{fr.abspath}:{lineno}", "format": f.name,
                "how": how}
        if rec.model:
            line["model"] = rec.model
        if rec.prompt_tokens is not None:
            line["prompt_tokens"] = rec.prompt_tokens
        if rec.synthetic:
            line["synthetic"] = rec.synthetic
            line["acceptance_measurable"] = False
            report.synthetic += 1
        fr.usable += 1
        fr.workloads[workload] += 1
        report.workloads.setdefault(workload, Counter())[how] += 1
        if writer.add(workload, line):
            fr.new += 1
    log.info("%s: %d lines, %d usable (%d new), %d malformed, %d skipped", fr.path, fr.lines, fr.usable,
             fr.new, fr.malformed_count, sum(fr.skipped.values()))
    return fr
