"""v2 -> v1 conversion through real btrfs receive (root): the same tree, a punched file of the parent; the
conversion in process is tests/unit/test_downgrade_model.py, its CLI tests/integration/test_downgrade_cli.py."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.btrfs import need_root_btrfs
from support.downgrading import PARENT, V2_STREAMS, to_v1
from support.loopfs import btrfs_loop
from support.streams import FIXTURES

from sendstream import Command, Encoder
from sendstream.codec.backend import default
from sendstream.codec.framer import Framer
from sendstream.io.windows import file_events

# --- real btrfs receive ------------------------------------------------------


def tree_state(root: Path) -> dict[str, tuple[Any, ...]]:
    out: dict[str, tuple[Any, ...]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames, ""]:
            p = os.path.join(dirpath, name) if name else dirpath
            if name == "" and dirpath != str(root):
                continue
            st = os.lstat(p)
            rel = os.path.relpath(p, root)
            xattrs = {x: os.getxattr(p, x, follow_symlinks=False) for x in os.listxattr(p, follow_symlinks=False)}
            content: Any = None
            if stat.S_ISREG(st.st_mode):
                content = hashlib.sha256(Path(p).read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                content = os.readlink(p)
            out[rel] = (st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_rdev, st.st_mtime_ns, content, xattrs)
    return out


@pytest.fixture(scope="module")
def fs() -> Iterator[Path]:
    need_root_btrfs()
    with btrfs_loop("1G") as mnt:
        yield mnt


def receive_all(fs: Path, name: str, streams: list[Path]) -> dict[str, tuple[Any, ...]]:
    where = fs / name
    where.mkdir()
    try:
        for s in streams:
            proc = subprocess.run(["btrfs", "receive", "-q", "-f", str(s), str(where)], capture_output=True)
            assert proc.returncode == 0, proc.stderr.decode(errors="replace")
        subs = {p.name: p for p in where.iterdir()}
        target = subs.get("rich_incr") or next(iter(subs.values()))
        return tree_state(target)
    finally:
        for sub in where.iterdir():
            subprocess.run(["btrfs", "subvolume", "delete", str(sub)], capture_output=True)
        shutil.rmtree(where, ignore_errors=True)


@pytest.mark.btrfs
@pytest.mark.parametrize("name", V2_STREAMS)
def test_btrfs_receive_accepts_v1_and_makes_the_same_tree(fs: Path, name: str, tmp_path: Path) -> None:
    chain = [PARENT[name], name] if name in PARENT else [name]
    originals = [FIXTURES / f"{n}.stream" for n in chain]
    converted = []
    for n in chain:
        out = tmp_path / f"{n}-as-v1.stream"
        to_v1(FIXTURES / f"{n}.stream", out, default())  # (the backends' conversions are compared above)
        converted.append(out)
    theirs = receive_all(fs, "v2", originals)
    ours = receive_all(fs, "v1", converted)
    assert len(ours) > 5
    assert ours == theirs


# --- a hole punched in a file of the parent (real kernel, real receive) -------------


def _sendstream(*args: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "sendstream", *map(str, args)], capture_output=True, timeout=120)


def _with_punch_length(source: Path, target: Path, length: int) -> None:
    """``source`` with its FALLOCATE's length set to ``length`` (the campaign's kernel sent 4096)."""
    encoder = Encoder()
    with source.open("rb") as f, target.open("wb") as o:
        for ev in file_events(f, Framer()):
            if isinstance(ev, Command) and ev.name == "fallocate":
                ev = Command.build("fallocate", [*((n, ev.get(n)) for n in ("path", "fallocate_mode", "file_offset")),
                                                 ("size", length)])  # fmt: skip
            o.write(encoder.send(ev))


@pytest.mark.btrfs
def test_a_punched_file_of_the_parent_keeps_its_size_in_v1(fs: Path, tmp_path: Path) -> None:
    """The kernel's v2 incremental punches `fallocate -p -o 0 -l 4096` in a 1,360-byte file of the
    parent as FALLOCATE mode=3 (KEEP_SIZE) and no TRUNCATE. Converted to v1 it was 4,096 bytes of
    zeros (with the campaign's len=4096), and btrfs receive made the file 4,096 bytes while verify
    said OK. Now the zeros stop at the size in the parent, given by --parent (its received
    subvolume, its extraction, or its stream); without it the conversion is refused."""
    work = fs / "punch"
    work.mkdir()
    made: list[Path] = []
    try:
        subprocess.run(["btrfs", "subvolume", "create", str(work / "s")], check=True, capture_output=True)
        made.append(work / "s")
        content = bytes(range(256)) * 5 + b"x" * 80
        (work / "s" / "f").write_bytes(content)
        for name in ("A", "B"):
            if name == "B":
                subprocess.run(["fallocate", "-p", "-o", "0", "-l", "4096", str(work / "s" / "f")], check=True)
            subprocess.run(["btrfs", "subvolume", "snapshot", "-r", str(work / "s"), str(work / name)],
                           check=True, capture_output=True)  # fmt: skip
            made.append(work / name)
        subprocess.run(["sync"], check=True)
        a2, b2, b4096 = tmp_path / "A.v2", tmp_path / "B.v2", tmp_path / "B4096.v2"
        for stream, args in ((a2, [work / "A"]), (b2, ["-p", work / "A", work / "B"])):
            subprocess.run(
                ["btrfs", "send", "-q", "--proto", "2", "-f", stream, *args], check=True, capture_output=True
            )
        falloc = [
            ev for ev in file_events(b2.open("rb"), Framer()) if isinstance(ev, Command) and ev.name == "fallocate"
        ]
        assert [(ev.get("fallocate_mode"), ev.get("file_offset")) for ev in falloc] == [(3, 0)]
        _with_punch_length(b2, b4096, 4096)
        a1 = tmp_path / "A.v1"
        assert _sendstream("convert", "--to-version", "1", a2, a1).returncode == 0
        refused = _sendstream("convert", "--to-version", "1", b4096, tmp_path / "no.v1")
        message = refused.stderr.decode()
        assert refused.returncode == 1 and "offset " in message and "(fallocate)" in message, message
        assert "--parent" in message and "Traceback" not in message and not (tmp_path / "no.v1").exists()
        into = work / "into"
        into.mkdir()
        made.append(into / "A")
        subprocess.run(["btrfs", "receive", "-q", "-f", a1, into], check=True, capture_output=True)
        extracted = tmp_path / "A-extracted"
        extracted.mkdir()
        assert _sendstream("extract", a2, extracted).returncode == 0
        parents = ((b2, into / "A"), (b4096, into / "A"), (b4096, a2), (b4096, extracted))
        for n, (incremental, parent) in enumerate(parents):
            v1 = tmp_path / f"B{n}.v1"
            done = _sendstream("convert", "--to-version", "1", "--parent", parent, incremental, v1)
            assert done.returncode == 0, done.stderr
            target = work / f"r{n}"
            target.mkdir()
            subprocess.run(["btrfs", "receive", "-q", "-f", a1, target], check=True, capture_output=True)
            made.append(target / "A")
            subprocess.run(["btrfs", "receive", "-q", "-f", v1, target], check=True, capture_output=True)
            made.append(target / "B")
            got = (target / "B" / "f").read_bytes()
            assert (len(got), got) == (1360, bytes(1360)), (n, len(got))
    finally:
        for sub in reversed(made):
            subprocess.run(["btrfs", "subvolume", "delete", str(sub)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)
