"""Which items a policy keeps at a given time, by btrbk's calendar.

Counted as btrbk counts (its ``schedule``): in wall-clock hours of the
policy's time zone (a day of 23 or 25 hours is not corrected); days start at
``hour_of_day``; weeks on ``day_of_week``; months and years on the first
``day_of_week`` in them. The first (oldest) item of each of the latest N
hours is kept, of those the first of each of the latest N days, of those the
first of each of the latest N weeks, of those the first of each of the latest
N months, and of those the first of each of the latest N years. An item dated
after ``now`` (a clock that was ahead) is kept.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Hashable, Iterable, Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from .policy import ALL, UNIT_NAMES, Policy, snapshot_time

K = TypeVar("K", bound=Hashable)
_EPOCH = datetime.datetime(1970, 1, 1)
_HOUR = datetime.timedelta(hours=1)


@dataclass(frozen=True)
class Decision(Generic[K]):
    """An item, its time, and why it is kept (``None``: the policy lets it go)."""

    key: K
    time: datetime.datetime
    reason: str | None

    @property
    def keep(self) -> bool:
        return self.reason is not None


@dataclass
class _Item(Generic[K]):
    key: K
    time: datetime.datetime
    deltas: dict[str, int]  # hours, days, weeks, months and years before now, by unit
    reason: str | None = None


def _trunc_div(a: int, b: int) -> int:
    """``a / b`` rounded toward zero (as btrbk's ``int``), for an item dated after now."""
    return a // b if a >= 0 else -(-a // b)


def _wall_hours(local: datetime.datetime) -> int:
    return (local.replace(tzinfo=None, minute=0, second=0, microsecond=0) - _EPOCH) // _HOUR


def _deltas(local: datetime.datetime, now: datetime.datetime, policy: Policy) -> dict[str, int]:
    from_day_start = local.hour - policy.hour_of_day
    from_week_start = (local.weekday() + 1) % 7 - policy.day_of_week
    if from_day_start < 0:
        from_day_start += 24
        from_week_start -= 1
    from_week_start %= 7
    month, year = local.month - 1, local.year
    if local.day <= from_week_start:  # before the month's first week day: still last month's
        month, year = (month - 1, year) if month else (11, year - 1)
    hours = _wall_hours(now) - _wall_hours(local)
    days = _trunc_div(hours + from_day_start, 24)
    years = now.year - year
    return {
        "h": hours,
        "d": days,
        "w": _trunc_div(days + from_week_start, 7),
        "m": years * 12 + (now.month - 1 - month),
        "y": years,
    }


def schedule(
    items: Iterable[tuple[K, datetime.datetime]],
    now: datetime.datetime,
    policy: Policy,
    *,
    parent_of: Callable[[K], K | None] | None = None,
    pinned: Mapping[K, str] | None = None,
    newest: bool = False,
) -> list[Decision[K]]:
    """What ``policy`` keeps of ``items`` (key, time) at ``now``, oldest first.

    With ``parent_of`` (an item's parent, or ``None``), whatever a kept item
    builds on is kept too; ``pinned`` items are kept for the reason given (the
    newest common parent of a target); with ``newest``, the newest item is
    kept whatever the minimum (the base of the next incremental).
    """
    tz = policy.tz
    local_now = now.astimezone(tz)
    ordered = sorted(
        (_Item(key, time, _deltas(time.astimezone(tz), local_now, policy)) for key, time in items),
        key=lambda item: item.time,
    )
    if policy.keeps_all:
        for item in ordered:
            item.reason = "no policy: everything is kept" if policy.preserve is None else "preserve_min: all"
    else:
        _apply(ordered, policy)
    if newest and ordered:
        ordered[-1].reason = ordered[-1].reason or "the newest: the base of the next incremental"
    decisions = [Decision(item.key, item.time, item.reason) for item in ordered]
    return keep_closure(decisions, parent_of, pinned or {})


def kept_by_name(
    named: Iterable[tuple[K, str | None]], now: datetime.datetime, policy: Policy, *, newest: bool = False
) -> set[K]:
    """Of items with a btrbk-style snapshot name each (``home.20261204T0130``), those ``policy`` keeps at
    ``now`` by the time the name says, subvolume by subvolume (with ``newest``: and the newest of each);
    one whose name says no time (or none) is kept: it cannot be placed."""
    kept: set[K] = set()
    by_subvolume: dict[str, list[tuple[K, datetime.datetime]]] = {}
    for key, name in named:
        said = snapshot_time(name, policy) if name else None
        if said is None:
            kept.add(key)
        else:
            by_subvolume.setdefault(said[0], []).append((key, said[1]))
    for items in by_subvolume.values():
        kept.update(d.key for d in schedule(items, now, policy, newest=newest) if d.keep)
    return kept


def _apply(ordered: list[_Item[K]], policy: Policy) -> None:
    minimum = policy.minimum
    for item in ordered:
        if item.deltas["h"] < 0:
            item.reason = "dated after now (a clock ahead): kept"
        elif minimum.kind == "age" and item.deltas[minimum.unit] <= minimum.count:
            item.reason = f"preserve_min: younger than {minimum}"
    if minimum.kind == "latest" and ordered:
        ordered[-1].reason = ordered[-1].reason or "preserve_min: the latest"
    preserve = policy.preserve or {}
    candidates = ordered
    for unit in ("h", "d", "w", "m", "y"):
        firsts: dict[int, _Item[K]] = {}
        for item in candidates:
            firsts.setdefault(item.deltas[unit], item)
        count = preserve.get(unit, 0)
        for delta, item in firsts.items():
            if count and (count == ALL or delta <= count) and item.reason is None:
                item.reason = (
                    f"preserve {UNIT_NAMES[unit]}: the first of its {_PERIOD[unit]}, {delta} {_PERIOD[unit]}s ago"
                )
        candidates = list(firsts.values())


_PERIOD = {"h": "hour", "d": "day", "w": "week", "m": "month", "y": "year"}


def keep_closure(
    decisions: list[Decision[K]], parent_of: Callable[[K], K | None] | None, pinned: Mapping[K, str]
) -> list[Decision[K]]:
    """``decisions`` with every pinned item kept, and every item a kept one builds on (through
    ``parent_of``), however far back."""
    reasons = {d.key: d.reason for d in decisions}
    for key, why in pinned.items():
        if key in reasons and reasons[key] is None:
            reasons[key] = why
    if parent_of is not None:
        seen: set[K] = set()
        for start in [k for k, why in reasons.items() if why is not None]:
            child, parent = start, parent_of(start)
            while parent is not None and parent in reasons and parent not in seen:
                seen.add(parent)
                if reasons[parent] is None:
                    reasons[parent] = f"a kept one builds on it ({child!s})"
                child, parent = parent, parent_of(parent)
    return [Decision(d.key, d.time, reasons[d.key]) for d in decisions]
