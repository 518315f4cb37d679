"""Damaged input: every damage gives our format error with its offset, never another exception."""

from __future__ import annotations

import io
import itertools
import random
import struct
from pathlib import Path
from typing import Any

import pytest
from support.streams import FIXTURES, STREAMS, boundaries, command_bytes, crafted, decode, random_chunks

from sendstream import Decoder, verify_file
from sendstream import errors as e
from sendstream.codec.backend import Backend

SAMPLE = FIXTURES / "rich-full-v2.stream"
PARTS = 3  # the cuts inside commands of a fixture, split so that no one test holds a worker for half a minute


def decoded_error(data: bytes, **kwargs: Any) -> e.FormatError:
    """The error of the strict decoder fed ``data`` in random pieces (its events are not kept)."""
    decoder = Decoder(strict=True, **kwargs)
    sizes = random_chunks(len(data))
    pos = 0
    with pytest.raises(e.FormatError) as info:
        while pos < len(data):
            n = next(sizes)
            decoder.receive_data(data[pos : pos + n])
            pos += n
            decoder.events()
        decoder.receive_data(b"")
        decoder.events()
    return info.value


def check(data: bytes, **kwargs: Any) -> e.FormatError:
    """Both the decoder and the verifier must reject ``data`` the same way."""
    err = decoded_error(data, **kwargs)
    report = verify_file(io.BytesIO(data), **kwargs)
    assert not report.ok
    first = report.problems[0]
    assert (type(first), first.offset, first.index) == (type(err), err.offset, err.index)
    return err


@pytest.mark.parametrize("path", STREAMS, ids=lambda p: p.stem)
def test_bit_flips_are_caught(path: Path, backend: Backend) -> None:
    data = path.read_bytes()
    rng = random.Random(path.name)
    positions = set(range(min(len(data), 200))) | {rng.randrange(len(data)) for _ in range(150)}
    for pos in sorted(positions):
        if 13 <= pos < 17:
            continue  # the version field is the one thing no CRC covers
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        err = check(bytes(flipped), backend=backend)
        assert err.offset is not None and 0 <= err.offset <= pos, (pos, err)


def test_version_flips_give_format_errors_or_a_valid_other_version(backend: Backend) -> None:
    data = SAMPLE.read_bytes()
    for bit in range(32):
        flipped = bytearray(data)
        flipped[13 + bit // 8] ^= 1 << (bit % 8)
        try:
            decode(bytes(flipped), backend=backend)
        except e.FormatError as err:
            assert err.offset is not None and err.offset >= 0


def test_truncation_at_every_command_boundary(stream_path: Path, backend: Backend) -> None:
    data = stream_path.read_bytes()
    marks = boundaries(data)
    for cut in marks[:-1]:
        if cut == 0:
            continue
        if data[cut : cut + 13] == b"btrfs-stream\0":
            continue  # a clean end between two streams
        err = decoded_error(data[:cut], backend=backend)  # one decode of each prefix
        assert isinstance(err, e.TruncatedStream) and err.offset == cut
        assert err.exit_code == e.EXIT_TRUNCATED


@pytest.mark.parametrize("part", range(PARTS))  # every command in one of the parts: they spread over workers
def test_truncation_inside_commands(stream_path: Path, part: int, backend: Backend) -> None:
    data = stream_path.read_bytes()
    marks = boundaries(data)
    for i, (start, end) in enumerate(itertools.pairwise(marks)):
        if i % PARTS != part:
            continue
        for cut in {start + 1, start + 5, start + 9, (start + end) // 2, end - 1}:
            if start < cut < end:
                err = decoded_error(data[:cut], backend=backend)  # one decode of each prefix
                assert isinstance(err, e.TruncatedStream)
                assert err.offset == start


def test_length_1718776930_names_the_btrf_bytes(backend: Backend) -> None:
    data = bytearray(SAMPLE.read_bytes())
    marks = boundaries(bytes(data))
    data[marks[5] : marks[5] + 4] = b"btrf"  # not followed by a real header: no restart to find
    err = check(bytes(data), backend=backend)
    assert isinstance(err, e.CommandTooLarge)
    assert err.actual == 1718776930 and "btrf" in str(err)
    assert (err.offset, err.index) == (marks[5], 4)


def test_oversized_length(backend: Backend) -> None:
    data = bytearray(SAMPLE.read_bytes())
    struct.pack_into("<L", data, 17, 0x7FFFFFFF)
    err = check(bytes(data), backend=backend)
    assert isinstance(err, e.CommandTooLarge) and err.offset == 17 and err.expected == "at most 147456 bytes"
    err = check(bytes(data), max_command_size=1 << 31, backend=backend)
    assert isinstance(err, e.TruncatedStream)


def test_unknown_command_and_duplicate_attribute_fail_verification(backend: Backend) -> None:
    err = check(crafted(2, command_bytes(77, [(15, b"x")])), backend=backend)
    assert isinstance(err, e.UnknownCommand) and err.offset == 17
    err = check(crafted(2, command_bytes(11, [(15, b"x"), (15, b"y")])), backend=backend)
    assert isinstance(err, e.DuplicateAttribute) and err.offset == 17 + 10 + 5


def test_trailing_bytes(backend: Backend) -> None:
    data = SAMPLE.read_bytes()
    err = check(data + b"garbage!", backend=backend)
    assert isinstance(err, e.TrailingData) and err.offset == len(data)
    err = check(data + b"btrfs-str", backend=backend)
    assert isinstance(err, e.TruncatedStream) and err.offset == len(data)


def test_not_a_stream(backend: Backend) -> None:
    err = check(b"hello world, this is not a send stream", backend=backend)
    assert isinstance(err, e.BadStreamHeader) and err.offset == 0
    err = check(b"btrfs-stream\0\x09\x00\x00\x00", backend=backend)
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


def test_verify_carries_partial_commands_across_reads(stream_path: Path, backend: Backend) -> None:
    data = stream_path.read_bytes()
    whole = verify_file(io.BytesIO(data), backend=backend)
    assert whole.ok and whole.bytes == len(data)
    for seed in range(3):
        report = verify_file(Trickle(data, seed), backend=backend)  # type: ignore[arg-type]
        assert (report.ok, report.streams, report.commands, report.bytes) == (
            True,
            whole.streams,
            whole.commands,
            len(data),
        )


def test_keep_going_reports_every_damaged_command(backend: Backend) -> None:
    data = bytearray(SAMPLE.read_bytes())
    marks = boundaries(bytes(data))
    for start in (marks[3], marks[8]):
        data[start + 11] ^= 0xFF
    report = verify_file(io.BytesIO(bytes(data)), keep_going=True, backend=backend)
    assert [(type(p), p.offset) for p in report.problems] == [(e.CrcMismatch, marks[3]), (e.CrcMismatch, marks[8])]
    first = verify_file(io.BytesIO(bytes(data)), backend=backend)
    assert len(first.problems) == 1
