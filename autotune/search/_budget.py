"""What a study run may still spend: the budget (server starts, trials, wall time), the pause of a
run in a shorter window, and the starts the search leaves for the confirmation.

Server starts are what a study costs (``budget.max_server_starts``). A start stopped by a signal
(``_record.stopped_by_signal``) or whose autotune process died (``_record.died_with_its_process``:
kill -9, a reboot) measured nothing through no fault of its configuration as far as anyone knows,
and does not count, so the rerun that resumes the study redoes it without losing a measured one
(``uncounted``). A run in a
window shorter than the study (``Pause``: a GPU lease, the scheduler's slot) stops after its
``pause_after_starts``, or before a start not expected to end in its ``pause_after_minutes``
(``expected_start_s``); the next run resumes the same study. The search stops where the
confirmation's rounds still fit the budget (``confirm_reserve``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

from autotune.core._measure import POWER_TARGET, confirmation_power
from autotune.core._spec import StudySpec
from autotune.search._record import (config_key_of, config_of, died_with_its_process, role_of, server_starts_of,
                                     start_s_of)
from autotune.search._space import NONE, SearchSpace
from autotune.search._trials import ROLE_BASELINE, ROLE_SEARCH, stopped_by_signal, stored_trials

UNSEEN_METHOD_FACTOR = 1.5
"""``expected_start_s`` of a method not started yet: this many times the study's longest start."""


@dataclass(frozen=True)
class Pause:
    """When a run stops before the study is done (``autotune study start --pause-after-...``)."""

    after_starts: int | None = None
    """At most this many server starts in this run, then stop without confirming or deciding:
    a GPU window shorter than the study (the next run resumes the same study). A start is
    begun only when the run may still make it, so none is cut short and lost to the budget."""
    after_minutes: float | None = None
    """This run ends within this many minutes: a start is begun only when it is expected to
    end in time (``expected_start_s``), else the run pauses before it; a window with a hard
    end (the scheduler's, a GPU lease) then loses no start to the clock."""
    window_began: float | None = None
    """``time.monotonic`` when the window began (the runner's command, before the GPU lock and
    probe); None: when the study was opened."""


NOISE_ROUNDS = 2
"""Confirmation rounds the search never takes for itself: the winner's own start-to-start noise
needs two of its starts (``CONFIRM_ROUNDS``' first reason)."""


