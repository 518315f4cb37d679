"""Retention in btrbk's preserve syntax: parsing, btrbk's calendar, and properties over random
histories pruned run after run on a simulated clock."""

from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sendstream import errors as e
from sendstream.retention import (
    ALL,
    KEEP_ALL,
    Minimum,
    Policy,
    parse_minimum,
    parse_preserve,
    policy,
    schedule,
    snapshot_time,
)

UTC = dt.UTC
BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")  # days of 23 and 25 hours


def at(text: str, tz: dt.tzinfo = UTC) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=tz)


def kept(items: list[tuple[str, dt.datetime]], now: dt.datetime, p: Policy, **kw: object) -> list[str]:
    return [d.key for d in schedule(items, now, p, **kw) if d.keep]  # type: ignore[arg-type]


# -- parsing ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "counts"),
    [
        ("14d 10w *m", {"d": 14, "w": 10, "m": ALL}),
        ("24h", {"h": 24}),
        ("*y 0d", {"y": ALL, "d": 0}),
        ("  6M 2W ", {"m": 6, "w": 2}),  # btrbk takes the units in either case
        ("no", {}),
    ],
)
def test_preserve_matrices_parse_as_btrbk_reads_them(text: str, counts: dict[str, int]) -> None:
    assert parse_preserve(text) == counts


@pytest.mark.parametrize("text", ["14d 3d", "14x", "", "d", "14d,10w", "no 3d", "-1d", "1000001h", "14 d"])
def test_a_bad_preserve_matrix_names_the_setting_and_what_was_expected(text: str) -> None:
    with pytest.raises(e.BadPolicy) as caught:
        parse_preserve(text, "target_preserve")
    assert caught.value.setting == "target_preserve" and caught.value.value == text
    assert str(caught.value).startswith(f"target_preserve = {text!r}: expected ")
    assert caught.value.exit_code == e.EXIT_USAGE


def test_minimums_and_the_other_settings_parse_or_say_what_is_expected() -> None:
    assert parse_minimum("all") == Minimum("all") and parse_minimum("latest") == Minimum("latest")
    assert parse_minimum("no") == Minimum("no") and parse_minimum("36h") == Minimum("age", 36, "h")
    for bad in ("2", "2x", "latest 2d", "*d"):
        with pytest.raises(e.BadPolicy, match=r"preserve_min = .*expected all, latest, no, or an age"):
            parse_minimum(bad)
    with pytest.raises(e.BadPolicy, match="preserve_day_of_week = 'someday': expected one of sunday"):
        policy("7d", day_of_week="someday")
    with pytest.raises(e.BadPolicy, match="preserve_hour_of_day = 24: expected a whole hour"):
        policy("7d", hour_of_day=24)
    assert policy("7d", day_of_week="Monday").day_of_week == 1


def test_our_defaults_keep_everything_unless_a_policy_is_written_and_then_it_takes_effect() -> None:
    """btrbk's preserve_min defaults to "all", which cancels a written preserve (btrbk #535)."""
    items = [(f"s{i}", at("2026-01-01T00:00") + dt.timedelta(days=i)) for i in range(30)]
    now = at("2026-01-31T00:00")
    assert policy() == KEEP_ALL and kept(items, now, KEEP_ALL) == [k for k, _ in items]
    assert str(policy("3d")) == "preserve 3d, minimum latest"
    assert kept(items, now, policy("3d")) == ["s27", "s28", "s29"]  # 1, 2 and 3 days ago (now is day 0)
    assert kept(items, now, policy("3d", "all")) == [k for k, _ in items]  # btrbk's default, asked for
    assert kept(items, now, policy("no")) == ["s29"]  # the newest, always
    assert kept(items, now, policy("no", "no")) == []


# -- btrbk's calendar, worked by hand --------------------------------------------------------------


def test_hourly_and_daily_keep_the_first_of_each_hour_and_day() -> None:
    # every 20 minutes for three days, now 2026-03-04 12:10 (a Wednesday)
    start = at("2026-03-01T12:00")
    items = [(f"{i}", start + dt.timedelta(minutes=20 * i)) for i in range(3 * 72 + 1)]
    now = items[-1][1] + dt.timedelta(minutes=10)
    decisions = schedule(items, now, policy("3h 2d", "no"))
    times = [d.time for d in decisions if d.keep]
    # the first of the hours 12:00, 11:00, 10:00, 9:00 (now's hour is 0 hours ago), and of the days
    # 2026-03-04, 03 and 02 (0, 1 and 2 days ago)
    assert times == [
        at("2026-03-02T00:00"),
        at("2026-03-03T00:00"),
        at("2026-03-04T00:00"),
        at("2026-03-04T09:00"),
        at("2026-03-04T10:00"),
        at("2026-03-04T11:00"),
        at("2026-03-04T12:00"),
    ]
    reasons = {d.time: d.reason for d in decisions}
    assert reasons[at("2026-03-02T00:00")] == "preserve daily: the first of its day, 2 days ago"
    assert reasons[at("2026-03-04T09:00")] == "preserve hourly: the first of its hour, 3 hours ago"


