"""Damaged input: every damage gives our format error with its offset, never another exception."""

from __future__ import annotations

import io
import itertools
import random
import struct
from pathlib import Path

import pytest
from support.streams import FIXTURES, STREAMS, boundaries, command_bytes, crafted, decode, random_chunks

from sendstream import errors as e
from sendstream import verify_file

SAMPLE = FIXTURES / "rich-full-v2.stream"


def check(data: bytes, **kwargs: object) -> e.FormatError:
    """Both the decoder and the verifier must reject ``data`` the same way."""
    with pytest.raises(e.FormatError) as info:
        decode(data, random_chunks(len(data)), strict=True, **kwargs)
    report = verify_file(io.BytesIO(data), **kwargs)  # type: ignore[arg-type]
    assert not report.ok
    first = report.problems[0]
    assert (type(first), first.offset, first.index) == (type(info.value), info.value.offset, info.value.index)
    return info.value


@pytest.mark.parametrize("path", STREAMS, ids=lambda p: p.stem)
def test_bit_flips_are_caught(path: Path) -> None:
    data = path.read_bytes()
    rng = random.Random(path.name)
    positions = set(range(min(len(data), 200))) | {rng.randrange(len(data)) for _ in range(150)}
    for pos in sorted(positions):
        if 13 <= pos < 17:
            continue  # the version field is the one thing no CRC covers
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        err = check(bytes(flipped))
        assert 0 <= err.offset <= pos, (pos, err)


def test_version_flips_give_format_errors_or_a_valid_other_version() -> None:
    data = SAMPLE.read_bytes()
    for bit in range(32):
        flipped = bytearray(data)
        flipped[13 + bit // 8] ^= 1 << (bit % 8)
        try:
            decode(bytes(flipped))
        except e.FormatError as err:
            assert err.offset >= 0


def test_truncation_at_every_command_boundary(stream_path: Path) -> None:
    data = stream_path.read_bytes()
    marks = boundaries(data)
    for cut in marks[:-1]:
        if cut == 0:
            continue
        if data[cut : cut + 13] == b"btrfs-stream\0":
            continue  # a clean end between two streams
        err = check(data[:cut])
        assert isinstance(err, e.TruncatedStream) and err.offset == cut
        assert err.exit_code == e.EXIT_TRUNCATED


def test_truncation_inside_commands(stream_path: Path) -> None:
    data = stream_path.read_bytes()
    marks = boundaries(data)
    for start, end in itertools.pairwise(marks):
        for cut in {start + 1, start + 5, start + 9, (start + end) // 2, end - 1}:
            if start < cut < end:
                err = check(data[:cut])
                assert isinstance(err, e.TruncatedStream)
                assert err.offset == start


def test_length_1718776930_names_the_btrf_bytes() -> None:
    data = bytearray(SAMPLE.read_bytes())
    marks = boundaries(bytes(data))
    data[marks[5] : marks[5] + 4] = b"btrf"  # not followed by a real header: no restart to find
    err = check(bytes(data))
    assert isinstance(err, e.CommandTooLarge)
    assert err.actual == 1718776930 and "btrf" in str(err)
    assert (err.offset, err.index) == (marks[5], 4)


def test_oversized_length() -> None:
    data = bytearray(SAMPLE.read_bytes())
    struct.pack_into("<L", data, 17, 0x7FFFFFFF)
    err = check(bytes(data))
    assert isinstance(err, e.CommandTooLarge) and err.offset == 17 and err.expected == "at most 147456 bytes"
    err = check(bytes(data), max_command_size=1 << 31)
    assert isinstance(err, e.TruncatedStream)


def test_unknown_command_and_duplicate_attribute_fail_verification() -> None:
    err = check(crafted(2, command_bytes(77, [(15, b"x")])))
    assert isinstance(err, e.UnknownCommand) and err.offset == 17
    err = check(crafted(2, command_bytes(11, [(15, b"x"), (15, b"y")])))
    assert isinstance(err, e.DuplicateAttribute) and err.offset == 17 + 10 + 5


def test_trailing_bytes() -> None:
    data = SAMPLE.read_bytes()
    err = check(data + b"garbage!")
    assert isinstance(err, e.TrailingData) and err.offset == len(data)
    err = check(data + b"btrfs-str")
    assert isinstance(err, e.TruncatedStream) and err.offset == len(data)


def test_not_a_stream() -> None:
    err = check(b"hello world, this is not a send stream")
    assert isinstance(err, e.BadStreamHeader) and err.offset == 0
    err = check(b"btrfs-stream\0\x09\x00\x00\x00")
    assert isinstance(err, e.BadStreamHeader) and err.actual == 9


class Trickle(io.RawIOBase):
    """A reader that hands out a few bytes at a time, like a slow pipe."""

    def __init__(self, data: bytes, seed: int) -> None:
        self.data = data
        self.pos = 0
        self.sizes = random_chunks(seed, 200000)

    def readable(self) -> bool:
        return True

    def readinto(self, b: memoryview) -> int:  # type: ignore[override]
        n = min(len(b), next(self.sizes), len(self.data) - self.pos)
        b[:n] = self.data[self.pos : self.pos + n]
        self.pos += n
        return n


def test_verify_carries_partial_commands_across_reads(stream_path: Path) -> None:
    data = stream_path.read_bytes()
    whole = verify_file(io.BytesIO(data))
    assert whole.ok and whole.bytes == len(data)
    for seed in range(3):
        report = verify_file(Trickle(data, seed))  # type: ignore[arg-type]
        assert (report.ok, report.streams, report.commands, report.bytes) == (
            True,
            whole.streams,
            whole.commands,
            len(data),
        )


def test_keep_going_reports_every_damaged_command() -> None:
    data = bytearray(SAMPLE.read_bytes())
    marks = boundaries(bytes(data))
    for start in (marks[3], marks[8]):
        data[start + 11] ^= 0xFF
    report = verify_file(io.BytesIO(bytes(data)), keep_going=True)
    assert [(type(p), p.offset) for p in report.problems] == [(e.CrcMismatch, marks[3]), (e.CrcMismatch, marks[8])]
    first = verify_file(io.BytesIO(bytes(data)))
    assert len(first.problems) == 1
