"""Replay sets: the requests a trial sends, one OpenAI-style request body per JSONL line.

A line is ``{"id": str, "endpoint": "completions" | "chat", "body": {...}, "tag": str | null,
"ts": float | null}``. ``body`` is replayed as logged (sampling parameters included; fields the
request omitted stay omitted) except ``model``, ``stream`` and ``stream_options``, which the
replay client sets.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autotune.core._files import PRIVATE, write_text
from autotune.core._inputs import InputError, input_lines

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}


class ReplaySetError(ValueError):
    """A replay set file is unreadable or a line is malformed; names file and line."""


@dataclass(frozen=True)
class ReplayRequest:
    id: str
    endpoint: str
    body: dict
    tag: str | None = None
    ts: float | None = None

    @property
    def path(self) -> str:
        return ENDPOINTS[self.endpoint]

    @property
    def greedy(self) -> bool:
        """Greedy requests (temperature 0) have one right output: they serve the equivalence check."""
        return self.body.get("temperature", None) == 0

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    def greedy_copy(self) -> "ReplayRequest":
        """The same prompt at temperature 0 (sampling knobs dropped), id ``<id>#greedy``: for the
        equivalence check of sampled traffic, whose outputs cannot be compared."""
        body = {k: v for k, v in self.body.items() if k not in ("top_p", "top_k", "min_p", "seed", "n")}
        return ReplayRequest(id=f"{self.id}#greedy", endpoint=self.endpoint, body={**body, "temperature": 0},
                             tag=self.tag, ts=None)


@dataclass
class ReplaySet:
    path: Path
    requests: list[ReplayRequest] = field(default_factory=list)

    @property
    def digest(self) -> str:
        """Content hash: identifies the replay set in trials and recommendations."""
        h = hashlib.sha256()
        for r in self.requests:
            h.update(r.to_json().encode())
        return h.hexdigest()[:16]

    def by_tag(self) -> dict[str | None, int]:
        counts: dict[str | None, int] = {}
        for r in self.requests:
            counts[r.tag] = counts.get(r.tag, 0) + 1
        return counts


def parse_line(line: str, where: str) -> ReplayRequest:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as e:
        raise ReplaySetError(f"{where}: not JSON ({e.msg})") from None
    except (ValueError, RecursionError) as e:  # an integer of 5000 digits, nesting 1000 deep
        raise ReplaySetError(f"{where}: not usable JSON ({type(e).__name__})") from None
    if not isinstance(obj, dict):
        raise ReplaySetError(f"{where}: expected an object, got {type(obj).__name__}")
    for key in ("id", "endpoint", "body"):
        if key not in obj:
            raise ReplaySetError(f"{where}: missing field '{key}'")
    if obj["endpoint"] not in ENDPOINTS:
        raise ReplaySetError(f"{where}: field 'endpoint' must be one of {sorted(ENDPOINTS)}, "
                             f"got {obj['endpoint']!r}")
    body = obj["body"]
    if not isinstance(body, dict):
        raise ReplaySetError(f"{where}: field 'body' must be an object")
    need = "messages" if obj["endpoint"] == "chat" else "prompt"
    if need not in body:
        raise ReplaySetError(f"{where}: field 'body.{need}' is required for endpoint {obj['endpoint']!r}")
    if need == "messages" and not (isinstance(body["messages"], list) and body["messages"]
                                   and all(isinstance(m, dict) for m in body["messages"])):
        raise ReplaySetError(f"{where}: field 'body.messages' must be a non-empty list of message objects")
    if need == "prompt" and not isinstance(body["prompt"], (str, list)):
        raise ReplaySetError(f"{where}: field 'body.prompt' must be a string or a list of token ids")
    if not isinstance(obj["id"], (str, int)) or isinstance(obj["id"], bool):
        raise ReplaySetError(f"{where}: field 'id' must be a string")
    if obj.get("tag") is not None and not isinstance(obj["tag"], str):
        raise ReplaySetError(f"{where}: field 'tag' must be a string or null")
    ts = obj.get("ts")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float)) or not math.isfinite(ts)):
        raise ReplaySetError(f"{where}: field 'ts' must be a number (epoch seconds) or null")
    return ReplayRequest(id=str(obj["id"]), endpoint=obj["endpoint"], body=body,
                         tag=obj.get("tag"), ts=obj.get("ts"))


def load(path: str | Path) -> ReplaySet:
    """Read a replay set: one request per line, lines split on ``\\n`` alone (JSON escapes every
    other line break, but a raw U+2028 inside a string is valid JSON that ``splitlines`` would
    cut); ReplaySetError names file and line of the first problem.

    Two streaming passes: the first checks every line and keeps only the ids, so a bad set (a
    duplicate id on its last line, a broken line) is refused at once with memory bounded by its
    ids, not by its prompts (a million lines: about 100 MB, not 1.6 GB); the second keeps the
    requests of a set known to be good."""
    path = Path(path)
    first_line: dict[str, int] = {}  # id -> its line: a duplicate is named in the same pass, at once
    for i, r in _requests(path):
        if r.id in first_line:
            raise ReplaySetError(f"{path}:{i}: duplicate request id {r.id!r} (first on line {first_line[r.id]})")
        first_line[r.id] = i
    if not first_line:
        raise ReplaySetError(f"{path}: replay set has no requests")
    del first_line
    return ReplaySet(path=path, requests=[r for _, r in _requests(path)])


def _requests(path: Path):
    """``(line number, request)`` of each non-blank line, read a line at a time."""
    try:
        for i, line in input_lines(path, "replay set"):
            if line.endswith(b"\n"):
                line = line[:-1]
            if not line.strip():
                continue
            try:
                text = line.decode("utf-8")
            except UnicodeDecodeError as e:
                raise ReplaySetError(f"{path}:{i}: not UTF-8 (byte {e.start + 1} of the line)") from None
            yield i, parse_line(text, f"{path}:{i}")
    except OSError as e:
        raise ReplaySetError(f"{path}: cannot read replay set ({e.strerror})") from None
    except InputError as e:
        raise ReplaySetError(str(e)) from None


def save(path: str | Path, requests: list[ReplayRequest]) -> Path:
    """Write atomically with 0600 permissions: replay sets hold production prompts."""
    return write_text(path, "".join(r.to_json() + "\n" for r in requests), PRIVATE)
