"""Archived streams read in place: ranged GETs, every command checked, each stream held to its manifest.

:func:`check` reads one stream (its objects in order) with ranged GETs of
:data:`CHUNK` bytes (a sealed segment at a time, when sealed: as much),
:data:`AHEAD` fetched while the one before is checked, so that a reader
holds at most ``2 * AHEAD + 1`` of them whatever the stream's size or the
store's answers (a length other than the range asked for is refused before
it is read). Every command is checked (framing, CRC) before it is handed
on, and the first one must make the snapshot that the manifest and the
stream's name say; at the end the size, command count and ledger must be
the manifest's, and (for :func:`verify`) the SHA-256. :func:`resolve` finds
the chain that makes a snapshot and checks its keys, before anything goes
on; :func:`restore` hands it on, full stream first, each stream's END held
back (:class:`EndHeld`) until the stream is its manifest's; :func:`verify`
checks every stream of an archive, in chain order, many at once in a
process pool.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .. import errors as e
from ..codec.events import Event, StreamHeader
from ..codec.framer import Framer
from ..format.command import Command
from ..format.layout import COMMAND_HEADER_SIZE, STREAM_MAGIC
from ..io.windows import file_events
from ..ops.repair import Healer
from ..transfer.identity import describe, made_by, printable, snapshot_name
from ..transfer.ledger import Ledger
from ..transfer.stored import Unnamed, stream_name
from .catalog import MANIFEST_SUFFIX, Entry, chain_to, chains, entries
from .hashing import Hasher
from .seal import SEAL_OVERHEAD, SEALED_SEGMENT, Sealer, segment_count
from .store import BucketClient, Location, calling

CHUNK = 8 << 20
AHEAD = 3  # ranged GETs at once: one GET at a time is slower than the checks
BEGUN = 8 << 10  # what EndHeld keeps of a stream's start: its header and first command (a path is < 4 KiB)


class RangedReader:
    """The objects of one stream, in order, as one reader (``readinto``), by ranged GETs.

    :data:`AHEAD` ranges are fetched at once while the caller checks the one before; with ``digest``
    each range is hashed, in order, in a thread of its own. At most ``2 * AHEAD + 1`` chunks are held.
    """

    def __init__(
        self, s3: BucketClient, location: Location, entry: Entry, *, digest: Any = None, sealer: Sealer | None = None
    ) -> None:
        self._s3 = s3
        self._location = location
        self._entry = entry
        self._sealer = sealer
        self._ranges = iter(_ranges(entry))
        self._pool = ThreadPoolExecutor(AHEAD, thread_name_prefix="sendstream-get")
        self._ahead: deque[Future[bytes]] = deque()
        self._hasher = Hasher(digest, AHEAD) if digest is not None else None
        self._current = memoryview(b"")
        for _ in range(AHEAD):
            self._fetch()

    def _fetch(self) -> None:
        if (span := next(self._ranges, None)) is not None:
            self._ahead.append(self._pool.submit(self._get, *span))

    def _get(self, name: str, start: int, end: int, index: int, number: int, offset: int) -> bytes:
        url = self._location.url(name)
        with calling(url):
            answer = self._s3.get_object(
                Bucket=self._location.bucket, Key=self._location.key(name), Range=f"bytes={start}-{end - 1}"
            )
            try:  # the length is checked before anything is read: a store may ignore the range
                length = answer.get("ContentLength")
                data: bytes = answer["Body"].read(end - start) if length == end - start else b""
            finally:
                answer["Body"].close()
        if len(data) != end - start:
            raise e.StoreError(
                url,
                f"bytes {start}-{end - 1} came back as {len(data) if data else length} bytes: "
                "the object is shorter than its manifest says, or the store ignores ranges",
            )
        if self._sealer is not None:
            data = self._sealer.open(data, self._entry.name, index, number, offset)
        return data

    def readinto(self, view: Any) -> int:
        if not self._current:
            if not self._ahead:
                return 0
            data = self._ahead.popleft().result()
            self._fetch()
            if self._hasher is not None:
                self._hasher.update(data)
            self._current = memoryview(data)
        n = min(len(view), len(self._current))
        view[:n] = self._current[:n]
        self._current = self._current[n:]
        return n

    def close(self) -> None:
        """Stop fetching; every range read so far is hashed when this returns."""
        self._pool.shutdown(cancel_futures=True)
        if self._hasher is not None:
            self._hasher.close()


def _ranges(entry: Entry) -> Iterator[tuple[str, int, int, int, int, int]]:
    """What to GET, in order: object, start, end, the part's number, the segment's number in it and its
    stream offset (sealed: a segment at a time; else :data:`CHUNK` bytes at a time)."""
    index = offset = 0
    for k, (name, size) in enumerate(entry.objects):
        if entry.sealed:
            start = 0
            for part in entry.parts[k]:
                index += 1
                for number in range(segment_count(part)):
                    end = start + min(SEALED_SEGMENT, part - number * SEALED_SEGMENT)
                    yield name, start, end, index, number, offset
                    start, offset = end, offset + end - start - SEAL_OVERHEAD
        else:
            for start in range(0, size, CHUNK):
                yield name, start, min(start + CHUNK, size), 0, 0, offset
                offset += min(CHUNK, size - start)


def opener(entry: Entry, location: Location, key: Sealer | None) -> Sealer | None:
    """The sealer that opens ``entry``'s parts: ``key``'s, when it is the one they were sealed with. With a
    key, a stream that is not sealed is refused: anyone who can write to the bucket can put one there."""
    if not entry.sealed:
        if key is not None:
            raise e.UsageError(
                f"{location.url(entry.name)} is not encrypted, but --encrypt-key was given: refused "
                "(anyone who can write to the bucket can put a plain stream there)"
            )
        return None
    if key is None:
        raise e.UsageError(f"{location.url(entry.name)} is encrypted ({entry.sealed}): give --encrypt-key FILE")
    if key.fingerprint != entry.sealed:
        raise e.UsageError(
            f"{location.url(entry.name)} is sealed with key {entry.sealed}, not with --encrypt-key's {key.fingerprint}"
        )
    return key


@dataclass(frozen=True)
class Measured:
    """What a stream read from the store is: its size, restarts healed, commands, ledger and SHA-256 (""
    when not hashed)."""

    size: int
    restarts: int
    commands: int
    ledger: str
    sha256: str


def measure(
    s3: BucketClient,
    location: Location,
    entry: Entry,
    write: Callable[[Any], object] = lambda data: None,
    key: Sealer | None = None,
    sha256: bool = True,
) -> Measured:
    """Read the objects of ``entry`` in place (opening its parts with ``key`` when sealed), check every
    command before ``write`` gets it and the first one against ``entry``'s name; what the stream is."""
    digest, ledger = hashlib.sha256() if sha256 else None, Ledger()
    reader = RangedReader(s3, location, entry, digest=digest, sealer=opener(entry, location, key))
    header: StreamHeader | None = None  # held until the first command says the stream is the one named
    try:
        healer = Healer(write, ledger=ledger)
        for event in file_events(reader, Framer(), healer.batch, firsts=True):  # type: ignore[arg-type]
            if header is None and isinstance(event, StreamHeader):
                header = event
                continue
            if healer.written == 0:  # (the header is not written yet) the stream's first command
                _makes(entry, event)
                assert header is not None  # the framer starts with it, or raises
                healer.event(header)
            healer.event(event)
    finally:
        reader.close()
    hexdigest = digest.hexdigest() if digest is not None else ""
    return Measured(healer.written, healer.restart_count, ledger.commands, ledger.digest(), hexdigest)


