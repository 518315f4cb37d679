"""The file layer: windows of input for the framer, and safe outputs.

A regular file is read through read-only mappings of the page cache, one
window at a time (no copy at all); a pipe or socket is read into one reused,
page-aligned buffer whose partial command at the end moves to the front
before the next read (only that tail is copied). Either way memory stays at
one window whatever the input size. Events handed out hold memoryviews into
the window: they are valid until the next event is asked for.
"""

from __future__ import annotations

import contextlib
import errno
import io
import mmap
import os
import socket
import stat
import sys
import weakref
from collections.abc import Iterator
from typing import Any, BinaryIO, NamedTuple

from .. import errors as e
from ..codec import native
from ..codec.decoder import HISTORY, Decoder, EndOfInput, Event, Framer, NeedData
from ..codec.native import END, FULL, NEED
from ..codec.scan import Batch, run_batch

CHUNK_SIZE = 1 << 20
WINDOW_SIZE = 16 << 20
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
    """Windows read with ``readinto`` into a reused page-aligned buffer."""

    def __init__(self, source: BinaryIO, size: int = 8 << 20) -> None:
        self._source = source
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
        n = self._source.readinto(mv[tail:]) or 0  # type: ignore[attr-defined]
        self._fill += n
        return Window(mv[: self._fill], keep, n == 0, self._origin)

    def check(self) -> None:
        """Reads report their own errors."""


class MappedWindows:
    """Windows mapped read-only from a regular file, ``size`` bytes at a time.

    Each mapping is guarded by the native module: if the file loses data
    while it is read (truncated by another process, an I/O error), the access
    reads zeros instead of killing the process with SIGBUS, and :meth:`check`
    raises :class:`~sendstream.errors.InputChanged` at that offset. Callers
    check before they trust a result (every window, errors, the end).
    """

    def __init__(self, source: BinaryIO, size: int = WINDOW_SIZE) -> None:
        self._fd = source.fileno()
        self._size = size
        self._base = self._start = source.tell()
        self._guarded: dict[int, int] = {}  # guard slot -> input offset of its mapping

    def check(self) -> None:
        """Raise :class:`~sendstream.errors.InputChanged` if a live mapping lost data."""
        for slot, origin in list(self._guarded.items()):
            at = native.module.faulted(slot)
            if at >= 0:
                try:
                    size: int | None = os.fstat(self._fd).st_size - self._base
                except OSError:
                    size = None
                raise e.InputChanged(origin + at, size)

    def _guard(self, mapped: mmap.mmap, origin: int) -> None:
        slot = native.module.guard(mapped)
        if slot >= 0:
            self._guarded[slot] = origin
            weakref.finalize(mapped, self._unguard, slot)

    def _unguard(self, slot: int) -> None:
        self._guarded.pop(slot, None)
        native.module.unguard(slot)

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
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mapped = mmap.mmap(self._fd, length, flags=flags, prot=mmap.PROT_READ, offset=start)
        self._guard(mapped, start - self._base)
        self._start = start
        # the previous mapping is unmapped when the last view into it goes
        return Window(memoryview(mapped), skip, length == left, start - self._base)


def is_regular(source: BinaryIO) -> bool:
    try:
        return stat.S_ISREG(os.fstat(source.fileno()).st_mode)
    except (AttributeError, OSError, ValueError):
        return False


