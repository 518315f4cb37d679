"""Input in windows for the framer: mapped regular files, buffered pipes and sockets; the event iterators.

A regular file is read through read-only mappings of the page cache, one
window at a time (no copy at all); a pipe or socket is read into one reused,
page-aligned buffer whose partial command at the end moves to the front
before the next read (only that tail is copied). Either way memory stays at
one window whatever the input size. Events handed out hold memoryviews into
the window: they are valid until the next event is asked for.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import select
import socket
import stat
import sys
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, NamedTuple

from .. import errors as e
from ..codec.backend import Backend, default
from ..codec.decoder import Decoder
from ..codec.events import EndOfInput, Event, NeedData, StreamHeader
from ..codec.framer import Framer
from ..codec.native import END, FULL, NEED
from ..codec.restart import HISTORY
from ..codec.scan import Batch, run_batch
from .pipes import widen

CHUNK_SIZE = 1 << 20
WINDOW_SIZE = 16 << 20
BATCH_BYTES = 1 << 20  # gather what is ready up to this much
GATHER_FROM = 1 << 16  # only after a read this large: a shorter one emptied the pipe or socket
TRICKLE = 16 << 10  # a read shorter than this: the producer writes little at a time
COALESCE = 0.0005  # then let this long pass before the next read (seconds)
_PAGE = mmap.PAGESIZE


class Window(NamedTuple):
    """A view of the input: ``mv[0]`` is at input offset ``origin``."""

    mv: memoryview
    pos: int
    eof: bool
    origin: int


def _pages(n: int) -> int:
    return -(-n // _PAGE) * _PAGE


class BufferedWindows:
    """Windows read into a reused page-aligned buffer, handing on what has arrived.

    A read takes what the source has now (``readinto1``: one system call) and
    never waits to fill the window, so every complete command goes on at
    once; after a large read it goes on reading while the source has more
    ready (a fast producer), up to :data:`BATCH_BYTES`, so windows stay large
    when bytes flow. After a short read of a pipe (``btrfs send`` of small
    files writes a few commands at a time) it lets :data:`COALESCE` pass
    before the next one: each wake-up costs more than the bytes it brings,
    and a stage woken for every write of a few hundred bytes would spend a
    core on it (measured in docs/contributing/pipelines.md). ``before_read``
    (flushing an output) runs before every read that may wait, and before
    that pause.
    """

    def __init__(
        self, source: BinaryIO, size: int = 8 << 20, *, before_read: Callable[[], object] | None = None
    ) -> None:
        self._source = source
        self._read = read_what_is_there(source)
        self._before_read = before_read
        self._trickling = False
        self._pauses = _is(stat.S_ISFIFO, source)  # a socket's or a TLS channel's reads are cut by packets and records
        self._ready = _poller(source)
        with contextlib.suppress(AttributeError, OSError, ValueError):
            widen(source.fileno())
        self._buf = mmap.mmap(-1, _pages(size))
        self._fill = 0
        self._origin = 0

    def advance(self, pos: int, need: int) -> Window:
        """The next window, after the consumer stopped at ``pos`` needing ``need`` bytes."""
        keep = min(pos, HISTORY)
        tail = self._fill - pos + keep
        if need + keep > len(self._buf):
            bigger = mmap.mmap(-1, _pages(need + keep))
            bigger[:tail] = self._buf[pos - keep : self._fill]
            self._buf = bigger  # the old buffer goes when its last view does
        elif pos > keep:
            self._buf.move(0, pos - keep, tail)
        self._origin += pos - keep
        self._fill = tail
        mv = memoryview(self._buf)
        n = self._read_some(mv[tail:])
        self._fill += n
        return Window(mv[: self._fill], keep, n == 0, self._origin)

    def _read_some(self, view: memoryview) -> int:
        """What the source has now, at least one byte (0 at its end): one read,
        then more only while they would not wait."""
        if self._before_read is not None:
            self._before_read()
        if self._trickling:
            time.sleep(COALESCE)
        total = n = self._read(view) or 0
        while n >= GATHER_FROM and total < min(len(view), BATCH_BYTES) and self._ready():
            n = self._read(view[total:]) or 0
            total += n
        self._trickling = self._pauses and 0 < total < TRICKLE
        return total

    def check(self) -> None:
        """Reads report their own errors."""


class MappedWindows:
    """Windows mapped read-only from a regular file, ``size`` bytes at a time.

    Each mapping is guarded by ``native``, the native module: if the file loses data
    while it is read (truncated by another process, an I/O error), the access
    reads zeros instead of killing the process with SIGBUS, and :meth:`check`
    raises :class:`~sendstream.errors.InputChanged` at that offset. Callers
    check before they trust a result (every window, errors, the end).
    """

    def __init__(self, source: BinaryIO, native: Any, size: int = WINDOW_SIZE) -> None:
        self._native = native
        self._fd = source.fileno()
        self._size = size
        self._base = self._start = source.tell()
        self._guarded: dict[int, int] = {}  # guard slot -> input offset of its mapping

    def check(self) -> None:
        """Raise :class:`~sendstream.errors.InputChanged` if a live mapping lost data."""
        for slot, origin in list(self._guarded.items()):
            at = self._native.faulted(slot)
            if at >= 0:
                try:
                    size: int | None = os.fstat(self._fd).st_size - self._base
                except OSError:
                    size = None
                raise e.InputChanged(origin + at, size)

    def _guard(self, mapped: mmap.mmap, origin: int) -> None:
        slot = self._native.guard(mapped)
        if slot >= 0:
            self._guarded[slot] = origin
            weakref.finalize(mapped, self._unguard, slot)

    def _unguard(self, slot: int) -> None:
        self._guarded.pop(slot, None)
        self._native.unguard(slot)

    def advance(self, pos: int, need: int) -> Window:
        self.check()
        offset = self._start + pos
        start = max(self._base, offset - HISTORY)
        start -= start % _PAGE
        skip = offset - start
        left = os.fstat(self._fd).st_size - start
        length = min(max(self._size, _pages(skip + need)), left)
        if length <= skip:
            return Window(memoryview(b""), 0, True, offset - self._base)
        # faulted in as read (the kernel maps 16 pages a fault): MAP_POPULATE cost 13-15% more, its page
        # walk marking every page accessed (docs/contributing/benchmarks.md, "The verifier at the read limit")
        mapped = mmap.mmap(self._fd, length, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=start)
        self._guard(mapped, start - self._base)
        self._start = start
        # the previous mapping is unmapped when the last view into it goes
        return Window(memoryview(mapped), skip, length == left, start - self._base)


def _is(kind: Callable[[int], bool], source: BinaryIO) -> bool:
    """Whether ``source`` has a descriptor of that ``kind`` (``stat.S_ISREG``, ...)."""
    try:
        return kind(os.fstat(source.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):
        return False


def is_regular(source: BinaryIO) -> bool:
    return _is(stat.S_ISREG, source)


def read_what_is_there(source: BinaryIO) -> Callable[[memoryview], int | None]:
    """``source``'s read that returns what has arrived (one system call), not a full buffer."""
    return getattr(source, "readinto1", None) or source.readinto  # type: ignore[attr-defined,no-any-return]


