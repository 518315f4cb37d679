"""Our dump against btrfs-progs 6.2 `btrfs receive --dump`, and JSON lines."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.btrfs import first_stream_as_6_2, need_btrfs_progs, utc
from support.streams import BTRFS_READABLE, STREAMS, command_bytes, crafted, stream_ids, u64

from sendstream import Command, encode_stream_header
from sendstream.io.windows import iter_events
from sendstream.render.dump import TextDumper, escape, format_time

ZONES = ["UTC", "America/New_York", "Asia/Kolkata", "Australia/Lord_Howe"]


def our_dump(path: Path, tz: str, *args: str) -> bytes:
    env = dict(os.environ, TZ=tz)
    return subprocess.run(
        [sys.executable, "-m", "sendstream", "dump", *args, str(path)], env=env, check=True, capture_output=True
    ).stdout


@pytest.mark.parametrize("path", BTRFS_READABLE, ids=stream_ids)
def test_stored_btrfs_dump_matches(path: Path) -> None:
    with utc():
        assert first_stream_as_6_2(path) == path.with_suffix(".dump").read_bytes()


@pytest.mark.parametrize("tz", ZONES)
@pytest.mark.parametrize("path", BTRFS_READABLE, ids=stream_ids)
def test_live_btrfs_receive_dump_matches(path: Path, tz: str) -> None:
    """The CLI's default text equals btrfs's but for the two deliberate differences."""
    need_btrfs_progs()
    theirs = subprocess.run(
        ["btrfs", "receive", "--dump"],
        stdin=path.open("rb"),
        env=dict(os.environ, TZ=tz),
        capture_output=True,
        check=True,
    ).stdout
    ours = our_dump(path, tz)
    with path.open("rb") as f:
        events = list(iter_events(f))
    first_end = next(i for i, ev in enumerate(events) if isinstance(ev, Command) and ev.name == "end")
    later_streams = [ev for ev in events[first_end + 1 :] if isinstance(ev, Command) and ev.name != "end"]
    our_lines = ours.splitlines(keepends=True)
    first_lines = our_lines[: len(our_lines) - len(later_streams)]
    # btrfs prints xattr data raw, cut at NUL: compare those lines in that form
    xattrs = [ev for ev in events[:first_end] if isinstance(ev, Command) and ev.name == "set_xattr"]
    raw = iter(xattrs)
    fixed = []
    for line in first_lines:
        if line.startswith(b"set_xattr "):
            ev = next(raw)
            data = bytes(ev.get("xattr_data"))
            line = line.replace(b" data=" + escape(data) + b" len=", b" data=" + data.split(b"\0")[0] + b" len=")
        fixed.append(line)
    assert b"".join(fixed) == theirs
    assert len(our_lines) == sum(1 for ev in events if isinstance(ev, Command) and ev.name != "end")


def test_every_stream_of_a_concatenated_file_is_dumped() -> None:
    path = next(p for p in STREAMS if p.stem.startswith("two-concat"))
    lines = our_dump(path, "UTC").splitlines()
    subvols = [line for line in lines if line.startswith((b"subvol ", b"snapshot "))]
    assert len(subvols) == 2
    assert len(path.with_suffix(".dump").read_bytes().splitlines()) < len(lines)


def test_xattr_data_is_escaped_not_raw() -> None:
    cmd = Command.build("set_xattr", [("path", b"f"), ("xattr_name", b"user.x"), ("xattr_data", b"\0A\nB \\")])
    assert TextDumper().line(cmd) == (
        b"set_xattr       ./f                             name=user.x data=\\000A\\nB\\ \\\\ len=6\n"
    )
    assert TextDumper(raw_xattr_data=True).line(cmd) == (
        b"set_xattr       ./f                             name=user.x data= len=6\n"
    )


def test_escape_follows_btrfs_progs() -> None:
    assert escape(b"plain-name.txt") == b"plain-name.txt"
    assert escape(b"a b\\c\n\t\x07\x08\x1b\x0c\r\x0b") == b"a\\ b\\\\c\\n\\t\\a\\b\\e\\f\\r\\v"
    assert escape(b"caf\xe9\x7f\x01") == b"caf\\351\\177\\001"


def test_long_paths_get_one_space_and_times_honour_tz() -> None:
    cmd = Command.build("truncate", [("path", b"x" * 40), ("size", 5)])
    assert TextDumper().line(cmd) == b"truncate        ./" + b"x" * 40 + b" size=5\n"
    assert format_time(0).endswith((b"+0000", b"-0500", b"+0530", b"+1030", b"-0400", b"+1100"))


def test_json_lines_are_typed_and_lossless(stream_path: Path) -> None:
    out = our_dump(stream_path, "UTC", "--json")
    with stream_path.open("rb") as f:
        commands = [ev for ev in iter_events(f) if isinstance(ev, Command)]
    objects = [json.loads(line) for line in out.splitlines()]
    assert len(objects) == len(commands)
    for obj, cmd in zip(objects, commands, strict=True):
        assert (obj["offset"], obj["index"], obj["command"]) == (cmd.offset, cmd.index, cmd.name)
        for name, value in cmd.values().items():
            shown = obj["attributes"][name]
            if name == "data":
                raw = bytes(value)
                assert shown == {"len": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
            elif isinstance(value, bytes | memoryview):
                raw = bytes(value)
                back = base64.b64decode(shown["base64"]) if isinstance(shown, dict) else shown.encode()
                assert back == raw
            elif name.endswith("time"):
                assert shown == {"sec": value.sec, "nsec": value.nsec}
            elif name.endswith("uuid"):
                assert shown == str(value)
            else:
                assert shown == value


def test_json_keeps_non_utf8_names(tmp_path: Path) -> None:
    path = tmp_path / "latin1.stream"
    path.write_bytes(crafted(1, command_bytes(11, [(15, b"caf\xe9")], 1)))
    first = json.loads(our_dump(path, "UTC", "--json").splitlines()[0])
    assert first["attributes"]["path"] == {"base64": base64.b64encode(b"caf\xe9").decode()}


def test_json_after_a_restart_reads_attributes_as_the_restarted_version(tmp_path: Path) -> None:
    """A v2 header, then a restart into a v1 stream: attribute 26 (FILEATTR, a u64 from v2
    on) is unknown to v1 and shown raw. It was decoded with the first header's version (a
    struct.error traceback); fuzz corpus dump/crash-json-restart-into-v1-stale-version."""
    path = tmp_path / "restarted.stream"
    mkfile = command_bytes(3, [(15, b"f"), (3, u64(257)), (26, b"\1\0")], 1)
    path.write_bytes(encode_stream_header(2) + crafted(1, mkfile))
    run = subprocess.run([sys.executable, "-m", "sendstream", "dump", "--json", str(path)], capture_output=True)
    assert b"Traceback" not in run.stderr
    assert b"restarted send" in run.stderr
    first = json.loads(run.stdout.splitlines()[0])
    assert (first["version"], first["command"]) == (1, "mkfile")
    assert first["attributes"] == {"path": "f", "ino": 257, "unknown(26)": {"base64": "AQA="}}