def test_days_start_at_the_hour_of_day_and_weeks_on_the_day_of_week() -> None:
    items = [(f"{i}", at("2026-03-01T00:00") + dt.timedelta(hours=i)) for i in range(24 * 21)]
    now = at("2026-03-21T23:30")  # a Saturday
    daily = [d.time for d in schedule(items, now, policy("1d", "no", hour_of_day=6)) if d.keep]
    assert daily == [at("2026-03-20T06:00"), at("2026-03-21T06:00")]
    weekly = [d.time for d in schedule(items, now, policy("2w", "no", day_of_week="wednesday")) if d.keep]
    # weeks from Wednesday: 2026-03-04, 11 and 18 (2, 1, 0 weeks ago)
    assert weekly == [at("2026-03-04T00:00"), at("2026-03-11T00:00"), at("2026-03-18T00:00")]


def test_months_and_years_start_on_the_first_day_of_week_in_them() -> None:
    # daily at noon through 2025 and 2026 (to 2026-12-03); months begin on their first Sunday
    items = [(f"{i}", at("2025-01-01T12:00") + dt.timedelta(days=i)) for i in range(702)]
    now = at("2026-12-03T13:00")
    monthly = [d.time.date() for d in schedule(items, now, policy("2m", "no")) if d.keep]
    # November 2026's first Sunday is the 1st, October's the 4th, December's the 6th (not yet):
    # December 1-3 are still November's, so the months kept are October and November
    assert monthly == [dt.date(2026, 10, 4), dt.date(2026, 11, 1)]
    yearly = [d.time.date() for d in schedule(items, now, policy("*y", "no")) if d.keep]
    # 2025-01-01 to 04 come before 2025's first Sunday: they are 2024's, and the first of them stays
    assert yearly == [dt.date(2025, 1, 1), dt.date(2025, 1, 5), dt.date(2026, 1, 4)]


def test_a_snapshot_dated_after_now_is_kept() -> None:
    items = [("old", at("2026-01-01T00:00")), ("ahead", at("2026-06-02T00:00"))]
    assert kept(items, at("2026-06-01T00:00"), policy("no", "no")) == ["ahead"]


def test_what_a_kept_one_builds_on_and_what_is_pinned_stay() -> None:
    items = [(f"s{i}", at("2026-01-01T00:00") + dt.timedelta(days=i)) for i in range(10)]
    parent = {f"s{i}": f"s{i - 1}" for i in range(1, 10)} | {"s5": None}  # s5 is a full stream
    now = at("2026-01-10T12:00")
    decisions = schedule(items, now, policy("1d", "no"), parent_of=parent.get, pinned={"s2": "target t1's parent"})
    reasons = {d.key: d.reason for d in decisions}
    # s8 and s9 by the policy, s5-s7 as their chain, s2 pinned and s0-s1 as its chain
    assert [k for k, why in reasons.items() if why] == ["s0", "s1", "s2", "s5", "s6", "s7", "s8", "s9"]
    assert reasons["s5"] == "a kept one builds on it (s6)" and reasons["s2"] == "target t1's parent"
    assert reasons["s3"] is None and reasons["s4"] is None


# -- properties over random histories --------------------------------------------------------------

COUNTS = st.one_of(st.none(), st.integers(0, 6), st.just(ALL))


@st.composite
def policies(draw: st.DrawFn) -> Policy:
    counts = {u: c for u in "hdwmy" if (c := draw(COUNTS)) is not None}
    minimum = draw(
        st.one_of(
            st.sampled_from([Minimum("latest"), Minimum("no"), Minimum("all")]),
            st.builds(Minimum, st.just("age"), st.integers(0, 5), st.sampled_from("hdwmy")),
        )
    )
    tz = draw(st.sampled_from([UTC, BERLIN]))
    return Policy(counts, minimum, draw(st.integers(0, 6)), draw(st.integers(0, 23)), tz)


@st.composite
def histories(draw: st.DrawFn) -> list[dt.datetime]:
    """Times of runs: a start between 2020 and 2030, then steps of minutes to weeks."""
    start = dt.datetime(2020, 1, 1, tzinfo=UTC) + dt.timedelta(minutes=draw(st.integers(0, 10 * 525_600)))
    steps = draw(st.lists(st.sampled_from([7, 45, 61, 300, 1440, 1500, 4 * 1440, 10_080, 40_000]), max_size=120))
    times = [start]
    for minutes in steps:
        times.append(times[-1] + dt.timedelta(minutes=minutes))
    return times


