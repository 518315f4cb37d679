"""The native backend agrees with the pure-Python one (the reference), everywhere."""

from __future__ import annotations

import io
import os
import random
from array import array
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.strategies import commands
from support.streams import FIXTURES, boundaries, crafted

from sendstream import Command, FormatError, crc32c, encode_command, reference_crc32c
from sendstream.codec.backend import native, pure
from sendstream.codec.framer import Framer
from sendstream.codec.limits import default_max_command_size
from sendstream.codec.scan import python_scan
from sendstream.io.windows import file_events
from sendstream.render.dump import TextDumper
from sendstream.render.progs import ProgsStyle

NATIVE = native()
if NATIVE is None:
    pytest.skip("the native module is not built (no compiler at install time)", allow_module_level=True)
native_scan = NATIVE.scan


def streams_of(data: bytes) -> list[tuple[int, int]]:
    """(first command offset, version) of each stream in ``data``."""
    out = []
    pos = 0
    while pos < len(data) and data[pos : pos + 13] == b"btrfs-stream\0":
        version = data[pos + 13]
        pos += 17
        out.append((pos, version))
        end = python_scan(data, pos, version, default_max_command_size(version))
        pos = end[0]
    return out


def both(data: bytes | bytearray, pos: int, version: int) -> tuple[int, int, int, int, int]:
    limit = default_max_command_size(version)
    native = native_scan(bytes(data), pos, version, limit)
    assert native == python_scan(bytes(data), pos, version, limit)
    return native


def test_every_fixture_scans_the_same(stream_path: Path) -> None:
    data = stream_path.read_bytes()
    for start, version in streams_of(data):
        pos, status, _need, count, nbytes = both(data, start, version)
        assert status == 1 and count > 1 and nbytes == pos - start


def test_splits_at_every_position(stream_path: Path) -> None:
    """A window ending anywhere stops at the partial command with the same need."""
    data = stream_path.read_bytes()
    start, version = streams_of(data)[0]
    step = max(1, len(data) // 3000)
    for cut in range(start, len(data), step):
        both(data[:cut], start, version)


def test_corrupted_variants_stop_in_the_same_place(stream_path: Path) -> None:
    data = stream_path.read_bytes()
    start, version = streams_of(data)[0]
    rng = random.Random(stream_path.name)
    for _ in range(300):
        damaged = bytearray(data)
        damaged[rng.randrange(start, len(data))] ^= 1 << rng.randrange(8)
        both(damaged, start, version)


@settings(deadline=None)
@given(st.sampled_from(sorted(FIXTURES.glob("*.stream"))), st.data())
def test_differential_fuzz(path: Path, data: st.DataObject) -> None:
    raw = bytearray(path.read_bytes()[:20000])
    start, version = streams_of(bytes(path.read_bytes()))[0]
    for _ in range(data.draw(st.integers(0, 4))):
        pos = data.draw(st.integers(start, len(raw) - 1))
        raw[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(start, len(raw)))
    both(raw[:cut], start, version)
    both(raw[:cut], start, data.draw(st.sampled_from([1, 2, 3])))


def test_a_damaged_end_over_the_next_header_stops_both_scanners() -> None:
    """Found by the fuzz test: END's length made 1 takes in the first byte of the next stream's
    header; the framer waits to see whether a restart starts there, and then finds one. The
    scanners stop at the damaged command on both paths and leave that to the framer."""
    data = bytearray((FIXTURES / "two-concat-v1.stream").read_bytes())
    start, version = streams_of(bytes(data))[0]
    end = streams_of(bytes(data))[1][0] - 17 - 10  # the END of the first stream
    data[end] = 1
    for cut in (end + 11, end + 11 + 17 + 10, len(data)):
        assert both(data[:cut], start, version)[:3] == (end, 2, 0)


def test_arrays_of_offsets_commands_and_lengths() -> None:
    data = (FIXTURES / "rich-full-v2.stream").read_bytes()
    marks = boundaries(data)
    offsets, cmds, lens = array("Q", bytes(8 * 50)), array("H", bytes(2 * 50)), array("I", bytes(4 * 50))
    assert lens.itemsize == 4
    pos, status, _, count, _ = native_scan(data, 17, 2, 147456, offsets, cmds, lens, 1000)
    assert (status, count) == (3, 50)
    assert list(offsets) == [1000 + m for m in marks[1:51]]
    assert list(lens) == [int.from_bytes(data[m : m + 4], "little") for m in marks[1:51]]
    assert list(cmds) == [int.from_bytes(data[m + 4 : m + 6], "little") for m in marks[1:51]]
    assert pos == marks[51]


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9, 4095, 24575, 24576, 24577, 100000, 300001])
def test_native_crc(size: int) -> None:
    data = os.urandom(size)
    assert NATIVE is not None
    assert NATIVE.crc32c(data) == pure().crc32c(data) == crc32c(data) == reference_crc32c(data)
    half = size // 2
    for backend in (NATIVE, pure()):
        assert backend.crc32c(data[half:], backend.crc32c(data[:half])) == crc32c(data)


# every text the dumper prints: each style, and 6.2's raw xattr data
TEXT_STYLES: list[tuple[ProgsStyle, bool]] = [("6.2", False), ("6.2", True), ("6.14", False)]


def python_text(data: bytes, style: ProgsStyle, raw_xattr: bool) -> bytes:
    dumper = TextDumper(style=style, raw_xattr_data=raw_xattr)
    out = []
    with io.BytesIO(data) as f:
        for ev in file_events(f, Framer(backend=pure())):
            if isinstance(ev, Command):
                out.append(dumper.line(ev))
    return b"".join(out)


def native_text(data: bytes, style: ProgsStyle, raw_xattr: bool) -> bytes:
    assert NATIVE is not None
    out = io.BytesIO()
    dumper = TextDumper(style=style, raw_xattr_data=raw_xattr)
    with io.BytesIO(data) as f:
        for ev in file_events(f, Framer(backend=NATIVE), dumper.native_batch(out, NATIVE)):
            if isinstance(ev, Command):
                out.write(dumper.line(ev))
    return out.getvalue()


@pytest.mark.parametrize(("style", "raw_xattr"), TEXT_STYLES)
def test_native_text_equals_the_python_reference(stream_path: Path, style: ProgsStyle, raw_xattr: bool) -> None:
    data = stream_path.read_bytes()
    assert native_text(data, style, raw_xattr) == python_text(data, style, raw_xattr)


@settings(deadline=None)
@given(st.data())
def test_native_text_on_generated_commands(data: st.DataObject) -> None:
    version = data.draw(st.sampled_from([1, 2, 3]))
    cmds = data.draw(st.lists(commands(version), min_size=1, max_size=10))
    stream = crafted(version, *(encode_command(c, version) for c in cmds))
    for style, raw in TEXT_STYLES:
        try:
            expected = python_text(stream, style, raw)
        except FormatError:
            # a time the C library cannot show: the native path hands it to Python, which raises
            with pytest.raises(FormatError):
                native_text(stream, style, raw)
            continue
        assert native_text(stream, style, raw) == expected
