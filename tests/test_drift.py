"""Drift check, realized vs predicted, and the commands around them (no vLLM server)."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from click.testing import CliRunner

from autotune.trust import _drift
from autotune.trust import _gate
from autotune.trust import _telemetry as tel
from autotune.cli._main import main
from autotune.traffic._replayset import ReplayRequest, save
from autotune.core._spec import DriftSpec

DATA = Path(__file__).parent / "data" / "telemetry"
NOW = dt.datetime(2026, 11, 30, 3, 0, tzinfo=dt.timezone.utc)


def reqs(n_code: int, n_chat: int, words: int = 40) -> list[ReplayRequest]:
    out = [ReplayRequest(id=f"code-{i}", endpoint="completions", tag="code",
                         body={"prompt": " ".join(["w1"] * words), "max_tokens": 8}) for i in range(n_code)]
    out += [ReplayRequest(id=f"chat-{i}", endpoint="chat", tag="chat",
                          body={"messages": [{"role": "user", "content": " ".join(["w2"] * words)}]})
            for i in range(n_chat)]
    return out


def spec(**drift) -> SimpleNamespace:
    return SimpleNamespace(drift=DriftSpec(**drift), model="/m/target",
                           engine=SimpleNamespace(serve_args={"max_model_len": 512}))


def bundle(before="before.prom", after="after_code.prom") -> dict:
    return tel.bundle((DATA / before).read_text(), (DATA / after).read_text(), source=f"{before}->{after}")


def rec_for(requests, telemetry: dict | None = None, expires: dt.datetime | None = None) -> dict:
    prod = _gate.production_figures(telemetry["derived"]) if telemetry else None
    return {"id": "r1", "workload": "code", "decision": "keep",
            "speculative_config": {"method": "ngram", "num_speculative_tokens": 4},
            "expires_at": (expires or NOW + dt.timedelta(days=7)).isoformat(),
            "traffic": _drift.traffic_profile(requests),
            "engine": _drift.engine_fingerprint("/m/target", "0.32.0+cpu", {"max_model_len": 512}),
            "fidelity": {"checked": True, "passed": True, "production": prod} if prod else {"checked": False}}


def test_traffic_profile_counts_tags_and_prompt_words():
    p = _drift.traffic_profile(reqs(8, 2, words=10))
    assert p["requests"] == 10 and p["tag_shares"] == {"chat": 0.2, "code": 0.8}
    assert p["prompt_words"]["p50"] == 10


def test_unchanged_traffic_needs_no_retune():
    b = bundle()
    r = _drift.check_drift(spec(), rec_for(reqs(8, 2), b), reqs(8, 2), b, "0.32.0+cpu", now=NOW)
    assert not r["retune"], r["reasons"]
    lines = _drift.drift_lines(r)
    assert lines[0].startswith("no retune needed: traffic 10 requests (chat 0.20, code 0.80)")
    assert "acceptance length" in lines[1] and "K=4" in lines[1]


def test_mix_change_says_which_tag_moved():
    r = _drift.check_drift(spec(), rec_for(reqs(8, 2)), reqs(7, 13), None, "0.32.0+cpu", now=NOW)
    assert r["retune"]
    assert _drift.drift_lines(r) == ["retune: mix changed (code share 0.80 -> 0.35, chat share 0.20 -> 0.65)"]


def test_prompt_lengths_expiry_and_engine():
    old = rec_for(reqs(8, 2), expires=NOW - dt.timedelta(hours=1))
    s = spec()
    s.engine.serve_args = {"max_model_len": 1024}
    r = _drift.check_drift(s, old, reqs(8, 2, words=80), None, "0.33.0", now=NOW)
    text = _drift.drift_lines(r)[0]
    assert "recommendation expired" in text
    assert "engine changed (vLLM 0.32.0+cpu -> 0.33.0)" in text
    assert "engine changed (serve args max_model_len)" in text
    assert "prompt lengths changed (p50 40 -> 80 words, +100%; p90 40 -> 80 words, +100%)" in text


def test_acceptance_moved_in_production():
    code, chat = bundle(), bundle("after_code.prom", "after_chat.prom")
    r = _drift.check_drift(spec(), rec_for(reqs(8, 2), code), reqs(8, 2), chat, "0.32.0+cpu", now=NOW)
    assert r["retune"]
    assert any(x.startswith("acceptance length changed (") and "at K=4" in x for x in r["reasons"])
    assert any(x.startswith("tokens per step changed (") for x in r["reasons"])


def test_no_recommendation_means_retune():
    r = _drift.check_drift(spec(), None, reqs(1, 0), None, None, now=NOW)
    assert r["retune"] and r["reasons"] == ["no recommendation yet"]


def test_realized_within_and_flagged():
    code = bundle()
    d = code["derived"]
    pred = {"tpot_p50": d["tpot_ms"]["p50"], "tpot_p90": d["tpot_ms"]["p90"], "acceptance_length": d["acceptance_length"],
            "tokens_per_step": d["tokens_per_step"], "deployed_k": 4}
    canary = {"tpot_ms_p50": [pred["tpot_p50"] * 0.75, pred["tpot_p50"] * 1.25],
              "tpot_ms_p90": [pred["tpot_p90"] * 0.65, pred["tpot_p90"] * 1.35],
              "acceptance_length": [pred["acceptance_length"] * 0.9, pred["acceptance_length"] * 1.1],
              "tokens_per_step": [pred["tokens_per_step"] * 0.9, pred["tokens_per_step"] * 1.1]}
    rec = {"id": "r1", "predicted": pred, "canary": canary}
    res = _drift.realized(rec, {"recommendation": "r1", "deployed_at": "x"}, code)
    assert not res["gap_flagged"] and all(r["gap"] == pytest.approx(0) for r in res["rows"] if r["predicted"])
    assert {r["figure"] for r in res["rows"] if r["predicted"] is None} == {"tpot_ms_mean"}  # not predicted here
    res = _drift.realized(rec, None, bundle("after_code.prom", "after_chat.prom"))
    assert res["gap_flagged"]
    assert any(f.startswith("acceptance_length: production") for f in res["flagged"])
    assert res["notes"] and "no deploy mark" in res["notes"][0]
    assert any("LARGE GAP" in line for line in _drift.realized_lines(res))


@pytest.fixture
def workload(tmp_path, monkeypatch):
    """A spec, its replay set, a production telemetry bundle and a recommendation made on them."""
    monkeypatch.setattr("autotune.ops._runner.installed_vllm_version", lambda spec: "0.32.0+cpu")
    rs = save(tmp_path / "code.jsonl", reqs(8, 2))
    prod = tel.save(tmp_path / "prod.json", bundle())
    (tmp_path / "code.yaml").write_text(yaml.safe_dump({
        "workload": "code", "model": "/m/target", "replay": {"path": str(rs), "concurrency": 4},
        "engine": {"serve_args": {"max_model_len": 512}}, "recommendations_dir": str(tmp_path / "rec"),
        "production": {"telemetry": str(prod)}}))
    rec = {**rec_for(reqs(8, 2), tel.load(prod)), "workload": "code",
           "expires_at": (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=7)).isoformat()}
    d = tel.load(prod)["derived"]
    rec["predicted"] = {"tpot_p50": d["tpot_ms"]["p50"], "tpot_p90": d["tpot_ms"]["p90"],
                        "acceptance_length": d["acceptance_length"], "tokens_per_step": d["tokens_per_step"],
                        "deployed_k": 4}
    (tmp_path / "rec").mkdir()
    (tmp_path / "rec" / "code.json").write_text(json.dumps(rec))
    return tmp_path


def test_cli_drift_check_exit_codes(workload):
    spec_path = str(workload / "code.yaml")
    r = CliRunner().invoke(main, ["drift", "check", "code", "--spec", spec_path])
    assert r.exit_code == 0, r.output
    assert r.output.startswith("no retune needed")
    save(workload / "mixed.jsonl", reqs(3, 7))
    r = CliRunner().invoke(main, ["drift", "check", "code", "--spec", spec_path, "--replay", str(workload / "mixed.jsonl")])
    assert r.exit_code == 1, r.output
    assert r.output.startswith("retune: mix changed (code share 0.80 -> 0.30, chat share 0.20 -> 0.70)")
    checks = (workload / "rec" / "history" / "code" / "checks.jsonl").read_text().splitlines()
    assert [json.loads(c)["retune"] for c in checks] == [False, True]
    r = CliRunner().invoke(main, ["drift", "check", "code", "--spec", spec_path, "--replay", str(workload / "no.jsonl")])
    assert r.exit_code == 2 and "cannot read replay set" in r.output


def test_cli_mark_deployed_then_check(workload):
    spec_path = str(workload / "code.yaml")
    r = CliRunner().invoke(main, ["recommend", "mark-deployed", "code", "--spec", spec_path, "--note", "canary-1"])
    assert r.exit_code == 0, r.output
    assert "marked deployed" in r.output
    assert json.loads((workload / "rec" / "code.deployed.json").read_text())["recommendation"] == "r1"
    r = CliRunner().invoke(main, ["recommend", "check", "code", "--spec", spec_path, "--telemetry",
                                  str(workload / "prod.json")])
    assert r.exit_code == 0, r.output  # no canary ranges in this file: gaps shown, none flagged
    assert "acceptance_length" in r.output and "gap" in r.output
    chat = tel.save(workload / "chat.json", bundle("after_code.prom", "after_chat.prom"))
    rec = json.loads((workload / "rec" / "code.json").read_text())
    rec["canary"] = {"acceptance_length": [rec["predicted"]["acceptance_length"] * 0.9,
                                           rec["predicted"]["acceptance_length"] * 1.1]}
    (workload / "rec" / "code.json").write_text(json.dumps(rec))
    r = CliRunner().invoke(main, ["recommend", "check", "code", "--spec", spec_path, "--telemetry", str(chat)])
    assert r.exit_code == 1, r.output
    assert "LARGE GAP: acceptance_length: production" in r.output


def test_daemon_skips_the_study_only_when_opted_in_and_nothing_drifted(workload):
    from autotune.ops._daemon import Daemon
    from autotune.core._settings import Settings
    from autotune.core._spec import load_spec

    said = []
    d = Daemon(Settings(home=str(workload / "home")), echo=lambda m, err=False: said.append(m))
    spec = load_spec(workload / "code.yaml")
    d.specs["code"] = spec
    assert d.no_retune_needed("code") is False and not said  # default: the study runs every night
    d.specs["code"] = spec.model_copy(update={"drift": spec.drift.model_copy(update={"skip_unless_drift": True})})
    assert d.no_retune_needed("code") is True
    assert any("[code] no retune needed: traffic 10 requests" in m for m in said)
    save(workload / "code.jsonl", reqs(2, 8))  # tonight's traffic is mostly chat
    said.clear()
    assert d.no_retune_needed("code") is False
    assert any("[code] retune: mix changed (code share 0.80 -> 0.20, chat share 0.20 -> 0.80)" in m for m in said)


def test_realized_does_not_judge_a_quantile_the_canary_left_unresolved():
    code = bundle()
    d = code["derived"]
    pred = {"tpot_p50": d["tpot_ms"]["p50"] * 3, "tpot_p90": d["tpot_ms"]["p90"], "deployed_k": 4}
    canary = {"tpot_ms_p50": None, "tpot_ms_p90": [pred["tpot_p90"] * 0.65, pred["tpot_p90"] * 1.35],
              "unresolved": {"tpot_ms_p50": "falls in production's 0-10 ms histogram bucket"}}
    res = _drift.realized({"id": "r1", "predicted": pred, "canary": canary}, {"recommendation": "r1"}, code)
    rows = {r["figure"]: r for r in res["rows"]}
    assert rows["tpot_ms_p50"]["ok"] is None and rows["tpot_ms_p50"]["unresolved"] and not res["gap_flagged"]
    assert rows["tpot_ms_p90"]["ok"] is True
    lines = _drift.realized_lines(res)
    assert any("unresolved" in x and "tpot_ms_p50" in x for x in lines)
    assert any(x.startswith("  note: tpot_ms_p50: falls in") for x in lines)
    # the same figures with a range: the 3x gap is flagged
    canary["tpot_ms_p50"] = [pred["tpot_p50"] * 0.75, pred["tpot_p50"] * 1.25]
    del canary["unresolved"]
    res = _drift.realized({"id": "r1", "predicted": pred, "canary": canary}, {"recommendation": "r1"}, code)
    assert res["gap_flagged"] and any(f.startswith("tpot_ms_p50") for f in res["flagged"])
