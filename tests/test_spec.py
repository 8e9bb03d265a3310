"""Study specs: the shipped ones validate, paths resolve against the spec's folder, and an invalid
spec fails with a message that names the file, the dotted field and the line."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.core._spec import SpecError, find_spec, load_spec

ROOT = Path(__file__).resolve().parent.parent
STUDIES = ROOT / "studies"

VALID = """\
workload: w
model: org/some-model
replay:
  path: replay.jsonl
  concurrency: 2
"""


def _write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    p = tmp_path / name
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text)
    return p


def _line(text: str, needle: str) -> int:
    """1-based number of the (only) line of ``text`` that contains ``needle``."""
    hits = [i + 1 for i, ln in enumerate(text.splitlines()) if needle in ln]
    assert len(hits) == 1, (needle, hits)
    return hits[0]


def _spec_error(path: Path) -> str:
    with pytest.raises(SpecError) as ei:
        load_spec(path)
    return str(ei.value)


# --------------------------------------------------------------------------- shipped specs


@pytest.mark.parametrize("workload", ["code-smollm2", "chat-smollm2", "mixed-smollm2"])
def test_real_model_specs_differ_only_in_their_traffic(workload, tmp_path, monkeypatch):
    """The three SmolLM2 workloads search the same space on the same server: only the replay set
    (its own gateway log and pool) and the study differ, so their grids compare."""
    monkeypatch.chdir(tmp_path)
    spec = load_spec(STUDIES / f"{workload}.yaml")
    code = load_spec(STUDIES / "code-smollm2.yaml")
    assert spec.workload == workload and spec.study_name == f"autotune-{workload}"
    assert spec.replay.path == str(ROOT / ".autotune" / "replay" / f"{workload}.jsonl")
    assert spec.model == str(ROOT / ".autotune" / "models" / "smollm2-135m")
    strip = {"workload", "replay", "source"}
    assert spec.model_dump(exclude=strip) == code.model_dump(exclude=strip)
    assert spec.replay.model_dump(exclude={"path"}) == code.replay.model_dump(exclude={"path"})


@pytest.mark.parametrize("workload", ["code", "chat", "random"])
def test_shipped_specs_validate_and_resolve_paths(workload, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # resolution must not depend on the working directory
    spec = load_spec(STUDIES / f"{workload}.yaml")
    assert spec.workload == workload
    assert spec.study_name == f"autotune-{workload}"
    assert spec.source == str(STUDIES / f"{workload}.yaml")
    assert spec.replay.path == str(ROOT / ".autotune" / "replay" / f"{workload}.jsonl")
    assert spec.model == str(ROOT / ".autotune" / "models" / ("random" if workload == "random" else "target"))
    assert spec.engine.command == [str(ROOT / ".venv" / "bin" / "vllm"), "serve"]
    assert spec.engine.env["TMPDIR"] == str(ROOT / ".autotune" / "tmp")
    assert spec.engine.env["VLLM_CACHE_ROOT"] == str(ROOT / ".autotune" / "cache" / "vllm")
    assert spec.engine.env["VLLM_TARGET_DEVICE"] == "cpu"  # not a path: left alone
    assert spec.storage == f"sqlite:///{ROOT / '.autotune' / 'autotune.db'}"
    assert spec.recommendations_dir == str(ROOT / "recommendations")
    assert "speculative_config" not in spec.engine.serve_args
    if "draft_model" in spec.space.methods:
        assert spec.space.draft_models == [str(ROOT / ".autotune" / "models" / "draft-60")]


def test_relative_paths_env_and_storage_resolve_against_spec_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOTUNE_TEST_PREFIX", "/opt/x")
    monkeypatch.chdir("/")
    text = VALID + """\
space:
  methods: [draft_model]
  draft_models: [../drafts/d1, org/hf-draft]
engine:
  command: [./bin/vllm, serve]
  python: ../py/bin/python
  env:
    DOT: ./data
    DOTDOT: ../up/cache
    PLAIN: cpu
    VAR: $AUTOTUNE_TEST_PREFIX/y
    ABS: /already/abs
