"""Restarted sends: detection and repair at every position, on real streams."""

from __future__ import annotations

import io
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support.streams import FIXTURES, boundaries, decode, random_chunks

from sendstream import Decoder, Framer, NeedData, verify_file
from sendstream import errors as e
from sendstream.codec.native import NATIVE
from sendstream.io.windows import file_events
from sendstream.ops.repair import Healer

SMALL = FIXTURES / "rich-incr-v2.stream"
MAGIC = b"btrfs-stream\0"


def repair(data: bytes, *, keep_last: bool = False, native: bool = NATIVE) -> bytes:
    out = io.BytesIO()

    def truncate(n: int) -> None:
        out.seek(n)
        out.truncate(n)

    healer = Healer(out.write, keep_last=keep_last, truncate=truncate)
    framer = Framer(batch=native)
    for event in file_events(io.BytesIO(data), framer, healer.batch if native else None):
        healer.event(event)
    return out.getvalue()


def repair_through_decoder(data: bytes, seed: int) -> bytes:
    """The same healing fed by the sans-IO decoder in random chunks."""
    out = io.BytesIO()
    healer = Healer(out.write)
    decoder = Decoder()
    chunks = random_chunks(seed)
    pos = 0
    while True:
        event = decoder.next_event()
        if isinstance(event, NeedData):
            n = next(chunks)
            decoder.receive_data(data[pos : pos + n])
            pos += n
            continue
        healer.event(event)
        if type(event).__name__ == "EndOfInput":
            return out.getvalue()


def restart_events(data: bytes) -> list[tuple[int, int, int]]:
    return [(ev[1], ev[3], ev[4]) for ev in decode(data) if ev[0] == "restart"]


@pytest.mark.parametrize("name", ["rich-incr-v2", "rich-incr-v1", "compressed-v2", "clone-src-v1"])
def test_restart_at_every_command_boundary(name: str) -> None:
    data = (FIXTURES / f"{name}.stream").read_bytes()
    marks = boundaries(data)
    for i, cut in enumerate(marks[1:-1], start=0):
        damaged = data[:cut] + data
        assert restart_events(damaged) == [(cut, i, 0)]
        assert repair(damaged) == data
        report = verify_file(io.BytesIO(damaged))
        assert report.exit_code == e.EXIT_RESTARTED
        assert f"stream restarted at offset {cut} after {i} complete commands; 0 bytes" in str(report.problems[0])


@pytest.mark.parametrize("name", ["rich-incr-v2", "rich-full-v1", "compressed-v2", "two-e-v1", "verity-v3"])
def test_restart_inside_commands(name: str) -> None:
    data = (FIXTURES / f"{name}.stream").read_bytes()
    marks = boundaries(data)
    commands = list(itertools.pairwise(marks[1:]))
    for i, (start, end) in enumerate(commands):
        for cut in sorted({start + 1, start + 4, start + 9, start + 10, (start + end) // 2, end - 1}):
            if not start < cut < end:
                continue
            damaged = data[:cut] + data
            if data[cut:end] == MAGIC[: end - cut]:
                # the header's first bytes happen to complete the command: it is whole
                assert restart_events(damaged) == [(cut, i + 1, 0)], (i, cut)
            else:
                assert restart_events(damaged) == [(cut, i, cut - start)], (i, cut)
            assert repair(damaged) == data, (i, cut)
    # inside the first command and just before END are among them
    assert commands[0][0] == 17 and data[commands[-1][0] + 4] == 21


def test_two_restarts_and_a_restart_during_the_replay() -> None:
    data = SMALL.read_bytes()
    marks = boundaries(data)
    a, b = marks[40] + 7, marks[12] + 3
    damaged = data[:a] + data[:b] + data
    assert [r[0] for r in restart_events(damaged)] == [a, a + b]
    assert repair(damaged) == data
    assert repair(damaged, native=False) == data
    for seed in range(3):
        assert repair_through_decoder(damaged, seed) == data


def test_repair_of_a_clean_stream_is_a_copy(stream_path: Path) -> None:
    data = stream_path.read_bytes()
    assert repair(data) == data


def test_a_diverging_replay_is_refused_unless_keep_last() -> None:
    data = SMALL.read_bytes()
    other = (FIXTURES / "rich-full-v2.stream").read_bytes()
    cut = boundaries(data)[30] + 5
    damaged = data[:cut] + other
    with pytest.raises(e.ReplayDiverges) as info:
        repair(damaged)
    assert info.value.index == 0 and info.value.offset == cut + 17
    assert "command #0 of length" in str(info.value)
    assert repair(damaged, keep_last=True) == other


def test_a_replay_of_another_version_is_refused() -> None:
    v2 = SMALL.read_bytes()
    v1 = (FIXTURES / "rich-incr-v1.stream").read_bytes()
    with pytest.raises(e.ReplayDiverges):
        repair(v2[: boundaries(v2)[3]] + v1)


def test_truncated_replays() -> None:
    data = SMALL.read_bytes()
    marks = boundaries(data)
    cut = marks[50] + 20
    for replayed in (marks[1], marks[10], marks[49], marks[50] + 3):
        damaged = data[:cut] + data[:replayed]
        with pytest.raises(e.TruncatedStream):
            repair(damaged)


@pytest.mark.parametrize("keep", [4, 8, 12, 16])
def test_a_header_only_partly_present_at_the_end(keep: int) -> None:
    data = SMALL.read_bytes()
    cut = boundaries(data)[20] + 6
    damaged = data[:cut] + data[:keep]
    with pytest.raises(e.TruncatedStream) as info:
        decode(damaged)
    assert "restarted stream" in str(info.value)


def test_a_header_right_after_end_is_the_next_stream_not_a_restart() -> None:
    data = (FIXTURES / "two-concat-v2.stream").read_bytes()
    assert restart_events(data) == []
    assert verify_file(io.BytesIO(data)).ok


def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "sendstream", *args], input=stdin, capture_output=True)


