"""A differential campaign against the kernel: seeded file-system histories on loop-device btrfs,
sent by the kernel, and what sendstream and btrfs-progs make of each stream.

A history is one seed: a mount (plain, ``compress=zstd`` or ``compress=lzo``), a subvolume built by
random operations, its read-only snapshot A, more operations, snapshot B. The kernel sends A and B in
full and B incrementally from A, in v1, in v2, and in v2 with ``--compressed-data`` on a compressed
mount. The oracles, each a *case* counted on its own:

- ``verify``: ``sendstream verify`` accepts each stream;
- ``dump``: ``sendstream dump --progs-style 6.2 --raw-xattr-data`` is byte for byte ``btrfs receive
  --dump`` of the system's btrfs-progs 6.2, and ``dump-6.14``: ``sendstream dump`` that of btrfs-progs
  6.14 where ``tools/setup-tests`` unpacked it (:func:`dump_oracles`);
- ``receive``: ``btrfs receive`` of each chain (A; B; A then the incremental) makes the source snapshot;
- ``extract``: ``sendstream extract`` of each chain makes the source snapshot (the incremental in place,
  onto the extraction of A, an untouched one as ``--clone-from``);
- ``convert``: ``sendstream convert --to-version 1`` of each v2 stream, then ``btrfs receive``, makes
  the source snapshot.

Trees are compared with :func:`support.trees.compare`, less the hole map (:func:`tree_differences`).
What the kernel or sendstream is known to get wrong is named in :data:`KNOWN` and recognised by
:func:`known`; a difference it does not recognise is a finding. Used by
tests/system/test_kernel_differential.py (a few seeds) and tools/differential.py (the long run).
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import random
import shutil
import struct
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sendstream import Command
from sendstream.io.windows import iter_events
from support.btrfs import UNPACKED_PROGS
from support.loopfs import btrfs_loop
from support.trees import compare, describe

# A difference of two trees (support.trees.compare): the entry, the attribute, the source's, the made tree's.
Diff = tuple[bytes | None, str, Any, Any]
MOUNTS = ("", "compress=zstd", "compress=lzo")
ORACLES = ("verify", "dump", "dump-6.14", "receive", "extract", "convert")
# Every oracle runs in the C locale (progs escapes by isprint()) and in one zone (dump prints local times).
ENV = dict(os.environ, LC_ALL="C", TZ="UTC")

# Caps: a file's data, a file's size (truncate and sparse writes reach past its data) and the bytes
# written in a history; a v1 incremental sends the zeros of a sparse file as data.
MAX_WRITE = 256 * 1024
MAX_SIZE = 768 * 1024
MAX_HISTORY_BYTES = 4 * 1024 * 1024
# The most operations before snapshot A, and again before B (each history draws from half of it up).
OPS = 40

FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FICLONERANGE = 0x4020940D  # _IOW(0x94, 13, struct file_clone_range)

_libc = ctypes.CDLL(None, use_errno=True)
_libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    """fallocate(2) with its mode (os.posix_fallocate has none)."""
    if _libc.fallocate(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def clone_range(src_fd: int, src_offset: int, length: int, dst_fd: int, dst_offset: int) -> None:
    """FICLONERANGE: the destination's range shares the source's extents (a reflink)."""
    fcntl.ioctl(dst_fd, FICLONERANGE, struct.pack("qQQQ", src_fd, src_offset, length, dst_offset))


def run(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([os.fspath(a) for a in args], capture_output=True, env=ENV)


def must(*args: str | Path) -> bytes:
    proc = run(*args)
    if proc.returncode != 0:
        raise RuntimeError(
            f"{' '.join(map(str, args))}: exit {proc.returncode}: {proc.stderr.decode(errors='replace')}"
        )
    return proc.stdout


def sendstream(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    return run(sys.executable, "-m", "sendstream", *args)


# --- the histories -----------------------------------------------------------


@dataclass
class Switches:
    """What the generator steers around, by name, unless switched on.

    ``inline_fallocate``: fallocate on a file smaller than a block on a compressed mount too (kernel
    defect (c) of issue 27: ``--compressed-data`` sends a compressed inline extent grown by fallocate
    as an encoded write of its own length, without the size)."""

    inline_fallocate: bool = False


def entries(root: bytes) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """The regular files, directories (the root as ``b""``) and symlinks below ``root``, sorted so that a
    seed makes the same choices; directories are listed with O_NOATIME, as reading one would change the
    inode (and the kernel send its times where the history changed nothing)."""
    files: list[bytes] = []
    dirs: list[bytes] = []
    links: list[bytes] = []

    def visit(rel: bytes) -> None:
        dirs.append(rel)
        fd = os.open(os.path.join(root, rel) if rel else root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOATIME)
        try:
            with os.scandir(fd) as it:
                listed = sorted(
                    (
                        os.fsencode(e.name),
                        e.is_dir(follow_symlinks=False),
                        e.is_symlink(),
                        e.is_file(follow_symlinks=False),
                    )
                    for e in it
                )
        finally:
            os.close(fd)
        for name, is_dir, is_link, is_file in listed:
            p = os.path.join(rel, name) if rel else name
            if is_dir:
                visit(p)
            elif is_link:
                links.append(p)
            elif is_file:
                files.append(p)

    visit(b"")
    return files, dirs, links


class History:
    """Random operations on the tree below ``root``, drawn from ``rng``; bytes paths throughout."""

    def __init__(self, rng: random.Random, root: Path, compressed: bool, switches: Switches) -> None:
        self.rng = rng
        self.root = os.fsencode(root)
        self.compressed = compressed
        self.switches = switches
        self.written = 0
        self.ops: dict[str, int] = {}
        self.clone_sources: list[bytes] = []  # roots of read-only snapshots to reflink from
        self.below_root = False  # change nothing in the root directory itself

    def full(self, rel: bytes) -> bytes:
        return os.path.join(self.root, rel) if rel else self.root

    def name(self) -> bytes:
        r = self.rng
        kind = r.randrange(10)
        base = b"n%d" % r.randrange(1000)
        if kind == 0:
            return base + b" with space"
        if kind == 1:
            return base + b"\nnewline"
        if kind == 2:
            return base + bytes([0xFF, 0xFE, r.randrange(0x80, 0x100)])  # not UTF-8
        if kind == 3:
            return (base + b"L" * 255)[: r.randrange(200, 256)]
        if kind == 4:
            return base + "é-ü".encode() + b"\\=\t"
        return base

    def new_path(self, dirs: list[bytes]) -> bytes:
        d = self.rng.choice(dirs)
        for _ in range(5):
            n = self.name()
            p = os.path.join(d, n) if d else n
            if not os.path.lexists(self.full(p)):
                return p
        return os.path.join(d, b"u%d" % self.rng.randrange(10**9)) if d else b"u%d" % self.rng.randrange(10**9)

    def data(self, n: int) -> bytes:
        n = max(0, min(n, MAX_WRITE, MAX_HISTORY_BYTES - self.written))
        self.written += n
        kind = self.rng.randrange(3)
        if kind == 0:
            return self.rng.randbytes(n)
        if kind == 1:
            return bytes(n)
        return (b"compressible %d " % self.rng.randrange(100) * (n // 14 + 1))[:n]

    def size(self) -> int:
        """Empty, inline-sized, a few blocks, or up to the cap."""
        low, high = self.rng.choice([(0, 1), (1, 100), (100, 4000), (4096, 65536), (4096, 65536), (65536, MAX_WRITE)])
        return self.rng.randrange(low, high)

    def offset(self, size: int) -> int:
        r = self.rng.randrange(4)
        if r == 0:
            return self.rng.randrange(0, size + 1)
        if r == 1:
            return self.rng.randrange(0, size // 4096 + 2) * 4096
        if r == 2:
            return size
        return size + self.rng.randrange(1, 200000)  # a hole before the data

    def step(self) -> None:
        files, dirs, links = entries(self.root)
        parents, movable = dirs, dirs[1:]  # where new names go; the directories that may move or go
        if self.below_root:  # the root keeps its entries and times: the incremental sends no UTIMES of it
            parents = dirs[1:]
            files, links, movable = ([p for p in x if b"/" in p] for x in (files, links, movable))
            if not parents:
                return
        ops: list[tuple[int, str, Callable[[], None]]] = [(6, "create", lambda: self.create(parents))]
        if files:
            f = self.rng.choice(files)
            ops += [
                (5, "write", lambda: self.write(f)),
                (2, "truncate", lambda: self.truncate(f)),
                (2, "fallocate", lambda: self.falloc(f)),
                (2, "reflink", lambda: self.reflink(files, parents)),
                (2, "hardlink", lambda: os.link(self.full(f), self.full(self.new_path(parents)))),
                (1, "unlink", lambda: os.unlink(self.full(f))),
            ]
        ops += [
            (2, "mkdir", lambda: os.mkdir(self.full(self.new_path(parents)))),
            (2, "symlink", lambda: os.symlink(self.target(), self.full(self.new_path(parents)))),
            (1, "mkfifo", lambda: os.mkfifo(self.full(self.new_path(parents)))),
            (3, "rename", lambda: self.rename(files + links + movable, parents)),
            (2, "swap", lambda: self.swap(files + links + movable)),
            (3, "xattr", lambda: self.xattr(files + parents)),
            (4, "attrs", lambda: self.attrs(files + links + parents)),
        ]
        if movable:
            ops.append((1, "rmdir", lambda: self.rmdir(movable)))
        if self.clone_sources:
            ops.append((3, "reflink-across", lambda: self.reflink_across(files, parents)))
        pick = self.rng.randrange(sum(w for w, _, _ in ops))
        for w, name, op in ops:
            if pick < w:
                with contextlib.suppress(OSError):  # a move into its own subtree, a clone refused: go on
                    op()
                self.ops[name] = self.ops.get(name, 0) + 1
                return
            pick -= w

    def create(self, dirs: list[bytes]) -> None:
        p = self.full(self.new_path(dirs))
        with open(p, "wb") as f:
            f.write(self.data(self.size()))

    def write(self, rel: bytes) -> None:
        p = self.full(rel)
        size = os.path.getsize(p)
        off = min(self.offset(size), MAX_SIZE)
        data = self.data(min(self.size(), MAX_SIZE - off))
        if self.rng.randrange(4) == 0:
            off = size  # append
        fd = os.open(p, os.O_WRONLY)
        try:
            os.pwrite(fd, data, off)
        finally:
            os.close(fd)

    def truncate(self, rel: bytes) -> None:
        size = os.path.getsize(self.full(rel))
        new = self.rng.randrange(0, size + 1) if self.rng.randrange(2) else min(self.offset(size), MAX_SIZE)
        os.truncate(self.full(rel), new)

    def falloc(self, rel: bytes) -> None:
        p = self.full(rel)
        size = os.path.getsize(p)
        if self.compressed and size < 4096 and not self.switches.inline_fallocate:
            return
        mode = self.rng.choice([0, FALLOC_FL_KEEP_SIZE, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE])
        off = self.offset(size) if mode != FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE else self.rng.randrange(size + 1)
        off = min(off, MAX_SIZE - 1)
        length = self.rng.randrange(1, min(MAX_SIZE - off, 3 * 65536) + 1)
        fd = os.open(p, os.O_WRONLY)
        try:
            fallocate(fd, mode, off, length)
        finally:
            os.close(fd)

    def _clone(self, src: bytes, dst: bytes) -> None:
        """Whole file (``cp --reflink``), or a block-aligned range into an existing file."""
        if self.rng.randrange(2) or not os.path.exists(dst):
            proc = run("cp", "--reflink=always", "--", os.fsdecode(src), os.fsdecode(dst))
            if proc.returncode != 0:  # e.g. two names of one file: skipped like a refused clone
                raise OSError(failed(proc))
            return
        size = os.path.getsize(src)
        so = self.rng.randrange(0, size // 4096 + 1) * 4096
        length = 0 if self.rng.randrange(2) else self.rng.randrange(1, 17) * 4096  # 0: to the end
        if length and so + length > size:
            length = 0
        do = min(self.rng.randrange(0, os.path.getsize(dst) // 4096 + 2) * 4096, MAX_SIZE - MAX_WRITE)
        sfd = os.open(src, os.O_RDONLY)
        dfd = os.open(dst, os.O_WRONLY)
        try:
            clone_range(sfd, so, length, dfd, do)
        finally:
            os.close(sfd)
            os.close(dfd)

    def reflink(self, files: list[bytes], dirs: list[bytes]) -> None:
        src = self.full(self.rng.choice(files))
        dst = self.full(self.rng.choice(files)) if self.rng.randrange(2) else self.full(self.new_path(dirs))
        if src != dst:
            self._clone(src, dst)

    def reflink_across(self, files: list[bytes], dirs: list[bytes]) -> None:
        snap = self.rng.choice(self.clone_sources)
        theirs = entries(snap)[0]
        if theirs:
            into_existing = files and self.rng.randrange(2)
            dst = self.full(self.rng.choice(files) if into_existing else self.new_path(dirs))
            self._clone(os.path.join(snap, self.rng.choice(theirs)), dst)

    def rename(self, paths: list[bytes], dirs: list[bytes]) -> None:
        if not paths:
            return
        src = self.rng.choice(paths)
        dst = self.rng.choice(paths) if self.rng.randrange(3) == 0 else self.new_path(dirs)
        os.rename(self.full(src), self.full(dst))  # over an existing name too (an empty directory, a file)

    def swap(self, paths: list[bytes]) -> None:
        """a -> tmp, b -> a, tmp -> b: a cycle the kernel resolves with temporary names."""
        if len(paths) < 2:
            return
        a, b = self.rng.sample(paths, 2)
        if a.startswith(b + b"/") or b.startswith(a + b"/"):
            return
        tmp = os.path.join(os.path.dirname(a), b"swap-tmp")
        os.rename(self.full(a), self.full(tmp))
        os.rename(self.full(b), self.full(a))
        os.rename(self.full(tmp), self.full(b))

    def rmdir(self, dirs: list[bytes]) -> None:
        d = self.rng.choice(dirs)
        if self.rng.randrange(2):
            os.rmdir(self.full(d))
        else:
            shutil.rmtree(self.full(d))

    def target(self) -> bytes:
        r = self.rng.randrange(4)
        if r == 0:
            return b"../" + self.name()
        if r == 1:
            return b"/abs/" + self.name() * self.rng.randrange(1, 4)
        if r == 2:
            return self.rng.randbytes(self.rng.randrange(1, 60)).replace(b"\0", b"z") or b"z"
        return self.name()

    def xattr(self, paths: list[bytes]) -> None:
        p = self.full(self.rng.choice(paths))
        names = os.listxattr(p)
        user = [n for n in names if n.startswith("user.")]
        if user and self.rng.randrange(4) == 0:
            os.removexattr(p, self.rng.choice(user))
            return
        name = self.rng.choice(user) if user and self.rng.randrange(2) else f"user.k{self.rng.randrange(50)}"
        r = self.rng.randrange(4)
        value = [
            b"",
            b"text value %d" % self.rng.randrange(100),
            self.rng.randbytes(self.rng.randrange(1, 64)),
            b"v" * self.rng.randrange(100, 2000),
        ][r]
        os.setxattr(p, name, value)

    def attrs(self, paths: list[bytes]) -> None:
        rel = self.rng.choice(paths)
        p = self.full(rel)
        is_link = os.path.islink(p)
        r = self.rng.randrange(3)
        if r == 0 and not is_link:
            os.chmod(p, self.rng.randrange(0o10000))
        elif r == 1:
            uid, gid = self.rng.choice([0, 1000, 65534, 4242]), self.rng.choice([0, 100, 65534, 4242])
            os.chown(p, uid, gid, follow_symlinks=False)
        else:
            now = 1_790_000_000 * 10**9
            t = [now + self.rng.randrange(-(10**18), 10**17) for _ in range(2)]
            os.utime(p, ns=(t[0], t[1]), follow_symlinks=False)

    def run(self, n: int) -> None:
        for _ in range(n):
            self.step()
        os.sync()


# --- the oracles -------------------------------------------------------------


def dump_oracles() -> list[tuple[str, str, tuple[str, ...]]]:
    """Each dump oracle there is here: its name, the btrfs-progs binary, and the arguments of ``sendstream
    dump`` that print that release's text exactly (6.2 prints xattr data raw)."""
    found: list[tuple[str, str, tuple[str, ...]]] = [("dump", "btrfs", ("--progs-style", "6.2", "--raw-xattr-data"))]
    if UNPACKED_PROGS.exists():
        found.append(("dump-6.14", str(UNPACKED_PROGS), ("--progs-style", "6.14")))
    return found


