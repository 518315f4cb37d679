"""Defects of the kernel's `btrfs send` (6.18 here), where sendstream and `btrfs receive` agree with
each other but not with the source snapshot: found by issue 27's differential campaign.

Each test asserts the defect as the kernel has it, so that it fails, loudly, when a kernel fixes it
(then the test, the format reference's "Known defects of the kernel's send" and any workaround go).
What the stream shows is asserted from its commands; what the receivers make, from `btrfs receive`
and `extract`.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.btrfs import need_root_btrfs
from support.loopfs import btrfs_loop

from sendstream import Command
from sendstream.extract import extract_stream
from sendstream.io.windows import iter_events

pytestmark = [pytest.mark.btrfs, pytest.mark.upstream_defect]

FIXED = "a kernel fixed this defect of btrfs send: drop the test and the docs' note ({})"


def sh(*args: object) -> None:
    done = subprocess.run([str(a) for a in args], capture_output=True)
    assert done.returncode == 0, f"{args}: {done.stderr.decode(errors='replace')}"


def commands(stream: Path) -> list[Command]:
    with stream.open("rb") as f:
        return [ev for ev in iter_events(f) if isinstance(ev, Command)]


@pytest.fixture(scope="module")
def fs() -> Iterator[Path]:
    need_root_btrfs()
    with btrfs_loop("512M", mount_opts="compress=zstd") as mnt:
        yield mnt


def test_root_times_are_not_sent_after_a_new_inode_passed_through_the_root(fs: Path, tmp_path: Path) -> None:
    """(a) An incremental makes every new inode under a temporary name in the root and renames
    it into place. The root did not change in the source, so no UTIMES of it is sent; but the
    receivers changed it (the mkfile and rename there), so its mtime is the time of the receive.
    `extract` puts back the times the root had in the parent's extraction."""
    base = fs / "a"
    base.mkdir()
    sh("btrfs", "subvolume", "create", base / "s")
    (base / "s" / "d").mkdir()
    os.utime(base / "s", (1000, 1000))
    sh("btrfs", "subvolume", "snapshot", "-r", base / "s", base / "A")
    (base / "s" / "d" / "new").write_bytes(b"x")
    sh("btrfs", "subvolume", "snapshot", "-r", base / "s", base / "B")
    sh("btrfs", "send", "-q", "-f", tmp_path / "A", base / "A")
    sh("btrfs", "send", "-q", "-f", tmp_path / "B", "-p", base / "A", base / "B")
    sent = commands(tmp_path / "B")
    assert any(c.name == "rename" and bytes(c.get("path")).startswith(b"o") for c in sent)
    root_utimes = [c for c in sent if c.name == "utimes" and bytes(c.get("path")) == b""]
    assert root_utimes == [], FIXED.format("the root's UTIMES is sent now")
    received = base / "received"
    received.mkdir()
    sh("btrfs", "receive", "-q", "-f", tmp_path / "A", received)
    sh("btrfs", "receive", "-q", "-f", tmp_path / "B", received)
    assert (base / "B").stat().st_mtime_ns == 1000 * 10**9
    assert received.joinpath("B").stat().st_mtime_ns != 1000 * 10**9
    extracted = tmp_path / "x"
    extracted.mkdir()
    extract_stream(tmp_path / "A", extracted)
    extract_stream(tmp_path / "B", extracted)
    # extract puts the parent's root times back, where the stream sent none: the source's
    assert extracted.stat().st_mtime_ns == 1000 * 10**9


def test_a_grown_compressed_inline_extent_is_sent_short(fs: Path, tmp_path: Path) -> None:
    """(c) With --compressed-data, a compressed inline extent of 1,722 bytes whose file fallocate
    grew to 4,096 is sent as an ENCODED_WRITE of 1,722 bytes and no TRUNCATE: the receivers make
    a 1,722-byte file. Without --compressed-data the kernel sends the 4,096 bytes."""
    base = fs / "c"
    base.mkdir()
    sh("btrfs", "subvolume", "create", base / "s")
    (base / "s" / "f").write_bytes(b"abcdefgh" * 215 + b"xy")
    sh("sync")
    sh("fallocate", "-l", "4096", base / "s" / "f")
    sh("btrfs", "subvolume", "snapshot", "-r", base / "s", base / "C")
    sh("btrfs", "send", "-q", "--proto", "2", "--compressed-data", "-f", tmp_path / "C", base / "C")
    sh("btrfs", "send", "-q", "--proto", "2", "-f", tmp_path / "plain", base / "C")
    sent = [(c.name, c.get("unencoded_file_len", None)) for c in commands(tmp_path / "C") if c.name in (
        "encoded_write", "write", "truncate")]  # fmt: skip
    assert sent == [("encoded_write", 1722)], FIXED.format(f"the file's size is sent now: {sent}")
    assert os.path.getsize(base / "C" / "f") == 4096
    received = base / "received"
    received.mkdir()
    sh("btrfs", "receive", "-q", "-f", tmp_path / "C", received)
    assert os.path.getsize(received / "C" / "f") == 1722
    extracted = tmp_path / "x"
    extracted.mkdir()
    extract_stream(tmp_path / "C", extracted)
    assert os.path.getsize(extracted / "f") == 1722  # the same as btrfs receive
    plain = [c for c in commands(tmp_path / "plain") if c.name in ("write", "truncate", "update_extent")]
    assert sum(len(c.get("data")) for c in plain if c.name == "write") == 4096 or any(
        c.name == "truncate" and c.get("size") == 4096 for c in plain
    )
