"""Scheduling across daylight-saving changes, in every zone of the tz database: each scheduled
night fires exactly once (an overlap's first occurrence; a gap's first valid instant), fire times
strictly increase, the look-back finds the last fire, and every computation is bounded.

The reference is computed independently: a wall time's occurrences are the folds that round-trip,
and a gap's end is found by scanning the zone's offsets minute by minute."""

from __future__ import annotations

import datetime as dt
import time
import zoneinfo

import pytest

from autotune.core._schedule import Schedule, previous_fire

UTC = dt.timezone.utc
YEAR = 2026


def _transitions(zone: zoneinfo.ZoneInfo, year: int) -> list[tuple[dt.datetime, dt.timedelta, dt.timedelta]]:
    """(instant, offset before, offset after) of each offset change in ``year``: a 6-hourly scan, then bisect."""
    out = []
    t = dt.datetime(year, 1, 1, tzinfo=UTC) - dt.timedelta(days=1)
    end = dt.datetime(year + 1, 1, 1, tzinfo=UTC) + dt.timedelta(days=1)
    prev = t.astimezone(zone).utcoffset()
    while t < end:
        nxt = t + dt.timedelta(hours=6)
        off = nxt.astimezone(zone).utcoffset()
        if off != prev:
            lo, hi = t, nxt
            while hi - lo > dt.timedelta(seconds=1):
                mid = lo + (hi - lo) / 2
                if mid.astimezone(zone).utcoffset() == prev:
                    lo = mid
                else:
                    hi = mid
            out.append((hi.replace(microsecond=0), prev, off))
            prev = off
        t = nxt
    return out


def _expected(zone, wall: dt.datetime, transitions) -> dt.datetime:
    """Where the scheduled naive ``wall`` should run: its first occurrence, or a gap's end."""
    occurrences = sorted({wall.replace(tzinfo=zone, fold=f).astimezone(UTC) for f in (0, 1)
                          if wall.replace(tzinfo=zone, fold=f).astimezone(UTC).astimezone(zone).replace(tzinfo=None) == wall})
    if occurrences:
        return occurrences[0]
    for at, before, after in transitions:  # the gap holding wall: local time jumps over it at `at`
        if (at + before).replace(tzinfo=None) <= wall < (at + after).replace(tzinfo=None):
            return at
    raise AssertionError(f"{wall} in {zone} neither exists nor lies in a gap")


def _cases():
    """Per zone with changes: a nightly cron at a wall minute inside each gap and each overlap."""
    for name in sorted(zoneinfo.available_timezones()):
        zone = zoneinfo.ZoneInfo(name)
        tr = _transitions(zone, YEAR)
        walls = set()
        for at, before, after in tr:
            # a minute inside the jumped or repeated stretch of local time (or the change itself)
            local = (at + min(before, after)).replace(tzinfo=None) + abs(after - before) / 2
            walls.add((local.minute, local.hour))
        yield name, tr, sorted(walls) or [(30, 1)]


CASES = list(_cases())


def test_the_tz_database_has_changes_to_test():
    with_changes = [n for n, tr, _ in CASES if tr]
    assert len(CASES) > 400 and len(with_changes) > 60, (len(CASES), len(with_changes))
    assert {"America/New_York", "Europe/Paris", "Australia/Lord_Howe", "Pacific/Chatham"} <= set(with_changes)


