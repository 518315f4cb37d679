#!/usr/bin/env python3
"""Build small btrfs send streams (and their dumps) as test fixtures.

Usage::

    python3 tools/make_fixtures.py [OUTDIR]               # everything (root, btrfs, loop devices)
    python3 tools/make_fixtures.py --v3-only [OUTDIR]     # only verity-v3.* and MANIFEST.md
    python3 tools/make_fixtures.py --check-only [OUTDIR]  # re-check the existing files, write nothing
    python3 tools/make_fixtures.py --clone-tree DIR       # only the clone-src fixtures' subvolumes, in DIR

OUTDIR defaults to fixtures/ next to tools/.  For each kernel stream NAME the full
run writes OUTDIR/NAME.stream (exact ``btrfs send`` output) and OUTDIR/NAME.dump
(exact stdout of ``TZ=UTC btrfs receive --dump < NAME.stream``).  verity-v3.stream
is written by sendstream's own writer (no kernel here writes v3) and its dump is
``TZ=UTC sendstream dump --progs-style 6.2`` output, as btrfs-progs 6.2 cannot read v3.  Every
stream is read back with the sendstream library (strict decoder: framing, CRCs,
attributes) and checked against its spec; OUTDIR/MANIFEST.md records the result.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import difflib
import fcntl
import os
import pathlib
import platform
import random
import re
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import uuid
import zlib
from collections.abc import Callable, Sequence
from typing import Any, BinaryIO

from sendstream import (
    Command,
    Decoder,
    StreamHeader,
    Timespec,
    encode_command,
    encode_stream_header,
)
from sendstream.errors import FormatError
from sendstream.format.layout import COMMAND_HEADER_SIZE, COMMAND_NUMBERS, attribute_name
from sendstream.io.windows import iter_events

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from support.loopfs import btrfs_loop, require_btrfs

# ---------------------------------------------------------------------------
# What a stream holds, as the sendstream library reads it
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class Summary:
    """Counts and attribute orders of one file (all its streams)."""

    versions: list[int] = dataclasses.field(default_factory=list)  # one per stream header
    ends: int = 0  # END commands seen
    commands: int = 0  # all commands, END included
    counts: collections.Counter[str] = dataclasses.field(default_factory=collections.Counter)
    attr_orders: dict[str, collections.Counter[tuple[str, ...]]] = dataclasses.field(default_factory=dict)
    compressions: collections.Counter[int] = dataclasses.field(default_factory=collections.Counter)
    max_payload: int = 0


def summarize(f: BinaryIO, attr_orders: bool = True) -> Summary:
    """Read every event of *f* with a strict sendstream decoder and tally it.

    Raises sendstream.errors.FormatError on any damage (framing, CRC, unknown or
    missing attributes, trailing bytes, a restarted send).
    """
    res = Summary()
    last: Command | None = None
    for event in iter_events(f, Decoder(strict=True)):
        if last is not None:  # events are contiguous: the next one ends the last command
            res.max_payload = max(res.max_payload, event.offset - last.offset - COMMAND_HEADER_SIZE)
            last = None
        if isinstance(event, StreamHeader):
            res.versions.append(event.version)
        elif isinstance(event, Command):
            last = event
            name = event.name
            res.commands += 1
            res.counts[name] += 1
            if name == "end":
                res.ends += 1
            elif name == "encoded_write":
                res.compressions[int(event.get("compression", 0))] += 1
            if attr_orders:
                order = tuple(attribute_name(t).upper() for t, _ in event.attributes or ())
                res.attr_orders.setdefault(name, collections.Counter())[order] += 1
    return res


def summarize_path(path: str | os.PathLike[str], attr_orders: bool = True) -> Summary:
    """summarize() the file at *path*."""
    with open(path, "rb") as f:
        return summarize(f, attr_orders)


# ---------------------------------------------------------------------------
# Building the trees
# ---------------------------------------------------------------------------

FICLONERANGE = 0x4020940D  # _IOW(0x94, 13, struct file_clone_range)


def _ns(sec: int, nsec: int) -> int:
    return sec * 1_000_000_000 + nsec


# Fixed times (the dump shows whole seconds, the stream keeps nanoseconds).
ATIME_BASE = _ns(1609459200, 111111111)  # 2021-01-01T00:00:00Z
MTIME_BASE = _ns(1609556645, 123456789)  # 2021-01-02T03:04:05Z
ATIME_INCR = _ns(1640995200, 222222222)  # 2022-01-01T00:00:00Z
MTIME_INCR = _ns(1641092645, 987654321)  # 2022-01-02T03:04:05Z
# A few per-file special times.
MTIME_OLD = _ns(0, 0)  # the epoch
MTIME_PRE_EPOCH = _ns(-86400, 500000000)  # 1969-12-31T00:00:00.5Z
MTIME_FUTURE = _ns(4102444800, 999999999)  # 2100-01-01T00:00:00Z


def run(
    cmd: Sequence[str | bytes | os.PathLike[str]],
    cwd: pathlib.Path | None = None,
    stdout: Any = subprocess.PIPE,
    env: dict[str, str] | None = None,
) -> bytes:
    """Run a command, fail loudly with its stderr, return stdout bytes."""
    proc = subprocess.run(
        [os.fsencode(c) if isinstance(c, (str, os.PathLike)) else c for c in cmd],
        cwd=cwd,
        stdout=stdout,
        stderr=subprocess.PIPE,
        env=env,
    )
    if proc.returncode != 0:
        raise SystemExit(
            f"command failed (exit {proc.returncode}): {' '.join(map(str, cmd))}\n"
            f"{proc.stderr.decode(errors='replace')}"
        )
    return proc.stdout if proc.stdout is not None else b""


def write_file(path: bytes | pathlib.Path, data: bytes, mode: int = 0o644) -> None:
    """Create/replace *path* with *data*."""
    with open(path, "wb") as f:
        f.write(data)
    os.chmod(path, mode)


def pwrite(path: bytes | pathlib.Path, offset: int, data: bytes) -> None:
    """Write *data* at *offset* without truncating."""
    fd = os.open(path, os.O_WRONLY)
    try:
        os.pwrite(fd, data, offset)
    finally:
        os.close(fd)


def clone_range(src: bytes | pathlib.Path, src_off: int, length: int, dst: bytes | pathlib.Path, dst_off: int) -> None:
    """Reflink *length* bytes of *src* at *src_off* into *dst* at *dst_off* (FICLONERANGE)."""
    with open(src, "rb") as s, open(dst, "r+b") as d:
        fcntl.ioctl(d.fileno(), FICLONERANGE, struct.pack("<qQQQ", s.fileno(), src_off, length, dst_off))


def make_socket(path: bytes) -> None:
    """Leave a unix socket inode at *path* (bind, then close)."""
    d, name = os.path.split(path)
    old = os.getcwd()
    os.chdir(d or b".")
    try:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.bind(name)
        finally:
            s.close()
    finally:
        os.chdir(old)


def text_blob(rng: random.Random, size: int) -> bytes:
    """Very compressible, deterministic pseudo-text of exactly *size* bytes."""
    phrases = [
        b"the btrfs send stream carries commands",
        b"each command has a header and attributes",
        b"a snapshot must be read-only to be sent",
        b"clone ranges refer to extents in other subvolumes",
        b"encoded writes keep compressed extents compressed",
        b"utimes chown and chmod follow every new inode",
    ]
    out = bytearray()
    line = 0
    while len(out) < size:
        line += 1
        out += b"%06d %s\n" % (line, rng.choice(phrases))
    return bytes(out[:size])


def set_times(
    root: bytes, atime: int, mtime: int, skip_mtimes: frozenset[int] = frozenset(), skip: frozenset[bytes] = frozenset()
) -> None:
    """Set atime/mtime of *root* and everything below (no symlink following).

    Entries whose current mtime is in *skip_mtimes* (already fixed) or whose
    path is in *skip* are left alone.
    """

    def one(p: bytes) -> None:
        if p in skip:
            return
        if os.lstat(p).st_mtime_ns in skip_mtimes:
            return
        os.utime(p, ns=(atime, mtime), follow_symlinks=False)

    def walk(d: bytes) -> None:
        with os.scandir(d) as it:
            entries = list(it)
        for e in entries:
            if e.is_dir(follow_symlinks=False):
                walk(e.path)
            else:
                one(e.path)
        one(d)

    walk(root)


def snapshot_ro(mnt: pathlib.Path, src: str, dst: str) -> None:
    """btrfs subvolume snapshot -r (after a sync so all data is on disk)."""
    os.sync()
    run(["btrfs", "subvolume", "snapshot", "-r", src, dst], cwd=mnt)


def subvol_create(mnt: pathlib.Path, name: str) -> bytes:
    run(["btrfs", "subvolume", "create", name], cwd=mnt)
    return os.fsencode(mnt / name)


def build_rich(mnt: pathlib.Path) -> list[bytes]:
    """Create subvol 'rich', populate it, snapshot 'rich_base'.  Returns chattr'd paths."""
    rng = random.Random(20240101)
    R = subvol_create(mnt, "rich")
    j = os.path.join

    # Regular files.
    write_file(j(R, b"hello.txt"), b"hello, world\n")
    write_file(j(R, b"empty"), b"")
    write_file(j(R, b"text.txt"), text_blob(rng, 3000))
    write_file(j(R, b"random.bin"), rng.randbytes(200 * 1024))  # ~5 v1 WRITEs, 2 v2 WRITEs
    write_file(j(R, b"delete-me.txt"), b"gone in the incremental\n")
    write_file(j(R, b"truncate-me.bin"), rng.randbytes(12000))
    write_file(j(R, b"exactly-4k"), rng.randbytes(4096))
    # Reflinked copy within the subvolume (full send: CLONE from random.bin).
    run(["cp", "--reflink=always", j(R, b"random.bin"), j(R, b"random-reflink.bin")])
    # Partial reflink at a different offset plus own data.
    write_file(j(R, b"partial-clone.bin"), rng.randbytes(8192))
    clone_range(j(R, b"random.bin"), 65536, 65536, j(R, b"partial-clone.bin"), 8192)
    with open(j(R, b"partial-clone.bin"), "ab") as f:
        f.write(b"tail after the cloned range\n")

    # Sparse file: leading hole, data islands, trailing data at 1 MiB.
    sp = j(R, b"sparse.bin")
    write_file(sp, b"")
    os.truncate(sp, 1024 * 1024 + 100)
    pwrite(sp, 65536, rng.randbytes(5000))
    pwrite(sp, 300000, b"island" * 500)
    pwrite(sp, 1024 * 1024, b"E" * 100)
    # Preallocated (unwritten) extent.
    fd = os.open(j(R, b"prealloc.bin"), os.O_CREAT | os.O_WRONLY, 0o644)
    os.posix_fallocate(fd, 0, 65536)
    os.pwrite(fd, b"written head\n", 0)
    os.close(fd)

    # Hard links (same dir, other dir, weird name).
    os.mkdir(j(R, b"links"))
    write_file(j(R, b"links", b"target"), b"I have many names\n")
    os.link(j(R, b"links", b"target"), j(R, b"links", b"hard1"))
    os.link(j(R, b"links", b"target"), j(R, b"hard-in-root"))
    os.link(j(R, b"links", b"target"), j(R, b"links", b"hard with space"))
    write_file(j(R, b"links", b"pair-a"), b"pair\n")
    os.link(j(R, b"links", b"pair-a"), j(R, b"links", b"pair-b"))

    # Symlinks: relative, absolute, dangling, with spaces, to a dir, long, non-UTF-8.
    os.symlink(b"hello.txt", j(R, b"link-to-hello"))
    os.symlink(b"/etc/passwd", j(R, b"link-absolute"))
    os.symlink(b"does/not/exist", j(R, b"link-dangling"))
    os.symlink(b"target with spaces/and more", j(R, b"link with spaces"))
    os.symlink(b"links", j(R, b"link-to-dir"))
    os.symlink(b"x" * 1000, j(R, b"link-long-target"))
    os.symlink(b"caf\xe9/\xff\xfe", j(R, b"link-non-utf8"))
    os.symlink(b"old-target", j(R, b"link-retarget"))

    # Special files.
    os.mkfifo(j(R, b"fifo"), 0o640)
    os.mkfifo(j(R, b"fifo-doomed"), 0o600)
    make_socket(j(R, b"sock"))
    os.mknod(j(R, b"chardev"), stat.S_IFCHR | 0o666, os.makedev(1, 3))
    os.mknod(j(R, b"blockdev"), stat.S_IFBLK | 0o660, os.makedev(7, 200))
    os.mknod(j(R, b"chardev-bignum"), stat.S_IFCHR | 0o600, os.makedev(259, 70000))

    # Awkward names.
    os.mkdir(j(R, b"names"))
    N = j(R, b"names")
    for name in (
        b"with space",
        b"new\nline",
        b"back\\slash",
        b"tab\there",
        b"caf\xe9",
        b"\xff\xfe",
        b"ctrl\x01\x7f",
        b"-leading-dash",
        b"equals=sign",
        "ünïcødé-✓".encode(),
        b"L" * 255,
        b" leading and trailing ",
    ):
        write_file(j(N, name), b"name: " + name + b"\n")
    os.mkdir(j(N, b"dir with space"))
    write_file(j(N, b"dir with space", b"inner\tfile"), b"x\n")
    write_file(j(N, b"rename-me-\xe9"), b"non-utf8 rename source\n")

    # Deep directory.
    p = j(R, b"deep")
    os.mkdir(p)
    for i in range(16):
        p = j(p, b"d%02d" % i)
        os.mkdir(p)
    write_file(j(p, b"bottom.txt"), b"deep down\n")
    os.mkdir(j(R, b"empty-dir"))

    # Material for the incremental's renames / deletions.
    os.mkdir(j(R, b"swap"))
    write_file(j(R, b"swap", b"a"), b"I am a\n")
    write_file(j(R, b"swap", b"b"), b"I am b\n")
    os.makedirs(j(R, b"dswap", b"x"))
    os.makedirs(j(R, b"dswap", b"y"))
    write_file(j(R, b"dswap", b"x", b"in-x"), b"x\n")
    write_file(j(R, b"dswap", b"y", b"in-y"), b"y\n")
    os.makedirs(j(R, b"nest", b"outer", b"inner"))
    write_file(j(R, b"nest", b"outer", b"inner", b"f"), b"nested\n")
    os.mkdir(j(R, b"overwrite"))
    write_file(j(R, b"overwrite", b"old"), b"old contents\n")
    write_file(j(R, b"overwrite", b"new"), b"new contents\n")
    os.makedirs(j(R, b"doomed", b"sub"))
    write_file(j(R, b"doomed", b"f1"), b"1\n")
    write_file(j(R, b"doomed", b"sub", b"f2"), b"2\n")
    os.mkdir(j(R, b"moved-from"))
    os.mkdir(j(R, b"moved-to"))
    write_file(j(R, b"moved-from", b"traveller"), b"moving\n")
    write_file(j(R, b"append.log"), b"line 1\n")
    write_file(j(R, b"immutable"), b"cannot touch this (until the incremental)\n")
    write_file(j(R, b"append-only"), b"will become append-only\n")
    write_file(j(R, b"nocow"), b"")

    # Xattrs: text, binary with NUL/newline, empty, big, odd names, on dir/root/fifo.
    os.setxattr(j(R, b"hello.txt"), b"user.comment", b"a plain text value")
    os.setxattr(j(R, b"hello.txt"), b"user.binary", b"\x00\x01\x02\nline2\n\x00\xff")
    os.setxattr(j(R, b"hello.txt"), b"user.empty", b"")
    os.setxattr(j(R, b"hello.txt"), b"user.to-remove", b"removed in the incremental")
    os.setxattr(j(R, b"hello.txt"), b"user.to-change", b"before")
    os.setxattr(j(R, b"text.txt"), b"user.big", rng.randbytes(2000))
    os.setxattr(j(R, b"text.txt"), b"user.with space", b"v")
    os.setxattr(j(R, b"text.txt"), b"user.\xff\xfe-non-utf8", b"\xe9")
    os.setxattr(j(R, b"links"), b"user.on-dir", b"dir xattr")
    os.setxattr(R, b"user.on-root", b"subvolume root xattr")
    os.setxattr(j(R, b"names", b"new\nline"), b"user.nl", b"x\ny")
    os.setxattr(j(R, b"random.bin"), b"trusted.sendstream", b"trusted namespace")

    # Owners and modes (chown before chmod: chown clears set-id bits).
    owners = {
        b"hello.txt": (1000, 1000, 0o644),
        b"text.txt": (0, 100, 0o600),
        b"random.bin": (65534, 65534, 0o444),
        b"empty": (123456, 654321, 0o000),
        b"fifo": (1000, 0, 0o640),
        b"sock": (0, 0, 0o777),
        b"names": (1000, 1000, 0o2775),
        b"empty-dir": (0, 0, 0o1777),
        b"exactly-4k": (0, 0, 0o4755),
        b"truncate-me.bin": (2000, 2000, 0o664),
        b"deep": (0, 0, 0o700),
    }
    for name, (uid, gid, mode) in owners.items():
        os.chown(j(R, name), uid, gid)
        os.chmod(j(R, name), mode)
    os.lchown(j(R, b"link-dangling"), 4242, 4343)
    # File capability (v2 vfs_cap_data: CAP_NET_BIND_SERVICE, effective); after the
    # chown, which would drop it.  The kernel re-sends it after CHOWN.
    os.setxattr(j(R, b"hello.txt"), b"security.capability", struct.pack("<IIIII", 0x02000001, 1 << 10, 0, 0, 0))

    # Fixed times everywhere, with a few special values.
    set_times(R, ATIME_BASE, MTIME_BASE)
    os.utime(j(R, b"exactly-4k"), ns=(MTIME_OLD, MTIME_OLD))
    os.utime(j(R, b"empty"), ns=(MTIME_PRE_EPOCH, MTIME_PRE_EPOCH))
    os.utime(j(R, b"hello.txt"), ns=(ATIME_BASE, MTIME_FUTURE))
    os.utime(j(R, b"link-absolute"), ns=(MTIME_OLD, MTIME_FUTURE), follow_symlinks=False)

    # Inode flags last (FILEATTR only shows up when an existing inode's flags change).
    run(["chattr", "+C", j(R, b"nocow")])
    run(["chattr", "+i", j(R, b"immutable")])
    return [j(R, b"immutable")]