def confirm_reserve(spec: StudySpec) -> int:
    """Server starts the search leaves for the confirmation: rounds of baseline, incumbent (when
    deployed) and winner, since the decision's power lies in those rounds, in this order of claim
    on the budget:

    1. the search's least: the baseline, the incumbent and one candidate;
    2. ``NOISE_ROUNDS`` confirmation rounds (fewer where ``confirm_max_starts`` says so), the
       least that measures the winner's own noise;
    3. the start that makes the search's opening pay, where it fits beside those rounds and the
       rounds left keep the decision's power at the spec's own start noise (``keeps_power``): each
       method's largest K is measured for the per-position counters that predict every smaller K,
       and only a start after them uses the counters (a search left the baseline and the largest K
       alone picks the better of two fixed points: on the generated grids below random order,
       docs/figures/search.md);
    4. confirmation rounds up to ``confirm_max_starts``; what is left goes to the search.

    ``confirm_starts`` rounds at least, whatever the budget."""
    o = spec.objective
    sides = 3 if spec.incumbent else 2
    most = o.max_confirm_starts()
    least = spec.budget.max_server_starts - (1 + bool(spec.incumbent) + 1)
    guided = spec.budget.max_server_starts - (1 + bool(spec.incumbent) + len(spec.space.methods) + 1)
    rounds = min(most, least // sides)
    if min(most, NOISE_ROUNDS) <= guided // sides < rounds and keeps_power(spec, guided // sides):
        rounds = guided // sides
    return sides * max(o.confirm_starts, rounds)


def keeps_power(spec: StudySpec, rounds: int) -> bool:
    """``rounds`` confirmation rounds see a true 20% gain in at least 80% of nights at the start
    noise the spec expects (``objective.start_noise``; ``core._measure.confirmation_power``, the
    figure the decision's ``evidence.plan`` states). No figure, no claim: False."""
    sn = spec.objective.start_noise
    if sn is None:
        return False
    sd_none, sd_spec = (math.log1p(sn.for_class(c).cv) for c in ("none", "speculative"))
    alpha = (1.0 - spec.guards.confidence) / 2.0
    deployed = bool(spec.incumbent)
    return confirmation_power(sd_spec if deployed else sd_none, sd_spec, rounds, deployed, alpha) >= POWER_TARGET


def plan(spec: StudySpec, methods) -> dict:
    """How the server-start budget splits before the first start, and what it cannot pay for.

    The search gets what the confirmation's reserve (``confirm_reserve``) leaves, and at most
    ``budget.max_trials`` trials. Its opening, before any prediction: no speculation, the
    incumbent, each method's largest K and (where its K range has room for one between) its
    acceptance knee; then a runoff of ``objective.runoff_contenders`` (2 starts) where two
    configurations are too close for one start each. A budget that cannot pay for these is not
    an error (the search stops, the runoff is skipped, and the decision says so), but a night
    that ends there was sized wrong: ``short`` says what is missing and which field pays for it."""
    b, o = spec.budget, spec.objective
    confirm = confirm_reserve(spec)
    search = max(0, min(b.max_server_starts - confirm, b.max_trials))
    ks = {m: spec.space.k_range(m) for m in methods}
    opening = 1 + bool(spec.incumbent) + sum(1 + (kr.max - kr.min >= 2) for kr in ks.values())
    runoff = 2 if o.runoff_contenders >= 2 else 0
    out = {"server_starts": b.max_server_starts, "confirmation": confirm, "search": search,
           "opening": opening, "runoff": runoff, "short": None}
    need = opening + runoff
    if search < need:
        what = (f"its opening needs up to {opening} (no speculation{', the incumbent' if spec.incumbent else ''}, "
                f"each method's largest K and acceptance knee)" + (f" and a runoff {runoff} more" if runoff else ""))
        # more starts grow the reserve too, up to every confirmation round the spec allows
        reserve = (3 if spec.incumbent else 2) * max(o.confirm_starts, o.max_confirm_starts()) if o.confirm_starts else 0
        fields = ([f"budget.max_trials {need}"] if b.max_trials < need else []) + \
                 ([f"budget.max_server_starts {need + reserve}"] if b.max_server_starts - confirm < need else [])
        out["short"] = (f"the search gets {search} of {b.max_server_starts} server starts ({confirm} kept for the "
                        f"confirmation, budget.max_trials {b.max_trials}); {what}: "
                        + " and ".join(fields) + " would pay for " + ("both" if runoff else "it"))
    return out


class StartBudget:
    """The budget and pause of one run of a study (``study``: its Optuna study, whose stored
    trials say what was spent; ``t0``: ``time.monotonic`` when the run opened it)."""

    def __init__(self, spec: StudySpec, space: SearchSpace, study, t0: float, pause: Pause = Pause()):
        self.spec, self.space, self.study, self.t0, self.pause = spec, space, study, t0, pause
        self.window_ends = None if pause.after_minutes is None else \
            (t0 if pause.window_began is None else pause.window_began) + pause.after_minutes * 60
        """``time.monotonic`` at the window's end, counted from ``pause.window_began``."""
        self.starts_at_open = self.server_starts()
        self.paused = False
        """A start was refused for the pause: nothing confirmed or decided in this run."""
        self.paused_for = ""
        """Why, when a start did not fit ``pause.after_minutes``."""

    # ---- what was spent
    def server_starts(self) -> int:
        """Every server start the study made, interrupted ones included: what it cost."""
        return sum(server_starts_of(t) for t in self.study.get_trials(deepcopy=False)
                   if t.state.name != "WAITING")

    def interrupted_starts(self) -> int:
        """Starts that measured nothing through no fault of their configuration (``uncounted``)."""
        return sum(server_starts_of(t) for t in uncounted(self.study.get_trials(deepcopy=False)))

    def budget_starts(self) -> int:
        """The starts ``budget.max_server_starts`` counts: all but ``interrupted_starts``, so the
        rerun that resumes a stopped or killed study redoes that start without losing a measured one
        (``max_wall_minutes`` bounds what each run spends)."""
        return self.server_starts() - self.interrupted_starts()

    def search_trials(self) -> int:
        trials = self.study.get_trials(deepcopy=False)
        free = {t.number for t in uncounted(trials)}
        return sum(1 for t in trials
                   if role_of(t) in (ROLE_BASELINE, ROLE_SEARCH)
                   and server_starts_of(t) and t.state.name != "WAITING"
                   and t.number not in free)

    # ---- what is left
    def left(self, reserve: int = 0) -> str | None:
        """Why no further start may be made (``reserve``: starts kept for the confirmation), or None."""
        b = self.spec.budget
        if self.budget_starts() + reserve >= b.max_server_starts:
            note = uncounted_note(self.study.get_trials(deepcopy=False))
            # the reserve said, or a budget of 8 that stops after 2 search starts reads as a bug
            kept = f": {reserve} of its starts kept for the confirmation" if reserve else ""
            return (f"server-start budget ({b.max_server_starts}) reached" + (f" ({note} not counted)" if note else "")
                    + kept)
        if self.search_trials() >= b.max_trials:
            return f"trial budget ({b.max_trials}) reached"
        if (time.monotonic() - self.t0) / 60 >= b.max_wall_minutes:
            return f"wall-time budget ({b.max_wall_minutes} min) reached"
        if len({config_key_of(t) for t in stored_trials(self.study)}) >= self.space.size():
            return "every configuration in the space was measured"
        return None

    def confirm_reserve(self) -> int:
        return confirm_reserve(self.spec)

    # ---- the pause
    def pause_due(self) -> bool:
        """This run has made its ``pause_after_starts`` (or a start did not fit its
        ``pause_after_minutes``); ``paused`` is set only where a start is then refused, so the run
        that makes the study's last start still decides."""
        return bool(self.paused_for) or self.pause.after_starts is not None and \
            self.server_starts() - self.starts_at_open >= self.pause.after_starts

    def fits(self, config_key: str, method: str) -> bool:
        """With ``pause_after_minutes``: is the start of ``config_key`` expected to end before the
        run's time is up? If not, the run pauses before it (``paused_for`` says why)."""
        if self.window_ends is None:
            return True
        expected = expected_start_s(self.study.get_trials(deepcopy=False), config_key, method)
        left = self.window_ends - time.monotonic()
        if expected is None or expected[0] <= left:
            return True
        self.paused_for = (f"paused before {config_key}: its start is expected to take {expected[0]:.0f} s "
                           f"({expected[1]}), {max(left, 0):.0f} s of this run's {self.pause.after_minutes:g} min "
                           "are left; the next run resumes the study")
        return False

    def blocked(self, reserve: int) -> str | None:
        """``left`` at a point where a start would follow, or the pause that refuses it."""
        reason = self.left(reserve)
        if not reason and self.pause_due():
            self.paused = True
            return self.pause_reason()
        return reason

    def pause_reason(self) -> str:
        if self.paused_for:
            return self.paused_for
        return (f"paused after {self.server_starts() - self.starts_at_open} server starts in this run "
                f"(pause_after_starts {self.pause.after_starts}); the next run resumes the study")


def uncounted(trials) -> list:
    """The trials whose start does not count against the budget: stopped by SIGINT or SIGTERM
    (someone chose to stop them), or whose autotune process died, the first such start of each
    configuration. A configuration whose start dies again counts from then on: it may be what
    kills the process (the host's OOM killer), and counting it bounds that crash loop."""
    died: set = set()
    out = []
    for t in sorted(trials, key=lambda t: t.number):
        if stopped_by_signal(t):
            out.append(t)
        elif died_with_its_process(t) and config_key_of(t) not in died:
            died.add(config_key_of(t))
            out.append(t)
    return out


def uncounted_note(trials, noun: bool = True) -> str:
    """What ``uncounted`` left out of the budget, in words: ``1 start stopped by a signal``,
    ``2 starts whose process died``, or both ("" when none; ``noun=False``: ``1 stopped by ...``)."""
    free = uncounted(trials)
    parts = []
    for n, why in ((sum(server_starts_of(t) for t in free if stopped_by_signal(t)), "stopped by a signal"),
                   (sum(server_starts_of(t) for t in free if not stopped_by_signal(t)), "whose process died")):
        if n:
            parts.append(f"{n} {'start' + 's' * (n > 1) + ' ' if noun else ''}{why}")
    return " and ".join(parts)


def start_seconds_of(t) -> float | None:
    """How long the trial's server start took, from start to stop: ``start_s``, or for trials
    written before it (and those a signal handler failed), Optuna's start and end times."""
    if (s := start_s_of(t)) is not None:
        return s
    if t.datetime_start and t.datetime_complete:
        return (t.datetime_complete - t.datetime_start).total_seconds()
    return None


def expected_start_s(trials, config_key: str, method: str) -> tuple[float, str] | None:
    """The seconds a start of ``config_key`` is expected to take, and the basis: the longest
    earlier start of the same method in this study, or of this configuration itself (an
    interrupted attempt's length is a lower bound of its own); with neither, half as much again as
    the longest start of any method (a method's first start loads what the others did not: on the
    H200 a draft model's start took 1.4-1.9 times an ngram start). The longest, not a mean: the
    window it protects has a hard end. None before any start has ended."""
    def method_of(t) -> str:
        return (config_of(t) or {}).get("method") or NONE

    ended = [(t, s) for t in trials if t.state.name in ("COMPLETE", "FAIL") and server_starts_of(t)
             and (s := start_seconds_of(t)) is not None]
    own = [s for t, s in ended if config_key_of(t) == config_key or
           (method_of(t) == method and t.state.name == "COMPLETE")]
    if own:
        return max(own), f"the longest of this study's {len(own)} start{'s' * (len(own) > 1)} of {method}"
    done = [s for t, s in ended if t.state.name == "COMPLETE"]
    if done:
        return UNSEEN_METHOD_FACTOR * max(done), (f"no start of {method} yet: {UNSEEN_METHOD_FACTOR:g} x the longest "
                                                  f"of this study's {len(done)} starts")
    return None