@pytest.mark.parametrize("name,transitions,walls", CASES, ids=[c[0] for c in CASES])
def test_each_scheduled_night_fires_once_across_a_year_of_changes(name, transitions, walls):
    zone = zoneinfo.ZoneInfo(name)
    start = dt.datetime(YEAR, 1, 1, tzinfo=zone)
    end = dt.datetime(YEAR + 1, 1, 1, tzinfo=zone)
    for minute, hour in walls:
        sched = Schedule(f"{minute} {hour} * * *", name)
        t0 = time.process_time()
        got = list(sched.fires(start, end))
        want, day = [], start.replace(tzinfo=None)
        while day < end.replace(tzinfo=None):
            w = _expected(zone, day.replace(hour=hour, minute=minute), transitions)
            if start <= w <= end and (not want or w > want[-1]):  # slots sharing a gap's end run once
                want.append(w)
            day += dt.timedelta(days=1)
        assert got == want, (name, hour, minute, [g for g in got if g not in want][:3], [w for w in want if w not in got][:3])
        assert all(a < b for a, b in zip(got, got[1:]))
        assert time.process_time() - t0 < 5, "one zone's year took seconds: the work is not bounded"

        # what APScheduler asks the daemon's trigger: after each fire, the next one; never the same twice
        trig, seen, t = sched.trigger(), [], None
        t = trig.get_next_fire_time(None, start.astimezone(UTC))
        while t is not None and t <= end:
            seen.append(t)
            t = trig.get_next_fire_time(t, t)
        assert seen == got
        # a daemon up late (10 minutes after a fire) gets the next slot, not the one it just ran
        for a, b in zip(got, got[1:]):
            late = a + dt.timedelta(minutes=10)
            if late < b:
                assert trig.get_next_fire_time(None, late) == b
        # the catch-up's look-back, from inside each change's repeated or skipped stretch
        for at, before, after in transitions:
            for probe in (at - dt.timedelta(minutes=1), at + dt.timedelta(minutes=1), at + abs(after - before)):
                last = max((g for g in want if g <= probe), default=None)
                if last is not None and probe - last <= dt.timedelta(days=8):
                    assert previous_fire(sched, probe) == last, (name, probe)


def test_the_fall_back_morning_in_new_york_fires_once_and_the_catch_up_returns():
    """The reported case: ``30 1 * * *`` on 2026-11-01, where 01:30 happens twice."""
    sched = Schedule("30 1 * * *", "America/New_York")
    morning = dt.datetime(2026, 11, 1, 6, 45, tzinfo=UTC)  # 01:45 EST, after the second 01:30
    t0 = time.process_time()
    assert previous_fire(sched, morning) == dt.datetime(2026, 11, 1, 5, 30, tzinfo=UTC)  # 01:30 EDT
    assert time.process_time() - t0 < 1
    fires = list(sched.fires(dt.datetime(2026, 10, 31, tzinfo=UTC), dt.datetime(2026, 11, 3, tzinfo=UTC)))
    assert [sched.local(t) for t in fires] == ["2026-10-31 01:30 EDT (-0400)", "2026-11-01 01:30 EDT (-0400)",
                                               "2026-11-02 01:30 EST (-0500)"]
    spring = Schedule("30 2 * * *", "America/New_York")  # 02:30 does not exist on 2026-03-08
    fires = list(spring.fires(dt.datetime(2026, 3, 7, tzinfo=UTC), dt.datetime(2026, 3, 10, tzinfo=UTC)))
    assert [spring.local(t) for t in fires] == ["2026-03-07 02:30 EST (-0500)", "2026-03-08 03:00 EDT (-0400)",
                                                "2026-03-09 02:30 EDT (-0400)"]


def test_a_skipped_day_and_a_frequent_cron_stay_bounded():
    # Samoa skipped 2011-12-30 whole: that night runs once, at the next valid midnight
    apia = Schedule("0 0 * * *", "Pacific/Apia")
    days = [apia.local(t)[:10] for t in apia.fires(dt.datetime(2011, 12, 28, tzinfo=UTC), dt.datetime(2012, 1, 2, tzinfo=UTC))]
    assert days == ["2011-12-28", "2011-12-29", "2011-12-31", "2012-01-01", "2012-01-02"]
    # every minute across a fall-back: the repeated hour's slots already ran; look-back is quick
    every = Schedule("* * * * *", "America/New_York")
    t0 = time.process_time()
    got = list(every.fires(dt.datetime(2026, 11, 1, 5, 58, tzinfo=UTC), dt.datetime(2026, 11, 1, 7, 2, tzinfo=UTC)))
    assert [every.local(t)[11:16] for t in got] == ["01:58", "01:59", "02:00", "02:01", "02:02"]
    assert previous_fire(every, dt.datetime(2026, 11, 1, 6, 30, tzinfo=UTC)) == dt.datetime(2026, 11, 1, 5, 59, tzinfo=UTC)
    assert previous_fire(Schedule("0 2 1 1 *"), dt.datetime(2026, 11, 29, tzinfo=UTC)) is None  # beyond the look-back
    assert previous_fire(Schedule("0 2 1 1 *"), dt.datetime(2026, 11, 29, tzinfo=UTC), lookback_days=400) \
        == dt.datetime(2026, 1, 1, 2, tzinfo=UTC)
    assert time.process_time() - t0 < 2
    with pytest.raises(ValueError, match="unknown time zone"):
        Schedule("0 2 * * *", "Mars/Olympus")
