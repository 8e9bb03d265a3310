"""Study specs: one YAML file per workload, validated before anything starts.

Errors name the file, the field and (where YAML knows it) the line, because a nightly run that
fails at 3am on ``space.k`` must say so without a stack trace. Relative paths in a spec are
relative to the spec file, and ``$VARS``/``~`` are expanded, so the same spec works from any
working directory.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, field_validator, model_serializer,
                      model_validator)

from autotune.core._cuts import refuted_in
from autotune.core._inputs import InputError, read_input
from autotune.core._measure import STATISTICS
from autotune.core._methods import check_method_name, knob_problem, needs_model
from autotune.core._names import workload_problem
from autotune.core._schedule import parse_cron

TUNED_METHODS = ("ngram", "ngram_gpu", "suffix", "draft_model", "eagle3", "eagle", "mtp",
                 # llama.cpp's n-gram drafters (llama-server --spec-type ngram-simple, ...)
                 "ngram_simple", "ngram_map_k", "ngram_map_k4v", "ngram_mod")
"""Methods with spec fields of their own (``space.ngram``, ``space.suffix``, ``space.draft_models``,
``space.eagle_heads``). A spec may name any other method the installed vLLM lists, as an entry of
``space.entries`` (``autotune/core/_methods.py``); the probe checks it."""
LEGACY_KNOBS = {
    "ngram": ("prompt_lookup_min", "prompt_lookup_max"),
    "ngram_gpu": ("prompt_lookup_min", "prompt_lookup_max"),
    "suffix": ("suffix_decoding_max_tree_depth", "suffix_decoding_max_spec_factor", "suffix_decoding_min_token_prob"),
}
"""The knobs each method's own spec fields give (``SpaceSpec.entry``); an entry's knobs of the same
names replace them."""
ENGINE_KINDS = ("vllm", "llamacpp")
# Speculative keys belong to the tuner: a spec that fixes them in serve_args would silently
# make every trial the same configuration.
RESERVED_SERVE_ARGS = {"speculative_config", "speculative-config", "sc", "port", "host", "model"}


class SpecError(ValueError):
    """A study spec is invalid. ``str()`` names file, field and line."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


REPLAY_MODES = ("closed", "open", "profile")


class ReplaySpec(_Model):
    path: str = Field(description="replay set JSONL (see autotune.traffic._replayset)")
    concurrency: int = Field(ge=1, description="target concurrency: closed-loop in-flight requests")
    requests: int | None = Field(default=None, ge=1, description="measured requests per trial (default: all after warm-up)")
    warmup: int = Field(default=4, ge=0, description="requests sent first and not measured")
    timeout_s: float = Field(default=300.0, gt=0, description="seconds one replayed request may take")
    settle_rounds: int = Field(default=3, ge=0, description="warm-up rounds (one full wave each) at every measured "
                                                           "concurrency until one compiles no kernel, at most this "
                                                           "many; only where the server logs its compiles (vLLM on "
                                                           "CUDA); 0: none")
    mode: Literal["closed", "open", "profile"] = Field(
        default="closed",
        description="closed: `concurrency` requests in flight; open: each request at its recorded time "
                    "(ts) x time_scale; profile: closed loops at each of `levels` in one server start")
    time_scale: float = Field(default=1.0, gt=0, description="open mode: factor on recorded inter-arrival "
                                                                 "times (0.01 replays a day in ~15 minutes)")
    levels: list[int] | None = Field(default=None, min_length=1, validate_default=True,
                                     description="profile mode: concurrency levels, each on its own requests")
    level_weights: list[float] | None = Field(default=None, validate_default=True,
                                              description="profile mode: share of traffic at each level "
                                                          "(default equal); weights the objective")
    min_in_window: int | None = Field(
        default=None, ge=1, description="profile mode: fewest requests a level must measure inside its steady "
                                        "window (default 2x the level); a level short of it draws further requests "
                                        "from the replay set's reserve (what warm-up, search and confirmation leave), "
                                        "and one still short is flagged in the trial (levels.<L>.thin) and the study "
                                        "warns: its figures rest on too few requests")
    min_window_tokens: int | None = Field(
        default=None, ge=1, description="profile mode: fewest output tokens the requests inside a level's steady "
                                        "window must generate (default: no token minimum); filled and flagged like "
                                        "min_in_window")
    windows: int = Field(
        default=1, ge=1, le=16,
        description="experimental: steady windows measured one after another in each server start, each on fresh "
                    "requests of the replay set (the same ones in every start), pooled into the start's figures. "
                    "Windows of one server differ by 5-6% on an H200 (docs/notes/2026-12-05-h200-round-15.md): N windows cut "
                    "that part of a start's noise by sqrt(N) for seconds each, where another start costs minutes. "
                    "Closed and profile mode")

    @field_validator("levels")
    @classmethod
    def _levels(cls, v, info):
        mode = info.data.get("mode", "closed")
        if v is None:
            if mode == "profile":
                raise ValueError("required when mode is 'profile' (e.g. [1, 4, 8])")
            return v
        if mode != "profile":
            raise ValueError(f"only used when mode is 'profile' (mode is {mode!r})")
        for lv in v:
            if lv < 1:
                raise ValueError(f"levels must be >= 1, got {lv}")
        if len(set(v)) != len(v):
            raise ValueError(f"levels repeat a value: {v}")
        return v

    @field_validator("level_weights")
    @classmethod
    def _weights(cls, v, info):
        if v is None:
            return v
        levels = info.data.get("levels")
        if info.data.get("mode", "closed") != "profile":
            raise ValueError("only used when mode is 'profile'")
        if levels is not None and len(v) != len(levels):
            raise ValueError(f"{len(v)} weights for {len(levels)} levels; give one weight per level")
        if any(not (w >= 0) for w in v) or not sum(v) > 0:
            raise ValueError(f"weights must be >= 0 with a positive sum, got {v}")
        return v

    @field_validator("min_in_window", "min_window_tokens")
    @classmethod
    def _min_in_window(cls, v, info):
        if v is not None and info.data.get("mode", "closed") != "profile":
            raise ValueError("only used when mode is 'profile'")
        return v

    @field_validator("windows")
    @classmethod
    def _windows(cls, v, info):
        if v > 1 and info.data.get("mode", "closed") == "open":
            raise ValueError("an open-loop replay follows the recorded arrival times once; windows need mode "
                             "'closed' or 'profile'")
        return v

    def weights(self) -> dict[int, float]:
        """Profile mode: level -> normalized weight (equal by default)."""
        levels = self.levels or [self.concurrency]
        raw = self.level_weights or [1.0] * len(levels)
        total = float(sum(raw))
        return {lv: float(w) / total for lv, w in zip(levels, raw)}


