"""Extraction in user space: every fixture against a real `btrfs receive`, and
crafted hostile streams that must not write anything outside DIR.

The comparison with `btrfs receive` needs root, loop devices and btrfs-progs
(CI has them) and skips elsewhere. Compared for every entry: type and mode,
owner, size, content (sha256), the data/hole map (SEEK_DATA/SEEK_HOLE in
4 KiB blocks), atime and mtime to the nanosecond, xattrs, symlink targets,
device numbers, link counts and which names are hard links of each other.

What cannot match, and is not compared:
- ctime and otime: set by the kernel when an inode changes; neither tool can
  set them (the stream's ctime is informational);
- a directory's link count and size: btrfs always gives directories one link
  and a size of twice the name bytes, other file systems do not;
- ``btrfs.*`` xattrs (``btrfs.compression``): properties of btrfs, which no
  other file system stores; the extractor reports them as skipped;
- the received UUID and the read-only flag of the subvolume: DIR is a plain
  directory.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import shutil
import stat
import subprocess
import sys
import uuid
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.btrfs import need_root_btrfs
from support.loopfs import btrfs_loop
from support.streams import FIXTURES, ROOT, STREAMS, stream_ids
from support.trees import BLOCK, ctimes, data_map, differences, tree_state, without_link_atimes

from sendstream import Command, encode_command, encode_stream_header
from sendstream.analysis.paths import PathTracker, is_temporary_name
from sendstream.analysis.resolve import resolve
from sendstream.codec.compression import decompress
from sendstream.errors import (
    ApplyError,
    BadCommand,
    CloneSourceMissing,
    ExtractError,
    LimitExceeded,
    UnsafePath,
    UsageError,
)
from sendstream.extract import Extractor
from sendstream.extract import extract_stream as extract
from sendstream.io.windows import file_events, iter_events

# Incrementals and the full stream of their parent (fixtures/MANIFEST.md).
PARENTS = {
    "rich-incr-v1": "rich-full-v1",
    "rich-incr-v2": "rich-full-v2",
    "rich-incr-nodata-v2": "rich-full-v2",
}
# Streams of several subvolumes: each goes to DIR/NAME, as btrfs receive puts it.
SEVERAL = {"two-concat-v1", "two-concat-v2", "two-e-v1", "two-e-v2"}
# Extracted by tests of their own: clone-src needs its parent and its clone
# source, which are not fixtures (built below on a real btrfs); btrfs-progs
# 6.2 cannot read v3.
OWN_TESTS = {"clone-src-v1", "clone-src-v2", "verity-v3"}
COMPARED = [p for p in STREAMS if p.stem not in OWN_TESTS]


# --- the real btrfs ----------------------------------------------------------


def sh(*args: str | Path, **kw: Any) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run([str(a) for a in args], capture_output=True, **kw)
    assert proc.returncode == 0, f"{args}: {proc.stderr.decode(errors='replace')}"
    return proc


@pytest.fixture(scope="module")
def fs() -> Iterator[Path]:
    need_root_btrfs()
    with btrfs_loop("1G") as mnt:
        yield mnt


@contextlib.contextmanager
def receive_dir(fs: Path, name: str) -> Iterator[Path]:
    """A directory to `btrfs receive` into; its subvolumes go afterwards, so that
    only one received subvolume at a time has a given received UUID."""
    where = fs / name
    where.mkdir()
    try:
        yield where
    finally:
        for sub in where.iterdir():
            subprocess.run(["btrfs", "subvolume", "delete", str(sub)], capture_output=True)
        shutil.rmtree(where, ignore_errors=True)


def without_clones(stream: Path, out: Path) -> Path:
    """``stream`` less its CLONE commands, through sendstream's own writer."""
    from sendstream import Encoder

    encoder = Encoder()
    with stream.open("rb") as f, out.open("wb") as o:
        for event in iter_events(f):
            if not (isinstance(event, Command) and event.name == "clone"):
                o.write(encoder.send(event))
    return out


def received(where: Path, name: str) -> Path:
    """The subvolume a stream made in ``where`` (the last one for an incremental)."""
    subvols = {p.name: p for p in where.iterdir()}
    for want in ("rich_incr", "work_2"):
        if want in subvols:
            return subvols[want]
    assert len(subvols) == 1, subvols
    return next(iter(subvols.values()))


@pytest.mark.btrfs
@pytest.mark.parametrize("stream", COMPARED, ids=stream_ids)
def test_same_tree_as_btrfs_receive(fs: Path, stream: Path, tmp_path: Path) -> None:
    chain = [FIXTURES / f"{PARENTS[stream.stem]}.stream"] if stream.stem in PARENTS else []
    chain.append(stream)
    several = stream.stem in SEVERAL
    ours = tmp_path / "dir"
    ours.mkdir()
    skipped = []
    with receive_dir(fs, stream.stem) as where:
        for s in chain:
            theirs = s
            if s.stem == "rich-full-nodata-v1":
                # --no-data leaves random.bin empty, so btrfs receive fails on the CLONEs
                # from it (EINVAL); the extractor skips them with a report. Compare with
                # what btrfs receive makes of the stream without them.
                theirs = without_clones(s, tmp_path / "noclone.stream")
            sh("btrfs", "receive", "-q", "-f", theirs, where)
            with s.open("rb") as f:
                skipped += extract(f, ours, per_subvolume=several).skipped
        if several:  # DIR itself is no subvolume: compare what is in it
            assert sorted(os.listdir(where)) == sorted(os.listdir(ours)) == ["two_a_snap", "two_b_snap"]
            pairs = [(where / n, ours / n) for n in os.listdir(ours)]
        else:
            pairs = [(received(where, stream.stem), ours)]
        for theirs_tree, ours_tree in pairs:
            assert differences(theirs_tree, ours_tree) == []
    reasons = {s.reason.split(":")[0] for s in skipped}
    allowed = {"xattr btrfs.compression", "no file data in the stream (btrfs send --no-data)"}
    allowed |= {r for r in reasons if r.startswith(("fileattr 0x", "clone source 'random.bin' is 0 bytes long"))}
    assert reasons <= allowed


@pytest.mark.btrfs
def test_onto_btrfs_reflinks_and_matches(fs: Path, tmp_path: Path) -> None:
    """DIR on btrfs itself (a plain directory): CLONE becomes a real reflink."""
    stream = FIXTURES / "rich-full-v2.stream"
    ours = fs / "plain-dir"
    ours.mkdir()
    try:
        with receive_dir(fs, "reflink") as where:
            sh("btrfs", "receive", "-q", "-f", stream, where)
            with stream.open("rb") as f:
                extract(f, ours)
            assert differences(received(where, stream.stem), ours) == []
        # the clone shares the source's extents: same physical offsets
        maps = [sh("filefrag", "-v", ours / n).stdout.splitlines()[3] for n in ("random.bin", "random-reflink.bin")]
        assert maps[0].split()[3] == maps[1].split()[3]
    finally:
        shutil.rmtree(ours)


# --- clone sources -----------------------------------------------------------


@pytest.fixture(scope="module")
def clone_world(fs: Path) -> Path:
    """lib, lib_snap, work, work_1, work_2 as tools/make_fixtures.py builds them
    (seeded content, fixed times): work_1 is the parent of the clone-src
    fixtures and lib_snap their clone source, with other UUIDs."""
    world = fs / "clone-world"
    world.mkdir()
    sh(sys.executable, ROOT / "tools" / "make_fixtures.py", "--clone-tree", world)
    return world


def first(stream: Path, name: str, pred: Any = lambda c: True) -> Command:
    with stream.open("rb") as f:
        for event in iter_events(f):
            if isinstance(event, Command) and event.name == name and pred(event):
                return event
    raise AssertionError(f"no {name} in {stream}")


def renamed_send(world: Path, subvol: str, new_uuid: uuid.UUID, ctransid: int, out: Path) -> Path:
    """`btrfs send SUBVOL` with the SUBVOL command's UUID and ctransid replaced, so
    that what receives it stands for the fixture's subvolume of that UUID."""
    raw = sh("btrfs", "send", "-q", world / subvol).stdout
    from sendstream import Encoder

    encoder = Encoder()
    with out.open("wb") as o:
        for event in iter_events(io.BytesIO(raw)):
            if isinstance(event, Command) and event.name == "subvol":
                event = Command.build(
                    "subvol", [("path", event.get("path")), ("uuid", new_uuid), ("ctransid", ctransid)]
                )
            o.write(encoder.send(event))
    return out


