"""Importing production logs: formats, gzip and globs, malformed-line reports, workload tagging,
pools (0600, deduplicated), redaction, and no prompt text in logs. Nothing here starts vLLM."""

from __future__ import annotations

import json
import logging
import stat
from pathlib import Path

import pytest
import yaml
from _traffic_logs import (CODE_TEXT, RULES_YAML, T0, chat_rows, gateway_lines, write_gz, write_jsonl)

from autotune.traffic import _traffic
from autotune.core._spec import SpecError, StudySpec, load_spec
from autotune.traffic._traffic import ImportOptions, TrafficError, import_paths, parse_ts
from autotune.traffic._workloads import Classifier, explicit_tag, looks_like_code

ROOT = Path(__file__).resolve().parent.parent


def _rules(tmp_path) -> list:
    data = yaml.safe_load((ROOT / "studies" / "code.yaml").read_text())
    data.update(yaml.safe_load(RULES_YAML))
    p = tmp_path / "code.yaml"
    p.write_text(yaml.safe_dump(data))
    return list(load_spec(p).traffic.rules)


def _pool(home: Path, workload: str) -> list[dict]:
    return [json.loads(x) for x in (home / "traffic" / f"{workload}.jsonl").read_text().splitlines()]


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def test_gateway_log_gzip_counts_tags_and_malformed_lines(tmp_path):
    lines, expect = gateway_lines()
    log = write_gz(tmp_path / "logs" / "gateway.jsonl.gz", lines)
    home = tmp_path / "home"
    rep = import_paths([str(log)], home, classifier=Classifier(_rules(tmp_path)))

    (fr,) = rep.files
    assert fr.lines == expect["lines"]
    assert fr.usable == fr.new == expect["usable"]
    assert fr.malformed_count == len(expect["malformed"])
    assert {ln for ln, _ in fr.malformed} == expect["malformed"]
    assert sum(fr.skipped.values()) == expect["skipped"]
    assert any("status 500" in r for r in fr.skipped) and any("embeddings" in r for r in fr.skipped)
    reasons = dict(fr.malformed)
    assert "not JSON" in reasons[4]
    assert "no request body" in reasons[8]
    assert "timestamp" in reasons[9]
    assert "object" in reasons[11]
    for ln, why in fr.malformed:
        assert fr.where(ln) == f"{log}:{ln}"
        assert "SECRET" not in why
    assert {w: dict(c) for w, c in rep.workloads.items()} == expect["workloads"]

    code = _pool(home, "code")
    assert len(code) == 3 and {r["how"] for r in code} == {"tag", "rule", "default"}
    first = next(r for r in code if r["how"] == "tag")
    # the body as logged, minus model/stream/stream_options; omitted fields stay omitted
    assert first["body"] == {"messages": [{"role": "user", "content": "Tell me a story SECRET-1"}],
                             "temperature": 0.7, "max_tokens": 64, "metadata": {"workload": "code"}}
    assert first["ts"] == T0.timestamp() and first["prompt_tokens"] == 12 and first["model"] == "prod-llm"
    assert first["src"] == f"{log}:1" and first["format"] == "openai"
    batch = next(r for r in code if r["how"] == "default")
    assert batch["endpoint"] == "chat" and batch["body"] == {
        "messages": [{"role": "user", "content": CODE_TEXT.format(i=5)}], "temperature": 0}
    chat = _pool(home, "chat")
    comp = next(r for r in chat if r["how"] == "tag")
    assert comp["endpoint"] == "completions" and comp["ts"] == T0.timestamp() + 1
    assert comp["body"] == {"prompt": "Once upon a time SECRET-2", "max_tokens": 32, "top_p": 0.9}
    bare = next(r for r in chat if r["how"] == "default")
    assert bare["body"] == {"prompt": "Write a haiku about autumn leaves SECRET-6", "max_tokens": 20}
    assert [r["how"] for r in _pool(home, "billing")] == ["rule"]

    for w in ("code", "chat", "billing"):
        assert _mode(home / "traffic" / f"{w}.jsonl") == 0o600
        assert _mode(home / "traffic" / f"{w}.meta.json") == 0o600
    assert _mode(home / "traffic") == 0o700
    meta = json.loads((home / "traffic" / "code.meta.json").read_text())
    assert meta["requests"] == 3 and meta["acceptance_measurable"] is True
    assert meta["sources"][str(log)]["requests"] == 3

    # importing the same log again adds nothing (ids are content hashes)
    again = import_paths([str(log)], home, classifier=Classifier(_rules(tmp_path)))
    assert again.usable == 6 and sum(again.new.values()) == 0
    assert len(_pool(home, "code")) == 3