storage: sqlite:///../x.db
recommendations_dir: ../recs
"""
    spec = load_spec(_write(tmp_path, text, "sub/spec.yaml"))
    sub = tmp_path / "sub"
    assert spec.storage == "sqlite:///" + str(tmp_path / "x.db")
    assert spec.storage.startswith("sqlite:////")  # an absolute sqlite URL
    assert spec.replay.path == str(sub / "replay.jsonl")
    assert spec.recommendations_dir == str(tmp_path / "recs")
    assert spec.engine.command == [str(sub / "bin" / "vllm"), "serve"]
    assert spec.engine.python == str(tmp_path / "py" / "bin" / "python")
    assert spec.engine.env == {
        "DOT": str(sub / "data"),
        "DOTDOT": str(tmp_path / "up" / "cache"),
        "PLAIN": "cpu",
        "VAR": "/opt/x/y",
        "ABS": "/already/abs",
    }
    assert spec.space.draft_models[0] == str(tmp_path / "drafts" / "d1")
    # a Hugging Face id that is not a local path stays a model id
    assert spec.model == "org/some-model"


@pytest.mark.parametrize("url", ["sqlite:////abs/a.db", "postgresql://u@db/optuna"])
def test_storage_urls_that_are_not_relative_sqlite_paths_are_kept(tmp_path, url):
    spec = load_spec(_write(tmp_path, VALID + f"storage: {url}\n"))
    assert spec.storage == url


def test_default_engine_command_is_not_resolved_as_a_path(tmp_path):
    spec = load_spec(_write(tmp_path, VALID))
    assert spec.engine.command == ["vllm", "serve"]
    assert spec.storage is None


# --------------------------------------------------------------------------- invalid specs


def test_a_name_no_method_can_have_names_field_and_line(tmp_path):
    # any method name may be given (the probe says whether the installed vLLM has it); one that
    # cannot be a method's name, or one that proposes no tokens, is refused at load
    for bad, why in (("Eagle-3", "not a method name"), ("extract_hidden_states", "proposes no tokens")):
        text = VALID + f"space:\n  methods: [ngram, {bad}]\n"
        p = _write(tmp_path, text)
        msg = _spec_error(p)
        assert f"{p}:{_line(text, 'methods:')}: field 'space.methods'" in msg
        assert repr(bad) in msg and why in msg


def test_k_min_above_max_block_style_points_at_the_k_line(tmp_path):
    text = VALID + "space:\n  methods: [ngram]\n  k:\n    min: 6\n    max: 3\n"
    p = _write(tmp_path, text)
    msg = _spec_error(p)
    assert f"{p}:{_line(text, '  k:')}: field 'space.k'" in msg
    assert "min (6) > max (3)" in msg


def test_k_min_above_max_flow_style(tmp_path):
    text = VALID + "space:\n  k: {min: 9, max: 2}\n"
    p = _write(tmp_path, text)
    msg = _spec_error(p)
    assert f"{p}:{_line(text, 'k: {')}: field 'space.k': min (9) > max (2)" in msg


def test_unknown_objective_statistic(tmp_path):
    text = VALID + "objective:\n  confirm_starts: 1\n  statistic: p42\n"
    p = _write(tmp_path, text)
    msg = _spec_error(p)
    assert f"{p}:{_line(text, 'statistic:')}: field 'objective.statistic'" in msg
    assert "'p42'" in msg and "median" in msg


def test_runoff_contenders_is_a_count_of_zero_or_more(tmp_path):
    from autotune.core._spec import RUNOFF_CONTENDERS, load_spec

    assert load_spec(_write(tmp_path, VALID)).objective.runoff_contenders == RUNOFF_CONTENDERS == 2
    text = VALID + "objective:\n  runoff_contenders: -1\n"
    msg = _spec_error(_write(tmp_path, text))
    assert f"{_line(text, 'runoff_contenders:')}: field 'objective.runoff_contenders'" in msg
    assert load_spec(_write(tmp_path, VALID + "objective:\n  runoff_contenders: 0\n")).objective.runoff_contenders == 0


def test_draft_model_without_draft_models(tmp_path):
    text = VALID + "space:\n  methods: [ngram, draft_model]\n"
    p = _write(tmp_path, text)
    msg = _spec_error(p)
    assert f"{p}:{_line(text, 'space:')}: field 'space'" in msg
    assert "space.draft_models" in msg


@pytest.mark.parametrize("key", ["speculative_config", "port", "--port", "speculative-config", "model"])
def test_reserved_serve_arg(tmp_path, key):
    text = VALID + f"engine:\n  serve_args:\n    dtype: float32\n    {key}: 1\n"
    p = _write(tmp_path, text)
    msg = _spec_error(p)
    assert f"{p}:{_line(text, 'serve_args:')}: field 'engine.serve_args'" in msg
    assert f"serve_args.{key} is set by the tuner" in msg


def test_unreserved_serve_args_are_accepted(tmp_path):
    text = VALID + "engine:\n  serve_args:\n    max_model_len: 512\n    served_model_port_x: 1\n"
    spec = load_spec(_write(tmp_path, text))
    assert spec.engine.serve_args == {"max_model_len": 512, "served_model_port_x": 1}


def test_unknown_top_level_field(tmp_path):
    text = VALID + "seed: 1\nmax_trails: 5\n"
    p = _write(tmp_path, text)
    msg = _spec_error(p)
    assert f"{p}:{_line(text, 'max_trails')}: field 'max_trails'" in msg
    assert "Extra inputs are not permitted" in msg


def test_missing_replay_block(tmp_path):
    text = "# a comment first\nworkload: w\nmodel: m\n"
    p = _write(tmp_path, text)
    msg = _spec_error(p)
    assert re.search(rf"^{re.escape(str(p))}(:\d+)?: field 'replay': Field required$", msg, re.M), msg


def test_several_errors_are_all_reported(tmp_path):
    text = VALID + "space:\n  k: {min: 3, max: 1}\nobjective:\n  statistic: mode\n"
    msg = _spec_error(_write(tmp_path, text))
    assert len(msg.splitlines()) == 2
    assert "'space.k'" in msg.splitlines()[0] and "'objective.statistic'" in msg.splitlines()[1]


def test_bad_yaml_syntax_names_line(tmp_path):
    text = "workload: w\nmodel: m\n  oops: indented\nreplay:\n  path: r\n"
    p = _write(tmp_path, text)
    msg = _spec_error(p)
    assert msg.startswith(f"{p}:3: not valid YAML")


def test_non_mapping_file(tmp_path):
    p = _write(tmp_path, "- workload\n- model\n")
    assert _spec_error(p) == f"{p}: a study spec is a mapping of fields"


def test_empty_file(tmp_path):
    p = _write(tmp_path, "# nothing here\n")
    assert _spec_error(p) == f"{p}: a study spec is a mapping of fields"


def test_missing_file(tmp_path):
    p = tmp_path / "nope.yaml"
    msg = _spec_error(p)
    assert msg.startswith(f"{p}: cannot read study spec")
    assert "No such file" in msg


def test_invalid_utf8_names_file_and_line(tmp_path):
    p = tmp_path / "spec.yaml"
    p.write_bytes(VALID.encode() + b"seed: 1\nincumbent: {method: \"ngr\xffam\"}\n")
    assert _spec_error(p) == f"{p}:7: not UTF-8 text (byte 0xff); save the spec as UTF-8"


def test_duplicate_key_names_both_lines(tmp_path):
    text = VALID + "seed: 1\nbudget:\n  max_trials: 4\n  max_trials: 40\n"
    p = _write(tmp_path, text)
    msg = _spec_error(p)
    assert msg.startswith(f"{p}:{_line(text, 'max_trials: 40')}: not valid YAML")
    first = text.splitlines().index("  max_trials: 4") + 1
    assert f"duplicate key 'max_trials' (first given on line {first})" in msg


def test_duplicate_top_level_key(tmp_path):
    text = VALID + "workload: other\n"
    msg = _spec_error(_write(tmp_path, text))
    assert "duplicate key 'workload' (first given on line 1)" in msg


@pytest.mark.parametrize("k", ["{min: 1, max: 1000000000}", "{min: 65, max: 70}"])
def test_k_beyond_the_largest_is_refused_at_once(tmp_path, k):
    text = VALID + f"space:\n  methods: [ngram]\n  k: {k}\n"
    p = _write(tmp_path, text)
    msg = _spec_error(p)
    assert f"{p}:{_line(text, 'k: {')}: field 'space.k." in msg and "less than or equal to 64" in msg


def test_k_per_method_beyond_the_largest_is_refused(tmp_path):
    text = VALID + "space:\n  methods: [ngram]\n  k_per_method:\n    ngram: {max: 100000}\n"
    msg = _spec_error(_write(tmp_path, text))
    assert "field 'space.k_per_method.ngram.max'" in msg and "64" in msg


def test_alias_bomb_is_refused_without_walking_it(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    p = _write(tmp_path, VALID + "\n".join(lines) + "\n")
    assert "expands to more than 100000 YAML nodes" in _spec_error(p)


@pytest.mark.parametrize("text,why", [
    ("workload: w\nmodel: m\nreplay: {path: r, concurrency: 1}\nincumbent: {when: 2026-13-45}\n", "ValueError"),
    ("[" * 5000 + "]" * 5000 + "\n", "RecursionError"),
])
def test_yaml_the_constructors_refuse_is_a_spec_error(tmp_path, text, why):
    p = _write(tmp_path, text)
    msg = _spec_error(p)
    assert msg.startswith(f"{p}") and "not valid YAML" in msg


def test_a_path_with_a_nul_byte_is_a_spec_error(tmp_path):
    p = _write(tmp_path, VALID.replace("org/some-model", '"./m\\0odel"'))
    assert "a path in the spec is unusable" in _spec_error(p)


# --------------------------------------------------------------------------- find_spec


def test_find_spec_finds_yaml_and_yml(tmp_path):
    (tmp_path / "a.yaml").write_text(VALID)
    (tmp_path / "b.yml").write_text(VALID)
    assert find_spec("a", tmp_path) == tmp_path / "a.yaml"
    assert find_spec("b", tmp_path) == tmp_path / "b.yml"
    assert find_spec("code", STUDIES) == STUDIES / "code.yaml"


def test_find_spec_error_lists_known_workloads(tmp_path):
    with pytest.raises(SpecError) as ei:
        find_spec("nosuch", STUDIES)
    msg = str(ei.value)
    assert "'nosuch'" in msg and str(STUDIES) in msg
    assert "known: chat, chat-llamacpp, chat-smollm2, code, code-llamacpp, code-smollm2, mixed-smollm2, random" in msg

    (tmp_path / "zeta.yml").write_text(VALID)
    (tmp_path / "alpha.yaml").write_text(VALID)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(SpecError, match=r"known: alpha, zeta\)"):
        find_spec("beta", tmp_path)
    with pytest.raises(SpecError, match=r"known: none\)"):
        find_spec("beta", tmp_path / "missing-dir")


def test_start_noise_may_give_the_speculative_configs_their_own_figure(tmp_path):
    text = VALID + "objective:\n  start_noise:\n    cv: 0.02\n    df: 2\n    speculative: {cv: 0.07, df: 4}\n"
    sn = load_spec(_write(tmp_path, text)).objective.start_noise
    assert (sn.for_class("none").cv, sn.for_class("speculative").cv, sn.for_class("speculative").df) == (0.02, 0.07, 4)
    plain = load_spec(_write(tmp_path, VALID + "objective:\n  start_noise: {cv: 0.05, df: 20}\n")).objective.start_noise
    assert plain.for_class("speculative") == plain.for_class("none") == plain  # one figure for every config
    with pytest.raises(ValueError, match="not one of none, speculative"):
        plain.for_class("draft_model")
    bad = VALID + "objective:\n  start_noise:\n    cv: 0.02\n    df: 2\n    speculative: {cv: 1.5, df: 4}\n"
    msg = _spec_error(_write(tmp_path, bad))
    assert f"spec.yaml:{_line(bad, 'speculative')}: field 'objective.start_noise.speculative.cv'" in msg


def test_bands_tax_reaches_the_search_and_a_bad_ratio_names_its_line(tmp_path):
    from autotune.search._sampler import CandidateSampler
    from autotune.search._space import SearchSpace
    from test_space import caps

    text = VALID + "space:\n  methods: [ngram]\n  bands:\n    enabled: true\n    tax: {ratio: 1.23, df: 4}\n"
    spec = load_spec(_write(tmp_path, text))
    assert (spec.space.bands.tax.ratio, spec.space.bands.tax.df) == (1.23, 4)
    assert CandidateSampler(spec, SearchSpace.build(spec.space, caps())).bands_tax == (1.23, 4)
    bad = VALID + "space:\n  bands:\n    tax: {ratio: 0, df: 4}\n"
    msg = _spec_error(_write(tmp_path, bad, "bad.yaml"))
    assert f":{_line(bad, 'tax:')}: field 'space.bands.tax.ratio'" in msg
