"""What a backup run sends and keeps, decided without touching anything (sans-IO).

The driver (:mod:`.run`) lists the host's snapshots and what each target
holds; these functions say, for one subvolume and one target, which
snapshots go and from which parent (:func:`sends`), which local snapshots
the policy lets go (:func:`local_kept`), and what ``backup status`` says
(:func:`standing`). A target's snapshot is matched to a local one by UUID,
and a local snapshot that was itself received by its received UUID, as
``btrfs receive`` matches a parent.
"""

from __future__ import annotations

import dataclasses
import datetime
import re
from collections.abc import Iterable, Mapping, Sequence

from ..errors import BadPolicy
from ..retention import Decision, Policy, schedule, snapshot_time

_AGE = re.compile(r"([1-9][0-9]{0,5})([hdw])")
_UNIT = {"h": datetime.timedelta(hours=1), "d": datetime.timedelta(days=1), "w": datetime.timedelta(weeks=1)}
MAX_CHAIN = 100_000  # held streams walked back to a full one at most (a chain that goes round ends too)


@dataclasses.dataclass(frozen=True)
class Local:
    """A read-only snapshot on the host: its name (``NAME.YYYYMMDDTHHMM``), UUIDs, the time its name says,
    and its subvolume ID (IDs grow as subvolumes are made: the order they were taken in, whatever the
    clock said, e.g. in the hour a change from summer time repeats)."""

    name: str
    uuid: str
    received_uuid: str | None
    time: datetime.datetime
    id: int = 0


@dataclasses.dataclass(frozen=True)
class Held:
    """A snapshot a target holds, as its list says (:mod:`sendstream.stores.store`)."""

    uuid: str
    parent_uuid: str | None
    snapshot: str | None
    arrived: datetime.datetime | None

    @classmethod
    def of(cls, listed: Mapping[str, object]) -> Held:
        """One entry of a target's list (flat JSON)."""
        arrived = listed.get("arrived")
        when = None
        if isinstance(arrived, str):
            try:
                when = datetime.datetime.fromisoformat(arrived)
            except ValueError:
                when = None
        parent, snapshot = listed.get("parent_uuid"), listed.get("snapshot")
        return cls(
            str(listed.get("uuid")),
            str(parent) if parent else None,
            str(snapshot) if isinstance(snapshot, str) else None,
            when,
        )

    def time(self, policy: Policy) -> datetime.datetime | None:
        """When the snapshot was taken, by its name; else when it arrived."""
        said = snapshot_time(self.snapshot, policy) if self.snapshot else None
        return said[1] if said else self.arrived


@dataclasses.dataclass(frozen=True)
class Rotation:
    """When a target gets a full stream again instead of one more incremental: once its chain has
    ``length`` incrementals, or its full stream is ``age`` old (None: never)."""

    length: int | None = None
    age: datetime.timedelta | None = None

    def __str__(self) -> str:
        return f"{self.length} incrementals" if self.length is not None else f"{self.age} since the full stream"