@settings(deadline=None)
@given(policies(), histories())
def test_pruning_run_after_run_keeps_what_the_policy_keeps_of_the_whole_history(
    p: Policy, runs: list[dt.datetime]
) -> None:
    """Each run takes a snapshot and deletes what the policy lets go; what is left is, every time,
    what the policy keeps of every snapshot ever taken: a deletion is never regretted later, and no
    run keeps a snapshot that a run on the whole history would not."""
    held: list[tuple[int, dt.datetime]] = []
    for i, now in enumerate(runs):
        held.append((i, now))
        held = [(d.key, d.time) for d in schedule(held, now, p) if d.keep]
        whole = [d.key for d in schedule(list(enumerate(runs[: i + 1])), now, p) if d.keep]
        assert [k for k, _ in held] == whole
        if p.minimum.kind in ("latest", "all"):
            assert held[-1][0] == i  # the newest stays
        if p.keeps_all:
            assert len(held) == i + 1


@settings(deadline=None)
@given(policies(), histories(), st.integers(0, 6))
def test_more_of_a_unit_never_keeps_less(p: Policy, runs: list[dt.datetime], more: int) -> None:
    items = list(enumerate(runs))
    now = runs[-1]
    for unit in "hdwmy":
        counts = dict(p.preserve or {})
        if counts.get(unit) == ALL:
            continue
        bigger = Policy(counts | {unit: counts.get(unit, 0) + more}, p.minimum, p.day_of_week, p.hour_of_day, p.tz)
        assert set(kept(items, now, p)) <= set(kept(items, now, bigger))  # type: ignore[arg-type]


@settings(deadline=None)
@given(policies(), histories())
def test_a_finite_policy_keeps_at_most_one_per_period_it_names(p: Policy, runs: list[dt.datetime]) -> None:
    counts = dict(p.preserve or {})
    bounded = Policy(counts, Minimum("no"), p.day_of_week, p.hour_of_day, p.tz)
    decisions = schedule(list(enumerate(runs)), runs[-1], bounded)
    if all(c != ALL for c in counts.values()):
        assert sum(d.keep for d in decisions) <= sum(c + 1 for c in counts.values() if c)
    for d in decisions:
        if d.reason and d.reason.startswith("preserve daily"):
            same_day = [x for x in decisions if x.reason and "days ago" in x.reason and x.reason == d.reason]
            assert same_day == [d]  # one per day: the first of it


@settings(deadline=None)
@given(policies(), histories(), st.data())
def test_nothing_a_kept_one_builds_on_and_nothing_pinned_is_let_go(
    p: Policy, runs: list[dt.datetime], data: st.DataObject
) -> None:
    n = len(runs)
    # each snapshot's stream is full or builds on an earlier one (as chains with rotations do)
    parents = [None] + [data.draw(st.one_of(st.none(), st.integers(0, i - 1))) for i in range(1, n)]
    pinned = {k: "a target's newest common parent" for k in data.draw(st.sets(st.integers(0, n - 1), max_size=3))}
    decisions = schedule(list(enumerate(runs)), runs[-1], p, parent_of=parents.__getitem__, pinned=pinned)
    keep = {d.key for d in decisions if d.keep}
    assert set(pinned) <= keep
    for k in keep:
        assert parents[k] is None or parents[k] in keep
    plain = {d.key for d in schedule(list(enumerate(runs)), runs[-1], p) if d.keep}
    assert plain <= keep  # closure only adds


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("home.20261204T0130", ("home", at("2026-12-04T01:30", BERLIN))),
        ("home.20261204", ("home", at("2026-12-04T06:00", BERLIN))),  # a date alone: at the hour days start
        ("home.20261204T013000+0100", ("home", at("2026-12-04T00:30"))),
        ("home.20261204T013000Z", ("home", at("2026-12-04T01:30"))),
        ("a.b.20261204T0130_2", ("a.b", at("2026-12-04T01:30", BERLIN))),
        ("home", None),
        ("home.20261340", None),  # digits, but no date
        ("home.2026120", None),
        ("home.20261204T01", None),
        ("home.20261201T013000+9900", None),  # an offset of 99 hours
        ("home.00010101T0000", None),  # before the calendar (midnight of year 1 in Berlin: year 0 in UTC)
        ("home.99991231T235959-2300", None),  # past it
    ],
)
def test_snapshot_names_say_their_time_as_btrbk_writes_it(name: str, said: tuple[str, dt.datetime] | None) -> None:
    assert snapshot_time(name, policy("1d", hour_of_day=6, tz=BERLIN)) == said