@pytest.mark.btrfs
@pytest.mark.parametrize("version", [1, 2])
def test_clone_sources_against_btrfs_receive(fs: Path, clone_world: Path, tmp_path: Path, version: int) -> None:
    stream = FIXTURES / f"clone-src-v{version}.stream"
    snapshot = first(stream, "snapshot")
    own = snapshot.get("uuid")
    foreign = first(stream, "clone", lambda c: c.get("clone_uuid") != own)
    lib_uuid, parent_uuid = foreign.get("clone_uuid"), snapshot.get("clone_uuid")
    parent = renamed_send(clone_world, "work_1", parent_uuid, snapshot.get("clone_ctransid"), tmp_path / "p.stream")
    lib = renamed_send(clone_world, "lib_snap", lib_uuid, foreign.get("clone_ctransid"), tmp_path / "l.stream")

    ours = tmp_path / "dir"
    clones = tmp_path / "clones"
    ours.mkdir()
    clones.mkdir()
    (clones / str(lib_uuid)).mkdir()
    with receive_dir(fs, f"clone-src-v{version}") as where:
        for s in (parent, lib, stream):
            sh("btrfs", "receive", "-q", "-f", s, where)
        with parent.open("rb") as f:
            extract(f, ours)
        with lib.open("rb") as f:
            extract(f, clones / str(lib_uuid))
        with stream.open("rb") as f, pytest.raises(CloneSourceMissing) as missing:
            extract(f, ours)
        assert str(lib_uuid) in str(missing.value) and "--clone-from" in str(missing.value)
        # the failed command was the first foreign CLONE: start again from the parent
        shutil.rmtree(ours)
        ours.mkdir()
        with parent.open("rb") as f:
            extract(f, ours)
        with stream.open("rb") as f:
            if version == 1:
                report = extract(f, ours, clone_dirs=[clones])
            else:
                report = extract(f, ours, clone_sources={lib_uuid: clones / str(lib_uuid)})
        assert report.skipped == []
        assert differences(where / "work_2", ours) == []


# --- v3 (no btrfs-progs reads it): the fixture's own commands say what to expect ---


def test_verity_v3_stream(tmp_path: Path) -> None:
    with (FIXTURES / "verity-v3.stream").open("rb") as f:
        report = extract(f, tmp_path)
    commands: dict[str, Command] = {}
    with (FIXTURES / "verity-v3.stream").open("rb") as f:
        for event in iter_events(f):
            if isinstance(event, Command):
                commands.setdefault(event.name, event)  # the first of each: the file's UTIMES, not the root's
    sector = commands["fallocate"].get("size")  # the punched hole: one sector
    atime, mtime = commands["utimes"].get("atime"), commands["utimes"].get("mtime")
    encoded = commands["encoded_write"]
    expect = bytes(commands["write"].get("data")) + bytes(sector)
    expect += decompress(1, encoded.get("data"), encoded.get("unencoded_len"))
    target = tmp_path / "file"
    st = target.lstat()  # before reading it changes the atime
    assert target.read_bytes() == expect
    with target.open("rb") as f:
        assert data_map(f.fileno(), len(expect)) == [(0, sector), (2 * sector, 4 * sector)]
    assert (stat.S_IMODE(st.st_mode), st.st_atime_ns, st.st_mtime_ns) == (
        0o644,
        atime.sec * 10**9 + atime.nsec,
        mtime.sec * 10**9 + mtime.nsec,
    )
    # fileattr is ignored as by btrfs receive; ext4/tmpfs without verity refuse ENABLE_VERITY
    # (and the fixture's signature is a placeholder); a user who is not root cannot chown to root.
    assert {s.command for s in report.skipped} - {"chown"} <= {"fileattr", "enable_verity"}
    assert "fileattr" in {s.command for s in report.skipped}


# --- crafted hostile streams ---------------------------------------------------

UUID_SELF = uuid.UUID(int=0x5E1F)
UUID_OTHER = uuid.UUID(int=0x07E4)


def build(name: str, *attrs: tuple[str, Any]) -> Command:
    return Command.build(name, list(attrs))


def subvol(name: bytes = b"evil") -> Command:
    return build("subvol", ("path", name), ("uuid", UUID_SELF), ("ctransid", 1))


def mkfile(path: bytes, ino: int = 300) -> Command:
    return build("mkfile", ("path", path), ("ino", ino))


def mkdir(path: bytes, ino: int = 400) -> Command:
    return build("mkdir", ("path", path), ("ino", ino))


def symlink(path: bytes, target: bytes, ino: int = 500) -> Command:
    return build("symlink", ("path", path), ("ino", ino), ("path_link", target))


def write(path: bytes, data: bytes = b"pwned\n", offset: int = 0) -> Command:
    return build("write", ("path", path), ("file_offset", offset), ("data", data))


def rename(src: bytes, dst: bytes) -> Command:
    return build("rename", ("path", src), ("path_to", dst))


def link(path: bytes, existing: bytes) -> Command:
    return build("link", ("path", path), ("path_link", existing))


def clone(path: bytes, source: bytes, source_uuid: uuid.UUID = UUID_SELF, length: int = 6) -> Command:
    return build(
        "clone",
        ("file_offset", 0),
        ("clone_len", length),
        ("path", path),
        ("clone_uuid", source_uuid),
        ("clone_ctransid", 1),
        ("clone_path", source),
        ("clone_offset", 0),
    )


def stream_of(*commands: Command, version: int = 2) -> tuple[bytes, list[int]]:
    """The stream bytes and the offset of each command."""
    out = bytearray(encode_stream_header(version))
    offsets = []
    for cmd in commands:
        offsets.append(len(out))
        out += encode_command(cmd, version)
    return bytes(out), offsets


@pytest.fixture
def arena(tmp_path: Path) -> Iterator[tuple[Path, Path]]:
    """DIR, and a sentinel tree next to it that must stay exactly as it is."""
    sentinel = tmp_path / "sentinel"
    (sentinel / "dir").mkdir(parents=True)
    (sentinel / "secret").write_bytes(b"secret\n")
    (sentinel / "dir" / "inner").write_bytes(b"inner\n")
    os.setxattr(sentinel / "secret", "user.keep", b"me")
    os.chmod(sentinel / "secret", 0o640)
    for p in (sentinel / "dir" / "inner", sentinel / "secret", sentinel / "dir", sentinel):
        os.utime(p, ns=(1_000_000_000, 2_000_000_000))
    dest = tmp_path / "dest"
    dest.mkdir()
    before = tree_state(sentinel), sorted(os.listdir(tmp_path))
    yield dest, sentinel
    assert (tree_state(sentinel), sorted(os.listdir(tmp_path))) == before, "something was written outside DIR"


OUTSIDE = b"../sentinel/secret"
ESCAPE_NAME = f"sendstream-escape-{os.getpid()}".encode()


