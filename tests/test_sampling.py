"""Sampling replay sets from traffic pools: deterministic, stratified, deduplicated, window and
context-length filters, manifest, 0600 files, and a replay set that `_replayset.load` reads."""

from __future__ import annotations

import json
import logging
import stat
from collections import Counter
from datetime import timedelta
from pathlib import Path

import pytest
import yaml
from _traffic_logs import T0, chat_rows, write_jsonl

from autotune.traffic import _replayset
from autotune.traffic._sampling import (_UNSET, PoolRow, SampleError, TokenCounter, Window, length_bucket, read_manifest,
                                sample_rows, sample_workload)
from autotune.core._spec import load_spec
from autotune.traffic._traffic import ImportOptions, import_paths
from autotune.traffic._workloads import Classifier

ROOT = Path(__file__).resolve().parent.parent


def _row(i: int, chars: int = 200, ts: float | None = None, prompt: str | None = None, max_tokens: int = 16):
    text = prompt if prompt is not None else (f"p{i} " + "x" * chars)[:chars]
    return PoolRow(id=f"r-{i:05d}", endpoint="chat", body={"messages": [{"role": "user", "content": text}],
                                                          "max_tokens": max_tokens},
                   tag="code", ts=T0.timestamp() + 60 * i if ts is None else ts)


def _sample(rows, n=20, seed=0, window=None, max_model_len=None):
    return sample_rows(rows, n=n, seed=seed, window=window or Window(None, None, None),
                       max_model_len=max_model_len, counter=TokenCounter(use_tokenizer=False))


def _ids(s) -> list[str]:
    return [r.id for r in s.requests]


def test_deterministic_for_a_seed_and_different_for_another():
    rows = [_row(i, chars=50 + 7 * i) for i in range(300)]
    a, b, c = _sample(rows, seed=1), _sample(rows, seed=1), _sample(rows, seed=2)
    assert _ids(a) == _ids(b) and len(_ids(a)) == 20 == len(set(_ids(a)))
    assert set(_ids(a)) != set(_ids(c))
    # independent of the pool's line order
    assert _ids(_sample(list(reversed(rows)), seed=1)) == _ids(a)


def test_stratification_keeps_length_proportions():
    # 60% short (~50 tokens), 30% medium (~300), 10% long (~1000), spread over the day
    rows = ([_row(i, chars=200) for i in range(360)] + [_row(1000 + i, chars=1200) for i in range(180)]
            + [_row(2000 + i, chars=4000) for i in range(60)])
    for seed in range(5):
        s = _sample(rows, n=50, seed=seed)
        got = Counter(length_bucket(TokenCounter(use_tokenizer=False).estimate(r)) for r in s.rows)
        assert abs(got["<128"] - 30) <= 1 and abs(got["128-512"] - 15) <= 1 and abs(got["512-2k"] - 5) <= 1
        assert s.manifest["strata"]["length"]["population"] == {"<128": 360, "128-512": 180, "512-2k": 60}
        assert sum(s.manifest["strata"]["cells"]["sample"].values()) == 50
        # the time-of-day buckets are covered too
        assert len({k.split("|")[1] for k, v in s.manifest["strata"]["cells"]["sample"].items() if v}) >= 3


def test_dedup_keeps_the_earliest():
    rows = [_row(i) for i in range(10)]
    rows += [_row(100 + i, prompt=rows[0].body["messages"][0]["content"], max_tokens=99) for i in range(5)]
    s = _sample(rows, n=100)
    assert s.manifest["skipped"]["duplicate"]["count"] == 5
    assert s.manifest["counts"] == {"pool": 15, "in_window": 15, "unique": 10, "eligible": 10, "sampled": 10}
    assert "r-00000" in _ids(s) and not any(i.startswith("r-001") for i in _ids(s))
    assert s.manifest["short_by"] == 90


def test_too_long_prompts_dropped_with_a_count():
    rows = [_row(i, chars=400) for i in range(20)] + [_row(100 + i, chars=3000) for i in range(7)]
    rows.append(_row(200, chars=400, max_tokens=500))  # prompt fits, prompt + max_tokens does not
    s = _sample(rows, n=50, max_model_len=512)
    assert s.manifest["skipped"]["too_long"]["count"] == 8
    assert s.manifest["counts"]["eligible"] == 20
    assert s.manifest["context"]["max_model_len"] == 512
    with pytest.raises(SampleError, match="too_long 28"):
        _sample(rows, max_model_len=64)


def test_window_filter():
    day = 86400
    rows = [_row(i, ts=T0.timestamp() + i * 3600) for i in range(72)]  # three days, hourly
    rows.append(_row(999))
    rows[-1].ts = None
    s = sample_rows(rows, n=100, seed=0, window=Window(None, None, 24.0), max_model_len=None,
                    counter=TokenCounter(use_tokenizer=False))
    newest = T0.timestamp() + 71 * 3600
    assert s.manifest["counts"]["eligible"] == 24 and all(r.ts > newest - day for r in s.rows)
    assert s.manifest["skipped"]["outside_window"]["count"] == 48
    assert s.manifest["skipped"]["no_timestamp"]["count"] == 1
    assert s.manifest["window"]["anchored_at_newest_request"].startswith("2025-06-03T23")
    s = sample_rows(rows, n=100, seed=0, window=Window(T0.timestamp() + day, T0.timestamp() + day + 6 * 3600, None),
                    max_model_len=None, counter=TokenCounter(use_tokenizer=False))
    assert s.manifest["counts"]["eligible"] == 6
    s = _sample(rows, n=100)  # no window at all: rows without a timestamp count too
    assert s.manifest["counts"]["eligible"] == 73


