"""Whole-buffer verification of send streams.

Input is read into one reused, page-aligned buffer (an anonymous mmap reads
several times faster than a bytearray here) and every complete command in it
is framed and checked in one :func:`verify_buffer` call; the partial command
at the end is moved to the front of the buffer before the next read, so only
that tail is ever copied.
"""

from __future__ import annotations

import mmap
import time
from dataclasses import dataclass, field
from typing import BinaryIO

from . import errors as e
from .decoder import EndOfInput, Framer, NeedData, default_max_command_size
from .format import COMMAND_HEADER_SIZE, MAX_VERSION, STREAM_HEADER_SIZE

BUFFER_SIZE = 8 << 20


@dataclass
class Report:
    """What a verification found."""

    streams: int = 0
    commands: int = 0
    bytes: int = 0
    seconds: float = 0.0
    problems: list[e.FormatError] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def exit_code(self) -> int:
        return self.problems[0].exit_code if self.problems else e.EXIT_OK


def verify_buffer(framer: Framer, mv: memoryview, pos: int, eof: bool, origin: int) -> tuple[int, bool]:
    """Check every complete event in ``mv[pos:]``.

    Returns where checking stopped (the start of a partial command, or the
    end) and whether the input is finished. Raises the first
    :class:`~sendstream.errors.FormatError` unless the framer keeps going.
    """
    step = framer.step
    while True:
        event, pos, _ = step(mv, pos, eof, origin)
        if event.__class__ is NeedData:
            return pos, False
        if event.__class__ is EndOfInput:
            return pos, True


def verify_file(
    source: BinaryIO,
    *,
    keep_going: bool = False,
    max_command_size: int | None = None,
    buffer_size: int = BUFFER_SIZE,
) -> Report:
    """Verify a whole input: framing, every CRC, commands and attributes
    known for the version, required attributes and their sizes, END, and
    no trailing bytes. Memory stays at one buffer whatever the input size.
    """
    framer = Framer(strict=True, keep_going=keep_going, max_command_size=max_command_size)
    largest = max_command_size or max(default_max_command_size(v) for v in range(1, MAX_VERSION + 1))
    size = max(buffer_size, largest + COMMAND_HEADER_SIZE + STREAM_HEADER_SIZE)
    size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
    report = Report()
    started = time.perf_counter()
    buf = mmap.mmap(-1, size)
    mv = memoryview(buf)
    try:
        fill = 0
        origin = 0
        done = False
        while not done:
            n = source.readinto(mv[fill:])  # type: ignore[attr-defined]
            eof = not n
            fill += n or 0
            try:
                pos, done = verify_buffer(framer, mv[:fill], 0, eof, origin)
            except e.FormatError as exc:
                framer.problems.append(exc)
                break
            tail = fill - pos
            if tail:
                mv[:tail] = mv[pos:fill]
            origin += pos
            fill = tail
    finally:
        mv.release()
        buf.close()
    report.streams = framer.streams
    report.commands = framer.commands
    report.bytes = framer.bytes
    report.problems = framer.problems
    report.seconds = time.perf_counter() - started
    return report