def _poller(source: BinaryIO) -> Callable[[], bool]:
    """Whether ``source`` can be read now without waiting (never, when it has no descriptor)."""
    try:
        fd = source.fileno()
    except (AttributeError, OSError, ValueError):
        return lambda: False
    poll = select.poll()
    poll.register(fd, select.POLLIN)
    return lambda: bool(poll.poll(0))


def windows_for(
    source: BinaryIO, before_read: Callable[[], object] | None = None, backend: Backend | None = None
) -> BufferedWindows | MappedWindows:
    """Mapped windows for a regular file, buffered ones for anything else
    (``before_read`` runs before each of their reads that may wait).

    Without the native module (the pure ``backend``) a mapping could not survive
    a file that shrinks under it (SIGBUS), so regular files are read then too.
    """
    native = (backend or default()).module
    if native is not None and is_regular(source):
        return MappedWindows(source, native)
    return BufferedWindows(source, before_read=before_read)


def open_input(path: str) -> BinaryIO:
    """A binary file for ``path``; ``-`` is standard input."""
    if path == "-":
        return sys.stdin.buffer
    return open(path, "rb")


def file_events(
    source: BinaryIO,
    framer: Framer | None = None,
    batch: Batch | None = None,
    *,
    firsts: bool = False,
    before_read: Callable[[], object] | None = None,
) -> Iterator[Event]:
    """Every event of ``source`` up to :class:`EndOfInput`, through windows.

    Command values are views into the current window: use or copy them
    before asking for the next event. With ``batch`` (a native scanner),
    runs of clean commands are handled by it and not yielded (with
    ``firsts``, each stream's first command still is: it says what the
    stream is). ``before_read`` runs before every read of a pipe or socket that may wait.
    The framer's backend (the default one without a framer) reads and checks.
    """
    framer = framer or Framer()
    windows = windows_for(source, before_read, framer.backend)
    mv, pos, eof, origin = windows.advance(0, 0)
    step = framer.step
    first = firsts
    try:
        while True:
            if batch is not None and framer.version and not first:
                pos, status, need = run_batch(framer, batch, mv, pos, origin)
                if status in (END, FULL):
                    continue
                if status == NEED and not eof:
                    mv, pos, eof, origin = windows.advance(pos, need)
                    continue
            event, pos, need = step(mv, pos, eof, origin)
            if event.__class__ is NeedData:
                mv, pos, eof, origin = windows.advance(pos, need)
                continue
            first = firsts and event.__class__ is StreamHeader
            if event.__class__ is EndOfInput:
                windows.check()
                yield event
                return
            yield event  # type: ignore[misc]
            del event  # its values are views: held while a batch runs on, they would keep old windows mapped
    except e.FormatError:
        windows.check()  # zeros where the file lost its data are no format error of the stream
        raise


def iter_events(source: BinaryIO, decoder: Decoder | None = None, chunk_size: int = CHUNK_SIZE) -> Iterator[Event]:
    """Every event of ``source`` through a :class:`Decoder` (values stay valid)."""
    decoder = decoder or Decoder()
    while True:
        event = decoder.next_event()
        if isinstance(event, NeedData):
            decoder.receive_data(source.read(chunk_size))
            continue
        yield event
        if isinstance(event, EndOfInput):
            return


def events(
    source: str | os.PathLike[str] | bytes | bytearray | memoryview | BinaryIO | socket.socket,
    framer: Framer | None = None,
) -> Iterator[Event]:
    """Every event of a stream from a path, bytes, a binary file or a socket.

    Command values are views into the input: copy what you keep beyond the
    next event.
    """
    if isinstance(source, str | os.PathLike):
        with open(source, "rb") as f:
            yield from file_events(f, framer)
    elif isinstance(source, bytes | bytearray | memoryview):
        yield from file_events(io.BytesIO(bytes(source)), framer)
    elif isinstance(source, socket.socket):
        with source.makefile("rb") as f:
            yield from file_events(f, framer)
    else:
        yield from file_events(source, framer)