def rotation(value: object, setting: str = "full_every") -> Rotation | None:
    """``full_every``: a chain length (``10``) or an age (``"30d"``, ``"4w"``, ``"12h"``); None when not set."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_CHAIN:
        return Rotation(length=value)
    m = _AGE.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise BadPolicy(setting, value, f'a chain length from 1 to {MAX_CHAIN} or an age N{{h,d,w}} such as "30d"')
    return Rotation(age=int(m.group(1)) * _UNIT[m.group(2)])


def age(value: object, setting: str) -> datetime.timedelta:
    """An age setting (``warn_after = "2d"``)."""
    m = _AGE.fullmatch(value) if isinstance(value, str) else None
    if m is None:
        raise BadPolicy(setting, value, 'an age N{h,d,w} such as "2d"')
    return int(m.group(1)) * _UNIT[m.group(2)]


@dataclasses.dataclass(frozen=True)
class Send:
    """One stream to send: ``snapshot`` whole (``parent`` None) or as an incremental of ``parent``."""

    snapshot: str
    parent: str | None
    why: str


def _holds(held: Iterable[Held]) -> set[str]:
    return {h.uuid for h in held}


def common(local: Sequence[Local], held: Iterable[Held]) -> Local | None:
    """The newest local snapshot the target holds (matched by UUID, or received UUID): the next parent."""
    uuids = _holds(held)
    return next((s for s in reversed(local) if s.uuid in uuids or s.received_uuid in uuids), None)


def chain(held: Sequence[Held], uuid: str) -> list[Held]:
    """The held streams that make the snapshot ``uuid``, its full stream first (as far as they are held)."""
    by_uuid = {h.uuid: h for h in held}
    out: list[Held] = []
    at = by_uuid.get(uuid)
    while at is not None and len(out) < MAX_CHAIN and at not in out:
        out.append(at)
        at = by_uuid.get(at.parent_uuid) if at.parent_uuid else None
    return out[::-1]


def sends(
    local: Sequence[Local],
    held: Sequence[Held],
    now: datetime.datetime,
    policy: Policy,
    full_every: Rotation | None = None,
) -> list[Send]:
    """What goes to a target that holds ``held``, oldest first: each local snapshot newer than the newest it
    holds, each an incremental of the one before (``local`` is oldest first); when it holds none, every
    local snapshot, the oldest whole; a full stream whenever ``full_every`` says a chain has grown long or
    old enough."""
    if not local:
        return []
    base = common(local, held)
    out: list[Send] = []
    started: datetime.datetime | None
    if base is None:  # all the host has goes: a run cut before its first stream got there is done again
        out.append(Send(local[0].name, None, "the target holds none of this subvolume's snapshots"))
        base = local[0]
        length, started = 0, base.time
    else:
        made = chain(held, _their_uuid(base, held))
        length, started = max(len(made) - 1, 0), made[0].time(policy) if made else None
    parent = base
    for snapshot in local[local.index(base) + 1 :]:
        due = full_every is not None and (
            (full_every.length is not None and length >= full_every.length)
            or (full_every.age is not None and (started is None or now - started >= full_every.age))
        )
        if due:
            out.append(Send(snapshot.name, None, f"full rotation: every {full_every}"))
            length, started = 0, snapshot.time
        else:
            out.append(Send(snapshot.name, parent.name, f"the target holds {parent.name}"))
            length += 1
        parent = snapshot
    return out


def _their_uuid(snapshot: Local, held: Iterable[Held]) -> str:
    """The UUID a target knows ``snapshot`` by: its own, or the one it was received as."""
    return snapshot.uuid if snapshot.uuid in _holds(held) else str(snapshot.received_uuid)


def pins(local: Sequence[Local], held: Sequence[Held], target: str) -> dict[str, str]:
    """The local snapshots a target needs kept, with why: the newest it holds (its next parent) and every
    newer one it does not hold yet (a failed send is sent again by the next run)."""
    base = common(local, held)
    start = local.index(base) if base is not None else 0
    out = {s.name: f"not yet on {target}" for s in local[start:]}
    if base is not None:
        out[base.name] = f"the newest {target} holds: its next parent"
    return out


def local_kept(
    local: Sequence[Local], policy: Policy, now: datetime.datetime, pinned: Mapping[str, str]
) -> list[Decision[str]]:
    """What ``policy`` keeps of the host's snapshots at ``now`` (the newest always: the next run's parent),
    and the ``pinned`` ones whatever it says; oldest first."""
    return schedule(((s.name, s.time) for s in local), now, policy, pinned=pinned, newest=True)


def order(name: str) -> tuple[int, str]:
    """What orders snapshots of one minute (``home.20261204T0130``, then ``_1``, ``_2``, ... ``_10``)."""
    return len(name), name


def snapshot_name(base: str, now: datetime.datetime, taken: Iterable[str]) -> str:
    """``BASE.YYYYMMDDTHHMM`` in local time (btrbk's default); when that minute has one already, ``_N`` after
    the highest N it has (snapshots of one minute are ordered by N)."""
    name = f"{base}.{now.astimezone():%Y%m%dT%H%M}"
    numbers = [int(m.group(1) or 0) for t in taken if (m := re.fullmatch(re.escape(name) + r"(?:_(\d{1,9}))?", t))]
    return f"{name}_{max(numbers) + 1}" if numbers else name


@dataclasses.dataclass(frozen=True)
class Standing:
    """Where a subvolume stands on a target, for ``backup status``."""

    last: str | None  # the newest snapshot of the subvolume the target holds (None: none)
    time: datetime.datetime | None  # when that one was taken
    age: datetime.timedelta | None
    chain: int  # incrementals on its full stream
    next: list[Send]
    stale: bool  # older than warn_after, or none held


def standing(
    local: Sequence[Local],
    held: Sequence[Held],
    now: datetime.datetime,
    policy: Policy,
    full_every: Rotation | None,
    warn_after: datetime.timedelta | None,
    base_name: str,
) -> Standing:
    """What ``backup status`` says of one subvolume (snapshots named ``base_name.*``) on one target."""
    mine = [h for h in held if h.snapshot and (said := snapshot_time(h.snapshot, policy)) and said[0] == base_name]
    mine += [h for h in held if h not in mine and common(local, [h]) is not None]
    dated = [(t, h) for h in mine if (t := h.time(policy)) is not None]
    last = max(dated, key=lambda x: (x[0], order(x[1].snapshot or ""))) if dated else None
    length = max(len(chain(held, last[1].uuid)) - 1, 0) if last else 0
    age_now = now - last[0] if last else None
    stale = last is None or (warn_after is not None and age_now is not None and age_now > warn_after)
    return Standing(
        last[1].snapshot if last else None,
        last[0] if last else None,
        age_now,
        length,
        sends(local, held, now, policy, full_every),
        stale,
    )
