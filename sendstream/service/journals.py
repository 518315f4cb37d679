"""The journals of unfinished transfers in the clients' places: found, listed, expired, removed; and each
client's quota, which counts them with its stored streams.

A session's stream is journaled in its client's place as ``.NAME.incoming.part``, its signed checkpoint in
``.NAME.incoming.part.resume`` (:class:`~sendstream.transfer.journal.Journal`), NAME the stream's name. A sender
that never comes back leaves them: they go after ``journal_days`` (serve.toml) without a write, or when an
admin removes them (``sendstream serve --config F --remove-journal CLIENT/NAME``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import stat
import threading
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from .. import errors as e
from ..io.outputs import is_temporary
from ..transfer.journal import PART_SUFFIX, load_state, state_path
from ..transfer.ledger import Checkpoint
from .claims import Claims
from .config import Client

if TYPE_CHECKING:
    from ..transfer.identity import Identity

_JOURNAL = re.compile(r"\.(.+)\.incoming\.part(\.resume)?")


@dataclasses.dataclass(frozen=True)
class Unfinished:
    """A journal in a client's place: of which stream, how large, when last written."""

    client: str
    name: str  # the stream's name
    path: str  # the journal: its part is PATH.part, its checkpoint PATH.part.resume
    size: int  # bytes of the part and its checkpoint
    written: float  # the last write to either, in seconds since the epoch


def remove_temporaries(client: Client) -> int:
    """Remove the temporary files that a service killed mid-transfer left in ``client``'s place (a raw
    stream's, a manifest's, a checkpoint's: nothing resumes them); how many. Only while no transfer runs."""
    if client.archive:
        return 0
    removed = 0
    with os.scandir(client.place) as entries:
        for entry in entries:
            if is_temporary(entry.name) and entry.is_file(follow_symlinks=False):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
                    removed += 1
    return removed


def unfinished(client: Client) -> list[Unfinished]:
    """The journals in ``client``'s place (a bucket keeps none), oldest first."""
    if client.archive:
        return []
    found: dict[str, tuple[int, float]] = {}
    with os.scandir(client.place) as entries:
        for entry in entries:
            journal = _JOURNAL.fullmatch(entry.name)
            if journal is None or not entry.is_file(follow_symlinks=False):
                continue
            st = entry.stat(follow_symlinks=False)
            size, written = found.get(journal.group(1), (0, 0.0))
            found[journal.group(1)] = size + st.st_size, max(written, st.st_mtime)
    journals = [
        Unfinished(client.identity, name, os.path.join(client.place, f".{name}.incoming"), size, written)
        for name, (size, written) in found.items()
    ]
    return sorted(journals, key=lambda j: (j.written, j.name))


def expired(client: Client, max_age: float, now: float) -> list[Unfinished]:
    """The journals in ``client``'s place not written for more than ``max_age`` seconds at ``now``."""
    return [j for j in unfinished(client) if now - j.written > max_age]


def remove(journal: str) -> None:
    """Remove the journal at ``journal`` (its part and its checkpoint; either may be gone already)."""
    for name in (journal + PART_SUFFIX, state_path(journal)):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def named(client: Client, name: str) -> Unfinished:
    """The journal of stream ``name`` in ``client``'s place; a usage error naming both when there is none."""
    found = next((j for j in unfinished(client) if j.name == name), None)
    if found is None:
        raise e.UsageError(f"no journal of {name!r} in {client.identity}'s place ({client.place})")
    return found


def kept(
    journal: str, key: bytes, identity: Identity, discarded: Callable[[str], object] = lambda why: None
) -> Checkpoint | None:
    """The durable checkpoint of an earlier run of the transfer of stream ``identity`` to ``journal``; None
    when there is none. What another stream of that name left is removed, and so is a journal that cannot
    be resumed (its part gone, not a file, or shorter than its checkpoint), telling ``discarded`` why:
    every resumed send of that stream would fail on it for ever."""
    try:
        checkpoint = load_state(journal, key)
    except e.ResumeError:
        return None
    if checkpoint.stream != identity:
        remove(journal)
        return None
    try:
        part = os.lstat(journal + PART_SUFFIX)
    except FileNotFoundError:
        why = "its part is gone"
    else:
        if not stat.S_ISREG(part.st_mode):
            why = "its part is not a file"
        elif part.st_size < checkpoint.offset:
            why = f"its checkpoint at {checkpoint.offset} lies past the end of its part ({part.st_size} bytes)"
        else:
            return checkpoint
    remove(journal)
    discarded(why)
    return None


