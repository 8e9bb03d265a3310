"""Hardware identity in the study fingerprint: what is detected, and that a worker on another
accelerator model cannot pool its trials into a study measured elsewhere (real PostgreSQL)."""

from __future__ import annotations

import os

import pytest

from _synthetic import Workload
from test_search_study import RATES, fake_measure, make_spec
from autotune.decide import _decision, _payload
from autotune.engines import _hardware
from autotune.engines._probe import Capabilities
from autotune.search import _study, _trials, study_record
from autotune.search._space import SearchSpace


@pytest.fixture
def nvidia_smi(tmp_path, monkeypatch):
    """An nvidia-smi on PATH that lists two H200s and one H100."""
    exe = tmp_path / "bin" / "nvidia-smi"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\nprintf '0, NVIDIA H200\\n1, NVIDIA H200\\n2, NVIDIA H100 80GB HBM3\\n'\n")
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{exe.parent}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    _hardware._nvidia_gpus.cache_clear()
    yield
    _hardware._nvidia_gpus.cache_clear()


def test_gpus_are_counted_by_model_within_the_visible_devices(nvidia_smi):
    assert _hardware.identity() == "1x NVIDIA H100 80GB HBM3 + 2x NVIDIA H200"
    assert _hardware.identity({"CUDA_VISIBLE_DEVICES": "0,1"}) == "2x NVIDIA H200"
    assert _hardware.identity({"CUDA_VISIBLE_DEVICES": "2"}) == "1x NVIDIA H100 80GB HBM3"
    assert _hardware.identity({"CUDA_VISIBLE_DEVICES": "2"}, explicit="8x MI300X") == "8x MI300X"


def test_without_gpus_the_cpu_model_and_core_count(monkeypatch):
    monkeypatch.setenv("PATH", "/nonexistent")
    _hardware._nvidia_gpus.cache_clear()
    hw = _hardware.identity()
    assert hw.startswith("cpu: ") and hw.endswith(f" x{os.cpu_count()}")
    assert _hardware._cpu_model() in hw


def test_hardware_changes_the_fingerprint(tmp_path):
    spec = make_spec(tmp_path)
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=[], arctic_inference=False)
    a = _study.fingerprint(spec, "d", caps, "1x NVIDIA H200")
    b = _study.fingerprint(spec, "d", caps, "1x NVIDIA H100 80GB HBM3")
    assert a != b and a == _study.fingerprint(spec, "d", caps, "1x NVIDIA H200")


def test_how_traffic_is_replayed_changes_the_fingerprint(tmp_path):
    """A trial measured in another replay mode, level set, weighting or window count is another
    measurement: editing any of them starts a new study instead of mixing the two."""
    spec = make_spec(tmp_path)
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=[], arctic_inference=False)
    base = _study.fingerprint(spec, "d", caps)

    def with_replay(**kw):
        return spec.model_copy(update={"replay": spec.replay.model_copy(update=kw)})

    profile = {"mode": "profile", "levels": [1, 4]}
    seen = {base}
    for kw in ({"windows": 3}, profile, {**profile, "levels": [1, 8]}, {**profile, "level_weights": [1.0, 3.0]},
               {**profile, "min_in_window": 2}):
        fp = _study.fingerprint(with_replay(**kw), "d", caps)
        assert fp not in seen, kw
        seen.add(fp)
    # the defaults written out are the defaults: a study that always had them keeps its name
    assert _study.fingerprint(with_replay(mode="closed", windows=1), "d", caps) == base


def _open(spec, url, home, hardware, **kw):
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=["method", "num_speculative_tokens",
                        "prompt_lookup_min", "prompt_lookup_max"], arctic_inference=False)
    return _study.Study(spec, caps, SearchSpace.build(spec.space, caps), url, ["vllm", "serve"], home,
                        hardware=hardware, **kw)


def test_a_worker_on_another_gpu_model_is_refused(tmp_path, monkeypatch, pg_url):
    spec = make_spec(tmp_path)
    monkeypatch.setattr(_study, "measure", fake_measure(Workload(rates=RATES)))
    leader = _open(spec, pg_url, tmp_path / "home", "1x NVIDIA H200")
    outcome = leader.run()
    assert _payload.build(study_record(leader), _decision.decide(study_record(leader)), outcome)["valid_for"]["hardware"] == "1x NVIDIA H200"
    assert leader.study.user_attrs["hardware"] == "1x NVIDIA H200"
    assert {t.user_attrs["hardware"] for t in leader.trials()} == {"1x NVIDIA H200"}
    # a worker on the same hardware finds the same study
    same = _open(spec, pg_url, tmp_path / "w1", "1x NVIDIA H200", leader=False)
    assert same.name == leader.name
    # on an H100: neither by the inputs' own name nor by --study-name
    for kw in ({}, {"study_name": leader.name}):
        with pytest.raises(_trials.HardwareMismatch) as ei:
            _open(spec, pg_url, tmp_path / "w2", "1x NVIDIA H100 80GB HBM3", leader=False, **kw)
        msg = str(ei.value)
        assert (f"study {leader.name} was measured on 1x NVIDIA H200, this host has 1x NVIDIA H100 80GB HBM3: "
                "trials from other hardware are not pooled") in msg
    import optuna

    assert [s.study_name for s in optuna.get_all_study_summaries(pg_url, include_best_trial=False)] == [leader.name]
    # a leader on other hardware runs a study of its own (its own decision), not the H200's
    own = _open(spec, pg_url, tmp_path / "l2", "1x NVIDIA H100 80GB HBM3")
    assert own.name != leader.name and own.trials() == []


def test_the_worker_command_on_other_hardware_exits_2_before_any_server_start(tmp_path, monkeypatch, pg_url):
    from autotune.core._settings import Settings
    from autotune.engines import _probe
    from autotune.ops import _runner

    make_spec(tmp_path)
    caps = Capabilities(version="0.32.0", methods=["ngram"], fields=["method", "num_speculative_tokens",
                        "prompt_lookup_min", "prompt_lookup_max"], arctic_inference=False)
    monkeypatch.setattr(_probe, "probe", lambda *a, **k: caps)
    fm = fake_measure(Workload(rates=RATES))
    monkeypatch.setattr(_study, "measure", fm)
    for k in ("AUTOTUNE__STORAGE", "AUTOTUNE__RECOMMENDATIONS_DIR"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("AUTOTUNE__HOME", str(tmp_path / "home"))
    req = dict(workload="syn", spec_path=str(tmp_path / "syn.yaml"), storage=pg_url)
    monkeypatch.setenv("AUTOTUNE__HARDWARE", "1x NVIDIA H200")
    assert _runner.run(_runner.RunRequest(**req), settings=Settings(), echo=lambda *a, **k: None) == 0
    measured = len(fm.calls)
    monkeypatch.setenv("AUTOTUNE__HARDWARE", "1x NVIDIA H100 80GB HBM3")
    monkeypatch.setenv("AUTOTUNE__GPU", "1")
    said = []
    code = _runner.run(_runner.RunRequest(**req, kind="worker", worker=True), settings=Settings(),
                       echo=lambda msg, err=False: said.append(msg))
    assert code == 2, said
    assert "was measured on 1x NVIDIA H200, this host has 1x NVIDIA H100 80GB HBM3" in said[-1]
    assert len(fm.calls) == measured  # nothing started