MAX_K = 64
"""The largest ``num_speculative_tokens`` a spec may ask for: far above what pays on any engine
(the studies stop at 8-16), low enough that the space (every K of every method) stays small."""


class KRange(_Model):
    min: int = Field(default=1, ge=1, le=MAX_K, description="smallest num_speculative_tokens tried")
    max: int = Field(default=8, ge=1, le=MAX_K, description="largest num_speculative_tokens tried")

    @model_validator(mode="after")
    def _ordered(self):
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) > max ({self.max})")
        return self


class NgramSpace(_Model):
    """Prompt-lookup windows of both n-gram proposers, ``ngram`` (host CPU) and ``ngram_gpu``."""

    prompt_lookup_min: list[int] = Field(default=[2], min_length=1, description="shortest n-gram matched in the "
                                         "prompt, values to try")
    prompt_lookup_max: list[int] = Field(default=[5], min_length=1, description="longest n-gram matched in the "
                                         "prompt, values to try")

    @model_validator(mode="after")
    def _some_pair(self):
        if not any(lo <= hi for lo in self.prompt_lookup_min for hi in self.prompt_lookup_max):
            raise ValueError("no prompt_lookup_min <= prompt_lookup_max pair")
        return self


class SuffixSpace(_Model):
    max_tree_depth: list[int] = Field(default=[24], min_length=1, description="suffix tree depth, values to try")
    max_spec_factor: list[float] = Field(default=[1.0], min_length=1, description="speculated tokens per matched "
                                         "prefix token, values to try")
    min_token_prob: list[float] = Field(default=[0.1], min_length=1, description="least estimated probability of "
                                        "a speculated token, values to try")


class BandsTax(_Model):
    """What a band schedule's decode step costs over plain K on this engine and hardware, measured
    on earlier nights (vLLM 0.25 drops FULL CUDA graphs with a schedule): the search's prior."""
    ratio: float = Field(gt=0, description="step cost of a schedule / plain K at the same K and level")
    df: int = Field(default=2, ge=0, description="what the figure is worth against the study's own schedules")


class BandsSpace(_Model):
    """Per-batch-size K (``num_speculative_tokens_per_batch_size``) for the concurrency profile."""
    enabled: bool = Field(default=False, description="try per-batch-size K bands as candidates")
    tax: BandsTax | None = Field(default=None, description="a band schedule's step cost over plain K measured "
                                 "on this engine and hardware: the search's prior, pooled with what earlier "
                                 "nights' studies in the same storage measured on the same hardware and vLLM "
                                 "(docs/benchmarks.md)")
    tpot_ms: float | None = Field(default=None, gt=0, description="production TPOT estimate: with replay.mode "
                                  "other than profile, the levels come from the replay set's arrival times")
    max_levels: int = Field(default=3, ge=2, le=8, description="most concurrency levels derived from tpot_ms")


class MethodEntry(_Model):
    """One method of the space: the drafter checkpoints it needs and the knobs it searches."""

    models: list[str] = Field(default=[], description="drafter paths or hub ids: a draft model, an EAGLE, DFlash "
                              "or DSpark drafter, Medusa or MLP-speculator heads (an MTP type runs the target's "
                              "own MTP layers without one); each is a candidate")
    knobs: dict[str, list[bool | int | float | str]] = Field(
        default={}, description="SpeculativeConfig field -> values to try, e.g. `enable_adaptive_verification: "
                                "[false, true]`, `parallel_drafting`, `rejection_sample_method`, "
                                "`dspark_draft_topk`; each field is checked against the installed vLLM's probe")
    k: KRange | None = Field(default=None, description="K range of this method, instead of `space.k`")

    @field_validator("knobs")
    @classmethod
    def _knobs(cls, v):
        for name, values in v.items():
            problem = knob_problem(name, values)
            if problem:
                raise ValueError(problem)
        return v

    @field_validator("models")
    @classmethod
    def _models(cls, v):
        if len(set(v)) != len(v):
            raise ValueError(f"models repeat a path: {v}")
        return v


