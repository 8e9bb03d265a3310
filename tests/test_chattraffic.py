"""Chat and mixed traffic for the real model (autotune.demo._chattraffic): deterministic, real
prose to summarise, and gateway logs that `traffic import` / `sample` turn into one replay set per
workload."""

from __future__ import annotations

import ast
import importlib.util
import re

import pytest

from autotune.demo import _chattraffic as chat
from autotune.demo import _codetraffic as ct
from autotune.demo import _demo
from autotune.traffic import _replayset


def _user(body: dict) -> str:
    return body["messages"][-1]["content"]


def test_chat_requests_are_deterministic_distinct_and_take_turns():
    a = chat.requests(60)
    assert a == chat.requests(60) and a != chat.requests(60, seed=1)
    users = [_user(b) for b in a]
    assert len(set(users)) == 60
    for i, b in enumerate(a):
        assert [m["role"] for m in b["messages"]] == ["user"]
        assert b["temperature"] == 0 and b["max_tokens"] == 96
        kind = chat.KINDS[i % 3]
        if kind == "summary":
            ask, para = _user(b).split("\n\n", 1)
            assert ask in chat._SUMMARY and chat.MIN_CHARS <= len(para) <= chat.MAX_CHARS
        else:
            assert "\n" not in _user(b)  # a question, no text to copy from


def test_summaries_quote_real_stdlib_prose():
    """Each paragraph is a docstring paragraph of a stdlib module, whitespace joined."""
    docs = []
    for name in ("textwrap", "shlex", "difflib", "statistics", "logging", "threading", "uuid", "csv"):
        spec = importlib.util.find_spec(name)
        tree = ast.parse(open(spec.origin, encoding="utf-8").read())
        docs += [" ".join((ast.get_docstring(n) or "").split()) for n in ast.walk(tree)
                 if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef))]
    corpus = "\n".join(docs)
    paras = chat.paragraphs()
    assert len(paras) >= 100 and len(set(paras)) == len(paras)
    found = [p for p in paras if " ".join(p.split()) in corpus]
    assert len(found) >= 20  # from the modules read here; the rest come from the other modules
    for p in paras:
        assert ">>>" not in p and chat.MIN_CHARS <= len(p) <= chat.MAX_CHARS


def test_mixed_traffic_holds_both_kinds_in_seeded_order():
    m = chat.mixed_requests(80)
    assert m == chat.mixed_requests(80) and len({str(b) for b in m}) == 80
    code = [b for b in m if b["messages"][0]["role"] == "system"]
    assert 0.3 <= len(code) / 80 <= 0.7
    assert all(re.search(r"```python\n", _user(b)) for b in code)
    assert [_user(b) for b in code] == [_user(b) for b in ct.requests(len(code))]
    assert all(b["messages"][0]["role"] == "system" for b in chat.mixed_requests(10, code_share=1.0))
    with pytest.raises(ct.TrafficGenError, match="code_share must be between 0 and 1, not 1.5"):
        chat.mixed_requests(10, code_share=1.5)
    with pytest.raises(ct.TrafficGenError, match="at least 1"):
        chat.requests(0)


@pytest.mark.parametrize("workload", ["chat-smollm2", "mixed-smollm2"])
def test_demo_writes_each_workloads_log_and_replay_set(tmp_path, workload):
    _demo.real_traffic(tmp_path, n_logged=30, n=10, workload="code-smollm2")
    out = _demo.real_traffic(tmp_path, n_logged=30, n=10, workload=workload)
    assert out == tmp_path / "replay" / f"{workload}.jsonl"
    rs = _replayset.load(out)
    assert len(rs.requests) == 10 and rs.by_tag() == {workload: 10}  # its own pool, not code's
    logged = {_user(b) for b in _demo.REAL_TRAFFIC[workload](30)}
    assert {_user(r.body) for r in rs.requests} <= logged
    assert (tmp_path / "logs" / f"gateway-{workload}.jsonl.gz").is_file()
    code = _replayset.load(tmp_path / "replay" / "code-smollm2.jsonl")
    assert code.by_tag() == {"code-smollm2": 10}


def test_demo_traffic_for_an_unknown_workload_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no demo traffic for workload 'poems'; one of code-smollm2, chat-smollm2"):
        _demo.real_traffic(tmp_path, workload="poems")
