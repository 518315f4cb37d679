"""A client's stream into its store place: checked, journaled (resumable), named only when whole, with its
manifest beside it; a name is stored once (the same bytes again are "already stored", others refused)."""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Callable
from typing import Any

from .. import errors as e
from ..archive.store import Location
from ..archive.upload import upload
from ..io.outputs import OutputDirectory, OutputFile
from ..net.journal import Journal
from ..net.progress import NONE, Progress
from ..net.receiving import receive_resumable
from ..net.session.protocol import PREFIX_SIZE
from ..net.session.receiver import SessionReceiver
from ..ops.identity import snapshot_name, stream_identity
from ..ops.ledger import Checkpoint, Ledger
from ..ops.stored import Unnamed, manifest, stream_name
from .config import Client
from .journals import Charge, incoming_name


def store(
    session: SessionReceiver,
    client: Client,
    peer: str,
    checkpoint: Checkpoint | None = None,
    charge: Charge | None = None,
) -> tuple[str, int, tuple[str, ...], bool]:
    """Check and write the stream of ``session`` into ``client``'s place; once stored, its file name, its
    size, the name of its snapshot, and whether these same bytes were stored under that name already.

    A session's stream is journaled (:class:`~sendstream.net.journal.Journal`: durable checkpoints, a
    resume state signed with the client's key), so that the same stream sent again continues from
    ``checkpoint``, the last one of an earlier run; a raw stream goes to a hidden temporary file. Write
    errors name the stream (a raw one: its place, until its first command names it); on any failure
    nothing is left under the stream's name (:func:`_named`). What is written is counted by ``charge``
    first (against the client's quota).
    """
    progress = Progress("received", mode=NONE)
    ledger = Ledger(checkpoint)
    taken = _Taken(client.place, charge)  # the whole stream, as written (a resumed one: its kept part first)

    with OutputDirectory(os.path.join(client.place, "incoming.stream")) as place:
        if session.raw:
            hidden, fd = place.create_temporary(0o600)
            try:
                with OutputFile(fd, taken.shown) as out:
                    receive_resumable(session, taken.through(_naming(out)), progress, ledger=ledger)
                    out.fsync()
                    taken.shown = out.path
            except BaseException:
                place.unlink(hidden)
                raise
        else:
            assert session.identity is not None
            hidden = incoming_name(session.identity)
            taken.shown = os.path.join(client.place, stream_name(session.identity))
            journal = Journal(os.path.join(client.place, hidden), client.key, checkpoint, shown=taken.shown)
            try:
                if checkpoint is not None:
                    kept_part, buf = journal.prefix(), bytearray(1 << 20)
                    while n := kept_part.readinto(buf):
                        taken.add(memoryview(buf)[:n])
                receive_resumable(session, taken.through(journal.write), progress, journal, ledger)
                journal.finish()
            except BaseException:
                journal.stop(session.written, session.identity, ledger)  # it stays, for the next run
                raise
        try:
            return _named(place, hidden, client, peer, ledger, taken)
        finally:
            place.unlink(hidden)  # named by now, or not to be


class _Taken:
    """The bytes of a stream :func:`store` wrote: counted and hashed as they are written; ``shown`` is
    the stream's path as errors name it (its place, until its name is known)."""

    def __init__(self, shown: str, charge: Charge | None = None) -> None:
        self.digest = hashlib.sha256()
        self.size = 0
        self.shown = shown
        self._charge = charge

    def add(self, data: Any) -> None:
        self.digest.update(data)
        self.size += len(data)

    def through(self, write: Callable[[Any], object]) -> Callable[[Any], None]:
        """``write`` (what it will write charged first), then :meth:`add` what it wrote."""

        def written(data: Any) -> None:
            if self._charge is not None:
                self._charge(len(data))
            write(data)
            self.add(data)

        return written


