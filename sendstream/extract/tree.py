"""The safe tree: stream paths checked, and resolved below a directory without
following symlinks, through a bounded cache of directory fds."""

from __future__ import annotations

import contextlib
import errno
import os
import stat

from ..errors import ApplyError, BadCommand, UnsafePath
from ..format.command import Command
from .report import show

__all__ = [
    "COPY_CACHE",
    "DIR_FLAGS",
    "NAME_MAX",
    "PATH_MAX",
    "Tree",
    "describe_mode",
    "is_empty",
    "open_listing",
    "path_of",
    "proc_path",
    "split_path",
]

NAME_MAX = 255
PATH_MAX = 4096

DIR_FLAGS = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FD_CACHE_MAX = 256
_TRAIL_STEP = 32  # see Tree
COPY_CACHE = 64  # for a clone source and each of the two trees of a copy


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


def path_of(cmd: Command, key: str = "path", *, root_ok: bool = True) -> tuple[bytes, ...]:
    """The components of the path attribute ``key`` of ``cmd`` (see :func:`split_path`);
    with ``root_ok=False`` the subvolume root is refused."""
    parts = split_path(bytes(cmd.get(key)), what=key.replace("_", " "))
    if not parts and not root_ok:
        raise BadCommand(f"{cmd.name} of the subvolume root", expected=f"a non-empty {key.replace('_', ' ')}")
    return parts


def proc_path(fd: int, name: bytes | None = None) -> bytes:
    """The /proc/self/fd path of ``fd`` (and ``name`` in it, for the l* calls)."""
    base = b"/proc/self/fd/%d" % fd
    return base if name is None else base + b"/" + name


class _CachedDir:
    """A cached directory fd and the cached directories in it (a trie node)."""

    __slots__ = ("children", "fd")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.children: dict[bytes, _CachedDir] = {}


class Tree:
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
            return os.open(name, DIR_FLAGS, dir_fd=parent)
        except OSError as exc:
            shown = show(b"/".join(parts[: depth + 1]))
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

    def parent(self, parts: tuple[bytes, ...]) -> tuple[int, bytes]:
        """The fd of the directory holding ``parts`` (as :meth:`directory`), and its last name."""
        return self.directory(parts[:-1]), parts[-1]

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
                    f"the {what} is not a regular file", expected="a regular file", actual=describe_mode(st.st_mode)
                )
            try:
                # no O_NOFOLLOW here: the /proc link is the way to the very inode checked
                fd = os.open(proc_path(pfd), flags | os.O_CLOEXEC | os.O_NOCTTY)
            except OSError as exc:
                if exc.errno == errno.EPERM and flags & os.O_NOATIME:
                    fd = os.open(proc_path(pfd), (flags & ~os.O_NOATIME) | os.O_CLOEXEC | os.O_NOCTTY)
                else:
                    raise ApplyError(f"cannot open {what}: {exc.strerror}", errno=exc.errno) from None
        finally:
            os.close(pfd)
        again = os.fstat(fd)
        if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino):  # pragma: no cover - needs a race
            os.close(fd)
            raise UnsafePath(f"the {what} changed while it was opened", expected="no concurrent changes in DIR")
        return fd


def describe_mode(mode: int) -> str:
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


def open_listing(dirfd: int) -> int:
    """An fd to read the entries of the directory ``dirfd``, with O_NOATIME where
    allowed: its atime is part of what is extracted."""
    try:
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_NOATIME | os.O_CLOEXEC, dir_fd=dirfd)
    except PermissionError:
        return os.open(".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC, dir_fd=dirfd)


def is_empty(dirfd: int) -> bool:
    """True when the directory has no entry."""
    fd = open_listing(dirfd)
    try:
        with os.scandir(fd) as entries:
            return next(entries, None) is None
    finally:
        os.close(fd)
