"""Replay sets: the requests a trial sends, one OpenAI-style request body per JSONL line.

A line is ``{"id": str, "endpoint": "completions" | "chat", "body": {...}, "tag": str | null,
"ts": float | null}``. ``body`` is replayed as logged (sampling parameters included; fields the
request omitted stay omitted) except ``model``, ``stream`` and ``stream_options``, which the
replay client sets.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

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
    return ReplayRequest(id=str(obj["id"]), endpoint=obj["endpoint"], body=body,
                         tag=obj.get("tag"), ts=obj.get("ts"))


def load(path: str | Path) -> ReplaySet:
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ReplaySetError(f"{path}: cannot read replay set ({e.strerror})") from None
    reqs = [parse_line(line, f"{path}:{i}") for i, line in enumerate(text.splitlines(), 1)
            if line.strip()]
    if not reqs:
        raise ReplaySetError(f"{path}: replay set has no requests")
    ids = [r.id for r in reqs]
    if len(set(ids)) != len(ids):
        dup = next(i for i in ids if ids.count(i) > 1)
        raise ReplaySetError(f"{path}: duplicate request id {dup!r}")
    return ReplaySet(path=path, requests=reqs)


def save(path: str | Path, requests: list[ReplayRequest]) -> Path:
    """Write atomically with 0600 permissions: replay sets hold production prompts."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        for r in requests:
            fh.write(r.to_json() + "\n")
    os.replace(tmp, path)
    return path
