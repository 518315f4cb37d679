"""Our dump against `btrfs receive --dump` of btrfs-progs 6.2 (the system's) and of current
btrfs-progs (6.14, unpacked by tools/setup-tests), byte for byte, on the fixtures and on streams
of a real `btrfs send`; the dump's own text is tests/unit/test_dump_text.py, its command line
tests/integration/test_dump_cli.py."""

from __future__ import annotations

import os
import random
import subprocess
import uuid
import zlib
from pathlib import Path

import pytest
from support.btrfs import first_stream_as_6_2, need_root_btrfs, progs_dump, progs_for, utc
from support.dumping import our_dump
from support.loopfs import btrfs_loop
from support.streams import BTRFS_READABLE, STREAMS, crafted, stream_ids

from sendstream import Command, encode_command
from sendstream.codec.backend import Backend
from sendstream.io.windows import iter_events
from sendstream.render.progs import PROGS_STYLES, ProgsStyle

# a zone with half-hour offsets and a half-hour DST shift
ZONES = ["UTC", "Australia/Lord_Howe"]


@pytest.mark.parametrize("path", BTRFS_READABLE, ids=stream_ids)
def test_stored_btrfs_dump_matches(path: Path) -> None:
    with utc():
        assert first_stream_as_6_2(path) == path.with_suffix(".dump").read_bytes()


def exact_options(style: ProgsStyle) -> list[str]:
    """Our options for btrfs-progs' exact text of ``style`` (6.2 prints xattr data raw)."""
    return ["--progs-style", style, *(["--raw-xattr-data"] if style == "6.2" else [])]


def first_stream(path: Path, tmp_path: Path) -> Path:
    """``path`` up to its first END: all of it but for a concatenated file."""
    with path.open("rb") as f:
        end = next(ev for ev in iter_events(f) if isinstance(ev, Command) and ev.name == "end")
    data = path.read_bytes()
    if end.offset + 10 == len(data):
        return path
    part = tmp_path / f"first-of-{path.name}"
    part.write_bytes(data[: end.offset + 10])
    return part


def assert_dump_equals_progs(path: Path, style: ProgsStyle, tz: str, backend: Backend, tmp_path: Path) -> None:
    """Our dump of ``path`` is byte for byte btrfs-progs' ``receive --dump`` of ``style``; of a
    concatenated file, btrfs-progs prints the first stream only, and we print that, then the others."""
    theirs = progs_dump(progs_for(style), path, tz)
    if path.read_bytes()[13] >= 3:
        assert theirs.returncode != 0 and b"stream version 3 not supported" in theirs.stderr
        pytest.skip(f"btrfs-progs {style} refuses v3 streams")
    assert theirs.returncode == 0, theirs.stderr
    first = first_stream(path, tmp_path)
    ours = our_dump(first, tz, *exact_options(style), backend=backend)
    assert ours == theirs.stdout
    if first != path:
        everything = our_dump(path, tz, *exact_options(style), backend=backend)
        assert everything.startswith(ours) and len(everything) > len(ours)


@pytest.mark.parametrize("tz", ZONES)
@pytest.mark.parametrize("style", PROGS_STYLES)
@pytest.mark.parametrize("path", STREAMS, ids=stream_ids)
def test_dump_equals_btrfs_receive_dump(
    path: Path, style: ProgsStyle, tz: str, backend: Backend, tmp_path: Path
) -> None:
    assert_dump_equals_progs(path, style, tz, backend, tmp_path)


# Names and values that the two styles print differently, or that test the escaping.
ODD = b"odd \\ name\n\x01\x7f\xe9\t"
XATTRS = {
    b"user.empty": b"",
    b"user.nul": b"a\0b",
    b"user.bytes": bytes(range(1, 32)) + b" \\\x7f\x80\xff",
    b"user.newline": b"one\ntwo",
    b"user." + ODD.replace(b"\n", b""): b"v",  # Linux takes any byte but NUL in a name
}


def _btrfs(*args: str | bytes | Path) -> None:
    subprocess.run(["btrfs", *args], check=True, capture_output=True)