class SpaceSpec(_Model):
    methods: list[str] = Field(default=["ngram", "suffix"], min_length=1,
                               description="speculative methods searched: any the installed vLLM's "
                                           "SpeculativeMethod lists (ngram, suffix, draft_model, eagle3, mtp, "
                                           "dflash, dspark, medusa, a per-model MTP type...; the probe drops "
                                           "those it lacks, saying why), or llama.cpp's ngram_simple, "
                                           "ngram_map_k, ngram_map_k4v, ngram_mod; the no-speculation baseline "
                                           "is always trial 0")
    k: KRange = Field(default=KRange(), description="K range of every method")
    k_per_method: dict[str, KRange] = Field(default={}, description="K range of one method, instead of `k`")
    ngram: NgramSpace = Field(default=NgramSpace(), description="n-gram proposers' prompt-lookup windows")
    suffix: SuffixSpace = Field(default=SuffixSpace(), description="suffix decoding knobs")
    draft_models: list[str] = Field(default=[], description="draft model paths for draft_model")
    draft_p_min: list[float] = Field(default=[], description="llama.cpp: --spec-draft-p-min values to try "
                                     "(empty: the server's default)")
    draft_n_min: list[int] = Field(default=[], description="llama.cpp: --spec-draft-n-min values to try "
                                   "(empty: the server's default)")
    eagle_heads: list[str] = Field(default=[], description="EAGLE head paths for eagle and eagle3")
    entries: dict[str, MethodEntry] = Field(default={}, description="per method: the drafter paths it needs "
                                            "and its knobs as value lists of SpeculativeConfig fields "
                                            "(docs/engines.md has the table); for ngram and suffix the knobs "
                                            "replace space.ngram / space.suffix, for draft_model and eagle the "
                                            "models replace space.draft_models / space.eagle_heads")
    bands: BandsSpace = Field(default=BandsSpace(), exclude=True, description="per-batch-size K bands")
    # exclude: bands add candidates but change no measurement, so study fingerprints stay as they were

    @field_validator("methods")
    @classmethod
    def _known(cls, v):
        for m in v:
            problem = check_method_name(m)
            if problem:
                raise ValueError(problem)
        if len(set(v)) != len(v):
            raise ValueError(f"methods repeat a name: {v}")
        return v

    @model_validator(mode="after")
    def _needs(self):
        legacy = {"draft_model": ("draft_models", self.draft_models),
                  "eagle": ("eagle_heads", self.eagle_heads), "eagle3": ("eagle_heads", self.eagle_heads)}
        for m in self.methods:
            entry = self.entries.get(m)
            if m in legacy and entry is not None and entry.models and legacy[m][1]:
                raise ValueError(f"method {m} has models in space.{legacy[m][0]} and in space.entries.{m}.models; "
                                 "give them in one place")
            if needs_model(m) and not self.entry(m).models:
                where = f"space.{legacy[m][0]} or " if m in legacy else ""
                raise ValueError(f"method {m} needs a drafter: give {where}space.entries.{m}.models")
            if m in ("ngram", "ngram_gpu") and entry is not None:
                knobs = self.entry(m).knobs
                if not any(lo <= hi for lo in knobs["prompt_lookup_min"] for hi in knobs["prompt_lookup_max"]):
                    raise ValueError(f"space.entries.{m}.knobs: no prompt_lookup_min <= prompt_lookup_max pair")
        for m in self.k_per_method:
            if m not in self.methods:
                raise ValueError(f"k_per_method names {m!r}, which is not in methods")
        for m, entry in self.entries.items():
            if m not in self.methods:
                raise ValueError(f"entries names {m!r}, which is not in methods")
            if entry.k is not None and m in self.k_per_method:
                raise ValueError(f"method {m} has a K range in k_per_method and in entries.{m}.k; give one")
        return self

    @field_validator("draft_p_min")
    @classmethod
    def _p_min(cls, v):
        for p in v:
            if not 0 <= p <= 1:
                raise ValueError(f"draft_p_min values lie in [0, 1], got {p}")
        return v

    @field_validator("draft_n_min")
    @classmethod
    def _n_min(cls, v):
        for n in v:
            if n < 0:
                raise ValueError(f"draft_n_min values are >= 0, got {n}")
        return v

    @model_serializer(mode="wrap")
    def _dump(self, handler):
        # knobs left unset are left out, so the dump (and every study fingerprint made of it)
        # of a spec without them is what it was before they existed
        data = handler(self)
        for key in ("draft_p_min", "draft_n_min", "entries"):
            if isinstance(data, dict) and not data.get(key):
                data.pop(key, None)
        return data

    def k_range(self, method: str) -> KRange:
        entry = self.entries.get(method)
        if entry is not None and entry.k is not None:
            return entry.k
        return self.k_per_method.get(method, self.k)

    def entry(self, method: str) -> MethodEntry:
        """``method`` in the one entry form, whichever fields the spec gave it in: its models
        (``draft_models``, ``eagle_heads`` or the entry's) and every knob with its values
        (``space.ngram``'s windows and ``space.suffix``'s limits as SpeculativeConfig fields,
        replaced by the entry's knobs of the same names)."""
        given = self.entries.get(method) or MethodEntry()
        knobs: dict[str, list] = {}
        if method in ("ngram", "ngram_gpu"):
            knobs = {"prompt_lookup_min": list(self.ngram.prompt_lookup_min),
                     "prompt_lookup_max": list(self.ngram.prompt_lookup_max)}
        elif method == "suffix":
            s = self.suffix
            knobs = {"suffix_decoding_max_tree_depth": list(s.max_tree_depth),
                     "suffix_decoding_max_spec_factor": list(s.max_spec_factor),
                     "suffix_decoding_min_token_prob": list(s.min_token_prob)}
        models = list(given.models)
        if not models and method == "draft_model":
            models = list(self.draft_models)
        elif not models and method in ("eagle", "eagle3"):
            models = list(self.eagle_heads)
        return MethodEntry(models=models, knobs={**knobs, **given.knobs}, k=self.k_range(method))

    def extra_knobs(self, method: str) -> dict[str, list]:
        """The entry's knobs that no method-specific field covers (``LEGACY_KNOBS``), in the
        order given: each is an Optuna parameter ``<method>.<field>`` of its own."""
        given = self.entries.get(method)
        own = LEGACY_KNOBS.get(method, ())
        return {k: list(v) for k, v in given.knobs.items() if k not in own} if given else {}


class BudgetSpec(_Model):
    max_trials: int = Field(default=10, ge=1, description="trials including the baseline")
    max_server_starts: int = Field(default=14, ge=1, description="server starts, confirmation included")
    max_wall_minutes: float = Field(default=60.0, gt=0, description="wall-clock minutes of the search")


class StartNoisePrior(_Model):
    """A recorded start-to-start CV of the per-start statistic, worth ``df`` degrees of freedom."""
    cv: float = Field(gt=0, lt=1, description="start-to-start coefficient of variation of per-start TPOT")
    df: int = Field(ge=1, le=200, description="degrees of freedom it is worth (starts measured minus configs)")


