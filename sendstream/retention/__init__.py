"""Retention: which snapshots (or stored streams) a policy keeps, in btrbk's preserve syntax.

A :class:`Policy` is read from the settings btrbk users already write
(``preserve = "14d 10w *m"``, ``preserve_min = "2d"``, ``preserve_day_of_week``,
``preserve_hour_of_day``) and :func:`schedule` applies it to items by the
snapshot's time, as btrbk does: the first snapshot of each of the latest N
hours, days (from ``hour_of_day``), weeks (from ``day_of_week``), months and
years, and every one younger than the minimum age. What a kept item builds on
and what a caller pins (the newest common parent of a target) are kept too.

Pure: the clock is the caller's ``now``; nothing here reads the time or a disk.
"""

from .policy import ALL, KEEP_ALL, Minimum, Policy, parse_minimum, parse_preserve, policy, snapshot_time
from .schedule import Decision, keep_closure, kept_by_name, schedule

__all__ = [
    "ALL",
    "KEEP_ALL",
    "Decision",
    "Minimum",
    "Policy",
    "keep_closure",
    "kept_by_name",
    "parse_minimum",
    "parse_preserve",
    "policy",
    "schedule",
    "snapshot_time",
]