def check(
    s3: BucketClient,
    location: Location,
    entry: Entry,
    write: Callable[[Any], object] = lambda data: None,
    key: Sealer | None = None,
    sha256: bool = True,
) -> None:
    """Read the stream of ``entry`` in place (:func:`measure`: every command checked before ``write`` gets
    it); then hold it to its manifest (:class:`~sendstream.errors.ManifestMismatch` when it differs), its
    SHA-256 too with ``sha256``.

    Without the SHA-256 the stream is still the manifest's to the bit, short of a CRC collision: every
    byte after the header is in a command whose CRC-32C was checked, and the ledger digests every
    command's length and CRC in order."""
    found = measure(s3, location, entry, write, key, sha256)
    for what, expected, actual in (
        ("restarts", 0, found.restarts),
        ("size", entry.size, found.size),
        ("commands", entry.commands, found.commands),
        ("ledger", entry.ledger, found.ledger),
        *([("SHA-256", entry.sha256, found.sha256)] if sha256 else []),
    ):
        if expected != actual:
            raise e.ManifestMismatch(  # (what the manifest says, escaped: it may hold anything)
                f"its {what} is not its manifest's",
                offset=found.size,
                expected=printable(str(expected)),
                actual=actual,
            )


def _makes(entry: Entry, first: Event) -> None:
    """Refuse a stream whose ``first`` command makes another snapshot than its manifest and name say."""
    if not isinstance(first, Command):
        raise e.ManifestMismatch("it has no command to say what it makes", offset=first.offset, expected=entry.name)
    made = made_by(first)
    try:
        same = stream_name(made) == entry.name
    except Unnamed:
        same = False
    if not same:
        raise e.ManifestMismatch(
            f"its first command is a {describe(made)}, not the snapshot its name and manifest say",
            offset=first.offset,
            expected=entry.name,
        )


