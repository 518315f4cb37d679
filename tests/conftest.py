"""Shared helpers: the fixture corpus, feeding helpers, crafted streams."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import struct
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sendstream import Command, Decoder, EndOfInput, NeedData, StreamHeader, encode_command, encode_stream_header
from sendstream.codec.events import Restart
from sendstream.io.windows import iter_events
from sendstream.render.dump import TextDumper

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
from loopfs import btrfs_loop, require_btrfs

__all__ = ["btrfs_loop"]

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "fixtures"
STREAMS = sorted(FIXTURES.glob("*.stream"))
# Streams that btrfs-progs 6.2 can read (it rejects v3).
BTRFS_READABLE = [p for p in STREAMS if p.read_bytes()[13] < 3]


def stream_ids(p: Path) -> str:
    return p.stem


@pytest.fixture(params=STREAMS, ids=stream_ids)
def stream_path(request: pytest.FixtureRequest) -> Path:
    return request.param  # type: ignore[no-any-return]


def canon(event: Any) -> tuple[Any, ...]:
    """A comparable form of an event (memoryviews turned into bytes)."""
    if isinstance(event, Command):
        attrs = None if event.attributes is None else tuple((t, bytes(v)) for t, v in event.attributes)
        return ("cmd", event.offset, event.index, event.cmd, event.crc, attrs, bytes(event.payload or b""))
    if isinstance(event, StreamHeader):
        return ("hdr", event.offset, event.version)
    if isinstance(event, Restart):
        return ("restart", event.offset, event.version, event.commands, event.partial)
    assert isinstance(event, EndOfInput)
    return ("eoi", event.offset)


def decode(data: bytes, chunks: Iterable[int] | None = None, **kwargs: Any) -> list[tuple[Any, ...]]:
    """Feed ``data`` in pieces of the given sizes (whole when None); canonical events."""
    decoder = Decoder(**kwargs)
    sizes = iter(chunks) if chunks is not None else iter([len(data)])
    pos = 0
    out: list[tuple[Any, ...]] = []
    while True:
        event = decoder.next_event()
        if isinstance(event, NeedData):
            if pos >= len(data):
                decoder.receive_data(b"")
                continue
            n = max(1, next(sizes, len(data)))
            decoder.receive_data(data[pos : pos + n])
            pos += n
            continue
        out.append(canon(event))
        if isinstance(event, EndOfInput):
            return out


def random_chunks(seed: int, high: int = 70000) -> Iterable[int]:
    rng = random.Random(seed)
    while True:
        yield rng.choice((1, 2, 9, 10, 11, 17, rng.randrange(1, 300), rng.randrange(1, high)))


def boundaries(data: bytes) -> list[int]:
    """Offsets where each event starts, and the end of the input."""
    return [e[1] for e in decode(data)]


def command_bytes(cmd: int, attrs: list[tuple[int, bytes]], version: int = 2) -> bytes:
    return encode_command(Command(cmd, list(attrs)), version)


def tlv(t: int, value: bytes) -> tuple[int, bytes]:
    return (t, value)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


END = bytes.fromhex("000000001500506cc99d")


def crafted(version: int, *commands: bytes) -> bytes:
    """A stream with the given encoded commands between a header and END."""
    return encode_stream_header(version) + b"".join(commands) + END


def key_file(path: Path) -> Path:
    """A fresh 32-byte pre-shared key at ``path``, readable by its owner only."""
    path.write_bytes(os.urandom(32))
    path.chmod(0o600)
    return path


@pytest.fixture
def key(tmp_path: Path) -> Path:
    """A pre-shared key file of the test."""
    return key_file(tmp_path / "psk.key")


def need_btrfs_progs() -> None:
    if shutil.which("btrfs") is None:
        pytest.skip("btrfs-progs is not installed (apt-get install btrfs-progs); CI installs it")


def need_root_btrfs() -> None:
    need_btrfs_progs()
    reason = require_btrfs()
    if reason:
        pytest.skip(f"needs a real file-backed btrfs: {reason}")


@contextlib.contextmanager
def utc() -> Iterator[None]:
    """Run in the UTC zone (the stored .dump files were made with TZ=UTC)."""
    old = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = old
        time.tzset()


def first_stream_as_6_2(path: Path) -> bytes:
    """Our text in btrfs-progs 6.2's exact form: raw xattr data, first stream only."""
    dumper = TextDumper(raw_xattr_data=True)
    out = []
    with path.open("rb") as f:
        for ev in iter_events(f):
            if isinstance(ev, Command):
                out.append(dumper.line(ev))
                if ev.name == "end":
                    break
    return b"".join(out)