@dataclass
class Failure:
    seed: int
    oracle: str
    case: str  # the stream or chain, e.g. "v2-cdata incr"
    detail: list[str]
    known: str | None  # the name of the known defect, or None: a finding

    def __str__(self) -> str:
        what = f"known {self.known}" if self.known else "FINDING"
        return f"seed {self.seed} {self.oracle} {self.case}: {what}: " + "; ".join(self.detail[:6])


# Differences of a tree from its source snapshot that are known, by name: each recognised by known().
KNOWN = {
    "kernel-root-times": "kernel defect (a) of issue 27: an incremental that renames an inode from a temporary "
    "name in the subvolume root sends no UTIMES for the root; both receivers keep the root's times of the run",
    "kernel-inline-fallocate": "kernel defect (c) of issue 27: with --compressed-data, a compressed inline extent "
    "whose file fallocate grew is sent as an encoded write of its own length and no truncate: the file is short",
    "kernel-inline-encoded-stale": "kernel defect found by this campaign (seed 10021 of tools/differential.py at "
    "f291159): with --compressed-data, an incremental that makes the first block of an existing, longer file a "
    "compressed inline extent followed by more data sends an encoded write of the inline bytes and TRUNCATE 4096; "
    "the rest of that block keeps the parent's bytes in both receivers (the size is right, the content not)",
    "convert-punch-size": "finding of issue 27 (fixed in branch i27-findings): convert --to-version 1 writes the "
    "zeros of a FALLOCATE punch (keep size) past the file's end, so the file grows",
}