def _spec(tmp_path: Path, **traffic) -> Path:
    data = yaml.safe_load((ROOT / "studies" / "code.yaml").read_text())
    data["model"] = str(tmp_path / "no-such-model")
    data["replay"]["path"] = str(tmp_path / "replay" / "code.jsonl")
    data["engine"]["serve_args"]["max_model_len"] = 512
    if traffic:
        data["traffic"] = traffic
    p = tmp_path / "code.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


def _import(tmp_path, rows, workload="code", **kw):
    f = write_jsonl(tmp_path / "logs" / f"{workload}-{len(rows)}.jsonl", rows)
    import_paths([str(f)], tmp_path / "home", classifier=Classifier(force=workload), **kw)


def test_sample_workload_writes_replay_set_and_manifest(tmp_path, caplog):
    rows = chat_rows(100, step=timedelta(minutes=10)) + chat_rows(5, chars=4000, prefix="long")
    rows += [dict(rows[0], timestamp=(T0 + timedelta(minutes=1)).isoformat())]  # same prompt again
    _import(tmp_path, rows)
    spec = load_spec(_spec(tmp_path, sample={"window_hours": 48}))
    with caplog.at_level(logging.INFO, logger="autotune"):
        out, mpath, s = sample_workload(tmp_path / "home", "code", spec=spec)
    assert out == Path(spec.replay.path) and mpath == Path(spec.replay.path + ".manifest.json")
    for p in (out, mpath, tmp_path / "home" / "traffic" / "code.jsonl"):
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    rs = _replayset.load(out)
    assert len(rs.requests) == 68 == spec.replay.warmup + 2 * spec.replay.requests
    assert all(r.tag == "code" and r.endpoint == "chat" for r in rs.requests)
    m = json.loads(mpath.read_text())
    assert m == read_manifest(out)
    assert m["content_hash"] == rs.digest and m["seed"] == 0 and m["workload"] == "code"
    assert m["skipped"]["duplicate"]["count"] == 1 and m["skipped"]["too_long"]["count"] == 5
    assert m["counts"]["pool"] == 106 and m["counts"]["eligible"] == 100
    assert m["context"]["max_model_len_from"] == "engine.serve_args.max_model_len"
    assert m["sources"]["pool"].endswith("traffic/code.jsonl")
    assert list(m["sources"]["sampled_from"].values()) == [68]
    assert m["acceptance_measurable"] is True and "warning" not in m
    assert m["window"]["window_hours"] == 48
    assert "SECRET" not in caplog.text and "lorem" not in caplog.text
    assert any("traffic sample code: 68 of 100" in r.getMessage() for r in caplog.records)
    # same pool + seed -> same file; another seed -> another sample
    again, _, _ = sample_workload(tmp_path / "home", "code", spec=spec, out=tmp_path / "again.jsonl")
    assert _replayset.load(again).digest == rs.digest
    other, _, _ = sample_workload(tmp_path / "home", "code", spec=spec, out=tmp_path / "o.jsonl", seed=5)
    assert _replayset.load(other).digest != rs.digest


def test_window_options(tmp_path):
    _import(tmp_path, chat_rows(48, step=timedelta(hours=1)))  # two days, hourly
    home, out = tmp_path / "home", tmp_path / "w.jsonl"
    t = T0.timestamp()
    cases = [  # (since, until, window_hours, eligible)
        (t + 10 * 3600, None, _UNSET, 38),            # --since alone: to the newest
        (t + 10 * 3600, None, 5.0, 5),                # --since + --window-hours
        (None, t + 10 * 3600, 4.0, 4),                # --until + --window-hours: the hours before
        (t, t + 3 * 3600, _UNSET, 3),                 # both
        (None, None, _UNSET, 24),                     # the default 24 h ending at the newest
        (None, None, None, 48),                       # no window (--all-time)
    ]
    for since, until, hours, eligible in cases:
        _, _, s = sample_workload(home, "code", out=out, n=100, since=since, until=until, window_hours=hours)
        assert s.manifest["counts"]["eligible"] == eligible, (since, until, hours)


def test_sample_redacts_with_spec_patterns(tmp_path):
    _import(tmp_path, chat_rows(10))
    spec = load_spec(_spec(tmp_path, redact=["SECRET-q\\d+"]))
    out, _, s = sample_workload(tmp_path / "home", "code", spec=spec, window_hours=None)
    text = out.read_text()
    assert "SECRET" not in text and text.count("[REDACTED]") == 10
    assert s.manifest["redaction_patterns"] == 1


