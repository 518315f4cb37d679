"""One interface for the places streams are kept in, whatever their kind.

A :class:`Store` answers what it holds (the snapshots a backup script picks
the parent of its next incremental from: ``send --list``) and takes a new
stream from a session. A bucket does more, for the commands that reach it
themselves (``send --to``, ``verify``, ``restore``): it archives a stream
read from a file, checks every stream it holds in place, and hands on the
chain that makes a snapshot; a kind that cannot do one of these says so
(:class:`Unsupported`). Its kinds: a file place (streams and their
manifests in a directory, :mod:`.files`), a ``btrfs receive`` place
(:mod:`.received`) and a bucket (the archive, :mod:`.bucket`).

Each snapshot held is one dict: ``name`` (in the place; see :func:`named`
for a name that is not UTF-8), ``snapshot`` (the snapshot's own name, as
its stream's first command says it: a received place's name, a stored
stream's from its manifest; None where that is not known), ``uuid`` and
``ctransid`` (of the sender's subvolume), ``parent_uuid`` and
``parent_ctransid`` (None for a full stream, or where the parent is gone),
``arrived`` (when it was stored or received, ISO 8601 UTC; None where the
place does not know), and for a stored stream its ``size`` and when it was
``stored``.
"""

from __future__ import annotations

import abc
import base64
import contextlib
import dataclasses
import datetime
import os
import uuid
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ..errors import UsageError, shown
from ..retention import Policy, kept_by_name
from ..session.receiver import SessionReceiver
from ..transfer.ledger import Checkpoint
from ..transfer.stored import stream_name

if TYPE_CHECKING:
    from ..archive.catalog import Entry
    from ..archive.reading import Verdict
    from ..archive.upload import Archived
    from ..io.framed import StreamSource
    from ..transfer.identity import Identity

MAX_HELD = 100_000  # snapshots listed at most (the answer's lines are bounded too)

Snapshot = dict[str, Any]  # one line of the list's answer: flat JSON


@dataclasses.dataclass(frozen=True)
class Taken:
    """A stream a store took: its name there (a ``btrfs receive`` place: the subvolumes made), its size,
    the snapshots it made, and whether it held these same bytes under that name already."""

    name: str
    size: int
    snapshots: tuple[str, ...]
    already: bool = False


@dataclasses.dataclass(frozen=True)
class Sender:
    """Who sends a stream to a store, and what its transfer brings: the client (its identity, and the key its
    journal is signed with), its peer address, the checkpoint a resumed stream continues from, ``charge``
    (told the size of every write first: a quota), ``claim`` (told each subvolume made, its UUID first) and
    ``say`` (told what ``btrfs receive`` says, line by line)."""

    identity: str
    key: bytes
    peer: str
    checkpoint: Checkpoint | None = None
    charge: Callable[[int], object] | None = None
    claim: Callable[[uuid.UUID, str], object] = lambda subvolume, name: None
    say: Callable[[str], object] = lambda line: None


@dataclasses.dataclass(frozen=True)
class Retained:
    """What a store kept and what it deleted (or, on a dry run, would delete), by name."""

    kept: tuple[str, ...]
    dropped: tuple[str, ...]


def retained(names: list[str], policy: Policy, now: datetime.datetime) -> tuple[list[str], list[str]]:
    """Of snapshots by ``names`` (``NAME.YYYYMMDDTHHMM``, as btrbk names them), those ``policy`` keeps at
    ``now``, subvolume by subvolume, with the newest of each whatever the minimum (the base of the next
    incremental), and the rest; one whose name says no time is kept (it cannot be placed)."""
    keep = kept_by_name(((name, name) for name in names), now, policy, newest=True)
    return sorted(keep), sorted(set(names) - keep)


class Unsupported(UsageError):
    """What a store of its kind cannot do."""