def test_forced_workload_and_replace(tmp_path):
    lines, _ = gateway_lines()
    log = write_gz(tmp_path / "g.jsonl.gz", lines)
    home = tmp_path / "home"
    rep = import_paths([str(log)], home, classifier=Classifier(force="nightly"))
    assert set(rep.workloads) == {"nightly"} and rep.workloads["nightly"]["forced"] == 6
    write_jsonl(tmp_path / "one.jsonl", chat_rows(1))
    import_paths([str(tmp_path / "one.jsonl")], home, classifier=Classifier(force="nightly"), replace=True)
    assert len(_pool(home, "nightly")) == 1


def test_other_gateway_shapes(tmp_path):
    t = "2025-06-01T00:00:05.250Z"
    f = write_jsonl(tmp_path / "g.jsonl", [
        # LiteLLM-style: the body's fields at the top level beside the proxy's own
        {"startTime": t, "call_type": "acompletion", "model": "x", "status": "success", "response_time": 1.2,
         "metadata": {"user_api_key_hash": "abc"}, "messages": [{"role": "user", "content": "hello"}],
         "temperature": 0.2, "api_base": "http://10.0.0.1"},
        {"startTime": t, "status": "failure", "messages": [{"role": "user", "content": "hello again"}]},
        # the request logged as a JSON string; a duration in 'time' is not taken for the timestamp
        {"time": 0.5, "created_at": t, "request": json.dumps({"prompt": "say hi", "max_tokens": 3}),
         "tag": "chat"},
        {"request": {"messages": []}},
        {"request": {"prompt": ["a", "b"]}},
    ])
    home = tmp_path / "home"
    rep = import_paths([str(f)], home)
    (fr,) = rep.files
    assert fr.usable == 2 and dict(fr.skipped) == {"failed in production (status failure)": 1}
    assert "non-empty list" in dict(fr.malformed)[4] and "batched" in dict(fr.malformed)[5]
    rows = {r["endpoint"]: r for r in _pool(home, "chat")}
    assert rows["chat"]["body"] == {"messages": [{"role": "user", "content": "hello"}], "temperature": 0.2}
    assert rows["chat"]["ts"] == T0.timestamp() + 5.25 and rows["chat"]["model"] == "x"
    assert rows["completions"]["body"] == {"prompt": "say hi", "max_tokens": 3}
    assert rows["completions"]["ts"] == T0.timestamp() + 5.25


def test_bench_jsonl(tmp_path):
    f = write_jsonl(tmp_path / "bench.jsonl", [
        {"prompt": "What is the capital of India? SECRET-b1", "output_tokens": 10},
        {"prompt": "def f(x):\n    return x * 2\n\nprint(f(3))", "output_tokens": 1520},
        {"prompt": "What is the capital of China?", "output_tokens": "many"},
        {"prompt": "No output length"},
    ])
    home = tmp_path / "home"
    rep = import_paths([str(f)], home)
    (fr,) = rep.files
    assert fr.formats == {"bench": 2} and fr.usable == 2 and fr.malformed_count == 2
    assert "output_tokens" in dict(fr.malformed)[3] and "output_tokens" in dict(fr.malformed)[4]
    (chat,) = _pool(home, "chat")
    assert chat["endpoint"] == "chat" and chat["ts"] is None and chat["format"] == "bench"
    assert chat["body"] == {"messages": [{"role": "user", "content": "What is the capital of India? SECRET-b1"}],
                            "max_tokens": 10}
    assert _pool(home, "code")[0]["body"]["max_tokens"] == 1520


MOONCAKE = [
    {"timestamp": 0, "input_length": 1000, "output_length": 20, "hash_ids": [1, 2]},
    {"timestamp": 1500, "input_length": 700, "output_length": 10, "hash_ids": [1, 3]},
    {"timestamp": 3000, "input_length": 90, "output_length": 5, "hash_ids": [4]},
    {"timestamp": 3100, "input_length": -1, "output_length": 5, "hash_ids": [5]},
]