def hostile_cases(sentinel: Path) -> list[tuple[str, list[Command], type[ExtractError]]]:
    """(id, commands after SUBVOL, the error of the last command)."""
    abs_sentinel = os.fsencode(sentinel)
    return [
        ("dotdot-mkfile", [mkfile(b"../sentinel/evil")], UnsafePath),
        ("dotdot-deep", [mkdir(b"d"), mkfile(b"d/../../sentinel/evil")], UnsafePath),
        ("absolute-mkfile", [mkfile(abs_sentinel + b"/evil")], UnsafePath),
        ("absolute-write", [write(abs_sentinel + b"/secret")], UnsafePath),
        ("dot-component", [mkfile(b"./x")], UnsafePath),
        ("empty-component", [mkdir(b"d"), mkfile(b"d//x")], UnsafePath),
        ("trailing-slash", [mkfile(b"x/")], UnsafePath),
        ("dotdot-write", [write(OUTSIDE)], UnsafePath),
        ("dotdot-truncate", [build("truncate", ("path", OUTSIDE), ("size", 0))], UnsafePath),
        ("dotdot-unlink", [build("unlink", ("path", OUTSIDE))], UnsafePath),
        ("dotdot-rmdir", [build("rmdir", ("path", b"../sentinel/dir"))], UnsafePath),
        ("dotdot-rename-from", [rename(OUTSIDE, b"stolen")], UnsafePath),
        ("dotdot-rename-to", [mkfile(b"x"), rename(b"x", b"../sentinel/secret")], UnsafePath),
        ("dotdot-chmod", [build("chmod", ("path", OUTSIDE), ("mode", 0o777))], UnsafePath),
        ("dotdot-chown", [build("chown", ("path", OUTSIDE), ("uid", 1), ("gid", 1))], UnsafePath),
        (
            "dotdot-xattr",
            [build("set_xattr", ("path", OUTSIDE), ("xattr_name", b"user.x"), ("xattr_data", b"1"))],
            UnsafePath,
        ),
        ("dotdot-symlink-name", [symlink(b"../sentinel/evil", b"x")], UnsafePath),
        ("symlink-to-root-then-create", [symlink(b"r", b"/"), mkfile(b"r/tmp/" + ESCAPE_NAME)], UnsafePath),
        ("symlink-to-root-then-write", [symlink(b"r", b"/"), write(b"r/tmp/" + ESCAPE_NAME)], UnsafePath),
        ("symlink-dir-then-write", [symlink(b"s", abs_sentinel), write(b"s/secret")], UnsafePath),
        ("symlink-dir-then-mkdir", [symlink(b"s", b"../sentinel"), mkdir(b"s/evil")], UnsafePath),
        ("symlink-dir-then-symlink", [symlink(b"s", b"../sentinel"), symlink(b"s/evil", b"x", 501)], UnsafePath),
        (
            "symlink-dir-then-utimes",
            [
                symlink(b"s", b"../sentinel"),
                build("utimes", ("path", b"s/secret"), ("atime", (0, 0)), ("mtime", (0, 0)), ("ctime", (0, 0))),
            ],
            UnsafePath,
        ),
        (
            "symlink-dir-then-chown",
            [symlink(b"s", b"../sentinel"), build("chown", ("path", b"s/secret"), ("uid", 1), ("gid", 1))],
            UnsafePath,
        ),
        (
            "symlink-dir-then-unlink",
            [symlink(b"s", b"../sentinel"), build("unlink", ("path", b"s/secret"))],
            UnsafePath,
        ),
        ("symlink-file-then-write", [symlink(b"f", OUTSIDE), write(b"f")], UnsafePath),
        (
            "symlink-file-then-truncate",
            [symlink(b"f", OUTSIDE), build("truncate", ("path", b"f"), ("size", 0))],
            UnsafePath,
        ),
        (
            "symlink-file-then-chmod",
            [symlink(b"f", OUTSIDE), build("chmod", ("path", b"f"), ("mode", 0o777))],
            UnsafePath,
        ),
        (
            "symlink-file-then-fallocate",
            [
                symlink(b"f", OUTSIDE),
                build("fallocate", ("path", b"f"), ("fallocate_mode", 3), ("file_offset", 0), ("size", 4096)),
            ],
            UnsafePath,
        ),
        (
            "symlink-file-then-encoded-write",
            [
                symlink(b"f", OUTSIDE),
                build(
                    "encoded_write",
                    ("path", b"f"),
                    ("file_offset", 0),
                    ("unencoded_file_len", 3),
                    ("unencoded_len", 3),
                    ("unencoded_offset", 0),
                    ("compression", 1),
                    ("data", zlib.compress(b"bad")),
                ),
            ],
            UnsafePath,
        ),
        (
            "symlink-file-then-clone-into",
            [mkfile(b"src"), write(b"src", b"clone!"), symlink(b"f", OUTSIDE), clone(b"f", b"src")],
            UnsafePath,
        ),
        ("rename-symlink-over-dir", [mkdir(b"d"), symlink(b"s", b"../sentinel"), rename(b"s", b"d")], ApplyError),
        (
            "rename-symlink-over-empty-place-then-write",
            [
                mkdir(b"d"),
                symlink(b"s", b"../sentinel"),
                build("rmdir", ("path", b"d")),
                rename(b"s", b"d"),
                write(b"d/secret"),
            ],
            UnsafePath,
        ),
        (
            "rename-symlink-over-file-then-write",
            [mkfile(b"x"), symlink(b"s", OUTSIDE), rename(b"s", b"x"), write(b"x")],
            UnsafePath,
        ),
        ("hardlink-to-outside", [link(b"hl", OUTSIDE)], UnsafePath),
        ("hardlink-to-absolute", [link(b"hl", abs_sentinel + b"/secret")], UnsafePath),
        ("hardlink-of-symlink-then-write", [symlink(b"s", OUTSIDE), link(b"hl", b"s"), write(b"hl")], UnsafePath),
        ("hardlink-through-symlink-dir", [symlink(b"s", b"../sentinel"), link(b"hl", b"s/secret")], UnsafePath),
        ("clone-source-dotdot", [mkfile(b"x"), clone(b"x", OUTSIDE)], UnsafePath),
        ("clone-source-absolute", [mkfile(b"x"), clone(b"x", abs_sentinel + b"/secret")], UnsafePath),
        ("clone-source-symlink", [mkfile(b"x"), symlink(b"s", OUTSIDE), clone(b"x", b"s")], UnsafePath),
        (
            "clone-source-through-symlink",
            [mkfile(b"x"), symlink(b"s", b"../sentinel"), clone(b"x", b"s/secret")],
            UnsafePath,
        ),
        ("clone-source-unknown-subvolume", [mkfile(b"x"), clone(b"x", b"secret", UUID_OTHER)], CloneSourceMissing),
        (
            "write-to-fifo",
            [build("mkfifo", ("path", b"p"), ("ino", 600), ("rdev", 0), ("mode", 0o10600)), write(b"p")],
            BadCommand,
        ),
        (
            "write-to-device",
            [
                build("mknod", ("path", b"null"), ("ino", 600), ("mode", 0o20666), ("rdev", os.makedev(1, 3))),
                write(b"null"),
            ],
            BadCommand,
        ),
        ("mkfile-over-symlink", [symlink(b"s", OUTSIDE), mkfile(b"s")], ApplyError),
        (
            "mknod-regular",
            [build("mknod", ("path", b"n"), ("ino", 600), ("mode", 0o100644), ("rdev", 0))],
            BadCommand,
        ),
        ("subvolume-root-rename", [rename(b"", b"x")], BadCommand),
    ]


CASE_IDS = [case[0] for case in hostile_cases(Path("/nonexistent"))]


@pytest.mark.parametrize("case", CASE_IDS)
def test_hostile_stream_writes_nothing_outside(arena: tuple[Path, Path], case: str) -> None:
    dest, sentinel = arena
    if case == "write-to-device" and os.geteuid() != 0:
        pytest.skip("making a device node needs root (elsewhere it becomes a regular file)")
    _, commands, error = next(c for c in hostile_cases(sentinel) if c[0] == case)
    data, offsets = stream_of(subvol(), *commands, build("end"))
    with pytest.raises(ExtractError) as caught:
        extract(io.BytesIO(data), dest)
    exc = caught.value
    assert type(exc) is error, str(exc)
    bad = len(commands)  # SUBVOL is #0: the last crafted command is the bad one
    assert (exc.offset, exc.index, exc.command) == (offsets[bad], bad, commands[-1].name)
    text = str(exc)
    assert text.startswith(f"offset {offsets[bad]}, command #{bad} ({commands[-1].name})"), text
    if error is UnsafePath:
        assert "expected" in text
    assert not Path("/tmp", os.fsdecode(ESCAPE_NAME)).exists()


def test_subvolume_names_are_checked(tmp_path: Path) -> None:
    for name in (b"../evil", b"a/b", b"/abs", b".", b""):
        data, _ = stream_of(subvol(name), build("end"))
        with pytest.raises(UnsafePath):
            extract(io.BytesIO(data), tmp_path, per_subvolume=True)
    assert os.listdir(tmp_path) == []


def test_refused_command_leaves_no_trace(tmp_path: Path) -> None:
    """Checks and decompression come before the first change."""
    good = b"good data\n"
    bad_zlib = build(
        "encoded_write",
        ("path", b"f"),
        ("file_offset", 0),
        ("unencoded_file_len", 4096),
        ("unencoded_len", 4096),
        ("unencoded_offset", 0),
        ("compression", 1),
        ("data", b"\x78\x9c garbage"),
    )
    data, _ = stream_of(subvol(), mkfile(b"f"), write(b"f", good), bad_zlib, build("end"))
    with pytest.raises(BadCommand, match="cannot decompress"):
        extract(io.BytesIO(data), tmp_path)
    assert (tmp_path / "f").read_bytes() == good
    out_of_range = build(
        "encoded_write",
        ("path", b"f"),
        ("file_offset", 0),
        ("unencoded_file_len", 8192),
        ("unencoded_len", 4096),
        ("unencoded_offset", 0),
        ("compression", 0),
        ("data", bytes(4096)),
    )
    too_big = build(
        "encoded_write",
        ("path", b"f"),
        ("file_offset", 0),
        ("unencoded_file_len", 1),
        ("unencoded_len", 1 << 40),
        ("unencoded_offset", 0),
        ("compression", 2),
        ("data", b"x"),
    )
    for cmd in (out_of_range, too_big):
        shutil.rmtree(tmp_path)
        tmp_path.mkdir()
        data, _ = stream_of(subvol(), mkfile(b"f"), write(b"f", good), cmd, build("end"))
        with pytest.raises(BadCommand):
            extract(io.BytesIO(data), tmp_path)
        assert (tmp_path / "f").read_bytes() == good


def test_stream_order_and_layout_errors(tmp_path: Path) -> None:
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_bytes(b"")
    data, _ = stream_of(subvol(), build("end"))
    with pytest.raises(BadCommand, match="is not empty"):
        extract(io.BytesIO(data), tmp_path / "full")
    (tmp_path / "empty").mkdir()
    data, _ = stream_of(mkfile(b"x"), build("end"))
    with pytest.raises(BadCommand, match="SUBVOL or SNAPSHOT first"):
        extract(io.BytesIO(data), tmp_path / "empty")
    with (FIXTURES / "two-e-v1.stream").open("rb") as f, pytest.raises(BadCommand, match="several subvolumes"):
        extract(f, tmp_path / "empty")


EMPTY_PARENT_SNAPSHOT = build(
    "snapshot", ("path", b"s"), ("uuid", UUID_SELF), ("ctransid", 2), ("clone_uuid", UUID_OTHER), ("clone_ctransid", 1)
)


