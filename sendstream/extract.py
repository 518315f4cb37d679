"""Apply send streams to a plain directory, in user space (no btrfs needed).

:class:`Extractor` does what ``btrfs receive`` does, command by command and
in stream order, on any Linux file system: the subvolume of a full stream
(SUBVOL) becomes the directory DIR itself, and an incremental stream
(SNAPSHOT) is applied in place onto a DIR that holds the extraction of its
parent. With ``per_subvolume=True`` each subvolume goes to ``DIR/NAME``
instead, as ``btrfs receive DIR`` places it; that is how an input holding
several subvolumes (``btrfs send A B``, with or without ``-e``, or a full
stream and then an incremental of it) is extracted. There an incremental
becomes a new ``DIR/NAME``, as btrfs makes a snapshot: a copy of its parent
(reflinked where the file system can), which is found by the SNAPSHOT's
parent UUID among the subvolumes extracted before it in the input, or among
the clone sources; the parent stays as it was. The copy keeps types, data
and holes, hard links, owners, modes, xattrs, atimes and mtimes, and counts
against ``max_clone_copy`` where it cannot reflink.

Safety: nothing is ever written outside DIR, whatever the stream says.
Every path must be relative and made of plain names (no ``..``, ``.``,
empty or absolute components); every directory on the way is opened
relative to the previous one with ``O_NOFOLLOW | O_DIRECTORY``, so a symlink
anywhere in a path is refused; the last component is acted on with the
``*at`` calls that do not follow symlinks (``renameat``, ``linkat`` without
``AT_SYMLINK_FOLLOW``, ``fchownat``/``utimensat`` with
``AT_SYMLINK_NOFOLLOW``, ``l*xattr``); file data is written only to regular
files opened ``O_PATH | O_NOFOLLOW``, checked, then reopened through
``/proc/self/fd`` (so a fifo or a device node is never opened, and a
symlink never followed). CHMOD of a symlink is refused (chmod follows
symlinks; the kernel never sends it). A clone reads only from DIR or from a
clone-source directory given by the caller, through the same checks.

Errors: every problem raises an :class:`ExtractError` naming the byte
offset, the command index and name, the path and what was expected. All
checks, path resolution and decompression happen before a command changes
anything, so a refused command leaves no trace; only an error of the file
system in the middle of a data command (ENOSPC) can leave that command's
range partly written, as with ``btrfs receive`` (or, per subvolume, the copy
of a SNAPSHOT's parent partly made). Commands before the failing
one stay applied (like ``btrfs receive``, there is no rollback).

Differences from ``btrfs receive``, by design or by necessity:

- no subvolume, no received UUID, no read-only flag: DIR is a plain directory;
- MKFILE refuses an existing name (btrfs-progs ``creat()`` would truncate it,
  or follow a symlink there);
- FILEATTR (inode flags) is ignored, as btrfs-progs 6.2 ignores it;
  UPDATE_EXTENT (``--no-data``) carries no data and is skipped, as there;
- CLONE is a reflink (``FICLONERANGE``) where DIR's file system can, else a
  copy that keeps the source's holes; such copies are bounded: over the
  whole extraction they copy at most ``max_clone_copy`` bytes of data (a
  stream can double a file with each CLONE), and each must fit in the free
  space of DIR's file system, checked before the command writes anything;
- ENCODED_WRITE is always decompressed (zlib, zstd, lzo) and written;
- ENABLE_VERITY is tried with ``FS_IOC_ENABLE_VERITY`` and skipped (reported)
  where the file system refuses;
- when not permitted (not root), device nodes become empty regular files,
  and CHOWN and xattrs the file system refuses (``btrfs.*`` outside btrfs,
  ``trusted.*`` without privilege) are skipped; each skip is reported in
  :attr:`ExtractReport.skipped`;
- a CLONE whose source range starts at or beyond the source's end (``--no-data``
  streams) is skipped with a report, where btrfs receive fails (EINVAL).

Not checked: that DIR (or the directory found) really holds the parent of an
incremental stream, beyond its UUID's name. btrfs
finds the parent by its received UUID; a plain directory has no such record
(keeping one would add a file or an xattr that the subvolume does not have).
Applied to the wrong directory, an incremental fails at the first command
that does not fit, with the commands before it applied. A clone from the
parent snapshot in place needs an untouched copy of the parent
(``clone_sources``), since DIR has changed; per subvolume, the parent is it.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import dataclasses
import errno
import fcntl
import os
import stat
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from types import TracebackType
from typing import Any, BinaryIO
from uuid import UUID

from . import errors as e
from .command import Command
from .compression import MAX_UNENCODED, decompress, lzo1x_decompress
from .decoder import EndOfInput, Restart
from .dump import escape
from .files import file_events
from .paths import Statistics

__all__ = [
    "MAX_CLONE_COPY",
    "SKIPS_KEPT",
    "SKIP_GROUPS_MAX",
    "ApplyError",
    "BadCommand",
    "CloneSourceMissing",
    "ExtractError",
    "ExtractReport",
    "Extractor",
    "SkipGroup",
    "Skipped",
    "UnsafePath",
    "decompress",
    "extract",
    "lzo1x_decompress",
    "parse_clone_from",
    "split_path",
]

NAME_MAX = 255
PATH_MAX = 4096
_OFF_MAX = (1 << 63) - 1
_NSEC = 1_000_000_000

# fallocate(2) modes the kernel sends, and ZERO_RANGE.
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10
_FALLOC_ALLOWED = FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE | FALLOC_FL_ZERO_RANGE

FICLONERANGE = 0x4020940D  # _IOW(0x94, 13, struct file_clone_range)
FS_IOC_ENABLE_VERITY = 0x40806685  # _IOW('f', 133, struct fsverity_enable_arg)

_DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FD_CACHE_MAX = 256
_TRAIL_STEP = 32  # see _Tree
_COPY_CACHE = 64  # for a clone source and each of the two trees of a copy
_SOURCES_OPEN = 8  # clone sources kept open at once
# Skips kept per group, groups kept, and the length of a group's kind (ExtractReport).
SKIPS_KEPT = 3
SKIP_GROUPS_MAX = 64
_SKIP_KIND_MAX = 200
# What clones may copy (data bytes) over a whole extraction where DIR cannot reflink.
MAX_CLONE_COPY = 64 << 30


# --- errors ----------------------------------------------------------------


def _show(raw: bytes) -> str:
    return escape(raw).decode("ascii", "backslashreplace")


class ExtractError(e.SendStreamError):
    """Applying a stream failed at a command; nothing of that command was done.

    Like :class:`sendstream.errors.FormatError` it carries ``offset``,
    ``index``, ``command``, ``expected`` and ``actual``, plus the ``path`` the
    command names and, for an error of the file system, its ``errno``.
    """

    kind = "cannot extract"
    exit_code = e.EXIT_CORRUPT

    def __init__(
        self,
        message: str,
        *,
        offset: int | None = None,
        index: int | None = None,
        command: str | None = None,
        path: bytes | None = None,
        expected: object = None,
        actual: object = None,
        errno: int | None = None,
    ) -> None:
        self.message = message
        self.offset = offset
        self.index = index
        self.command = command
        self.path = path
        self.expected = expected
        self.actual = actual
        self.errno = errno
        super().__init__(message)

    def __str__(self) -> str:
        where = []
        if self.offset is not None:
            where.append(f"offset {self.offset}")
        if self.index is not None:
            where.append(f"command #{self.index}" + (f" ({self.command})" if self.command else ""))
        elif self.command is not None:
            where.append(self.command)
        if self.path is not None:
            where.append(f"path '{_show(self.path)}'")
        text = f"{', '.join(where)}: " if where else ""
        text += f"{self.kind}: {self.message}"
        if self.expected is not None:
            text += f"; expected {self.expected}"
            if self.actual is not None:
                text += f", got {self.actual}"
        return text


class UnsafePath(ExtractError):
    """The stream names a path that leaves DIR or goes through a symlink."""

    kind = "unsafe path"


class BadCommand(ExtractError):
    """A command's values cannot be applied (out of range, bad compressed data,
    a command out of place)."""

    kind = "bad command"


class ApplyError(ExtractError):
    """The file system refused the command (the errno is kept)."""

    kind = "cannot apply"
    exit_code = e.EXIT_IO


class CloneSourceMissing(ExtractError):
    """A CLONE names a subvolume that was not given as a clone source."""

    kind = "clone source not found"
    exit_code = e.EXIT_USAGE


@dataclasses.dataclass(frozen=True, slots=True)
class Skipped:
    """A command (or part of one) not applied, and why; extraction went on."""

    offset: int
    index: int
    command: str
    path: bytes
    reason: str

    def __str__(self) -> str:
        return f"offset {self.offset}, command #{self.index} ({self.command}), path '{_show(self.path)}': {self.reason}"


@dataclasses.dataclass(slots=True)
class Subvolume:
    """A subvolume the input held, and where it went."""

    kind: str  # "subvol" (full) or "snapshot" (incremental)
    path: bytes
    uuid: UUID
    parent_uuid: UUID | None
    directory: str


@dataclasses.dataclass(slots=True)
class SkipGroup:
    """The skips of one command and kind of reason: how many, and the first few."""

    kept: list[Skipped] = dataclasses.field(default_factory=list)
    count: int = 0
    other: bool = False  # every kind past the first SKIP_GROUPS_MAX, together


@dataclasses.dataclass(slots=True)
class ExtractReport:
    """What an extraction did: subvolumes, statistics per stream, skips.

    Skips are counted (``skip_count``) and grouped by command and kind of
    reason (the reason up to its first ':'); ``skipped`` keeps the first
    ``SKIPS_KEPT`` of each group, in order, and past ``SKIP_GROUPS_MAX``
    groups every other kind goes into one more group. So what is kept is
    bounded whatever the input (20 MB of unknown commands are 2 million
    skips); :class:`Extractor`'s ``on_skip`` sees every one.
    """

    subvolumes: list[Subvolume] = dataclasses.field(default_factory=list)
    statistics: Statistics = dataclasses.field(default_factory=Statistics)
    skipped: list[Skipped] = dataclasses.field(default_factory=list)
    skip_count: int = 0
    applied: int = 0
    data_bytes: int = 0  # file bytes written (WRITE, ENCODED_WRITE unencoded) and cloned
    copied_bytes: int = 0  # data bytes copied (clones, copies of parents) where no reflink was possible
    _groups: dict[tuple[str, str], SkipGroup] = dataclasses.field(default_factory=dict, init=False, repr=False)
    _other: SkipGroup = dataclasses.field(default_factory=lambda: SkipGroup(other=True), init=False, repr=False)

    def add_skip(self, skipped: Skipped) -> None:
        """Count one skip, and keep it if it is among the first of its group."""
        self.skip_count += 1
        # The kind can hold stream text (an xattr name, a path): cut, it stays a short key.
        key = (skipped.command, skipped.reason.split(":", 1)[0][:_SKIP_KIND_MAX])
        group = self._groups.get(key)
        if group is None:
            if len(self._groups) < SKIP_GROUPS_MAX:
                group = self._groups[key] = SkipGroup()
            else:
                group = self._other
        group.count += 1
        if len(group.kept) < SKIPS_KEPT:
            group.kept.append(skipped)
            self.skipped.append(skipped)

    def skip_groups(self) -> list[SkipGroup]:
        """The groups of skips in the order of their first skip, the other kinds last."""
        return [*self._groups.values(), *((self._other,) if self._other.count else ())]

    def summary(self) -> str:
        """One line: the subvolumes, commands applied, file bytes, skips."""
        subvolumes = ", ".join(
            f"'{_show(s.path)}' ({'full' if s.kind == 'subvol' else f'incremental on {s.parent_uuid}'}) "
            f"into {s.directory}"
            for s in self.subvolumes
        )
        return (
            f"extracted {subvolumes or 'nothing'}: {self.applied} commands applied, "
            f"{self.data_bytes} bytes of file data written or cloned, "
            f"{self.skip_count} skipped"
        )


def parse_clone_from(values: Iterable[str]) -> tuple[dict[UUID, str], list[str]]:
    """``--clone-from`` values: ``UUID=DIR`` maps one subvolume, a plain ``DIR``
    holds extractions in subdirectories named by UUID. Returns both kinds."""
    sources: dict[UUID, str] = {}
    dirs: list[str] = []
    for value in values:
        head, sep, tail = value.partition("=")
        try:
            key = UUID(head) if sep else None
        except ValueError:
            key = None
        if key is None:
            dirs.append(value)
        else:
            sources[key] = tail
    return sources, dirs


# --- paths -----------------------------------------------------------------


def split_path(raw: bytes, *, what: str = "path") -> tuple[bytes, ...]:
    """The components of a stream path; ``()`` for the subvolume root (``b""``).

    Raises :class:`UnsafePath` for an absolute path, a NUL, or an empty,
    ``.`` or ``..`` component.
    """
    if not raw:
        return ()
    expected = "a relative path of plain names (no '/', '.', '..' or empty components)"
    if raw.startswith(b"/"):
        raise UnsafePath(f"the {what} is absolute", expected=expected)
    if b"\0" in raw:
        raise UnsafePath(f"the {what} holds a NUL byte", expected=expected)
    if len(raw) >= PATH_MAX:
        raise UnsafePath(f"the {what} is {len(raw)} bytes long", expected=f"less than {PATH_MAX}")
    parts = tuple(raw.split(b"/"))
    for part in parts:
        if part in (b"", b".", b".."):
            shown = "an empty" if not part else f"a '{part.decode()}'"
            raise UnsafePath(f"the {what} has {shown} component", expected=expected)
        if len(part) > NAME_MAX:
            raise UnsafePath(f"a component of the {what} is {len(part)} bytes long", expected=f"at most {NAME_MAX}")
    return parts


def _proc(fd: int, name: bytes | None = None) -> bytes:
    """The /proc/self/fd path of ``fd`` (and ``name`` in it, for the l* calls)."""
    base = b"/proc/self/fd/%d" % fd
    return base if name is None else base + b"/" + name


class _CachedDir:
    """A cached directory fd and the cached directories in it (a trie node)."""

    __slots__ = ("children", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.children: dict[bytes, _CachedDir] = {}


class _Tree:
    """A directory opened once; paths below it resolved without following symlinks.

    Directory fds of resolved parents are cached in a trie of components, so
    every cached directory's ancestors are cached too and a lookup costs one
    step per component, whatever the depth. At most ``cache`` are cached;
    past that, directories are opened one by one, and of the last path
    resolved so (the trail) every ``_TRAIL_STEP``-th directory and the last
    one stay open: a lookup on or below that path starts from them, so a
    deep chain costs one open per command, and a walk back up at most
    ``_TRAIL_STEP`` per directory. Entries are dropped by :meth:`forget_under`
    (after anything that moves or removes directories); fds handed out are
    closed by :meth:`trim`, which runs between commands, never during one, so
    an fd a command holds stays valid until it is done.
    """

    def __init__(self, fd: int, label: str, cache: int = _FD_CACHE_MAX) -> None:
        self.fd = fd
        self.label = label
        self._cache = cache
        self._root = _CachedDir(fd)
        self._cached = 0
        self._trail_parts: tuple[bytes, ...] = ()
        self._trail: list[tuple[int, int]] = []  # (depth, fd) along _trail_parts, deepest last
        self._loose: list[int] = []  # no longer cached or on the trail, maybe still in use

    def forget(self) -> None:
        self._forget_cached()
        self._cut_trail(0)
        self.trim()

    def _forget_cached(self) -> None:
        self._close_subtrees(list(self._root.children.values()))
        self._root.children.clear()

    def _close_subtrees(self, stack: list[_CachedDir]) -> None:
        while stack:
            node = stack.pop()
            os.close(node.fd)
            self._cached -= 1
            stack.extend(node.children.values())

    def _cut_trail(self, depth: int) -> None:
        """Drop the trail's directories deeper than ``depth``."""
        while self._trail and self._trail[-1][0] > depth:
            self._loose.append(self._trail.pop()[1])  # the command may still use it
        self._trail_parts = self._trail_parts[: self._trail[-1][0]] if self._trail else ()

    def forget_under(self, parts: tuple[bytes, ...]) -> None:
        """Forget the directories at ``parts`` and below (it was moved or removed)."""
        if parts and self._trail_parts[: len(parts)] == parts:
            self._cut_trail(len(parts) - 1)
        node = self._root
        for name in parts[:-1]:
            child = node.children.get(name)
            if child is None:
                return
            node = child
        gone = node.children.pop(parts[-1], None) if parts else None
        if gone is not None:
            self._close_subtrees([gone])

    def trim(self) -> None:
        while self._loose:
            os.close(self._loose.pop())
        if self._cached >= self._cache:
            self._forget_cached()

    def close(self) -> None:
        self.forget()
        os.close(self.fd)

    def directory(self, parts: tuple[bytes, ...]) -> int:
        """The fd of the directory ``parts`` (borrowed: valid until :meth:`trim`)."""
        node = self._root
        known = 0  # components resolved without opening anything
        for name in parts:
            child = node.children.get(name)
            if child is None:
                break
            node = child
            known += 1
        fd = node.fd
        if known == len(parts):
            return fd
        trail_parts = self._trail_parts
        common = min(len(parts), len(trail_parts))  # components shared with the trail
        if parts[:common] != trail_parts[:common]:
            common = next(i for i, (a, b) in enumerate(zip(parts, trail_parts, strict=False)) if a != b)
        caching = True
        for depth, trail_fd in reversed(self._trail):
            if depth <= common:
                if depth > known:
                    known, fd, caching = depth, trail_fd, False
                break
        owned = False  # fd is an intermediate one, ours to close
        on_trail = False  # the trail follows parts (after its first new directory)
        for depth in range(known, len(parts)):
            try:
                new = self._open(fd, parts, depth)
            finally:
                if owned:
                    os.close(fd)
            if caching and self._cached < self._cache:
                child = _CachedDir(new)
                node.children[parts[depth]] = child
                node = child
                self._cached += 1
            elif (depth + 1) % _TRAIL_STEP and depth + 1 < len(parts):
                caching, owned = False, True
            else:
                if not on_trail:  # what the trail has beyond the shared part is another path
                    self._cut_trail(common)
                    on_trail = True
                if self._trail and self._trail[-1][0] % _TRAIL_STEP:  # the last is the last no more
                    self._loose.append(self._trail.pop()[1])
                caching, owned = False, False
                self._trail.append((depth + 1, new))
                self._trail_parts = parts[: depth + 1]
            fd = new
        return fd

    def _open(self, parent: int, parts: tuple[bytes, ...], depth: int) -> int:
        """Open the directory ``parts[depth]`` in ``parent`` (which is ``parts[:depth]``)."""
        name = parts[depth]
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            shown = _show(b"/".join(parts[: depth + 1]))
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                with contextlib.suppress(OSError):
                    if stat.S_ISLNK(os.stat(name, dir_fd=parent, follow_symlinks=False).st_mode):
                        raise UnsafePath(
                            f"'{shown}' in {self.label} is a symlink",
                            expected="a directory (symlinks are never followed)",
                        ) from None
                raise ApplyError(f"'{shown}' in {self.label} is not a directory", errno=errno.ENOTDIR) from None
            raise ApplyError(
                f"cannot open directory '{shown}' in {self.label}: {exc.strerror}", errno=exc.errno
            ) from None

    def open_regular(self, parts: tuple[bytes, ...], flags: int, what: str) -> int:
        """An fd of the regular file at ``parts`` opened with ``flags``.

        The file is first opened ``O_PATH | O_NOFOLLOW`` and checked, then
        reopened through /proc: a symlink is never followed and a fifo or a
        device node never opened.
        """
        if not parts:
            raise BadCommand(f"the subvolume root is not a regular file ({what})", expected="a file path")
        parent = self.directory(parts[:-1])
        try:
            pfd = os.open(parts[-1], os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=parent)
        except OSError as exc:
            raise ApplyError(f"cannot open {what}: {exc.strerror}", errno=exc.errno) from None
        try:
            st = os.fstat(pfd)
            if stat.S_ISLNK(st.st_mode):
                raise UnsafePath(f"the {what} is a symlink", expected="a regular file (symlinks are never followed)")
            if not stat.S_ISREG(st.st_mode):
                raise BadCommand(
                    f"the {what} is not a regular file", expected="a regular file", actual=_kind(st.st_mode)
                )
            try:
                # no O_NOFOLLOW here: the /proc link is the way to the very inode checked
                fd = os.open(_proc(pfd), flags | os.O_CLOEXEC | os.O_NOCTTY)
            except OSError as exc:
                if exc.errno == errno.EPERM and flags & os.O_NOATIME:
                    fd = os.open(_proc(pfd), (flags & ~os.O_NOATIME) | os.O_CLOEXEC | os.O_NOCTTY)
                else:
                    raise ApplyError(f"cannot open {what}: {exc.strerror}", errno=exc.errno) from None
        finally:
            os.close(pfd)
        again = os.fstat(fd)
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino):  # pragma: no cover - needs a race
            os.close(fd)
            raise UnsafePath(f"the {what} changed while it was opened", expected="no concurrent changes in DIR")
        return fd


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "directory"),
        (stat.S_ISLNK, "symlink"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISFIFO, "fifo"),
        (stat.S_ISSOCK, "socket"),
        (stat.S_ISREG, "regular file"),
    ):
        if test(mode):
            return name
    return f"mode {mode:o}"