def modify_rich(mnt: pathlib.Path) -> None:
    """Change 'rich' after 'rich_base' was taken (everything an incremental has to express)."""
    rng = random.Random(20240202)
    R = os.fsencode(mnt / "rich")
    j = os.path.join
    run(["chattr", "-i", j(R, b"immutable")])  # -> FILEATTR 0 in v2

    # Renames: swap two files, swap two dirs, invert a nesting, overwrite, cross-dir move.
    os.rename(j(R, b"swap", b"a"), j(R, b"swap", b"tmp"))
    os.rename(j(R, b"swap", b"b"), j(R, b"swap", b"a"))
    os.rename(j(R, b"swap", b"tmp"), j(R, b"swap", b"b"))
    os.rename(j(R, b"dswap", b"x"), j(R, b"dswap", b"tmp"))
    os.rename(j(R, b"dswap", b"y"), j(R, b"dswap", b"x"))
    os.rename(j(R, b"dswap", b"tmp"), j(R, b"dswap", b"y"))
    os.rename(j(R, b"nest", b"outer", b"inner"), j(R, b"nest", b"inner"))
    os.rename(j(R, b"nest", b"outer"), j(R, b"nest", b"inner", b"outer"))
    os.rename(j(R, b"overwrite", b"new"), j(R, b"overwrite", b"old"))
    os.rename(j(R, b"moved-from", b"traveller"), j(R, b"moved-to", b"traveller renamed"))
    os.rename(j(R, b"names", b"rename-me-\xe9"), j(R, b"names", b"renamed-\xff"))
    os.rename(j(R, b"deep", b"d00"), j(R, b"deep", b"D00"))

    # Deletions.
    os.unlink(j(R, b"delete-me.txt"))
    os.unlink(j(R, b"fifo-doomed"))
    os.unlink(j(R, b"links", b"pair-b"))
    shutil.rmtree(j(R, b"doomed"))
    os.rmdir(j(R, b"empty-dir"))

    # Data changes: append, overwrite in the middle, shrink, grow, punch a hole.
    with open(j(R, b"append.log"), "ab") as f:
        f.write(b"line 2\nline 3\n")
    pwrite(j(R, b"random.bin"), 100000, rng.randbytes(4096))
    os.truncate(j(R, b"truncate-me.bin"), 5000)
    os.truncate(j(R, b"sparse.bin"), 2 * 1024 * 1024)
    run(["fallocate", "-p", "-o", "131072", "-l", "32768", j(R, b"random-reflink.bin")])

    # Metadata changes.
    os.chown(j(R, b"hello.txt"), 1001, 1001)  # drops security.capability ...
    os.chmod(j(R, b"hello.txt"), 0o600)
    os.setxattr(
        j(R, b"hello.txt"),
        b"security.capability",  # ... so set it again
        struct.pack("<IIIII", 0x02000001, 1 << 10 | 1 << 12, 0, 0, 0),
    )
    os.chown(j(R, b"text.txt"), 1000, 1000)
    os.chmod(j(R, b"text.txt"), 0o640)
    os.link(j(R, b"hello.txt"), j(R, b"links", b"new-hardlink-to-hello"))
    write_file(j(R, b"new-file.txt"), b"created in the incremental\n")
    os.symlink(b"new-file.txt", j(R, b"new-symlink"))
    os.unlink(j(R, b"link-retarget"))
    os.symlink(b"new-target", j(R, b"link-retarget"))
    os.mkdir(j(R, b"new-dir"))
    write_file(j(R, b"new-dir", b"inside"), b"inside new dir\n")

    # Xattrs: remove, change, add.
    os.removexattr(j(R, b"hello.txt"), b"user.to-remove")
    os.setxattr(j(R, b"hello.txt"), b"user.to-change", b"after\n(with a newline)")
    os.setxattr(j(R, b"append.log"), b"user.added", b"\x00added\x00")
    os.removexattr(j(R, b"text.txt"), b"user.big")

    set_times(R, ATIME_INCR, MTIME_INCR, skip_mtimes=frozenset({MTIME_BASE, MTIME_OLD, MTIME_PRE_EPOCH, MTIME_FUTURE}))
    run(["chattr", "+a", j(R, b"append-only")])  # -> FILEATTR in v2


