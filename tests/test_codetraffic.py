"""Code-editing traffic from stdlib source (autotune.demo._codetraffic): deterministic, real
functions, and a gateway log that `autotune traffic import` / `sample` turn into a replay set."""

from __future__ import annotations

import ast
import re

import pytest
from click.testing import CliRunner

from autotune.cli._main import main
from autotune.demo import _codetraffic as ct
from autotune.demo import _demo
from autotune.traffic import _replayset


def _code(body: dict) -> str:
    return re.search(r"```python\n(.*)```", body["messages"][-1]["content"], re.DOTALL).group(1)


def test_requests_are_deterministic_edits_of_real_functions():
    a, b = ct.requests(30), ct.requests(30)
    assert a == b and ct.requests(30, seed=1) != a
    users = [r["messages"][-1]["content"] for r in a]
    assert len(set(users)) == 30
    kinds = {u.split()[0] for u in users}
    assert kinds >= {"Rename", "Add"}  # the edits take turns
    for r in a:
        assert [m["role"] for m in r["messages"]] == ["system", "user"]
        assert r["temperature"] == 0 and r["max_tokens"] == 96
        src = _code(r)
        tree = ast.parse(src)  # a whole function, as it is in the stdlib
        assert len(tree.body) == 1 and isinstance(tree.body[0], ast.FunctionDef)
        assert ct.MIN_LINES <= src.count("\n") <= ct.MAX_LINES
        ask = r["messages"][-1]["content"].split("\n")[0]
        named = re.findall(r"`([^`]+)`", ask)
        assert named and named[0] in src  # the edit names something that is in the function


def test_gateway_log_goes_through_traffic_import_and_sample(tmp_path):
    home = tmp_path / "home"
    log = ct.write_log(tmp_path / "logs" / "gw.jsonl.gz", "code-smollm2", 40)
    blob = log.read_bytes()
    assert ct.write_log(log, "code-smollm2", 40).read_bytes() == blob  # same input, same bytes

    run = CliRunner().invoke(main, ["traffic", "import", str(log), "--home", str(home)], catch_exceptions=False)
    assert run.exit_code == 0, run.output
    assert f"{log}: 40 lines, 40 imported (40 new, openai 40), 0 malformed" in run.output
    assert "workload code-smollm2: 40 imported (40 by tag)" in run.output
    out = tmp_path / "replay.jsonl"
    run = CliRunner().invoke(main, ["traffic", "sample", "--workload", "code-smollm2", "--out", str(out), "--n", "12",
                                    "--all-time", "--no-tokenizer", "--home", str(home)], catch_exceptions=False)
    assert run.exit_code == 0, run.output
    rs = _replayset.load(out)
    assert len(rs.requests) == 12 and rs.by_tag() == {"code-smollm2": 12}
    logged = {r["messages"][-1]["content"] for r in ct.requests(40)}
    for r in rs.requests:
        assert r.endpoint == "chat" and r.greedy and "model" not in r.body
        assert r.body["messages"][-1]["content"] in logged


def test_demo_writes_the_log_and_samples_its_replay_set(tmp_path):
    out = _demo.real_traffic(tmp_path, n_logged=30, n=10)
    assert out == tmp_path / "replay" / "code-smollm2.jsonl"
    assert len(_replayset.load(out).requests) == 10
    assert (tmp_path / "logs" / "gateway-code-smollm2.jsonl.gz").is_file()
    assert out.with_name(out.name + ".manifest.json").is_file()


def test_more_requests_than_functions_is_a_clear_error():
    with pytest.raises(ct.TrafficGenError, match=r"only \d+ stdlib functions .* 100000 requests need as many"):
        ct.requests(100_000)
    with pytest.raises(ct.TrafficGenError, match="at least 1"):
        ct.requests(0)
