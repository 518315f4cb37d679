"""Whole-buffer verification of send streams.

Input comes in windows (:mod:`sendstream.io.windows`: mapped page cache for a
regular file, a reused page-aligned buffer for a pipe) and every complete
command in a window is framed and checked in one call of the native scanner
(:meth:`Backend.scan <sendstream.codec.backend.Backend.scan>`, driven by
:func:`sendstream.codec.scan.run_batch`) on the native backend.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, BinaryIO

from .. import errors as e
from ..codec.backend import Backend
from ..codec.events import StreamHeader
from ..codec.framer import Framer
from ..codec.scan import Batch
from ..format.command import Command, subvolume_of
from ..format.layout import STREAM_HEADER_SIZE, STREAM_MAGIC
from ..io.framed import StreamSource, opened
from ..io.windows import file_events, windows_for

MAX_LISTED = 100  # streams whose subvolume a report names; an input may hold millions of tiny streams


@dataclass
class Report:
    """What a verification found."""

    streams: int = 0
    commands: int = 0
    bytes: int = 0
    seconds: float = 0.0
    problems: e.ProblemLog = field(default_factory=e.ProblemLog)
    # well-formed, but what btrfs receive would not apply as written (a name with a NUL)
    warnings: e.ProblemLog = field(default_factory=e.ProblemLog)
    # what the first command of each stream says it is (the first MAX_LISTED streams)
    subvolumes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems.total

    @property
    def exit_code(self) -> int:
        """The first problem's code; a restart's only when nothing else is wrong."""
        firsts = self.problems.first_of.values()
        worse = [p for p in firsts if not isinstance(p, e.StreamRestarted)]
        first = min(worse or firsts, key=lambda p: p.offset, default=None)
        return e.EXIT_OK if first is None else first.exit_code

    def summary(self) -> str:
        """What each stream is (:attr:`subvolumes`, a line each), then one line: OK or FAILED (how many
        problems and warnings), what was read, how fast."""
        rate = self.bytes / self.seconds / 1e6 if self.seconds else 0.0
        count, warned = self.problems.total, self.warnings.total
        status = "OK" if self.ok else f"FAILED ({count} problem{'s' * (count != 1)})"
        if warned:
            status += f" ({warned} warning{'s' * (warned != 1)})"
        more = self.streams - len(self.subvolumes)
        listed = [*self.subvolumes, *([f"(and {more} more streams)"] if self.subvolumes and more > 0 else [])]
        return "\n".join(
            [
                *listed,
                f"{status}: {self.streams} stream{'s' * (self.streams != 1)}, {self.commands} commands, "
                f"{self.bytes} bytes in {self.seconds:.3f} s ({rate:.1f} MB/s)",
            ]
        )


def _batch(backend: Backend) -> Batch | None:
    """The backend's scanner as a batch function (None on the pure backend)."""
    if not backend.is_native:
        return None

    def scan(
        mv: memoryview, pos: int, version: int, limit: int, origin: int, unknown: Any
    ) -> tuple[int, int, int, int, int]:
        return backend.scan(mv, pos, version, limit, unknown=unknown)

    return scan


def verify_file(
    source: BinaryIO,
    *,
    keep_going: bool = False,
    max_command_size: int | None = None,
    backend: Backend | None = None,
) -> Report:
    """Verify a whole input: framing, every CRC, commands and attributes
    known for the version, required attributes and their sizes, END, and
    no trailing bytes, on ``backend`` (the default one without it). Memory
    stays at one window whatever the input size.
    """
    framer = Framer(
        strict=True, check_names=True, keep_going=keep_going, max_command_size=max_command_size, backend=backend
    )
    started = time.perf_counter()
    subvolumes: list[str] = []
    first = False  # the next event is a stream's first command
    try:
        for event in file_events(source, framer, _batch(framer.backend), firsts=True):
            if first and event.__class__ is Command and len(subvolumes) < MAX_LISTED:
                said = subvolume_of(event)
                if said is not None:
                    subvolumes.append(said)
            first = event.__class__ is StreamHeader
            del event  # a view into the window: let it go before the scan moves on
    except e.FormatError as exc:
        # without its traceback the error holds no view of the input window
        framer.problems.append(exc.with_traceback(None))
    seconds = time.perf_counter() - started
    return Report(framer.streams, framer.commands, framer.bytes, seconds, framer.problems, framer.warnings, subvolumes)


def verify(
    source: StreamSource,
    *,
    keep_going: bool = False,
    max_command_size: int | None = None,
    backend: Backend | None = None,
) -> Report:
    """Verify the stream at ``source`` (a path, ``-``, or a binary file); see :func:`verify_file`."""
    with opened(source) as f:
        return verify_file(f, keep_going=keep_going, max_command_size=max_command_size, backend=backend)


def find_headers(source: StreamSource) -> Iterator[tuple[int, int]]:
    """Every ``btrfs-stream`` header in ``source``: ``(offset, version)``,
    wherever it is, to resynchronise on a damaged input."""
    with opened(source) as f:
        yield from _headers(f)


def _headers(source: BinaryIO) -> Iterator[tuple[int, int]]:
    windows = windows_for(source)
    pos = need = 0
    while True:
        mv, start, eof, origin = windows.advance(pos, need)
        data = bytes(mv[start:])
        at = data.find(STREAM_MAGIC)
        while at >= 0 and at + STREAM_HEADER_SIZE <= len(data):
            yield origin + start + at, int.from_bytes(data[at + 13 : at + STREAM_HEADER_SIZE], "little")
            at = data.find(STREAM_MAGIC, at + 1)
        if eof:
            windows.check()
            return
        # keep the bytes a header cut by the window's end could start in
        keep = min(len(data), STREAM_HEADER_SIZE - 1) if at < 0 else len(data) - at
        pos, need = start + len(data) - keep, STREAM_HEADER_SIZE
