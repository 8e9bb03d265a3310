"""Speculative methods as spec entries: what each needs (a model or head) and which
``SpeculativeConfig`` fields it may search (its knobs).

vLLM adds methods every month (0.32 lists dflash, dspark, medusa, mlp_speculator and twenty-odd MTP
model types beside ngram, suffix, draft_model and EAGLE), so a spec may name any of them; whether
the installed vLLM has the method and each knob's field is the probe's to say
(``engines._probe.Capabilities``), not a list frozen here. What is fixed here is only what a
spec can get wrong without vLLM: a method that needs a drafter checkpoint and names none, a knob
the tuner owns (K, the model, the bands), a value that is not a plain scalar.
"""

from __future__ import annotations

import re

MODEL_METHODS = ("draft_model", "eagle", "eagle3", "dflash", "dspark", "medusa", "mlp_speculator")
"""vLLM methods whose drafter is a separate checkpoint (``model``): a draft model, an EAGLE,
DFlash or DSpark drafter, Medusa or MLP-speculator heads."""

NOT_TUNABLE = {
    "extract_hidden_states": "it records hidden states (to train drafters) and proposes no tokens",
    "custom_class": "its proposer is user code autotune cannot configure from a spec",
    "none": "the no-speculation baseline is always trial 0",
}

RESERVED_KNOBS = {
    "method": "the entry's own name",
    "num_speculative_tokens": "K is searched over space.k (or the entry's k)",
    "model": "give drafter paths in the entry's models",
    "num_speculative_tokens_per_batch_size": "band schedules are space.bands",
    "synthetic_acceptance_rates": "synthetic acceptance is benchmark-only (benchmark.synthetic_acceptance)",
    "synthetic_acceptance_length": "synthetic acceptance is benchmark-only (benchmark.synthetic_acceptance)",
}

ADAPTIVE_KNOBS = {"enable_adaptive_verification": True}
"""Knob values that make vLLM choose the verified tokens per step at run time (a cost model
profiled at start-up): such a configuration's K is a ceiling, not what each step verifies, so its
counters predict no other K and its TPOT is measured, never predicted."""

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


def is_mtp(method: str) -> bool:
    """vLLM's multi-token-prediction methods: ``mtp`` and the per-model ``*_mtp`` types."""
    return method == "mtp" or method.endswith("_mtp")


def needs_model(method: str) -> bool:
    return method in MODEL_METHODS


def always_drafts(method: str) -> bool:
    """A model-based drafter proposes at every decode step (n-gram and suffix lookups often find
    nothing): its coverage is 1."""
    return needs_model(method) or is_mtp(method)


def is_adaptive(config: dict | None) -> bool:
    """A runtime-adaptive configuration (``ADAPTIVE_KNOBS``)."""
    return bool(config) and any(config.get(k) == v for k, v in ADAPTIVE_KNOBS.items())


def check_method_name(method: str) -> str | None:
    """None when ``method`` may be named in a spec (the probe decides whether vLLM has it)."""
    if method in NOT_TUNABLE:
        return f"method {method!r} cannot be tuned: {NOT_TUNABLE[method]}"
    if not _NAME.match(method):
        return f"method {method!r} is not a method name (lower-case letters, digits and _)"
    return None


def knob_problem(name: str, values: list) -> str | None:
    """None when ``values`` may be searched for the knob ``name``, else why not."""
    if name in RESERVED_KNOBS:
        return f"knob {name!r} is not searched here: {RESERVED_KNOBS[name]}"
    if not _NAME.match(name):
        return f"knob {name!r} is not a SpeculativeConfig field name"
    if not values:
        return f"knob {name!r} has no values to try"
    if len({(type(x), x) for x in values}) != len(values):
        return f"knob {name!r} repeats a value: {values}"
    if name == "rejection_sample_method" and "synthetic" in values:
        return ("rejection_sample_method 'synthetic' is benchmark-only (benchmark.synthetic_acceptance), "
                "never a candidate")
    return None
