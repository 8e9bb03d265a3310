"""Optuna orchestration: baseline first, then the search, then a confirmation of the winner.

Each trial is one server start (or none, for a configuration already measured). The study lives
in Optuna's RDB storage (SQLite by default), named after the workload and a fingerprint of what
was measured (replay set, model, engine setup, space), so a rerun on the same inputs resumes
and a night with fresh traffic starts a new study.

Order of work, spending server starts on purpose:
1. the no-speculation baseline (the reference every ratio is taken against);
2. each method at its largest K (its per-position acceptance covers every smaller K);
3. ``objective.search``, one ``study.optimize`` whose sampler proposes each next configuration
   (``_sampler.CandidateSampler``): by default the predictor (``_policy``) proposes what it rates
   likely to beat the best by more than the noise, band schedules included, and stops the
   optimization (``study.stop()``) when nothing is; ``grid``/``random`` propose every candidate;
   ``tpe`` (or a predictor without data) goes on with the acceptance knee (``SearchSpace.knee_k``)
   and Optuna's TPE sampler, guards as constraints, until the budget (``_budget``) or the space
   runs out;
4. the runoff (``_runoff``, ``objective.runoff_contenders``): when the search stops, its best and
   the measured configurations that could still be faster than it (chance >= 20% at the search's
   noise) get one more start each, in a drawn order, within the search's budget; the winner that
   goes into confirmation is the best of them like with like (the mean log of the same number of
   first starts each), since one lucky start picked the search's best;
5. with ``objective.nominee`` (experimental), where the budget ended the search: the configuration
   the predictor rates more likely than not faster than that winner, never started, takes its place
   (``_nominee``; dropped again where a confirmation start of it fails a guard);
6. ``confirm_starts`` fresh starts each of baseline, incumbent and winner, interleaved, on
   fresh requests (more rounds up to ``confirm_max_starts`` while the decision is open): the
   decision rests on these starts only, so the winner's selection start (the winner's curse)
   is not in it (``_confirm``, ``decide``, docs/decisions.md).

``Study`` drives this order and each trial's objective (claim, start, measure, guards); it
composes the Optuna glue (``_trials``: storage, trial queries, user attributes), the budget and
pause of the run (``_budget``), the runoff (``_runoff``) and the confirmation plan (``_confirm``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from autotune.core._cuts import unsettled_note
from autotune.core._measure import pooled_start_noise
from autotune.core._names import child
from autotune.core._signals import signame_of
from autotune.core._spec import StudySpec
from autotune.engines import _registry
from autotune.engines._hardware import identity
from autotune.engines._probe import Capabilities
from autotune.engines._recovery import process_identity
from autotune.search._record import (bands_of, claim_key_of, config_key_of, config_of, duplicate, ended_unmeasured,
                                     enqueued_claim_key, error_of, interrupted, measurement_of, nominee_of,
                                     repeat_asked, role_of, runoff_of, runoff_round_of, sampler_stop_of, stalled)
from autotune.search._recovery import recover_trials, trial_id
from autotune.search import _bands, _carry, _equivalence, _nights, _nominee, _observations, _predict, _runoff
from autotune.search._budget import Pause, StartBudget, confirm_reserve
from autotune.search._budget import plan as budget_plan
from autotune.search._confirm import Confirmation
from autotune.search._levels import measurement_objective
from autotune.search._sampler import MODES as SAMPLER_MODES
from autotune.search._sampler import CandidateSampler
from autotune.search._search import failed_keys, study_weights, with_profile
from autotune.search._space import NONE, SearchSpace, canonical, in_space, label, params_of
from autotune.search._trial import (Measurement, TrialFailed, batch_invariant, equivalence_requests, measure,
                                    stall_verdict)
from autotune.search._trials import (ROLE_BASELINE, ROLE_CONFIRM, ROLE_SEARCH, check_hardware, fail_own_running,
                                     failed_here, in_state, interrupted_attrs, may_take_over, open_storage,
                                     open_study, stored_trials, trial_row)
from autotune.traffic import _replayset

log = logging.getLogger(__name__)


@dataclass
class TrialEvent:
    """What the CLI prints after each trial."""

    number: int
    role: str
    config: dict | None
    state: str
    value: float | None
    best: float | None
    server_starts: int
    elapsed_s: float
    note: str = ""


@dataclass
class StudyOutcome:
    study_name: str
    storage: str
    trials: list = field(default_factory=list)
    server_starts: int = 0
    """Every start made; ``interrupted_starts`` of them measured nothing and did not count
    against the budget."""
    interrupted_starts: int = 0
    wall_s: float = 0.0
    stopped_because: str = ""
    paused: bool = False
    """The run stopped at its ``pause_after_starts`` or ``pause_after_minutes``: nothing confirmed
    or decided yet."""


#: the replay settings that change what one start measures: a trial measured under other values is
#: another measurement, so editing any of them starts a new study instead of resuming the old one
REPLAY_FINGERPRINT = ("concurrency", "mode", "levels", "level_weights", "windows", "min_in_window")
#: their defaults (besides concurrency): a study on the defaults keeps the name it always had
_DEFAULT_REPLAY = {"mode": "closed", "levels": None, "level_weights": None, "windows": 1, "min_in_window": None}


def fingerprint(spec: StudySpec, replay_digest: str, caps: Capabilities, hardware: str | None = None) -> str:
    """What was measured: replay set, how it is replayed (``REPLAY_FINGERPRINT``), model, engine
    setup, space, and (``hardware``, from ``_hardware.identity``) the accelerator model and count
    the trials run on."""
    replay = spec.replay.model_dump(include=set(REPLAY_FINGERPRINT))
    blob = json.dumps({"replay": replay_digest, "model": spec.model, "serve": spec.engine.serve_args,
                       "vllm": caps.version, "space": spec.space.model_dump(), "seed": spec.seed,
                       "concurrency": replay.pop("concurrency"),
                       **({"replay_mode": replay} if replay != _DEFAULT_REPLAY else {}),
                       **({"benchmark": spec.benchmark.model_dump()} if spec.benchmark else {}),
                       **({"hardware": hardware} if hardware else {})},
                      sort_keys=True, default=str)
    return hashlib.sha1(blob.encode()).hexdigest()[:8]


def split_requests(spec: StudySpec, rs: _replayset.ReplaySet):
    """Warm-up, search and confirmation requests. Confirmation gets fresh requests when the
    replay set is large enough, so the winner is not re-judged on the requests it was picked on."""
    reqs = rs.requests
    w = spec.replay.warmup
    warmup, rest = reqs[:w], reqs[w:]
    n = spec.replay.requests or len(rest)
    if len(rest) < spec.replay.concurrency:
        raise ValueError(f"{rs.path}: {len(rest)} requests after warm-up, fewer than the concurrency "
                         f"{spec.replay.concurrency}")
    search = rest[:n]
    confirm = rest[n:2 * n] if len(rest) >= 2 * n else search
    return warmup, search, confirm


def _used(spec: StudySpec, rs: _replayset.ReplaySet) -> int:
    warmup, search, confirm = split_requests(spec, rs)
    return len(warmup) + len(search) + (len(confirm) if confirm is not search else 0)


def window_requests(spec: StudySpec, rs: _replayset.ReplaySet) -> list[tuple[list, list]]:
    """``replay.windows``: the (warm-up, measured) requests of each window after a start's first,
    taken in order from what warm-up, search and confirmation leave, the same in every start (a
    request is replayed once per server lifetime, so later windows need requests of their own).
    Confirmation starts measure their first window on the confirmation requests and these after it."""
    extra = spec.replay.windows - 1
    if extra < 1:
        return []
    warmup, search, _ = split_requests(spec, rs)
    w, n = len(warmup), len(search)
    used = _used(spec, rs)
    need = used + extra * (w + n)
    if len(rs.requests) < need:
        raise ValueError(f"{rs.path}: replay.windows {spec.replay.windows} needs {need} requests (warm-up {w} and "
                         f"{n} measured per window, after the {used} of warm-up, search and confirmation), the "
                         f"replay set holds {len(rs.requests)}: sample more traffic or lower replay.windows")
    rest = rs.requests[used:need]
    return [(list(rest[i:i + w]), list(rest[i + w:i + w + n])) for i in range(0, extra * (w + n), w + n)]


def reserve_requests(spec: StudySpec, rs: _replayset.ReplaySet) -> list:
    """What warm-up, search, confirmation and the further windows leave of the replay set: the
    requests a profile level draws when its steady window is short (``replay.min_in_window``/
    ``min_window_tokens``). Each server start draws from the start of it, so every start measures
    the same requests."""
    more = sum(len(w) + len(r) for w, r in window_requests(spec, rs))
    return list(rs.requests[_used(spec, rs) + more:])


def runoff_winner(study, by: dict[str, list]) -> str | None:
    """The runoff's winner among ``study``'s feasible search trials ``by`` config key
    (``_runoff.winner``: like with like over the first search starts of its entrants that have their
    runoff start), or None before two of them have it, or without a runoff."""
    ran = {config_key_of(t) for ts in by.values() for t in ts if runoff_round_of(t) is not None}
    keys = [k for k in (runoff_of(study.study).get("entrants") or []) if k in ran and k in by]
    starts = {k: [study.objective_of(t) for t in sorted(by[k], key=lambda t: t.number)] for k in keys}
    return _runoff.winner(starts, keys)


def equivalence_note(spec: StudySpec, caps: Capabilities | None, n: int) -> str:
    """The study note of an engine that is not batch-invariant here: what is replayed, why, and
    how a spec makes the engine invariant (then the measured outputs are compared, at no cost)."""
    engine = _registry.for_spec(spec)
    where = f"{engine.name} on {caps.platform}" if getattr(caps, "platform", "") else engine.name
    how = f"; {engine.invariant_how} makes it batch-invariant" if engine.invariant_how else ""
    return (f"equivalence: {where} is not batch-invariant (a greedy output depends on which requests share a "
            f"batch); {n} greedy requests are replayed one at a time after each start's measured requests "
            f"(their outputs only){how}")


class Study:
    """One Optuna study of one workload, shared by every process that runs it.

    Several processes may drive the same study (a resumed run, ``autotune worker`` on other
    hosts): every trial first *claims* what it measures in ``autotune_claims`` (a unique key per
    configuration, or per confirmation slot), so a configuration is measured once however many
    workers propose it, and records its owner (host, pid) so that a restart can tell a trial
    whose process died from one still running elsewhere (``_recovery``).
    """

    def __init__(self, spec: StudySpec, caps: Capabilities, space: SearchSpace, storage: str,
                 command: list[str], home: Path, study_name: str | None = None,
                 on_event: Callable[[TrialEvent], None] | None = None, *, store=None,
                 pid_dir: Path | None = None, sampler_seed: int | None = None,
                 warm_start: list[dict] | None = None, leader: bool = True, run_id: str | None = None,
                 poll_s: float = 2.0, hardware: str | None = None,
                 fidelity_check: Callable[["Study"], object] | None = None,
                 pause_after_starts: int | None = None, pause_after_minutes: float | None = None,
                 window_began: float | None = None, pause: Pause | None = None, previous: dict | None = None):
        """``pause``: the run's pause as one value (``_budget.Pause``), or its three parts as
        ``pause_after_starts``, ``pause_after_minutes`` and ``window_began``; not both. ``previous``:
        a nightly run's current recommendation, whose study the search may carry (``carry_search``)."""
        import optuna

        if pause is not None and (pause_after_starts, pause_after_minutes, window_began) != (None, None, None):
            raise ValueError("Study: give the pause as pause=Pause(...) or as pause_after_starts, pause_after_minutes "
                             "and window_began, not both")
        pause = pause or Pause(pause_after_starts, pause_after_minutes, window_began)

        self.spec, self.caps, self.space = spec, caps, space
        self.command, self.home = command, home
        self.on_event = on_event or (lambda e: None)
        self.store, self.pid_dir, self.leader, self.run_id, self.poll_s = store, pid_dir, leader, run_id, poll_s
        self.fidelity_check = fidelity_check
        """``trust._gate.check_study`` in a run with ``production.telemetry``: called after the incumbent's
        trial, before any search; raises to stop the study (the runner passes it in)."""
        self.warm_start = list(warm_start or [])
        self.previous = previous
        self.notes: list[str] = []
        self._said_blocked = False
        self.replay_set = _replayset.load(spec.replay.path)
        # bands without replay.levels: levels from the traffic
        self.spec = spec = with_profile(spec, self.replay_set, self.notes)
        self.warmup, self.search_reqs, self.confirm_reqs = split_requests(spec, self.replay_set)
        self.invariant = batch_invariant(spec, caps)  # vLLM: the probed platform and VLLM_BATCH_INVARIANT
        self.equivalence_reqs = equivalence_requests(spec, self.search_reqs, caps)  # greedy copies or replays
        self.window_reqs = window_requests(spec, self.replay_set)
        self.reserve_reqs = reserve_requests(spec, self.replay_set) if spec.replay.mode == "profile" else []
        if self.equivalence_reqs and not self.invariant:
            self.notes.append(equivalence_note(spec, caps, len(self.equivalence_reqs)))
        elif self.equivalence_reqs:
            self.notes.append(f"equivalence: {len(self.equivalence_reqs)} greedy copies of sampled requests are "
                              "replayed after each start's measured requests (their outputs only)")
        self.hardware = hardware or identity(spec.engine.env)
        self.inputs = fingerprint(spec, self.replay_set.digest, caps)
        self.fingerprint = fingerprint(spec, self.replay_set.digest, caps, self.hardware)
        self.name = study_name or f"{spec.study_name}-{self.fingerprint}"
        self.storage_url = storage
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            tpe = optuna.samplers.TPESampler(seed=spec.seed if sampler_seed is None else sampler_seed,
                                             n_startup_trials=4, multivariate=True, group=True)
            sampler = tpe if spec.objective.search not in SAMPLER_MODES else CandidateSampler(
                spec, space, mode=spec.objective.search, bands_max_batch=self._bands_max_batch(spec, caps),
                fallback=tpe, notes=self.notes)
        self.storage = open_storage(storage, on_failed=self._record_trial)
        check_hardware(self.storage, study_name, self.name, self.inputs, self.hardware, leader)
        self.sampler = sampler
        self.study = open_study(self.storage, self.name, sampler, hardware=self.hardware, inputs=self.inputs,
                                workload=spec.workload, replay_digest=self.replay_set.digest,
                                vllm_version=caps.version)
        if leader and "search_basis" not in self.study.user_attrs:
            self.study.set_user_attr("search_basis", _carry.search_basis(spec))
        if store is not None:
            store.record_study(self.name, spec.workload, self.fingerprint, spec.model, caps.version,
                               str(self.replay_set.path), self.replay_set.digest)
        self.t0 = time.monotonic()
        self.current_server = None
        self.stopped_because = ""
        self.confirming = Confirmation()
        """The confirmation plan (``_confirm``); ``confirm_open`` and ``confirmation`` read through to it."""
        if self.confirm_reqs is self.search_reqs and spec.objective.confirm_starts:
            self.notes.append(f"confirmation reuses the search requests: {len(self.replay_set.requests)} requests "
                              f"in the replay set, fewer than warm-up + 2 x {len(self.search_reqs)} needed for fresh "
                              "ones (the decision says so)")
        short = budget_plan(spec, space.methods)["short"]
        if short:
            self.notes.append(f"budget: {short}")
        if spec.engine.preload and (open_cut := unsettled_note("engine.preload")):
            self.notes.append(open_cut)
        self._dupes = 0
        self.recovered = self.recover()
        self.budget = StartBudget(spec, space, self.study, self.t0, pause)
        """What this run may still spend, and its pause (``_budget``)."""

    @property
    def paused(self) -> bool:
        """A start was refused for this run's pause (``_budget.Pause``): nothing confirmed or decided."""
        return self.budget.paused

    @paused.setter
    def paused(self, value: bool) -> None:
        self.budget.paused = value

    @property
    def spec(self) -> StudySpec:
        return self._spec

    @spec.setter
    def spec(self, value: StudySpec) -> None:
        self._spec = value  # the budget judges by the study's spec, also one set after the study opened
        if "budget" in self.__dict__:
            self.budget.spec = value

    @property
    def confirm_open(self) -> Callable[[], bool] | None:
        """Set by the caller that decides (``decide._decision.open_question``): one more confirmation round?"""
        return self.confirming.open

    @confirm_open.setter
    def confirm_open(self, value: Callable[[], bool] | None) -> None:
        self.confirming.open = value

    @property
    def confirmation(self) -> dict:
        """What the confirmation ran, and why a round did not (``Confirmation.record``)."""
        return self.confirming.record

    @confirmation.setter
    def confirmation(self, value: dict) -> None:
        self.confirming.record = value

    @property
    def pause_after_starts(self) -> int | None:
        return self.budget.pause.after_starts

    @property
    def pause_after_minutes(self) -> float | None:
        return self.budget.pause.after_minutes

    # ---- bookkeeping over stored trials -------------------------------------------------
    def trials(self, role: str | None = None, config_key: str | None = None, complete=True):
        """The study's trials of ``role`` and ``config_key`` (``_trials.stored_trials``)."""
        return stored_trials(self.study, role, config_key, complete)

    def _in_state(self, states, claim_key: str | None = None) -> list:
        return in_state(self.study, states, claim_key)

    def server_starts(self) -> int:
        """Every server start the study made, interrupted ones included (``StartBudget.server_starts``)."""
        return self.budget.server_starts()

    def interrupted_starts(self) -> int:
        """Starts stopped by a signal or a dead process (``StartBudget.interrupted_starts``)."""
        return self.budget.interrupted_starts()

    def budget_starts(self) -> int:
        """The starts ``budget.max_server_starts`` counts (``StartBudget.budget_starts``)."""
        return self.budget.budget_starts()

    def search_trials(self) -> int:
        return self.budget.search_trials()

    def start_to_start_noise(self, m: Measurement) -> dict:
        """Start-to-start noise as known when ``m`` is recorded: the sd of log per-start objective
        (about the CV) of this configuration's starts so far, ``m`` included, and of every
        configuration with repeated starts pooled (``_measure.pooled_start_noise``), with its
        degrees of freedom. Stalled starts are left out (their TPOT is biased)."""
        stat = self.spec.objective.statistic
        samples: dict[str, list[float]] = {}

        def add(key: str, levels, tpots) -> None:
            v = measurement_objective(levels, tpots, stat) if tpots else float("nan")
            if v > 0 and math.isfinite(v):
                samples.setdefault(key, []).append(math.log(v))

        for t in self.trials():
            mm = measurement_of(t)
            if mm and not stalled(t):
                add(config_key_of(t), mm.get("levels"), mm.get("tpot_ms"))
        key = canonical(m.config)
        if not (m.summary.get("stall") or {}).get("stalled"):
            add(key, m.levels, m.tpot_ms)
        own, pooled = pooled_start_noise({key: samples.get(key, [])}), pooled_start_noise(samples)
        return {"config_starts": len(samples.get(key, [])), "config_sd_log": own.sd if own.df else None,
                "study_sd_log": pooled.sd if pooled.df else None, "study_df": pooled.df}

    def baseline_reference(self) -> tuple[dict, dict, dict, dict]:
        """What a candidate's greedy outputs are judged against (``_equivalence.baseline_reference``)."""
        return _equivalence.baseline_reference([measurement_of(t) for t in self.trials(config_key=NONE)],
                                               self.spec.guards.equivalence_near_tie)

    def baseline_throughput(self) -> float | None:
        vals = [measurement_of(t)["summary"]["output_throughput_tok_s"] for t in self.trials(config_key=NONE)]
        return sum(vals) / len(vals) if vals else None

    def set_noise_prior(self, sd: float, df: int) -> None:
        """Start-to-start noise known before this study (earlier nights of the same hardware), for
        the predictor's intervals; a TPE search has no use for it."""
        if isinstance(self.sampler, CandidateSampler) and df > 0:
            self.sampler.set_noise_prior(sd, df)

    def use_earlier_bands_tax(self) -> str | None:
        """The bands tax earlier nights measured on this hardware and engine (``_nights``), pooled
        into the predictor's prior; a line saying so, or None when there is nothing to use."""
        sp = self.spec.space.bands
        if not (isinstance(self.sampler, CandidateSampler) and sp.enabled):
            return None
        found = _nights.earlier_bands_tax(self.storage, self.spec.study_name, exclude=self.name,
                                          hardware=self.hardware, vllm_version=getattr(self.caps, "version", None),
                                          weights=self.sampler.weights, level=self.sampler.level)
        if found is None:
            return None
        ratio, df, studies = found
        self.sampler.set_bands_tax_prior(ratio, df)
        pooled, n = self.sampler.bands_tax
        return (f"bands tax: earlier nights measured {ratio:.2f}x over plain K ({df} schedule levels, "
                f"{len(studies)} studies); the predictor's prior is now {pooled:.2f}x ({n} df)")

    def carry_search(self) -> str | None:
        """``objective.carry_search`` on a nightly run: when tonight's starts of the baseline and
        last night's winner measure what last night's study did (``_carry.judge``), the reason the
        search ends there, its starts left to the confirmation; else None, and the search runs as
        on any night. What was judged is kept as the study's ``carry`` attribute."""
        if not (self.spec.objective.carry_search and self.previous and self.leader) or self.paused:
            return None
        verdict, source, before = _carry.against_last_night(self)
        n = before + 1 if verdict.carried else 0
        self.study.set_user_attr("carry", {"carried": verdict.carried, "reason": verdict.reason, "from": source,
                                           "nights": n, **verdict.detail})
        self.notes.append(f"carry: {verdict.reason}" + ("" if verdict.carried else "; the search runs in full"))
        if not verdict.carried:
            return None
        return (f"{verdict.reason}; last night's search ({source}) is not measured again (carried night {n} of at "
                f"most {self.spec.objective.carry_max_nights})")

    def best(self, search_only: bool = False):
        """A trial of the best feasible measured speculative config (by the objective, the mean
        of its starts where the search started it more than once), or None. ``search_only``:
        among the search's starts (the winner the search picked; a confirmation start never
        re-picks it)."""
        by: dict[str, list] = {}
        for t in self.trials():
            if config_key_of(t) != NONE \
                    and (not search_only or role_of(t) != ROLE_CONFIRM) \
                    and t.constraints and all(c <= 0 for c in t.constraints.values()):
                by.setdefault(config_key_of(t), []).append(t)
        if not by:
            return None
        won = runoff_winner(self, by) if search_only else None
        ts = by[won] if won else min(by.values(), key=lambda ts: statistics.fmean(self.objective_of(t) for t in ts))
        return min(ts, key=self.objective_of)

    def search_starts(self) -> dict[str, list[float]]:
        """Each feasible speculative configuration's search starts (its objective, in the order
        measured): what the runoff ranks."""
        out: dict[str, list[float]] = {}
        for t in sorted(self.trials(), key=lambda t: t.number):
            if config_key_of(t) != NONE and role_of(t) != ROLE_CONFIRM \
                    and t.constraints and all(c <= 0 for c in t.constraints.values()):
                out.setdefault(config_key_of(t), []).append(self.objective_of(t))
        return out

    def search_noise(self) -> float:
        """The search's relative start-to-start noise: this study's repeated starts pooled with the
        prior the predictor uses (``_predict.estimate_noise``; the spec's speculative figure, or
        earlier nights through ``set_noise_prior``)."""
        level = int(self.spec.replay.concurrency)
        obs = [o for o in (_observations.observation_from_trial(t, level) for t in self.trials()
                           if role_of(t) != ROLE_CONFIRM) if o is not None]
        prior = self.sampler.noise_prior if isinstance(self.sampler, CandidateSampler) else None
        if prior is None and self.spec.objective.start_noise is not None:
            sp = self.spec.objective.start_noise.for_class("speculative")
            prior = (sp.cv, sp.df) if sp is not None else None
        return _predict.estimate_noise(obs, *(prior or ()))

    def runoff(self) -> None:
        """One more start each of the search's best and the measured configurations that could
        still be faster (``_runoff``), at most ``objective.runoff_contenders`` of them, in the
        runoff's drawn order, on the search requests; ``best(search_only=True)`` then picks like
        with like. Planned once and stored (``runoff`` study attribute): a resumed run finishes a
        begun runoff and never repeats one of its starts. No room in the budget (the confirmation's
        reserve kept): skipped, and the study says so (notes, ``evidence.runoff``)."""
        from optuna.trial import TrialState

        most = self.spec.objective.runoff_contenders
        plan = runoff_of(self.study)
        if not most or not self.leader or self.paused:
            return
        if not plan:
            b = self.spec.budget
            noise = self.search_noise()
            base = [self.objective_of(t) for t in self.trials(config_key=NONE) if role_of(t) != ROLE_CONFIRM]
            picked = _runoff.entrants(self.search_starts(), noise, most, baseline=base)
            if not picked:
                return  # nothing the search's starts cannot tell apart from its best, or a best slower than none
            room = _runoff.room(b.max_server_starts, self.budget_starts(), self.confirm_reserve(), b.max_trials,
                                self.search_trials())
            plan = {"entrants": [k for k, _ in picked], "chances": {k: p for k, p in picked if p is not None},
                    "noise": noise}
            if room < 2:
                plan["skipped"] = (f"no room in the budget for the runoff of {len(picked)} configurations "
                                   f"({room} search start{'s' * (room != 1)} left beside the confirmation's "
                                   f"{self.confirm_reserve()})")
                self.notes.append(f"runoff: {plan['skipped']}")
            else:
                if room < len(picked):
                    plan["trimmed"] = f"{len(picked) - room} contender(s) left out for the budget"
                    plan["entrants"] = plan["entrants"][:room]
                plan["order"] = _runoff.order(f"{self.spec.seed}/{self.name}", plan["entrants"])
            self.study.set_user_attr("runoff", plan)
        if plan.get("skipped"):
            return
        params = {}
        for t in self.trials(role=ROLE_SEARCH):
            params.setdefault(config_key_of(t), t)
        for pos, key in enumerate(plan["order"]):
            slot = f"runoff/0/{key}"
            if any(claim_key_of(t) == slot and (t.state in (TrialState.COMPLETE, TrialState.RUNNING)
                                               or (t.state == TrialState.FAIL and not interrupted(t)))
                   for t in self.study.get_trials(deepcopy=False)):
                continue  # made already (a resumed run): never again
            if self.budget.pause_due():
                self.paused = True
                return
            if self.budget_starts() >= self.spec.budget.max_server_starts:
                return
            t = params[key]
            bands = bands_of(t)
            self._run_enqueued(dict(t.params), ROLE_SEARCH, claim_key=slot,
                               attrs={**({"bands": bands} if bands else {}), "repeat": True,
                                      "runoff_round": 0, "runoff_position": pos})

    def nominate(self) -> dict | None:
        """The predictor's nominee (``_nominee``) that the confirmation confirms in place of the
        search's best: planned once, after the runoff, and stored (``nominee`` study attribute) so a
        resumed run confirms the same one; ``dropped`` says why once a guard ruled it out
        (``_confirm``). None where ``objective.nominee`` is off, the search was not the predictor's,
        its sampler stopped it (nothing left likely to beat the best), last night's search was carried
        (``carry_search``: its ranking stands), there is nothing to confirm, or no unmeasured
        configuration is more likely than not faster than the best measured start."""
        plan = nominee_of(self.study)
        if plan or not self.leader:
            return plan or None
        o, s = self.spec.objective, self.sampler
        best = self.best(search_only=True)
        if not (o.nominee and o.confirm_starts and isinstance(s, CandidateSampler) and s.mode == "predictor") \
                or any(sampler_stop_of(t) for t in self.study.get_trials(deepcopy=False)) or best is None \
                or (self.study.user_attrs.get("carry") or {}).get("carried"):
            return None
        obs = [x for x in (_observations.observation_from_trial(t, s.level) for t in self.trials()
                           if role_of(t) != ROLE_CONFIRM) if x is not None]
        nom = _nominee.nominate(obs, [c for _, c in s.cands], weights=s.weights, failed=failed_keys(self.study),
                                noise_prior=s.noise_prior, bands_tax=s.bands_tax)
        params = self._enqueueable(nom.config) if nom is not None else None
        if params is None:
            return None
        plan = {**nom.to_attrs(), "params": params,
                "instead_of": {"config_key": config_key_of(best), "label": label(config_of(best)),
                               "tpot_ms": self.mean_objective(best)}}
        self.study.set_user_attr("nominee", plan)
        note = f"nominee: {_nominee.text(plan)}"
        self.notes.append(note)
        log.info("%s", note)
        return plan

    def mean_objective(self, t) -> float:
        """The objective of ``t``'s configuration, averaged over its search starts."""
        ts = [u for u in self.trials(config_key=config_key_of(t)) if role_of(u) != ROLE_CONFIRM]
        return statistics.fmean(self.objective_of(u) for u in ts) if ts else self.objective_of(t)

    def objective_of(self, t) -> float:
        """The trial's objective as this version computes it, from its stored measurement.
        Optuna's stored value is what the version that measured it computed: a study resumed
        after the objective changed (profile studies once pooled both levels' requests) would
        otherwise rank old and new trials on different figures."""
        m = measurement_of(t)
        if not m.get("tpot_ms"):
            return t.value
        return measurement_objective(m.get("levels"), m["tpot_ms"], self.spec.objective.statistic)

    # ---- recovery and claims --------------------------------------------------------------
    def recover(self) -> list[int]:
        """Fail (with the reason) and re-enqueue trials whose process died; see ``_recovery``."""
        done = recover_trials(self.study, self.storage, on_failed=self._record_trial)
        if done:
            self.notes.append(f"resumed: trial(s) {', '.join(map(str, done))} were interrupted and are retried")
        return done

    def _may_take_over(self, holder: int, role: str) -> bool:
        """A claim passes on when its trial gave up: pruned, interrupted, or failed. A search trial
        does not retry a configuration vLLM already refused (that would only spend a start)."""
        return may_take_over(self.storage.get_trial(trial_id(self.study, self.storage, holder)), role)

    def _claim(self, trial, claim_key: str, role: str) -> None:
        import optuna

        if self.store is None:
            return
        ok, holder = self.store.claim(self.name, claim_key, trial.number, lambda h: self._may_take_over(h, role))
        if not ok:
            trial.set_user_attr("duplicate", True)
            raise optuna.TrialPruned(f"trial {holder} measures {claim_key}")

    # ---- the objective --------------------------------------------------------------------
    def objective(self, trial) -> float:
        import optuna

        trial.set_user_attr("owner", process_identity())
        role = role_of(trial) or ROLE_SEARCH
        trial.set_user_attr("role", role)
        proposal = self.study.sampler.proposal(trial.number) if isinstance(self.study.sampler, CandidateSampler) \
            else None
        if proposal is not None and proposal.action == "stop":
            trial.set_user_attr("stop", proposal.reason)
            self.stopped_because = proposal.reason
            trial.study.stop()  # the sampler's decision ends study.optimize; no server starts
            raise optuna.TrialPruned(proposal.reason)
        for k, v in (proposal.attrs.items() if proposal is not None else ()):
            trial.set_user_attr(k, v)
        config = _bands.apply(self.space.suggest(trial), bands_of(trial))
        key = canonical(config)
        trial.set_user_attr("config", config)
        trial.set_user_attr("config_key", key)
        repeat = role == ROLE_SEARCH and (repeat_asked(trial) or runoff_round_of(trial) is not None) \
            and bool(self.trials(config_key=key))
        claim_key = enqueued_claim_key(trial) or (
            f"{key}#{len(self.trials(config_key=key)) + 1}" if repeat else key)
        trial.set_user_attr("claim_key", claim_key)
        if role != ROLE_CONFIRM and self.trials(config_key=key) and not repeat:
            trial.set_user_attr("duplicate", True)
            raise optuna.TrialPruned(f"already measured: {key}")
        if role == ROLE_SEARCH and key == NONE and self.trials(config_key=NONE):
            raise optuna.TrialPruned("baseline already measured")
        if not self.budget.fits(key, (config or {}).get("method", NONE)):
            self.paused = True
            trial.set_user_attr("paused", self.budget.paused_for)
            trial.study.stop()
            raise optuna.TrialPruned(self.budget.paused_for)
        self._claim(trial, claim_key, role)
        reqs = self.confirm_reqs if role == ROLE_CONFIRM else self.search_reqs
        log_path = child(self.home / "logs", self.name) / f"trial-{trial.number:04d}.log"
        trial.set_user_attr("log_path", str(log_path))
        trial.set_user_attr("vllm_version", self.caps.version)
        trial.set_user_attr("hardware", self.hardware)
        trial.set_user_attr("server_starts", 1)
        if self.run_id:
            trial.set_user_attr("run_id", self.run_id)
        began = time.monotonic()
        try:
            m = measure(self.spec, config, reqs, self.warmup, log_path, self.command,
                        on_server=self._track_server, pid_dir=self.pid_dir,
                        extra_args=self.caps.per_request_metrics_args(config is not None),
                        **({"equivalence": self.equivalence_reqs} if self.equivalence_reqs else {}),
                        **({"reserve": self.reserve_reqs} if self.reserve_reqs else {}),
                        **({"windows": self.window_reqs} if self.window_reqs else {}),
                        **({"caps": self.caps} if not self.invariant else {}))
        except TrialFailed as e:
            trial.set_user_attr("error", e.reason)
            if e.timeline:
                trial.set_user_attr("timeline", e.timeline)
            raise
        except KeyboardInterrupt as e:
            # measure() has stopped the server on its way out; say why the trial failed
            for k, v in interrupted_attrs(signame_of(e)).items():
                trial.set_user_attr(k, v)
            raise
        finally:  # every start's length, measured or not (``expected_start_s``)
            trial.set_user_attr("start_s", time.monotonic() - began)
        return self._record(trial, m, role)

    def _track_server(self, server) -> None:
        self.current_server = server

    def _record(self, trial, m: Measurement, role: str) -> float:
        g = self.spec.guards
        stall_verdict(m.summary, m.tpot_source)  # idempotent: measure() sets it; other producers too
        failed = m.summary.get("failed", 0)
        value = measurement_objective(m.levels, m.tpot_ms, self.spec.objective.statistic) if m.tpot_ms else float("inf")
        if m.config:
            base_out, base_texts, refs, tol = self.baseline_reference()
            eq = {**_equivalence.judge(base_out, base_texts, refs, m.outputs, m.texts, tol["nats"], m.token_ids),
                  "tolerance_how": tol["how"]}
        else:  # the baseline: its own outputs, and the engine's numerics it measured
            n = len(m.outputs)
            eq = {"compared": n, "matched": n, "identical": n, "near_ties": 0, "differs": 0,
                  **({"engine_noise": m.engine_noise} if m.engine_noise else {})}
        match_frac = eq["matched"] / eq["compared"] if eq["compared"] else 1.0
        base_tp = self.baseline_throughput() if m.config else m.summary["output_throughput_tok_s"]
        tp_ratio = m.summary["output_throughput_tok_s"] / base_tp if base_tp else 1.0
        constraints = [float(failed - g.max_failed_requests), g.equivalence_min_match - match_frac,
                       g.throughput_floor - tp_ratio]
        trial.set_user_attr("measurement", m.to_attrs())
        trial.set_user_attr("equivalence", eq)
        trial.set_user_attr("throughput_ratio", tp_ratio)
        for name, c in zip(("failed_requests", "equivalence", "throughput_floor"), constraints):
            trial.set_constraint(name, c)
        if m.config and m.config.get(_bands.BANDS_KEY):  # did the schedule take effect? (see _bands.verify)
            _bands.check_trial(trial, m, next((measurement_of(t).get("levels") for t in self.trials(config_key=NONE)), None))
        # the one stall truth (``_trial.stall_verdict``): client-side TPOT biased by TTFT stalls
        trial.set_user_attr("stalled", bool((m.summary.get("stall") or {}).get("stalled", False)))
        trial.set_user_attr("noise", {"within_start": m.summary.get("noise"),
                                      "start_to_start": self.start_to_start_noise(m)})
        if not m.tpot_ms:
            trial.set_user_attr("error", "no request completed: " + "; ".join(m.errors[:3]))
        return value

    def _record_trial(self, frozen) -> None:
        """The trial's headline numbers into autotune_trials (SRE reports, exporter)."""
        if self.store is None or frozen.state.name in ("WAITING", "RUNNING", "PRUNED"):
            return  # pruned trials started nothing (duplicates, already measured)
        try:
            self.store.upsert_trial(trial_row(frozen, self.name, self.run_id, self.spec.workload))
        except Exception as e:  # the report table must never fail a study
            log.warning("cannot record trial %s in autotune_trials: %s", frozen.number, e)

    # ---- driving -------------------------------------------------------------------------
    def _bands_max_batch(self, spec: StudySpec, caps: Capabilities) -> int | None:
        """The largest batch a band schedule covers, when bands are searched (a profile of 2+ levels)."""
        if spec.space.bands.enabled and len(study_weights(spec)) >= 2:
            if caps.supports_bands():
                return int(spec.engine.serve_args.get("max_num_seqs") or 256)
            self.notes.append(f"bands: vLLM {caps.version} has no num_speculative_tokens_per_batch_size")
        return None

    def confirm_reserve(self) -> int:
        """Server starts the search leaves for the confirmation (``_budget.confirm_reserve``), none
        while every speculative configuration measured so far failed a guard: no confirmation can
        happen then, so its starts go to the search, and come back once a candidate passes."""
        if self.all_blocked():
            if not self._said_blocked:
                self._said_blocked = True
                note = (f"guards: every speculative configuration measured so far failed a guard; no confirmation "
                        f"can happen until one passes, so the {confirm_reserve(self.spec)} starts kept for it go to "
                        "the search")
                self.notes.append(note)
                log.warning("%s", note)
            return 0
        return confirm_reserve(self.spec)

    def all_blocked(self) -> bool:
        """Speculative configurations completed, and every one failed a guard."""
        spec_trials = [t for t in self.trials() if config_key_of(t) != NONE and t.constraints]
        return bool(spec_trials) and self.best() is None

    def _callback(self, study, frozen) -> None:
        import optuna

        self._record_trial(frozen)
        if ended_unmeasured(frozen):
            return  # the sampler's stop or the run's clock: nothing was measured, study.stop() was called
        best = self.best()
        self.on_event(TrialEvent(
            number=frozen.number, role=role_of(frozen) or ROLE_SEARCH,
            config=config_of(frozen), state=frozen.state.name,
            value=frozen.value if frozen.state == optuna.trial.TrialState.COMPLETE else None,
            best=self.mean_objective(best) if best else None, server_starts=self.server_starts(),
            elapsed_s=time.monotonic() - self.t0,
            note=error_of(frozen) or ("duplicate" if duplicate(frozen) else "")))
        reason = self.budget.left(reserve=self.confirm_reserve()
                                   if role_of(frozen) != ROLE_CONFIRM else 0)
        self._dupes = self._dupes + 1 if duplicate(frozen) else 0
        if self._dupes >= 25:
            reason = "the sampler keeps proposing measured configurations"
        if role_of(frozen) != ROLE_CONFIRM and runoff_round_of(frozen) is None \
                and (reason or self.budget.pause_due()):
            if reason:
                self.stopped_because = reason
            else:
                self.paused = True
            study.stop()

    def _optimize_one(self) -> None:
        self.study.optimize(self.objective, n_trials=1, catch=(TrialFailed,), callbacks=[self._callback],
                            gc_after_trial=False)

    def _run_enqueued(self, params: dict, role: str, claim_key: str | None = None, attrs: dict | None = None) -> None:
        """Enqueue (unless a retry of it already waits) and run until it is no longer waiting.
        Optuna hands out the oldest waiting trial first, so retries of interrupted trials run
        first; a trial another worker picks up is simply no longer ours to wait for.
        ``attrs``: more user attributes (the predictor's prediction; ``bands``: a band schedule)."""
        from optuna.trial import TrialState

        key = canonical(_bands.apply(self.space.config_from_params(params), (attrs or {}).get("bands")))
        claim_key = claim_key or key
        if not self._in_state((TrialState.WAITING,), claim_key):
            self.study.enqueue_trial(params, user_attrs={**(attrs or {}), "role": role, "config_key": key,
                                                         "claim_key": claim_key}, skip_if_exists=False)
        while self._in_state((TrialState.WAITING,), claim_key):
            self._optimize_one()

    def _wait_while_running(self, claim_key: str | None = None, timeout_s: float | None = None) -> None:
        """Another worker is measuring it (or anything, when ``claim_key`` is None): wait, and
        fail its trial if that worker dies meanwhile (heartbeat), so the wait ends."""
        from optuna.trial import TrialState

        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while self._in_state((TrialState.RUNNING,), claim_key):
            if deadline is not None and time.monotonic() > deadline:
                return
            time.sleep(self.poll_s)
            self.recover()

    def run(self, confirm: bool = True) -> StudyOutcome:
        """The baseline, the incumbent and warm start, the search, and (``confirm``, the leader
        only) the confirmation rounds. Without ``confirm`` the caller runs ``confirm()`` itself
        (the runner's confirm step) and reads ``outcome()`` after it."""
        from optuna.trial import TrialState

        self._dupes = 0
        while not self.trials(config_key=NONE) and not self.budget.blocked(self.confirm_reserve()):
            if self._in_state((TrialState.RUNNING,), NONE):
                self._wait_while_running(NONE)          # another worker runs the baseline
            elif not self._in_state((TrialState.WAITING,), NONE) and self._baseline_failed_here():
                break
            else:
                self._run_enqueued({"method": NONE}, ROLE_BASELINE)
        if self.paused:
            return self.outcome()
        if not self.trials(config_key=NONE):
            raise TrialFailed("the no-speculation baseline failed; nothing can be compared "
                              f"(see {self.home / 'logs' / self.name})")
        for cfg in ([self.spec.incumbent] if self.spec.incumbent else []) + self.warm_start:
            params = self._enqueueable(cfg)
            if params and not self.trials(config_key=canonical(cfg)) and not self.budget.blocked(self.confirm_reserve()):
                self._run_enqueued(params, ROLE_SEARCH)
        self.fidelity = None
        if self.leader and self.spec.production.telemetry and self.fidelity_check is not None:
            self.fidelity = self.fidelity_check(self)  # no search on a replay that misses production
        carried = self.carry_search()
        for method in ([] if carried else self.space.methods):
            params = self.space.params_for(method)
            if self.trials(config_key=canonical(self.space.config_from_params(params))):
                continue
            if self.budget.blocked(self.confirm_reserve()):
                break
            self._run_enqueued(params, ROLE_SEARCH)
        # objective.search: the sampler (predictor, grid, random: _sampler.CandidateSampler; tpe) drives
        # study.optimize; TPE first measures each method's acceptance knee (SearchSpace.knee_k)
        searched = isinstance(self.study.sampler, CandidateSampler)
        for method in ([] if searched or carried else self.space.methods):
            top = self.trials(config_key=canonical(self.space.config_from_params(self.space.params_for(method))))
            rates = measurement_of(top[0])["spec_delta"].get("per_position_rates") if top else None
            knee = self.space.knee_k(method, rates or [])
            params = self.space.params_for(method, knee) if knee else None
            if params and not self.trials(config_key=canonical(self.space.config_from_params(params))) \
                    and not self.budget.blocked(self.confirm_reserve()):
                self._run_enqueued(params, ROLE_SEARCH)
        if not carried and not self.paused and not self.budget.blocked(self.confirm_reserve()):
            self.study.optimize(self.objective, catch=(TrialFailed,), callbacks=[self._callback],
                                gc_after_trial=False)
        if not self.paused:
            self.stopped_because = carried or self.stopped_because or self.budget.left(self.confirm_reserve()) \
                or "search finished"
            if self.stopped_because and self.leader:
                self.study.set_user_attr("stopped_because", self.stopped_because)
            if self.leader:
                self._wait_while_running()  # other workers' last trials belong in the decision
                self.runoff()
                if confirm and not self.paused:
                    self.confirm()
        return self.outcome()

    def outcome(self) -> StudyOutcome:
        """What the study has done so far: its trials, starts, why it stopped, whether it paused."""
        return StudyOutcome(study_name=self.name, storage=self.storage_url,
                            trials=self.study.get_trials(deepcopy=False), server_starts=self.server_starts(),
                            interrupted_starts=self.interrupted_starts(),
                            wall_s=time.monotonic() - self.t0,
                            stopped_because=self.budget.pause_reason() if self.paused else self.stopped_because,
                            paused=self.paused)

    def _baseline_failed_here(self) -> bool:
        """The baseline failed in this process already: do not start it again and again."""
        return failed_here(self.study.get_trials(deepcopy=False), NONE)

    def _enqueueable(self, config: dict | None) -> dict | None:
        """Optuna params for a known config (incumbent, yesterday's winner), or None when the
        space cannot express it (method dropped, K or knob outside the spec's lists)."""
        if not config:
            return None
        if config.get("method") not in self.space.methods:
            self.notes.append(f"warm start {canonical(config)} skipped: method not in tonight's space")
            return None
        params = params_of(config, self.space)
        ok = self.space.config_from_params(params) == config and in_space(self.space, params)
        if not ok:
            self.notes.append(f"warm start {canonical(config)} skipped: outside the spec's space")
            return None
        return params

    def confirm(self) -> None:
        """Fresh starts of baseline, incumbent and winner on the confirmation requests, interleaved
        round by round, ``confirm_starts`` each, then more while ``confirm_open()`` says the decision
        is still open, up to ``confirm_max_starts`` (``_confirm.Confirmation``). The decision uses
        these starts only. What ran, and why a round did not, is kept in ``self.confirmation``."""
        self.confirming.run(self)

    def fail_own_running(self, signame: str) -> None:
        """After the signal ``signame``: any trial of this process still RUNNING is failed, marked
        as stopped by it (``interrupted_attrs``)."""
        fail_own_running(self.study, self.storage, signame, self._record_trial)