NOISE_CLASSES = ("none", "speculative")
"""Configurations whose starts vary alike: no speculation, and every speculative config (on the
H200 the baseline repeats within 0.5% where n-gram configs move up to 8%, docs/notes/2026-12-03-h200-round-10.md)."""
SEARCH_TOLERANCE = 0.03
"""The predictor's default "close enough": the search benchmark's target is a pick within 3% of
the grid's best (docs/figures/search.md). The measured noise (7-9% per start for n-gram configs on the
H200) is no stopping margin: it would stop before telling 4% apart, and on a quiet host it would
keep starting servers for 1%."""
CONFIRM_ROUNDS = 4
"""Default confirmation rounds at most (``objective.confirm_max_starts``): the winner's own noise
needs two of its starts, and four rounds see a 20% gain at 6% start-to-start noise in about nine
nights of ten (benchmarks/decisions.py)."""
RUNOFF_CONTENDERS = 2
"""Default ``objective.runoff_contenders``: at most this many measured configurations that could
still beat the search's best get one more start each beside it before the confirmation
(``search._runoff``; chosen on benchmarks/search.py, docs/figures/search.md)."""


class StartNoiseSpec(StartNoisePrior):
    """A recorded A/A figure: the start-to-start CV of the per-start statistic on this hardware
    (e.g. from ``benchmarks/start_noise.py``), worth ``df`` degrees of freedom in the decision;
    for every configuration, or for no speculation alone when ``speculative`` gives the
    speculative configurations' own figure."""
    speculative: StartNoisePrior | None = Field(
        default=None, description="the speculative configurations' own start-to-start CV and df, where they "
                                  "vary more than the baseline (benchmarks/start_noise.py --by-class)")

    def for_class(self, cls: str) -> StartNoisePrior:
        """The prior of one class of ``NOISE_CLASSES``."""
        if cls not in NOISE_CLASSES:
            raise ValueError(f"noise class {cls!r} is not one of {', '.join(NOISE_CLASSES)}")
        return self.speculative if cls == "speculative" and self.speculative is not None else self


