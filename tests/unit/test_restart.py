"""Restarted sends: detection and repair at every position, on real streams."""

from __future__ import annotations

import io
import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from support.streams import FIXTURES, boundaries, decode, random_chunks

from sendstream import Decoder, Framer, NeedData, verify_file
from sendstream import errors as e
from sendstream.codec.backend import Backend
from sendstream.codec.events import Restart
from sendstream.io.windows import file_events
from sendstream.ops.repair import Healer

SMALL = FIXTURES / "rich-incr-v2.stream"
MAGIC = b"btrfs-stream\0"
PARTS = 4  # the cuts inside commands of a fixture, split so that no one test holds a worker for a minute


def heal(data: bytes, *, keep_last: bool = False, backend: Backend) -> tuple[bytes, list[Restart]]:
    """What ``sendstream repair`` writes, and the restarts it found, from one decode of ``data``."""
    out = io.BytesIO()

    def truncate(n: int) -> None:
        out.seek(n)
        out.truncate(n)

    healer = Healer(out.write, keep_last=keep_last, truncate=truncate, backend=backend)
    framer = Framer(backend=backend)
    for event in file_events(io.BytesIO(data), framer, healer.batch):
        healer.event(event)
    return out.getvalue(), healer.restarts


def repair(data: bytes, *, keep_last: bool = False, backend: Backend) -> bytes:
    return heal(data, keep_last=keep_last, backend=backend)[0]


def repair_through_decoder(data: bytes, seed: int, backend: Backend) -> bytes:
    """The same healing fed by the sans-IO decoder in random chunks."""
    out = io.BytesIO()
    healer = Healer(out.write, backend=backend)
    decoder = Decoder(backend=backend)
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


def restart_events(data: bytes, backend: Backend) -> list[tuple[int, int, int]]:
    return [(ev[1], ev[3], ev[4]) for ev in decode(data, backend=backend) if ev[0] == "restart"]


@pytest.mark.parametrize("name", ["rich-incr-v2", "rich-incr-v1", "compressed-v2", "clone-src-v1"])
def test_restart_at_every_command_boundary(name: str, backend: Backend) -> None:
    data = (FIXTURES / f"{name}.stream").read_bytes()
    version = data[13]
    marks = boundaries(data)
    for i, cut in enumerate(marks[1:-1], start=0):
        # one decode of each damaged copy: the restart it finds and the repair
        healed, restarts = heal(data[:cut] + data, backend=backend)
        assert healed == data
        assert restarts == [Restart(cut, version, i, 0)]
        problem = restarts[0].error(i)
        assert problem.exit_code == e.EXIT_RESTARTED
        assert f"stream restarted at offset {cut} after {i} complete commands; 0 bytes" in str(problem)


