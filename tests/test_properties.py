"""Property tests: whatever bytes a study spec, a traffic log or a replay set holds, reading it
ends in a result or in the reader's own error naming the file (and the line), never another
exception and never a hang. Bounded examples and a per-example deadline keep the whole file to
seconds; hypothesis shrinks any failure to the smallest input that shows it."""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autotune.core._spec import SpecError, StudySpec, load_spec
from autotune.traffic import _replayset
from autotune.traffic._traffic import ImportOptions, TrafficError, import_paths

FAST = settings(max_examples=100, deadline=2000, suppress_health_check=[HealthCheck.too_slow])

# JSON-like values, with the shapes readers meet: strings (line separators and NULs included),
# numbers at the edges, nesting
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(10 ** 30), max_value=10 ** 30),
                    st.floats(allow_nan=False), st.text(max_size=20))
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=12)


def _keyed(keys: list[str]):
    """Objects whose keys are mostly the ones a reader looks for, with any values."""
    return st.dictionaries(st.one_of(st.sampled_from(keys), st.text(max_size=6)), VALUES, max_size=len(keys) + 2)


_ROOT: list[Path] = []


@pytest.fixture(autouse=True, scope="module")
def _examples_root(tmp_path_factory):
    """One pytest temp folder for all examples (pytest prunes old ones), not thousands in /tmp."""
    _ROOT.append(tmp_path_factory.mktemp("examples"))
    yield
    _ROOT.pop()


def _file(data: bytes, name: str) -> Path:
    d = Path(tempfile.mkdtemp(prefix="x", dir=_ROOT[-1]))
    p = d / name
    p.write_bytes(data)
    return p


# ---- the spec loader ---------------------------------------------------------------------------
SPEC_KEYS = ["workload", "model", "replay", "space", "budget", "objective", "engine", "storage", "incumbent",
             "traffic", "schedule", "drift", "production", "benchmark", "seed"]
REPLAY_KEYS = ["path", "concurrency", "requests", "warmup", "mode", "levels", "level_weights", "windows"]


def _spec_texts():
    """Raw bytes and text, and specs that are mostly valid: the required fields right, any
    others drawn from the spec's own field names with any values."""
    replay = st.fixed_dictionaries({"path": st.text(min_size=1, max_size=10),
                                    "concurrency": st.integers(min_value=-1, max_value=64)},
                                   optional={k: VALUES for k in REPLAY_KEYS[2:]})
    top = st.fixed_dictionaries({"workload": st.from_regex(r"[a-z][a-z0-9_.-]{0,8}", fullmatch=True),
                                 "model": st.text(min_size=1, max_size=12), "replay": replay},
                                optional={k: VALUES for k in SPEC_KEYS[3:]})
    structured = top.map(lambda d: yaml.safe_dump(d, allow_unicode=True))
    return st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode),
                     structured.map(str.encode))


def _check_spec(data: bytes) -> None:
    p = _file(data, "spec.yaml")
    try:
        spec = load_spec(p)
    except SpecError as e:
        msg = str(e)
        assert msg.startswith(str(p)), msg
        assert re.match(rf"{re.escape(str(p))}(:\d+)?: ", msg), msg
    else:
        assert isinstance(spec, StudySpec)


@FAST
@given(_spec_texts())
def test_any_spec_bytes_load_or_fail_naming_the_file(data):
    _check_spec(data)


@FAST
@given(st.binary(min_size=1, max_size=8), st.integers(min_value=0, max_value=60))
def test_a_valid_spec_with_bytes_spliced_in_loads_or_fails_naming_the_file(junk, at):
    text = (Path(__file__).resolve().parent.parent / "studies" / "code.yaml").read_bytes()
    at = min(at * len(text) // 60, len(text))
    _check_spec(text[:at] + junk + text[at:])


# ---- the traffic readers -----------------------------------------------------------------------
LOG_KEYS = ["messages", "prompt", "model", "timestamp", "ts", "created_at", "request", "body", "response",
            "status", "url", "workload", "tag", "usage", "output_tokens", "input_length", "output_length",
            "hash_ids", "max_tokens", "temperature"]


def _log_lines():
    """Lines of every format, mostly well-formed (so imports succeed and the pool writer runs),
    with any values in the optional fields, beside lines of any keys and of raw bytes."""
    extra = {k: VALUES for k in ("timestamp", "model", "workload", "usage", "status", "url", "max_tokens")}
    message = st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "assistant"]),
                                     "content": st.one_of(st.text(max_size=30), VALUES)})
    chat = st.fixed_dictionaries({"messages": st.lists(message, min_size=1, max_size=3)}, optional=extra)
    completion = st.fixed_dictionaries({"prompt": st.one_of(st.text(min_size=1, max_size=30), VALUES)},
                                       optional=extra)
    bench = st.fixed_dictionaries({"prompt": st.text(max_size=30),
                                   "output_tokens": st.one_of(st.integers(-2, 64), VALUES)})
    trace = st.fixed_dictionaries({"input_length": st.integers(-2, 4000), "output_length": st.integers(-2, 64)},
                                  optional={"timestamp": VALUES, "hash_ids": st.lists(st.integers(0, 9), max_size=4)})
    wrapped = st.one_of(chat, completion).flatmap(lambda body: st.sampled_from([
        {"request": {"body": body}}, {"body": json.dumps(body)}, {"payload": body}, {"request": body}]))
    objects = st.one_of(chat, completion, bench, trace, wrapped, _keyed(LOG_KEYS))
    line = objects.map(lambda o: json.dumps(o, ensure_ascii=False).encode())
    return st.lists(st.one_of(line, line, line, st.binary(max_size=60)), min_size=1, max_size=8).map(b"\n".join)


