"""The confirmation: fresh starts of baseline, incumbent and winner after the search, on which the
decision rests.

The search picked its winner on one start, which favours a lucky start (the winner's curse), so
the decision uses none of the search's starts: ``confirm_starts`` fresh starts each of the
no-speculation baseline, the deployed incumbent (when it is not the winner) and the winner, on
the confirmation requests, interleaved round by round so that slow drift of the host hits each
side alike, in a random order (``round_order``); then, while the decision
is still open (``Confirmation.open``, asked by the caller
that decides: ``decide._decision.open_question``), more rounds up to ``confirm_max_starts``. The looks
the budget allows are fixed before the first confirmation start and kept in the study for a
resumed run: the decision spends its error over exactly these (``decide._noise.planned_looks``).
Each round's start of a side claims its slot (``confirm/<round>/<config key>``), so a resumed run
or another worker never repeats one.

Why a random order: a GPU's starts are not independent of what ran before them (on an H100 a
speculative config's second start ran 3-25% faster than its first; a start after a speculative
start can run 1-2% faster). A fixed order (baseline, incumbent, winner) puts the same side after
the same neighbour every round, so such an effect becomes a bias that no variance shows; drawn
at random (in mirrored pairs of rounds, ``round_order``) it averages out and what is left of it
shows in the start-to-start variance.
The order comes from the spec's seed and the study's name (kept by a resumed run, which draws the
same order again), and each start stores its round and place (``confirm_round``,
``confirm_position``).
"""

from __future__ import annotations

import random
from typing import Callable, Sequence, TypeVar

from autotune.search._record import (bands_of, claim_key_of, config_key_of, confirm_looks_of, error_of, interrupted,
                                     role_of)
from autotune.search._space import NONE, canonical
from autotune.search._trials import ROLE_CONFIRM

T = TypeVar("T")


def round_order(seed: str, round_index: int, sides: Sequence[T], stage: str = "confirm") -> list[T]:
    """``sides`` in the order round ``round_index`` starts them: rounds come in mirrored pairs, a
    uniformly random permutation drawn from ``seed`` (the spec's seed and the study's name) and
    the pair alone, then its reverse, so a resumed run or another worker draws the same order, and
    every night's study its own. The pair balances a linear drift of the host exactly, and puts
    a side after itself at the pair's seam: the baseline, the one side that is not speculative,
    otherwise follows a speculative start in 8 of 9 starts against 5 of 9 for the others, and a
    start right after a speculative one can run faster (a carry-over: at 1% start-to-start noise
    and a 2% carry-over, false disable fell from 2.6% to 0.4% and false change from 4.2% to 1.1%,
    benchmarks/decisions.py). ``stage``: which of the study's interleaved stages draws (the
    confirmation, the search's runoff: ``_runoff``), each its own draws."""
    if round_index % 2:
        return round_order(seed, round_index - 1, sides, stage)[::-1]
    out = list(sides)
    random.Random(f"{seed}/{stage}/{round_index}").shuffle(out)
    return out


