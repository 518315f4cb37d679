"""A ``btrfs receive`` place: each stream received into subvolumes, confined (:mod:`.confine`), journaled
(resumable), the subvolumes a failed run began deleted."""

from __future__ import annotations

import contextlib
import datetime
import os
import shlex
import subprocess
import uuid
from collections.abc import Callable
from types import TracebackType
from typing import BinaryIO, Self

from .. import errors as e
from ..codec.framer import Framer
from ..endpoints.receiving import receive_into
from ..io.windows import file_events
from ..ops.repair import Healer
from ..retention import Policy
from ..session.receiver import SessionReceiver
from ..transfer.journal import PART_SUFFIX, Journal
from ..transfer.ledger import Ledger
from ..transfer.progress import NONE, Progress
from ..transfer.sinks import ChildSink, Data, Sink
from .confine import UuidGuard, leftover, placed
from .store import MAX_HELD, Retained, Sender, Snapshot, Store, Taken, incoming_name, named, retained, when


class ReceivePlace(Store):
    """The directory ``place`` that ``btrfs receive`` writes each stream into as its subvolumes."""

    kind = "btrfs receive place"
    taken = "received"
    named_as = "subvolumes"

    def take(self, session: SessionReceiver, sender: Sender) -> Taken:
        """Check the stream of ``session`` and give it to ``btrfs receive`` in the place, its paths and UUIDs
        confined (:class:`~sendstream.stores.confine.UuidGuard`); the subvolumes made (each told to
        ``sender.claim`` first), and the size. What ``btrfs receive`` writes goes to ``sender.say``.

        A session's stream is journaled as a file place journals it, so that the same stream sent again
        continues from ``sender.checkpoint``: ``btrfs receive`` cannot continue what an earlier run began,
        so the subvolumes that run left are deleted and the kept part is given to a new ``btrfs receive``
        again before the session's bytes. On any failure the subvolumes this run began are deleted; the
        journal stays. What is written is counted by ``sender.charge`` first (against the client's quota).
        """
        with _Receiving(self.place, session, sender) as out:
            summary = receive_into(session, out, Progress("received", mode=NONE))
        return Taken(", ".join(out.made), summary.bytes + summary.skipped, tuple(out.made))

    def receive(self, source: BinaryIO, say: Callable[[str], object] = lambda line: None) -> Taken:
        """Check and heal the stream read from ``source`` (a host's own ``btrfs send``) and give it to ``btrfs
        receive`` in the place, its paths and UUIDs confined as a session's are; what ``btrfs receive``
        says goes to ``say``. A subvolume that an earlier, cut run of this stream left unfinished (its mark,
        ``.NAME.receiving``, says so) is deleted first; anything else under that name is refused, and left;
        on any failure the subvolumes this run began are deleted."""
        made: list[str] = []

        def claimed(subvolume: uuid.UUID, name: str) -> None:
            path, mark = os.path.join(self.place, name), os.path.join(self.place, f".{name}.receiving")
            if leftover(path, subvolume) and _marked(mark, subvolume):  # a cut run of ours began it
                _delete_subvolume(path)
            if os.path.lexists(path):  # not ours to replace, nor to delete when this fails
                raise e.OutputError(self.place, f"{name!r} is there already, and is not this stream's: left as it is")
            with open(mark, "w") as f:  # (so that a cut run's leftover is known as ours, and only that)
                f.write(f"{subvolume}\n")
            made.append(name)

        guard = UuidGuard(self.place, claimed)
        child = ChildSink(shlex.join(["btrfs", "receive", "--chroot", self.place]), stderr=say, stdout_too=True)

        def write(data: Data) -> None:
            guard(data)
            child.write(data)

        healer = Healer(write)
        try:
            with child, guard:
                for event in file_events(source, Framer(), healer.batch):
                    healer.event(event)
        except BaseException:
            for name in made:
                _delete_subvolume(os.path.join(self.place, name))
            _unmark(self.place, made)
            raise
        _unmark(self.place, made)
        return Taken(", ".join(made), healer.written, tuple(made))

    def _snapshots(self) -> list[Snapshot]:
        mine, _ = placed(self.place)
        received = {name: s for name, s in mine.items() if s.received_uuid is not None}
        by_uuid = {s.uuid: s for s in received.values()}
        out = []
        for name, s in list(received.items())[:MAX_HELD]:
            parent = by_uuid.get(s.parent_uuid)
            shown = named(os.fsencode(name))
            out.append(
                {
                    **shown,
                    "snapshot": shown["name"],
                    "uuid": str(s.received_uuid),
                    "ctransid": s.send_transid,
                    "parent_uuid": str(parent.received_uuid) if parent else None,
                    "parent_ctransid": parent.send_transid if parent else None,
                    "arrived": when(s.received_at),
                }
            )
        return out

    def retain(self, policy: Policy, now: datetime.datetime, *, dry_run: bool = False) -> Retained:
        """Keep what ``policy`` keeps of the received subvolumes, by the time each one's name says; delete
        the others (``btrfs subvolume delete``). A received subvolume needs none of the others (btrfs shares
        their extents, it does not chain them), so only the policy keeps; its name is its snapshot's."""
        mine, _ = placed(self.place)
        kept, dropped = retained([name for name, s in mine.items() if s.received_uuid is not None], policy, now)
        if not dry_run:
            for name in dropped:
                _delete_subvolume(os.path.join(self.place, name))
            if left := [name for name in dropped if os.path.lexists(os.path.join(self.place, name))]:
                raise e.OutputError(self.place, f"btrfs subvolume delete left {', '.join(map(repr, left))}")
        return Retained(tuple(kept), tuple(dropped))


