"""Copies of extractions: a SNAPSHOT's parent copied into DIR/NAME (per subvolume),
reflinked where the file system can, and the budget of what copies may take."""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import stat
from collections.abc import Callable, Iterator

from ..errors import ApplyError, BadCommand, CloneSourceMissing, LimitExceeded
from ..format.command import Command
from .report import ExtractReport, Skip, show
from .sources import CloneSources, clone_from_hint
from .syscalls import copy_range, data_ranges, free_space, mknod_or_file, reflink
from .tree import COPY_CACHE, DIR_FLAGS, Tree, describe_mode, open_listing, proc_path

__all__ = ["MAX_CLONE_COPY", "CopyBudget", "copy_parent"]

# What clones may copy (data bytes) over a whole extraction where DIR cannot reflink.
MAX_CLONE_COPY = 64 << 30

_Entry = tuple[tuple[bytes, ...], os.stat_result, bool]
_READ_FLAGS = os.O_RDONLY | os.O_NOATIME | os.O_NONBLOCK


class CopyBudget:
    """The data bytes copies may take where the file system cannot reflink: at most
    ``limit`` over a whole extraction, counted in ``report.copied_bytes``."""

    def __init__(self, limit: int, report: ExtractReport) -> None:
        self.limit = limit
        self._report = report

    def allow(self, need: int, what: str, fd: int, cmd: Command) -> None:
        """Refuse a copy of ``need`` bytes of data (``what``, into the file system of ``fd``,
        for ``cmd``) past the budget or the free space; before it writes."""
        used = self._report.copied_bytes
        if need > self.limit - used:
            raise LimitExceeded(
                f"{what} would copy {need} bytes of data (this file system cannot reflink), and copies "
                f"have taken {used} bytes already",
                limit=self.limit,
                option="--max-clone-copy",
                offset=cmd.offset,
                index=cmd.index,
                command=cmd.name,
            )
        free = free_space(fd)
        if need > free:
            raise ApplyError(
                f"{what} would copy {need} bytes of data (this file system cannot reflink), which does not "
                f"fit in the free space of the file system ({free} bytes)",
                errno=errno.ENOSPC,
            )

    def spend(self, copied: int) -> None:
        """Count ``copied`` data bytes copied."""
        self._report.copied_bytes += copied


def copy_parent(cmd: Command, name: bytes, dest_fd: int, sources: CloneSources, budget: CopyBudget, skip: Skip) -> None:
    """Make DIR/``name`` (``dest_fd`` is DIR) a copy of the extraction of the parent of
    the SNAPSHOT ``cmd``, as ``btrfs receive`` snapshots it; the parent stays as it was."""
    parent = cmd.get("clone_uuid")
    found = sources.find(parent)
    if found is None:
        raise CloneSourceMissing(
            f"the parent {parent} of the incremental stream of '{show(name)}' was not extracted before it "
            "in this input, nor given",
            expected=f"its extraction: {clone_from_hint(parent)}",
        )
    fd, where = found
    source = Tree(fd, f"parent {where}", COPY_CACHE)
    # a parent extracted in DIR is ours to keep as it was; a --clone-from source is only read
    ours = sources.extracted(parent)
    try:
        if _holds(fd, dest_fd):
            raise BadCommand(f"the parent's extraction {where} holds DIR", expected="a directory outside DIR")
        need, sample = _data_size(source)
        if sample is not None and not _can_reflink(source, sample, dest_fd):
            budget.allow(need, f"the copy of the parent {parent} ({where})", dest_fd, cmd)
        os.mkdir(name, 0o700, dir_fd=dest_fd)
        copy = Tree(os.open(name, DIR_FLAGS, dir_fd=dest_fd), f"subvolume {show(name)}", COPY_CACHE)
        try:
            budget.spend(_copy_tree(source, copy, functools.partial(skip, cmd), restore_atimes=ours))
        finally:
            copy.close()
    finally:
        source.close()


def _walk(tree: Tree) -> Iterator[_Entry]:
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
        fd = open_listing(tree.directory(parts))
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


