"""The state of a directory tree, read without changing it, and what differs between two trees."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import stat
from pathlib import Path
from typing import Any

# The granularity of data_map: btrfs' sector.
BLOCK = 4096


def data_map(fd: int, size: int) -> list[tuple[int, int]]:
    """The data ranges of a file in whole blocks (holes are what is left out)."""
    ranges: list[tuple[int, int]] = []
    pos = 0
    end = -(-size // BLOCK) * BLOCK
    while pos < size:
        try:
            start = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            assert exc.errno == errno.ENXIO
            break
        stop = os.lseek(fd, start, os.SEEK_HOLE)
        start, stop = start // BLOCK * BLOCK, min(-(-stop // BLOCK) * BLOCK, end)
        if ranges and ranges[-1][1] >= start:
            ranges[-1] = (ranges[-1][0], max(stop, ranges[-1][1]))
        else:
            ranges.append((start, stop))
        pos = stop
    return ranges


def tree_state(root: Path) -> tuple[dict[bytes, dict[str, Any]], list[list[bytes]]]:
    """Every entry below ``root`` (itself as ``b""``) and the hard-link groups.

    Each entry is stat'ed before it is read, files and directories are read
    with O_NOATIME, and a symlink's atime, which readlink moves, is put back,
    so reading does not change the atimes compared.
    """
    entries: dict[bytes, dict[str, Any]] = {}
    inodes: dict[tuple[int, int], list[bytes]] = {}

    def visit(rel: bytes) -> None:
        full = os.path.join(os.fsencode(root), rel) if rel else os.fsencode(root)
        st = os.lstat(full)
        entry: dict[str, Any] = {
            "mode": oct(st.st_mode),
            "owner": (st.st_uid, st.st_gid),
            "atime": st.st_atime_ns,
            "mtime": st.st_mtime_ns,
        }
        if not stat.S_ISDIR(st.st_mode):
            entry["nlink"] = st.st_nlink
            entry["size"] = st.st_size
            inodes.setdefault((st.st_dev, st.st_ino), []).append(rel)
        if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            entry["rdev"] = (os.major(st.st_rdev), os.minor(st.st_rdev))
        names = os.listxattr(full, follow_symlinks=False)
        entry["xattrs"] = {
            n: os.getxattr(full, n, follow_symlinks=False) for n in sorted(names) if not n.startswith("btrfs.")
        }
        if stat.S_ISLNK(st.st_mode):
            entry["target"] = os.readlink(full)
            if os.lstat(full).st_atime_ns != st.st_atime_ns:  # readlink moved it: put it back
                with contextlib.suppress(OSError):  # (a read-only subvolume keeps it)
                    os.utime(full, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
        elif stat.S_ISREG(st.st_mode):
            fd = os.open(full, os.O_RDONLY | os.O_NOATIME)
            try:
                digest = hashlib.sha256()
                while chunk := os.read(fd, 1 << 20):
                    digest.update(chunk)
                entry["sha256"] = digest.hexdigest()
                entry["data"] = data_map(fd, st.st_size)
            finally:
                os.close(fd)
        entries[rel] = entry
        if stat.S_ISDIR(st.st_mode):
            fd = os.open(full, os.O_RDONLY | os.O_DIRECTORY | os.O_NOATIME)
            try:
                children = sorted(os.listdir(fd))
            finally:
                os.close(fd)
            for name in children:
                visit(os.path.join(rel, os.fsencode(name)) if rel else os.fsencode(name))

    visit(b"")
    links = sorted(sorted(names) for names in inodes.values() if len(names) > 1)
    return entries, links


def ctimes(root: Path) -> dict[bytes, int]:
    """The ctime of every entry below ``root``, moving no atime (lstat, directories
    listed with O_NOATIME, no symlink followed)."""
    out: dict[bytes, int] = {}
    pending = [b""]
    while pending:
        rel = pending.pop()
        full = os.path.join(os.fsencode(root), rel)
        st = os.lstat(full)
        out[rel] = st.st_ctime_ns
        if stat.S_ISDIR(st.st_mode):
            fd = os.open(full, os.O_RDONLY | os.O_DIRECTORY | os.O_NOATIME)
            try:
                pending.extend(os.path.join(rel, os.fsencode(name)) for name in os.listdir(fd))
            finally:
                os.close(fd)
    return out


def without_link_atimes(state: tuple[dict[bytes, dict[str, Any]], list[list[bytes]]]) -> Any:
    """A :func:`tree_state` without the atimes of symlinks, which reading them moves."""
    entries, links = state
    return {k: {a: v for a, v in e.items() if not ("target" in e and a == "atime")} for k, e in entries.items()}, links


def compare(theirs: Path, ours: Path) -> list[tuple[bytes | None, str, Any, Any]]:
    """What differs between two trees: (entry, attribute, theirs, ours) each, in order; the attribute
    ``only`` for an entry on one side (a present side True), the entry None for the hard links."""
    (a, links_a), (b, links_b) = tree_state(theirs), tree_state(ours)
    out: list[tuple[bytes | None, str, Any, Any]] = []
    for rel in sorted(a.keys() | b.keys()):
        if rel not in b or rel not in a:
            out.append((rel, "only", rel in a, rel in b))
            continue
        for key in sorted(a[rel].keys() | b[rel].keys()):
            if a[rel].get(key) != b[rel].get(key):
                out.append((rel, key, a[rel].get(key), b[rel].get(key)))
    if links_a != links_b:
        out.append((None, "hard links", links_a, links_b))
    return out


def describe(diff: tuple[bytes | None, str, Any, Any], names: tuple[str, str] = ("btrfs receive", "ours")) -> str:
    """One line of :func:`compare`, the two sides named."""
    rel, key, x, y = diff
    if rel is None:
        return f"{key}: {names[0]} {x!r}, {names[1]} {y!r}"
    if key == "only":
        return f"{rel!r}: only in {names[0] if x else names[1]}"
    return f"{rel!r} {key}: {names[0]} {x!r}, {names[1]} {y!r}"


def differences(theirs: Path, ours: Path) -> list[str]:
    """What differs between two trees, one line per attribute (empty when equal)."""
    return [describe(d) for d in compare(theirs, ours)]