def known(oracle: str, case: str, diffs: Sequence[Diff], streams: Sequence[Path]) -> str | None:
    """The name of the known defect that explains ``diffs`` (of :func:`support.trees.compare`) of ``case``
    (the variant and the step, "v2-cdata incr"), or None."""
    variant, step = case.split()
    if not diffs:
        return None
    if step == "incr" and all(rel == b"" and key in ("atime", "mtime") for rel, key, _, _ in diffs):
        return "kernel-root-times"
    sizes = [(x, y) for _, key, x, y in diffs if key == "size"]
    only_data = sizes and all(key in ("size", "sha256") for _, key, _, _ in diffs)
    inline = variant == "v2-cdata" and any(inline_encoded(s) for s in streams)
    if inline and only_data and all(y < x and y < 4096 for x, y in sizes):
        return "kernel-inline-fallocate"
    if inline and step == "incr" and not sizes and all(key == "sha256" for _, key, _, _ in diffs):
        return "kernel-inline-encoded-stale"
    if oracle == "convert" and only_data and all(y > x for x, y in sizes) and any(punches(s) for s in streams):
        return "convert-punch-size"
    return None


def inline_encoded(stream: Path) -> bool:
    """An ENCODED_WRITE of a compressed inline extent: at offset 0, of less than a block."""
    with stream.open("rb") as f:
        return any(
            isinstance(ev, Command)
            and ev.name == "encoded_write"
            and ev.get("file_offset") == 0
            and ev.get("unencoded_file_len") < 4096
            for ev in iter_events(f)
        )