def test_mooncake_trace_needs_synthesize(tmp_path):
    f = write_jsonl(tmp_path / "trace.jsonl", MOONCAKE)
    with pytest.raises(TrafficError) as e:
        import_paths([str(f)], tmp_path / "home")
    assert "--synthesize" in str(e.value) and "3 skipped" in str(e.value)
    assert f"{f}:4" in str(e.value)  # the malformed row is named
    assert not (tmp_path / "home" / "traffic" / "chat.jsonl").exists()


def test_mooncake_trace_synthesized_is_flagged(tmp_path):
    f = write_jsonl(tmp_path / "trace.jsonl", MOONCAKE)
    home = tmp_path / "home"
    start = parse_ts("2025-06-01T12:00:00Z")
    rep = import_paths([str(f)], home, classifier=Classifier(force="trace"),
                       options=ImportOptions(synthesize=True, trace_start=start))
    assert rep.usable == 3 and rep.synthetic == 3 and rep.malformed == 1
    rows = _pool(home, "trace")
    assert all(r["acceptance_measurable"] is False and r["format"] == "mooncake" for r in rows)
    assert rows[1]["ts"] == start + 1.5
    assert rows[0]["body"] == {"max_tokens": 20, "ignore_eos": True, "temperature": 0}
    assert "prompt" not in rows[0]["body"]  # materialized at sampling time only
    meta = json.loads((home / "traffic" / "trace.meta.json").read_text())
    assert meta["acceptance_measurable"] is False and meta["synthetic_requests"] == 3
    p1 = _traffic.synthetic_prompt(rows[0]["synthetic"]).split()
    p2 = _traffic.synthetic_prompt(rows[1]["synthetic"]).split()
    assert len(p1) == 1000 and len(p2) == 700
    assert p1[:512] == p2[:512] and p1[512:700] != p2[512:700]  # shared hash id 1 -> shared prefix


def test_glob_of_several_files(tmp_path):
    logs = tmp_path / "logs"
    write_jsonl(logs / "a-1.jsonl", chat_rows(2, prefix="a"))
    write_gz(logs / "a-2.jsonl.gz", [json.dumps(r) for r in chat_rows(3, prefix="b")])
    write_jsonl(logs / "sub" / "a-3.jsonl", chat_rows(4, prefix="c"))
    write_jsonl(logs / "other.txt", ["garbage"])
    rep = import_paths([str(logs / "**" / "a-*.jsonl*")], tmp_path / "home")
    assert [Path(f.path).name for f in rep.files] == ["a-1.jsonl", "a-2.jsonl.gz", "a-3.jsonl"]
    assert rep.usable == 9 and rep.malformed == 0
    # a folder, and a pattern that matches nothing (reported, not fatal)
    rep = import_paths([str(logs / "sub"), str(tmp_path / "nope-*.jsonl")], tmp_path / "home2")
    assert rep.usable == 4 and rep.missing == [str(tmp_path / "nope-*.jsonl")]


def test_nothing_usable_is_an_error(tmp_path):
    f = write_jsonl(tmp_path / "bad.jsonl", ["nope", "{\"a\": 1}", "[]"])
    with pytest.raises(TrafficError) as e:
        import_paths([str(f)], tmp_path / "home")
    msg = str(e.value)
    assert "nothing usable" in msg and "3 malformed" in msg
    for ln in (1, 2, 3):
        assert f"{f}:{ln}:" in msg
    assert not list((tmp_path / "home" / "traffic").glob("*.jsonl*"))
    with pytest.raises(TrafficError, match="no log files match"):
        import_paths([str(tmp_path / "missing-*.jsonl")], tmp_path / "home")


