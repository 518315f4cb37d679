"""A file place: each stream a file named by what it is, checked, journaled (resumable), named only when whole,
with its manifest beside it; a name is stored once (the same bytes again are "already stored", others refused)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable
from types import TracebackType
from typing import Any, Self

from .. import errors as e
from ..archive.store import Directory, DirectoryClient
from ..endpoints.receiving import receive_into
from ..io.outputs import OutputDirectory, OutputFile
from ..session.protocol import PREFIX_SIZE
from ..session.receiver import SessionReceiver
from ..transfer.identity import snapshot_name, stream_identity
from ..transfer.journal import Journal
from ..transfer.ledger import Ledger
from ..transfer.progress import NONE, Progress
from ..transfer.sinks import Data, Sink
from ..transfer.stored import Unnamed, manifest, stream_name
from .catalogued import Catalogued
from .store import MAX_HELD, Sender, Snapshot, Taken, incoming_name

MAX_MANIFEST = 64 << 10  # a manifest read for the list: more is not one of ours
_FIELDS = ("uuid", "ctransid", "parent_uuid", "parent_ctransid")


class FilePlace(Catalogued):
    """Streams and their manifests in the directory ``place`` (:mod:`sendstream.transfer.stored`); read,
    checked, restored from and pruned as an archive (:class:`~sendstream.stores.catalogued.Catalogued`)."""

    kind = "file place"

    def __init__(self, place: str) -> None:
        super().__init__(place)
        self.location = Directory(place)
        self._connect = DirectoryClient

    def take(self, session: SessionReceiver, sender: Sender) -> Taken:
        """Check and write the stream of ``session`` into the place, once stored under its name.

        A session's stream is journaled (:class:`~sendstream.transfer.journal.Journal`: durable checkpoints,
        a resume state signed with the sender's key), so that the same stream sent again continues from
        ``sender.checkpoint``, the last one of an earlier run; a raw stream goes to a hidden temporary file.
        Write errors name the stream (a raw one: its place, until its first command names it); on any
        failure nothing is left under the stream's name (:func:`_named`). What is written is counted by
        ``sender.charge`` first (against the client's quota).
        """
        with _Placing(self.place, session, sender) as out:
            receive_into(session, out, Progress("received", mode=NONE))
        assert out.taken is not None
        return out.taken

    def _snapshots(self) -> list[Snapshot]:
        out: list[Snapshot] = []
        with os.scandir(self.place) as entries:
            for entry in entries:
                if not entry.name.endswith(".stream.json") or entry.name.startswith(".") or len(out) >= MAX_HELD:
                    continue
                try:
                    with open(entry.path, "rb") as f:
                        note = json.loads(f.read(MAX_MANIFEST))
                    stream = note["stream"]
                    out.append(
                        {"name": entry.name[: -len(".json")], "snapshot": _text(note.get("snapshot")),
                         **{k: stream.get(k) for k in _FIELDS}, "size": note.get("size"),
                         "stored": note.get("stored"), "arrived": note.get("stored")}
                    )  # fmt: skip
                except (OSError, ValueError, KeyError, TypeError, AttributeError):
                    continue  # not one of ours, or being written: not held
        return out


def _text(value: Any) -> str | None:
    """A manifest's string (a snapshot's name), or None (an older manifest has none, or it was not said)."""
    return value if isinstance(value, str) and value else None


class _Placing(Sink):
    """The stream of ``session`` into the file place ``place`` (:meth:`FilePlace.take`): a session's journaled
    under its hidden name, a raw one written to a hidden temporary file; named (:func:`_named`) as it is
    left whole, else removed (a journal stays, for the next run)."""

    ledger: Ledger

    def __init__(self, place: str, session: SessionReceiver, sender: Sender) -> None:
        self._place, self._session, self._sender = place, session, sender
        self.ledger = Ledger(sender.checkpoint)
        self.taken: Taken | None = None
        self._written = _Written(place, sender.charge)  # the whole stream (a resumed one: its kept part first)
        self._file: OutputFile | None = None

    def __enter__(self) -> Self:
        self._directory = place = OutputDirectory(os.path.join(self._place, "incoming.stream"))
        session, sender, written = self._session, self._sender, self._written
        try:
            if session.raw:
                self._hidden, fd = place.create_temporary(0o600)
                self._file = OutputFile(fd, written.shown)
                self._write = written.through(_naming(self._file))
                return self
            assert session.identity is not None
            self._hidden = incoming_name(session.identity)
            written.shown = os.path.join(self._place, stream_name(session.identity))
            self.journal = journal = Journal(
                os.path.join(self._place, self._hidden), sender.key, sender.checkpoint, shown=written.shown
            )
        except BaseException:
            place.close()
            raise
        try:
            if sender.checkpoint is not None:
                kept_part, buf = journal.prefix(), bytearray(1 << 20)
                while n := kept_part.readinto(buf):
                    written.add(memoryview(buf)[:n])
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        self._write = written.through(journal.write)
        return self

    def write(self, data: Data) -> None:
        self._write(data)

    def flush(self) -> None:
        """Nothing to do: a journal's checkpoint flushes, and a raw stream is made durable when whole."""

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        with self._directory as place:
            try:
                if self._file is not None:
                    with self._file as out:
                        if kind is None:
                            out.fsync()
                            self._written.shown = out.path
                elif kind is None:
                    assert self.journal is not None
                    self.journal.finish()
            except BaseException:
                self._stop()
                raise
            if kind is not None:
                self._stop()
                return
            try:
                self.taken = _named(place, self._hidden, self._sender, self.ledger, self._written)
            finally:
                place.unlink(self._hidden)  # named by now, or not to be

    def _stop(self) -> None:
        """On a failure: a raw stream's file goes; a journal stays, for the next run."""
        if self.journal is None:
            self._directory.unlink(self._hidden)
        else:
            self.journal.stop(self._session.written, self._session.identity, self.ledger)


class _Written:
    """The bytes of a stream :meth:`FilePlace.take` wrote: counted and hashed as they are written; ``shown`` is
    the stream's path as errors name it (its place, until its name is known)."""

    def __init__(self, shown: str, charge: Callable[[int], object] | None = None) -> None:
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


def _named(place: OutputDirectory, hidden: str, sender: Sender, ledger: Ledger, taken: _Written) -> Taken:
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
        shown = os.path.join(os.path.dirname(place.path), name)
        sha256 = taken.digest.hexdigest()
        snapshot = snapshot_name(prefix)
        record = manifest(
            identity, size=size, sha256=sha256, commands=ledger.commands, ledger=ledger.digest(),
            client=sender.identity, peer=sender.peer, snapshot=snapshot,
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
    return Taken(name, size, (snapshot,) if snapshot else (), already)


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
