"""What flows from the study to the stages above it: typed, frozen records of trials and studies.

The study keeps its trials in Optuna (``user_attrs`` dicts). Writing them is the glue's job
(``_study``, ``_trials``, ``_recovery``: ``set_user_attr``, ``storage.set_trial_user_attr``);
reading them is this module's alone: decide, trust and report read its records, and the search's
own glue its one-attribute readers (``role_of``, ``measurement_of``, ...), so a renamed or
missing attribute is found in one place rather than in every reader, and a decision is a pure
function of a value a test can build. A record is a snapshot: the study goes on, the record does
not; read it again after more trials ran.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any


@dataclass(frozen=True)
class TrialRecord:
    """One stored trial (one server start, or a start that failed or never ran)."""

    number: int
    state: str                                  # Optuna's state name: COMPLETE, FAIL, RUNNING, WAITING, PRUNED
    value: float | None = None                  # the objective as stored when it was measured
    role: str | None = None                     # baseline | search | confirm
    config: dict | None = None                  # the speculative config measured (None: no speculation)
    config_key: str | None = None               # ``_space.canonical(config)``
    measurement: Mapping = field(default_factory=dict)  # ``Measurement.to_attrs()``; empty when none was made
    stalled: bool = False                       # TTFT stalls biased its client-side TPOT (``_trial.stall_verdict``)
    equivalence: Mapping = field(default_factory=dict)  # greedy outputs compared with the baseline's
    server_starts: int = 0
    error: str | None = None
    noise: Mapping | None = None                # within-start and start-to-start noise (``_trial.noise_text``)
    predicted_tpot_ms: float | None = None      # the predictor's figure before the start
    predicted_ci: tuple | None = None
    bands_check: Mapping | None = None          # did a band schedule take effect (``_bands.check_trial``)
    runoff_round: int | None = None             # a start of the search's runoff (``_runoff``)
    constraints: Mapping = field(default_factory=dict)  # the guards, Optuna-style (<= 0: satisfied)
    datetime_start: dt.datetime | None = None
    datetime_complete: dt.datetime | None = None
    failed_timeline: Mapping | None = None      # a failed start's ``timeline``, as far as it got

    @property
    def tpot_ms(self) -> list:
        """Per-request TPOTs of the start (empty when none completed)."""
        return self.measurement.get("tpot_ms") or []

    @property
    def summary(self) -> Mapping:
        return self.measurement.get("summary") or {}

    @property
    def levels(self) -> Mapping:
        """Per concurrency level (a profile study): TPOTs, weight; empty otherwise."""
        return self.measurement.get("levels") or {}

    @property
    def counters(self) -> Mapping:
        """The speculation counters' deltas over the start (``measurement.spec_delta``)."""
        return self.measurement.get("spec_delta") or {}

    @property
    def timeline(self) -> Mapping:
        """Where the start's seconds went (``_trial.timeline``); empty for a trial before them."""
        return self.measurement.get("timeline") or self.failed_timeline or {}

    def noise_attrs(self) -> dict:
        """What ``_trial.noise_text`` reads."""
        return {"measurement": self.measurement, "noise": self.noise}


@dataclass(frozen=True)
class StudyRecord:
    """One study as the stages above search see it: its trials and what the run knew about it.

    ``spec``, ``replay_set``, ``confirmation``, ``fidelity`` and ``search_best`` come from the live
    run (``study_record``); a study read back from storage alone (``read_study``) has its stored
    attributes and trials, and whatever the caller passes."""

    name: str | None
    workload: str | None = None
    all_trials: tuple[TrialRecord, ...] = ()    # every trial, every state, by number
    spec: Any = None                            # the StudySpec the run used (profile levels filled in)
    fingerprint: str | None = None
    hardware: str | None = None                 # None: not known (then not compared)
    vllm_version: str | None = None             # None: not known (then not compared)
    replay_digest: str | None = None
    replay_set: Any = None                      # the ``ReplaySet`` measured on
    dropped_methods: Mapping = field(default_factory=dict)  # methods the space dropped, with why
    confirmation: Mapping = field(default_factory=dict)     # what the confirmation rounds did (``Study.confirm``)
    confirm_looks: int | None = None
    fidelity: Mapping | None = None             # the fidelity gate's block, when it ran
    predictor: Mapping | None = None            # the predictor's stored curves, for the report
    search_best: int | None = None              # the number of the search's pick (``Study.best(search_only=True)``)
    runoff: Mapping = field(default_factory=dict)  # the search's runoff: entrants, order, or why it was skipped
    nominee: Mapping = field(default_factory=dict)  # the predictor's nominee the confirmation confirmed (``_nominee``)
    carry: Mapping | None = None                # a nightly run's carry of last night's search (``_carry``)

    def trials(self, role: str | None = None, config_key: str | None = None, complete: bool = True) -> list[TrialRecord]:
        """The trials (completed ones unless ``complete`` is false), of one role or config."""
        return [t for t in self.all_trials
                if (not complete or t.state == "COMPLETE") and (not role or t.role == role)
                and (not config_key or t.config_key == config_key)]

    def best(self) -> TrialRecord | None:
        """The winner the confirmation confirmed, the one the decision judges: the trial the search
        picked (None: no feasible speculative config was measured), or, where the predictor's
        nominee was confirmed in its place (``nominated``), the nominee's first confirmation start,
        or before it has one a record of the configuration alone (``NOMINATED``, no start)."""
        key = self.nominated()
        if key is not None:
            started = [t for t in self.all_trials if t.config_key == key and t.role == "confirm"
                       and t.state == "COMPLETE"]
            return started[0] if started else TrialRecord(number=-1, state="NOMINATED", config=self.nominee.get("config"),
                                                          config_key=key)
        return next((t for t in self.all_trials if t.number == self.search_best), None) \
            if self.search_best is not None else None

    def nominated(self) -> str | None:
        """The config key of the predictor's nominee where the confirmation confirms it in place
        of the search's pick (None: no nominee, or one dropped for a guard)."""
        n = self.nominee or {}
        return n.get("config_key") if n.get("config_key") and not n.get("dropped") else None