class ObjectiveSpec(_Model):
    statistic: str = Field(default="median", description="per-start statistic of per-request TPOT the study "
                           "minimizes and decides on: median, mean, trimmed_mean or p90")
    confirm_starts: int = Field(default=1, ge=0, description="fresh server starts each of baseline, incumbent and "
                                                             "winner, interleaved, that the decision rests on")
    confirm_max_starts: int | None = Field(default=None, ge=1, description="sequential confirmation: while the "
                                           "decision is open, more interleaved rounds up to this many starts each "
                                           "(the error spent over the looks the budget allows, docs/decisions.md); "
                                           f"default the larger of confirm_starts and {CONFIRM_ROUNDS}")
    start_noise: StartNoiseSpec | None = Field(default=None, description="the start-to-start noise expected on "
                                               "this hardware (an A/A figure): it plans the confirmation and "
                                               "guides the search; the decision's intervals rest on the night's "
                                               "own starts alone (docs/decisions.md)")
    search: Literal["predictor", "tpe", "grid", "random"] = Field(
        default="predictor", description="predictor: start only what the TPOT predictor (_predict) rates likely to "
                                         "win, stop when nothing is; tpe: Optuna's TPE; grid / random: every config")
    min_gain: float | None = Field(default=None, ge=0, lt=1,
                                   description="the decision: the winner must beat the deployed config by this "
                                               "fraction; the predictor's search too, when larger than search_tolerance")
    search_tolerance: float = Field(default=SEARCH_TOLERANCE, gt=0, lt=1,
                                    description="predictor: a start must be likely to beat the best by this fraction; "
                                                "the search stops when no candidate is (what 'close enough' means)")
    search_repeats: bool = Field(default=False, description="experimental, predictor: start a measured configuration "
                                 "again while a measured rival may still beat the best by search_tolerance (one start "
                                 "each cannot rank configurations a few percent apart on a noisy machine); off by "
                                 "default, since on a host whose noise is near the tolerance it spends the whole "
                                 "budget; the H200 specs turn it on (docs/benchmarks.md, round 11)")
    carry_search: bool = Field(default=False, description="experimental, nightly runs: where tonight's starts of "
                               "the baseline and last night's winner measure what last night's did (its gain within "
                               "the start noise, its acceptance length within 10%), last night's search stands and "
                               "tonight's starts go to the confirmation, which decides on fresh starts as always; "
                               "otherwise the search runs in full (autotune/search/_carry.py)")
    carry_max_nights: int = Field(default=6, ge=1, description="carry_search: a full search at least every this "
                                  "many nights, so that a ranking never goes stale unseen")
    runoff_contenders: int = Field(default=RUNOFF_CONTENDERS, ge=0, description="when the search stops: at most "
                                   "this many measured configurations that could still be faster than its best "
                                   "(chance >= 20% at the search's noise) get one more start each beside the best, "
                                   "in a random order, and the winner that goes into confirmation is chosen like "
                                   "with like (the same number of first starts each); the starts come out of the "
                                   "search's budget, the confirmation's reserve kept; 0: off (docs/decisions.md)")
    nominee: bool = Field(default=False, description="experimental, predictor: when the budget ends the search "
                          "and the predictor rates a configuration never started more likely than not faster than "
                          "the best measured one, the confirmation confirms that nominee instead of the search's "
                          "best (a budget that leaves the search two starts: docs/figures/search.md); a nominee "
                          "whose confirmation start fails a guard is dropped for the search's best; off by "
                          "default, since where the largest K is best a wrong prediction can displace it")

    @field_validator("statistic")
    @classmethod
    def _stat(cls, v):
        if v not in STATISTICS:
            raise ValueError(f"unknown statistic {v!r}; one of {', '.join(STATISTICS)}")
        return v

    @model_validator(mode="after")
    def _confirm_max(self):
        if self.confirm_max_starts is not None and self.confirm_max_starts < self.confirm_starts:
            raise ValueError(f"confirm_max_starts ({self.confirm_max_starts}) is below confirm_starts "
                             f"({self.confirm_starts})")
        return self

    def search_min_gain(self) -> float:
        """The gain a search start must be likely to bring: ``search_tolerance``, or ``min_gain``
        when larger (a smaller gain could not change the decision)."""
        return max(self.search_tolerance, self.min_gain or 0.0)

    def max_confirm_starts(self) -> int:
        """Confirmation rounds at most: none without ``confirm_starts``; by default enough for the
        winner's own start-to-start noise and the power to see a 20% gain at 6% noise
        (``CONFIRM_ROUNDS``)."""
        if not self.confirm_starts:
            return 0
        return max(self.confirm_starts, CONFIRM_ROUNDS) if self.confirm_max_starts is None else self.confirm_max_starts

    def planned_looks(self, starts_left: int | None = None, sides: int | None = None) -> int:
        """Confirmation rounds at which the decision may stop: up to ``max_confirm_starts``, and
        no more than the ``starts_left`` of the budget allow at ``sides`` starts a round, so no
        error is spent on a look that cannot happen. Fixed before the first confirmation start
        (``Study.confirm`` stores it), it sizes the decision's error spending."""
        most = self.max_confirm_starts()
        if not most:
            return 1
        if starts_left is not None and sides:
            most = min(most, starts_left // sides)
        return max(1, most)


class GuardSpec(_Model):
    max_failed_requests: int = Field(default=0, ge=0, description="failed requests a candidate may have")
    equivalence_min_match: float = Field(default=1.0, ge=0, le=1,
                                         description="fraction of greedy outputs equivalent to the baseline's: "
                                                     "identical, or parting from it first at a near-tie")
    equivalence_near_tie: Annotated[float, Field(ge=0)] | Literal["auto"] = Field(
        default="auto", description="nats: a divergence where the baseline's margin between its token and the "
        "candidate's is at most this is a near-tie, numerics rather than a wrong output; auto: measured in the "
        "baseline's start (docs/decisions.md)")
    throughput_floor: float = Field(default=0.9, gt=0, description="candidate/baseline output throughput")
    equivalence_min_compared: int = Field(default=16, ge=0, description="greedy requests the equivalence check "
                                          "must compare; fewer: 'not checked'")
    equivalence_required: bool = Field(default=True, description="an equivalence not checked blocks `change`; "
                                       "false opts out")
    confidence: float = Field(default=0.95, gt=0, lt=1, description="confidence of the decision's intervals")


class EngineSpec(_Model):
    kind: Literal["vllm", "llamacpp"] = Field(default="vllm", description="the serving engine "
                                              "(autotune/engines/_registry.py): vllm or llamacpp (llama-server)")
    command: list[str] = Field(default=["vllm", "serve"], min_length=1,
                               description="argv prefix that runs `vllm serve` (a venv path, a container command); "
                                           "for llamacpp the llama-server executable (default: llama-server)")
    python: str | None = Field(default=None, description="python of the vLLM environment, for the capability probe")
    env: dict[str, str] = Field(default={}, description="environment variables of every server start (one that "
                                "makes a start-up cut measured to move TPOT, autotune/core/_cuts.py, is refused "
                                "unless production_equivalent is false)")
    serve_args: dict[str, Any] = Field(default={}, description="serve arguments every trial shares "
                                       "(snake_case keys, as in production)")
    preload: bool = Field(default=False, description="vllm: import the next `vllm serve` while the current one "
                          "starts, so a start skips the API process's imports (15-24 s on an H100 host; "
                          "autotune/engines/_preload.py, autotune/core/_cuts.py)")
    start_timeout_s: float = Field(default=600.0, gt=0, description="seconds a server may take to become healthy")
    stop_timeout_s: float = Field(default=30.0, gt=0, description="seconds a server may take to stop before it "
                                  "is killed")

    @field_validator("serve_args")
    @classmethod
    def _not_reserved(cls, v, info):
        for key in v:
            if key.replace("_", "-").lstrip("-") in {k.replace("_", "-") for k in RESERVED_SERVE_ARGS}:
                raise ValueError(f"serve_args.{key} is set by the tuner, not the spec")
        if info.data.get("kind") == "llamacpp":
            name = next((k for k in v if k.lstrip("-").replace("-", "_").startswith(("spec_", "draft_"))
                         or k.lstrip("-").replace("-", "_") in ("m", "md", "model_draft", "metrics", "alias")), None)
            if name is not None:
                raise ValueError(f"serve_args.{name} is set by the tuner, not the spec (llama-server's "
                                 "speculative flags, model, --metrics and --alias)")
        return v

    @model_validator(mode="after")
    def _llamacpp_command(self):
        if self.kind == "llamacpp" and "command" not in self.model_fields_set:
            object.__setattr__(self, "command", ["llama-server"])
        if self.kind == "llamacpp" and self.preload:
            raise ValueError("preload: true is for vllm (it imports `vllm serve` ahead); llama-server has no "
                             "imports to skip")
        return self


def _workload_name(v: str) -> str:
    """A spec's workload names files (its recommendation, pool, lock): no '/', no '..'."""
    problem = workload_problem(v)
    if problem:
        raise ValueError(problem)
    return v


class TrafficRule(_Model):
    """Tags imported traffic with ``workload`` when every condition given matches (first rule wins)."""
    workload: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="the workload matching requests join")
    model: str | None = Field(default=None, description="regex searched in the logged model name")
    regex: str | None = Field(default=None, description="regex searched in the prompt text")
    keywords: list[str] = Field(default=[], description="any of these words in the prompt text (case-insensitive)")

    _workload_name = field_validator("workload")(_workload_name)

    @field_validator("model", "regex")
    @classmethod
    def _compiles(cls, v):
        if v is not None:
            _compile(v)
        return v

    @model_validator(mode="after")
    def _some_condition(self):
        if self.model is None and self.regex is None and not self.keywords:
            raise ValueError("a rule needs at least one of model, regex, keywords")
        return self


