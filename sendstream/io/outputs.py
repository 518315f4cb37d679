"""Outputs written safely: never through a planted symlink, errors that name the file.

:func:`atomic_output` writes a file through a temporary one renamed into
place on success; :class:`OutputDirectory` makes and opens names relative to a
directory opened once, with ``O_CREAT | O_EXCL | O_NOFOLLOW``;
:class:`OutputFile` names the file in its write errors.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import io
import os
import re
import stat
import sys
from collections.abc import Iterator
from typing import Any, BinaryIO

from .. import errors as e
from .pipes import widen


def is_special(path: str) -> bool:
    """True for a path that exists and is not a regular file (a device such as /dev/null, a fifo, a symlink)."""
    try:
        return not stat.S_ISREG(os.lstat(path).st_mode)
    except FileNotFoundError:
        return False


_TEMPORARY = re.compile(r"\..*\.[0-9a-f]{12}\.tmp", re.DOTALL)


def is_temporary(name: str) -> bool:
    """Whether ``name`` is one that :meth:`OutputDirectory.create_temporary` makes."""
    return _TEMPORARY.fullmatch(name) is not None


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

    @contextlib.contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the directory's lock (``flock``) inside: what others holding it check and rename in the
        directory does not interleave with what we do (two transfers naming one stream)."""
        fcntl.flock(self.fd, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self.fd, fcntl.LOCK_UN)


class OutputFile(io.FileIO):
    """A file written for ``path``: each write writes all it is given or fails; its errors
    (ENOSPC, EIO, a fifo's reader gone) name ``path``. On standard output (``reader_may_leave``) a reader
    that went away (``| head``) stays a BrokenPipeError, which ends a command quietly."""

    def __init__(self, fd: int, path: str, *, closefd: bool = True, reader_may_leave: bool = False) -> None:
        super().__init__(fd, "wb", closefd=closefd)
        self.path = path
        self._reader_may_leave = reader_may_leave

    def write(self, data: Any) -> int:
        """Write all of ``data``: a short write (a file-size limit, a disk that filled and was freed)
        goes on with the rest, never drops it."""
        view, done = memoryview(data).cast("B"), 0
        try:
            while done < len(view):
                n = super().write(view[done:] if done else view)
                if not n:  # None: a non-blocking descriptor that is full
                    raise e.OutputError(self.path, f"the system took none of the {len(view) - done} bytes left")
                done += n
        except BrokenPipeError:
            if self._reader_may_leave:
                raise
            raise e.OutputError(self.path, "its reader went away (broken pipe)") from None
        except OSError as exc:
            raise e.OutputError(self.path, exc.strerror or str(exc)) from None
        return done

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
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise e.OutputError(path, exc.strerror or str(exc)) from None
    widen(fd)
    return fd


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
        widen(sys.stdout.fileno())
        with io.BufferedWriter(
            OutputFile(sys.stdout.fileno(), "standard output", closefd=False, reader_may_leave=True)
        ) as stdout:
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