class _Receiving(Sink):
    """The stream of ``session`` into ``btrfs receive`` in ``place`` (:meth:`ReceivePlace.take`), each command
    through the :class:`~sendstream.stores.confine.UuidGuard` first; the subvolumes a failure leaves deleted."""

    def __init__(self, place: str, session: SessionReceiver, sender: Sender) -> None:
        self._place, self._session, self._sender = place, session, sender
        self.made: list[str] = []
        self._again = False  # an earlier run of this stream was cut
        self._guard = UuidGuard(place, self._claimed)
        self._child = ChildSink(shlex.join(["btrfs", "receive", "--chroot", place]), stderr=sender.say, stdout_too=True)
        self._running = contextlib.ExitStack()  # the child and the guard, once entered
        self.replay = self._replay  # a resumed journal's kept part: btrfs receive must see it again

    def __enter__(self) -> Self:
        session = self._session
        if not session.raw:
            assert session.identity is not None
            path = os.path.join(self._place, incoming_name(session.identity))
            self._again = os.path.lexists(path + PART_SUFFIX)
            checkpoint = self._sender.checkpoint
            self.journal, self.ledger = Journal(path, self._sender.key, checkpoint), Ledger(checkpoint)
        try:
            with contextlib.ExitStack() as entering:
                entering.enter_context(self._child)
                entering.enter_context(self._guard)
                self._running = entering.pop_all()
        except BaseException:
            self._failed()
            raise
        return self

    def _claimed(self, subvolume: uuid.UUID, name: str) -> None:
        path = os.path.join(self._place, name)
        # what an earlier run began from the kept part (or, cut before its first checkpoint, its first)
        journal = self.journal
        earlier = journal is not None and (self._guard.offset < journal.offset or (self._again and not self.made))
        if earlier and leftover(path, subvolume):
            _delete_subvolume(path)
        self._sender.claim(subvolume, name)
        self.made.append(name)

    def _replay(self, data: Data) -> None:
        self._guard(data)
        self._child.write(data)

    def write(self, data: Data) -> None:
        if self._sender.charge is not None:
            self._sender.charge(len(data))
        self._replay(data)
        if self.journal is not None:
            self.journal.write(data)

    def flush(self) -> None:
        self._child.flush()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        try:
            self._running.__exit__(kind, exc, tb)
        except BaseException:
            self._failed()
            raise
        if kind is not None:
            self._failed()
        elif self.journal is not None:
            self.journal.discard()

    def _failed(self) -> None:
        """The journal stays (where the stream stopped), and the subvolumes this run began go."""
        if self.journal is not None and self.ledger is not None:
            self.journal.stop(self._session.written, self._session.identity, self.ledger)
        for name in self.made:
            _delete_subvolume(os.path.join(self._place, name))


def _marked(mark: str, subvolume: uuid.UUID) -> bool:
    """Whether ``mark`` says a receive of ``subvolume`` of ours began (and was cut)."""
    try:
        with open(mark, "rb") as f:
            return f.read(64).strip() == str(subvolume).encode()
    except OSError:
        return False


def _unmark(place: str, names: list[str]) -> None:
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(place, f".{name}.receiving"))


def _delete_subvolume(path: str) -> None:
    """Delete the subvolume at ``path`` (nothing when there is none): one a failed transfer began, or one
    a policy lets go."""
    with contextlib.suppress(OSError):
        if os.lstat(path).st_ino == 256:
            subprocess.run(["btrfs", "-q", "subvolume", "delete", path], capture_output=True, check=False)