@pytest.mark.parametrize("part", range(PARTS))  # every command in one of the parts: they spread over workers
@pytest.mark.parametrize("name", ["rich-incr-v2", "rich-full-v1", "compressed-v2", "two-e-v1", "verity-v3"])
def test_restart_inside_commands(name: str, part: int, backend: Backend) -> None:
    data = (FIXTURES / f"{name}.stream").read_bytes()
    version = data[13]
    marks = boundaries(data)
    commands = list(itertools.pairwise(marks[1:]))
    for i, (start, end) in enumerate(commands):
        if i % PARTS != part:
            continue
        for cut in sorted({start + 1, start + 4, start + 9, start + 10, (start + end) // 2, end - 1}):
            if not start < cut < end:
                continue
            healed, restarts = heal(data[:cut] + data, backend=backend)  # one decode of each damaged copy
            if data[cut:end] == MAGIC[: end - cut]:
                # the header's first bytes happen to complete the command: it is whole
                assert restarts == [Restart(cut, version, i + 1, 0)], (i, cut)
            else:
                assert restarts == [Restart(cut, version, i, cut - start)], (i, cut)
            assert healed == data, (i, cut)
    # inside the first command and just before END are among them
    assert commands[0][0] == 17 and data[commands[-1][0] + 4] == 21 and len(commands) > PARTS


def test_two_restarts_and_a_restart_during_the_replay(backend: Backend) -> None:
    data = SMALL.read_bytes()
    marks = boundaries(data)
    a, b = marks[40] + 7, marks[12] + 3
    damaged = data[:a] + data[:b] + data
    assert [r[0] for r in restart_events(damaged, backend=backend)] == [a, a + b]
    assert repair(damaged, backend=backend) == data
    for seed in range(3):
        assert repair_through_decoder(damaged, seed, backend=backend) == data


def test_repair_of_a_clean_stream_is_a_copy(stream_path: Path, backend: Backend) -> None:
    data = stream_path.read_bytes()
    assert repair(data, backend=backend) == data


def test_a_diverging_replay_is_refused_unless_keep_last(backend: Backend) -> None:
    data = SMALL.read_bytes()
    other = (FIXTURES / "rich-full-v2.stream").read_bytes()
    cut = boundaries(data)[30] + 5
    damaged = data[:cut] + other
    with pytest.raises(e.ReplayDiverges) as info:
        repair(damaged, backend=backend)
    assert info.value.index == 0 and info.value.offset == cut + 17
    assert "command #0 of length" in str(info.value)
    assert repair(damaged, keep_last=True, backend=backend) == other


def test_a_replay_of_another_version_is_refused(backend: Backend) -> None:
    v2 = SMALL.read_bytes()
    v1 = (FIXTURES / "rich-incr-v1.stream").read_bytes()
    with pytest.raises(e.ReplayDiverges):
        repair(v2[: boundaries(v2)[3]] + v1, backend=backend)


def test_truncated_replays(backend: Backend) -> None:
    data = SMALL.read_bytes()
    marks = boundaries(data)
    cut = marks[50] + 20
    for replayed in (marks[1], marks[10], marks[49], marks[50] + 3):
        damaged = data[:cut] + data[:replayed]
        with pytest.raises(e.TruncatedStream):
            repair(damaged, backend=backend)


@pytest.mark.parametrize("keep", [4, 8, 12, 16])
def test_a_header_only_partly_present_at_the_end(keep: int, backend: Backend) -> None:
    data = SMALL.read_bytes()
    cut = boundaries(data)[20] + 6
    damaged = data[:cut] + data[:keep]
    with pytest.raises(e.TruncatedStream) as info:
        decode(damaged, backend=backend)
    assert "restarted stream" in str(info.value)


def test_a_header_right_after_end_is_the_next_stream_not_a_restart(backend: Backend) -> None:
    data = (FIXTURES / "two-concat-v2.stream").read_bytes()
    assert restart_events(data, backend=backend) == []
    assert verify_file(io.BytesIO(data), backend=backend).ok


def test_copy_range_passes_checked_input_ranges_on(backend: Backend) -> None:
    """What the kTLS sender sends with sendfile: input ranges instead of bytes."""
    data = SMALL.read_bytes()
    damaged = data[: boundaries(data)[30] + 9] + data
    out = io.BytesIO()

    def copy_range(offset: int, length: int) -> None:
        out.write(damaged[offset : offset + length])

    healer = Healer(out.write, copy_range=copy_range, backend=backend)
    for event in file_events(io.BytesIO(damaged), Framer(backend=backend), healer.batch):
        healer.event(event)
    assert out.getvalue() == data and healer.written == len(data)


def test_events_of_a_restarted_stream_are_healed_unless_raw(backend: Backend) -> None:
    """A script that counts what writes write counts each byte once: the replay is dropped, the
    Restart still said; raw=True gives the input as it is."""
    import sendstream

    data = SMALL.read_bytes()
    marks = boundaries(data)
    cut = marks[40] + 7  # inside command 39: a partial command, then the whole stream again
    damaged = data[:cut] + data

    def written(events: Iterable[object]) -> int:
        return sum(len(ev.get("data")) for ev in events if isinstance(ev, sendstream.Command) and ev.name == "write")

    def events(source: bytes, raw: bool = False) -> Iterator[sendstream.Event]:
        return sendstream.events(source, Framer(backend=backend), raw=raw)

    clean = [ev for ev in events(data) if isinstance(ev, sendstream.Command)]
    healed = list(events(damaged))
    assert [type(ev).__name__ for ev in healed].count("Restart") == 1
    commands = [ev for ev in healed if isinstance(ev, sendstream.Command)]
    assert [(c.name, c.crc) for c in commands] == [(c.name, c.crc) for c in clean]
    assert written(events(damaged)) == written(events(data))
    raw = [ev for ev in events(damaged, raw=True) if isinstance(ev, sendstream.Command)]
    assert len(raw) == len(clean) + 39  # the 39 whole commands before the cut, twice
    assert written(events(damaged, raw=True)) > written(events(data))


def test_healed_events_refuse_a_replay_that_differs(backend: Backend) -> None:
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
        list(sendstream.events(data[:cut] + bytes(other), Framer(backend=backend)))
    assert raised.value.offset == cut + start and raised.value.index == i - 1
