"""ls, diff, paths and stats on crafted streams: bounded memory, limits, and the same answer native and pure."""

from __future__ import annotations

import io
import json
import tracemalloc
from pathlib import Path

import pytest
from support.commands import build, encoded, snapshot, subvol
from support.streams import STREAMS, crafted, stream_ids

from sendstream import Command, encode_command
from sendstream.analysis.changes import changes
from sendstream.analysis.paths import NAME_UNIT, PathTracker
from sendstream.analysis.resolve import PathResolver, resolve
from sendstream.analysis.statistics import MAX_STREAMS, Statistics
from sendstream.errors import LimitExceeded
from sendstream.format.layout import COMMANDS
from sendstream.io.windows import file_events
from sendstream.render.changes import diff_json, diff_json_pieces, json_line, ls_json, ls_json_pieces
from sendstream.render.paths import statistics_lines

# --- 1. prefixes are shared -------------------------------------------------------


def test_a_deep_path_costs_each_name_once() -> None:
    """One legal CHMOD of 32,767 components used to store the whole origin path on every
    made-up ancestor (1 GB for this one path); each name now keeps its parent and name."""
    deep = b"/".join([b"a"] * 32767)
    tracker = PathTracker(max_names=10**6)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        touched = tracker.feed(build("chmod", ("path", deep), ("mode", 0o600)))
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert touched is not None and tracker.names == 32768
    assert used / 32767 < 250, used / 32767
    leaf = touched.entry
    assert leaf.origin == leaf.final_path() == deep and not leaf.moved
    middle = tracker.entries[1000]
    assert middle.origin == b"/".join([b"a"] * 1000)


def test_origin_and_moved_through_renames() -> None:
    tracker = PathTracker()
    tracker.feed(snapshot())
    touched = tracker.feed(build("chmod", ("path", b"d/e/f"), ("mode", 0)))
    assert touched is not None
    f = touched.entry
    tracker.feed(build("rename", ("path", b"d"), ("path_to", b"x")))
    assert (f.origin, f.path(), f.moved) == (b"d/e/f", b"x/e/f", False)
    d = tracker.lookup(b"x")
    assert (d.origin, d.moved) == (b"d", True)
    tracker.feed(build("rename", ("path", b"x/e/f"), ("path_to", b"g")))
    assert (f.origin, f.path(), f.moved) == (b"d/e/f", b"g", True)
    # a name made up under a moved directory was there before: its origin is under the old place
    assert tracker.lookup(b"x/e/new").origin == b"d/e/new"


# --- 2. limits ---------------------------------------------------------------------


def test_max_names_counts_made_up_ancestors_and_long_names() -> None:
    tracker = PathTracker(max_names=6)
    tracker.feed(subvol())
    tracker.feed(build("chmod", ("path", b"a/b/c"), ("mode", 0)))  # root, a, b, c
    assert tracker.names == 4
    tracker.feed(build("chmod", ("path", b"n" * NAME_UNIT), ("mode", 0)))  # one name's worth
    assert tracker.names == 5
    cmd = build("chmod", ("path", b"n" * (NAME_UNIT + 1)), ("mode", 0))  # two
    cmd.offset, cmd.index = 1234, 7
    with pytest.raises(LimitExceeded) as info:
        tracker.feed(cmd)
    error = info.value
    assert (error.offset, error.index, error.command, error.limit, error.option) == (1234, 7, "chmod", 6, "--max-names")
    assert "--max-names raises it" in str(error) and error.exit_code == 8
    # a new subvolume starts the count again
    tracker.feed(subvol(b"t"))
    assert tracker.names == 1