@pytest.fixture(scope="module")
def sent_streams(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Streams of a real `btrfs send` (zstd mount): full v1 and v2, --compressed-data (ENCODED_WRITE),
    and a v2 incremental, of a tree with odd names, xattrs with empty, NUL-holding and unprintable
    values, and reflinks (CLONE) whose source has an odd name."""
    need_root_btrfs()
    out = tmp_path_factory.mktemp("sent")
    rng = random.Random(27)
    streams: dict[str, Path] = {}
    with btrfs_loop("512M", mount_opts="compress=zstd") as mnt:
        _btrfs("subvolume", "create", mnt / "sub")
        sub = os.fsencode(mnt / "sub")
        source = os.path.join(sub, b"src " + ODD)
        with open(source, "wb") as f:
            f.write(rng.randbytes(256 * 1024))
        subprocess.run(["cp", "--reflink=always", source, os.path.join(sub, b"copy " + ODD)], check=True)
        with open(os.path.join(sub, b"text.txt"), "wb") as f:
            f.write(b"compressible line of text\n" * 8000)
        target = os.path.join(sub, b"x" + ODD)
        with open(target, "wb"):
            pass
        for name, value in XATTRS.items():
            os.setxattr(target, name, value)
        _btrfs("subvolume", "snapshot", "-r", mnt / "sub", mnt / "snap1")
        os.removexattr(target, b"user." + ODD.replace(b"\n", b""))
        os.setxattr(target, b"user.nul", b"\0\0")
        with open(source, "r+b") as f:
            f.seek(128 * 1024)
            f.write(rng.randbytes(64 * 1024))
        subprocess.run(["cp", "--reflink=always", source, os.path.join(sub, b"again " + ODD)], check=True)
        with open(os.path.join(sub, b"text.txt"), "ab") as f:
            f.write(b"more compressible text\n" * 8000)
        _btrfs("subvolume", "snapshot", "-r", mnt / "sub", mnt / "snap2")
        sends: dict[str, list[str | Path]] = {
            "full-v1": ["--proto", "1", mnt / "snap1"],
            "full-v2": ["--proto", "2", mnt / "snap1"],
            "compressed": ["--compressed-data", mnt / "snap1"],
            "incr-v2": ["--proto", "2", "-p", mnt / "snap1", mnt / "snap2"],
            "incr-compressed": ["--compressed-data", "-p", mnt / "snap1", mnt / "snap2"],
        }
        for sent, args in sends.items():
            streams[sent] = out / f"{sent}.stream"
            _btrfs("send", "-q", "-f", streams[sent], *args)
    return streams


SENT = ["full-v1", "full-v2", "compressed", "incr-v2", "incr-compressed"]


@pytest.mark.parametrize("style", PROGS_STYLES)
@pytest.mark.parametrize("name", SENT)
def test_dump_of_real_send_equals_btrfs_receive_dump(
    sent_streams: dict[str, Path], name: str, style: ProgsStyle, backend: Backend, tmp_path: Path
) -> None:
    path = sent_streams[name]
    with path.open("rb") as f:
        names = {ev.name for ev in iter_events(f) if isinstance(ev, Command)}
    # the stream holds what it is meant to test
    assert {"set_xattr", "clone"} <= names
    assert ("remove_xattr" in names) == name.startswith("incr")
    assert ("encoded_write" in names) == ("compressed" in name)
    assert_dump_equals_progs(path, style, "Asia/Kolkata", backend, tmp_path)


def edge_stream(path: Path) -> Path:
    """What no kernel sends but a stream may hold: a NUL inside names (btrfs-progs cuts them there),
    xattr data of every byte, a clone length past a C int, an ENCODED_WRITE without ENCRYPTION."""
    every_byte = bytes(range(256))
    commands = [
        Command.build("subvol", [("path", b"sub\tvol"), ("uuid", uuid.UUID(int=27)), ("ctransid", 9)]),
        Command.build("mkfile", [("path", b"f \xe9"), ("ino", 257)]),
        Command.build(
            "set_xattr", [("path", b"f \xe9"), ("xattr_name", b"user.a\x01 b\0cut"), ("xattr_data", every_byte)]
        ),
        Command.build("set_xattr", [("path", b"f \xe9"), ("xattr_name", b"user.e"), ("xattr_data", b"")]),
        Command.build("remove_xattr", [("path", b"f \xe9"), ("xattr_name", b"user.\\\x7f\0cut")]),
        Command.build(
            "clone",
            [
                ("path", b"f \xe9"),
                ("file_offset", 0),
                ("clone_len", 0x1_8000_0000),
                ("clone_uuid", uuid.UUID(int=28)),
                ("clone_ctransid", 8),
                ("clone_path", b"src \\ \n\xff\0cut"),
                ("clone_offset", 4096),
            ],
        ),
        Command.build(
            "encoded_write",
            [
                ("path", b"f \xe9"),
                ("file_offset", 0),
                ("unencoded_file_len", 4096),
                ("unencoded_len", 4096),
                ("unencoded_offset", 0),
                ("compression", 1),
                ("data", zlib.compress(bytes(4096))),
            ],
        ),
    ]
    path.write_bytes(crafted(2, *(encode_command(c, 2) for c in commands)))
    return path


@pytest.mark.parametrize("style", PROGS_STYLES)
def test_dump_of_edge_values_equals_btrfs_receive_dump(style: ProgsStyle, backend: Backend, tmp_path: Path) -> None:
    assert_dump_equals_progs(edge_stream(tmp_path / "edge.stream"), style, "UTC", backend, tmp_path)