class TrafficSampleSpec(_Model):
    n: int | None = Field(default=None, ge=1, description="requests per replay set (default: warmup + 2 * requests, else 68)")
    window_hours: float | None = Field(default=24.0, gt=0, description="window ending at the newest imported request; null = all")
    seed: int = Field(default=0, description="seed of the stratified sample")


class TrafficSpec(_Model):
    rules: list[TrafficRule] = Field(default=[], description="workload rules for untagged requests")
    redact: list[str] = Field(default=[], description="regexes replaced by [REDACTED] in imported prompts")
    sample: TrafficSampleSpec = Field(default=TrafficSampleSpec(), description="`autotune traffic sample` settings")

    @field_validator("redact")
    @classmethod
    def _compile_all(cls, v):
        for pattern in v:
            _compile(pattern)
        return v


def _compile(pattern: str):
    import re

    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"invalid regex {pattern!r}: {e}") from None


class ScheduleSpec(_Model):
    """When the daemon (`autotune daemon run`) retunes this workload, unattended."""
    cron: str = Field(default="0 2 * * *", description="crontab expression (minute hour day month weekday)")
    timezone: str = Field(default="UTC", description="IANA time zone of `cron`; across a daylight-saving change each "
                          "scheduled time runs once: in a repeated hour at its first occurrence, in a skipped hour "
                          "at the change")
    misfire_grace_minutes: float = Field(default=360.0, ge=0,
                                         description="a run missed by at most this much (daemon down, GPU busy) still runs")
    enabled: bool = Field(default=True, description="false: the daemon skips this workload")

    @model_validator(mode="after")
    def _parses(self):
        parse_cron(self.cron, self.timezone)  # ValueError names what is wrong
        return self


class DriftSpec(_Model):
    """When a nightly recommendation must say that the deployed config no longer fits the traffic."""
    min_acceptance_rate: float = Field(default=0.4, ge=0, le=1,
                                       description="incumbent's accepted/drafted tokens below this = drift")
    # `autotune drift check` (no GPU): what moves enough to retune (see autotune/trust/_drift.py)
    acceptance_length_change: float = Field(default=0.15, gt=0, description="relative change of production's "
                                            "acceptance length at the deployed K that calls for a retune")
    tokens_per_step_change: float = Field(default=0.15, gt=0, description="relative change of production's "
                                          "tokens per decode step that calls for a retune")
    tag_share_change: float = Field(default=0.2, gt=0, le=1, description="absolute change of a tag's share "
                                    "of the traffic (0.8 -> 0.55 is 0.25) that calls for a retune")
    prompt_length_change: float = Field(default=0.3, gt=0, description="relative change of the prompt "
                                        "length p50 or p90 that calls for a retune")
    skip_unless_drift: bool = Field(default=False, description="daemon: run the nightly study only when "
                                    "`autotune drift check` finds a reason to retune")
    min_days_between_changes: float = Field(default=0.0, ge=0, description="damping: within this many days "
                                            "of the last recommendation a different config is held back (the "
                                            "previous one stays) unless the incumbent's acceptance fell below "
                                            "min_acceptance_rate, vLLM's version changed or the incumbent lost "
                                            "to no speculation; 0 = off")


class FidelityTolerances(_Model):
    """How close the incumbent's replay must come to production (relative, coverage absolute);
    null skips a figure."""
    acceptance_length: float | None = Field(default=0.10, gt=0, description="relative")
    coverage: float | None = Field(default=0.10, gt=0, description="absolute (drafted steps / decode steps)")
    tokens_per_step: float | None = Field(default=0.10, gt=0, description="relative")
    tpot_p50: float | None = Field(default=0.25, gt=0, description="relative")
    tpot_p90: float | None = Field(default=0.35, gt=0, description="relative")
    tpot_mean: float | None = Field(default=0.25, gt=0, description="relative")
    itl_mean: float | None = Field(default=0.30, gt=0, description="relative")


class ProductionSpec(_Model):
    """The deployment this workload's traffic comes from: its telemetry gates every study
    (autotune/trust/_gate.py) and drives `autotune drift check`."""
    telemetry: str | None = Field(default=None, description="telemetry bundle of production (`autotune "
                                  "telemetry scrape --out FILE`); null = no fidelity gate")
    tolerances: FidelityTolerances = Field(default=FidelityTolerances(), description="the fidelity gate's tolerances")
    min_figures: int = Field(default=3, ge=1, description="the fidelity gate fails when fewer figures "
                             "could be compared (missing on one side or tolerance null)")


class SyntheticAcceptanceSpec(_Model):
    """Fixed per-position acceptance for cost benchmarks (dummy weights, no real draft quality).

    vLLM then accepts draft position i with an unconditional rate (``rejection_sample_method:
    synthetic``): the measured TPOT is the real cost of that acceptance profile, but the outputs
    are not the target model's. Benchmarking only: never part of a recommended config."""
    alpha: float | None = Field(default=None, gt=0, le=1,
                                description="rates alpha^1 .. alpha^K for a trial with K speculative tokens")
    rates: list[float] | None = Field(default=None, min_length=1,
                                      description="explicit per-position rates (non-increasing); the first K are used")

    @field_validator("rates")
    @classmethod
    def _rates(cls, v):
        if v is None:
            return v
        for r in v:
            if not 0 <= r <= 1:
                raise ValueError(f"rates must lie in [0, 1], got {r}")
        if any(b > a for a, b in zip(v, v[1:])):
            raise ValueError(f"rates must be non-increasing (per-position unconditional rates), got {v}")
        return v

    @model_validator(mode="after")
    def _one_of(self):
        if (self.alpha is None) == (self.rates is None):
            raise ValueError("give exactly one of alpha (rates alpha^1..alpha^K) or rates")
        return self

    def rates_for(self, k: int) -> list[float]:
        """The ``synthetic_acceptance_rates`` of a trial with ``k`` speculative tokens."""
        if self.alpha is not None:
            return [round(self.alpha ** i, 6) for i in range(1, k + 1)]
        if k > len(self.rates):
            raise ValueError(f"benchmark.synthetic_acceptance.rates has {len(self.rates)} rates, a trial has K={k}")
        return list(self.rates[:k])


