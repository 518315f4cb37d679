"""v1 conversion: a hole punched with KEEP_SIZE becomes zeros only up to the file's size at that
point of the stream, a size followed through the commands or taken from the parent, never guessed."""

from __future__ import annotations

import uuid

import pytest

from sendstream import Command, StreamHeader
from sendstream.errors import DowngradeError
from sendstream.ops.downgrade import Downgrader, ParentTree


def fallocate(path: bytes, offset: int, size: int, mode: int = 3) -> Command:
    return Command.build(
        "fallocate", [("path", path), ("fallocate_mode", mode), ("file_offset", offset), ("size", size)]
    )


def snapshot() -> Command:
    return Command.build("snapshot", [("path", b"B"), ("uuid", uuid.UUID(int=1)), ("ctransid", 8),
                                      ("clone_uuid", uuid.UUID(int=2)), ("clone_ctransid", 7)])  # fmt: skip


def zeros(d: Downgrader, command: Command) -> list[tuple[int, int]]:
    """The WRITEs of zeros ``command`` becomes: (offset, length) each."""
    out = d.send(command)
    assert all(c.name == "write" and not any(c.get("data")) for c in out)
    return [(int(c.get("file_offset")), len(c.get("data"))) for c in out]


def incremental(parent: dict[bytes, int] | ParentTree | None = None) -> Downgrader:
    d = Downgrader(parent=parent.get if isinstance(parent, dict) else parent)
    d.send(StreamHeader(0, 2))
    d.send(snapshot())
    return d


def test_a_punch_in_a_file_of_the_parent_stops_at_its_size_there() -> None:
    """The kernel's incremental: FALLOCATE mode=3 offset=0 len=4096 on a 1,360-byte file of the
    parent, no TRUNCATE; zeros past 1,360 made btrfs receive grow the file to 4,096."""
    assert zeros(incremental({b"f": 1360}), fallocate(b"f", 0, 4096)) == [(0, 1360)]


def test_without_the_parent_the_punch_is_refused_naming_the_option() -> None:
    d = incremental()
    with pytest.raises(DowngradeError, match="give the parent with --parent") as caught:
        d.send(fallocate(b"dir/f", 0, 4096))
    assert caught.value.command == "fallocate"
    assert "dir/f" in str(caught.value)
    # a parent that has no such file is no answer either
    with pytest.raises(DowngradeError, match="no regular file at dir/f"):
        incremental({}).send(fallocate(b"dir/f", 0, 4096))


def test_the_size_follows_the_file_through_the_stream() -> None:
    """What came before the punch counts: a WRITE past the parent's size, a rename of the
    file's directory (the parent's path is the one asked), a TRUNCATE, a CLONE, a hard link."""
    asked: list[bytes] = []

    def parent(path: bytes) -> int | None:
        asked.append(path)
        return {b"d/f": 1000, b"g": 10}.get(path)

    d = incremental(parent)  # type: ignore[arg-type]
    d.send(Command.build("rename", [("path", b"d"), ("path_to", b"e")]))
    d.send(Command.build("write", [("path", b"e/f"), ("file_offset", 1500), ("data", b"x" * 100)]))
    assert asked == [b"d/f"]  # taken once, before the write, from where the file was in the parent
    assert zeros(d, fallocate(b"e/f", 0, 1 << 20)) == [(0, 1600)]
    d.send(Command.build("truncate", [("path", b"e/f"), ("size", 300)]))
    assert zeros(d, fallocate(b"e/f", 200, 4096)) == [(200, 100)]
    d.send(Command.build("link", [("path", b"h"), ("path_link", b"e/f")]))
    assert zeros(d, fallocate(b"h", 0, 4096)) == [(0, 300)]
    clone = [("path", b"g"), ("file_offset", 50), ("clone_len", 4000), ("clone_uuid", uuid.UUID(int=1)),
             ("clone_ctransid", 8), ("clone_path", b"h"), ("clone_offset", 0)]  # fmt: skip
    d.send(Command.build("clone", clone))
    assert zeros(d, fallocate(b"g", 0, 8192)) == [(0, 4050)]
    # zeroing without KEEP_SIZE grows the file; a later punch sees the new size
    assert zeros(d, fallocate(b"g", 5000, 1000, mode=0x10)) == [(5000, 1000)]
    assert zeros(d, fallocate(b"g", 0, 8192)) == [(0, 6000)]
    # a file the stream made needs no parent
    d.send(Command.build("unlink", [("path", b"g")]))
    d.send(Command.build("mkfile", [("path", b"g"), ("ino", 300)]))
    assert zeros(d, fallocate(b"g", 0, 8192)) == []


def test_the_parent_from_its_streams() -> None:
    """A full stream and an incremental on top, fed in order, give the parent's sizes at their end."""
    tree = ParentTree()
    for command in (
        Command.build("subvol", [("path", b"A"), ("uuid", uuid.UUID(int=2)), ("ctransid", 7)]),
        Command.build("mkdir", [("path", b"o257-7-0"), ("ino", 257)]),
        Command.build("rename", [("path", b"o257-7-0"), ("path_to", b"d")]),
        Command.build("mkfile", [("path", b"d/f"), ("ino", 258)]),
        Command.build("write", [("path", b"d/f"), ("file_offset", 0), ("data", b"y" * 1360)]),
        Command.build("mkfile", [("path", b"gone"), ("ino", 259)]),
        Command.build("end", []),
        snapshot(),
        Command.build("rename", [("path", b"d"), ("path_to", b"e")]),
        Command.build("unlink", [("path", b"gone")]),
        Command.build("end", []),
    ):
        tree.feed(command)
    assert (tree(b"e/f"), tree(b"d/f"), tree(b"gone"), tree(b"e"), tree(b"")) == (1360, None, None, None, None)
    assert zeros(incremental(tree), fallocate(b"e/f", 0, 4096)) == [(0, 1360)]


def test_a_new_name_of_a_file_of_the_parent_asks_the_parent_by_its_old_name() -> None:
    """A LINK the stream makes to a file of the parent has no path in the parent; the size is
    asked by the name the file had there."""
    d = incremental({b"f": 700})
    d.send(Command.build("link", [("path", b"g"), ("path_link", b"f")]))
    assert zeros(d, fallocate(b"g", 0, 4096)) == [(0, 700)]
