"""The kernel differential campaign, short: a few seeded file-system histories on loop-device btrfs,
each sent by the kernel in v1 and v2 (full and incremental, ``--compressed-data`` on compressed mounts),
each stream through every oracle of :mod:`support.differential`. ``tools/differential.py`` runs the
same for as long as asked (docs/contributing/differential.md holds its figures).

A seed that meets a known defect (``KNOWN``) is marked xfail, strict: when the defect is fixed the
seed passes, and the mark must go. A difference that no entry of ``KNOWN`` explains fails the test,
with its seed: ``python3 tools/differential.py --histories 1 --seed SEED --keep DIR`` keeps its streams.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.btrfs import need_root_btrfs
from support.commands import build
from support.differential import (
    KNOWN,
    ORACLES,
    Campaign,
    Figures,
    campaign,
    clone_range,
    known,
    tree_differences,
    variants,
)
from support.loopfs import btrfs_loop
from support.streams import crafted

from sendstream import encode_command

pytestmark = pytest.mark.btrfs

# Seeds of the long run of 2026-12-04 (docs/contributing/differential.md): zstd, zstd with the root
# untouched from A to B, plain, lzo, plain with the root untouched; 5 to 15 seconds each on 2 cores.
SEEDS = [20000, 20001, 20003, 20005, 20006]
# Seeds that meet a known defect, by its name in KNOWN.
KNOWN_SEEDS = {20001: "kernel-root-times"}


class KnownDefect(Exception):
    """Only differences that KNOWN explains."""


@pytest.fixture(scope="module")
def runner() -> Iterator[Campaign]:
    need_root_btrfs()
    with campaign() as c:
        yield c


def seeds() -> list[object]:
    return [
        pytest.param(s, marks=pytest.mark.xfail(raises=KnownDefect, strict=True, reason=KNOWN[KNOWN_SEEDS[s]]))
        if s in KNOWN_SEEDS
        else s
        for s in SEEDS
    ]


@pytest.mark.parametrize("seed", seeds())
def test_history(runner: Campaign, seed: int) -> None:
    fig = runner.history(seed)
    findings = [f for f in fig.failures if f.known is None]
    assert not findings, "\n".join(map(str, findings))
    assert all(fig.cases[o] >= 3 for o in ORACLES), fig.cases  # every oracle ran on every chain
    if fig.failures:
        raise KnownDefect("; ".join(map(str, fig.failures)))


def test_a_tree_unlike_its_source_differs(tmp_path: Path) -> None:
    """The tree oracle sees content, times, xattrs and links, and hides only the hole map."""
    source, made = tmp_path / "source", tmp_path / "made"
    for d in (source, made):
        d.mkdir()
        (d / "f").write_bytes(b"x" * 5000)
        os.setxattr(d / "f", "user.k", b"")
        os.utime(d / "f", ns=(1, 2))
        os.utime(d, ns=(3, 4))
    assert tree_differences(source, made) == []
    (made / "f").write_bytes(b"y" * 5000)
    os.link(made / "f", made / "g")
    os.utime(made / "f", ns=(1, 2))
    os.utime(made, ns=(3, 4))
    os.setxattr(source / "f", "user.k", b"v")
    diffs = tree_differences(source, made)
    assert {(rel, key) for rel, key, _, _ in diffs} == {
        (b"f", "nlink"),
        (b"f", "sha256"),
        (b"f", "xattrs"),
        (b"g", "only"),
        (None, "hard links"),
    }
    assert known("receive", "v1 incr", diffs, []) is None


def test_only_the_root_times_of_an_incremental_are_the_kernel_defect() -> None:
    root_times = [(b"", "mtime", 1, 2), (b"", "atime", 1, 2)]
    assert known("receive", "v1 incr", root_times, []) == "kernel-root-times"
    assert known("receive", "v1 B", root_times, []) is None  # a full stream sends the root's times
    assert known("extract", "v2 incr", [*root_times, (b"f", "mtime", 1, 2)], []) is None


def test_a_short_file_is_the_kernel_defect_only_after_an_inline_encoded_write(tmp_path: Path) -> None:
    inline, other = tmp_path / "inline.stream", tmp_path / "other.stream"
    inline.write_bytes(crafted(2, encoded_write(0, 300)))
    other.write_bytes(crafted(2, encoded_write(0, 4096), encoded_write(4096, 300)))
    short = [(b"g", "sha256", "a", "b"), (b"g", "size", 4096, 300)]
    assert known("receive", "v2-cdata B", short, [inline]) == "kernel-inline-fallocate"
    assert known("receive", "v2-cdata B", short, [other]) is None
    assert known("receive", "v2 B", short, [inline]) is None
    assert known("receive", "v2-cdata B", [(b"g", "size", 300, 4096), (b"g", "sha256", "a", "b")], [inline]) is None
    stale = [(b"f", "sha256", "a", "b")]
    assert known("extract", "v2-cdata incr", stale, [inline]) == "kernel-inline-encoded-stale"
    assert known("extract", "v2-cdata B", stale, [inline]) is None
    assert known("extract", "v2-cdata incr", stale, [other]) is None


def encoded_write(offset: int, length: int) -> bytes:
    cmd = build(
        "encoded_write",
        ("path", b"g"),
        ("file_offset", offset),
        ("unencoded_file_len", length),
        ("unencoded_len", length),
        ("unencoded_offset", 0),
        ("compression", 2),
        ("encryption", 0),
        ("data", b"\0" * 19),
    )
    return encode_command(cmd, 2)


def test_the_kernel_leaves_stale_bytes_after_an_inline_encoded_write(runner: Campaign) -> None:
    """The kernel defect this campaign found (seed 10021 at f291159), in its smallest history: an existing
    8 KiB file becomes 300 compressible bytes (a compressed inline extent) with a clone at 4096. The
    ``--compressed-data`` incremental sends ENCODED_WRITE of the 300 bytes and TRUNCATE 4096, so both
    receivers keep the parent's bytes from 300 to 4096. When this fails, the kernel has been fixed:
    the entry of KNOWN goes."""
    with btrfs_loop("1G", mount_opts="compress=zstd") as src:
        subprocess.run(["btrfs", "-q", "subvolume", "create", src / "src"], check=True)
        f, g = src / "src" / "f", src / "src" / "g"
        f.write_bytes(b"compressible 61 " * 512)
        g.write_bytes(bytes(range(256)) * 20)
        os.sync()
        subprocess.run(["btrfs", "-q", "subvolume", "snapshot", "-r", src / "src", src / "A"], check=True)
        os.truncate(f, 0)
        f.write_bytes(b"y" * 300)
        os.sync()
        with g.open("rb") as gs, f.open("r+b") as fs:
            clone_range(gs.fileno(), 0, 0, fs.fileno(), 4096)
        os.sync()
        subprocess.run(["btrfs", "-q", "subvolume", "snapshot", "-r", src / "src", src / "B"], check=True)
        fig = Figures()
        work = runner.target / "stale"
        work.mkdir()
        try:
            for v in variants(compressed=True):
                runner.check_variant(0, v, src, work, fig)
        finally:
            runner.clean(work)
    failed = sorted((x.oracle, x.case, x.known) for x in fig.failures)
    stale = "kernel-inline-encoded-stale"
    assert failed == [(o, "v2-cdata incr", stale) for o in ("convert", "extract", "receive")], fig.failures