@FAST
@given(st.one_of(_log_lines(), st.binary(max_size=400)), st.sampled_from(["auto", "openai", "bench", "mooncake"]),
       st.booleans())
def test_any_log_bytes_import_with_a_report_or_fail_cleanly(data, fmt, synthesize):
    log = _file(data, "gw.jsonl")
    home = log.parent / "home"
    try:
        report = import_paths([str(log)], home, fmt=fmt, options=ImportOptions(synthesize=synthesize))
    except TrafficError as e:
        assert "nothing usable" in str(e), str(e)
        assert not (home / "traffic").exists() or not list((home / "traffic").glob("*.jsonl"))
        return
    assert report.usable > 0 and report.lines >= report.usable + report.malformed
    for line, why in report.files[0].malformed:  # file:line reasons, never the line's text
        assert line >= 1 and why
    for pool in report.pools.values():  # every pool line is whole: a request a replay set can hold
        for i, line in enumerate(pool.read_text(encoding="utf-8").split("\n"), 1):
            if line and not json.loads(line).get("synthetic"):  # synthetic rows get their prompt when sampled
                _replayset.parse_line(line, f"{pool}:{i}")


# ---- the replay-set reader ---------------------------------------------------------------------
def _replay_lines():
    req = st.fixed_dictionaries({"id": VALUES, "endpoint": st.sampled_from(["chat", "completions", "x"]),
                                 "body": _keyed(["prompt", "messages", "max_tokens", "temperature"])},
                                optional={"tag": VALUES, "ts": VALUES})
    line = req.map(lambda o: json.dumps(o, ensure_ascii=False).encode())
    return st.lists(st.one_of(line, st.binary(max_size=40)), min_size=1, max_size=6).map(b"\n".join)


@FAST
@given(st.one_of(_replay_lines(), st.binary(max_size=300)))
def test_any_replay_set_bytes_load_or_fail_naming_file_and_line(data):
    p = _file(data, "replay.jsonl")
    try:
        rs = _replayset.load(p)
    except _replayset.ReplaySetError as e:
        msg = str(e)
        assert re.match(rf"{re.escape(str(p))}(:\d+)?: ", msg), msg
    else:
        assert rs.requests and all(r.endpoint in _replayset.ENDPOINTS for r in rs.requests)
        assert len({r.id for r in rs.requests}) == len(rs.requests)


# ---- the same through the command line: exit 2 (or 0 with a report), one error line -------------
CLI = settings(max_examples=30, deadline=4000, suppress_health_check=[HealthCheck.too_slow])


def _invoke(args: list[str], env: dict):
    from click.testing import CliRunner

    from autotune.cli._main import main

    return CliRunner().invoke(main, args, env=env)


@CLI
@given(_spec_texts())
def test_study_start_on_any_spec_bytes_exits_2_naming_the_file(data):
    p = _file(data, "code.yaml")
    r = _invoke(["study", "start", "--workload", "code", "--spec", str(p)],
                {"AUTOTUNE__HOME": str(p.parent / "home"), "AUTOTUNE__STORAGE": None})
    assert (r.exit_code, type(r.exception)) == (2, SystemExit), r.output
    assert r.output.startswith(f"error: {p}"), r.output


@CLI
@given(st.one_of(_log_lines(), st.binary(max_size=300)))
def test_traffic_import_of_any_bytes_reports_or_exits_2(data):
    log = _file(data, "gw.jsonl")
    r = _invoke(["traffic", "import", "--home", str(log.parent / "home"), "--studies-dir", str(log.parent),
                 str(log)], {})
    assert type(r.exception) in (SystemExit, type(None)) and r.exit_code in (0, 2), r.output
    if r.exit_code == 2:
        assert r.output.startswith("error: nothing usable in 1 file(s)"), r.output
    else:
        assert r.output.startswith(f"{log}: ") and " imported (" in r.output
    for line in r.output.splitlines():
        if line.startswith(f"  {log}:"):
            assert re.match(rf"  {re.escape(str(log))}:\d+: \S", line), line