# ---- one attribute of a stored trial (frozen or live): the glue's reads, where a whole record per
# trial would cost more than the read (budget, claims, recovery, the sampler's loops)
def role_of(t) -> str | None:
    return t.user_attrs.get("role")


def config_key_of(t) -> str | None:
    return t.user_attrs.get("config_key")


def claim_key_of(t) -> str | None:
    """What the trial claims (a repeat's or a confirmation round's slot), else its config key."""
    a = t.user_attrs
    return a.get("claim_key") or a.get("config_key")


def enqueued_claim_key(t) -> str | None:
    """The slot the trial was enqueued to claim (None: its config key, set when it runs)."""
    return t.user_attrs.get("claim_key")


def config_of(t) -> dict | None:
    return t.user_attrs.get("config")


def says_config(t) -> bool:
    """The trial says what it measured (a config, or None for no speculation)."""
    return "config" in t.user_attrs


def measurement_of(t) -> dict:
    """``Measurement.to_attrs()``; {} when none was made."""
    return t.user_attrs.get("measurement") or {}


def server_starts_of(t) -> int:
    return int(t.user_attrs.get("server_starts", 0) or 0)


def error_of(t) -> str | None:
    return t.user_attrs.get("error")


def failed_with_error(t) -> bool:
    """The trial carries an error (a FAIL without one never got as far as starting)."""
    return "error" in t.user_attrs


def interrupted(t) -> bool:
    """Its start was cut short (a signal, or its process died), not refused by vLLM."""
    return bool(t.user_attrs.get("interrupted"))


def stopped_by_signal(t) -> bool:
    """The trial's start was stopped by SIGINT or SIGTERM (``interrupted_by``; storages written before
    that mark say it in the error: ``interrupted by SIGINT: ...``), not by its process dying."""
    a = t.user_attrs
    return bool(a.get("interrupted_by")) or str(a.get("error") or "").startswith("interrupted by SIG")


def died_with_its_process(t) -> bool:
    """The run that made the trial's start ended during it: its autotune process died (kill -9, the
    OOM killer, a reboot) or, in a daemon, its database failed mid-trial. A later run's recovery
    failed it (``_recovery``, ``process_died``; storages written before that mark say it in the
    error: ``interrupted: its autotune process ... died``)."""
    a = t.user_attrs
    return bool(a.get("process_died")) or str(a.get("error") or "").startswith("interrupted: its autotune process")


def owner_of(t) -> dict:
    """The process that ran the trial (``engines._recovery.process_identity``); {} when none."""
    return t.user_attrs.get("owner") or {}


def start_s_of(t) -> float | None:
    """How long its server start took, as measured (None: not recorded)."""
    s = t.user_attrs.get("start_s")
    return float(s) if s is not None else None


def stalled(t) -> bool:
    return bool(t.user_attrs.get("stalled"))


def predicted_tpot_of(t) -> float | None:
    return t.user_attrs.get("predicted_tpot_ms")


def bands_of(t) -> dict | None:
    """The band schedule the trial was enqueued with (a confirmation of a banded winner)."""
    return t.user_attrs.get("bands")


def repeat_asked(t) -> bool:
    """The sampler asked for another start of a measured configuration."""
    return bool(t.user_attrs.get("repeat"))


def duplicate(t) -> bool:
    return bool(t.user_attrs.get("duplicate"))


def ended_unmeasured(t) -> bool:
    """The sampler's stop or the run's pause: the trial started nothing."""
    a = t.user_attrs
    return bool(a.get("stop") or a.get("paused"))


def run_id_of(t) -> str | None:
    return t.user_attrs.get("run_id")


def log_path_of(t) -> str | None:
    return t.user_attrs.get("log_path")


_WHAT_TO_RUN = ("role", "config_key", "claim_key", "repeat", "runoff_round", "runoff_position")