def test_paths_records_are_compact() -> None:
    """Each held command costs 46 bytes and the part of its path that differs from the
    command before: 20,000 WRITEs to one file keep its name once."""
    name = b"dir/" + b"f" * 200
    resolver = PathResolver()
    assert list(resolver.feed(subvol())) != []
    resolver.feed(build("mkfile", ("path", name), ("ino", 257)))
    list(resolver.feed(build("mkfile", ("path", name), ("ino", 257))))
    held = resolver.held
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(20000):
            list(resolver.feed(build("write", ("path", name), ("file_offset", i), ("data", b"x"))))
        used = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert resolver.held - held == 20000 * 46
    assert used / 20000 < 60, used / 20000
    records = list(resolver.feed(build("rename", ("path", b"dir"), ("path_to", b"moved"))))
    records += list(resolver.feed(build("end")))
    assert [r.command for r in records[-3:]] == ["write", "rename", "end"]
    assert records[-3].path == name and records[-3].final == b"moved/" + b"f" * 200
    assert (records[-2].other_path, records[-2].other_final) == (b"moved", b"moved")


def test_a_command_without_a_path_is_not_held() -> None:
    """Unknown commands need no final path: each comes out at once (10-byte records of
    zeros used to cost a record each until END)."""
    data = crafted(2, encoded("chmod", ("path", b"f"), ("mode", 0)), bytes(10 * 1000))
    resolver = PathResolver()
    out = []
    with io.BytesIO(data) as f:
        for event in file_events(f):
            ready = list(resolver.feed(event))
            if isinstance(event, Command) and event.name == "unknown(0)":
                assert [(r.index, r.command, r.path) for r in ready] == [(event.index, "unknown(0)", None)]
            out += ready
    assert resolver.held == 0
    assert [r.command for r in out][-2:] == ["chmod", "end"] and len(out) == 1002


# --- 3. no state from before a SUBVOL; native and pure agree --------------------------


# --- 4. MKNOD's u64 mode ----------------------------------------------------------------


# --- stats ---------------------------------------------------------------------------------


def test_statistics_are_bounded_by_kinds_and_streams() -> None:
    unknown = b"".join(encode_command(Command(n, None, payload=b""), 2) for n in range(30, 300))
    one = crafted(2, encode_command(subvol(), 2), unknown)
    statistics = Statistics()
    with io.BytesIO(one * (MAX_STREAMS + 5)) as f:
        for event in file_events(f):
            statistics.feed(event)
    assert len(statistics.streams) == MAX_STREAMS and statistics.rest is not None
    assert statistics.rest.streams == 5 and statistics.rest.offset == MAX_STREAMS * len(one)
    assert all(len(s.commands) <= len(COMMANDS) + 1 for s in statistics.all())
    assert statistics.streams[0].commands["unknown"].count == 270
    assert statistics.rest.commands["unknown"].count == 5 * 270
    lines = statistics_lines(statistics)
    assert f"streams {MAX_STREAMS + 1} to {MAX_STREAMS + 5} from offset {MAX_STREAMS * len(one)}, version 2:" in lines


# --- the output streams, and says the same -------------------------------------------------


@pytest.mark.parametrize("stream", STREAMS, ids=stream_ids)
def test_json_in_pieces_is_the_same_json(stream: Path) -> None:
    with stream.open("rb") as f:
        for result in changes(file_events(f)):
            assert b"".join(ls_json_pieces(result)) == json_line(ls_json(result))
            assert b"".join(diff_json_pieces(result)) == json_line(diff_json(result))
            json.loads(b"".join(ls_json_pieces(result)))


def test_a_transient_name_shows_where_it_was_removed() -> None:
    """A file made and replaced within the stream: its last place, now built from its parent."""
    commands = [
        subvol(),
        build("mkdir", ("path", b"o260-1-0"), ("ino", 260)),
        build("mkfile", ("path", b"o260-1-0/tmp"), ("ino", 261)),
        build("mkfile", ("path", b"o262-1-0"), ("ino", 262)),
        build("rename", ("path", b"o262-1-0"), ("path_to", b"o260-1-0/tmp")),  # replaces it
        build("rename", ("path", b"o260-1-0"), ("path_to", b"dir")),
        build("end"),
    ]
    (result,) = changes(commands)
    assert [(c.action, c.path, c.old_path) for c in result.changes] == [
        ("created", b"dir", None),
        ("created", b"dir/tmp", None),
        ("transient", None, b"dir/tmp"),
    ]
    records = list(resolve(commands))
    assert records[2].final is None and records[3].final == b"dir/tmp"