class Confirmation:
    """The confirmation plan of one study run and what it did (``record``)."""

    def __init__(self):
        self.open: Callable[[], bool] | None = None
        """Set by the caller that decides (``decide._decision.open_question``): one more round?"""
        self.record: dict = {}
        """What ran, and why a round did not (``Study.confirmation``), for the decision to state."""

    def sides(self, study, best, nominee: dict | None = None) -> list[tuple[dict, str, dict | None]]:
        """(Optuna params, config key, more user attributes) of each side a round starts, in order:
        the baseline, the incumbent when it is deployed and not the winner, and the winner: the
        predictor's ``nominee`` (``_nominee``, its stored plan) where there is one, else ``best``
        (the search's winner, with its band schedule)."""
        wkey = nominee["config_key"] if nominee else config_key_of(best)
        sides = [({"method": NONE}, NONE, None)]
        inc = study.spec.incumbent
        if inc and canonical(inc) != wkey:
            params = study._enqueueable(inc)
            if params is None:
                study.notes.append(f"the incumbent {canonical(inc)} cannot be confirmed: outside tonight's space")
            else:
                sides.append((params, canonical(inc), None))
        if nominee:
            sides.append((dict(nominee["params"]), wkey, {"nominated": True}))
            return sides
        bands = bands_of(best)
        sides.append((dict(best.params), wkey, {"bands": bands} if bands else None))
        return sides

    def nominee(self, study) -> dict | None:
        """The predictor's nominee still in the running (``study.nominate()``), or None: none, or
        one dropped; a nominee a confirmation start of which failed a guard, or that the engine
        refused, is dropped here (stored, noted) and the search's best is confirmed instead."""
        plan = study.nominate() if hasattr(study, "nominate") else None
        if not plan or plan.get("dropped"):
            return None
        why = screen([t for t in study.study.get_trials(deepcopy=False)
                      if config_key_of(t) == plan["config_key"] and role_of(t) == ROLE_CONFIRM])
        if why is None:
            return plan
        plan = {**plan, "dropped": why}
        if study.leader:
            study.study.set_user_attr("nominee", plan)
        study.notes.append(f"nominee: {plan['label']} dropped, {why}; the search's best "
                           f"{(plan.get('instead_of') or {}).get('label')} is confirmed instead")
        return None

    def looks(self, study, sides: int) -> int:
        """The looks the budget allows ``sides`` sides, fixed before the first confirmation start
        (and kept for a resumed run): the decision spends its error over exactly these
        (``decide._noise.planned_looks``)."""
        looks = confirm_looks_of(study.study)
        if looks is None:
            done = len(study.trials(role=ROLE_CONFIRM))
            looks = study.spec.objective.planned_looks(
                study.spec.budget.max_server_starts - study.budget_starts() + done, sides)
            if study.leader:
                study.study.set_user_attr("confirm_looks", looks)
        return looks

    def run(self, study) -> None:
        """Confirm ``study``'s winner (a ``_study.Study``: its trials, budget and starts): the
        rounds already measured count, a round missing a side starts it, and the budget or this
        run's pause ends the confirmation early (``record`` says so)."""
        best = study.best(search_only=True)
        spec = study.spec
        obj = spec.objective
        n, most = obj.confirm_starts, obj.max_confirm_starts()
        self.record = {"planned": n, "max": most, "rounds": 0, "skipped": None,
                       "fresh_requests": study.confirm_reqs is not study.search_reqs}
        if best is None:
            self.record["skipped"] = "no candidate to confirm"
            return
        if n == 0:
            self.record["skipped"] = "objective.confirm_starts is 0"
            return
        nominee = self.nominee(study)
        stored = study.nominate() if hasattr(study, "nominate") else None
        if stored:
            self.record["nominee"] = {k: v for k, v in stored.items() if k != "params"}
        sides = self.sides(study, best, nominee)
        looks = self.looks(study, len(sides))
        self.record["looks"] = looks
        most = max(n, min(most, looks))  # confirm_starts rounds are tried whatever the budget (and say so)
        seed = f"{spec.seed}/{study.name}"
        for i in range(most):
            have = [len(study.trials(role=ROLE_CONFIRM, config_key=key)) > i for _, key, _ in sides]
            if not any(have) and i >= n and not (self.open is not None and self.open()):
                break  # the decision is settled (or nobody asks): no further round; one begun is finished
            ordered = round_order(seed, i, sides)
            self.record.setdefault("order", []).append([key for _, key, _ in ordered])
            for pos, (params, key, attrs) in enumerate(ordered):
                have = study.trials(role=ROLE_CONFIRM, config_key=key)
                slot = f"confirm/{i}/{key}"
                if len(have) > i or any(claim_key_of(t) == slot for t in have):
                    continue
                if study.budget.pause_due():
                    study.paused = True
                    return
                if study.budget_starts() >= spec.budget.max_server_starts:
                    if i < n:
                        self.record["skipped"] = (f"the server-start budget ({spec.budget.max_server_starts})"
                                                  f" was spent after {i} of {n} confirmation rounds")
                    else:
                        self.record["stopped"] = f"server-start budget spent after {i} rounds"
                    return
                study._run_enqueued(params, ROLE_CONFIRM, claim_key=slot,
                                    attrs={**(attrs or {}), "confirm_round": i, "confirm_position": pos})
                if nominee and key == nominee["config_key"] and self.nominee(study) is None:
                    return self.run(study)  # dropped: the search's best takes its place, the rounds go on
            self.record["rounds"] = i + 1


def screen(trials) -> str | None:
    """Why a nominee's confirmation starts rule it out, or None: the engine refused or crashed on
    it (an interrupted start is retried, not held against it), or a start failed a guard (the
    trial's constraints: failed requests, greedy equivalence, the throughput floor, a band schedule
    that did not take effect)."""
    for t in sorted(trials, key=lambda t: t.number):
        if t.state.name == "FAIL" and error_of(t) and not interrupted(t):
            return f"its confirmation start failed: {error_of(t)[:200]}"
        bad = [name for name, c in (getattr(t, "constraints", None) or {}).items() if c > 0]
        if t.state.name == "COMPLETE" and bad:
            return f"its confirmation start failed the guard{'s' * (len(bad) > 1)} {', '.join(bad)}"
    return None