def punches(stream: Path) -> bool:
    """A FALLOCATE that punches a hole and keeps the size, as the kernel sends for holes in v2."""
    with stream.open("rb") as f:
        return any(
            isinstance(ev, Command) and ev.name == "fallocate" and ev.get("fallocate_mode") == 3
            for ev in iter_events(f)
        )


def tree_differences(source: Path, made: Path) -> list[Diff]:
    """What differs between a source snapshot and a tree made from its streams, less what no stream
    can carry: the hole map (a v1 incremental sends holes as zeros, a receiver may write them)."""
    return [d for d in compare(source, made) if d[1] != "data"]


@dataclass
class Figures:
    histories: int = 0
    root_untouched: int = 0  # histories whose second part changed nothing in the root directory
    streams: int = 0
    stream_bytes: int = 0
    cases: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ORACLES, 0))
    failures: list[Failure] = field(default_factory=list)
    known: dict[str, int] = field(default_factory=dict)
    mounts: dict[str, int] = field(default_factory=dict)
    ops: dict[str, int] = field(default_factory=dict)
    commands: dict[str, int] = field(default_factory=dict)

    def add(self, other: Figures) -> None:
        self.histories += other.histories
        self.root_untouched += other.root_untouched
        self.streams += other.streams
        self.stream_bytes += other.stream_bytes
        for k, v in other.cases.items():
            self.cases[k] += v
        self.failures += other.failures
        for mine, theirs in (
            (self.known, other.known),
            (self.mounts, other.mounts),
            (self.ops, other.ops),
            (self.commands, other.commands),
        ):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v