class BenchmarkSpec(_Model):
    """Settings for measuring cost on test setups (dummy weights); every output made with them is
    marked ``benchmark_only`` and none of them enters a recommended config."""
    synthetic_acceptance: SyntheticAcceptanceSpec | None = Field(default=None, description="fixed per-position "
                                                                 "acceptance (dummy weights)")


class StudySpec(_Model):
    workload: str = Field(pattern=r"^[A-Za-z0-9_.-]+$", description="workload name; studies/<workload>.yaml")
    model: str = Field(description="target model: Hugging Face id or path (a GGUF file for llama.cpp)")
    served_model_name: str | None = Field(default=None, description="name the server serves the model under")
    replay: ReplaySpec = Field(description="the replay set and how it is played")
    space: SpaceSpec = Field(default=SpaceSpec(), description="what the search may try")
    budget: BudgetSpec = Field(default=BudgetSpec(), description="limits of one study")
    objective: ObjectiveSpec = Field(default=ObjectiveSpec(), description="what is minimized, and how it is decided")
    guards: GuardSpec = Field(default=GuardSpec(), description="what a winner must pass")
    engine: EngineSpec = Field(default=EngineSpec(), description="how servers are started")
    incumbent: dict[str, Any] | None = Field(default=None, description="speculative config deployed now; null = none")
    production_equivalent: bool = Field(default=True, description="false: the engine setup differs from "
                                        "production, and the recommendation says so")
    storage: str | None = Field(default=None, description="Optuna storage URL (default: sqlite in the home)")
    recommendations_dir: str = Field(default="recommendations", description="where recommendations are written")
    seed: int = Field(default=0, description="seed of the samplers")
    traffic: TrafficSpec = Field(default=TrafficSpec(), description="`autotune traffic`: workload rules, redaction, sampling")
    schedule: ScheduleSpec = Field(default=ScheduleSpec(), description="nightly retuning by the daemon")
    drift: DriftSpec = Field(default=DriftSpec(), description="thresholds of `autotune drift check` and damping")
    production: ProductionSpec = Field(default=ProductionSpec(), description="production telemetry: fidelity gate and drift check")
    benchmark: BenchmarkSpec | None = Field(default=None, description="benchmarking-only settings (synthetic "
                                            "acceptance); marks every output made with them")
    source: str = Field(default="", exclude=True)

    _workload_name = field_validator("workload")(_workload_name)

    @field_validator("benchmark")
    @classmethod
    def _benchmark_covers_k(cls, v, info):
        sa = v and v.synthetic_acceptance
        space = info.data.get("space")
        if sa is not None and sa.rates is not None and space is not None:
            k_max = max(space.k_range(m).max for m in space.methods)
            if k_max > len(sa.rates):
                raise ValueError(f"synthetic_acceptance.rates has {len(sa.rates)} rates but the space "
                                 f"reaches K={k_max}; give at least {k_max}")
        return v

    @property
    def study_name(self) -> str:
        return f"autotune-{self.workload}"

    def benchmark_only(self) -> dict | None:
        """What makes this spec's measurements benchmark-only (None for a production study)."""
        sa = self.benchmark and self.benchmark.synthetic_acceptance
        if sa is None:
            return None
        return {"synthetic_acceptance": sa.model_dump(exclude_none=True),
                "warning": "measured with vLLM's synthetic rejection sampler (fixed acceptance, outputs are "
                           "not the model's): a cost benchmark, not a configuration to deploy"}

    def run_config(self, config: dict | None) -> dict | None:
        """The speculative config a trial's server gets: ``config`` plus the benchmark-only
        synthetic acceptance for its K. ``config`` itself (what the study records and may
        recommend) is left as it is."""
        sa = self.benchmark and self.benchmark.synthetic_acceptance
        if not config or sa is None:
            return config
        k = int(config.get("num_speculative_tokens") or 0)
        if k < 1:
            return config
        return {**config, "rejection_sample_method": "synthetic", "synthetic_acceptance_rates": sa.rates_for(k)}


def _expand(value: str, base: Path) -> str:
    value = os.path.expandvars(os.path.expanduser(value))
    if "://" in value or os.path.isabs(value):
        return value
    return str((base / value).resolve())


def _line_of(root, loc: tuple) -> int | None:
    """Line number of a field in the YAML node tree, for error messages."""
    import yaml

    node = root
    line = node.start_mark.line + 1 if node is not None else None
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = [(k, v) for k, v in node.value if k.value == part]
            if not match:
                break
            key, node = match[0]
            line = key.start_mark.line + 1  # the line that names the field, not its block's first line
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line


MAX_YAML_NODES = 100_000
"""A spec is a page of YAML: one whose aliases expand past this many nodes is refused before
anything walks it (a "billion laughs" file would otherwise hang the loader)."""


def _yaml_loader():
    import yaml

    class StrictLoader(yaml.SafeLoader):
        """PyYAML's safe loader, except that a key given twice in one mapping is an error
        (PyYAML keeps the last silently: a spec would run with a value its reader did not see)."""

        def construct_mapping(self, node, deep=False):
            if isinstance(node, yaml.MappingNode):
                seen: dict = {}
                for key_node, _ in node.value:
                    if key_node.tag == "tag:yaml.org,2002:merge" or not isinstance(key_node, yaml.ScalarNode):
                        continue
                    key = self.construct_object(key_node, deep=deep)
                    if key in seen:
                        raise yaml.constructor.ConstructorError(
                            None, None, f"duplicate key {key!r} (first given on line {seen[key] + 1})",
                            key_node.start_mark)
                    seen[key] = key_node.start_mark.line
            return super().construct_mapping(node, deep=deep)

    return StrictLoader