class Store(abc.ABC):
    """A place streams are kept in: :meth:`held` says what it holds, :meth:`take` takes a new stream."""

    kind = "place"  # what a store of its kind is called in what it says
    journaled = True  # whether a session's stream is journaled in the place (resumable); a bucket keeps none
    taken = "stored"  # what a stream taken is called in the service's log
    named_as = "stream"  # and the field that names it

    def __init__(self, place: str) -> None:
        self.place = place

    def held(self) -> list[Snapshot]:
        """The snapshots in the place, by name (at most :data:`MAX_HELD`)."""
        return sorted(self._snapshots(), key=lambda s: str(s["name"]))[:MAX_HELD]

    @abc.abstractmethod
    def _snapshots(self) -> list[Snapshot]:
        """The snapshots in the place, in any order."""

    @abc.abstractmethod
    def take(self, session: SessionReceiver, sender: Sender) -> Taken:
        """Check the stream of ``session`` and keep it; on any failure nothing is kept under its name."""

    def hold(
        self, identity: Identity, lost: Callable[[str], object], alive: Callable[[], int]
    ) -> contextlib.AbstractContextManager[None]:
        """Hold the stream of ``identity`` for one transfer against other services that share the place (a
        bucket's claim, held while ``alive()`` grows; ``lost`` hears why it was let go); a place of this
        machine's: nothing (the service's own claims keep its transfers apart)."""
        return contextlib.nullcontext()

    def resumed(self, identity: Identity, key: bytes, discard: Callable[[str], object]) -> Checkpoint | None:
        """Where an earlier transfer of the stream of ``identity`` into a place without a journal stands
        (a bucket's upload state, signed with ``key``; ``discard`` hears why one is not taken); None: from
        the start."""
        return None

    def unfollowed(self) -> None:
        """The sender could not follow the answer :meth:`resumed`'s checkpoint gave, which had no ledger
        (a bucket's upload another service continued: the ledger of what it kept is not known there): a new
        sender cannot check its stream against it, so what was kept goes and the next transfer starts over
        (the one that could not follow sent nothing of it yet). A place of this machine's: nothing."""
        return None

    def journal(self, identity: Identity) -> str | None:
        """Where the stream of ``identity`` is journaled until it is whole (None: it is not)."""
        return os.path.join(self.place, incoming_name(identity)) if self.journaled else None

    def upload(
        self,
        source: StreamSource,
        *,
        key: bytes | None = None,
        encrypt_key: bytes | None = None,
        change_sealing: bool = False,
        retries: int = 0,
        retry_delay: float = 1.0,
        warn: Any = None,
        notice: Callable[[str], object] = lambda text: None,
        wrote: Callable[[int], object] | None = None,
    ) -> Archived:
        """Check and heal the stream read from ``source`` (a file or ``-``) and keep it, as ``send --to``
        does (``key``: resumable, its state signed with it; ``encrypt_key``: sealed with it)."""
        raise self._cannot("take a stream but from a session")

    def verify(
        self, workers: int | None = None, encrypt_key: bytes | None = None, scheduler: str | None = None
    ) -> Iterator[Verdict]:
        """Check every stream held in place, as ``verify`` does: a verdict for each."""
        raise self._cannot("check its streams in place")

    def chain(self, snapshot: str, encrypt_key: bytes | None = None) -> list[Entry]:
        """The streams that make ``snapshot``, full stream first, all a :meth:`restore` must know before
        anything is handed on."""
        raise self._cannot("hand on a chain of streams")

    def restore(
        self,
        chain: list[Entry],
        write: Callable[[Any], object],
        encrypt_key: bytes | None = None,
        *,
        consumer: str | None = None,
        wrote: Callable[[int], object] = lambda n: None,
    ) -> None:
        """Hand on the streams of ``chain`` (:meth:`chain`) in order to ``write``, each command checked."""
        raise self._cannot("hand on a chain of streams")

    def retain(self, policy: Policy, now: datetime.datetime, *, dry_run: bool = False) -> Retained:
        """Keep what ``policy`` keeps at ``now`` (by the time each snapshot's name says, subvolume by
        subvolume, with whatever a kept one needs, and the newest of each: the base of the next
        incremental), delete the rest (not with ``dry_run``)."""
        raise self._cannot("keep its snapshots by a policy")

    def _cannot(self, what: str) -> Unsupported:
        return Unsupported(f"{self.place!r}: a {self.kind} cannot {what}; a bucket (s3://BUCKET/PREFIX) can")


def incoming_name(identity: Identity) -> str:
    """The hidden name a session's stream is journaled under in its place, until it is whole."""
    return f".{stream_name(identity)}.incoming"


def when(seconds: float | None) -> str | None:
    """A time as the list says it: ISO 8601 in UTC, to the second."""
    if seconds is None:
        return None
    return datetime.datetime.fromtimestamp(int(seconds), datetime.UTC).isoformat(timespec="seconds")


def named(raw: bytes) -> dict[str, str]:
    """A snapshot's ``name``: the name when it is UTF-8, else escaped (``\\xe9``) with its bytes in
    ``name_base64`` beside (a flat field: the list's answers are flat JSON objects)."""
    try:
        return {"name": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"name": shown(raw), "name_base64": base64.b64encode(raw).decode("ascii")}