def test_truncated_gzip_keeps_what_was_read(tmp_path):
    f = write_gz(tmp_path / "t.jsonl.gz", [json.dumps(r) for r in chat_rows(50)])
    data = f.read_bytes()
    f.write_bytes(data[: len(data) // 2])
    rep = import_paths([str(f)], tmp_path / "home")
    (fr,) = rep.files
    assert 0 < fr.usable < 50 and fr.malformed_count >= 1
    assert "compressed" in fr.malformed[-1][1]


def test_redaction_replaces_matches(tmp_path):
    f = write_jsonl(tmp_path / "r.jsonl", [
        {"workload": "chat", "request": {"messages": [
            {"role": "user", "content": [{"type": "text", "text": "mail bob@example.com now"}]},
            {"role": "user", "content": "call 555-1234, mail amy@corp.io"}]}},
        {"workload": "chat", "request": {"prompt": "key sk-abcdef123456 here"}},
    ])
    home = tmp_path / "home"
    rep = import_paths([str(f)], home, redact=[r"[\w.]+@[\w.]+", r"sk-[A-Za-z0-9]+", r"\d{3}-\d{4}"])
    assert rep.redacted == 4
    text = (home / "traffic" / "chat.jsonl").read_text()
    for secret in ("bob@example.com", "amy@corp.io", "sk-abcdef123456", "555-1234"):
        assert secret not in text
    assert text.count("[REDACTED]") == 4
    with pytest.raises(TrafficError, match="invalid --redact regex"):
        import_paths([str(f)], home, redact=["("])


def test_no_prompt_text_in_info_logs(tmp_path, caplog):
    lines, _ = gateway_lines()
    log = write_gz(tmp_path / "g.jsonl.gz", lines)
    with caplog.at_level(logging.DEBUG, logger="autotune"):
        import_paths([str(log)], tmp_path / "home", classifier=Classifier(_rules(tmp_path)))
    assert any(r.levelno == logging.INFO for r in caplog.records)
    assert "SECRET" not in caplog.text and "dinner" not in caplog.text and "def add" not in caplog.text


def test_timestamps():
    assert parse_ts("2025-06-01T00:00:00Z") == T0.timestamp()
    assert parse_ts("2025-06-01T02:00:00+02:00") == T0.timestamp()
    assert parse_ts("2025-06-01 00:00:00") == T0.timestamp()  # naive = UTC
    for v in (T0.timestamp(), T0.timestamp() * 1e3, T0.timestamp() * 1e6, T0.timestamp() * 1e9,
              str(int(T0.timestamp()))):
        assert parse_ts(v) == pytest.approx(T0.timestamp())
    for bad in ("soon", True, -1, [1]):
        with pytest.raises((ValueError, TypeError)):
            parse_ts(bad)


def test_workload_tags_and_default_classifier():
    assert explicit_tag({"metadata": {"workload": "Code Assist!"}}) == "Code-Assist"
    assert explicit_tag({"x": 1}, {"tag": "chat"}) == "chat"
    assert explicit_tag({"tag": ""}, {}) is None
    for text in ("Can you fix the bug in main.py?", "```\nx = 1\n```",
                 "def add(a, b):\n    return a + b\n\nprint(add(1, 2))",
                 "const x = foo(); if (x == null) { return; }",
                 "SELECT name FROM users WHERE age > 30 ORDER BY name"):
        assert looks_like_code(text), text
    for text in ("What is a good vegetarian recipe for dinner (quick)?",
                 "Write a function that returns the sum of a list",
                 "I think it was True that the meeting was None of my business.",
                 "Summarize: the offsite is on Friday (10am). Bring laptops; lunch provided.", ""):
        assert not looks_like_code(text), text


def test_spec_traffic_block(tmp_path):
    spec = load_spec(ROOT / "studies" / "code.yaml")  # no traffic block: defaults
    assert spec.traffic.rules == [] and spec.traffic.sample.window_hours == 24 and spec.traffic.sample.n is None
    data = yaml.safe_load((ROOT / "studies" / "code.yaml").read_text())
    data["traffic"] = {"rules": [{"workload": "code", "regex": "import \\w+", "keywords": ["pandas"]}],
                       "redact": ["\\d{16}"], "sample": {"n": 40, "window_hours": 6, "seed": 7}}
    p = tmp_path / "code.yaml"
    p.write_text(yaml.safe_dump(data))
    t = load_spec(p).traffic
    assert t.rules[0].keywords == ["pandas"] and t.sample.seed == 7 and t.redact == ["\\d{16}"]
    c = Classifier(t.rules)
    assert c.classify(tag=None, model=None, text="import os; using Pandas") == ("code", "rule")
    assert c.classify(tag=None, model=None, text="pandas, but no regex match") == ("chat", "default")
    for bad, field in (({"rules": [{"workload": "code"}]}, "traffic.rules.0"),
                       ({"rules": [{"workload": "code", "regex": "("}]}, "traffic.rules.0.regex"),
                       ({"redact": ["[a-"]}, "traffic.redact"), ({"sample": {"n": 0}}, "traffic.sample.n")):
        data["traffic"] = bad
        p.write_text(yaml.safe_dump(data))
        with pytest.raises(SpecError) as e:
            load_spec(p)
        assert f"field '{field}" in str(e.value) and str(p) in str(e.value)
    assert StudySpec.model_fields["traffic"].default.sample.seed == 0