def _data_size(tree: Tree) -> tuple[int, tuple[bytes, ...] | None]:
    """The data bytes (holes left out) of the regular files of ``tree``, each inode
    once, and a file that has some (None when none has)."""
    total, sample = 0, None
    links = _Links()
    for parts, st, done in _walk(tree):
        if done or not stat.S_ISREG(st.st_mode) or not st.st_size or links.seen(st, parts) is not None:
            continue
        fd = tree.open_regular(parts, _READ_FLAGS, "file of the parent")
        try:
            size = sum(end - start for start, end in data_ranges(fd, 0, os.fstat(fd).st_size))
        finally:
            os.close(fd)
        if size and sample is None:
            sample = parts
        total += size
    return total, sample


def _can_reflink(tree: Tree, sample: tuple[bytes, ...], dirfd: int) -> bool:
    """Whether the file ``sample`` of ``tree`` reflinks into the file system of ``dirfd``
    (tried on an unnamed temporary file, which leaves nothing behind)."""
    src = tree.open_regular(sample, _READ_FLAGS, "file of the parent")
    try:
        try:
            tmp = os.open(".", os.O_TMPFILE | os.O_WRONLY | os.O_CLOEXEC, 0o600, dir_fd=dirfd)
        except OSError:  # no O_TMPFILE here: count on copies
            return False
        try:
            return reflink(src, 0, os.fstat(src).st_size, tmp, 0)
        finally:
            os.close(tmp)
    finally:
        os.close(src)


def _copy_tree(src: Tree, dst: Tree, skip: Callable[[bytes, str], None], *, restore_atimes: bool) -> int:
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
        dirfd, name = dst.parent(parts)
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
        elif not mknod_or_file(name, kind | 0o600, st.st_rdev, dirfd):
            node = f"{describe_mode(st.st_mode)} ({os.major(st.st_rdev)}, {os.minor(st.st_rdev)})"
            skip(
                b"/".join(parts),
                f"not permitted to make a {node} in the copy of the parent: made an empty regular file in its place",
            )
        _copy_metadata(src, dst, parts, st, skip)
    return copied


def _copy_file(src: Tree, parts: tuple[bytes, ...], dirfd: int) -> int:
    """Copy the regular file ``parts`` of ``src`` to the new file ``parts[-1]`` in
    ``dirfd``; the data bytes copied (0 when reflinked)."""
    fd = src.open_regular(parts, _READ_FLAGS, "file of the parent")
    try:
        out = os.open(
            parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600, dir_fd=dirfd
        )
        try:
            size = os.fstat(fd).st_size
            if not size or reflink(fd, 0, size, out, 0):
                return 0
            return copy_range(fd, 0, size, out, 0)
        finally:
            os.close(out)
    finally:
        os.close(fd)


def _read_link(src: Tree, parts: tuple[bytes, ...], st: os.stat_result, restore_atime: bool) -> bytes:
    dirfd = src.directory(parts[:-1])
    target = os.readlink(parts[-1], dir_fd=dirfd)
    if restore_atime and os.stat(parts[-1], dir_fd=dirfd, follow_symlinks=False).st_atime_ns != st.st_atime_ns:
        with contextlib.suppress(OSError):  # a read-only parent keeps the new atime
            os.utime(parts[-1], ns=(st.st_atime_ns, st.st_mtime_ns), dir_fd=dirfd, follow_symlinks=False)
    return target


def _copy_metadata(
    src: Tree, dst: Tree, parts: tuple[bytes, ...], st: os.stat_result, skip: Callable[[bytes, str], None]
) -> None:
    """Owner, xattrs, mode and times of ``parts`` from ``src`` to ``dst``, in that order
    (chown clears capabilities and setuid bits; the times come last)."""
    if parts:  # the entry itself, through its directory (never following a symlink)
        source, target, follow = (
            proc_path(src.directory(parts[:-1]), parts[-1]),
            proc_path(dst.directory(parts[:-1]), parts[-1]),
            False,
        )
    else:  # the root, a directory: through its fd
        source, target, follow = proc_path(src.fd), proc_path(dst.fd), True
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