def _naming(out: OutputFile) -> Callable[[Any], None]:
    """``out.write`` for a raw stream; ``out.path`` (a directory) becomes the stream's name in it as soon
    as the stream's first command, which says it, is in."""
    place, head = out.path, bytearray()

    def write(data: Any) -> None:
        if out.path == place and len(head) < PREFIX_SIZE:
            head.extend(memoryview(data)[: PREFIX_SIZE - len(head)])
            with contextlib.suppress(Unnamed):
                out.path = os.path.join(place, stream_name(stream_identity(bytes(head))))
        out.write(data)

    return write


def _named(
    place: OutputDirectory, hidden: str, client: Client, peer: str, ledger: Ledger, taken: _Taken
) -> tuple[str, int, tuple[str, ...], bool]:
    """Give the whole stream in ``hidden`` (``taken`` as it was written) its name, with its manifest beside
    it (durable before the sender hears success); its name, size, snapshot, and whether these same bytes
    were stored under that name already. A file that is not all the bytes taken is never named, and
    neither is a stream whose name holds other bytes: it is refused, as ``send --to s3://`` refuses."""
    fd = place.open_ours(hidden, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        if size != taken.size:
            raise e.OutputError(taken.shown, f"it holds {size} bytes of the {taken.size} received: not stored")
        prefix = os.pread(fd, PREFIX_SIZE, 0)  # the prefix says what it is
        identity = stream_identity(prefix)
        name = stream_name(identity)
        shown = os.path.join(client.place, name)
        sha256 = taken.digest.hexdigest()
        record = manifest(
            identity, size=size, sha256=sha256, commands=ledger.commands, ledger=ledger.digest(),
            client=client.identity, peer=peer,
        )  # fmt: skip
        with place.locked():  # another transfer of this name waits until ours is named (or refused)
            already = place.lstat(name) is not None
            if already:
                _refuse_other(place, name, size, sha256, shown)
            if not already or place.lstat(name + ".json") is None:  # (none: cut between the two renames)
                note = _note(place, record, shown + ".json")
                try:
                    if not already:
                        place.replace(hidden, name, fd)
                    place.replace(note, name + ".json")
                except BaseException:
                    place.unlink(note)
                    if not already:
                        place.unlink(name)
                    raise
                place.sync()
    finally:
        os.close(fd)
    snapshot = snapshot_name(prefix)
    return name, size, (snapshot,) if snapshot else (), already


def _refuse_other(place: OutputDirectory, name: str, size: int, sha256: str, shown: str) -> None:
    """Refuse unless the stream stored as ``name`` is ``size`` bytes with the digest ``sha256``."""
    with os.fdopen(place.open_ours(name, os.O_RDONLY), "rb") as f:
        same = os.fstat(f.fileno()).st_size == size and hashlib.file_digest(f, "sha256").hexdigest() == sha256
    if not same:
        raise e.UsageError(f"{shown}: a stream of this name is stored already, with other bytes: not replaced")


def _note(place: OutputDirectory, record: bytes, shown: str) -> str:
    """A new hidden file in ``place`` that holds ``record``, durable (its errors name ``shown``): its name."""
    note, fd = place.create_temporary(0o600)
    try:
        with OutputFile(fd, shown) as f:
            f.write(record)
            f.fsync()
    except BaseException:
        place.unlink(note)
        raise
    return note


def archive_into(session: SessionReceiver, client: Client, peer: str, s3: Any) -> tuple[str, int, tuple[str, ...]]:
    """Check the stream of ``session`` and archive it in ``client``'s bucket through ``s3`` (as ``send --to
    s3://``); its name, size and snapshot."""
    done = upload(
        session,  # type: ignore[arg-type]
        Location.parse(client.place), s3, wrote=session.wrote, client=client.identity, peer=peer,
    )  # fmt: skip
    session.commit()
    return done.url.rsplit("/", 1)[1], done.size, (done.snapshot,) if done.snapshot else ()
