"""Time arithmetic for unattended runs: cron expressions, ``--if-stale 20h`` durations, misfires.

Kept apart from the daemon so that spec validation (a bad ``schedule.cron`` is a spec error with
its line) and ``study start --if-stale`` use the same parsing without starting a scheduler.
"""

from __future__ import annotations

import datetime as dt
import re

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_cron(expr: str, timezone: str = "UTC"):
    """An APScheduler CronTrigger for a standard 5-field crontab line; ValueError says why not."""
    from apscheduler.triggers.cron import CronTrigger

    if len(expr.split()) != 5:
        raise ValueError(f"cron {expr!r} must have 5 fields (minute hour day month weekday)")
    try:
        return CronTrigger.from_crontab(expr, timezone=timezone)
    except Exception as e:  # apscheduler raises ValueError or pytz/zoneinfo errors
        raise ValueError(f"invalid cron {expr!r} in timezone {timezone!r}: {e}") from None


def parse_duration(text: str) -> float:
    """``"20h"`` -> 72000.0 seconds. Units s, m, h, d, w; a bare number is seconds."""
    m = _DURATION.match(str(text))
    if not m:
        raise ValueError(f"invalid duration {text!r}: use a number and a unit, e.g. 20h, 90m, 1d")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def previous_fire(trigger, at: dt.datetime | None = None, lookback_days: int = 8) -> dt.datetime | None:
    """The last time ``trigger`` fired at or before ``at`` (None if not within ``lookback_days``).

    APScheduler only knows the next fire time; a daemon that was down over its slot needs the
    previous one to decide whether the missed run is still within the misfire grace.
    """
    at = at or now()
    t = trigger.get_next_fire_time(None, at - dt.timedelta(days=lookback_days))
    last = None
    while t is not None and t <= at:
        last = t
        t = trigger.get_next_fire_time(t, t + dt.timedelta(seconds=1))
    return last


def iso(t: dt.datetime | None = None) -> str:
    """UTC timestamp as stored in autotune's tables: sortable text both SQLite and PostgreSQL parse."""
    return (t or now()).astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_iso(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
