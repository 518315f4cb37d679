"""Property-based round trips and a fuzz harness for the decoder.

The fuzz rule (as h11's): any input parses, or raises our FormatError.
"""

from __future__ import annotations

import contextlib
import io

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.strategies import commands
from support.streams import STREAMS, crafted, decode

from sendstream import Command, Decoder, Encoder, FormatError, encode_command, verify_file
from sendstream.codec.backend import Backend


@settings(deadline=None)
@given(st.data())
def test_generated_commands_round_trip(backend: Backend, data: st.DataObject) -> None:
    version = data.draw(st.sampled_from([1, 2, 3]))
    cmds = data.draw(st.lists(commands(version), min_size=1, max_size=8))
    stream = crafted(version, *(encode_command(c, version) for c in cmds))
    decoder = Decoder(strict=True, backend=backend)
    decoder.receive_data(stream)
    decoder.receive_data(b"")
    events = decoder.events()
    got = [ev for ev in events if isinstance(ev, Command) and ev.name != "end"]
    assert got == cmds
    for mine, theirs in zip(got, cmds, strict=True):
        assert mine.values() == theirs.values()
    encoder = Encoder()
    assert b"".join(encoder.send(ev) for ev in events) == stream
    assert verify_file(io.BytesIO(stream), backend=backend).ok


SEEDS = [p.read_bytes()[:4000] for p in STREAMS[:4]]


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from(SEEDS),
    st.lists(st.tuples(st.integers(0, 3999), st.integers(0, 255)), max_size=6),
    st.binary(max_size=64),
    st.integers(1, 4000),
)
def test_fuzz_decoder_parses_or_raises_our_error(
    backend: Backend, seed: bytes, edits: list[tuple[int, int]], tail: bytes, cut: int
) -> None:
    data = bytearray(seed[:cut])
    for pos, value in edits:
        if pos < len(data):
            data[pos] = value
    data += tail
    for strict in (False, True):
        try:
            decode(bytes(data), strict=strict, backend=backend)
        except FormatError as err:
            assert err.offset is not None and 0 <= err.offset <= len(data)
    report = verify_file(io.BytesIO(bytes(data)), backend=backend)
    assert all(isinstance(p, FormatError) for p in report.problems)


@settings(deadline=None)
@given(st.binary(max_size=200))
def test_fuzz_arbitrary_bytes_after_a_header(backend: Backend, raw: bytes) -> None:
    for version in (1, 2, 3):
        data = b"btrfs-stream\0" + bytes([version, 0, 0, 0]) + raw
        with contextlib.suppress(FormatError):
            decode(data, backend=backend)