def archived(s3: BucketClient, location: Location, problems: list[e.BadManifest] | None = None) -> list[Entry]:
    """Every stream archived directly under ``location`` (manifests that cannot be taken go to ``problems``);
    none, and no problem either, is :class:`~sendstream.errors.NothingFound` (a prefix with a typo must not
    pass, under cron, as an archive that checks clean)."""
    found = entries(s3, location, problems)
    if not found and not problems:
        raise e.NothingFound(
            f"{location.url()}: nothing is archived here (no NAME{MANIFEST_SUFFIX} directly under this prefix)"
        )
    return found


def resolve(s3: BucketClient, location: Location, snapshot: str, key: Sealer | None = None) -> list[Entry]:
    """The streams that make ``snapshot`` (a snapshot's name or UUID, as ``archive ls`` shows them, or
    ``UUID.CTRANSID``), full stream first, each one's key checked: all a restore must know before it
    starts a consumer and hands anything on."""
    found = archived(s3, location)
    chain = chain_to(found, _identified(found, snapshot, location), location)
    for entry in chain:
        opener(entry, location, key)
    return chain


def _identified(found: list[Entry], snapshot: str, location: Location) -> str:
    """``snapshot`` as ``UUID.CTRANSID``: of a UUID (with or without its ctransid: the newest), else of
    the one stream that makes the snapshot of that name (two of that name are a usage error)."""
    uuid, _, ctransid = snapshot.partition(".")
    matches = [x for x in found if x.uuid == uuid and ctransid in ("", str(x.ctransid))]
    if not matches:
        matches = [x for x in found if x.snapshot == snapshot]
        if len(matches) > 1:
            named = ", ".join(f"{x.uuid}.{x.ctransid} (stored {x.stored})" for x in sorted(matches, key=_age))
            raise e.UsageError(
                f"{location.url()}: {len(matches)} archived snapshots are called {snapshot!r}: {named}; "
                "give one's UUID.CTRANSID"
            )
    if not matches:
        raise e.NothingFound(
            f"{location.url()}: no archived stream makes snapshot {snapshot!r} (a name, UUID or UUID.CTRANSID "
            f"as `sendstream archive ls {location.url()}` shows them)"
        )
    newest = max(matches, key=lambda x: x.ctransid)
    return f"{newest.uuid}.{newest.ctransid}"


def _age(entry: Entry) -> tuple[str, int]:
    return entry.stored, entry.ctransid


class EndHeld:
    """The writer of one stream that hands on all of it but its last :data:`COMMAND_HEADER_SIZE` bytes, its
    END command (which has no attributes), until :meth:`release`.

    ``btrfs receive`` finalizes a snapshot (read-only, received) at END, so no END may go on before the
    stream is its manifest's. END is the stream's last command: the framer refuses anything after it but a
    stream header, and a second header is refused here (before the END ahead of it goes on). No command
    starts with the header's magic: its length would be past every limit, which the framer refused.
    """

    def __init__(self, write: Callable[[Any], object], wrote: Callable[[int], object] = lambda n: None) -> None:
        self._write = write
        self._wrote = wrote
        self._held = b""
        self.handed = 0  # bytes handed on
        self.begun = b""  # the first BEGUN of them: what the consumer began to make

    def __call__(self, data: Any) -> None:
        n = len(data)
        if (self.handed or self._held) and bytes(data[: len(STREAM_MAGIC)]) == STREAM_MAGIC:
            raise e.ManifestMismatch(
                "a second stream begins after its END", offset=self.handed + len(self._held), expected="one stream"
            )
        if n >= COMMAND_HEADER_SIZE:
            self._pass(self._held)
            self._pass(data[: n - COMMAND_HEADER_SIZE])
            self._held = bytes(data[n - COMMAND_HEADER_SIZE :])
        else:
            joined = self._held + bytes(data)
            self._pass(joined[: len(joined) - COMMAND_HEADER_SIZE])
            self._held = joined[-COMMAND_HEADER_SIZE:]

    def release(self) -> None:
        """The stream is its manifest's: hand its END on."""
        self._pass(self._held)
        self._held = b""

    def _pass(self, data: Any) -> None:
        if len(data) > 0:
            self._write(data)
            self._wrote(len(data))
            if len(self.begun) < BEGUN:
                self.begun += bytes(data[: BEGUN - len(self.begun)])
            self.handed += len(data)