@dataclass(frozen=True)
class Variant:
    name: str
    args: tuple[str, ...]
    version: int


def variants(compressed: bool) -> list[Variant]:
    out = [Variant("v1", (), 1), Variant("v2", ("--proto", "2"), 2)]
    if compressed:
        out.append(Variant("v2-cdata", ("--proto", "2", "--compressed-data"), 2))
    return out


class Campaign:
    """One receiving file system for many histories; each history has a source file system of its own."""

    def __init__(
        self, target: Path, ops: int = OPS, switches: Switches | None = None, keep: Path | None = None
    ) -> None:
        self.target = target
        self.n_ops = ops
        self.switches = switches or Switches()
        self.keep = keep  # where the streams of a history with a finding are copied to

    def history(self, seed: int) -> Figures:
        rng = random.Random(seed)
        mount = rng.choice(MOUNTS)
        fig = Figures(histories=1, mounts={mount or "plain": 1})
        with btrfs_loop("1G", mount_opts=mount) as src_fs:
            must("btrfs", "subvolume", "create", src_fs / "src")
            h = History(rng, src_fs / "src", bool(mount), self.switches)
            h.run(rng.randrange(self.n_ops // 2, self.n_ops + 1))
            must("btrfs", "subvolume", "snapshot", "-r", src_fs / "src", src_fs / "A")
            h.clone_sources.append(os.fsencode(src_fs / "A"))
            h.below_root = rng.randrange(4) == 0
            h.run(rng.randrange(self.n_ops // 2, self.n_ops + 1))
            must("btrfs", "subvolume", "snapshot", "-r", src_fs / "src", src_fs / "B")
            fig.ops = h.ops
            fig.root_untouched = int(h.below_root)
            work = self.target / f"seed-{seed}"
            work.mkdir()
            try:
                for v in variants(bool(mount)):
                    self.check_variant(seed, v, src_fs, work, fig)
                if self.keep is not None and any(f.known is None for f in fig.failures):
                    dest = self.keep / f"seed-{seed}"
                    dest.mkdir(parents=True, exist_ok=True)
                    for s in work.glob("*.stream"):
                        shutil.copy2(s, dest)
            finally:
                self.clean(work)
        for f in fig.failures:
            if f.known:
                fig.known[f.known] = fig.known.get(f.known, 0) + 1
        return fig

    def check_variant(self, seed: int, v: Variant, src: Path, work: Path, fig: Figures) -> None:
        streams = {step: work / f"{v.name}-{step}.stream" for step in ("A", "B", "incr")}
        must("btrfs", "send", "-q", *v.args, "-f", streams["A"], src / "A")
        must("btrfs", "send", "-q", *v.args, "-f", streams["B"], src / "B")
        must("btrfs", "send", "-q", *v.args, "-p", src / "A", "-f", streams["incr"], src / "B")

        def check(oracle: str, step: str, result: list[Diff] | str, used: list[Path]) -> None:
            fig.cases[oracle] += 1
            if not result:
                return
            if isinstance(result, str):
                fig.failures.append(Failure(seed, oracle, f"{v.name} {step}", [result], None))
                return
            detail = [describe(d, ("source", "made")) for d in result]
            case = f"{v.name} {step}"
            fig.failures.append(Failure(seed, oracle, case, detail, known(oracle, case, result, used)))

        converted: dict[str, Path] = {}
        for step, s in streams.items():
            fig.streams += 1
            fig.stream_bytes += s.stat().st_size
            with s.open("rb") as f:
                for ev in iter_events(f):
                    if isinstance(ev, Command):
                        fig.commands[ev.name] = fig.commands.get(ev.name, 0) + 1
            check("verify", step, failed(sendstream("verify", "-q", s)), [s])
            for oracle, progs, style in dump_oracles():
                ours = sendstream("dump", *style, s)
                theirs = run(progs, "receive", "--dump", "-f", s)
                check(oracle, step, failed(ours) or first_difference(theirs.stdout, ours.stdout), [s])
            if v.version == 2:
                out = s.with_suffix(".v1.stream")
                parent = [streams["A"]] if step == "incr" else []
                proc = sendstream("convert", "--to-version", "1", *convert_parent(parent), s, out)
                if proc.returncode == 0:
                    converted[step] = out
                else:
                    check("convert", step, failed(proc), [s])
        chains = {"A": ["A"], "B": ["B"], "incr": ["A", "incr"]}
        for step, chain in chains.items():
            used = [streams[c] for c in chain]
            source = src / ("A" if step == "A" else "B")
            check("receive", step, self.received(work / f"r-{v.name}-{step}", used, source), used)
            check("extract", step, self.extracted(work / f"x-{v.name}-{step}", used, source), used)
            if v.version == 2 and all(c in converted for c in chain):
                conv = [converted[c] for c in chain]
                check("convert", step, self.received(work / f"c-{v.name}-{step}", conv, source), used)

    def received(self, where: Path, chain: list[Path], source: Path) -> list[Diff] | str:
        """``btrfs receive`` of each stream of ``chain`` into ``where``, the last subvolume against ``source``."""
        where.mkdir()
        try:
            for s in chain:
                proc = run("btrfs", "receive", "-q", "-f", s, where)
                if proc.returncode != 0:
                    return f"btrfs receive {s.name}: {failed(proc)}"
            return tree_differences(source, where / source.name)
        finally:
            self.clean(where)

    def extracted(self, where: Path, chain: list[Path], source: Path) -> list[Diff] | str:
        """``sendstream extract`` of each stream of ``chain`` into ``where/tree`` in turn, against ``source``.

        Each incremental is applied in place, with an untouched extraction of its parent as ``--clone-from``
        (as the docs of ``extract`` say: it may clone from the parent, which the extraction in place changes)."""
        tree = where / "tree"
        tree.mkdir(parents=True)
        clone_from: list[str | Path] = []
        try:
            for i, s in enumerate(chain):
                proc = sendstream("extract", "-q", *clone_from, s, tree)
                if proc.returncode == 0 and i < len(chain) - 1:
                    parent = where / f"parent-{i}"
                    parent.mkdir()
                    proc = sendstream("extract", "-q", *clone_from, s, parent)
                    clone_from = ["--clone-from", f"{subvolume_uuid(s)}={parent}"]
                if proc.returncode != 0:
                    return f"sendstream extract {s.name}: {failed(proc)}"
            return tree_differences(source, tree)
        finally:
            shutil.rmtree(where, ignore_errors=True)

    @staticmethod
    def clean(where: Path) -> None:
        """Delete the received subvolumes below ``where`` (read-only ones too), then the rest."""
        if not where.exists():
            return
        for p in sorted(where.iterdir()):
            if p.is_dir() and not p.is_symlink() and p.stat().st_ino == 256:
                run("btrfs", "subvolume", "delete", p)
        shutil.rmtree(where, ignore_errors=True)


def convert_parent(streams: list[Path]) -> list[str | Path]:
    """``--parent`` with the streams of an incremental's parent (the sizes of the parent's files, which a
    hole punched in them must keep)."""
    return [a for s in streams for a in ("--parent", s)]


def subvolume_uuid(stream: Path) -> str:
    """The UUID of the subvolume a stream makes (of its SUBVOL or SNAPSHOT command)."""
    with stream.open("rb") as f:
        for ev in iter_events(f):
            if isinstance(ev, Command) and ev.name in ("subvol", "snapshot"):
                return str(ev.get("uuid"))
    raise ValueError(f"{stream}: no SUBVOL or SNAPSHOT command")


def failed(proc: subprocess.CompletedProcess[bytes]) -> str:
    """Empty when ``proc`` succeeded, else its exit and what it said."""
    if proc.returncode == 0:
        return ""
    return f"exit {proc.returncode}: {proc.stderr.decode(errors='replace').strip()}"


def first_difference(theirs: bytes, ours: bytes) -> str:
    """Empty when the two texts are the same, else their first line that differs."""
    if theirs == ours:
        return ""
    a, b = theirs.splitlines(), ours.splitlines()
    for i in range(max(len(a), len(b))):
        x = a[i] if i < len(a) else None
        y = b[i] if i < len(b) else None
        if x != y:
            return f"line {i + 1}: btrfs receive --dump {x!r}, sendstream dump {y!r}"
    return "the same lines, other line ends"


@contextlib.contextmanager
def campaign(ops: int = OPS, switches: Switches | None = None, keep: Path | None = None) -> Iterator[Campaign]:
    """A campaign with its receiving file system (plain btrfs), cleaned up afterwards."""
    with btrfs_loop("2G") as target:
        yield Campaign(target, ops, switches, keep)
