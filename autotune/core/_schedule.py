"""Time arithmetic for unattended runs: cron expressions, ``--if-stale 20h`` durations, misfires.

Kept apart from the daemon so that spec validation (a bad ``schedule.cron`` is a spec error with
its line) and ``study start --if-stale`` use the same parsing without starting a scheduler.
"""

from __future__ import annotations

import datetime as dt
import re
from zoneinfo import ZoneInfo

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


class Schedule:
    """A crontab line read as wall-clock times in an IANA zone, each mapped to one instant.

    APScheduler's CronTrigger walks local time itself: across a fall-back overlap it fires a
    nightly slot twice (01:30 -04:00, then 01:30 -05:00), and asking it for the fire after one
    inside the overlap can return the same instant again, so a loop over it never ends. Here the
    cron fields are matched on naive wall-clock times (a zone without transitions, where every
    step moves forward), and each wall time becomes an instant by one rule: in an overlap the
    first occurrence, in a gap the first valid instant after it (the transition). Each scheduled
    night therefore runs exactly once, in any zone, and every computation is bounded.
    """

    def __init__(self, expr: str, timezone: str = "UTC"):
        from apscheduler.triggers.cron import CronTrigger

        if len(str(expr).split()) != 5:
            raise ValueError(f"cron {expr!r} must have 5 fields (minute hour day month weekday)")
        try:
            self.zone = ZoneInfo(timezone)
        except Exception:  # ZoneInfoNotFoundError, ValueError for a malformed key
            raise ValueError(f"invalid cron {expr!r} in timezone {timezone!r}: unknown time zone") from None
        try:
            self._wall = CronTrigger.from_crontab(expr, timezone=dt.timezone.utc)
        except Exception as e:  # apscheduler raises ValueError with the field
            raise ValueError(f"invalid cron {expr!r} in timezone {timezone!r}: {e}") from None
        self.expr, self.timezone = expr, timezone

    def __repr__(self) -> str:
        return f"Schedule({self.expr!r}, {self.timezone!r})"

    # ---- wall time <-> instant ----------------------------------------------------------
    def _wall_of(self, t: dt.datetime) -> dt.datetime:
        """The naive wall-clock time of instant ``t`` in the zone (as a UTC-tagged value)."""
        return t.astimezone(self.zone).replace(tzinfo=dt.timezone.utc, fold=0)

    def _instant(self, wall: dt.datetime) -> dt.datetime:
        """The instant a scheduled wall time runs at (overlap: first occurrence; gap: its end)."""
        local = wall.replace(tzinfo=self.zone, fold=0)
        t = local.astimezone(dt.timezone.utc)
        if self._wall_of(t) == wall:
            return t
        # wall lies in a gap: fold=1 reads it with the offset after the transition, an instant
        # before the gap; fold=0 with the offset before, an instant after it. Bisect to the second.
        lo = wall.replace(tzinfo=self.zone, fold=1).astimezone(dt.timezone.utc)
        hi = t
        lo, hi = min(lo, hi), max(lo, hi)
        while hi - lo > _SECOND:
            mid = lo + (hi - lo) / 2
            if self._wall_of(mid) >= wall:
                hi = mid
            else:
                lo = mid
        return hi.replace(microsecond=0) + (_SECOND if hi.microsecond else dt.timedelta(0))

    # ---- fire times -----------------------------------------------------------------------
    def fires(self, start: dt.datetime, end: dt.datetime | None = None):
        """Fire instants (UTC) at or after ``start``, strictly increasing, up to ``end``."""
        start = _aware(start)
        wall = self._wall.get_next_fire_time(None, self._wall_of(start))
        last = None
        skipped = 0
        while wall is not None:
            t = self._instant(wall)
            if end is not None and t > end:
                return
            if t >= start and (last is None or t > last):  # slots sharing a gap's end run once
                yield t
                last = t
                skipped = 0
            else:
                skipped += 1
                if skipped > _MAX_SKIPPED:  # a wall time maps back at most one overlap's length
                    raise RuntimeError(f"{self!r}: no fire time after {skipped} candidates from {start}")
            wall = self._wall.get_next_fire_time(wall, wall + _MICRO)

    def next_fire(self, start: dt.datetime) -> dt.datetime | None:
        """The first fire instant at or after ``start`` (None if the cron never fires again)."""
        return next(self.fires(start), None)

    def previous_fire(self, at: dt.datetime | None = None, lookback_days: float = 8) -> dt.datetime | None:
        """The last fire instant at or before ``at`` (None if not within ``lookback_days``).

        Looks back in widening windows, so a frequent cron costs a few steps and a rare one a few
        windows: the work is bounded by the fires inside the first window that holds one.
        """
        at = _aware(at or now())
        for days in (1 / 24, 1, 8, 32, 400, 3000):
            days = min(days, lookback_days)
            last = None
            for t in self.fires(at - dt.timedelta(days=days), at):
                last = t
            if last is not None or days >= lookback_days:
                return last
        return None

    def trigger(self):
        """An APScheduler trigger firing at these instants (its misfire and coalesce rules apply)."""
        from apscheduler.triggers.base import BaseTrigger

        schedule = self

        class _Trigger(BaseTrigger):
            def get_next_fire_time(self, previous_fire_time, now_):
                # as CronTrigger: after a fire, the next one after it (even if already past:
                # APScheduler's misfire grace and coalescing decide what a late one does)
                start = previous_fire_time + _MICRO if previous_fire_time else now_
                return schedule.next_fire(start)

            def __str__(self):
                return f"cron[{schedule.expr!r} {schedule.timezone}]"

        return _Trigger()

    def local(self, t: dt.datetime) -> str:
        """``t`` as the zone's wall time with its offset: what the operator scheduled."""
        return t.astimezone(self.zone).strftime("%Y-%m-%d %H:%M %Z (%z)")


_SECOND = dt.timedelta(seconds=1)
_MICRO = dt.timedelta(microseconds=1)
_MAX_SKIPPED = 200_000  # a once-a-minute cron across the longest overlap on record (a day) is 1440


def _aware(t: dt.datetime) -> dt.datetime:
    return t if t.tzinfo else t.replace(tzinfo=dt.timezone.utc)


def parse_cron(expr: str, timezone: str = "UTC") -> Schedule:
    """A :class:`Schedule` for a standard 5-field crontab line; ValueError says why not."""
    return Schedule(expr, timezone)


def parse_duration(text: str) -> float:
    """``"20h"`` -> 72000.0 seconds. Units s, m, h, d, w; a bare number is seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"invalid duration {text!r}: use a number and a unit, e.g. 20h, 90m, 1d")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def previous_fire(schedule: Schedule, at: dt.datetime | None = None, lookback_days: float = 8) -> dt.datetime | None:
    """The last time ``schedule`` fired at or before ``at`` (None if not within ``lookback_days``).

    A daemon that was down over its slot needs it to decide whether the missed run is still
    within the misfire grace; APScheduler only knows the next fire time.
    """
    return schedule.previous_fire(at, lookback_days)


def iso(t: dt.datetime | None = None) -> str:
    """UTC timestamp as stored in autotune's tables: sortable text both SQLite and PostgreSQL parse."""
    return (t or now()).astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