def test_an_incremental_onto_an_empty_directory_is_one_of_an_empty_parent(tmp_path: Path) -> None:
    """It was refused ("'DIR' is empty; expected the extraction of the parent subvolume"), while an
    empty directory is exactly the extraction of an empty parent and btrfs receive makes the
    snapshot. The summary says DIR was taken as such."""
    (tmp_path / "d").mkdir()
    data, _ = stream_of(
        EMPTY_PARENT_SNAPSHOT,
        mkfile(b"o257-2-0"),
        rename(b"o257-2-0", b"new"),
        write(b"new", b"hello"),
        build("utimes", ("path", b""), *((k, (5, 0)) for k in ("atime", "mtime", "ctime"))),
        build("end"),
    )
    report = extract(io.BytesIO(data), tmp_path / "d")
    assert (tmp_path / "d" / "new").read_bytes() == b"hello"
    assert [s.onto_empty for s in report.subvolumes] == [True]
    assert "(empty: its parent was empty)" in report.summary()


@pytest.mark.parametrize(
    "names_the_parent",
    [
        [write(b"old", b"x")],
        [rename(b"old", b"new")],
        [build("unlink", ("path", b"old"))],
        [mkfile(b"o257-2-0"), rename(b"o257-2-0", b"dir/new")],
        [link(b"new", b"old")],
        [build("chmod", ("path", b"dir"), ("mode", 0o700))],
    ],
    ids=["write", "rename", "unlink", "into-a-directory", "link", "chmod"],
)
def test_an_empty_directory_that_is_not_the_parent_is_told(tmp_path: Path, names_the_parent: list[Command]) -> None:
    """The guard for a user who points at the wrong empty directory: the incremental may name
    nothing of its parent but the root; the first command on anything else stops the extraction
    with the path, and says the directory is not the parent's extraction."""
    (tmp_path / "d").mkdir()
    data, offsets = stream_of(EMPTY_PARENT_SNAPSHOT, *names_the_parent, build("end"))
    with pytest.raises(BadCommand, match="was empty, and the incremental names something of its parent") as caught:
        extract(io.BytesIO(data), tmp_path / "d")
    assert caught.value.offset == offsets[-2] and caught.value.path in (b"old", b"dir", b"new", b"o257-2-0")
    assert "expected the extraction of the parent subvolume" in str(caught.value)
    assert list((tmp_path / "d").iterdir()) in ([], [tmp_path / "d" / "o257-2-0"])


def test_the_parents_root_times_stay_when_the_stream_sends_none(tmp_path: Path) -> None:
    """The kernel sends no UTIMES of an unchanged root, even after it made a new inode there under
    a temporary name and renamed it away, which moved the root's times here: they are put back as
    the parent's at END. A UTIMES of the root in the stream wins."""
    for stream_sets_them in (False, True):
        where = tmp_path / f"d{stream_sets_them}"
        (where / "d").mkdir(parents=True)
        os.utime(where, ns=(7_000_000_001, 9_000_000_002))
        commands = [EMPTY_PARENT_SNAPSHOT, mkfile(b"o257-2-0"), rename(b"o257-2-0", b"d/new")]
        if stream_sets_them:
            commands.append(build("utimes", ("path", b""), *((k, (5, 6)) for k in ("atime", "mtime", "ctime"))))
        data, _ = stream_of(*commands, build("end"))
        extract(io.BytesIO(data), where)
        st = where.stat()
        assert (st.st_atime_ns, st.st_mtime_ns) == ((5_000_000_006,) * 2 if stream_sets_them else
                                                    (7_000_000_001, 9_000_000_002))  # fmt: skip
        assert (where / "d" / "new").exists()


@pytest.mark.btrfs
def test_an_incremental_of_an_empty_parent_like_btrfs_receive(fs: Path, tmp_path: Path) -> None:
    """The kernel's incremental of an empty subvolume, extracted onto the extraction of its
    (empty) parent, makes the tree btrfs receive makes."""
    work = fs / "emptyparent"
    work.mkdir()
    made: list[Path] = []
    try:
        sh("btrfs", "subvolume", "create", work / "s")
        made.append(work / "s")
        sh("btrfs", "subvolume", "snapshot", "-r", work / "s", work / "A")
        made.append(work / "A")
        (work / "s" / "d").mkdir()
        (work / "s" / "d" / "f").write_bytes(b"data\n" * 100)
        (work / "s" / "g").write_bytes(b"g")
        sh("btrfs", "subvolume", "snapshot", "-r", work / "s", work / "B")
        made.append(work / "B")
        sh("btrfs", "send", "-q", "-f", tmp_path / "A.stream", work / "A")
        sh("btrfs", "send", "-q", "-f", tmp_path / "B.stream", "-p", work / "A", work / "B")
        out = tmp_path / "out"
        out.mkdir()
        extract(tmp_path / "A.stream", out)
        assert list(out.iterdir()) == []
        report = extract(tmp_path / "B.stream", out)
        assert [s.onto_empty for s in report.subvolumes] == [True]
        with receive_dir(fs, "emptyparent-received") as where:
            sh("btrfs", "receive", "-q", "-f", tmp_path / "A.stream", where)
            sh("btrfs", "receive", "-q", "-f", tmp_path / "B.stream", where)
            assert tree_state(out) == tree_state(where / "B")
    finally:
        for sub in reversed(made):
            subprocess.run(["btrfs", "subvolume", "delete", str(sub)], capture_output=True)
        shutil.rmtree(work, ignore_errors=True)


def test_incremental_clone_from_the_changed_parent_is_refused(tmp_path: Path) -> None:
    snap = build(
        "snapshot",
        ("path", b"s"),
        ("uuid", UUID_SELF),
        ("ctransid", 2),
        ("clone_uuid", UUID_OTHER),
        ("clone_ctransid", 1),
    )
    (tmp_path / "old").write_bytes(b"parent data")
    data, _ = stream_of(snap, mkfile(b"x"), clone(b"x", b"old", UUID_OTHER), build("end"))
    with pytest.raises(CloneSourceMissing, match="parent snapshot"):
        extract(io.BytesIO(data), tmp_path)


def test_device_nodes_become_files_when_not_permitted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.mknod

    def refuse(path: Any, mode: int = 0o600, device: int = 0, *, dir_fd: int | None = None) -> None:
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
            raise PermissionError(errno.EPERM, "Operation not permitted")
        real(path, mode, device, dir_fd=dir_fd)

    monkeypatch.setattr(os, "mknod", refuse)
    dev = build("mknod", ("path", b"null"), ("ino", 600), ("rdev", os.makedev(1, 3)), ("mode", 0o20666))
    data, _ = stream_of(subvol(), dev, build("chmod", ("path", b"null"), ("mode", 0o640)), build("end"))
    report = extract(io.BytesIO(data), tmp_path)
    assert [s.command for s in report.skipped] == ["mknod"]
    assert "character device (1, 3)" in report.skipped[0].reason
    st = (tmp_path / "null").lstat()
    assert stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o640 and st.st_size == 0


FUZZ_PATHS = [b"a", b"b", b"a/b", b"a/b/c", b"s", b"s/secret", b"s/x", b"l", b"l/x", b"o257-1-0", b"o257-1-0/f"]
FUZZ_PATHS += [b"..", b"../sentinel/secret", b"a/../../sentinel/secret", b"/tmp/" + ESCAPE_NAME, b"", b"a//b", b"."]
FUZZ_TARGETS = [b"../sentinel", b"../sentinel/secret", b"/", b"a", b"../../..", b"s/secret"]


def fuzz_command(draw: Any, sentinel: Path) -> Command:
    from hypothesis import strategies as st

    p = draw(st.sampled_from(FUZZ_PATHS))
    q = draw(st.sampled_from(FUZZ_PATHS))
    kind = draw(st.sampled_from(
        ["mkfile", "mkdir", "symlink", "rename", "link", "unlink", "rmdir", "write", "truncate", "clone",
         "chmod", "chown", "utimes", "set_xattr", "remove_xattr", "mkfifo", "fallocate", "encoded_write"]
    ))  # fmt: skip
    if kind in ("mkfile", "mkdir", "mkfifo"):
        return build(kind, ("path", p), ("ino", 300))
    if kind == "symlink":
        target = draw(st.sampled_from([*FUZZ_TARGETS, os.fsencode(sentinel)]))
        return symlink(p, target)
    if kind == "rename":
        return rename(p, q)
    if kind == "link":
        return link(p, q)
    if kind in ("unlink", "rmdir"):
        return build(kind, ("path", p))
    if kind == "write":
        return write(p, b"pwned", draw(st.sampled_from([0, 4096, 1 << 40])))
    if kind == "truncate":
        return build("truncate", ("path", p), ("size", draw(st.sampled_from([0, 10, 1 << 62]))))
    if kind == "clone":
        return clone(p, q, draw(st.sampled_from([UUID_SELF, UUID_OTHER])), draw(st.sampled_from([0, 5, 1 << 62])))
    if kind == "chmod":
        return build("chmod", ("path", p), ("mode", 0o7777))
    if kind == "chown":
        return build("chown", ("path", p), ("uid", 1234), ("gid", 1234))
    if kind == "utimes":
        return build("utimes", ("path", p), ("atime", (0, 0)), ("mtime", (1, 2)), ("ctime", (0, 0)))
    if kind == "set_xattr":
        return build("set_xattr", ("path", p), ("xattr_name", b"user.pwned"), ("xattr_data", b"1"))
    if kind == "remove_xattr":
        return build("remove_xattr", ("path", p), ("xattr_name", b"user.keep"))
    if kind == "fallocate":
        return build("fallocate", ("path", p), ("fallocate_mode", 3), ("file_offset", 0), ("size", 1 << 20))
    return build(
        "encoded_write", ("path", p), ("file_offset", 0), ("unencoded_file_len", 5), ("unencoded_len", 5),
        ("unencoded_offset", 0), ("compression", 1), ("data", zlib.compress(b"pwned")),
    )  # fmt: skip


