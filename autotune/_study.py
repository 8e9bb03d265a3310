"""Optuna orchestration: baseline first, then the search, then a confirmation of the winner.

Each trial is one server start (or none, for a configuration already measured). The study lives
in Optuna's RDB storage (SQLite by default), named after the workload and a fingerprint of what
was measured (replay set, model, engine setup, space), so a rerun on the same inputs resumes
and a night with fresh traffic starts a new study.

Order of work, spending server starts on purpose:
1. the no-speculation baseline (the reference every ratio is taken against);
2. each method at its largest K (its per-position acceptance covers every smaller K);
3. Optuna's TPE sampler, guards as constraints, until the budget or the space runs out;
4. ``confirm_starts`` fresh starts each of baseline and winner on fresh requests, so the
   winner's curse and start-to-start variance show up in the confidence interval.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from . import _measure, _replayset
from ._probe import Capabilities
from ._space import NONE, SearchSpace, canonical
from ._spec import StudySpec
from ._trial import Measurement, TrialFailed, measure

log = logging.getLogger(__name__)

ROLE_BASELINE, ROLE_SEARCH, ROLE_CONFIRM = "baseline", "search", "confirm"


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
    wall_s: float = 0.0
    stopped_because: str = ""


def fingerprint(spec: StudySpec, replay_digest: str, caps: Capabilities) -> str:
    blob = json.dumps({"replay": replay_digest, "model": spec.model, "serve": spec.engine.serve_args,
                       "vllm": caps.version, "space": spec.space.model_dump(), "seed": spec.seed,
                       "concurrency": spec.replay.concurrency}, sort_keys=True, default=str)
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


class Study:
    def __init__(self, spec: StudySpec, caps: Capabilities, space: SearchSpace, storage: str,
                 command: list[str], home: Path, study_name: str | None = None,
                 on_event: Callable[[TrialEvent], None] | None = None):
        import optuna

        self.spec, self.caps, self.space = spec, caps, space
        self.command, self.home = command, home
        self.on_event = on_event or (lambda e: None)
        self.replay_set = _replayset.load(spec.replay.path)
        self.warmup, self.search_reqs, self.confirm_reqs = split_requests(spec, self.replay_set)
        self.name = study_name or f"{spec.study_name}-{fingerprint(spec, self.replay_set.digest, caps)}"
        self.storage_url = storage
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(seed=spec.seed, n_startup_trials=4, multivariate=True,
                                                 group=True)
            self.storage = optuna.storages.RDBStorage(storage, heartbeat_interval=60, grace_period=180)
        self.study = optuna.create_study(study_name=self.name, storage=self.storage, direction="minimize",
                                         sampler=sampler, load_if_exists=True)
        self.study.set_user_attr("workload", spec.workload)
        self.study.set_user_attr("replay_digest", self.replay_set.digest)
        self.study.set_user_attr("vllm_version", caps.version)
        self.t0 = time.monotonic()
        self.current_server = None
        self.stopped_because = ""

    # ---- bookkeeping over stored trials -------------------------------------------------
    def trials(self, role: str | None = None, config_key: str | None = None, complete=True):
        import optuna

        out = []
        for t in self.study.get_trials(deepcopy=False):
            if complete and t.state != optuna.trial.TrialState.COMPLETE:
                continue
            if role and t.user_attrs.get("role") != role:
                continue
            if config_key and t.user_attrs.get("config_key") != config_key:
                continue
            out.append(t)
        return out

    def server_starts(self) -> int:
        return sum(int(t.user_attrs.get("server_starts", 0)) for t in self.study.get_trials(deepcopy=False))

    def search_trials(self) -> int:
        return sum(1 for t in self.study.get_trials(deepcopy=False)
                   if t.user_attrs.get("role") in (ROLE_BASELINE, ROLE_SEARCH)
                   and t.user_attrs.get("server_starts", 0))

    def baseline_outputs(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for t in self.trials(config_key=NONE):
            out.update(t.user_attrs.get("measurement", {}).get("outputs", {}))
        return out

    def baseline_throughput(self) -> float | None:
        vals = [t.user_attrs["measurement"]["summary"]["output_throughput_tok_s"] for t in self.trials(config_key=NONE)]
        return sum(vals) / len(vals) if vals else None

    def best(self):
        """Best feasible measured speculative config (by the objective), or None."""
        cands = [t for t in self.trials() if t.user_attrs.get("config_key") != NONE
                 and t.constraints and all(c <= 0 for c in t.constraints.values())]
        return min(cands, key=lambda t: t.value) if cands else None

    # ---- the objective --------------------------------------------------------------------
    def objective(self, trial) -> float:
        import optuna

        role = trial.user_attrs.get("role") or ROLE_SEARCH
        trial.set_user_attr("role", role)
        config = self.space.suggest(trial)
        key = canonical(config)
        trial.set_user_attr("config", config)
        trial.set_user_attr("config_key", key)
        if role != ROLE_CONFIRM and self.trials(config_key=key):
            trial.set_user_attr("duplicate", True)
            raise optuna.TrialPruned(f"already measured: {key}")
        if role == ROLE_SEARCH and key == NONE and self.trials(config_key=NONE):
            raise optuna.TrialPruned("baseline already measured")
        reqs = self.confirm_reqs if role == ROLE_CONFIRM else self.search_reqs
        log_path = self.home / "logs" / self.name / f"trial-{trial.number:04d}.log"
        trial.set_user_attr("log_path", str(log_path))
        trial.set_user_attr("vllm_version", self.caps.version)
        trial.set_user_attr("server_starts", 1)
        try:
            m = measure(self.spec, config, reqs, self.warmup, log_path, self.command,
                        on_server=self._track_server, extra_args=self.caps.per_request_metrics_args(config is not None))
        except TrialFailed as e:
            trial.set_user_attr("error", e.reason)
            raise
        return self._record(trial, m, role)

    def _track_server(self, server) -> None:
        self.current_server = server

    def _record(self, trial, m: Measurement, role: str) -> float:
        g = self.spec.guards
        failed = m.summary.get("failed", 0)
        value = _measure.summarize(m.tpot_ms, self.spec.objective.statistic) if m.tpot_ms else float("inf")
        base_out = self.baseline_outputs() if m.config else m.outputs
        compared = [rid for rid in m.outputs if rid in base_out]
        matched = sum(1 for rid in compared if m.outputs[rid] == base_out[rid])
        match_frac = matched / len(compared) if compared else 1.0
        base_tp = self.baseline_throughput() if m.config else m.summary["output_throughput_tok_s"]
        tp_ratio = m.summary["output_throughput_tok_s"] / base_tp if base_tp else 1.0
        constraints = [float(failed - g.max_failed_requests), g.equivalence_min_match - match_frac,
                       g.throughput_floor - tp_ratio]
        trial.set_user_attr("measurement", m.to_attrs())
        trial.set_user_attr("equivalence", {"compared": len(compared), "matched": matched})
        trial.set_user_attr("throughput_ratio", tp_ratio)
        for name, c in zip(("failed_requests", "equivalence", "throughput_floor"), constraints):
            trial.set_constraint(name, c)
        # client-side stalls bias only client-side TPOT; the engine's own timings are immune
        trial.set_user_attr("stalled", m.tpot_source == "client"
                            and bool((m.summary.get("stall") or {}).get("stalled", False)))
        if not m.tpot_ms:
            trial.set_user_attr("error", "no request completed: " + "; ".join(m.errors[:3]))
        return value

    # ---- driving -------------------------------------------------------------------------
    def _budget_left(self, reserve: int = 0) -> str | None:
        b = self.spec.budget
        if self.server_starts() + reserve >= b.max_server_starts:
            return f"server-start budget ({b.max_server_starts}) reached"
        if self.search_trials() >= b.max_trials:
            return f"trial budget ({b.max_trials}) reached"
        if (time.monotonic() - self.t0) / 60 >= b.max_wall_minutes:
            return f"wall-time budget ({b.max_wall_minutes} min) reached"
        if len({t.user_attrs.get("config_key") for t in self.trials()}) >= self.space.size():
            return "every configuration in the space was measured"
        return None

    def _callback(self, study, frozen) -> None:
        import optuna

        best = self.best()
        self.on_event(TrialEvent(
            number=frozen.number, role=frozen.user_attrs.get("role", ROLE_SEARCH),
            config=frozen.user_attrs.get("config"), state=frozen.state.name,
            value=frozen.value if frozen.state == optuna.trial.TrialState.COMPLETE else None,
            best=best.value if best else None, server_starts=self.server_starts(),
            elapsed_s=time.monotonic() - self.t0,
            note=frozen.user_attrs.get("error", "") or ("duplicate" if frozen.user_attrs.get("duplicate") else "")))
        reason = self._budget_left(reserve=2 * self.spec.objective.confirm_starts
                                   if frozen.user_attrs.get("role") != ROLE_CONFIRM else 0)
        self._dupes = self._dupes + 1 if frozen.user_attrs.get("duplicate") else 0
        if self._dupes >= 25:
            reason = "the sampler keeps proposing measured configurations"
        if reason and frozen.user_attrs.get("role") != ROLE_CONFIRM:
            self.stopped_because = reason
            study.stop()

    def _run_enqueued(self, params: dict, role: str) -> None:
        self.study.enqueue_trial(params, user_attrs={"role": role}, skip_if_exists=False)
        self.study.optimize(self.objective, n_trials=1, catch=(TrialFailed,), callbacks=[self._callback],
                            gc_after_trial=False)

    def run(self) -> StudyOutcome:
        self._dupes = 0
        reserve = 2 * self.spec.objective.confirm_starts
        if not self.trials(config_key=NONE) and not self._budget_left(reserve):
            self._run_enqueued({"method": NONE}, ROLE_BASELINE)
        if not self.trials(config_key=NONE):
            raise TrialFailed("the no-speculation baseline failed; nothing can be compared "
                              f"(see {self.home / 'logs' / self.name})")
        if self.spec.incumbent:
            inc_key = canonical(self.spec.incumbent)
            if not self.trials(config_key=inc_key) and not self._budget_left(reserve):
                self._run_enqueued(_params_of(self.spec.incumbent, self.space), ROLE_SEARCH)
        for method in self.space.methods:
            if self._budget_left(reserve):
                break
            params = self.space.params_for(method)
            if not self.trials(config_key=canonical(self.space.config_from_params(params))):
                self._run_enqueued(params, ROLE_SEARCH)
        if not self._budget_left(reserve):
            self.study.optimize(self.objective, catch=(TrialFailed,), callbacks=[self._callback],
                                gc_after_trial=False)
        self.stopped_because = self.stopped_because or self._budget_left(reserve) or "search finished"
        self.confirm()
        return StudyOutcome(study_name=self.name, storage=self.storage_url,
                            trials=self.study.get_trials(deepcopy=False), server_starts=self.server_starts(),
                            wall_s=time.monotonic() - self.t0, stopped_because=self.stopped_because)

    def confirm(self) -> None:
        """Fresh starts of baseline and winner, interleaved, until each has confirm_starts."""
        best = self.best()
        n = self.spec.objective.confirm_starts
        if best is None or n == 0:
            return
        b_params = {"method": NONE}
        w_params = dict(best.params)
        for _ in range(n):
            for params, key in ((b_params, NONE), (w_params, best.user_attrs["config_key"])):
                have = len(self.trials(role=ROLE_CONFIRM, config_key=key))
                if have < n and self.server_starts() < self.spec.budget.max_server_starts:
                    self._run_enqueued(params, ROLE_CONFIRM)


def _params_of(config: dict, space: SearchSpace) -> dict:
    method = config["method"]
    params = {"method": method, f"{method}.k": config.get("num_speculative_tokens", 1)}
    if method == "ngram":
        params["ngram.window"] = f"{config.get('prompt_lookup_min', 5)}-{config.get('prompt_lookup_max', 5)}"
    elif method in ("draft_model", "eagle", "eagle3"):
        params[f"{method}.model"] = config["model"]
    return params
