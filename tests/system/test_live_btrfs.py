"""End to end with the real kernel: btrfs send, our tools, btrfs receive.

Needs root, loop devices and btrfs-progs (CI has them); skips elsewhere.
"""

from __future__ import annotations

import hashlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.btrfs import first_stream_as_6_2, need_root_btrfs, utc
from support.loopfs import btrfs_loop

from sendstream import verify_file

pytestmark = pytest.mark.btrfs


def sh(*args: str | Path, **kw: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(a) for a in args], check=True, capture_output=True, **kw)  # type: ignore[call-overload, no-any-return]


@pytest.fixture(scope="module")
def fs() -> Iterator[Path]:
    need_root_btrfs()
    with btrfs_loop("512M", mount_opts="compress-force=zstd") as mnt:
        yield mnt


def make_tree(root: Path, seed: int) -> None:
    (root / "dir with space").mkdir()
    (root / "dir with space" / "caf\udce9").write_bytes(b"x" * 70000)
    (root / "big").write_bytes(hashlib.sha256(str(seed).encode()).digest() * 20000)
    (root / "holes").write_bytes(b"")
    with (root / "holes").open("r+b") as f:
        f.seek(1 << 20)
        f.write(b"end")
    os.symlink("big", root / "link")
    os.link(root / "big", root / "hard")
    os.mkfifo(root / "fifo")
    os.setxattr(root / "big", "user.bin", b"\0\n\xff")


def tree_digest(root: Path) -> list[tuple[str, str]]:
    out = []
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out.append((rel, "->" + os.readlink(path)))
        elif path.is_file():
            out.append((rel, hashlib.sha256(path.read_bytes()).hexdigest()))
        else:
            out.append((rel, oct(path.lstat().st_mode)))
    return out


@pytest.mark.parametrize("flags", [["--proto", "1"], ["--proto", "2"], ["--compressed-data"]], ids=["v1", "v2", "comp"])
def test_real_send_verify_dump_convert_receive(fs: Path, flags: list[str], tmp_path: Path) -> None:
    name = "src_" + flags[-1].strip("-")
    sh("btrfs", "subvolume", "create", fs / name)
    make_tree(fs / name, len(flags[-1]))
    sh("btrfs", "subvolume", "snapshot", "-r", fs / name, fs / f"{name}_snap")
    sh("sync")
    stream = tmp_path / "s.stream"
    sh("btrfs", "send", "-q", *flags, "-f", stream, fs / f"{name}_snap")
    data = stream.read_bytes()

    assert verify_file(io.BytesIO(data)).ok
    theirs = sh("btrfs", "receive", "--dump", stdin=stream.open("rb"), env=dict(os.environ, TZ="UTC")).stdout
    with utc():
        assert first_stream_as_6_2(stream) == theirs

    rewritten = tmp_path / "rewritten.stream"
    sh(sys.executable, "-m", "sendstream", "convert", stream, rewritten)
    assert rewritten.read_bytes() == data
    dest = fs / f"recv_{name}"
    dest.mkdir()
    sh("btrfs", "receive", "-f", rewritten, dest)
    assert tree_digest(dest / f"{name}_snap") == tree_digest(fs / f"{name}_snap")