def build_comp(mnt: pathlib.Path) -> None:
    """Subvol 'comp' with zlib/zstd/lzo extents (per-file compression property)."""
    rng = random.Random(20240303)
    C = subvol_create(mnt, "comp")
    j = os.path.join

    def compressed(name: bytes, algo: str, data: bytes) -> bytes:
        p = j(C, name)
        write_file(p, b"")
        run(["btrfs", "property", "set", p, "compression", algo])
        with open(p, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return p

    compressed(b"zlib.txt", "zlib", text_blob(rng, 200000))
    compressed(b"zstd.txt", "zstd", text_blob(rng, 200000))
    compressed(b"lzo.txt", "lzo", text_blob(rng, 200000))
    compressed(b"zstd-inline.txt", "zstd", text_blob(rng, 1500))  # inline: plain WRITE
    # A compressed extent later partly overwritten: partial references into it.
    p = compressed(b"zstd-partial.txt", "zstd", text_blob(rng, 256 * 1024))
    fd = os.open(p, os.O_WRONLY)
    os.pwrite(fd, rng.randbytes(4096), 65536)
    os.fsync(fd)
    os.close(fd)
    write_file(j(C, b"plain.bin"), rng.randbytes(10000))
    set_times(C, ATIME_BASE, MTIME_BASE)


def build_two(mnt: pathlib.Path) -> None:
    """Two small independent subvolumes 'two_a', 'two_b'."""
    j = os.path.join
    A = subvol_create(mnt, "two_a")
    write_file(j(A, b"a.txt"), b"subvolume A\n")
    os.mkdir(j(A, b"dir"))
    write_file(j(A, b"dir", b"nested"), b"nested in A\n")
    B = subvol_create(mnt, "two_b")
    write_file(j(B, b"b.txt"), b"subvolume B\n")
    os.symlink(b"b.txt", j(B, b"link"))
    os.setxattr(j(B, b"b.txt"), b"user.which", b"B")
    set_times(A, ATIME_BASE, MTIME_BASE)
    set_times(B, ATIME_BASE, MTIME_BASE)


def build_clone(mnt: pathlib.Path) -> None:
    """'lib' (clone source) and 'work' (snapshots work_1, work_2 reflinking from lib_snap)."""
    rng = random.Random(20240404)
    j = os.path.join
    L = subvol_create(mnt, "lib")
    write_file(j(L, b"f1.bin"), rng.randbytes(96 * 1024))
    write_file(j(L, b"f2.bin"), rng.randbytes(128 * 1024))
    set_times(L, ATIME_BASE, MTIME_BASE)
    snapshot_ro(mnt, "lib", "lib_snap")

    W = subvol_create(mnt, "work")
    write_file(j(W, b"own.bin"), rng.randbytes(64 * 1024))
    write_file(j(W, b"notes.txt"), b"work in progress\n")
    set_times(W, ATIME_BASE, MTIME_BASE)
    snapshot_ro(mnt, "work", "work_1")

    LS = os.fsencode(mnt / "lib_snap")
    # Whole-file reflink from the clone source.
    run(["cp", "--reflink=always", j(LS, b"f1.bin"), j(W, b"f1-copy.bin")])
    # Partial reflink from the clone source at a different offset, between own data.
    write_file(j(W, b"mixed.bin"), rng.randbytes(4096))
    clone_range(j(LS, b"f2.bin"), 32768, 65536, j(W, b"mixed.bin"), 4096)
    with open(j(W, b"mixed.bin"), "ab") as f:
        f.write(rng.randbytes(1000))
    # Reflink of a file that already is in the parent snapshot.
    run(["cp", "--reflink=always", j(W, b"own.bin"), j(W, b"own-copy.bin")])
    set_times(W, ATIME_INCR, MTIME_INCR, skip_mtimes=frozenset({MTIME_BASE}))
    snapshot_ro(mnt, "work", "work_2")


# ---------------------------------------------------------------------------
# Streams
# ---------------------------------------------------------------------------

Check = Callable[[Summary, bytes], str | None]


@dataclasses.dataclass
class Spec:
    name: str
    args: list[str]  # btrfs send arguments (run with cwd = mount point); [] for our writer's streams
    what: str
    require: Check | None = None


@dataclasses.dataclass
class Result:
    spec: Spec
    size: int
    summary: Summary


def _need_cmds(*names: str) -> Check:
    def check(res: Summary, dump: bytes) -> str | None:
        missing = [n for n in names if not res.counts.get(n)]
        return f"missing commands: {', '.join(missing)}" if missing else None

    return check


def _need_compressions(res: Summary, dump: bytes) -> str | None:
    seen = set()
    for line in dump.splitlines():
        if line.startswith(b"encoded_write"):
            m = re.search(rb"\bcompression=(\d+)", line)
            if m:
                seen.add(int(m.group(1)))
    problems = []
    if 1 not in seen:
        problems.append("no zlib (compression=1) encoded_write in the dump")
    if 2 not in seen:
        problems.append("no zstd (compression=2) encoded_write in the dump")
    if not seen & {3, 4, 5, 6, 7}:
        problems.append("no lzo (compression=3..7) encoded_write in the dump")
    if set(res.compressions) != seen:
        problems.append(f"dump compressions {sorted(seen)} != stream {sorted(res.compressions)}")
    return "; ".join(problems) or None


def _all(*checks: Check) -> Check:
    def check(res: Summary, dump: bytes) -> str | None:
        errs = [e for c in checks if (e := c(res, dump))]
        return "; ".join(errs) or None

    return check


def _need_streams(headers: int, ends: int) -> Check:
    def check(res: Summary, dump: bytes) -> str | None:
        if len(res.versions) != headers or res.ends != ends:
            return f"expected {headers} headers/{ends} ENDs, got {len(res.versions)}/{res.ends}"
        return None

    return check


def _need_dump_lines(res: Summary, dump: bytes) -> str | None:
    """A dump of every stream (sendstream dump, no raw xattr data): one line per command but END."""
    lines = len(dump.splitlines())
    if lines != res.commands - res.ends:
        return f"dump has {lines} lines, the stream {res.commands} commands ({res.ends} END)"
    return None


SPECS: list[Spec] = [
    Spec(
        "rich-full-v1",
        ["--proto", "1", "rich_base"],
        "full v1 stream of the rich tree: files, empty file, sparse file, reflinks (CLONE), "
        "hard links, symlinks, fifo, socket, char/block devices, xattrs (binary, empty, "
        "non-UTF-8 names, security.capability), odd names, modes/owners, deep dirs",
        _need_cmds(
            "subvol",
            "mkfile",
            "mkdir",
            "mknod",
            "mkfifo",
            "mksock",
            "symlink",
            "rename",
            "link",
            "set_xattr",
            "write",
            "clone",
            "truncate",
            "chmod",
            "chown",
            "utimes",
        ),
    ),
    Spec(
        "rich-full-v2",
        ["--proto", "2", "rich_base"],
        "the same tree as rich-full-v1, protocol v2 (DATA without length, 128 KiB writes)",
        _need_cmds("subvol", "write", "clone", "mknod", "mksock", "set_xattr"),
    ),
    Spec(
        "rich-incr-v1",
        ["--proto", "1", "-p", "rich_base", "rich_incr"],
        "incremental v1 rich_base -> rich_incr: file and dir swaps, nesting inversion, "
        "rename over an existing file, unlink, rmdir, append, overwrite, shrink, grow, "
        "punched hole (zeros in v1), chmod/chown, new hard link, symlink retarget, "
        "xattr removal/change",
        _need_cmds(
            "snapshot",
            "rename",
            "unlink",
            "rmdir",
            "link",
            "remove_xattr",
            "set_xattr",
            "write",
            "truncate",
            "chmod",
            "chown",
            "utimes",
        ),
    ),
    Spec(
        "rich-incr-v2",
        ["--proto", "2", "-p", "rich_base", "rich_incr"],
        "the same incremental in v2 (punched hole may become FALLOCATE, chattr changes become FILEATTR)",
        _need_cmds("snapshot", "rename", "unlink", "rmdir", "remove_xattr", "write"),
    ),
    Spec(
        "rich-full-nodata-v1",
        ["--proto", "1", "--no-data", "rich_base"],
        "full v1 --no-data stream of the rich tree: UPDATE_EXTENT instead of WRITE/CLONE",
        _need_cmds("update_extent"),
    ),
    Spec(
        "rich-incr-nodata-v2",
        ["--proto", "2", "--no-data", "-p", "rich_base", "rich_incr"],
        "incremental v2 --no-data stream (UPDATE_EXTENT)",
        _need_cmds("update_extent"),
    ),
    Spec(
        "compressed-v2",
        ["--compressed-data", "comp_snap"],
        "--compressed-data (implies v2): ENCODED_WRITE for zlib, zstd and lzo extents "
        "(incl. partial references into a compressed extent and an inline compressed "
        "extent), btrfs.compression property xattrs, plain WRITE for the uncompressed "
        "overwrite and file",
        _all(_need_cmds("encoded_write", "write"), _need_compressions),
    ),
    Spec(
        "two-concat-v1",
        ["--proto", "1", "two_a_snap", "two_b_snap"],
        "two subvolumes in one command without -e: two complete streams back to back "
        "(btrfs receive --dump shows only the first)",
        _need_streams(2, 2),
    ),
    Spec(
        "two-e-v1",
        ["--proto", "1", "-e", "two_a_snap", "two_b_snap"],
        "two subvolumes with -e: one header, two SUBVOL commands, one END",
        _need_streams(1, 1),
    ),
    Spec("two-concat-v2", ["--proto", "2", "two_a_snap", "two_b_snap"], "as two-concat-v1 in v2", _need_streams(2, 2)),
    Spec("two-e-v2", ["--proto", "2", "-e", "two_a_snap", "two_b_snap"], "as two-e-v1 in v2", _need_streams(1, 1)),
    Spec(
        "clone-src-v1",
        ["--proto", "1", "-c", "work_1", "-c", "lib_snap", "work_2"],
        "clone sources: work_2 holds a whole-file reflink and a partial reflink (other "
        "offset) from lib_snap, and a reflink of a file already in work_1; btrfs send "
        "picks work_1 as parent itself (SNAPSHOT), CLONE commands name lib_snap's UUID",
        _need_cmds("snapshot", "clone"),
    ),
    Spec(
        "clone-src-v2",
        ["--proto", "2", "-c", "work_1", "-c", "lib_snap", "work_2"],
        "as clone-src-v1 in v2",
        _need_cmds("snapshot", "clone"),
    ),
]


# ---------------------------------------------------------------------------
# The v3 stream, written by sendstream (no kernel here writes v3)
# ---------------------------------------------------------------------------

V3_NAME = "verity-v3"
V3_SUBVOL = b"verity_snap"
V3_UUID = uuid.UUID("3f0c9a52-6d1e-4b7a-9c28-e5a4b1d07f63")
V3_CTRANSID = 5
V3_INO = 257
V3_TMP = b"o257-5-0"  # the kernel's orphan name: o<ino>-<generation>-0
V3_FILE = b"file"
SECTOR = 4096
# FALLOCATE mode: FALLOC_FL_KEEP_SIZE | FALLOC_FL_PUNCH_HOLE, what the kernel sends for a hole.
V3_FALLOC_PUNCH_HOLE = 0x01 | 0x02
V3_FILEATTR = 1 << 11  # BTRFS_INODE_COMPRESS
V3_VERITY_SHA256 = 1  # FS_VERITY_HASH_ALG_SHA256
V3_VERITY_SALT = bytes.fromhex("5eed5a1700c0ffee")
V3_VERITY_SIG = b"sendstream fixture: placeholder fs-verity signature (not PKCS#7)\n"


def _timespec(ns: int) -> Timespec:
    return Timespec(*divmod(ns, 1_000_000_000))


V3_ATIME = _timespec(ATIME_BASE)
V3_MTIME = _timespec(MTIME_BASE)
V3_CTIME = _timespec(_ns(1672531200, 333333333))  # 2023-01-01T00:00:00Z
V3_OTIME = _timespec(_ns(1672531199, 444444444))  # one second earlier


def _lines(tag: bytes, size: int) -> bytes:
    """Deterministic text of exactly *size* bytes (no PRNG involved)."""
    out = b"".join(b"%s line %05d of a verity-protected file\n" % (tag, i) for i in range(size // 16 + 1))
    return out[:size]


def v3_commands() -> list[Command]:
    """The commands of verity-v3.stream, in the kernel's command and attribute orders."""
    head = _lines(b"plain", SECTOR)  # WRITE at 0
    # FALLOCATE punches [SECTOR, 2*SECTOR); ENCODED_WRITE covers [2*SECTOR, 4*SECTOR).
    unencoded = _lines(b"zlib", 2 * SECTOR)
    # zlib, not zstd: the stdlib module makes the bytes the same wherever this runs.
    # Level 3 is btrfs' default; like the kernel, send the sector-padded disk bytes.
    packer = zlib.compressobj(3, zlib.DEFLATED, 15)
    compressed = packer.compress(unencoded) + packer.flush()
    compressed += bytes(-len(compressed) % SECTOR)
    if zlib.decompressobj().decompress(compressed) != unencoded:  # pragma: no cover - sanity
        raise AssertionError("zlib round trip failed")
    times = [("atime", V3_ATIME), ("mtime", V3_MTIME), ("ctime", V3_CTIME), ("otime", V3_OTIME)]
    f = V3_FILE
    return [
        Command.build("subvol", [("path", V3_SUBVOL), ("uuid", V3_UUID), ("ctransid", V3_CTRANSID)]),
        Command.build("chown", [("path", b""), ("uid", 0), ("gid", 0)]),
        Command.build("chmod", [("path", b""), ("mode", 0o755)]),
        Command.build("mkfile", [("path", V3_TMP), ("ino", V3_INO)]),
        Command.build("rename", [("path", V3_TMP), ("path_to", f)]),
        Command.build("write", [("path", f), ("file_offset", 0), ("data", head)]),
        Command.build(
            "fallocate",
            [("path", f), ("fallocate_mode", V3_FALLOC_PUNCH_HOLE), ("file_offset", SECTOR), ("size", SECTOR)],
        ),
        Command.build(
            "encoded_write",
            [
                ("path", f),
                ("file_offset", 2 * SECTOR),
                ("unencoded_file_len", len(unencoded)),
                ("unencoded_len", len(unencoded)),
                ("unencoded_offset", 0),
                ("compression", 1),  # zlib
                ("encryption", 0),
                ("data", compressed),
            ],
        ),
        Command.build("chown", [("path", f), ("uid", 0), ("gid", 0)]),
        Command.build("chmod", [("path", f), ("mode", 0o644)]),
        Command.build("fileattr", [("path", f), ("fileattr", V3_FILEATTR)]),
        Command.build(
            "enable_verity",
            [
                ("path", f),
                ("verity_algorithm", V3_VERITY_SHA256),
                ("verity_block_size", SECTOR),
                ("verity_salt_data", V3_VERITY_SALT),
                ("verity_sig_data", V3_VERITY_SIG),
            ],
        ),
        Command.build("utimes", [("path", f), *times]),
        Command.build("utimes", [("path", b""), *times]),
        Command.build("end"),
    ]


def v3_stream() -> bytes:
    """verity-v3.stream, byte for byte."""
    return encode_stream_header(3) + b"".join(encode_command(cmd, 3) for cmd in v3_commands())


V3_SPEC = Spec(
    V3_NAME,
    [],
    "protocol v3, written by sendstream's own writer (no kernel here writes v3): SUBVOL, CHOWN/CHMOD of the "
    "root, MKFILE + RENAME, WRITE (DATA without length), FALLOCATE (punch hole), zlib ENCODED_WRITE, FILEATTR, "
    "ENABLE_VERITY (sha256, 4 KiB blocks, 8-byte salt, signature), UTIMES with OTIME, in the kernel's attribute "
    "orders. The dump is `TZ=UTC sendstream dump --progs-style 6.2` output: btrfs-progs 6.2 rejects v3 streams "
    "(`ERROR: stream version 3 not supported`)",
    _all(
        _need_cmds(
            "subvol",
            "chown",
            "chmod",
            "mkfile",
            "rename",
            "write",
            "encoded_write",
            "fallocate",
            "fileattr",
            "enable_verity",
            "utimes",
        ),
        _need_streams(1, 1),
        _need_dump_lines,
    ),
)


def sendstream_cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    """Run the sendstream CLI of this interpreter with TZ=UTC."""
    return subprocess.run(
        [sys.executable, "-m", "sendstream", *args], capture_output=True, env=dict(os.environ, TZ="UTC")
    )


def write_v3(outdir: pathlib.Path) -> None:
    """Write verity-v3.stream and verity-v3.dump into *outdir*."""
    stream = outdir / f"{V3_NAME}.stream"
    tmp = stream.with_suffix(".stream.tmp")
    tmp.write_bytes(v3_stream())
    os.replace(tmp, stream)
    # in 6.2's style, as the other stored dumps (btrfs-progs 6.2's own)
    proc = sendstream_cli("dump", "--progs-style", "6.2", str(stream))
    if proc.returncode != 0:
        raise SystemExit(f"sendstream dump {stream} failed: {proc.stderr.decode(errors='replace')}")
    (outdir / f"{V3_NAME}.dump").write_bytes(proc.stdout)


def check_v3(outdir: pathlib.Path, problems: list[str]) -> None:
    """The files on disk are what v3_stream() writes; `sendstream verify` passes, `convert` gives the
    same bytes back and `dump` the stored dump."""
    stream = outdir / f"{V3_NAME}.stream"
    name = V3_NAME
    try:
        data = stream.read_bytes()
        dump = stream.with_suffix(".dump").read_bytes()
    except OSError as exc:
        problems.append(f"{name}: {exc}")
        return
    if data != v3_stream():
        problems.append(f"{name}: the stored stream differs from what v3_stream() writes now (edited? another zlib?)")
    proc = sendstream_cli("verify", "-q", str(stream))
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        problems.append(f"{name}: sendstream verify exit {proc.returncode}: {err}")
    with tempfile.TemporaryDirectory() as tmpdir:
        out = pathlib.Path(tmpdir) / "converted.stream"
        proc = sendstream_cli("convert", str(stream), str(out))
        if proc.returncode != 0 or not out.exists() or out.read_bytes() != data:
            problems.append(f"{name}: sendstream convert does not give the same bytes back")
    proc = sendstream_cli("dump", "--progs-style", "6.2", str(stream))
    if proc.returncode != 0 or proc.stdout != dump:
        problems.append(f"{name}: the stored dump differs from `TZ=UTC sendstream dump --progs-style 6.2`")


# ---------------------------------------------------------------------------
# Checking, the manifest, main
# ---------------------------------------------------------------------------

STREAM_BUDGET = 300 * 1024
TOTAL_BUDGET = 3 * 1024 * 1024


def human(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n < 1024 * 1024 else f"{n / 1048576:.2f} MiB"


def btrfs_dump(stream: pathlib.Path) -> tuple[bytes, str | None]:
    """Stdout of ``TZ=UTC btrfs receive --dump < stream`` and an error, if it failed."""
    with open(stream, "rb") as f:
        proc = subprocess.run(
            ["btrfs", "receive", "--dump"], stdin=f, capture_output=True, env=dict(os.environ, TZ="UTC")
        )
    err = None
    if proc.returncode != 0:
        err = f"btrfs receive --dump failed: {proc.stderr.decode(errors='replace').strip()}"
    return proc.stdout, err


def check_stream(spec: Spec, outdir: pathlib.Path, problems: list[str], rerun_dump: bool = False) -> Result | None:
    """Read NAME.stream with the library and check it against its spec, NAME.dump and the size budget.

    With *rerun_dump* a kernel stream's stored dump must also equal a fresh ``btrfs receive --dump``.
    """
    stream = outdir / f"{spec.name}.stream"
    try:
        dump = stream.with_suffix(".dump").read_bytes()
        size = stream.stat().st_size
        res = summarize_path(stream)
    except (OSError, FormatError) as exc:
        problems.append(f"{spec.name}: {exc}")
        return None
    if rerun_dump and spec.args:
        fresh, err = btrfs_dump(stream)
        if err:
            problems.append(f"{spec.name}: {err}")
        elif fresh != dump:
            problems.append(f"{spec.name}: the stored dump differs from a fresh `btrfs receive --dump`")
    if spec.require and (err := spec.require(res, dump)):
        problems.append(f"{spec.name}: {err}")
    if size > STREAM_BUDGET:
        problems.append(f"{spec.name}: {size} bytes is over the {human(STREAM_BUDGET)} budget")
    return Result(spec, size, res)


def check_all(outdir: pathlib.Path, problems: list[str], rerun_dump: bool = False) -> list[Result]:
    """check_stream() every fixture in *outdir*, check_v3(), and the total size budget."""
    results = [r for spec in SPECS if (r := check_stream(spec, outdir, problems, rerun_dump))]
    check_v3(outdir, problems)
    if r := check_stream(V3_SPEC, outdir, problems):
        results.append(r)
        _check_kernel_orders(r, results, problems)
    total = sum(p.stat().st_size for p in outdir.iterdir() if p.is_file())
    print(f"total size of {outdir}: {human(total)}")
    if total > TOTAL_BUDGET:
        problems.append(f"fixtures total {total} bytes is over the {human(TOTAL_BUDGET)} budget")
    return results


def _check_kernel_orders(ours: Result, results: list[Result], problems: list[str]) -> None:
    """Our writer's attribute orders must be ones the kernel emitted (for commands seen from the kernel)."""
    kernel: dict[str, set[tuple[str, ...]]] = {}
    for r in results:
        if r.spec.args:
            for name, orders in r.summary.attr_orders.items():
                kernel.setdefault(name, set()).update(orders)
    for name, orders in ours.summary.attr_orders.items():
        for order in orders:
            if name in kernel and order not in kernel[name]:
                problems.append(f"{ours.spec.name}: {name} order {', '.join(order)} is not one the kernel emitted")


def build_kernel_streams(outdir: pathlib.Path, problems: list[str]) -> None:
    """Make the trees on a fresh loop btrfs; write every SPECS stream and its btrfs dump."""
    with btrfs_loop("512M", mount_opts="noatime,commit=300") as mnt:
        build_rich(mnt)
        snapshot_ro(mnt, "rich", "rich_base")
        modify_rich(mnt)
        snapshot_ro(mnt, "rich", "rich_incr")
        build_comp(mnt)
        snapshot_ro(mnt, "comp", "comp_snap")
        build_two(mnt)
        snapshot_ro(mnt, "two_a", "two_a_snap")
        snapshot_ro(mnt, "two_b", "two_b_snap")
        build_clone(mnt)
        os.sync()

        for spec in SPECS:
            stream_path = outdir / f"{spec.name}.stream"
            tmp = stream_path.with_suffix(".stream.tmp")
            with open(tmp, "wb") as f:
                run(["btrfs", "send", *spec.args], cwd=mnt, stdout=f)
            os.replace(tmp, stream_path)
            dump, err = btrfs_dump(stream_path)
            if err:
                problems.append(f"{spec.name}: {err}")
            (outdir / f"{spec.name}.dump").write_bytes(dump)


def _counts_str(res: Summary) -> str:
    return " ".join(f"{k}={v}" for k, v in sorted(res.counts.items()))


def print_summary(results: list[Result]) -> None:
    print(f"{'name':<22} {'bytes':>8} {'ver':>4} {'cmds':>5}  counts")
    for r in results:
        res = r.summary
        vers = ",".join(map(str, res.versions))
        print(f"{r.spec.name:<22} {r.size:>8} {vers:>4} {res.commands:>5}  {_counts_str(res)}")
        if res.compressions:
            print(
                f"{'':<22} {'':>8} {'':>4} {'':>5}  encoded_write compression values: "
                f"{dict(sorted(res.compressions.items()))}"
            )


def generated_with() -> str:
    """'kernel X, btrfs-progs vY' of this machine."""
    progs = subprocess.run(["btrfs", "--version"], capture_output=True, text=True).stdout.strip()
    return f"kernel {platform.release()}, {progs}"


_GENERATED_WITH = re.compile(r"`btrfs send` \((kernel [^)]*)\)")


def recorded_generated_with(outdir: pathlib.Path) -> str:
    """The kernel and btrfs-progs the existing MANIFEST.md names (the kernel streams' origin)."""
    try:
        m = _GENERATED_WITH.search((outdir / "MANIFEST.md").read_text(encoding="utf-8"))
    except OSError:
        m = None
    return m.group(1) if m else "kernel and btrfs-progs not recorded"


def _orders_lines(results: list[Result]) -> list[str]:
    """One line per command and attribute order seen in *results*, most frequent first."""
    merged: dict[str, dict[tuple[str, ...], tuple[int, set[int]]]] = {}
    for r in results:
        for name, orders in r.summary.attr_orders.items():
            for order, n in orders.items():
                cnt, vers = merged.setdefault(name, {}).get(order, (0, set()))
                merged[name][order] = (cnt + n, vers | set(r.summary.versions))
    lines = []
    for name in sorted(merged, key=lambda n: COMMAND_NUMBERS.get(n, 99)):
        for order, (n, vers) in sorted(merged[name].items(), key=lambda kv: -kv[1][0]):
            vs = ", ".join(f"v{v}" for v in sorted(vers))
            lines.append(f"- `{name}`: {', '.join(order) or '(none)'} [{n}; {vs}]")
    return lines


def render_manifest(results: list[Result], kernel_info: str) -> str:
    """fixtures/MANIFEST.md: one line per stream, then the observed attribute orders."""
    kernel = [r for r in results if r.spec.args]
    ours = [r for r in results if not r.spec.args]
    lines = [
        "# Send stream fixtures",
        "",
        f"Generated by `python3 tools/make_fixtures.py` with the real kernel `btrfs send` "
        f"({kernel_info}) on a fresh file-backed btrfs (`tests/support/loopfs.py`, mounted "
        "`noatime,commit=300`). Each `NAME.stream` is the exact output of the command shown "
        "(run in the mount point; all sent subvolumes are read-only snapshots); "
        "`NAME.dump` is the exact stdout of `TZ=UTC btrfs receive --dump < NAME.stream`.",
        "",
        f"The exception is `{V3_NAME}`: no kernel here writes protocol v3, so sendstream's own writer makes it "
        "(`python3 tools/make_fixtures.py --v3-only`, byte-deterministic), and as btrfs-progs 6.2 cannot read "
        f"v3 streams, `{V3_NAME}.dump` is the stdout of `TZ=UTC sendstream dump --progs-style 6.2 {V3_NAME}.stream` "
        "(the 6.2 text, as every stored dump).",
        "",
        "Content is deterministic (seeded data, fixed atime/mtime) but UUIDs, transids, "
        "ctimes and otimes change on every run. btrfs-progs 6.2 prints xattr data raw, so "
        "values with newlines break dump lines, and `receive --dump` only dumps the first "
        "stream of a file holding several streams back to back (the `two-concat-*` dumps "
        "show subvolume two_a_snap only).",
        "",
        "| stream | bytes | what it contains | command |",
        "|---|---:|---|---|",
    ]
    for r in results:
        if r.spec.args:
            cmd = "btrfs send " + " ".join(r.spec.args) + f" > {r.spec.name}.stream"
        else:
            cmd = "python3 tools/make_fixtures.py --v3-only"
        lines.append(f"| `{r.spec.name}` | {r.size} | {r.spec.what}. Commands: {_counts_str(r.summary)} | `{cmd}` |")
    lines += [
        "",
        "## Attribute orders the kernel emitted",
        "",
        "Per command, every TLV order seen across these fixtures, with how often and in which stream versions.",
        "",
        *_orders_lines(kernel),
    ]
    if ours:
        lines += [
            "",
            f"## Attribute orders in `{V3_NAME}` (sendstream's writer)",
            "",
            "The kernel's orders above; ENABLE_VERITY in the order of the kernel's send_verity().",
            "",
            *_orders_lines(ours),
        ]
    comp: collections.Counter[int] = collections.Counter()
    for r in kernel:
        comp.update(r.summary.compressions)
    seen = {n for r in kernel for n in r.summary.counts}
    lines += [
        "",
        "## Observed when generating",
        "",
        f"- ENCODED_WRITE compression values: {dict(sorted(comp.items()))} "
        "(1 zlib, 2 zstd, 3..7 lzo with 4K..64K sectors).",
        f"- FALLOCATE {'appears' if 'fallocate' in seen else 'does not appear'}; "
        f"FILEATTR {'appears' if 'fileattr' in seen else 'does not appear'} "
        "(the kernel sends FILEATTR only for an inode whose flags changed in an "
        "incremental send, never for new inodes).",
        f"- largest command payload: {max((r.summary.max_payload for r in kernel), default=0)} bytes.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="make_fixtures.py", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "outdir", nargs="?", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent / "fixtures"
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--v3-only", action="store_true", help=f"write only {V3_NAME}.* and MANIFEST.md (no root needed)")
    mode.add_argument("--check-only", action="store_true", help="re-check the existing files; write nothing")
    mode.add_argument(
        "--clone-tree",
        type=pathlib.Path,
        metavar="DIR",
        help="only build the subvolumes of the clone-src fixtures (lib, lib_snap, work, work_1, work_2) in DIR, "
        "a directory on a mounted btrfs (the tests compare extractions against them)",
    )
    args = parser.parse_args(argv[1:])
    if args.clone_tree:
        build_clone(args.clone_tree)
        return 0
    outdir: pathlib.Path = args.outdir
    problems: list[str] = []
    manifest = outdir / "MANIFEST.md"

    if args.check_only:
        rerun = shutil.which("btrfs") is not None
        if not rerun:
            print("btrfs-progs not installed: stored dumps are not compared with btrfs receive --dump")
        results = check_all(outdir, problems, rerun_dump=rerun)
        print_summary(results)
        want = render_manifest(results, recorded_generated_with(outdir))
        have = manifest.read_text(encoding="utf-8") if manifest.exists() else ""
        if want != have:
            sys.stdout.writelines(
                difflib.unified_diff(have.splitlines(True), want.splitlines(True), str(manifest), "expected")
            )
            problems.append(f"{manifest} is out of date (python3 tools/make_fixtures.py --v3-only rewrites it)")
    else:
        outdir.mkdir(parents=True, exist_ok=True)
        if args.v3_only:
            kernel_info = recorded_generated_with(outdir)
        else:
            reason = require_btrfs()
            if reason:
                print(f"cannot build fixtures here: {reason}", file=sys.stderr)
                return 2
            # Make SIGTERM/SIGHUP unwind through the finally blocks (unmount, detach).
            for sig in (signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, lambda s, _f: sys.exit(128 + s))
            build_kernel_streams(outdir, problems)
            kernel_info = generated_with()
        write_v3(outdir)
        results = check_all(outdir, problems)
        print_summary(results)
        manifest.write_text(render_manifest(results, kernel_info), encoding="utf-8")
    for p in problems:
        print("PROBLEM:", p, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
