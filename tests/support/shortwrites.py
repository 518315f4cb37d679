"""Writers that misbehave as a filling disk does, put under every :class:`~sendstream.io.outputs.OutputFile`.

A write to a file may take fewer bytes than it was given (a file-size limit,
a disk that fills and is freed a moment later); CPython ignores SIGXFSZ and a
full disk cannot be freed on cue, so the tests inject the raw file instead:
:func:`writing_through` makes one of the classes here the base class of
``OutputFile`` while it is held, in this process (:mod:`short_serve` does it
in a ``sendstream`` process).
"""

from __future__ import annotations

import contextlib
import errno
import io
from collections.abc import Iterator
from typing import Any

from sendstream.io.outputs import OutputFile


class Tally:
    """How often the injected writer misbehaved."""

    short = 0


class ShortFileIO(io.FileIO):
    """Every third write takes only half of what it is given, and says so."""

    calls = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        ShortFileIO.calls += 1
        if len(view) > 1 and ShortFileIO.calls % 3 == 0:
            Tally.short += 1
            return int(super().write(view[: len(view) // 2]))
        return int(super().write(view))


class LyingFileIO(io.FileIO):
    """One write of more than a byte takes only half of it, and says it took all (a broken layer)."""

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        if len(view) > 1 and not Tally.short:
            Tally.short += 1
            super().write(view[: len(view) // 2])
            return len(view)
        return int(super().write(view))


class FullFileIO(io.FileIO):
    """A disk that fills: the write that would pass :attr:`room` bytes in all fails with ENOSPC."""

    room = 1 << 20
    written = 0

    def write(self, data: Any) -> int:
        n = len(memoryview(data).cast("B"))
        if FullFileIO.written + n > FullFileIO.room:
            Tally.short += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        FullFileIO.written += n
        return int(super().write(data))


@contextlib.contextmanager
def writing_through(kind: type[io.FileIO]) -> Iterator[type[Tally]]:
    """Every ``OutputFile`` writes through ``kind`` while this is held."""
    Tally.short, ShortFileIO.calls, FullFileIO.written = 0, 0, 0
    OutputFile.__bases__ = (kind,)
    try:
        yield Tally
    finally:
        OutputFile.__bases__ = (io.FileIO,)