def test_random_hostile_sequences_stay_inside() -> None:
    """Random commands over paths with '..', absolute paths and symlinks out: each is
    applied or refused with an ExtractError, and nothing outside DIR ever changes."""
    import tempfile

    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    @settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.data())
    def run(data: Any) -> None:
        with tempfile.TemporaryDirectory() as top:
            base = Path(top)
            sentinel = base / "sentinel"
            sentinel.mkdir()
            (sentinel / "secret").write_bytes(b"secret\n")
            os.setxattr(sentinel / "secret", "user.keep", b"me")
            for p in (sentinel / "secret", sentinel, base):
                os.utime(p, ns=(10**9, 2 * 10**9))
            (base / "dest").mkdir()
            before = tree_state(sentinel), sorted(os.listdir(base))
            commands = [fuzz_command(data.draw, sentinel) for _ in range(data.draw(st.integers(1, 12)))]
            with Extractor(base / "dest") as x:
                x.apply(subvol())
                for cmd in commands:
                    with contextlib.suppress(ExtractError):
                        x.apply(cmd)
            assert (tree_state(sentinel), sorted(os.listdir(base))) == before
            assert not Path("/tmp", os.fsdecode(ESCAPE_NAME)).exists()

    run()


# --- pieces ---------------------------------------------------------------------