def _expanded_size(node, limit: int) -> int:
    """Nodes in the tree ``node`` stands for, aliases expanded (counted once per distinct node, so
    the walk itself stays linear); stops counting past ``limit``."""
    import yaml

    memo: dict[int, int] = {}

    def size(n) -> int:
        if id(n) in memo:
            return memo[id(n)]
        memo[id(n)] = 1  # a node that refers to itself (PyYAML allows it) counts once
        total = 1
        if isinstance(n, yaml.MappingNode):
            children = [c for pair in n.value for c in pair]
        elif isinstance(n, yaml.SequenceNode):
            children = n.value
        else:
            children = []
        for c in children:
            total += size(c)
            if total > limit:
                break
        memo[id(n)] = total
        return total

    return size(node) if node is not None else 0


def _read_yaml(path: Path):
    """(data, root node) of a spec file; SpecError names the file and the line of any problem:
    unreadable, not UTF-8, not YAML, a duplicate key, aliases that expand too far."""
    import yaml

    try:
        raw = read_input(path, "study spec")
    except OSError as e:
        raise SpecError(f"{path}: cannot read study spec ({e.strerror})") from None
    except InputError as e:
        raise SpecError(str(e)) from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        raise SpecError(f"{path}:{line}: not UTF-8 text (byte 0x{raw[e.start]:02x}); save the spec as UTF-8") from None
    loader = None
    try:
        loader = _yaml_loader()(text)  # its reader refuses control characters at once
        root = loader.get_single_node()
        if _expanded_size(root, MAX_YAML_NODES) > MAX_YAML_NODES:
            raise SpecError(f"{path}: expands to more than {MAX_YAML_NODES} YAML nodes (aliases): not a study spec")
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark else ""
        raise SpecError(f"{path}{where}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    except (ValueError, TypeError, OverflowError, RecursionError) as e:  # PyYAML's own constructors:
        # a date like 2026-13-45, nesting deeper than Python's stack
        if isinstance(e, SpecError):
            raise
        raise SpecError(f"{path}: not valid YAML ({type(e).__name__}: {e})") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, root


def load_spec(path: str | Path) -> StudySpec:
    """Load and validate a study spec; SpecError names file, field and line."""
    path = Path(path)
    data, root = _read_yaml(path)
    if not isinstance(data, dict):
        raise SpecError(f"{path}: a study spec is a mapping of fields")
    try:
        spec = StudySpec.model_validate(data)
    except ValidationError as e:
        msgs = []
        for err in e.errors():
            loc = tuple(p for p in err["loc"] if not (isinstance(p, str) and p.startswith("function-")))
            field = ".".join(str(p) for p in loc) or "(top level)"
            line = _line_of(root, loc)
            msg = err["msg"].removeprefix("Value error, ")
            msgs.append(f"{path}:{line}: field '{field}': {msg}" if line else f"{path}: field '{field}': {msg}")
        raise SpecError("\n".join(msgs)) from None
    refused = refuted_in(spec.engine.env) if spec.production_equivalent else None
    if refused:
        loc = ("engine", "env", refused[0])
        line = _line_of(root, loc)
        raise SpecError(f"{path}{f':{line}' if line else ''}: field '{'.'.join(loc)}': {refused[1]}")
    try:
        return _localized(spec, path)
    except (ValueError, OSError) as e:  # a path with a NUL byte, a $VAR that makes one
        raise SpecError(f"{path}: a path in the spec is unusable ({e})") from None


def _localized(spec: StudySpec, path: Path) -> StudySpec:
    """``spec`` with its relative paths made absolute (relative to the spec file) and expanded."""
    base = path.parent.resolve()
    space = spec.space.model_copy(update={
        "draft_models": [_expand(p, base) for p in spec.space.draft_models],
        "eagle_heads": [_expand(p, base) for p in spec.space.eagle_heads],
        "entries": {m: e.model_copy(update={"models": [_expand_model(p, base) for p in e.models]})
                    for m, e in spec.space.entries.items()},
    })
    command = list(spec.engine.command)
    if command and ("/" in command[0]):
        command[0] = _expand(command[0], base)
    env = {k: _expand(v, base) if v.startswith(("./", "../")) else os.path.expandvars(v)
           for k, v in spec.engine.env.items()}
    engine = spec.engine.model_copy(update={
        "command": command, "env": env,
        "python": _expand(spec.engine.python, base) if spec.engine.python else None,
    })
    local = _expand(spec.model, base)
    model = local if Path(local).exists() or spec.model.startswith((".", "/", "~", "$")) else spec.model
    return spec.model_copy(update={
        "model": model,
        "replay": spec.replay.model_copy(update={"path": _expand(spec.replay.path, base)}),
        "space": space, "engine": engine,
        "storage": spec.storage and _storage_url(spec.storage, base),
        "recommendations_dir": _expand(spec.recommendations_dir, base),
        "production": spec.production.model_copy(update={"telemetry": _expand(spec.production.telemetry, base)})
        if spec.production.telemetry else spec.production,
        "source": str(path),
    })


def _expand_model(value: str, base: Path) -> str:
    """A drafter path made absolute, or a hub id left as it is (as ``model`` is)."""
    local = _expand(value, base)
    return local if Path(local).exists() or value.startswith((".", "/", "~", "$")) else value


def _storage_url(url: str, base: Path) -> str:
    if url.startswith("sqlite:///") and not url.startswith("sqlite:////"):
        return "sqlite:///" + _expand(url.removeprefix("sqlite:///"), base)
    return url


def find_spec(workload: str, studies_dir: str | Path) -> Path:
    d = Path(studies_dir)
    if workload_problem(workload):  # never a spec outside the studies folder
        raise SpecError(f"no study spec for workload {workload!r}: {workload_problem(workload)}")
    for ext in (".yaml", ".yml"):
        p = d / f"{workload}{ext}"
        if p.exists():
            return p
    known = sorted(p.stem for p in d.glob("*.y*ml")) if d.is_dir() else []
    raise SpecError(f"no study spec for workload {workload!r} in {d} (known: {', '.join(known) or 'none'})")
