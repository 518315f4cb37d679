"""The sans-IO decoder and the writer on real streams and crafted ones."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.streams import END, canon, command_bytes, crafted, decode, random_chunks, u64

from sendstream import Command, Decoder, Encoder, EndOfInput, NeedData, StreamHeader, encode_stream_header
from sendstream import errors as e
from sendstream.codec.backend import Backend
from sendstream.codec.framer import Framer
from sendstream.io.windows import iter_events


def roundtrip(data: bytes, backend: Backend) -> bytes:
    encoder = Encoder()
    decoder = Decoder(backend=backend)
    decoder.receive_data(data)
    decoder.receive_data(b"")
    return b"".join(encoder.send(ev) for ev in decoder.events())


def test_writing_what_we_read_gives_the_same_bytes(stream_path: Path, backend: Backend) -> None:
    data = stream_path.read_bytes()
    assert roundtrip(data, backend=backend) == data


def test_same_events_whole_chunked_and_byte_by_byte(stream_path: Path, backend: Backend) -> None:
    data = stream_path.read_bytes()
    whole = decode(data, backend=backend)
    assert whole[0] == ("hdr", 0, data[13])
    assert whole[-1] == ("eoi", len(data))
    for seed in range(3):
        assert decode(data, random_chunks(seed), backend=backend) == whole
    assert decode(data, iter(lambda: 1, 0), backend=backend) == whole


def test_streams_back_to_back(stream_path: Path, backend: Backend) -> None:
    data = stream_path.read_bytes()
    one = decode(data, backend=backend)
    two = decode(data + data, random_chunks(7), backend=backend)
    headers = [ev for ev in two if ev[0] == "hdr"]
    first_headers = sum(1 for ev in one if ev[0] == "hdr")
    assert len(headers) == 2 * first_headers
    assert headers[first_headers][1] == len(data)
    commands = [ev for ev in two if ev[0] == "cmd"]
    assert [ev[2] for ev in commands] == list(range(len(commands)))
    assert roundtrip(data + data, backend=backend) == data + data


def test_length_is_checked_before_buffering(backend: Backend) -> None:
    decoder = Decoder(max_command_size=100, backend=backend)
    decoder.receive_data(encode_stream_header(2))
    assert isinstance(decoder.next_event(), StreamHeader)
    assert isinstance(decoder.next_event(), NeedData)
    # a header claiming 101 bytes fails at once, without its payload
    decoder.receive_data(b"\x65\x00\x00\x00\x0f\x00\x00\x00\x00\x00")
    with pytest.raises(e.CommandTooLarge) as info:
        decoder.next_event()
    assert (info.value.offset, info.value.index, info.value.actual) == (17, 0, 101)
    # the decoder stays failed
    with pytest.raises(e.CommandTooLarge):
        decoder.next_event()


@pytest.mark.parametrize(("version", "limit"), [(1, 65536), (2, 147456), (3, 147456)])
def test_default_limit_follows_the_version(version: int, limit: int, backend: Backend) -> None:
    data_header = 4 if version == 1 else 2
    ok = command_bytes(15, [(15, b"f"), (18, u64(0)), (19, b"x" * (limit - 17 - data_header))], version)
    assert len(ok) == limit + 10
    assert decode(crafted(version, ok), backend=backend)[1][0] == "cmd"
    too_big = (limit + 1).to_bytes(4, "little") + ok[4:10]
    with pytest.raises(e.CommandTooLarge):
        decode(encode_stream_header(version) + too_big, backend=backend)


def test_unknown_command_is_kept_raw_reported_and_round_trips(backend: Backend) -> None:
    weird = command_bytes(99, [(15, b"x")], 2)
    data = crafted(2, weird)
    decoder = Decoder(backend=backend)
    decoder.receive_data(data)
    decoder.receive_data(b"")
    events = decoder.events()
    cmd = events[1]
    assert isinstance(cmd, Command) and cmd.attributes is None and cmd.name == "unknown(99)"
    assert bytes(cmd.payload or b"") == weird[10:]
    assert [type(p) for p in decoder.framer.problems] == [e.UnknownCommand]
    assert roundtrip(data, backend=backend) == data
    with pytest.raises(e.UnknownCommand) as info:
        decode(data, strict=True, backend=backend)
    assert (info.value.offset, info.value.index, info.value.command) == (17, 0, "unknown(99)")


def test_a_v2_command_in_a_v1_stream_is_unknown(backend: Backend) -> None:
    fallocate = command_bytes(23, [(15, b"f"), (25, b"\0" * 4), (18, u64(0)), (4, u64(1))], 1)
    with pytest.raises(e.UnknownCommand):
        decode(crafted(1, fallocate), strict=True, backend=backend)
    assert decode(crafted(2, fallocate), strict=True, backend=backend)[1][3] == 23


def test_unknown_attribute_is_kept_raw_and_strict_rejects_it(backend: Backend) -> None:
    data = crafted(2, command_bytes(11, [(15, b"f"), (40, b"?")], 2))
    assert roundtrip(data, backend=backend) == data
    with pytest.raises(e.UnknownAttribute) as info:
        decode(data, strict=True, backend=backend)
    assert info.value.offset == 17 + 10 + 5 and info.value.attribute == "unknown(40)"
    # type 0 is never valid either
    with pytest.raises(e.UnknownAttribute):
        decode(crafted(1, command_bytes(11, [(15, b"f"), (0, b"")], 1)), strict=True, backend=backend)


@pytest.mark.parametrize(
    ("attrs", "error", "attribute"),
    [
        ([(15, b"f"), (15, b"g")], e.DuplicateAttribute, "path"),
        ([], e.MissingAttribute, "path"),
        ([(15, b"f"), (3, b"1234")], e.AttributeSize, "ino"),
    ],
)
def test_attribute_errors(
    attrs: list[tuple[int, bytes]], error: type[e.FormatError], attribute: str, backend: Backend
) -> None:
    cmd = 3 if attribute == "ino" else 11
    with pytest.raises(error) as info:
        decode(crafted(1, command_bytes(cmd, attrs, 1)), backend=backend)
    assert info.value.attribute == attribute and info.value.index == 0
    assert "command #0" in str(info.value) and "expected" in str(info.value)


def test_a_tlv_running_past_its_command(backend: Backend) -> None:
    good = command_bytes(11, [(15, b"file")], 1)
    payload = good[10:14] + b"fi"  # the TLV says 4 bytes, 2 follow
    from sendstream.codec.crc import crc32c

    hdr = len(payload).to_bytes(4, "little") + b"\x0b\x00"
    bad = hdr + crc32c(payload, crc32c(hdr + b"\0" * 4)).to_bytes(4, "little") + payload
    with pytest.raises(e.BadAttribute) as info:
        decode(crafted(1, bad), backend=backend)
    assert info.value.offset == 27 and info.value.actual == 4


def test_end_of_input_and_misuse(backend: Backend) -> None:
    with pytest.raises(e.TruncatedStream):
        decode(b"", backend=backend)
    decoder = Decoder(backend=backend)
    decoder.receive_data(b"")
    with pytest.raises(e.UsageError):
        decoder.receive_data(b"x")
    assert isinstance(e.UsageError("x"), e.SendStreamError) and not isinstance(e.UsageError("x"), e.FormatError)


def test_iter_events_reads_a_file(stream_path: Path, backend: Backend) -> None:
    with stream_path.open("rb") as f:
        events = list(iter_events(f, Decoder(backend=backend), chunk_size=4096))
    assert isinstance(events[0], StreamHeader) and isinstance(events[-1], EndOfInput)


def test_encoder_refuses_a_command_outside_a_stream() -> None:
    with pytest.raises(e.UsageError):
        Encoder().send(Command(11, [(15, b"f")]))
    with pytest.raises(e.UsageError):
        Encoder().send(StreamHeader(0, 4))
    assert END in crafted(1)


def test_events_from_a_path_bytes_a_file_and_a_socket(stream_path: Path, backend: Backend) -> None:
    import socket
    import threading

    import sendstream

    data = stream_path.read_bytes()
    expected = [canon(ev) for ev in sendstream.events(stream_path, Framer(backend=backend))]
    assert expected == decode(data, backend=backend)
    assert [canon(ev) for ev in sendstream.events(data, Framer(backend=backend))] == expected
    with stream_path.open("rb") as f:
        assert [canon(ev) for ev in sendstream.events(f, Framer(backend=backend))] == expected
    a, b = socket.socketpair()

    def write() -> None:
        with a:
            a.sendall(data)

    writer = threading.Thread(target=write)
    writer.start()
    with b:
        assert [canon(ev) for ev in sendstream.events(b, Framer(backend=backend))] == expected
    writer.join()