def is_special(path: str) -> bool:
    """True for a path that exists and is not a regular file (a device such as /dev/null, a fifo, a symlink)."""
    try:
        return not stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class OutputDirectory:
    """The directory of an output path, opened once; every name in it is made or
    opened relative to it, never through a symlink.

    A local user who can write to the directory (a shared or group-writable
    backup directory) could otherwise plant a symlink where we write, and make
    us (root) overwrite any file. Files are created with ``O_CREAT | O_EXCL |
    O_NOFOLLOW``; an existing one is reused only when it is a regular file of
    ours with no other link.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.name = os.path.basename(path)
        if not self.name or self.name in (".", ".."):
            raise e.UsageError(f"{path!r} names a directory, not a file")
        where = os.path.dirname(path) or "."
        try:
            self.fd = os.open(where, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except OSError as exc:
            raise e.OutputError(path, f"cannot open its directory: {exc.strerror}") from None

    def __enter__(self) -> OutputDirectory:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def lstat(self, name: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def create(self, name: str, mode: int = 0o666) -> int:
        """A new file ``name`` (the umask applies), never an existing one or a symlink's target."""
        try:
            return os.open(name, _CREATE, mode, dir_fd=self.fd)
        except OSError as exc:
            raise e.OutputError(os.path.join(os.path.dirname(self.path), name), exc.strerror or str(exc)) from None

    def create_temporary(self, mode: int = 0o666) -> tuple[str, int]:
        """A new file with a fresh hidden name beside the output."""
        for _ in range(100):
            name = f".{self.name[:200]}.{os.urandom(6).hex()}.tmp"
            try:
                return name, os.open(name, _CREATE, mode, dir_fd=self.fd)
            except FileExistsError:
                continue
            except OSError as exc:
                raise e.OutputError(self.path, exc.strerror or str(exc)) from None
        raise e.OutputError(self.path, "no free temporary name beside it")

    def open_ours(self, name: str, flags: int) -> int:
        """Open the existing ``name``: only a regular file owned by us, with no other hard link."""
        shown = os.path.join(os.path.dirname(self.path), name)
        refused = "it is not a regular file of ours with a single link (a symlink?): refusing to use it"
        try:
            fd = os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY | os.O_NONBLOCK, dir_fd=self.fd)
        except OSError as exc:
            raise e.OutputError(shown, refused if exc.errno == errno.ELOOP else exc.strerror or str(exc)) from None
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            os.close(fd)
            raise e.OutputError(shown, refused)
        return fd

    def remove_stale(self, name: str) -> None:
        """Remove ``name`` when it is a regular file of ours with one link; refuse anything else there."""
        st = self.lstat(name)
        if st is None:
            return
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid() or st.st_nlink != 1:
            raise e.OutputError(
                os.path.join(os.path.dirname(self.path), name),
                "it exists and is not a regular file of ours (a symlink, another user's file, a hard link): "
                "refusing to write through it; remove it if it is yours",
            )
        os.unlink(name, dir_fd=self.fd)

    def replace(self, source: str, target: str, fd: int | None = None) -> None:
        """Rename ``source`` over ``target``; with ``fd``, only if ``source`` is still that file."""
        if fd is not None:
            st, now = os.fstat(fd), self.lstat(source)
            if now is None or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
                raise e.OutputError(
                    os.path.join(os.path.dirname(self.path), source), "it was replaced while we wrote it"
                )
        try:
            os.replace(source, target, src_dir_fd=self.fd, dst_dir_fd=self.fd)
        except OSError as exc:
            raise e.OutputError(self.path, exc.strerror or str(exc)) from None

    def unlink(self, name: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=self.fd)

    def sync(self) -> None:
        os.fsync(self.fd)


class OutputFile(io.FileIO):
    """A file written for ``path``: its errors (ENOSPC, EIO) name ``path``; a reader that
    went away (``| head``) stays a BrokenPipeError."""

    def __init__(self, fd: int, path: str, *, closefd: bool = True) -> None:
        super().__init__(fd, "wb", closefd=closefd)
        self.path = path

    def write(self, data: Any) -> int:
        try:
            return super().write(data)
        except BrokenPipeError:
            raise
        except OSError as exc:
            raise e.OutputError(self.path, exc.strerror or str(exc)) from None

    def fsync(self) -> None:
        try:
            os.fsync(self.fileno())
        except OSError as exc:
            raise e.OutputError(self.path, exc.strerror or str(exc)) from None


