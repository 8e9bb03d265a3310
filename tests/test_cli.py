"""The command line: exit codes and messages for bad input, and reading recommendations.
Nothing here starts vLLM: every invocation fails (or finishes) before a server would start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from autotune.cli._main import EXIT_INPUT, main
from autotune.decide._recommend import SCHEMA, write_atomic

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ROOT / "studies"


@pytest.fixture
def env(tmp_path, monkeypatch) -> dict:
    for var in ("AUTOTUNE__STORAGE", "AUTOTUNE__VLLM_COMMAND", "AUTOTUNE__VLLM_PYTHON"):
        monkeypatch.delenv(var, raising=False)
    recs = tmp_path / "recs"
    recs.mkdir()
    e = {"AUTOTUNE__STUDIES_DIR": str(STUDIES), "AUTOTUNE__RECOMMENDATIONS_DIR": str(recs),
         "AUTOTUNE__HOME": str(tmp_path / "home")}
    for k, v in e.items():
        monkeypatch.setenv(k, v)
    monkeypatch.chdir(tmp_path)
    return e


def _run(*args):
    return CliRunner().invoke(main, list(args), catch_exceptions=False)


def test_help():
    r = _run("--help")
    assert r.exit_code == 0
    for cmd in ("study", "recommend", "demo", "probe"):
        assert cmd in r.output
    r = _run("study", "start", "--help")
    assert r.exit_code == 0 and "--workload" in r.output and "--spec" in r.output


def test_study_start_unknown_workload(env):
    r = _run("study", "start", "--workload", "nosuch")
    assert r.exit_code == EXIT_INPUT == 2
    assert "error: no study spec for workload 'nosuch'" in r.output
    assert "known: chat, chat-llamacpp, chat-smollm2, code, code-llamacpp, code-smollm2, mixed-smollm2, random" in r.output


def test_study_start_invalid_spec_names_file_and_field(env, tmp_path):
    text = (STUDIES / "code.yaml").read_text().replace("k: {min: 1, max: 8}", "k: {min: 9, max: 8}")
    assert "min: 9" in text
    bad = tmp_path / "bad-code.yaml"
    bad.write_text(text)
    line = next(i + 1 for i, ln in enumerate(text.splitlines()) if "k: {min: 9" in ln)
    r = _run("study", "start", "--workload", "code", "--spec", str(bad))
    assert r.exit_code == 2
    assert f"{bad}:{line}: field 'space.k': min (9) > max (8)" in r.output
    assert not (tmp_path / "home").exists()  # failed before the probe or any server


def test_study_start_spec_for_another_workload(env):
    r = _run("study", "start", "--workload", "chat", "--spec", str(STUDIES / "code.yaml"))
    assert r.exit_code == 2
    assert "field 'workload' is 'code', not 'chat'" in r.output


def test_study_start_missing_spec_file(env, tmp_path):
    r = _run("study", "start", "--workload", "code", "--spec", str(tmp_path / "gone.yaml"))
    assert r.exit_code == 2
    assert str(tmp_path / "gone.yaml") in r.output and "cannot read study spec" in r.output


def test_recommend_show_without_recommendation(env):
    r = _run("recommend", "show", "code")
    assert r.exit_code == 2
    assert "no recommendation for workload 'code'" in r.output
    assert str(Path(env["AUTOTUNE__RECOMMENDATIONS_DIR"]) / "code.json") in r.output


def test_recommend_show_unknown_workload(env):
    r = _run("recommend", "show", "nosuch")
    assert r.exit_code == 2 and "no study spec for workload 'nosuch'" in r.output


def _rec(decision="change", config=None, speedup=True) -> dict:
    config = config if config is not None else {"method": "ngram", "num_speculative_tokens": 4,
                                                "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    args = ["--speculative-config", json.dumps(config, sort_keys=True)] if config else []
    ev = {"statistic": "median", "baseline": {"tpot_ms": 30.0}}
    if speedup:
        ev.update(speedup=3.0, speedup_ci=[2.9, 3.1], confidence=0.95, winner={"tpot_ms": 10.0, "config": config})
    return {"schema": SCHEMA, "workload": "code", "decision": decision,
            "reason": "ngram K=4 is 3.00x faster in median TPOT than no speculation",
            "speculative_config": config or None, "vllm_serve_args": args, "evidence": ev,
            "study": {"name": "autotune-code-0123abcd", "server_starts": 7},
            "created_at": "2025-05-01T03:00:00+00:00", "expires_at": "2025-05-08T03:00:00+00:00"}


def test_recommend_show_prints_the_decision(env):
    write_atomic(Path(env["AUTOTUNE__RECOMMENDATIONS_DIR"]) / "code.json", _rec())
    r = _run("recommend", "show", "code")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert lines[0] == "code: change — ngram K=4 is 3.00x faster in median TPOT than no speculation"
    assert "add to vllm serve:  --speculative-config " \
           "'{\"method\": \"ngram\", \"num_speculative_tokens\": 4, \"prompt_lookup_max\": 4, " \
           "\"prompt_lookup_min\": 2}'" in r.output
    assert "winner vs no speculation: speedup 3.00x, 95% CI 2.90-3.10" in r.output
    assert "median TPOT: no speculation 30.00 ms, winner 10.00 ms" in r.output
    assert "study autotune-code-0123abcd: 7 server starts" in r.output
    assert "expires 2025-05-08T03:00:00+00:00" in r.output


def test_recommend_show_keep_without_speculation(env):
    write_atomic(Path(env["AUTOTUNE__RECOMMENDATIONS_DIR"]) / "code.json", _rec("keep", config={}, speedup=False))
    r = _run("recommend", "show", "code")
    assert r.exit_code == 0, r.output
    assert r.output.startswith("code: keep — ")
    assert "speculative_config: null" in r.output
    assert "add to vllm serve:  (nothing)" in r.output
    assert "speedup" not in r.output


def test_recommend_show_json_prints_the_file(env):
    rec = _rec()
    write_atomic(Path(env["AUTOTUNE__RECOMMENDATIONS_DIR"]) / "code.json", rec)
    r = _run("recommend", "show", "code", "--json")
    assert r.exit_code == 0
    assert json.loads(r.output) == rec