def test_synthetic_trace_set_is_marked(tmp_path):
    trace = [{"timestamp": 1000 * i, "input_length": 50 + i, "output_length": 8, "hash_ids": [i]} for i in range(12)]
    _import(tmp_path, trace, workload="trace", options=ImportOptions(synthesize=True))
    out, mpath, s = sample_workload(tmp_path / "home", "trace", out=tmp_path / "trace.jsonl", n=10)
    m = json.loads(mpath.read_text())
    assert m["acceptance_measurable"] is False and m["synthetic_requests"] == 10
    assert "synthetic prompts" in m["warning"]
    rs = _replayset.load(out)
    assert all(len(r.body["prompt"].split()) == next(t["input_length"] for t in trace
                                                       if t["hash_ids"] == s.rows[k].synthetic["hash_ids"])
               for k, r in enumerate(rs.requests))


def test_sample_errors(tmp_path):
    with pytest.raises(SampleError, match="no traffic pool"):
        sample_workload(tmp_path / "home", "code", out=tmp_path / "x.jsonl")
    _import(tmp_path, chat_rows(3))
    with pytest.raises(SampleError, match="outside_window 3"):
        sample_workload(tmp_path / "home", "code", out=tmp_path / "x.jsonl",
                        since=T0.timestamp() + 86400, until=T0.timestamp() + 2 * 86400)
    with pytest.raises(SampleError, match="give --out or a study spec"):
        sample_workload(tmp_path / "home", "code")
    assert not (tmp_path / "x.jsonl").exists()


def test_tokenizer_counts_when_available(tmp_path):
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    model = tmp_path / "model"
    vocab = {"[UNK]": 0, "a": 1, "b": 2}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(model)
    counter = TokenCounter(str(model))
    assert counter.tokenizer is not None and "tokenizer" in counter.description
    # 1000 one-letter words: 2000 characters (~500 tokens by the estimate, which would fit 512),
    # 1000 tokens by the tokenizer (too long)
    long_row = _row(1, prompt="a " * 1000, max_tokens=8)
    long_row.endpoint, long_row.body = "completions", {"prompt": "a " * 1000, "max_tokens": 8}
    assert TokenCounter(use_tokenizer=False).fits(long_row, 512)
    assert not counter.fits(long_row, 512)
    short = _row(2, prompt="b b b", max_tokens=8)
    assert counter.fits(short, 512)
    assert counter.methods["tokenizer"] == 1 and counter.methods["bytes bound"] == 1


# ---- the replay-set reader ------------------------------------------------------------------
def test_replay_line_with_a_raw_line_separator_is_one_request(tmp_path):
    body = {"prompt": "first\u2028second\u2029third\x85fourth", "max_tokens": 4}
    p = tmp_path / "r.jsonl"
    p.write_text(json.dumps({"id": "a", "endpoint": "completions", "body": body}, ensure_ascii=False) + "\r\n"
                 + json.dumps({"id": "b", "endpoint": "completions", "body": {"prompt": "x"}}) + "\n",
                 encoding="utf-8")
    rs = _replayset.load(p)
    assert [r.id for r in rs.requests] == ["a", "b"] and rs.requests[0].body == body


def test_replay_set_not_utf8_names_file_and_line(tmp_path):
    p = tmp_path / "r.jsonl"
    good = json.dumps({"id": "a", "endpoint": "completions", "body": {"prompt": "x"}}).encode()
    p.write_bytes(good + b"\n\n" + good.replace(b'"x"', b'"\xc3("').replace(b'"a"', b'"b"') + b"\n")
    with pytest.raises(_replayset.ReplaySetError) as ei:
        _replayset.load(p)
    bad_at = good.index(b"\"x\"") + 2  # 1-based: the byte after the quote
    assert str(ei.value) == f"{p}:3: not UTF-8 (byte {bad_at} of the line)"


@pytest.mark.parametrize("line,why", [
    ('{"id": "a", "endpoint": "chat", "body": {"messages": "hi"}}', "'body.messages' must be a non-empty list"),
    ('{"id": "a", "endpoint": "completions", "body": {"prompt": 3}}', "'body.prompt' must be a string"),
    ('{"id": "a", "endpoint": "completions", "body": {"prompt": "x"}, "ts": "noon"}', "'ts' must be a number"),
    ('{"id": "a", "endpoint": "completions", "body": {"prompt": "x"}, "tag": [1]}', "'tag' must be a string"),
    ('{"id": {}, "endpoint": "completions", "body": {"prompt": "x"}}', "'id' must be a string"),
    ('{"id": "a", "endpoint": "completions", "body": {"prompt": "x"}, "n": ' + "9" * 5000 + "}", "not usable JSON"),
    ("[" * 100_000 + "]" * 100_000, "not usable JSON"),
])
def test_replay_line_of_the_wrong_shape_names_file_line_and_field(tmp_path, line, why):
    p = tmp_path / "r.jsonl"
    p.write_text(line + "\n")
    with pytest.raises(_replayset.ReplaySetError) as ei:
        _replayset.load(p)
    assert str(ei.value).startswith(f"{p}:1: ") and why in str(ei.value)
