"""The fixture corpus, and streams fed, crafted and compared in canonical form."""

from __future__ import annotations

import os
import random
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, cast

from sendstream import Command, Decoder, EndOfInput, NeedData, StreamHeader, encode_command, encode_stream_header
from sendstream.codec.backend import Backend
from sendstream.codec.events import Restart
from sendstream.transfer.identity import Identity

ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURES = ROOT / "fixtures"
STREAMS = sorted(FIXTURES.glob("*.stream"))
# Streams that btrfs-progs 6.2 can read (it rejects v3).
BTRFS_READABLE = [p for p in STREAMS if p.read_bytes()[13] < 3]
# The rich full stream: what the transport tests send.
SAMPLE = FIXTURES / "rich-full-v2.stream"

_LAST_TM = 67_768_036_191_676_799  # 2147485547-12-31T23:59:59Z: year INT_MAX + 1900, the end of struct tm
_FIRST_TM = -67_768_040_609_740_800  # -2147481748-01-01T00:00:00Z: year INT_MIN + 1900
_DATETIME = (-62_135_596_800, 253_402_300_799)  # 0001-01-01T00:00:00Z and 9999-12-31T23:59:59Z: Python's datetime
# Seconds of a timespec at and around the limits of time_t, struct tm, 32-bit times and Python's
# datetime, as signed 64-bit values (the dump prints them; the fuzz harness mutates times to them).
EDGE_TIMES = tuple(
    sorted(
        {
            *(t + d for t in (_LAST_TM, _FIRST_TM, *_DATETIME) for d in (-1, 0, 1)),
            *(t + d for t in (1 << 31, 1 << 32) for d in (-1, 0)),
            -(1 << 31),
            -(1 << 31) - 1,
            -1,
            0,
            1,
            (1 << 63) - 1,
            -(1 << 63),
            -(1 << 63) + 1,
            1 << 62,
        }
    )
)


def stream_ids(p: Path) -> str:
    return p.stem


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


def random_chunks(seed: int, high: int = 70000) -> Iterator[int]:
    rng = random.Random(seed)
    while True:
        yield rng.choice((1, 2, 9, 10, 11, 17, rng.randrange(1, 300), rng.randrange(1, high)))


def boundaries(data: bytes) -> list[int]:
    """Offsets where each event starts, and the end of the input."""
    return [e[1] for e in decode(data)]


def command_bytes(cmd: int, attrs: list[tuple[int, bytes]], version: int = 2) -> bytes:
    return encode_command(Command(cmd, list(attrs)), version)


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


END = bytes.fromhex("000000001500506cc99d")


def crafted(version: int, *commands: bytes) -> bytes:
    """A stream with the given encoded commands between a header and END."""
    return encode_stream_header(version) + b"".join(commands) + END


def backend_env(backend: Backend, env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (this process's without it) for a command that decodes on ``backend``."""
    env = dict(os.environ if env is None else env)
    env.pop("SENDSTREAM_PURE", None)
    if not backend.is_native:
        env["SENDSTREAM_PURE"] = "1"
    return env


def partial_identity(**fields: object) -> Identity:
    """An identity with only ``fields``: what a test of journals and tokens needs (a forged token's, or a
    placeholder); a stream's own has them all (:func:`~sendstream.transfer.identity.stream_identity`)."""
    return cast(Identity, fields)
