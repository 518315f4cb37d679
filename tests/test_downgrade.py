"""v2 -> v1 conversion: valid v1 streams, and (root) the same tree through real btrfs receive."""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES, btrfs_loop, need_root_btrfs

from sendstream import Command, Encoder, StreamHeader
from sendstream.downgrade import V1_WRITE_SIZE, DowngradeError, Downgrader, downgrade
from sendstream.dump import TextDumper
from sendstream.files import file_events
from sendstream.format import COMMANDS
from sendstream.verify import verify_file

V2_STREAMS = ["compressed-v2", "rich-full-v2", "rich-incr-v2"]
PARENT = {"rich-incr-v2": "rich-full-v2"}


def to_v1(src: Path, out: Path) -> list[str]:
    warnings: list[str] = []
    encoder = Encoder()
    with src.open("rb") as f, out.open("wb") as o:
        for event in downgrade(file_events(f), warnings.append):
            o.write(encoder.send(event))
    return warnings


def dump_lines(path: Path) -> list[bytes]:
    dumper = TextDumper()
    with path.open("rb") as f:
        return [dumper.line(ev) for ev in file_events(f) if isinstance(ev, Command)]


@pytest.mark.parametrize("name", [*V2_STREAMS, "verity-v3"])
def test_result_is_a_valid_v1_stream(name: str, tmp_path: Path) -> None:
    out = tmp_path / "v1.stream"
    warnings = to_v1(FIXTURES / f"{name}.stream", out)
    with out.open("rb") as f:
        report = verify_file(f)
    assert report.ok, report.problems
    with out.open("rb") as f:
        events = list(file_events(f))
    assert [ev.version for ev in events if isinstance(ev, StreamHeader)] == [1]
    for ev in events:
        if isinstance(ev, Command):
            assert COMMANDS[ev.cmd].version == 1, ev.name
            if ev.name == "write":
                assert len(ev.get("data")) <= V1_WRITE_SIZE
    dropped = {w.split("(")[1].split(")")[0] for w in warnings}
    assert dropped == {"rich-incr-v2": {"fileattr"}, "verity-v3": {"fileattr", "enable_verity"}}.get(name, set())


def test_incremental_equals_the_kernels_v1(tmp_path: Path) -> None:
    """The kernel's v1 and v2 incrementals are of the same snapshots: converted, v2 gives v1's dump,
    the punched hole (FALLOCATE) included as a WRITE of zeros."""
    out = tmp_path / "incr-as-v1.stream"
    to_v1(FIXTURES / "rich-incr-v2.stream", out)
    assert dump_lines(out) == dump_lines(FIXTURES / "rich-incr-v1.stream")
    with out.open("rb") as f:
        zeros = [
            ev for ev in file_events(f) if isinstance(ev, Command) and ev.name == "write" and not any(ev.get("data"))
        ]
    assert [(bytes(ev.get("path")), ev.get("file_offset"), len(ev.get("data"))) for ev in zeros] == [
        (b"random-reflink.bin", 131072, 32768)
    ]


def file_data(path: Path) -> dict[bytes, bytes]:
    """The image of every file the stream writes (WRITE and decompressed ENCODED_WRITE), by path."""
    files: dict[bytes, bytearray] = {}
    from sendstream.compression import decompress

    with path.open("rb") as f:
        for ev in file_events(f):
            if not isinstance(ev, Command) or ev.name not in ("write", "encoded_write"):
                continue
            p = bytes(ev.get("path"))
            off = int(ev.get("file_offset"))
            if ev.name == "write":
                data = bytes(ev.get("data"))
            else:
                plain = decompress(int(ev.get("compression")), ev.get("data"), int(ev.get("unencoded_len")))
                start = int(ev.get("unencoded_offset"))
                data = plain[start : start + int(ev.get("unencoded_file_len"))]
            buf = files.setdefault(p, bytearray())
            if len(buf) < off + len(data):
                buf.extend(bytes(off + len(data) - len(buf)))
            buf[off : off + len(data)] = data
    return {p: bytes(b) for p, b in files.items()}


def test_encoded_writes_become_the_same_bytes(tmp_path: Path) -> None:
    out = tmp_path / "v1.stream"
    to_v1(FIXTURES / "compressed-v2.stream", out)
    assert file_data(out) == file_data(FIXTURES / "compressed-v2.stream")


def test_sans_io_and_edge_cases() -> None:
    d = Downgrader()
    assert d.send(StreamHeader(0, 2)) == [StreamHeader(0, 1)]
    assert d.send(Command.build("mkfile", [("path", b"f"), ("ino", 257)]))[0].name == "mkfile"
    big = bytes(range(256)) * 512  # 128 KiB
    writes = d.send(Command.build("write", [("path", b"f"), ("file_offset", 10), ("data", big)]))
    assert [(w.get("file_offset"), len(w.get("data"))) for w in writes] == [(10, 49152), (49162, 49152), (98314, 32768)]
    assert b"".join(bytes(w.get("data")) for w in writes) == big
    # punch inside a file of known size: zeros, cut at the size (KEEP_SIZE)
    zeros = d.send(
        Command.build("fallocate", [("path", b"f"), ("fallocate_mode", 3), ("file_offset", 131000), ("size", 4096)])
    )
    assert [(w.name, w.get("file_offset"), len(w.get("data"))) for w in zeros] == [("write", 131000, 82)]
    assert (
        d.send(Command.build("fallocate", [("path", b"f"), ("fallocate_mode", 1), ("file_offset", 0), ("size", 9)]))
        == []
    )
    grow = d.send(
        Command.build("fallocate", [("path", b"f"), ("fallocate_mode", 0), ("file_offset", 0), ("size", 200000)])
    )
    assert [(c.name, c.get("size")) for c in grow] == [("truncate", 200000)]
    assert (
        d.send(Command.build("fallocate", [("path", b"g"), ("fallocate_mode", 0), ("file_offset", 0), ("size", 9)]))
        == []
    )
    assert "unknown size" in d.warnings[-1]
    enc = Command.build(
        "encoded_write",
        [("path", b"f"), ("file_offset", 0), ("unencoded_file_len", 4), ("unencoded_len", 4),
         ("unencoded_offset", 0), ("compression", 0), ("encryption", 1), ("data", b"abcd")],
    )  # fmt: skip
    with pytest.raises(DowngradeError, match="encrypted"):
        d.send(enc)
    v1 = Downgrader()
    assert v1.send(StreamHeader(0, 1)) == [StreamHeader(0, 1)]
    cmd = Command.build("write", [("path", b"f"), ("file_offset", 0), ("data", b"x")])
    assert v1.send(cmd) == [cmd]


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
        to_v1(FIXTURES / f"{n}.stream", out)
        converted.append(out)
    theirs = receive_all(fs, "v2", originals)
    ours = receive_all(fs, "v1", converted)
    assert len(ours) > 5
    assert ours == theirs