def test_cli_verify_scan_and_repair(tmp_path: Path) -> None:
    data = SMALL.read_bytes()
    cut = boundaries(data)[25] + 11
    damaged = tmp_path / "damaged.stream"
    damaged.write_bytes(data[:cut] + data)
    verify = run("verify", str(damaged))
    assert verify.returncode == 5
    assert f"stream restarted at offset {cut} after 24 complete commands; 11 bytes of a partial command" in (
        verify.stderr.decode()
    )
    scan = run("verify", "--scan", str(damaged))
    assert scan.stdout.decode() == (
        f"offset 0: stream header, version 2\noffset {cut}: stream header, version 2\n2 stream headers\n"
    )
    fixed = tmp_path / "fixed.stream"
    result = run("repair", str(damaged), str(fixed))
    assert result.returncode == 0 and fixed.read_bytes() == data
    assert b"1 restart repaired" in result.stderr
    piped = run("repair", "-", "-", stdin=damaged.read_bytes())
    assert piped.returncode == 0 and piped.stdout == data


def test_cli_repair_leaves_no_half_written_file(tmp_path: Path) -> None:
    data = SMALL.read_bytes()
    other = (FIXTURES / "rich-full-v2.stream").read_bytes()
    damaged = tmp_path / "damaged.stream"
    damaged.write_bytes(data[: boundaries(data)[30]] + other)
    out = tmp_path / "out.stream"
    result = run("repair", str(damaged), str(out))
    assert result.returncode == 5 and b"replay differs" in result.stderr
    assert sorted(os.listdir(tmp_path)) == ["damaged.stream"]
    kept = run("repair", "--keep-last", str(damaged), str(out))
    assert kept.returncode == 0 and out.read_bytes() == other
    assert run("repair", "--keep-last", str(damaged), "-").returncode == 2  # a pipe cannot be truncated


def test_convert_refuses_a_restarted_stream(tmp_path: Path) -> None:
    data = SMALL.read_bytes()
    result = run("convert", "-", str(tmp_path / "x"), stdin=data[:500] + data)
    assert result.returncode == 5 and not (tmp_path / "x").exists()


def test_copy_range_passes_checked_input_ranges_on() -> None:
    """What the kTLS sender sends with sendfile: input ranges instead of bytes."""
    data = SMALL.read_bytes()
    damaged = data[: boundaries(data)[30] + 9] + data
    out = io.BytesIO()
    healer = Healer(out.write, copy_range=lambda offset, length: out.write(damaged[offset : offset + length]))
    for event in file_events(io.BytesIO(damaged), Framer(), healer.batch):
        healer.event(event)
    assert out.getvalue() == data and healer.written == len(data)


def test_events_of_a_restarted_stream_are_healed_unless_raw() -> None:
    """A script that counts what writes write counts each byte once: the replay is dropped, the
    Restart still said; raw=True gives the input as it is."""
    import sendstream

    data = SMALL.read_bytes()
    marks = boundaries(data)
    cut = marks[40] + 7  # inside command 39: a partial command, then the whole stream again
    damaged = data[:cut] + data

    def written(events: object) -> int:
        return sum(len(ev.get("data")) for ev in events if isinstance(ev, sendstream.Command) and ev.name == "write")

    clean = [ev for ev in sendstream.events(data) if isinstance(ev, sendstream.Command)]
    healed = list(sendstream.events(damaged))
    assert [type(ev).__name__ for ev in healed].count("Restart") == 1
    commands = [ev for ev in healed if isinstance(ev, sendstream.Command)]
    assert [(c.name, c.crc) for c in commands] == [(c.name, c.crc) for c in clean]
    assert written(sendstream.events(damaged)) == written(sendstream.events(data))
    raw = [ev for ev in sendstream.events(damaged, raw=True) if isinstance(ev, sendstream.Command)]
    assert len(raw) == len(clean) + 39  # the 39 whole commands before the cut, twice
    assert written(sendstream.events(damaged, raw=True)) > written(sendstream.events(data))


def test_healed_events_refuse_a_replay_that_differs() -> None:
    import sendstream
    from sendstream import crc32c

    data = SMALL.read_bytes()
    marks = boundaries(data)
    cut = marks[40]
    # the first WRITE before the cut, with its last data byte changed and its CRC made right again
    i = next(i for i in range(1, 40) if int.from_bytes(data[marks[i] + 4 : marks[i] + 6], "little") == 15)
    start, end = marks[i], marks[i + 1]
    other = bytearray(data)
    other[end - 1] ^= 1
    body = bytearray(other[start:end])
    body[6:10] = bytes(4)
    other[start + 6 : start + 10] = crc32c(bytes(body)).to_bytes(4, "little")
    with pytest.raises(e.ReplayDiverges, match="is not the one written before it") as raised:
        list(sendstream.events(data[:cut] + bytes(other)))
    assert raised.value.offset == cut + start and raised.value.index == i - 1
