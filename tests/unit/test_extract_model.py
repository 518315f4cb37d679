"""In process, beside extraction: path checks, the LZO and size-bounded decompression, paths and
statistics of every fixture (extraction itself, and against btrfs receive, is tests/system/test_extract.py)."""

from __future__ import annotations

import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.streams import FIXTURES, STREAMS, stream_ids

from sendstream import Command
from sendstream.analysis.paths import is_temporary_name
from sendstream.analysis.resolve import resolve
from sendstream.analysis.statistics import Statistics
from sendstream.codec.compression import decompress, lzo1x_decompress
from sendstream.errors import UnsafePath
from sendstream.extract import split_path
from sendstream.io.windows import file_events, iter_events


def test_split_path() -> None:
    assert split_path(b"") == ()
    assert split_path(b"a/b c/\xff") == (b"a", b"b c", b"\xff")
    for bad in (b"/a", b"a/../b", b"..", b".", b"a//b", b"a/", b"a\0b", b"x" * 256):
        with pytest.raises(UnsafePath):
            split_path(bad)


def lzo_segments(data: bytes, sector: int) -> Iterator[bytes]:
    total = int.from_bytes(data[:4], "little")
    pos = 4
    while pos < total:
        if -pos % sector < 4:
            pos += -pos % sector
        n = int.from_bytes(data[pos : pos + 4], "little")
        yield data[pos + 4 : pos + 4 + n]
        pos += 4 + n


def test_lzo_against_liblzo2() -> None:
    """Our LZO1X decoder gives liblzo2's output on every segment of the fixture."""
    lzo = pytest.importorskip("lzo", reason="python-lzo (liblzo2) is not installed: cross-check skipped")
    with (FIXTURES / "compressed-v2.stream").open("rb") as f:
        writes = [
            bytes(c.get("data")) for c in iter_events(f) if isinstance(c, Command) and c.get("compression", 0) == 3
        ]
    assert writes
    for data in writes:
        for segment in lzo_segments(data, 4096):
            assert lzo1x_decompress(segment, 4096) == lzo.decompress(segment, False, 4096)
    rng = __import__("random").Random(7)
    for size in (0, 1, 3, 4, 17, 100, 4096, 70000):
        for raw in (rng.randbytes(size), bytes(size), (b"abc" * size)[:size], b"x" * size):
            assert lzo1x_decompress(lzo.compress(raw, 1, False), max(size, 1)) == raw


def test_lzo_rejects_bad_input() -> None:
    for bad in (b"", b"\x11\x00", b"\x12ab", b"\x15abcd\x11\x00\x00extra", b"\x00\x00\x00\x00\x00"):
        with pytest.raises(ValueError):
            lzo1x_decompress(bad, 4096)
    with pytest.raises(ValueError, match="output overrun"):
        lzo1x_decompress(b"\x15abcd\x11\x00\x00", 3)
    assert lzo1x_decompress(b"\x15abcd\x11\x00\x00", 4) == b"abcd"


def test_decompress_limits() -> None:
    import zstandard

    plain = b"0123456789" * 1000
    assert decompress(2, zstandard.ZstdCompressor().compress(plain) + bytes(100), 10000) == plain
    assert decompress(1, zlib.compress(plain) + bytes(50), 12000) == plain + bytes(2000)
    bomb = zstandard.ZstdCompressor().compress(bytes(50 << 20))
    assert decompress(2, bomb, 4096) == bytes(4096)
    assert decompress(1, zlib.compress(bytes(50 << 20)), 4096) == bytes(4096)
    with pytest.raises(ValueError):
        decompress(9, b"", 10)


@pytest.mark.parametrize("stream", STREAMS, ids=stream_ids)
def test_paths_and_statistics_of_every_fixture(stream: Path) -> None:
    with stream.open("rb") as f:
        records = list(resolve(file_events(f)))
    for r in records:
        if r.final is not None:
            assert not any(is_temporary_name(part) for part in r.final.split(b"/")), r
    statistics = Statistics()
    with stream.open("rb") as f:
        for event in file_events(f):
            statistics.feed(event)
    total = sum(s.total.wire_bytes for s in statistics.streams) + 17 * len(statistics.streams)
    assert total == stream.stat().st_size
    counts: dict[str, int] = {}
    for s in statistics.streams:
        for name, c in s.commands.items():
            counts[name] = counts.get(name, 0) + c.count
    manifest = (FIXTURES / "MANIFEST.md").read_text()
    line = next(x for x in manifest.splitlines() if x.startswith(f"| `{stream.stem}` |"))
    listed = line.split("Commands: ")[1].split(" |")[0]
    assert " ".join(f"{k}={v}" for k, v in sorted(counts.items())) == listed
    assert len(records) == sum(counts.values())
