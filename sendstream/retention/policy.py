"""A retention policy, read from btrbk's preserve settings.

``preserve`` is btrbk's preserve matrix: ``[N]h [N]d [N]w [N]m [N]y`` in any
order, each unit at most once, ``*`` for all of that unit, or ``no`` for none
(then only the minimum keeps anything). ``preserve_min`` is ``all``,
``latest``, ``no`` or an age ``N{h,d,w,m,y}``: everything younger is kept.

Our defaults differ from btrbk's on purpose. btrbk's ``*_preserve_min``
defaults to ``all``, which keeps everything whatever ``*_preserve`` says, so a
policy written without a minimum silently does nothing (btrbk #535). Here a
policy that is not written keeps everything (nothing is ever deleted unless
asked), and a written ``preserve`` takes effect with the minimum ``latest``:
the newest is always kept.
"""

from __future__ import annotations

import datetime
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final, Literal

from .. import errors as e

UNITS: Final = ("h", "d", "w", "m", "y")
UNIT_NAMES: Final = {"h": "hourly", "d": "daily", "w": "weekly", "m": "monthly", "y": "yearly"}
ALL: Final = sys.maxsize  # ``*``: every one of that unit
DAYS: Final = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")  # as struct tm's wday
_TERM = re.compile(r"(\*|[0-9]+)([hdwmyHDWMY])")
_AGE = re.compile(r"([0-9]+)([hdwmy])")
_MAX_COUNT = 1_000_000  # more hours than a century has: a typo, not a policy


@dataclass(frozen=True)
class Minimum:
    """Everything younger than ``count`` ``unit``s is kept (``kind`` ``"age"``), or ``"all"``,
    ``"latest"`` (the newest), ``"no"`` (none by age)."""

    kind: Literal["all", "latest", "no", "age"]
    count: int = 0
    unit: str = ""

    def __str__(self) -> str:
        return f"{self.count}{self.unit}" if self.kind == "age" else self.kind


@dataclass(frozen=True)
class Policy:
    """What to keep: ``preserve`` counts by unit (``None``: no policy, keep everything), the
    ``minimum``, the day weeks start on (``day_of_week``, 0 is Sunday), the hour days start at, and
    the time zone calendar days are counted in (``None``: local time)."""

    preserve: Mapping[str, int] | None = None
    minimum: Minimum = field(default_factory=lambda: Minimum("latest"))
    day_of_week: int = 0
    hour_of_day: int = 0
    tz: datetime.tzinfo | None = None

    @property
    def keeps_all(self) -> bool:
        return self.preserve is None or self.minimum.kind == "all"

    def __str__(self) -> str:
        if self.preserve is None:
            return "keep all (no policy)"
        terms = " ".join(
            f"{'*' if self.preserve[u] == ALL else self.preserve[u]}{u}" for u in UNITS if u in self.preserve
        )
        return f"preserve {terms or 'no'}, minimum {self.minimum}"


KEEP_ALL: Final = Policy()


def parse_preserve(text: str, setting: str = "preserve") -> dict[str, int]:
    """``"14d 10w *m"`` -> ``{"d": 14, "w": 10, "m": ALL}``; ``"no"`` -> ``{}``."""
    if not isinstance(text, str):
        raise e.BadPolicy(setting, text, 'a string such as "24h 14d 10w *m" or "no"')
    if text.strip() == "no":
        return {}
    counts: dict[str, int] = {}
    rest = _TERM.sub(lambda m: _add(counts, m, text, setting), text)
    if rest.strip() or not counts:
        raise e.BadPolicy(setting, text, '[N]h [N]d [N]w [N]m [N]y (N a number or *), or "no"')
    return counts


def _add(counts: dict[str, int], m: re.Match[str], text: str, setting: str) -> str:
    unit = m.group(2).lower()
    if unit in counts:
        raise e.BadPolicy(setting, text, f"each unit once ({unit!r} is given twice)")
    count = ALL if m.group(1) == "*" else int(m.group(1))
    if count != ALL and count > _MAX_COUNT:
        raise e.BadPolicy(setting, text, f"at most {_MAX_COUNT} of a unit (or * for all)")
    counts[unit] = count
    return " "


def parse_minimum(text: str, setting: str = "preserve_min") -> Minimum:
    """``"all"``, ``"latest"``, ``"no"`` or an age such as ``"2d"``."""
    for kind in ("all", "latest", "no"):
        if text == kind:
            return Minimum(kind)
    m = _AGE.fullmatch(text) if isinstance(text, str) else None
    if m is None or int(m.group(1)) > _MAX_COUNT:
        raise e.BadPolicy(setting, text, 'all, latest, no, or an age N{h,d,w,m,y} such as "2d"')
    return Minimum("age", int(m.group(1)), m.group(2))


def policy(
    preserve: str | None = None,
    minimum: str | None = None,
    *,
    day_of_week: str = "sunday",
    hour_of_day: int = 0,
    tz: datetime.tzinfo | None = None,
) -> Policy:
    """A policy from btrbk's settings (``None``: not written; see the module for the defaults)."""
    if not isinstance(day_of_week, str) or day_of_week.lower() not in DAYS:
        raise e.BadPolicy("preserve_day_of_week", day_of_week, f"one of {', '.join(DAYS)}")
    if isinstance(hour_of_day, bool) or not isinstance(hour_of_day, int) or not 0 <= hour_of_day <= 23:
        raise e.BadPolicy("preserve_hour_of_day", hour_of_day, "a whole hour from 0 to 23")
    return Policy(
        None if preserve is None else parse_preserve(preserve),
        Minimum("latest") if minimum is None else parse_minimum(minimum),
        DAYS.index(day_of_week.lower()),
        hour_of_day,
        tz,
    )


_NAMED = re.compile(
    r"(?P<base>.+)\.(?P<date>\d{8})(?:[tT](?P<hm>\d{4})(?:(?P<s>\d{2})(?P<zone>[zZ]|[+-]\d{4})?)?)?(?:_\d+)?"
)


def snapshot_time(name: str, policy: Policy = KEEP_ALL) -> tuple[str, datetime.datetime] | None:
    """The subvolume and time a btrbk-style snapshot name says (``home.20261204T0130``, ``home.20261204``,
    ``home.20261204T013000+0100``, each with an optional ``_N``), in ``policy``'s time zone unless the name
    gives an offset; ``None`` for a name that says no time. A date alone is taken at the policy's
    ``hour_of_day``, the start of its day (as btrbk takes its short format)."""
    m = _NAMED.fullmatch(name)
    if m is None:
        return None
    hm, zone = m.group("hm"), m.group("zone")
    text = m.group("date") + (f"{hm}{m.group('s') or '00'}" if hm else f"{policy.hour_of_day:02d}0000")
    try:  # (a name may say anything: 20261340, year 1, an offset of 99 hours are no time of a snapshot)
        naive = datetime.datetime.strptime(text, "%Y%m%d%H%M%S")
        if zone in ("z", "Z"):
            when = naive.replace(tzinfo=datetime.UTC)
        elif zone:
            offset = datetime.timedelta(hours=int(zone[1:3]), minutes=int(zone[3:5]))
            when = naive.replace(tzinfo=datetime.timezone(-offset if zone[0] == "-" else offset))
        else:
            when = naive.replace(tzinfo=policy.tz) if policy.tz is not None else naive.astimezone()
        when.astimezone(datetime.UTC).astimezone(policy.tz)  # placed on the calendar, both ways
    except (ValueError, OverflowError):
        return None
    return m.group("base"), when