def test_parse_clone_from(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--clone-from =DIR` (an empty UUID) was taken as a directory named `=DIR`, and the error came
    later and named no path; now every value's directory must exist, and the error names the value."""
    from sendstream.extract import parse_clone_from

    monkeypatch.chdir(tmp_path)
    for d in ("lib", "clones", "a=b"):
        (tmp_path / d).mkdir()
    u = uuid.UUID("9db24a68-fcc1-8b4c-9e63-ffaea681221b")
    assert parse_clone_from([f"{u}=lib", "clones", "a=b"]) == ({u: "lib"}, ["clones", "a=b"])
    for value, says in (
        ("=lib", "'' is not a UUID (UUID=DIR), and there is no directory '=lib'"),
        ("x=lib", "'x' is not a UUID (UUID=DIR), and there is no directory 'x=lib'"),
        (f"{u}=", "no directory after '='"),
        (f"{u}=missing", "'missing' is not a directory"),
        ("missing", "not a directory"),
    ):
        with pytest.raises(UsageError) as caught:
            parse_clone_from([value])
        assert str(caught.value).endswith(f"--clone-from {value!r}: {says}"), str(caught.value)
        assert caught.value.exit_code == 2


# --- paths and statistics --------------------------------------------------------


def test_temporary_name_is_reported_at_its_final_path() -> None:
    commands = [
        subvol(),
        mkfile(b"o257-7-0", 257),
        mkdir(b"o258-7-0", 258),
        rename(b"o258-7-0", b"dir"),
        rename(b"o257-7-0", b"dir/file"),
        write(b"dir/file"),
        build("end"),
    ]
    records = list(resolve(commands))
    assert [r.command for r in records] == [c.name for c in commands]
    assert (records[1].path, records[1].final) == (b"o257-7-0", b"dir/file")
    assert records[2].final == b"dir" and records[5].final == b"dir/file" and records[5].renamed is False
    assert records[0].path is None and records[0].subvolume == b"evil"
    assert is_temporary_name(b"o257-7-0") and not is_temporary_name(b"o257-7") and not is_temporary_name(b"dir")


def test_directory_filled_under_its_temporary_name() -> None:
    tracker = PathTracker()
    tracker.feed(subvol())
    made = tracker.feed(mkdir(b"o300-9-0", 300))
    inner = tracker.feed(mkfile(b"o300-9-0/f", 301))
    tracker.feed(rename(b"o300-9-0", b"a/b"))
    assert made is not None and inner is not None
    assert (inner.path, inner.entry.final_path()) == (b"o300-9-0/f", b"a/b/f")
    assert made.entry.final_path() == b"a/b"


def test_hard_link_survivor_and_removed_file() -> None:
    tracker = PathTracker()
    tracker.feed(
        snapshot := build(
            "snapshot",
            ("path", b"s"),
            ("uuid", UUID_SELF),
            ("ctransid", 2),
            ("clone_uuid", UUID_OTHER),
            ("clone_ctransid", 1),
        )
    )
    assert snapshot.name == "snapshot"
    written = tracker.feed(write(b"old-name"))
    tracker.feed(link(b"new-name", b"old-name"))
    tracker.feed(build("unlink", ("path", b"old-name")))
    gone = tracker.feed(write(b"doomed"))
    tracker.feed(build("unlink", ("path", b"doomed")))
    assert written is not None and gone is not None
    assert written.entry.final_path() == b"new-name"
    assert gone.entry.final_path() is None


def test_rename_into_itself_is_an_error_not_a_cycle() -> None:
    from sendstream.errors import FormatError

    tracker = PathTracker()
    tracker.feed(subvol())
    tracker.feed(mkdir(b"a"))
    with pytest.raises(FormatError, match="renamed into itself"):
        tracker.feed(rename(b"a", b"a/b/c"))
    assert tracker.lookup(b"a").path() == b"a"


def test_clone_copy_keeps_holes_and_refuses_overlap(tmp_path: Path) -> None:
    """Where no reflink is possible, a clone copies data and punches the source's holes."""
    block = b"d" * BLOCK
    commands = [
        subvol(),
        mkfile(b"src", 257),
        write(b"src", block, 0),
        write(b"src", block, 16 * BLOCK),
        build("truncate", ("path", b"src"), ("size", 32 * BLOCK)),
        mkfile(b"dst", 258),
        write(b"dst", b"x" * (8 * BLOCK), 0),
        clone(b"dst", b"src", length=32 * BLOCK),
        mkfile(b"short", 259),
        clone(b"short", b"src", length=10**9),  # cut at the source's end, as the kernel does
        build("end"),
    ]
    data, _ = stream_of(*commands)
    report = extract(io.BytesIO(data), tmp_path)
    src = (tmp_path / "src").read_bytes()
    for name in ("dst", "short"):
        assert (tmp_path / name).read_bytes() == src
        with (tmp_path / name).open("rb") as f:
            assert data_map(f.fileno(), len(src)) == [(0, BLOCK), (16 * BLOCK, 17 * BLOCK)]
    assert report.data_bytes == 2 * BLOCK + 8 * BLOCK + 2 * 32 * BLOCK
    overlap = build(
        "clone",
        ("file_offset", BLOCK),
        ("clone_len", 4 * BLOCK),
        ("path", b"src"),
        ("clone_uuid", UUID_SELF),
        ("clone_ctransid", 1),
        ("clone_path", b"src"),
        ("clone_offset", 0),
    )
    shutil.rmtree(tmp_path)
    tmp_path.mkdir()
    data, _ = stream_of(subvol(), mkfile(b"src"), write(b"src", block * 8), overlap, build("end"))
    with pytest.raises(BadCommand, match="overlaps"):
        extract(io.BytesIO(data), tmp_path)
    assert (tmp_path / "src").read_bytes() == block * 8


def test_the_comparison_sees_each_attribute(tmp_path: Path) -> None:
    """differences() is not blind: each kind of change to an extraction shows."""
    stream = FIXTURES / "rich-full-v2.stream"
    trees = [tmp_path / "a", tmp_path / "b"]
    for t in trees:
        t.mkdir()
        with stream.open("rb") as f:
            extract(f, t)
    assert differences(*trees) == []
    b = trees[1]
    os.utime(b / "text.txt", ns=(1, (b / "text.txt").lstat().st_mtime_ns))
    os.setxattr(b / "hello.txt", "user.comment", b"changed")
    fd = os.open(b / "partial-clone.bin", os.O_WRONLY)
    try:
        from sendstream.extract.syscalls import fallocate

        fallocate(fd, 3, 0, BLOCK)  # a hole where there was data
    finally:
        os.close(fd)
    os.unlink(b / "links" / "hard1")
    (b / "links" / "hard1").write_bytes(b"I have many names\n")
    found = "\n".join(differences(*trees))
    for needle in (
        "b'text.txt' atime",
        "b'hello.txt' xattrs",
        "b'partial-clone.bin' data",
        "b'partial-clone.bin' sha256",
        "b'links/hard1' nlink",
        "hard links",
    ):
        assert needle in found, found


# --- limits: deep trees, clone copies, skips, hostile values ----------------------


def deep(depth: int, name: bytes = b"a") -> bytes:
    return b"/".join([name] * depth)


def read_deep(root: Path, path: bytes) -> bytes:
    """The content of the file ``path`` below ``root``, opened component by component
    (the full path is longer than the kernel resolves at once, PATH_MAX)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    parts = path.split(b"/")
    try:
        for part in parts[:-1]:
            fd, old = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd), fd
            os.close(old)
        with open(os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fd), "rb") as f:
            return f.read()
    finally:
        os.close(fd)


@contextlib.contextmanager
def few_fds(limit: int = 400) -> Iterator[None]:
    """At most ``limit`` open files (the fd cache keeps 256; one fd per level of a deep
    tree would be 2,000)."""
    import resource

    limits = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limits[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, limits)


@pytest.fixture
def scratch(tmp_path: Path) -> Iterator[Path]:
    """A directory for deep trees, removed by `rm -rf` (shutil.rmtree recurses): in
    /dev/shm where there is one, as removing 2,000 nested directories takes seconds
    on a disk mounted with discard."""
    import tempfile

    where = Path(tempfile.mkdtemp(dir="/dev/shm" if os.access("/dev/shm", os.W_OK) else tmp_path))
    try:
        yield where
    finally:
        subprocess.run(["rm", "-rf", "--", str(where)], check=True)


@pytest.mark.parametrize("depth", [1000, 2000])
def test_deep_directory_chain(scratch: Path, depth: int) -> None:
    """A legal chain of directories 1,000 and 2,000 deep (paths under 4096 bytes):
    resolved without recursion, with a bounded number of fds, and what a rename
    moves is no longer reached by its old path."""
    up = 100  # within the fds cached, so the rename leaves the last deep directory used as it is
    commands = [subvol()]
    commands += [mkdir(deep(i), 400 + i) for i in range(1, depth + 1)]
    commands += [mkfile(deep(depth) + b"/f", 300), write(deep(depth) + b"/f", b"deep\n")]
    moved = b"b/" + deep(depth - 1)  # a -> b: everything below is reached through b now
    commands += [rename(b"a", b"b"), mkfile(moved + b"/g", 301), write(moved + b"/g", b"moved\n")]
    # move the chain below depth 100 up to c: the last directory used is in it
    commands += [rename(b"b/" + deep(up - 1), b"c")]
    data, offsets = stream_of(*commands, mkfile(moved + b"/h", 302))
    with few_fds():
        with pytest.raises(ApplyError) as caught:
            extract(io.BytesIO(data), scratch)
        assert (caught.value.offset, caught.value.index, caught.value.command) == (offsets[-1], len(commands), "mkfile")
        assert "No such file or directory" in str(caught.value)
        lower = b"c/" + deep(depth - up)
        assert read_deep(scratch, lower + b"/f") == b"deep\n"
        assert read_deep(scratch, lower + b"/g") == b"moved\n"
        assert sorted(os.listdir(scratch)) == ["b", "c"]
        data, _ = stream_of(*commands, mkfile(lower + b"/h", 302), build("end"))
        dest = scratch / "again"
        dest.mkdir()
        report = extract(io.BytesIO(data), dest)
        assert report.applied == len(commands) + 2
        assert read_deep(dest, lower + b"/h") == b""


def cannot_reflink(where: Path) -> bool:
    """True when the file system of ``where`` refuses FICLONERANGE (clones are copied)."""
    import fcntl
    import struct

    from sendstream.extract.syscalls import FICLONERANGE

    a, b = where / ".reflink-probe-a", where / ".reflink-probe-b"
    a.write_bytes(b"r" * BLOCK)
    b.write_bytes(b"")
    try:
        with a.open("rb") as src, b.open("r+b") as dst:
            fcntl.ioctl(dst.fileno(), FICLONERANGE, struct.pack("<qQQQ", src.fileno(), 0, BLOCK, 0))
    except OSError:
        return True
    finally:
        a.unlink()
        b.unlink()
    return False


@pytest.fixture
def copy_dir(tmp_path: Path) -> Iterator[Path]:
    """A directory where clones are copies: tmp_path, else one in /dev/shm (tmpfs)."""
    if cannot_reflink(tmp_path):
        yield tmp_path
        return
    import tempfile

    shm = Path("/dev/shm")
    if not shm.is_dir() or not cannot_reflink(shm):
        pytest.skip("no directory here where the file system cannot reflink")
    where = Path(tempfile.mkdtemp(dir=shm))
    try:
        yield where
    finally:
        shutil.rmtree(where)


CHUNK = 64 << 10


def doubling(clones: int) -> tuple[bytes, list[int]]:
    """One 64 KiB WRITE, then CLONEs that each copy the whole file after itself."""
    commands = [subvol(), mkfile(b"f"), write(b"f", bytes(range(256)) * (CHUNK // 256))]
    for k in range(clones):
        size = CHUNK << k
        commands.append(
            build(
                "clone",
                ("file_offset", size),
                ("clone_len", size),
                ("path", b"f"),
                ("clone_uuid", UUID_SELF),
                ("clone_ctransid", 1),
                ("clone_path", b"f"),
                ("clone_offset", 0),
            )
        )
    return stream_of(*commands, build("end"))


def test_clone_copies_are_bounded(copy_dir: Path) -> None:
    """Without reflinks, 40 self-doubling CLONEs would ask for 64 KiB x 2**40: the copy
    budget stops the first clone that does not fit, before it writes anything."""
    from sendstream.errors import EXIT_LIMIT

    pattern = bytes(range(256)) * (CHUNK // 256)
    limit = 1 << 20  # the clones of 64, 128, 256 and 512 KiB fit (960 KiB); the 5th does not
    data, offsets = doubling(40)
    dest = copy_dir / "dest"
    dest.mkdir()
    with pytest.raises(LimitExceeded) as caught:
        extract(io.BytesIO(data), dest, max_clone_copy=limit)
    exc = caught.value
    assert (exc.offset, exc.index, exc.command, exc.limit) == (offsets[7], 7, "clone", limit)
    text = str(exc)
    assert text.startswith(f"offset {offsets[7]}, command #7 (clone): limit reached: ") and "--max-clone-copy" in text
    assert "would copy 1048576 bytes" in text and "983040 bytes already" in text, text
    assert (dest / "f").read_bytes() == pattern * 16  # nothing of the refused clone

    stream = copy_dir / "doubling.stream"
    stream.write_bytes(data)
    shutil.rmtree(dest)
    dest.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "sendstream", "extract", "--max-clone-copy", str(limit), str(stream), str(dest)],
        capture_output=True,
    )
    assert result.returncode == EXIT_LIMIT
    assert result.stderr == f"sendstream: error: {text}\n".encode()
    assert (dest / "f").read_bytes() == pattern * 16

    data, _ = doubling(4)  # the same clones under the limit: all copied
    shutil.rmtree(dest)
    dest.mkdir()
    report = extract(io.BytesIO(data), dest, max_clone_copy=limit)
    assert (dest / "f").read_bytes() == pattern * 16
    assert (report.copied_bytes, report.data_bytes) == (15 * CHUNK, 16 * CHUNK)


def test_clone_copy_budget_counts_data_not_holes(copy_dir: Path) -> None:
    """A sparse source costs only its data; a reflinked clone would cost nothing."""
    commands = [
        subvol(),
        mkfile(b"sparse", 257),
        write(b"sparse", b"d" * BLOCK, 1 << 30),
        mkfile(b"copy", 258),
        clone(b"copy", b"sparse", length=(1 << 30) + BLOCK),
        build("end"),
    ]
    data, _ = stream_of(*commands)
    report = extract(io.BytesIO(data), copy_dir, max_clone_copy=BLOCK)
    assert report.copied_bytes == BLOCK
    assert (copy_dir / "copy").stat().st_size == (1 << 30) + BLOCK


def test_a_copy_is_whole_or_fails(copy_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A clone copied where copy_file_range takes nothing (some file systems, for some files) is read and
    written instead, not cut short; a source that really ends early fails the command."""
    block = bytes(range(256)) * (BLOCK // 256)
    commands = [subvol(), mkfile(b"src", 257), write(b"src", block * 4), mkfile(b"dst", 258)]
    data, offsets = stream_of(*commands, clone(b"dst", b"src", length=4 * BLOCK), build("end"))
    whole, cut = copy_dir / "whole", copy_dir / "cut"
    whole.mkdir()
    cut.mkdir()
    monkeypatch.setattr(os, "copy_file_range", lambda *args: 0)
    extract(io.BytesIO(data), whole)
    assert (whole / "dst").read_bytes() == block * 4
    monkeypatch.setattr(os, "pread", lambda *args: b"")  # the source shrank under us
    with pytest.raises(ApplyError, match="clone: the source ended at offset 0, 16384 bytes early") as caught:
        extract(io.BytesIO(data), cut)
    assert caught.value.offset == offsets[4]


def test_a_write_the_file_takes_none_of_fails(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0

    def none_taken(fd: int, data: Any, offset: int) -> int:
        nonlocal calls
        calls += 1
        assert calls < 100, "pwrite_all spins on a write that takes nothing"
        return 0

    data, offsets = stream_of(subvol(), mkfile(b"f"), write(b"f", b"abc"), build("end"))
    monkeypatch.setattr(os, "pwrite", none_taken)
    with pytest.raises(ApplyError, match="write: the file took none of 3 bytes at offset 0") as caught:
        extract(io.BytesIO(data), tmp_path)
    assert caught.value.offset == offsets[2]


@contextlib.contextmanager
def small_fs(where: Path, kind: str, size: str) -> Iterator[Path]:
    """A small file system of ``kind`` (tmpfs, or ext4 in an image file) mounted at
    ``where``, unmounted afterwards; skips the test when it cannot be made."""
    if os.geteuid() != 0:
        pytest.skip(f"mounting a small {kind} needs root")
    where.mkdir()
    if kind == "tmpfs":
        command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)]
    else:
        image = where.parent / f"{where.name}.img"
        subprocess.run(["truncate", "-s", size, str(image)], check=True)
        made = subprocess.run([f"mkfs.{kind}", "-q", "-F", str(image)], capture_output=True)
        if made.returncode != 0:
            pytest.skip(f"cannot make a {kind}: {made.stderr.decode(errors='replace')}")
        command = ["mount", "-o", "loop", str(image), str(where)]
    mounted = subprocess.run(command, capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a {kind}: {mounted.stderr.decode(errors='replace')}")
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def test_clone_copy_must_fit_in_the_free_space(tmp_path: Path) -> None:
    """On a 1.5 MiB tmpfs, the doubling clones stop at the first that does not fit,
    with an error naming the sizes, before it writes anything."""
    with small_fs(tmp_path / "small", "tmpfs", "1536k") as small:
        data, offsets = doubling(40)
        with pytest.raises(ApplyError) as caught:
            extract(io.BytesIO(data), small)
        exc = caught.value
        assert (exc.offset, exc.index, exc.command, exc.errno) == (offsets[7], 7, "clone", errno.ENOSPC)
        assert "would copy 1048576 bytes of data" in str(exc) and "does not fit in the free space" in str(exc)
        assert (small / "f").stat().st_size == 16 * CHUNK


def test_fallocate_must_fit_in_the_free_space(tmp_path: Path) -> None:
    """ext4 keeps the blocks it allocated before ENOSPC: one FALLOCATE larger than the
    free space would leave the file system full. It is refused before."""
    with small_fs(tmp_path / "small", "ext4", "32M") as fs:
        small = fs / "dest"  # not the root, which holds lost+found
        small.mkdir()
        free = os.statvfs(small).f_bfree * os.statvfs(small).f_frsize
        allocate = build("fallocate", ("path", b"f"), ("fallocate_mode", 0), ("file_offset", 0), ("size", 64 << 20))
        data, offsets = stream_of(subvol(), mkfile(b"f"), allocate, build("end"))
        with pytest.raises(ApplyError) as caught:
            extract(io.BytesIO(data), small)
        exc = caught.value
        assert (exc.offset, exc.index, exc.command, exc.errno) == (offsets[2], 2, "fallocate", errno.ENOSPC)
        assert f"fallocate of {64 << 20} bytes does not fit in the free space" in str(exc)
        assert os.statvfs(small).f_bfree * os.statvfs(small).f_frsize > free - (1 << 20)
        assert (small / "f").stat().st_blocks == 0
        # what fits is allocated (KEEP_SIZE: the size stays)
        keep = build("fallocate", ("path", b"f"), ("fallocate_mode", 1), ("file_offset", 0), ("size", 1 << 20))
        data, _ = stream_of(subvol(b"again"), mkfile(b"f"), keep, build("end"))
        extract(io.BytesIO(data), small, per_subvolume=True)
        st = (small / "again" / "f").stat()
        assert (st.st_size, st.st_blocks * 512) == (0, 1 << 20)


def test_many_clone_sources_keep_few_fds(tmp_path: Path) -> None:
    """CLONEs from 20 clone sources, each file 10 directories deep: the sources kept
    open (with the directory fds each caches) are bounded, so 150 open files do."""
    clones = tmp_path / "clones"
    inner = "/".join(f"d{i}" for i in range(10))
    sources = [uuid.UUID(int=0x1000 + n) for n in range(20)]
    for n, source in enumerate(sources):
        (clones / str(source) / inner).mkdir(parents=True)
        (clones / str(source) / inner / "f").write_bytes(b"source %02d\n" % n)
    commands = [subvol()]
    for n, source in enumerate(sources * 2):
        target = b"t%02d" % n
        commands += [mkfile(target, 300 + n), clone(target, inner.encode() + b"/f", source, length=10)]
    data, _ = stream_of(*commands, build("end"))
    dest = tmp_path / "dest"
    dest.mkdir()
    with few_fds(150):
        extract(io.BytesIO(data), dest, clone_dirs=[clones])
    for n in range(40):
        assert (dest / f"t{n:02d}").read_bytes() == b"source %02d\n" % (n % 20)


def test_skips_are_counted_and_a_few_kept(tmp_path: Path) -> None:
    """200,000 CRC-valid unknown commands and 100 kinds of FILEATTR: the report keeps the
    first few skips of each kind (at most SKIP_GROUPS_MAX kinds, then one group of the
    others), counts every one, and the CLI says so in one line per group."""
    from sendstream.extract.report import SKIP_GROUPS_MAX, SKIPS_KEPT

    unknown = 200_000
    kinds = 100
    fileattrs = [build("fileattr", ("path", b"f"), ("fileattr", n)) for n in range(kinds)]
    head, _ = stream_of(subvol(), mkfile(b"f"))
    zero = encode_command(Command(0, []), 2)  # "command 0": 10 bytes, CRC-valid
    tail, _ = stream_of(*fileattrs, build("end"))
    data = head + zero * unknown + tail[17:]
    seen: list[object] = []
    report = extract(io.BytesIO(data), tmp_path, on_skip=seen.append)
    assert len(seen) == report.skip_count == unknown + kinds
    groups = report.skip_groups()
    assert [g.count for g in groups] == [unknown] + [1] * (SKIP_GROUPS_MAX - 1) + [kinds - SKIP_GROUPS_MAX + 1]
    assert [g.other for g in groups] == [False] * SKIP_GROUPS_MAX + [True]
    assert len(report.skipped) == SKIPS_KEPT + (SKIP_GROUPS_MAX - 1) + SKIPS_KEPT
    first = groups[0].kept[0]
    assert (first.offset, first.index, first.command) == (len(head), 2, "unknown(0)")
    last, other = groups[-2:]  # fileattr 0x3e is the 64th kind, the first of the others 0x3f
    assert [g.kept[0].reason for g in (last, other)] == [
        f"fileattr 0x{n:x}: ignored, as btrfs receive 6.2 does" for n in (62, 63)
    ]
    (stream,) = report.statistics.streams
    assert stream.commands["unknown"].count == unknown and len(stream.commands) == 5

    path = tmp_path.parent / f"{tmp_path.name}.stream"
    path.write_bytes(data)
    dest = tmp_path.parent / f"{tmp_path.name}-cli"
    dest.mkdir()
    result = subprocess.run([sys.executable, "-m", "sendstream", "extract", str(path), str(dest)], capture_output=True)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = result.stderr.decode().splitlines()
    skips = [line for line in lines if line.startswith("sendstream: warning: skipped: ")]
    assert len(skips) == SKIP_GROUPS_MAX + 1
    assert skips[0] == (
        f"sendstream: warning: skipped: offset {len(head)}, command #2 (unknown(0)), path '': unknown command "
        f"number 0: ignored, as btrfs receive does (and {unknown - 1} more like it)"
    )
    assert skips[1].endswith("path 'f': fileattr 0x0: ignored, as btrfs receive 6.2 does")
    assert skips[-1].endswith(
        f"fileattr 0x3f: ignored, as btrfs receive 6.2 does (and {kinds - SKIP_GROUPS_MAX} more of other kinds)"
    )
    summary = f"{kinds + 3} commands applied, 0 bytes of file data written or cloned, {unknown + kinds} skipped"
    assert lines[-1].endswith(summary)


def concatenated(version: int, out: Path) -> Path:
    """rich-full then rich-incr (its incremental) in one file, as `btrfs send -p` writes them."""
    out.write_bytes(b"".join((FIXTURES / f"rich-{k}-v{version}.stream").read_bytes() for k in ("full", "incr")))
    return out


def rich_parent_uuid() -> uuid.UUID:
    return first(FIXTURES / "rich-incr-v2.stream", "snapshot").get("clone_uuid")


@pytest.mark.parametrize("version", [1, 2])
def test_full_and_incremental_in_one_file(tmp_path: Path, version: int) -> None:
    """--per-subvolume: the incremental becomes DIR/rich_incr, made from a copy of
    DIR/rich_base extracted just before, which stays as it was; the same trees as the
    full stream extracted into one directory and the incremental applied onto it."""
    both = concatenated(version, tmp_path / "both.stream")
    into = tmp_path / "per-subvolume"
    into.mkdir()
    with both.open("rb") as f:
        report = extract(f, into, per_subvolume=True)
    assert [(s.kind, s.path, s.directory) for s in report.subvolumes] == [
        ("subvol", b"rich_base", str(into / "rich_base")),
        ("snapshot", b"rich_incr", str(into / "rich_incr")),
    ]
    assert report.subvolumes[1].parent_uuid == report.subvolumes[0].uuid == rich_parent_uuid()
    in_place, parent = tmp_path / "in-place", tmp_path / "parent"
    for where, kinds in ((in_place, ("full", "incr")), (parent, ("full",))):
        where.mkdir()
        for kind in kinds:
            with (FIXTURES / f"rich-{kind}-v{version}.stream").open("rb") as f:
                extract(f, where)
    assert differences(in_place, into / "rich_incr") == []
    assert differences(parent, into / "rich_base") == []  # the parent is untouched
    assert differences(parent, in_place) != []  # (the incremental does change things)
    if cannot_reflink(tmp_path):
        assert report.copied_bytes > 0


def test_copy_of_the_parent_counts_against_the_copy_budget(copy_dir: Path) -> None:
    both = concatenated(2, copy_dir / "both.stream")
    with both.open("rb") as f:
        snapshot_at = next(c for c in file_events(f) if isinstance(c, Command) and c.name == "snapshot")
        offset, index = snapshot_at.offset, snapshot_at.index
    alone = copy_dir / "full"
    alone.mkdir()
    with (FIXTURES / "rich-full-v2.stream").open("rb") as f:
        clones = extract(f, alone).copied_bytes  # what the full stream's own CLONEs copy
    into = copy_dir / "dest"
    into.mkdir()
    with both.open("rb") as f, pytest.raises(LimitExceeded) as caught:
        extract(f, into, per_subvolume=True, max_clone_copy=clones + 1000)
    assert (caught.value.offset, caught.value.index, caught.value.command) == (offset, index, "snapshot")
    assert f"the copy of the parent {rich_parent_uuid()}" in str(caught.value)
    assert os.listdir(into) == ["rich_base"]  # nothing of the snapshot


def test_incremental_whose_parent_is_missing(tmp_path: Path) -> None:
    """Without its parent, the SNAPSHOT of --per-subvolume names the parent's UUID and how
    to give it (exit 2, no traceback); given with --clone-from, it is copied and only read:
    no ctime of it moves (fuzz corpus extract/crash-per-subvolume-copy-of-clone-from-parent-moves-link-ctime)."""
    parent_uuid = rich_parent_uuid()
    incr = FIXTURES / "rich-incr-v2.stream"
    into = tmp_path / "dest"
    into.mkdir()
    result = subprocess.run(
        [sys.executable, "-m", "sendstream", "extract", "--per-subvolume", str(incr), str(into)], capture_output=True
    )
    assert result.returncode == 2
    message = result.stderr.decode()
    assert message.startswith("sendstream: error: offset 17, command #0 (snapshot), path 'rich_incr': ")
    assert f"the parent {parent_uuid} of the incremental stream of 'rich_incr'" in message
    assert f"--clone-from {parent_uuid}=DIR" in message and message.count("\n") == 1
    assert os.listdir(into) == []

    parent, in_place = tmp_path / "clones" / str(parent_uuid), tmp_path / "in-place"
    for where, streams in ((parent, ("full",)), (in_place, ("full", "incr"))):
        where.mkdir(parents=True)
        for kind in streams:
            with (FIXTURES / f"rich-{kind}-v2.stream").open("rb") as f:
                extract(f, where)
    before, changed = tree_state(parent), ctimes(parent)
    for option in (f"{parent_uuid}={parent}", str(tmp_path / "clones")):
        shutil.rmtree(into)
        into.mkdir()
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "sendstream",
                "extract",
                "-q",
                "--per-subvolume",
                "--clone-from",
                option,
                incr,
                into,
            ],
            capture_output=True,
        )
        assert result.returncode == 0, result.stderr
        assert differences(in_place, into / "rich_incr") == [], option
        # read, never written: no ctime moves (putting back the atime that reading a
        # symlink moves would be a write); all else as it was
        assert ctimes(parent) == changed
        assert without_link_atimes(tree_state(parent)) == without_link_atimes(before)
        for rel, entry in before[0].items():  # the next option copies a parent as extracted
            if "target" in entry:
                path = os.path.join(os.fsencode(parent), rel)
                os.utime(path, ns=(entry["atime"], entry["mtime"]), follow_symlinks=False)
        changed = ctimes(parent)


def test_snapshots_and_clones_read_the_untouched_parent(tmp_path: Path) -> None:
    """Two incrementals of one parent in one input: each starts from the parent as it
    was, and a CLONE from the parent reads it, not the changed copy."""
    parent_id, first_id, second_id = (uuid.UUID(int=n) for n in (1, 2, 3))

    def snapshot(name: bytes, own: uuid.UUID) -> Command:
        return build(
            "snapshot", ("path", name), ("uuid", own), ("ctransid", 2), ("clone_uuid", parent_id), ("clone_ctransid", 1)
        )

    full, _ = stream_of(
        build("subvol", ("path", b"base"), ("uuid", parent_id), ("ctransid", 1)),
        mkfile(b"f"),
        write(b"f", b"original"),
        build("end"),
    )
    first_incr, _ = stream_of(
        snapshot(b"one", first_id),
        write(b"f", b"CHANGED!"),
        mkfile(b"g"),
        clone(b"g", b"f", parent_id, length=8),
        build("end"),
    )
    second_incr, _ = stream_of(snapshot(b"two", second_id), mkfile(b"h"), build("end"))
    report = extract(io.BytesIO(full + first_incr + second_incr), tmp_path, per_subvolume=True)
    assert [s.directory for s in report.subvolumes] == [str(tmp_path / n) for n in ("base", "one", "two")]
    assert (tmp_path / "base" / "f").read_bytes() == b"original"
    assert os.listdir(tmp_path / "base") == ["f"]
    assert (tmp_path / "one" / "f").read_bytes() == b"CHANGED!"
    assert (tmp_path / "one" / "g").read_bytes() == b"original"
    assert (tmp_path / "two" / "f").read_bytes() == b"original"
    assert sorted(os.listdir(tmp_path / "two")) == ["f", "h"]


def test_deep_parent_is_copied(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The copy of a parent 2,000 directories deep: no recursion, few fds, and a walk
    back up that does not reopen the whole chain for each directory."""
    depth = 2000
    chain = [mkdir(deep(i), 400 + i) for i in range(1, depth + 1)]
    full, _ = stream_of(subvol(b"base"), *chain, mkfile(deep(depth) + b"/f"), write(deep(depth) + b"/f"), build("end"))
    snapshot = build(
        "snapshot",
        ("path", b"next"),
        ("uuid", UUID_OTHER),
        ("ctransid", 2),
        ("clone_uuid", UUID_SELF),
        ("clone_ctransid", 1),
    )
    incr, _ = stream_of(snapshot, mkfile(deep(depth) + b"/g", 301), build("end"))
    opened = 0
    real_open = os.open

    def counted(*args: Any, **kwargs: Any) -> int:
        nonlocal opened
        opened += 1
        return real_open(*args, **kwargs)

    monkeypatch.setattr(os, "open", counted)
    with few_fds():
        extract(io.BytesIO(full + incr), scratch, per_subvolume=True)
    monkeypatch.undo()
    assert read_deep(scratch / "next", deep(depth) + b"/f") == b"pwned\n"
    assert read_deep(scratch / "next", deep(depth) + b"/g") == b""
    with pytest.raises(FileNotFoundError):
        read_deep(scratch / "base", deep(depth) + b"/g")
    # reopening the chain from the top for each directory would be about depth**2 = 4 million
    assert opened < 100 * depth, opened


@pytest.mark.btrfs
def test_full_and_incremental_in_one_file_against_btrfs_receive(fs: Path, tmp_path: Path) -> None:
    """On btrfs the parent is reflinked, and both trees are those of `btrfs receive`."""
    both = concatenated(2, tmp_path / "both.stream")
    ours = fs / "per-subvolume"
    ours.mkdir()
    try:
        with receive_dir(fs, "both") as where:
            sh("btrfs", "receive", "-q", "-f", both, where)
            with both.open("rb") as f:
                report = extract(f, ours, per_subvolume=True)
            for name in ("rich_base", "rich_incr"):
                assert differences(where / name, ours / name) == []
        assert report.copied_bytes == 0
    finally:
        shutil.rmtree(ours)