def usage(place: str, leaving_out: set[str]) -> int:
    """Bytes of the regular files directly in ``place`` (stored streams, manifests, journals), but those
    named in ``leaving_out``."""
    with os.scandir(place) as entries:
        return sum(
            entry.stat(follow_symlinks=False).st_size
            for entry in entries
            if entry.name not in leaving_out and entry.is_file(follow_symlinks=False)
        )


class Quota:
    """A client's place against its ``quota``: the regular files directly in it, counted when a transfer
    begins or ends (the running transfers' journals left out), and what its running transfers hold."""

    def __init__(self, client: Client) -> None:
        assert client.quota is not None
        self.client = client
        self.limit = client.quota
        self._lock = threading.Lock()
        self._held = 0
        self._running: set[Charge] = set()

    def begin(self, part: str | None, kept: int) -> Charge:
        """A transfer begins that writes the file ``part`` in the place (None: a name not known yet), ``kept``
        bytes of it from an earlier run; refused when the place holds its quota already."""
        charge = Charge(self, part, kept)
        with self._lock:
            self._running.add(charge)
            self._count()
            if self._total() >= self.limit:
                self._running.discard(charge)
                raise self._exceeded(f"its place holds {self._total()} bytes, its whole quota")
        return charge

    def add(self, charge: Charge, n: int) -> None:
        """``n`` more bytes that ``charge``'s transfer is to write; refused when they would pass the quota."""
        with self._lock:
            if self._total() + n > self.limit:
                charge.exceeded = True
                raise self._exceeded(f"the stream would pass its place's quota after {charge.written} bytes")
            charge.written += n

    def end(self, charge: Charge) -> None:
        """``charge``'s transfer ended: whatever it left is counted on disk from now on (once: a transfer
        ends its charge before its sender hears the end, and again on its way out)."""
        with self._lock:
            if charge not in self._running:
                return
            self._running.discard(charge)
            self._count()

    def _count(self) -> None:
        self._held = usage(self.client.place, {c.part for c in self._running if c.part is not None})

    def _total(self) -> int:
        return self._held + sum(c.kept + c.written for c in self._running)

    def _exceeded(self, what: str) -> e.LimitExceeded:
        name = self.client.identity
        return e.LimitExceeded(f"{name}: {what}", limit=self.limit, option=f"clients.{name}.quota in serve.toml")


@dataclasses.dataclass(eq=False)
class Charge:
    """What one running transfer writes into its client's place, counted against the :class:`Quota`."""

    quota: Quota
    part: str | None  # the file it writes, left out when the place is counted
    kept: int  # bytes of it an earlier run left
    written: int = 0
    exceeded: bool = False  # the quota cut it

    def __call__(self, n: int) -> None:
        self.quota.add(self, n)

    def end(self) -> None:
        self.quota.end(self)


def sweep_journals(
    clients: Iterable[Client], max_age: float, now: float, claims: Claims, log: Callable[..., object]
) -> None:
    """Remove the journals of ``clients`` not written for ``max_age`` seconds before ``now`` that no running
    transfer holds (``claims``); each removal, and a place that cannot be searched, is ``log``ged."""
    for client in clients:
        try:
            old = expired(client, max_age, now)
        except OSError as exc:
            log("failed", client=client.identity, reason=f"searching {client.place} for journals: {exc}")
            continue
        for journal in old:
            held = claims.holding(client)
            try:
                held.path(journal.path)
            except e.SessionError:
                continue  # its sender came back meanwhile
            try:
                remove(journal.path)
            finally:
                held.release()
            days = round((now - journal.written) / 86400, 1)
            log("expired", client=client.identity, journal=journal.name, bytes=journal.size, days=days)