def what_to_run(t) -> dict:
    """The attributes that say what the trial runs (a retry keeps these, not the dead attempt's
    error or measurement)."""
    a = t.user_attrs
    return {k: a[k] for k in _WHAT_TO_RUN if k in a}


# ---- one attribute of a stored study (or its summary)
def study_hardware(s) -> str | None:
    """The hardware the study was first measured on (``_trials.open_study``)."""
    return s.user_attrs.get("hardware")


def study_inputs(s) -> str | None:
    """Its fingerprint without hardware: what a worker on other hardware would join."""
    return s.user_attrs.get("inputs")


def study_workload(s) -> str | None:
    return s.user_attrs.get("workload")


def study_vllm_version(s) -> str | None:
    """The engine version the study measured (``_trials.open_study``)."""
    return s.user_attrs.get("vllm_version")


def runoff_of(s) -> dict:
    """The search's runoff as the study stored it (``Study.runoff``): entrants and order, or why
    it was skipped; {} when none was planned."""
    return s.user_attrs.get("runoff") or {}


def nominee_of(s) -> dict:
    """The predictor's nominee as the study stored it (``Study.nominate``): the configuration, its
    prediction, the search's best it displaced, and ``dropped`` once a guard ruled it out; {} when
    none was nominated."""
    return s.user_attrs.get("nominee") or {}


def sampler_stop_of(t) -> str | None:
    """Why the search's sampler stopped the search, on the trial that received its stop (None: not one)."""
    return t.user_attrs.get("stop")


def runoff_round_of(t) -> int | None:
    """The runoff round of a start of the search's runoff (None: not one)."""
    r = t.user_attrs.get("runoff_round")
    return None if r is None else int(r)


def confirm_looks_of(s) -> int | None:
    """The confirmation's looks, fixed before its first start (``_confirm.Confirmation.looks``)."""
    return s.user_attrs.get("confirm_looks")


def trial_record(t) -> TrialRecord:
    """The record of an Optuna ``FrozenTrial``."""
    a = t.user_attrs
    ci = a.get("predicted_ci")
    cons = getattr(t, "constraints", None)
    return TrialRecord(
        number=t.number, state=t.state.name, value=t.value, role=a.get("role"), config=a.get("config"),
        config_key=a.get("config_key"), measurement=a.get("measurement") or {}, stalled=bool(a.get("stalled")),
        equivalence=a.get("equivalence") or {}, server_starts=int(a.get("server_starts", 0) or 0),
        error=a.get("error"), noise=a.get("noise"), predicted_tpot_ms=a.get("predicted_tpot_ms"),
        failed_timeline=a.get("timeline"),
        predicted_ci=tuple(ci) if ci is not None else None, bands_check=a.get("bands_check"),
        runoff_round=runoff_round_of(t),
        constraints=cons if isinstance(cons, dict) else {},
        datetime_start=t.datetime_start, datetime_complete=t.datetime_complete)


def read_study(optuna_study, **context) -> StudyRecord:
    """The record of an Optuna study as stored: its trials and study attributes. ``context``
    sets the fields storage does not hold (``spec``, ``replay_set``, ``confirmation``, ...) or
    overrides a stored one."""
    a = optuna_study.user_attrs
    rec = StudyRecord(
        name=optuna_study.study_name, workload=a.get("workload"),
        all_trials=tuple(trial_record(t) for t in optuna_study.get_trials(deepcopy=False)),
        hardware=a.get("hardware"), vllm_version=a.get("vllm_version"), replay_digest=a.get("replay_digest"),
        confirm_looks=a.get("confirm_looks"), predictor=a.get("predictor"), runoff=runoff_of(optuna_study),
        nominee=nominee_of(optuna_study), carry=a.get("carry"))
    return replace(rec, **context) if context else rec


def study_record(study) -> StudyRecord:
    """The record of a live ``Study`` (or an object with its attributes: ``study`` (Optuna),
    ``spec``, and any of ``name``, ``caps``, ``hardware``, ``fingerprint``, ``replay_set``,
    ``space``, ``confirmation``, ``fidelity``, ``best``): what decide, trust and report are given."""
    best = study.best(search_only=True) if hasattr(study, "best") else None
    caps = getattr(study, "caps", None)
    space = getattr(study, "space", None)
    spec = getattr(study, "spec", None)
    context = {"name": getattr(study, "name", None), "spec": spec,
               "replay_set": getattr(study, "replay_set", None),
               "confirmation": getattr(study, "confirmation", None) or {},
               "fidelity": getattr(study, "fidelity", None),
               "dropped_methods": getattr(space, "dropped", None) or {},
               "search_best": best.number if best is not None else None}
    for key, value in (("hardware", getattr(study, "hardware", None)), ("vllm_version", getattr(caps, "version", None)),
                       ("fingerprint", getattr(study, "fingerprint", None)),
                       ("workload", getattr(spec, "workload", None))):
        if value is not None:
            context[key] = value
    return read_study(study.study, **context)
