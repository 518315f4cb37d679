"""Archived streams read in place: ranged GETs, every command checked, each stream held to its manifest.

:func:`check` reads one stream (its objects in order) with ranged GETs of
:data:`CHUNK` bytes, the next one fetched while this one is checked, so
that a reader holds at most two chunks whatever the stream's size. Every
command is checked (framing, CRC) before it is handed on; at the end the
size, SHA-256, command count and ledger must be the manifest's.
:func:`restore` hands a chain on, full stream first; :func:`verify` checks
every stream of an archive, many at once in a process pool.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .. import errors as e
from ..codec.framer import Framer
from ..io.windows import file_events
from ..ops.ledger import Ledger
from ..ops.repair import Healer
from .catalog import Entry, chain_to, entries
from .store import Location, calling, connect

CHUNK = 8 << 20


class RangedReader:
    """The objects of one stream, in order, as one reader (``readinto``), by ranged GETs."""

    def __init__(self, s3: Any, location: Location, objects: tuple[tuple[str, int], ...], chunk: int = CHUNK) -> None:
        self._s3 = s3
        self._location = location
        self._ranges = [
            (name, start, min(start + chunk, size)) for name, size in objects for start in range(0, size, chunk)
        ]
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="sendstream-get")
        self._ahead: Future[bytes] | None = self._fetch(0)
        self._next = 1
        self._current = memoryview(b"")

    def _fetch(self, i: int) -> Future[bytes] | None:
        return self._pool.submit(self._get, *self._ranges[i]) if i < len(self._ranges) else None

    def _get(self, name: str, start: int, end: int) -> bytes:
        url = self._location.url(name)
        with calling(url):
            answer = self._s3.get_object(
                Bucket=self._location.bucket, Key=self._location.key(name), Range=f"bytes={start}-{end - 1}"
            )
            data: bytes = answer["Body"].read()
        if len(data) != end - start:
            raise e.StoreError(url, f"bytes {start}-{end - 1} came back as {len(data)} bytes: the object is shorter")
        return data

    def readinto(self, view: Any) -> int:
        if not self._current:
            if self._ahead is None:
                return 0
            self._current = memoryview(self._ahead.result())
            self._ahead = self._fetch(self._next)
            self._next += 1
        n = min(len(view), len(self._current))
        view[:n] = self._current[:n]
        self._current = self._current[n:]
        return n

    def close(self) -> None:
        self._pool.shutdown(cancel_futures=True)


def check(s3: Any, location: Location, entry: Entry, write: Callable[[Any], object] = lambda data: None) -> None:
    """Read the stream of ``entry`` in place and check every command before ``write`` gets it; then
    hold it to its manifest (:class:`~sendstream.errors.ManifestMismatch` when it differs)."""
    digest, ledger = hashlib.sha256(), Ledger()

    def out(data: Any) -> None:
        write(data)
        digest.update(data)

    reader = RangedReader(s3, location, entry.objects)
    try:
        healer = Healer(out, ledger=ledger)
        for event in file_events(reader, Framer(), healer.batch):  # type: ignore[arg-type]
            healer.event(event)
    finally:
        reader.close()
    stored = sum(size for _, size in entry.objects)
    for what, expected, actual in (
        ("restarts", 0, healer.restart_count),
        ("size", entry.size, healer.written),
        ("size of its objects", entry.size, stored),
        ("commands", entry.commands, ledger.commands),
        ("ledger", entry.ledger, ledger.digest()),
        ("SHA-256", entry.sha256, digest.hexdigest()),
    ):
        if expected != actual:
            raise e.ManifestMismatch(
                f"its {what} is not its manifest's", offset=healer.written, expected=expected, actual=actual
            )


def restore(s3: Any, location: Location, subvolume: str, write: Callable[[Any], object]) -> list[Entry]:
    """Hand on every stream that makes ``subvolume`` (the full stream, then each incremental) in
    order, each command checked before it goes on; the streams."""
    chain = chain_to(entries(s3, location), subvolume, location)
    for entry in chain:
        check(s3, location, entry, write)
    return chain


@dataclass(frozen=True)
class Verdict:
    """The check of one archived stream: ``problem`` is None when it is sound."""

    name: str
    size: int
    problem: str | None


def verify(
    s3: Any,
    location: Location,
    endpoint_url: str | None,
    workers: int | None = None,
) -> Iterator[Verdict]:
    """Check every stream archived at ``location`` in place, ``workers`` (every core) at once, each in
    a process of its own with its own connection; verdicts in the archive's order as they come."""
    found = entries(s3, location)
    workers = workers or len(os.sched_getaffinity(0))
    context = multiprocessing.get_context("spawn")  # no fork of a process with threads and connections
    with ProcessPoolExecutor(min(workers, max(1, len(found))), mp_context=context) as pool:
        jobs = [pool.submit(_verdict, endpoint_url, location, entry) for entry in found]
        for job in jobs:
            yield job.result()


_CLIENT: Any = None


def _verdict(endpoint_url: str | None, location: Location, entry: Entry) -> Verdict:
    global _CLIENT
    if _CLIENT is None:
        _CLIENT = connect(endpoint_url)
    try:
        check(_CLIENT, location, entry)
    except e.SendStreamError as exc:
        return Verdict(entry.name, entry.size, str(exc))
    return Verdict(entry.name, entry.size, None)
