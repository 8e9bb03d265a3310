"""Synthetic production logs for the traffic tests (written by the tests, nothing downloaded).

Every prompt contains a ``SECRET-<n>`` marker so tests can assert that no prompt text reaches
logs or command output.
"""

from __future__ import annotations

import gzip
import json
from datetime import datetime, timedelta, timezone
from pathlib import Path

T0 = datetime(2025, 6, 1, 0, 0, tzinfo=timezone.utc)

CODE_TEXT = "Please fix this:\n```python\ndef add(a, b):\n    return a - b\n```\nSECRET-{i}"
CHAT_TEXT = "What should I cook for dinner tonight with some leftover rice? SECRET-{i}"


def gateway_lines() -> tuple[list[str], dict]:
    """A gateway log: chat + completions bodies, tags in three places, rules and default
    classification, one production failure and malformed lines. Returns (lines, expectations)."""
    t = T0.isoformat().replace("+00:00", "Z")
    good = [
        # 1 tagged (metadata.workload in the body), nested request/response, usage
        {"timestamp": t, "request": {"body": {"model": "prod-llm", "messages": [
            {"role": "user", "content": "Tell me a story SECRET-1"}], "temperature": 0.7, "max_tokens": 64,
            "stream": True, "stream_options": {"include_usage": True}, "metadata": {"workload": "code"}}},
         "response": {"status_code": 200, "usage": {"prompt_tokens": 12, "completion_tokens": 64}}},
        # 2 tagged at the top level, completions body, epoch ms timestamp
        {"timestamp": int(T0.timestamp() * 1000) + 1000, "workload": "chat", "model": "prod-llm",
         "request": {"prompt": "Once upon a time SECRET-2", "max_tokens": 32, "top_p": 0.9}},
        # 3 rule by model name (prose text, would be chat by default)
        {"ts": T0.timestamp() + 2, "request": {"model": "coder-7b-instruct", "messages": [
            {"role": "user", "content": "How are you today? SECRET-3"}], "max_tokens": 16}},
        # 4 rule by keyword
        {"ts": T0.timestamp() + 3, "request": {"model": "prod-llm", "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "Where is my Invoice for May? SECRET-4"}]}},
        # 5 default classifier -> code (fenced block), OpenAI batch style
        {"custom_id": "req-5", "method": "POST", "url": "/v1/chat/completions", "created_at": t,
         "body": {"model": "prod-llm", "messages": [{"role": "user", "content": CODE_TEXT.format(i=5)}],
                  "temperature": 0}},
        # 6 default classifier -> chat, bare completions body logged with a timestamp
        {"model": "prod-llm", "prompt": "Write a haiku about autumn leaves SECRET-6", "max_tokens": 20,
         "timestamp": t, "stream": False, "latency_ms": 812, "headers": {"x-team": "blue"}},
    ]
    lines = [json.dumps(g) for g in good[:3]]
    lines.append("{not json at all SECRET-bad")                                    # line 4: malformed
    lines += [json.dumps(g) for g in good[3:5]]
    lines.append("")                                                               # line 7: blank, not counted
    lines.append(json.dumps({"timestamp": t, "request": {"foo": 1}}))             # line 8: malformed (no body)
    lines.append(json.dumps({"timestamp": "yesterday-ish", "request": {            # line 9: malformed (bad ts)
        "messages": [{"role": "user", "content": "hi SECRET-9"}]}}))
    lines.append(json.dumps({"timestamp": t, "status": 500, "request": {           # line 10: skipped (failed)
        "messages": [{"role": "user", "content": "boom SECRET-10"}]}}))
    lines.append(json.dumps([1, 2, 3]))                                            # line 11: malformed
    lines.append(json.dumps(good[5]))                                              # line 12
    lines.append(json.dumps({"url": "/v1/embeddings", "body": {"input": "x", "prompt": "y"}}))  # 13 skipped
    expect = {"lines": 12, "usable": 6, "malformed": {4, 8, 9, 11}, "skipped": 2,
              "workloads": {"code": {"tag": 1, "rule": 1, "default": 1}, "chat": {"tag": 1, "default": 1},
                            "billing": {"rule": 1}}}
    return lines, expect


RULES_YAML = """
traffic:
  rules:
    - {workload: code, model: "coder"}
    - {workload: billing, keywords: [invoice, refund]}
"""


def write_gz(path: Path, lines: list[str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")
    return path


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n")
    return path


def chat_rows(n: int, *, start: datetime = T0, step: timedelta = timedelta(minutes=7), chars: int = 200,
              workload: str = "code", prefix: str = "q") -> list[dict]:
    """Tagged gateway rows with distinct prompts of about ``chars`` characters."""
    rows = []
    for i in range(n):
        text = f"{prefix}{i} SECRET-{prefix}{i} " + "lorem ipsum dolor sit amet " * (chars // 27 + 1)
        rows.append({"timestamp": (start + i * step).isoformat(), "workload": workload,
                     "request": {"model": "m", "messages": [{"role": "user", "content": text[:chars]}],
                                 "max_tokens": 16, "temperature": 0}})
    return rows