# --- system calls Python does not wrap ---------------------------------------

_libc: Any = None


def _fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if _libc.fallocate(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _enable_verity(fd: int, algorithm: int, block_size: int, salt: bytes, sig: bytes) -> None:
    salt_buf = ctypes.create_string_buffer(salt, len(salt) or 1)
    sig_buf = ctypes.create_string_buffer(sig, len(sig) or 1)
    arg = struct.pack(
        "<IIIIQIIQ88x",
        1,
        algorithm,
        block_size,
        len(salt),
        ctypes.addressof(salt_buf) if salt else 0,
        len(sig),
        0,
        ctypes.addressof(sig_buf) if sig else 0,
    )
    fcntl.ioctl(fd, FS_IOC_ENABLE_VERITY, arg)


# --- the extractor -----------------------------------------------------------

_DATA_COMMANDS = frozenset({"write", "encoded_write", "clone", "truncate", "fallocate", "update_extent"})


class Extractor:
    """Applies the commands of send streams to the directory ``dest``.

    Feed it every event of the input (:meth:`event`) in order, then
    :meth:`close` (or use it as a context manager). ``clone_sources`` maps
    the UUID of a clone-source subvolume to the directory holding its
    extraction; each directory of ``clone_dirs`` may hold such extractions
    in subdirectories named by UUID (``DIR/9db24a68-fcc1-...``). The
    subvolume being extracted is its own clone source. Where the file system
    cannot reflink, clones copy at most ``max_clone_copy`` bytes of data in
    all (:class:`sendstream.errors.LimitExceeded` past it). ``on_skip`` is
    called for every :class:`Skipped` as it happens.
    """

    def __init__(
        self,
        dest: str | os.PathLike[str],
        *,
        clone_sources: Mapping[UUID, str | os.PathLike[str]] | None = None,
        clone_dirs: Sequence[str | os.PathLike[str]] = (),
        per_subvolume: bool = False,
        max_unencoded: int = MAX_UNENCODED,
        max_clone_copy: int = MAX_CLONE_COPY,
        on_skip: Callable[[Skipped], None] | None = None,
    ) -> None:
        self.dest = os.fspath(dest)
        self.per_subvolume = per_subvolume
        self.max_unencoded = max_unencoded
        self.max_clone_copy = max_clone_copy
        self.report = ExtractReport()
        self._on_skip = on_skip
        self._clone_sources = {u: os.fspath(p) for u, p in (clone_sources or {}).items()}
        self._clone_dirs = [os.fspath(d) for d in clone_dirs]
        self._sources: dict[UUID, _Tree] = {}  # open clone sources, the most recently used last
        self._extracted: dict[UUID, Subvolume] = {}  # per subvolume: the last extracted of each UUID
        self._dest_fd = os.open(self.dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._tree: _Tree | None = None  # the current subvolume
        self._root_fd = -1  # an O_RDONLY fd of its root (for f* calls)
        self._subvolume: Subvolume | None = None
        self._writing: tuple[tuple[bytes, ...], int] | None = None
        self._handlers: dict[str, Callable[[Command], None]] = {
            "subvol": self._subvol,
            "snapshot": self._snapshot,
            "mkfile": self._mkfile,
            "mkdir": self._mkdir,
            "mknod": self._mknod,
            "mkfifo": self._mkfifo,
            "mksock": self._mksock,
            "symlink": self._symlink,
            "rename": self._rename,
            "link": self._link,
            "unlink": self._unlink,
            "rmdir": self._rmdir,
            "set_xattr": self._set_xattr,
            "remove_xattr": self._remove_xattr,
            "write": self._write,
            "clone": self._clone,
            "truncate": self._truncate,
            "chmod": self._chmod,
            "chown": self._chown,
            "utimes": self._utimes,
            "end": self._end,
            "update_extent": self._update_extent,
            "fallocate": self._fallocate,
            "fileattr": self._fileattr,
            "encoded_write": self._encoded_write,
            "enable_verity": self._enable_verity,
        }
        self._cmd: Command | None = None

    # -- lifecycle --

    def __enter__(self) -> Extractor:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close every file descriptor (the extraction itself stays)."""
        self._close_subvolume()
        for tree in self._sources.values():
            tree.close()
        self._sources.clear()
        if self._dest_fd >= 0:
            os.close(self._dest_fd)
            self._dest_fd = -1

    def _close_subvolume(self) -> None:
        self._stop_writing()
        if self._tree is not None:
            self._tree.close()
            self._tree = None
        if self._root_fd >= 0:
            os.close(self._root_fd)
            self._root_fd = -1
        self._subvolume = None

    # -- events --

    def event(self, event: Any) -> None:
        """Apply one event of :func:`sendstream.files.file_events` (or a Decoder)."""
        self.report.statistics.feed(event)
        if isinstance(event, Command):
            self.apply(event)
        elif isinstance(event, Restart):
            raise BadCommand(
                f"the send restarted here after {event.commands} commands (`sendstream repair` fixes the stream)",
                offset=event.offset,
            )
        elif isinstance(event, EndOfInput) and self._subvolume is not None:
            raise BadCommand("the input ended before END", offset=event.offset, expected="an END command")

    def apply(self, command: Command) -> None:
        """Apply one command; on any problem raise an :class:`ExtractError` for it."""
        self._cmd = command
        path = None
        try:
            if command.attributes is None:
                self._skip(b"", f"unknown command number {command.cmd}: ignored, as btrfs receive does")
                return
            path = command.get("path", None)
            handler = self._handlers.get(command.name)
            if handler is None:  # pragma: no cover - every known command has one
                self._skip(b"", "no handler")
                return
            if command.name not in _DATA_COMMANDS:
                self._stop_writing()
            for tree in (self._tree, *self._sources.values()):
                if tree is not None:
                    tree.trim()
            if command.name not in ("subvol", "snapshot") and self._tree is None:
                raise BadCommand(
                    "a command outside a subvolume", expected="SUBVOL or SNAPSHOT first (and nothing after END)"
                )
            handler(command)
            self.report.applied += 1
        except ExtractError as exc:
            self._stop_writing()
            _locate(exc, command, path)
            raise
        except e.LimitExceeded:
            self._stop_writing()
            raise
        except KeyError as exc:
            self._stop_writing()
            raise BadCommand(
                f"attribute {exc.args[0]} is missing",
                offset=command.offset,
                index=command.index,
                command=command.name,
                path=path,
                expected=f"attribute {exc.args[0]}",
            ) from None
        except (OverflowError, ValueError) as exc:  # a value the system calls cannot take
            self._stop_writing()
            raise BadCommand(
                f"{command.name}: {exc}",
                offset=command.offset,
                index=command.index,
                command=command.name,
                path=path,
            ) from None
        except OSError as exc:
            self._stop_writing()
            raise ApplyError(
                f"{command.name}: {exc.strerror or exc}",
                offset=command.offset,
                index=command.index,
                command=command.name,
                path=path,
                errno=exc.errno,
            ) from exc
        finally:
            self._cmd = None

    def _skip(self, path: bytes, reason: str) -> None:
        cmd = self._cmd
        assert cmd is not None
        skipped = Skipped(cmd.offset, cmd.index, cmd.name, path, reason)
        self.report.add_skip(skipped)
        if self._on_skip is not None:
            self._on_skip(skipped)

    # -- helpers --

    @property
    def tree(self) -> _Tree:
        assert self._tree is not None
        return self._tree

    def _parts(self, cmd: Command, key: str = "path", *, root_ok: bool = True) -> tuple[bytes, ...]:
        parts = split_path(bytes(cmd.get(key)), what=key.replace("_", " "))
        if not parts and not root_ok:
            raise BadCommand(f"{cmd.name} of the subvolume root", expected=f"a non-empty {key.replace('_', ' ')}")
        return parts

    def _parent(self, parts: tuple[bytes, ...]) -> tuple[int, bytes]:
        return self.tree.directory(parts[:-1]), parts[-1]

    def _stop_writing(self) -> None:
        if self._writing is not None:
            os.close(self._writing[1])
            self._writing = None

    def _writable(self, parts: tuple[bytes, ...]) -> int:
        """The open write fd of the regular file ``parts`` (kept across data commands)."""
        if self._writing is not None and self._writing[0] == parts:
            return self._writing[1]
        self._stop_writing()
        fd = self.tree.open_regular(parts, os.O_WRONLY | os.O_NONBLOCK, "file to write")
        self._writing = (parts, fd)
        return fd

    @staticmethod
    def _u63(cmd: Command, *keys: str) -> list[int]:
        values = [int(cmd.get(k)) for k in keys]
        for k, v in zip(keys, values, strict=True):
            if v > _OFF_MAX:
                raise BadCommand(f"{k} {v} is out of range", expected=f"at most {_OFF_MAX}")
        if sum(values) > _OFF_MAX:
            raise BadCommand(f"{' + '.join(keys)} is out of range", expected=f"at most {_OFF_MAX}")
        return values

    # -- subvolumes --

    def _begin(self, cmd: Command, kind: str) -> None:
        if self.report.subvolumes and not self.per_subvolume:
            raise BadCommand(
                "the input holds several subvolumes",
                expected="one subvolume, or per_subvolume=True (--per-subvolume) to put each in DIR/NAME",
            )
        self._close_subvolume()
        name = bytes(cmd.get("path"))
        if self.per_subvolume:
            parts = split_path(name, what="subvolume name")
            if len(parts) != 1:
                raise UnsafePath("the subvolume name is not a single name", expected="one path component")
            if kind == "subvol":
                os.mkdir(parts[0], 0o700, dir_fd=self._dest_fd)
            else:
                self._copy_parent(cmd, parts[0])
            root = os.open(parts[0], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=self._dest_fd)
            directory = os.path.join(self.dest, os.fsdecode(parts[0]))
        else:
            root = os.dup(self._dest_fd)
            directory = self.dest
        try:
            empty = _is_empty(root)
            if kind == "subvol" and not empty:
                raise BadCommand(
                    f"{directory!r} is not empty", expected="an empty directory for a full stream (SUBVOL)"
                )
            if kind == "snapshot" and empty and not self.per_subvolume:
                raise BadCommand(
                    f"{directory!r} is empty",
                    expected=f"the extraction of the parent subvolume {cmd.get('clone_uuid')} (incremental stream)",
                )
            tree_fd = os.open(".", _DIR_FLAGS, dir_fd=root)
        except BaseException:
            os.close(root)
            raise
        self._root_fd = root
        self._tree = _Tree(tree_fd, f"subvolume {name.decode(errors='backslashreplace')}")
        self._subvolume = Subvolume(
            kind, name, cmd.get("uuid"), cmd.get("clone_uuid") if kind == "snapshot" else None, directory
        )
        self.report.subvolumes.append(self._subvolume)
        if self.per_subvolume:
            self._extracted[self._subvolume.uuid] = self._subvolume

    def _subvol(self, cmd: Command) -> None:
        self._begin(cmd, "subvol")

    def _snapshot(self, cmd: Command) -> None:
        self._begin(cmd, "snapshot")

    def _end(self, cmd: Command) -> None:
        self._close_subvolume()

    # -- names --

    def _create(self, cmd: Command, make: Callable[[int, bytes], None]) -> None:
        dirfd, name = self._parent(self._parts(cmd, root_ok=False))
        make(dirfd, name)

    def _mkfile(self, cmd: Command) -> None:
        def make(dirfd: int, name: bytes) -> None:
            # O_EXCL: never truncate an existing file, never follow a symlink there.
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open(name, flags, 0o600, dir_fd=dirfd))

        self._create(cmd, make)

    def _mkdir(self, cmd: Command) -> None:
        self._create(cmd, lambda dirfd, name: os.mkdir(name, 0o700, dir_fd=dirfd))

    def _mknod(self, cmd: Command) -> None:
        mode = int(cmd.get("mode"))
        rdev = int(cmd.get("rdev"))
        kind = stat.S_IFMT(mode)
        if kind not in (stat.S_IFCHR, stat.S_IFBLK, stat.S_IFIFO, stat.S_IFSOCK):
            raise BadCommand(f"mknod of a {_kind(mode)}", expected="a device, fifo or socket", actual=f"mode {mode:o}")
        parts = self._parts(cmd, root_ok=False)

        def make(dirfd: int, name: bytes) -> None:
            try:
                # RDEV is the kernel's new_encode_dev(), which is glibc's dev_t for
                # majors below 4096 and minors below 2**20; btrfs-progs passes it on as is.
                os.mknod(name, kind, rdev, dir_fd=dirfd)
            except PermissionError:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                os.close(os.open(name, flags, 0o600, dir_fd=dirfd))
                self._skip(
                    bytes(cmd.get("path")),
                    f"not permitted to make a {_kind(mode)} ({os.major(rdev)}, {os.minor(rdev)}): "
                    "made an empty regular file in its place",
                )

        dirfd, name = self._parent(parts)
        make(dirfd, name)

    def _mkfifo(self, cmd: Command) -> None:
        self._create(cmd, lambda dirfd, name: os.mkfifo(name, 0o600, dir_fd=dirfd))

    def _mksock(self, cmd: Command) -> None:
        self._create(cmd, lambda dirfd, name: os.mknod(name, stat.S_IFSOCK | 0o600, 0, dir_fd=dirfd))

    def _symlink(self, cmd: Command) -> None:
        target = bytes(cmd.get("path_link"))
        if not target or b"\0" in target or len(target) >= PATH_MAX:
            raise BadCommand("bad symlink target", expected=f"1 to {PATH_MAX - 1} bytes without NUL")
        self._create(cmd, lambda dirfd, name: os.symlink(target, name, dir_fd=dirfd))

    def _rename(self, cmd: Command) -> None:
        src = self._parts(cmd, root_ok=False)
        dst = self._parts(cmd, "path_to", root_ok=False)
        sfd, sname = self._parent(src)
        dfd, dname = self._parent(dst)
        try:
            os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
        finally:  # what was at either path (and below) is not there any more
            self.tree.forget_under(src)
            self.tree.forget_under(dst)

    def _link(self, cmd: Command) -> None:
        new = self._parts(cmd, root_ok=False)
        old = self._parts(cmd, "path_link", root_ok=False)
        ofd, oname = self._parent(old)
        nfd, nname = self._parent(new)
        os.link(oname, nname, src_dir_fd=ofd, dst_dir_fd=nfd, follow_symlinks=False)

    def _unlink(self, cmd: Command) -> None:
        dirfd, name = self._parent(self._parts(cmd, root_ok=False))
        os.unlink(name, dir_fd=dirfd)

    def _rmdir(self, cmd: Command) -> None:
        parts = self._parts(cmd, root_ok=False)
        dirfd, name = self._parent(parts)
        try:
            os.rmdir(name, dir_fd=dirfd)
        finally:
            self.tree.forget_under(parts)

    # -- metadata --

    def _xattr_target(self, parts: tuple[bytes, ...]) -> int | bytes:
        if not parts:
            return self._root_fd
        dirfd, name = self._parent(parts)
        return _proc(dirfd, name)

    @staticmethod
    def _xattr_name(cmd: Command) -> bytes:
        name = bytes(cmd.get("xattr_name"))
        if not name or b"\0" in name or len(name) > NAME_MAX:
            raise BadCommand("bad xattr name", expected=f"1 to {NAME_MAX} bytes without NUL")
        return name

    def _set_xattr(self, cmd: Command) -> None:
        parts = self._parts(cmd)
        name = self._xattr_name(cmd)
        value = bytes(cmd.get("xattr_data"))
        target = self._xattr_target(parts)
        try:
            if isinstance(target, int):
                os.setxattr(target, name, value)
            else:
                os.setxattr(target, name, value, follow_symlinks=False)
        except OSError as exc:
            self._xattr_refused(cmd, exc, name)

    def _remove_xattr(self, cmd: Command) -> None:
        parts = self._parts(cmd)
        name = self._xattr_name(cmd)
        target = self._xattr_target(parts)
        try:
            if isinstance(target, int):
                os.removexattr(target, name)
            else:
                os.removexattr(target, name, follow_symlinks=False)
        except OSError as exc:
            self._xattr_refused(cmd, exc, name)

    def _xattr_refused(self, cmd: Command, exc: OSError, name: bytes) -> None:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM):
            self._skip(bytes(cmd.get("path")), f"xattr {_show(name)}: {exc.strerror}")
            return
        raise exc

    def _chmod(self, cmd: Command) -> None:
        parts = self._parts(cmd)
        mode = int(cmd.get("mode")) & 0o7777
        if not parts:
            os.fchmod(self._root_fd, mode)
            return
        dirfd, name = self._parent(parts)
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
        try:
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise UnsafePath("chmod of a symlink (it would change the symlink's target)", expected="no symlink")
            os.chmod(_proc(fd), mode)
        finally:
            os.close(fd)

    def _chown(self, cmd: Command) -> None:
        parts = self._parts(cmd)
        uid, gid = int(cmd.get("uid")), int(cmd.get("gid"))
        if uid >= 0xFFFFFFFF or gid >= 0xFFFFFFFF:
            raise BadCommand("uid or gid out of range", expected="below 4294967295", actual=f"{uid}:{gid}")
        try:
            if not parts:
                os.fchown(self._root_fd, uid, gid)
            else:
                dirfd, name = self._parent(parts)
                os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)
        except PermissionError as exc:
            if os.geteuid() == 0:
                raise
            self._skip(bytes(cmd.get("path")), f"chown to {uid}:{gid}: {exc.strerror} (not root)")

    def _utimes(self, cmd: Command) -> None:
        parts = self._parts(cmd)
        times = []
        for key in ("atime", "mtime"):
            ts = cmd.get(key)
            if not 0 <= ts.nsec < _NSEC:
                raise BadCommand(f"{key} nanoseconds out of range", expected=f"below {_NSEC}", actual=ts.nsec)
            times.append(ts.sec * _NSEC + ts.nsec)
        ns = (times[0], times[1])
        if not parts:
            os.utime(self._root_fd, ns=ns)
        else:
            dirfd, name = self._parent(parts)
            os.utime(name, ns=ns, dir_fd=dirfd, follow_symlinks=False)

    def _fileattr(self, cmd: Command) -> None:
        self._parts(cmd)
        self._skip(
            bytes(cmd.get("path")), f"fileattr 0x{int(cmd.get('fileattr')):x}: ignored, as btrfs receive 6.2 does"
        )

    def _enable_verity(self, cmd: Command) -> None:
        parts = self._parts(cmd, root_ok=False)
        fd = self.tree.open_regular(parts, os.O_RDONLY, "file to protect")
        try:
            _enable_verity(
                fd,
                int(cmd.get("verity_algorithm")),
                int(cmd.get("verity_block_size")),
                bytes(cmd.get("verity_salt_data")),
                bytes(cmd.get("verity_sig_data")),
            )
        except OSError as exc:
            self._skip(bytes(cmd.get("path")), f"enable_verity: {exc.strerror or exc}")
        finally:
            os.close(fd)

    # -- data --

    def _write(self, cmd: Command) -> None:
        parts = self._parts(cmd, root_ok=False)
        data = cmd.get("data")
        (offset,) = self._u63(cmd, "file_offset")
        if offset + len(data) > _OFF_MAX:
            raise BadCommand("the write ends beyond the largest file offset")
        _pwrite_all(self._writable(parts), memoryview(data), offset)
        self.report.data_bytes += len(data)

    def _encoded_write(self, cmd: Command) -> None:
        parts = self._parts(cmd, root_ok=False)
        offset, file_len = self._u63(cmd, "file_offset", "unencoded_file_len")
        unencoded_len = int(cmd.get("unencoded_len"))
        unencoded_offset = int(cmd.get("unencoded_offset"))
        compression = int(cmd.get("compression", 0))
        encryption = int(cmd.get("encryption", 0))
        if encryption:
            raise BadCommand("encrypted data is not supported", expected="encryption 0", actual=encryption)
        if unencoded_len > self.max_unencoded:
            raise BadCommand(
                f"unencoded_len {unencoded_len} is over the limit", expected=f"at most {self.max_unencoded}"
            )
        if unencoded_offset + file_len > unencoded_len:
            raise BadCommand(
                "unencoded_offset + unencoded_file_len is beyond unencoded_len",
                expected=f"at most {unencoded_len}",
                actual=unencoded_offset + file_len,
            )
        try:
            plain = decompress(compression, cmd.get("data"), unencoded_len)
        except (ValueError, ImportError) as exc:
            raise BadCommand(f"cannot decompress: {exc}", expected="valid compressed data") from None
        fd = self._writable(parts)
        _pwrite_all(fd, memoryview(plain)[unencoded_offset : unencoded_offset + file_len], offset)
        self.report.data_bytes += file_len

    def _truncate(self, cmd: Command) -> None:
        parts = self._parts(cmd, root_ok=False)
        (size,) = self._u63(cmd, "size")
        os.ftruncate(self._writable(parts), size)

    def _fallocate(self, cmd: Command) -> None:
        parts = self._parts(cmd, root_ok=False)
        mode = int(cmd.get("fallocate_mode"))
        offset, size = self._u63(cmd, "file_offset", "size")
        if mode & ~_FALLOC_ALLOWED:
            raise BadCommand(f"fallocate mode 0x{mode:x}", expected="KEEP_SIZE, PUNCH_HOLE or ZERO_RANGE flags")
        fd = self._writable(parts)
        # ext4 keeps what it allocated before ENOSPC: 40 bytes of stream would fill the disk.
        if not mode & FALLOC_FL_PUNCH_HOLE and size > (free := _free_space(fd)):
            raise ApplyError(
                f"fallocate of {size} bytes does not fit in the free space of the file system ({free} bytes)",
                errno=errno.ENOSPC,
            )
        _fallocate(fd, mode, offset, size)

    def _update_extent(self, cmd: Command) -> None:
        self._parts(cmd, root_ok=False)
        self._skip(bytes(cmd.get("path")), "no file data in the stream (btrfs send --no-data)")

    def _find_extraction(self, uuid: UUID) -> tuple[int, str] | None:
        """An O_PATH fd and the place of an extraction of subvolume ``uuid`` other than
        the current one: extracted before in this input (DIR/NAME, per subvolume),
        or given as a clone source. None when there is none."""
        sub = self._extracted.get(uuid)
        if sub is not None and sub is not self._subvolume:
            return os.open(sub.path, _DIR_FLAGS, dir_fd=self._dest_fd), sub.directory
        where = self._clone_sources.get(uuid)
        if where is not None:
            return os.open(where, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC), where
        for d in self._clone_dirs:
            base = os.open(d, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                return os.open(str(uuid), _DIR_FLAGS, dir_fd=base), os.path.join(d, str(uuid))
            except FileNotFoundError:
                continue
            finally:
                os.close(base)
        return None

    @staticmethod
    def _hint(uuid: UUID) -> str:
        return f"--clone-from {uuid}=DIR, or a --clone-from DIR holding a directory named {uuid}"

    def _clone_tree(self, clone_uuid: UUID, clone_path: bytes) -> _Tree:
        sub = self._subvolume
        assert sub is not None
        if clone_uuid == sub.uuid:
            return self.tree
        tree = self._sources.pop(clone_uuid, None)
        if tree is not None:
            self._sources[clone_uuid] = tree  # the most recently used last
            return tree
        found = self._find_extraction(clone_uuid)
        if found is None:
            if clone_uuid == sub.parent_uuid and not self.per_subvolume:
                raise CloneSourceMissing(
                    f"the clone source is the parent snapshot {clone_uuid} (path '{_show(clone_path)}'), which "
                    "the extraction has changed in place",
                    expected=f"an untouched extraction of the parent: {self._hint(clone_uuid)}",
                )
            raise CloneSourceMissing(
                f"subvolume {clone_uuid} (path '{_show(clone_path)}') was not given", expected=self._hint(clone_uuid)
            )
        fd, where = found
        if len(self._sources) >= _SOURCES_OPEN:  # each keeps fds: close the least recently used
            self._sources.pop(next(iter(self._sources))).close()
        tree = self._sources[clone_uuid] = _Tree(fd, f"clone source {where}", _COPY_CACHE)
        return tree

    def _clone(self, cmd: Command) -> None:
        parts = self._parts(cmd, root_ok=False)
        src_parts = self._parts(cmd, "clone_path", root_ok=False)
        offset, length, src_offset = self._u63(cmd, "file_offset", "clone_len", "clone_offset")
        if src_offset + length > _OFF_MAX or offset + length > _OFF_MAX:
            raise BadCommand("the clone range is out of range", expected=f"offsets at most {_OFF_MAX}")
        tree = self._clone_tree(cmd.get("clone_uuid"), bytes(cmd.get("clone_path")))
        src = tree.open_regular(src_parts, os.O_RDONLY | os.O_NOATIME | os.O_NONBLOCK, "clone source")
        try:
            dst = self._writable(parts)
            sst, dstat = os.fstat(src), os.fstat(dst)
            size = sst.st_size
            if src_offset >= size:
                # The kernel refuses this (EINVAL, and btrfs receive stops); it happens in
                # --no-data streams, whose files have no size: extract what can be.
                self._skip(
                    bytes(cmd.get("path")),
                    f"clone source '{_show(bytes(cmd.get('clone_path')))}' is {size} bytes long, the range starts "
                    f"at {src_offset}: nothing to clone (btrfs receive fails here)",
                )
                return
            # As the kernel's remap checks: the range is cut at the source's end (0: up to it).
            length = size - src_offset if length == 0 else min(length, size - src_offset)
            if (sst.st_dev, sst.st_ino) == (dstat.st_dev, dstat.st_ino) and (
                src_offset < offset + length and offset < src_offset + length
            ):
                raise BadCommand("the clone range overlaps its source in the same file", expected="separate ranges")
            if not _reflink(src, src_offset, length, dst, offset):
                need = sum(end - start for start, end in _data_ranges(src, src_offset, src_offset + length))
                self._allow_copy(need, f"the clone of {length} bytes into '{_show(b'/'.join(parts))}'", dst)
                self.report.copied_bytes += _copy_range(src, src_offset, length, dst, offset)
            self.report.data_bytes += length
        finally:
            os.close(src)

    def _allow_copy(self, need: int, what: str, fd: int) -> None:
        """Refuse a copy of ``need`` bytes of data (``what``, into the file system of ``fd``)
        past the copy budget (``max_clone_copy``) or the free space; before it writes."""
        used = self.report.copied_bytes
        if need > self.max_clone_copy - used:
            cmd = self._cmd
            assert cmd is not None
            raise e.LimitExceeded(
                f"{what} would copy {need} bytes of data (this file system cannot reflink), and copies "
                f"have taken {used} bytes already",
                limit=self.max_clone_copy,
                option="--max-clone-copy",
                offset=cmd.offset,
                index=cmd.index,
                command=cmd.name,
            )
        free = _free_space(fd)
        if need > free:
            raise ApplyError(
                f"{what} would copy {need} bytes of data (this file system cannot reflink), which does not "
                f"fit in the free space of the file system ({free} bytes)",
                errno=errno.ENOSPC,
            )

    def _copy_parent(self, cmd: Command, name: bytes) -> None:
        """Make DIR/``name`` a copy of the extraction of the SNAPSHOT's parent, as
        ``btrfs receive`` snapshots it; the parent stays as it was."""
        parent = cmd.get("clone_uuid")
        found = self._find_extraction(parent)
        if found is None:
            raise CloneSourceMissing(
                f"the parent {parent} of the incremental stream of '{_show(name)}' was not extracted before it "
                "in this input, nor given",
                expected=f"its extraction: {self._hint(parent)}",
            )
        fd, where = found
        source = _Tree(fd, f"parent {where}", _COPY_CACHE)
        # a parent extracted in DIR is ours to keep as it was; a --clone-from source is only read
        ours = parent in self._extracted
        try:
            if _holds(fd, self._dest_fd):
                raise BadCommand(f"the parent's extraction {where} holds DIR", expected="a directory outside DIR")
            need, sample = _data_size(source)
            if sample is not None and not _can_reflink(source, sample, self._dest_fd):
                self._allow_copy(need, f"the copy of the parent {parent} ({where})", self._dest_fd)
            os.mkdir(name, 0o700, dir_fd=self._dest_fd)
            copy = _Tree(os.open(name, _DIR_FLAGS, dir_fd=self._dest_fd), f"subvolume {_show(name)}", _COPY_CACHE)
            try:
                self.report.copied_bytes += _copy_tree(source, copy, self._skip, restore_atimes=ours)
            finally:
                copy.close()
        finally:
            source.close()


def _locate(exc: ExtractError, cmd: Command, path: Any) -> None:
    if exc.offset is None:
        exc.offset = cmd.offset
    if exc.index is None:
        exc.index = cmd.index
    if exc.command is None:
        exc.command = cmd.name
    if exc.path is None and path is not None:
        exc.path = bytes(path)


def _free_space(fd: int) -> int:
    """The bytes free for us in the file system of ``fd`` (root may use the reserve)."""
    fs = os.fstatvfs(fd)
    return fs.f_frsize * (fs.f_bfree if os.geteuid() == 0 else fs.f_bavail)


def _open_listing(dirfd: int) -> int:
    """An fd to read the entries of the directory ``dirfd``, with O_NOATIME where
    allowed: its atime is part of what is extracted."""
    try:
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOATIME | os.O_CLOEXEC, dir_fd=dirfd)
    except PermissionError:
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dirfd)


def _is_empty(dirfd: int) -> bool:
    """True when the directory has no entry."""
    fd = _open_listing(dirfd)
    try:
        with os.scandir(fd) as entries:
            return next(entries, None) is None
    finally:
        os.close(fd)


def _pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data = data[n:]
        offset += n


def _reflink(src: int, src_offset: int, length: int, dst: int, dst_offset: int) -> bool:
    """Share ``src[src_offset:+length]`` at ``dst_offset``; False where the file system cannot."""
    try:
        fcntl.ioctl(dst, FICLONERANGE, struct.pack("<qQQQ", src, src_offset, length, dst_offset))
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS):
            raise
        return False
    return True


def _data_ranges(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The ranges of ``fd`` between ``start`` and ``end`` that hold data (not holes)."""
    pos = start
    while pos < end:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            return
        if data >= end:
            return
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        yield data, hole
        pos = hole


def _copy_range(src: int, src_offset: int, length: int, dst: int, dst_offset: int) -> int:
    """Make ``dst[dst_offset:+length]`` what ``src[src_offset:+length]`` is, holes
    included; the data bytes copied."""
    dst_size = os.fstat(dst).st_size
    shift = dst_offset - src_offset
    pos = src_offset
    copied = 0
    for data, hole in _data_ranges(src, src_offset, src_offset + length):
        if data > pos:  # a hole in the source: a hole in the destination
            _punch(dst, pos + shift, data - pos, dst_size)
        _copy(src, data, dst, data + shift, hole - data)
        copied += hole - data
        pos = hole
    if pos < src_offset + length:
        _punch(dst, pos + shift, src_offset + length - pos, dst_size)
    if dst_size < dst_offset + length:
        os.ftruncate(dst, max(os.fstat(dst).st_size, dst_offset + length))
    return copied


def _punch(fd: int, offset: int, length: int, size: int) -> None:
    length = min(length, size - offset)  # nothing to punch beyond the end
    if length <= 0:
        return
    try:
        _fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        zeros = bytes(min(length, 1 << 20))
        while length > 0:
            n = min(length, len(zeros))
            _pwrite_all(fd, memoryview(zeros)[:n], offset)
            offset += n
            length -= n


def _copy(src: int, src_offset: int, dst: int, dst_offset: int, length: int) -> None:
    while length > 0:
        try:
            n = os.copy_file_range(src, dst, length, src_offset, dst_offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            n = -1
        if n < 0:
            chunk = os.pread(src, min(length, 1 << 20), src_offset)
            if not chunk:
                break
            _pwrite_all(dst, memoryview(chunk), dst_offset)
            n = len(chunk)
        elif n == 0:
            break
        src_offset += n
        dst_offset += n
        length -= n


# --- snapshots: a copy of the parent -------------------------------------------

_Entry = tuple[tuple[bytes, ...], os.stat_result, bool]
_READ_FLAGS = os.O_RDONLY | os.O_NOATIME | os.O_NONBLOCK


def _walk(tree: _Tree) -> Iterator[_Entry]:
    """Every entry of ``tree`` depth first, without recursion: ``(parts, stat, False)``,
    then for a directory ``(parts, stat, True)`` once its entries are done (the root is
    ``()``). Directories are read with O_NOATIME where allowed. Memory: the names not
    yet visited of the directories on the way down."""
    stack: list[tuple[tuple[bytes, ...], os.stat_result | None, bool]] = [((), os.fstat(tree.fd), False)]
    while stack:
        tree.trim()
        parts, st, done = stack.pop()
        if st is None:
            st = os.stat(parts[-1], dir_fd=tree.directory(parts[:-1]), follow_symlinks=False)
        yield parts, st, done
        if done or not stat.S_ISDIR(st.st_mode):
            continue
        stack.append((parts, st, True))
        fd = _open_listing(tree.directory(parts))
        try:
            with os.scandir(fd) as entries:
                stack.extend(((*parts, os.fsencode(entry.name)), None, False) for entry in entries)
        finally:
            os.close(fd)


class _Links:
    """The inodes of several names met in a walk: the first name of each, until all
    its names are met (memory: the hard-link groups still open)."""

    def __init__(self) -> None:
        self._first: dict[tuple[int, int], tuple[tuple[bytes, ...], int]] = {}

    def seen(self, st: os.stat_result, parts: tuple[bytes, ...]) -> tuple[bytes, ...] | None:
        """The first name met of ``parts``'s inode, or None when ``parts`` is the first."""
        if st.st_nlink < 2:
            return None
        key = (st.st_dev, st.st_ino)
        known = self._first.get(key)
        if known is None:
            self._first[key] = (parts, st.st_nlink - 1)
            return None
        first, left = known
        if left > 1:
            self._first[key] = (first, left - 1)
        else:
            del self._first[key]
        return first


def _holds(outer: int, inner: int) -> bool:
    """True when the directory ``inner`` is ``outer`` or below it."""
    target = os.fstat(outer)
    fd = os.open(".", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=inner)
    try:
        while True:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
                return True
            up = os.open("..", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=fd)
            os.close(fd)
            fd = up
            above = os.fstat(fd)
            if (above.st_dev, above.st_ino) == (st.st_dev, st.st_ino):  # the root
                return False
    finally:
        os.close(fd)


def _data_size(tree: _Tree) -> tuple[int, tuple[bytes, ...] | None]:
    """The data bytes (holes left out) of the regular files of ``tree``, each inode
    once, and a file that has some (None when none has)."""
    total, sample = 0, None
    links = _Links()
    for parts, st, done in _walk(tree):
        if done or not stat.S_ISREG(st.st_mode) or not st.st_size or links.seen(st, parts) is not None:
            continue
        fd = tree.open_regular(parts, _READ_FLAGS, "file of the parent")
        try:
            size = sum(end - start for start, end in _data_ranges(fd, 0, os.fstat(fd).st_size))
        finally:
            os.close(fd)
        if size and sample is None:
            sample = parts
        total += size
    return total, sample


def _can_reflink(tree: _Tree, sample: tuple[bytes, ...], dirfd: int) -> bool:
    """Whether the file ``sample`` of ``tree`` reflinks into the file system of ``dirfd``
    (tried on an unnamed temporary file, which leaves nothing behind)."""
    src = tree.open_regular(sample, _READ_FLAGS, "file of the parent")
    try:
        try:
            tmp = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
        except OSError:  # no O_TMPFILE here: count on copies
            return False
        try:
            return _reflink(src, 0, os.fstat(src).st_size, tmp, 0)
        finally:
            os.close(tmp)
    finally:
        os.close(src)


def _copy_tree(src: _Tree, dst: _Tree, skip: Callable[[bytes, str], None], *, restore_atimes: bool) -> int:
    """Copy every entry of ``src`` into the empty ``dst``: types, data (reflinked where
    possible, holes kept), hard links, owners, modes, xattrs, atimes and mtimes; the
    source is read with O_NOATIME. Reading a symlink moves its atime: with
    ``restore_atimes`` it is put back (which moves its ctime: a write, only for a source
    of ours). Returns the data bytes copied (not reflinked)."""
    links = _Links()
    copied = 0
    for parts, st, done in _walk(src):
        dst.trim()
        if done or not parts:
            if done:
                _copy_metadata(src, dst, parts, st, skip)
            continue
        kind = stat.S_IFMT(st.st_mode)
        dirfd, name = dst.directory(parts[:-1]), parts[-1]
        first = links.seen(st, parts) if kind != stat.S_IFDIR else None
        if first is not None:
            os.link(first[-1], name, src_dir_fd=dst.directory(first[:-1]), dst_dir_fd=dirfd, follow_symlinks=False)
            continue
        if kind == stat.S_IFDIR:
            os.mkdir(name, 0o700, dir_fd=dirfd)
            continue  # its metadata once its entries are done
        if kind == stat.S_IFREG:
            copied += _copy_file(src, parts, dirfd)
        elif kind == stat.S_IFLNK:
            os.symlink(_read_link(src, parts, st, restore_atimes), name, dir_fd=dirfd)
        elif kind == stat.S_IFIFO:
            os.mkfifo(name, 0o600, dir_fd=dirfd)
        else:
            try:
                os.mknod(name, kind | 0o600, st.st_rdev, dir_fd=dirfd)
            except PermissionError:
                flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
                os.close(os.open(name, flags, 0o600, dir_fd=dirfd))
                skip(
                    b"/".join(parts),
                    f"not permitted to make a {_kind(st.st_mode)} ({os.major(st.st_rdev)}, {os.minor(st.st_rdev)}) "
                    "in the copy of the parent: made an empty regular file in its place",
                )
        _copy_metadata(src, dst, parts, st, skip)
    return copied


def _copy_file(src: _Tree, parts: tuple[bytes, ...], dirfd: int) -> int:
    """Copy the regular file ``parts`` of ``src`` to the new file ``parts[-1]`` in
    ``dirfd``; the data bytes copied (0 when reflinked)."""
    fd = src.open_regular(parts, _READ_FLAGS, "file of the parent")
    try:
        out = os.open(
            parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dirfd
        )
        try:
            size = os.fstat(fd).st_size
            if not size or _reflink(fd, 0, size, out, 0):
                return 0
            return _copy_range(fd, 0, size, out, 0)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _read_link(src: _Tree, parts: tuple[bytes, ...], st: os.stat_result, restore_atime: bool) -> bytes:
    dirfd = src.directory(parts[:-1])
    target = os.readlink(parts[-1], dir_fd=dirfd)
    if restore_atime and os.stat(parts[-1], dir_fd=dirfd, follow_symlinks=False).st_atime_ns != st.st_atime_ns:
        with contextlib.suppress(OSError):  # a read-only parent keeps the new atime
            os.utime(parts[-1], ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dirfd, follow_symlinks=False)
    return target


def _copy_metadata(
    src: _Tree, dst: _Tree, parts: tuple[bytes, ...], st: os.stat_result, skip: Callable[[bytes, str], None]
) -> None:
    """Owner, xattrs, mode and times of ``parts`` from ``src`` to ``dst``, in that order
    (chown clears capabilities and setuid bits; the times come last)."""
    if parts:  # the entry itself, through its directory (never following a symlink)
        source, target, follow = (
            _proc(src.directory(parts[:-1]), parts[-1]),
            _proc(dst.directory(parts[:-1]), parts[-1]),
            False,
        )
    else:  # the root, a directory: through its fd
        source, target, follow = _proc(src.fd), _proc(dst.fd), True
    shown = b"/".join(parts)
    try:
        os.chown(target, st.st_uid, st.st_gid, follow_symlinks=follow)
    except PermissionError as exc:
        if os.geteuid() == 0:
            raise
        skip(shown, f"chown to {st.st_uid}:{st.st_gid}: {exc.strerror} (not root)")
    for name in os.listxattr(source, follow_symlinks=follow):
        try:
            os.setxattr(target, name, os.getxattr(source, name, follow_symlinks=follow), follow_symlinks=follow)
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM):
                raise
            skip(shown, f"xattr {name}: {exc.strerror}")
    if not stat.S_ISLNK(st.st_mode):
        os.chmod(target, stat.S_IMODE(st.st_mode))
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=follow)


def extract(
    source: BinaryIO,
    dest: str | os.PathLike[str],
    *,
    clone_sources: Mapping[UUID, str | os.PathLike[str]] | None = None,
    clone_dirs: Sequence[str | os.PathLike[str]] = (),
    per_subvolume: bool = False,
    max_clone_copy: int = MAX_CLONE_COPY,
    on_skip: Callable[[Skipped], None] | None = None,
    events: Iterable[Any] | None = None,
) -> ExtractReport:
    """Apply every stream of ``source`` to ``dest``; see :class:`Extractor`.

    ``events`` replaces reading ``source`` (e.g. a Decoder's events).
    """
    with Extractor(
        dest,
        clone_sources=clone_sources,
        clone_dirs=clone_dirs,
        per_subvolume=per_subvolume,
        max_clone_copy=max_clone_copy,
        on_skip=on_skip,
    ) as extractor:
        for event in events if events is not None else file_events(source):
            extractor.event(event)
        return extractor.report
