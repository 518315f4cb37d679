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
from .decoder import EndOfInput, Framer, NeedData

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


def verify_buffer(framer: Framer, mv: memoryview, pos: int, eof: bool, origin: int) -> tuple[int, int]:
    """Check every complete event in ``mv[pos:]``.

    Returns where checking stopped (the start of a partial command) and how
    many bytes from there the next event needs; 0 when the input is
    finished. Raises the first :class:`~sendstream.errors.FormatError`
    unless the framer keeps going.
    """
    step = framer.step
    while True:
        event, pos, need = step(mv, pos, eof, origin)
        if event.__class__ is NeedData:
            return pos, need
        if event.__class__ is EndOfInput:
            return pos, 0


def _aligned(size: int) -> mmap.mmap:
    return mmap.mmap(-1, -(-size // mmap.PAGESIZE) * mmap.PAGESIZE)


def verify_file(
    source: BinaryIO,
    *,
    keep_going: bool = False,
    max_command_size: int | None = None,
    buffer_size: int = BUFFER_SIZE,
) -> Report:
    """Verify a whole input: framing, every CRC, commands and attributes
    known for the version, required attributes and their sizes, END, and
    no trailing bytes. Memory stays at one buffer whatever the input size;
    it grows only for a command larger than the buffer whose length passed
    the limit check.
    """
    framer = Framer(strict=True, keep_going=keep_going, max_command_size=max_command_size)
    started = time.perf_counter()
    buf = _aligned(buffer_size)
    try:
        fill = origin = 0
        need = 1
        while need:
            if need > len(buf):
                bigger = _aligned(need)
                bigger[:fill] = buf[:fill]
                buf.close()
                buf = bigger
            with memoryview(buf) as mv:
                n = source.readinto(mv[fill:])  # type: ignore[attr-defined]
                fill += n or 0
                try:
                    pos, need = verify_buffer(framer, mv[:fill], 0, not n, origin)
                except e.FormatError as exc:
                    # without its traceback the error holds no view of the buffer
                    framer.problems.append(exc.with_traceback(None))
                    break
                tail = fill - pos
                if tail:
                    mv[:tail] = mv[pos:fill]
            origin += pos
            fill = tail
    finally:
        buf.close()
    return Report(framer.streams, framer.commands, framer.bytes, time.perf_counter() - started, framer.problems)
