"""Optuna orchestration: baseline first, then the search, then a confirmation of the winner.

Each trial is one server start (or none, for a configuration already measured). The study lives
in Optuna's RDB storage (SQLite by default), named after the workload and a fingerprint of what
was measured (replay set, model, engine setup, space), so a rerun on the same inputs resumes
and a night with fresh traffic starts a new study.

Order of work, spending server starts on purpose:
1. the no-speculation baseline (the reference every ratio is taken against);
2. each method at its largest K (its per-position acceptance covers every smaller K);
3. ``objective.search`` (``_search.drive``): by default the predictor (``_predict``) starts what
   it rates likely to beat the best by more than the noise, band schedules included, and stops
   when nothing is; ``grid``/``random`` measure every candidate; ``tpe`` (or a predictor without
   data) goes on with the acceptance knee (``SearchSpace.knee_k``) and Optuna's TPE sampler,
   guards as constraints, until the budget or the space runs out;
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

from . import _bands, _replayset
from ._levels import measurement_objective
from ._probe import Capabilities
from ._space import NONE, SearchSpace, canonical
from ._spec import StudySpec
from ._signals import signame_of
from ._store import open_optuna_storage
from ._trial import Measurement, TrialFailed, measure

log = logging.getLogger(__name__)

ROLE_BASELINE, ROLE_SEARCH, ROLE_CONFIRM = "baseline", "search", "confirm"
# Optuna heartbeats: a trial whose process stopped beating for the grace period is failed and
# retried by whichever worker looks next (same-host deaths are caught at once, by pid).
HEARTBEAT_INTERVAL_S, HEARTBEAT_GRACE_S = 60, 180


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
                       "concurrency": spec.replay.concurrency,
                       **({"benchmark": spec.benchmark.model_dump()} if spec.benchmark else {})},
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
                 poll_s: float = 2.0):
        import optuna

        from ._recovery import StaleTrialCallback

        self.spec, self.caps, self.space = spec, caps, space
        self.command, self.home = command, home
        self.on_event = on_event or (lambda e: None)
        self.store, self.pid_dir, self.leader, self.run_id, self.poll_s = store, pid_dir, leader, run_id, poll_s
        self.warm_start = list(warm_start or [])
        self.notes: list[str] = []
        self.replay_set = _replayset.load(spec.replay.path)
        from ._search import with_profile  # bands without replay.levels: levels from the traffic
        self.spec = spec = with_profile(spec, self.replay_set, self.notes)
        self.warmup, self.search_reqs, self.confirm_reqs = split_requests(spec, self.replay_set)
        self.fingerprint = fingerprint(spec, self.replay_set.digest, caps)
        self.name = study_name or f"{spec.study_name}-{self.fingerprint}"
        self.storage_url = storage
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            sampler = optuna.samplers.TPESampler(seed=spec.seed if sampler_seed is None else sampler_seed,
                                                 n_startup_trials=4, multivariate=True, group=True)
            self.storage = open_optuna_storage(
                storage, heartbeat_interval=HEARTBEAT_INTERVAL_S, grace_period=HEARTBEAT_GRACE_S,
                heartbeat_stale_trial_callback=StaleTrialCallback(on_failed=self._record_trial))
        self.study = optuna.create_study(study_name=self.name, storage=self.storage, direction="minimize",
                                         sampler=sampler, load_if_exists=True)
        if self.study.user_attrs.get("workload") != spec.workload:
            self.study.set_user_attr("workload", spec.workload)
            self.study.set_user_attr("replay_digest", self.replay_set.digest)
            self.study.set_user_attr("vllm_version", caps.version)
        if store is not None:
            store.record_study(self.name, spec.workload, self.fingerprint, spec.model, caps.version,
                               str(self.replay_set.path), self.replay_set.digest)
        self.t0 = time.monotonic()
        self.current_server = None
        self.stopped_because = ""
        self._dupes = 0
        self.recovered = self.recover()

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

    def _in_state(self, states, claim_key: str | None = None) -> list:
        return [t for t in self.study.get_trials(deepcopy=False, states=states)
                if claim_key is None or _claim_key_of(t) == claim_key]

    def server_starts(self) -> int:
        return sum(int(t.user_attrs.get("server_starts", 0)) for t in self.study.get_trials(deepcopy=False)
                   if t.state.name != "WAITING")

    def search_trials(self) -> int:
        return sum(1 for t in self.study.get_trials(deepcopy=False)
                   if t.user_attrs.get("role") in (ROLE_BASELINE, ROLE_SEARCH)
                   and t.user_attrs.get("server_starts", 0) and t.state.name != "WAITING")

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
        return min(cands, key=self.objective_of) if cands else None

    def objective_of(self, t) -> float:
        """The trial's objective as this version computes it, from its stored measurement.
        Optuna's stored value is what the version that measured it computed: a study resumed
        after the objective changed (profile studies once pooled both levels' requests) would
        otherwise rank old and new trials on different figures."""
        m = t.user_attrs.get("measurement") or {}
        if not m.get("tpot_ms"):
            return t.value
        return measurement_objective(m.get("levels"), m["tpot_ms"], self.spec.objective.statistic)

    # ---- recovery and claims --------------------------------------------------------------
    def recover(self) -> list[int]:
        """Fail (with the reason) and re-enqueue trials whose process died; see ``_recovery``."""
        from ._recovery import recover_trials

        done = recover_trials(self.study, self.storage, on_failed=self._record_trial)
        if done:
            self.notes.append(f"resumed: trial(s) {', '.join(map(str, done))} were interrupted and are retried")
        return done

    def _may_take_over(self, holder: int, role: str) -> bool:
        """A claim passes on when its trial gave up: pruned, interrupted, or failed. A search trial
        does not retry a configuration vLLM already refused (that would only spend a start)."""
        t = self.study._storage.get_trial(self.study._storage.get_trial_id_from_study_id_trial_number(
            self.study._study_id, holder))
        if t.state.name == "PRUNED":
            return True
        if t.state.name == "FAIL":
            return role != ROLE_SEARCH or bool(t.user_attrs.get("interrupted")) or "error" not in t.user_attrs
        return False

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

        from ._recovery import process_identity

        trial.set_user_attr("owner", process_identity())
        role = trial.user_attrs.get("role") or ROLE_SEARCH
        trial.set_user_attr("role", role)
        config = _bands.apply(self.space.suggest(trial), trial.user_attrs.get("bands"))
        key = canonical(config)
        trial.set_user_attr("config", config)
        trial.set_user_attr("config_key", key)
        claim_key = trial.user_attrs.get("claim_key") or key
        trial.set_user_attr("claim_key", claim_key)
        if role != ROLE_CONFIRM and self.trials(config_key=key):
            trial.set_user_attr("duplicate", True)
            raise optuna.TrialPruned(f"already measured: {key}")
        if role == ROLE_SEARCH and key == NONE and self.trials(config_key=NONE):
            raise optuna.TrialPruned("baseline already measured")
        self._claim(trial, claim_key, role)
        reqs = self.confirm_reqs if role == ROLE_CONFIRM else self.search_reqs
        log_path = self.home / "logs" / self.name / f"trial-{trial.number:04d}.log"
        trial.set_user_attr("log_path", str(log_path))
        trial.set_user_attr("vllm_version", self.caps.version)
        trial.set_user_attr("server_starts", 1)
        if self.run_id:
            trial.set_user_attr("run_id", self.run_id)
        try:
            m = measure(self.spec, config, reqs, self.warmup, log_path, self.command,
                        on_server=self._track_server, pid_dir=self.pid_dir,
                        extra_args=self.caps.per_request_metrics_args(config is not None))
        except TrialFailed as e:
            trial.set_user_attr("error", e.reason)
            raise
        except KeyboardInterrupt as e:
            # measure() has stopped the server on its way out; say why the trial failed
            trial.set_user_attr("error", f"interrupted by {signame_of(e)}: vllm serve stopped, trial not measured")
            trial.set_user_attr("interrupted", True)
            raise
        return self._record(trial, m, role)

    def _track_server(self, server) -> None:
        self.current_server = server

    def _record(self, trial, m: Measurement, role: str) -> float:
        g = self.spec.guards
        failed = m.summary.get("failed", 0)
        value = measurement_objective(m.levels, m.tpot_ms, self.spec.objective.statistic) if m.tpot_ms else float("inf")
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
        if m.config and m.config.get(_bands.BANDS_KEY):  # did the schedule take effect? (see _bands.verify)
            _bands.check_trial(trial, m, next((t.user_attrs["measurement"].get("levels") for t in self.trials(config_key=NONE)), None))
        # client-side stalls bias only client-side TPOT; the engine's own timings are immune
        trial.set_user_attr("stalled", m.tpot_source == "client"
                            and bool((m.summary.get("stall") or {}).get("stalled", False)))
        if not m.tpot_ms:
            trial.set_user_attr("error", "no request completed: " + "; ".join(m.errors[:3]))
        return value

    def _record_trial(self, frozen) -> None:
        """The trial's headline numbers into autotune_trials (SRE reports, exporter)."""
        if self.store is None or frozen.state.name in ("WAITING", "RUNNING", "PRUNED"):
            return  # pruned trials started nothing (duplicates, already measured)
        m = frozen.user_attrs.get("measurement") or {}
        d = m.get("spec_delta") or {}
        cfg = frozen.user_attrs.get("config") or {}
        owner = frozen.user_attrs.get("owner") or {}
        try:
            self.store.upsert_trial({
                "study_name": self.name, "trial_number": frozen.number,
                "run_id": frozen.user_attrs.get("run_id") or self.run_id, "workload": self.spec.workload,
                "role": frozen.user_attrs.get("role"), "config_key": frozen.user_attrs.get("config_key"),
                "method": cfg.get("method") if cfg else ("none" if "config" in frozen.user_attrs else None),
                "k": cfg.get("num_speculative_tokens") if cfg else None, "state": frozen.state.name,
                "tpot_ms": frozen.value if frozen.state.name == "COMPLETE" and frozen.value != float("inf") else None,
                "acceptance_length": d.get("acceptance_length"), "acceptance_rate": d.get("acceptance_rate"),
                "output_tok_s": (m.get("summary") or {}).get("output_throughput_tok_s"),
                "failed_requests": (m.get("summary") or {}).get("failed"),
                "server_starts": int(frozen.user_attrs.get("server_starts", 0)),
                "start_seconds": m.get("start_seconds"),
                "error": frozen.user_attrs.get("error") or (str(frozen.system_attrs.get("fail_reason", ""))[:500] or None),
                "host": owner.get("host"), "log_path": frozen.user_attrs.get("log_path")})
        except Exception as e:  # the report table must never fail a study
            log.warning("cannot record trial %s in autotune_trials: %s", frozen.number, e)

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

        self._record_trial(frozen)
        best = self.best()
        self.on_event(TrialEvent(
            number=frozen.number, role=frozen.user_attrs.get("role", ROLE_SEARCH),
            config=frozen.user_attrs.get("config"), state=frozen.state.name,
            value=frozen.value if frozen.state == optuna.trial.TrialState.COMPLETE else None,
            best=self.objective_of(best) if best else None, server_starts=self.server_starts(),
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

    def run(self) -> StudyOutcome:
        from optuna.trial import TrialState

        self._dupes = 0
        reserve = 2 * self.spec.objective.confirm_starts
        while not self.trials(config_key=NONE) and not self._budget_left(reserve):
            if self._in_state((TrialState.RUNNING,), NONE):
                self._wait_while_running(NONE)          # another worker runs the baseline
            elif not self._in_state((TrialState.WAITING,), NONE) and self._baseline_failed_here():
                break
            else:
                self._run_enqueued({"method": NONE}, ROLE_BASELINE)
        if not self.trials(config_key=NONE):
            raise TrialFailed("the no-speculation baseline failed; nothing can be compared "
                              f"(see {self.home / 'logs' / self.name})")
        for cfg in ([self.spec.incumbent] if self.spec.incumbent else []) + self.warm_start:
            params = self._enqueueable(cfg)
            if params and not self.trials(config_key=canonical(cfg)) and not self._budget_left(reserve):
                self._run_enqueued(params, ROLE_SEARCH)
        self.fidelity = None
        if self.leader and self.spec.production.telemetry:  # no search on a replay that misses production
            from ._gate import check_study
            self.fidelity = check_study(self)  # raises _gate.FidelityFailed, naming the figure that is off
        for method in self.space.methods:
            if self._budget_left(reserve):
                break
            params = self.space.params_for(method)
            if not self.trials(config_key=canonical(self.space.config_from_params(params))):
                self._run_enqueued(params, ROLE_SEARCH)
        from ._search import drive  # objective.search: predictor (default), grid, random; False: TPE below
        searched = drive(self, reserve)
        for method in ([] if searched else self.space.methods):  # each method's acceptance knee (SearchSpace.knee_k)
            top = self.trials(config_key=canonical(self.space.config_from_params(self.space.params_for(method))))
            rates = top[0].user_attrs["measurement"]["spec_delta"].get("per_position_rates") if top else None
            knee = self.space.knee_k(method, rates or [])
            params = self.space.params_for(method, knee) if knee else None
            if params and not self._budget_left(reserve) and \
                    not self.trials(config_key=canonical(self.space.config_from_params(params))):
                self._run_enqueued(params, ROLE_SEARCH)
        if not searched and not self._budget_left(reserve):
            self.study.optimize(self.objective, catch=(TrialFailed,), callbacks=[self._callback],
                                gc_after_trial=False)
        self.stopped_because = self.stopped_because or self._budget_left(reserve) or "search finished"
        if self.leader:
            self._wait_while_running()  # other workers' last trials belong in the decision
            self.confirm()
        return StudyOutcome(study_name=self.name, storage=self.storage_url,
                            trials=self.study.get_trials(deepcopy=False), server_starts=self.server_starts(),
                            wall_s=time.monotonic() - self.t0, stopped_because=self.stopped_because)

    def _baseline_failed_here(self) -> bool:
        """The baseline failed in this process already: do not start it again and again."""
        import os

        return any(t.user_attrs.get("config_key") == NONE and t.state.name == "FAIL"
                   and (t.user_attrs.get("owner") or {}).get("pid") == os.getpid()
                   and not t.user_attrs.get("interrupted")
                   for t in self.study.get_trials(deepcopy=False))

    def _enqueueable(self, config: dict | None) -> dict | None:
        """Optuna params for a known config (incumbent, yesterday's winner), or None when the
        space cannot express it (method dropped, K or knob outside the spec's lists)."""
        if not config:
            return None
        if config.get("method") not in self.space.methods:
            self.notes.append(f"warm start {canonical(config)} skipped: method not in tonight's space")
            return None
        params = _params_of(config, self.space)
        ok = self.space.config_from_params(params) == config and _in_space(self.space, params)
        if not ok:
            self.notes.append(f"warm start {canonical(config)} skipped: outside the spec's space")
            return None
        return params

    def confirm(self) -> None:
        """Fresh starts of baseline and winner, interleaved, until each has confirm_starts."""
        best = self.best()
        n = self.spec.objective.confirm_starts
        if best is None or n == 0:
            return
        b_params = {"method": NONE}
        w_params = dict(best.params)
        for i in range(n):
            for params, key in ((b_params, NONE), (w_params, best.user_attrs["config_key"])):
                have = self.trials(role=ROLE_CONFIRM, config_key=key)
                slot = f"confirm/{i}/{key}"
                if len(have) >= n or any(_claim_key_of(t) == slot for t in have):
                    continue
                if self.server_starts() < self.spec.budget.max_server_starts:
                    bands = best.user_attrs.get("bands") if key != NONE else None
                    self._run_enqueued(params, ROLE_CONFIRM, claim_key=slot, attrs={"bands": bands} if bands else None)

    def fail_own_running(self, reason: str) -> None:
        """After an interrupt: any trial of this process still RUNNING is failed with the reason."""
        import os

        from optuna.trial import TrialState

        for t in self._in_state((TrialState.RUNNING,)):
            if (t.user_attrs.get("owner") or {}).get("pid") == os.getpid():
                try:
                    self.storage.set_trial_user_attr(t._trial_id, "error", reason)
                    self.storage.set_trial_user_attr(t._trial_id, "interrupted", True)
                    self.storage.set_trial_state_values(t._trial_id, state=TrialState.FAIL)
                    self._record_trial(self.storage.get_trial(t._trial_id))
                except Exception:
                    pass


def _claim_key_of(t) -> str | None:
    return t.user_attrs.get("claim_key") or t.user_attrs.get("config_key")


def _params_of(config: dict, space: SearchSpace) -> dict:
    method = config["method"]
    params = {"method": method, f"{method}.k": config.get("num_speculative_tokens", 1)}
    if method == "ngram":
        params["ngram.window"] = f"{config.get('prompt_lookup_min', 5)}-{config.get('prompt_lookup_max', 5)}"
    elif method == "suffix":
        for p, key in (("max_tree_depth", "suffix_decoding_max_tree_depth"),
                       ("max_spec_factor", "suffix_decoding_max_spec_factor"),
                       ("min_token_prob", "suffix_decoding_min_token_prob")):
            if key in config:
                params[f"suffix.{p}"] = config[key]
    elif method in ("draft_model", "eagle", "eagle3"):
        params[f"{method}.model"] = config["model"]
    return params


def _in_space(space: SearchSpace, params: dict) -> bool:
    """Whether enqueued params lie inside the distributions ``space.suggest`` declares (Optuna
    refuses a categorical value outside its choices)."""
    method = params["method"]
    kr = space.spec.k_range(method)
    if not kr.min <= int(params[f"{method}.k"]) <= kr.max:
        return False
    choices = {"ngram.window": space._ngram_windows(),
               "suffix.max_tree_depth": space.spec.suffix.max_tree_depth,
               "suffix.max_spec_factor": space.spec.suffix.max_spec_factor,
               "suffix.min_token_prob": space.spec.suffix.min_token_prob,
               "draft_model.model": space.spec.draft_models,
               "eagle.model": space.spec.eagle_heads, "eagle3.model": space.spec.eagle_heads}
    return all(params[name] in values for name, values in choices.items() if name in params)
