"""Conversion to v1 of the fixtures, and crafted streams with holes, for the downgrade's tests."""

from __future__ import annotations

import uuid
from pathlib import Path

from sendstream import Command, Encoder, encode_command
from sendstream.codec.backend import Backend
from sendstream.codec.framer import Framer
from sendstream.io.windows import file_events
from sendstream.ops.downgrade import ParentTree, downgrade
from support.streams import FIXTURES, crafted

V2_STREAMS = ["compressed-v2", "rich-full-v2", "rich-incr-v2"]
PARENT = {"rich-incr-v2": "rich-full-v2"}


def to_v1(src: Path, out: Path, backend: Backend) -> list[str]:
    """Convert, the fixture's parent (if any) giving the sizes of its files."""
    warnings: list[str] = []
    encoder = Encoder()
    parent = None
    if src.stem in PARENT:
        parent = ParentTree()
        with (FIXTURES / f"{PARENT[src.stem]}.stream").open("rb") as f:
            for event in file_events(f, Framer(backend=backend)):
                if isinstance(event, Command):
                    parent.feed(event)
    with src.open("rb") as f, out.open("wb") as o:
        for event in downgrade(file_events(f, Framer(backend=backend)), warnings.append, parent=parent):
            o.write(encoder.send(event))
    return warnings


def hole_stream(*commands: Command) -> bytes:
    head = Command.build("subvol", [("path", b"s"), ("uuid", uuid.UUID(int=1)), ("ctransid", 1)])
    return crafted(2, *(encode_command(c, 2) for c in (head, *commands)))


def fallocate(path: bytes, mode: int, offset: int, size: int) -> Command:
    return Command.build(
        "fallocate", [("path", path), ("fallocate_mode", mode), ("file_offset", offset), ("size", size)]
    )