def _special_output(path: str, st: os.stat_result) -> int:
    """An fd to write to the existing non-regular ``path`` (a character device, a fifo)."""
    if stat.S_ISLNK(st.st_mode):
        raise e.UsageError(f"{path!r} is a symlink: refusing to follow or replace it (give its target's path)")
    if not (stat.S_ISCHR(st.st_mode) or stat.S_ISFIFO(st.st_mode)):
        raise e.UsageError(f"{path!r} is not a regular file, a character device or a fifo: refusing to write to it")
    try:
        return os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise e.OutputError(path, exc.strerror or str(exc)) from None


def windows_for(source: BinaryIO) -> BufferedWindows | MappedWindows:
    """Mapped windows for a regular file, buffered ones for anything else.

    Without the native module a mapping could not survive a file that shrinks
    under it (SIGBUS), so regular files are read then too.
    """
    return MappedWindows(source) if native.NATIVE and is_regular(source) else BufferedWindows(source)


class FlushBeforeRead:
    """Reads ``source``, flushing ``out`` whenever a read might wait, so that a
    pipeline downstream gets every checked command without delay."""

    def __init__(self, source: BinaryIO, out: BinaryIO) -> None:
        self._source = source
        self._out = out

    def readinto(self, b: memoryview) -> int:
        self._out.flush()
        return self._source.readinto(b) or 0  # type: ignore[attr-defined]


def open_input(path: str) -> BinaryIO:
    """A binary file for ``path``; ``-`` is standard input."""
    if path == "-":
        return sys.stdin.buffer
    return open(path, "rb")


def file_events(source: BinaryIO, framer: Framer | None = None, batch: Batch | None = None) -> Iterator[Event]:
    """Every event of ``source`` up to :class:`EndOfInput`, through windows.

    Command values are views into the current window: use or copy them
    before asking for the next event. With ``batch`` (a native scanner),
    runs of clean commands are handled by it and not yielded.
    """
    framer = framer or Framer()
    windows = windows_for(source)
    mv, pos, eof, origin = windows.advance(0, 0)
    step = framer.step
    try:
        while True:
            if batch is not None and framer.version:
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
            if event.__class__ is EndOfInput:
                windows.check()
                yield event
                return
            yield event  # type: ignore[misc]
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


@contextlib.contextmanager
def atomic_output(path: str) -> Iterator[BinaryIO]:
    """Write ``path`` through a temporary file renamed into place on success.

    On an error nothing is left behind, and an existing file is untouched. A
    new file gets ``0666`` less the umask; a replaced one keeps its mode (and,
    for root, its owner). ``-`` writes to standard output; a character device
    (such as /dev/null) or a fifo is written directly (renaming over it would
    replace it); a symlink or any other kind of file is refused. Errors name
    ``path``, never the temporary file.
    """
    if path == "-":
        sys.stdout.flush()
        with io.BufferedWriter(OutputFile(sys.stdout.fileno(), "standard output", closefd=False)) as stdout:
            yield stdout
        return
    try:
        st: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        st = None
    except OSError as exc:
        raise e.OutputError(path, exc.strerror or str(exc)) from None
    if st is not None and not stat.S_ISREG(st.st_mode):
        with io.BufferedWriter(OutputFile(_special_output(path, st), path)) as direct:
            yield direct
        return
    with OutputDirectory(path) as directory:
        tmp, fd = directory.create_temporary()
        try:
            raw = OutputFile(fd, path)
            if st is not None:
                os.fchmod(fd, stat.S_IMODE(st.st_mode))
                if os.geteuid() == 0:
                    os.fchown(fd, st.st_uid, st.st_gid)
            with io.BufferedWriter(raw) as out:
                yield out
                out.flush()
                raw.fsync()
            directory.replace(tmp, directory.name)
        except BaseException:
            directory.unlink(tmp)
            raise


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