def restore(
    s3: BucketClient,
    location: Location,
    chain: list[Entry],
    write: Callable[[Any], object],
    key: Sealer | None = None,
    *,
    consumer: str | None = None,
    wrote: Callable[[int], object] = lambda n: None,
) -> None:
    """Hand on the streams of ``chain`` (:func:`resolve`) in order, each command checked before it goes
    on (``wrote`` hears the size of each write), each stream's END only once the stream is its manifest's
    (its ledger: its SHA-256 is left to :func:`verify`, it would cost a third of the restore's CPU).

    A stream that fails is a :class:`~sendstream.errors.RestoreStopped` that says what ``consumer`` (an
    ``--exec`` command, standard output; None: a file, which is not kept) was left with."""
    for done, entry in enumerate(chain):
        held = EndHeld(write, wrote)
        try:
            check(s3, location, entry, held, key, sha256=False)
        except e.SendStreamError as exc:
            raise e.RestoreStopped(location.url(entry.name), exc, _left(consumer, done, held)) from exc
        held.release()


def _left(consumer: str | None, done: int, held: EndHeld) -> str:
    """What ``consumer`` has when a restore stopped inside the stream ``held`` was handing on, after ``done``
    whole streams: the snapshot that stream began is named from what went on, not from its manifest."""
    if consumer is None:
        return ""
    before = f" (and the {done} stream{'s' * (done != 1)} before it, whole)" if done else ""
    if not held.handed:
        return f"{consumer} was given nothing of it{before}"
    name = snapshot_name(held.begun)
    made = (
        f"under btrfs receive, {name!r} is left a writable subvolume that was not received: delete it "
        f"(btrfs subvolume delete DIR/{name}) before restoring again"
        if name
        else "btrfs receive began no subvolume of it"
    )
    return f"{consumer} was given {held.handed} bytes of it, not its END{before}: {made}"


@dataclass(frozen=True)
class Verdict:
    """The check of one archived stream: ``problem`` is None when it is sound."""

    name: str
    size: int
    problem: str | None


def to_verify(s3: BucketClient, location: Location) -> tuple[list[Verdict], list[Entry]]:
    """What :func:`verify` checks at ``location``: a verdict for each manifest that cannot be taken, and the
    streams in chain order (as ``archive ls`` lists them)."""
    problems: list[e.BadManifest] = []
    found = archived(s3, location, problems)
    ordered = [entry for tree in chains(found) for _, entry in tree]
    listed = set(ordered)
    ordered += [x for x in found if x not in listed]  # streams whose parents go round in a circle
    return [Verdict(problem.streams[0], 0, problem.reason) for problem in problems], ordered


def verify(
    s3: BucketClient,
    location: Location,
    endpoint_url: str | None,
    workers: int | None = None,
    key: bytes | None = None,
) -> Iterator[Verdict]:
    """Check every stream archived at ``location`` in place, ``workers`` (every core) at once, each in
    a process of its own with its own connection; the verdicts in :func:`to_verify`'s order."""
    problems, ordered = to_verify(s3, location)
    yield from problems
    workers = workers or len(os.sched_getaffinity(0))
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads and connections
    with ProcessPoolExecutor(min(workers, max(1, len(ordered))), mp_context=context) as pool:
        jobs = [pool.submit(verdict, endpoint_url, location, entry, key) for entry in ordered]
        for job in jobs:
            yield job.result()


_CLIENT: Any = None


def process_client(endpoint_url: str | None, location: Location) -> BucketClient:
    """The client of this process (a pool's or a cluster's worker): one, made when first asked."""
    global _CLIENT
    if _CLIENT is None:
        _CLIENT = location.connect(endpoint_url)
    return _CLIENT  # type: ignore[no-any-return]


def verdict(endpoint_url: str | None, location: Location, entry: Entry, key: bytes | None) -> Verdict:
    """The check of ``entry`` in a process (or a thread) of a pool, with :func:`process_client`."""
    client = process_client(endpoint_url, location)
    try:
        check(client, location, entry, key=Sealer(key) if key is not None else None)
    except e.SendStreamError as exc:
        return Verdict(entry.name, entry.size, str(exc))
    return Verdict(entry.name, entry.size, None)
