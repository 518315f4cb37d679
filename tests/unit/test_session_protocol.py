"""The session protocol's state machines, without sockets: real bytes in, events out.

Every conversation is fed whole, byte by byte and in seeded random chunks;
every frame and line is cut at every position (the part gives no event,
the rest completes it); the sender's and the receiver's machines talk to
each other; hostile bytes raise our SessionError naming what was expected.
"""

from __future__ import annotations

import random
import struct
from collections.abc import Iterable

import pytest
from support.streams import FIXTURES

from sendstream.errors import SessionError, SessionMisuse
from sendstream.session.messages import MAX_LINE
from sendstream.session.protocol import (
    MAX_FRAME,
    MAX_REASON,
    PREFIX_SIZE,
    RAW_MAGIC,
    Abort,
    Ack,
    Answer,
    Bye,
    CompressAnswer,
    CompressOffer,
    Data,
    End,
    Event,
    Hello,
    Listed,
    ListRequest,
    RawStream,
    ReceiverConnection,
    ReceiverState,
    SenderConnection,
    SenderState,
    Status,
    data_frames,
    encode,
    listed_line,
    status_line,
)
from sendstream.transfer.identity import stream_identity

STREAM = (FIXTURES / "rich-full-v2.stream").read_bytes()
IDENTITY = stream_identity(STREAM[:PREFIX_SIZE])
SEED = 12
Machine = ReceiverConnection | SenderConnection


def chunked(data: bytes, how: str) -> Iterable[bytes]:
    """``data`` whole, byte by byte, or in seeded random chunks of 1 to 3000 bytes."""
    if how == "whole":
        yield data
    elif how == "bytes":
        yield from (data[i : i + 1] for i in range(len(data)))
    else:
        rng, i = random.Random(f"{SEED}-{len(data)}"), 0
        while i < len(data):
            n = rng.randint(1, 3000)
            yield data[i : i + n]
            i += n


def feed(machine: Machine, pieces: Iterable[bytes]) -> list[Event]:
    """The events of ``pieces``, with adjacent Data merged into one (as bytes): comparable however the bytes came."""
    events: list[Event] = []
    for piece in pieces:
        for event in machine.receive_data(piece):
            if isinstance(event, Data):
                payload = bytes(event.payload)
                if events and isinstance(last := events[-1], Data):
                    payload = bytes(last.payload) + payload
                    events.pop()
                event = Data(memoryview(payload))
            events.append(event)
    return events


def receiver(verified: int = 0, resume: int = 0) -> ReceiverConnection:
    """A receiver machine past the hello of :data:`IDENTITY`, that answered ``(verified, resume)``."""
    machine = ReceiverConnection()
    assert machine.receive_data(encode(Hello(IDENTITY))) == [Hello(IDENTITY)]
    machine.send(Answer(verified, resume))
    return machine


def sender(*, listing: bool = False) -> SenderConnection:
    """A sender machine that said its hello (or, ``listing``, asked for its list)."""
    machine = SenderConnection()
    machine.send(ListRequest() if listing else Hello(IDENTITY))
    return machine


def frames(data: bytes, size: int) -> bytes:
    """``data`` as D frames of at most ``size`` bytes, then E."""
    out = b"".join(encode(Data(memoryview(data[i : i + size]))) for i in range(0, len(data), size))
    return out + encode(End(len(data)))


# --- the sender's bytes at the receiver -----------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["whole", "bytes", "random"])
def test_a_whole_session_at_the_receiver(how: str) -> None:
    data = STREAM[:50_000]
    hello, wire = encode(Hello(IDENTITY)), frames(data, 7001)
    machine = ReceiverConnection()
    events = feed(machine, chunked(hello, how))
    machine.send(Answer(0, 0))
    events += feed(machine, chunked(wire, how))
    assert events == [Hello(IDENTITY), Data(memoryview(data)), End(len(data))]
    assert machine.offset == len(data)


@pytest.mark.parametrize("how", ["whole", "bytes", "random"])
def test_a_raw_stream_is_data_from_its_first_byte(how: str) -> None:
    data = STREAM[:20_000]
    assert data.startswith(RAW_MAGIC)
    assert feed(ReceiverConnection(), chunked(data, how)) == [RawStream(), Data(memoryview(data))]


def test_a_resumed_session_counts_from_where_the_receiver_resumes() -> None:
    machine = receiver(100, 200)
    assert feed(machine, [encode(Data(memoryview(STREAM[200:300]))), encode(End(300))]) == [
        Data(memoryview(STREAM[200:300])),
        End(300),
    ]


def test_an_abort_gives_its_reason_and_drops_what_is_over_the_limit() -> None:
    long = b"r" * (MAX_REASON + 500)
    wire = struct.pack(">cI", b"X", len(long)) + long + encode(End(0))
    for how in ("whole", "bytes", "random"):
        assert feed(receiver(), chunked(wire, how)) == [Abort("r" * MAX_REASON), End(0)]
    assert feed(receiver(), [encode(Abort("bad \x1b crc"))]) == [Abort("bad \\x1b crc")]


def test_after_the_status_frames_in_flight_are_dropped_until_the_bye() -> None:
    machine = receiver()
    assert machine.send(Status(0, "ok")) == b"sendstream-status 0 ok\n"
    wire = encode(Data(memoryview(b"late" * 1000))) + encode(End(12345)) + encode(Bye())
    for how in ("whole", "bytes", "random"):
        machine = receiver()
        machine.send(Status(0, "ok"))
        assert feed(machine, chunked(wire + b"whatever follows", how)) == [Bye()]
        assert machine.payload_left == 0


# --- the receiver's lines at the sender -----------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["whole", "bytes", "random"])
def test_answer_acks_and_status_at_the_sender(how: str) -> None:
    wire = encode(Answer(10, 20)) + b"".join(encode(Ack(v)) for v in (30, 4 << 20, 1 << 40))
    wire += status_line(3, "truncated\nstream") + b"ignored after the status"
    assert feed(sender(), chunked(wire, how)) == [
        Answer(10, 20),
        Ack(30),
        Ack(4 << 20),
        Ack(1 << 40),
        Status(3, "truncated\\nstream"),
    ]


def test_a_receiver_that_finished_answers_the_hello_with_its_status() -> None:
    assert feed(sender(), [b"sendstream-status 0 ok\n"]) == [Status(0, "ok")]


# --- both machines talking ------------------------------------------------------------------------------------------


def test_sender_and_receiver_machines_against_each_other() -> None:
    rng = random.Random(SEED)
    sender_, receiver_ = SenderConnection(), ReceiverConnection()
    to_receiver, to_sender = bytearray(), bytearray()

    def deliver(wire: bytearray, machine: Machine) -> list[Event]:
        """What has been sent so far, in random pieces."""
        events = feed(machine, chunked(bytes(wire), "random" if rng.random() < 0.5 else "bytes"))
        wire.clear()
        return events

    to_receiver += sender_.send(Hello(IDENTITY))
    assert deliver(to_receiver, receiver_) == [Hello(IDENTITY)]
    to_sender += receiver_.send(Answer(0, 0))
    assert deliver(to_sender, sender_) == [Answer(0, 0)]
    got = bytearray()
    offset = 0
    while offset < len(STREAM):
        n = rng.randint(1, 40_000)
        to_receiver += sender_.send(Data(memoryview(STREAM[offset : offset + n])))
        offset += n
        for event in deliver(to_receiver, receiver_):
            assert isinstance(event, Data)
            got += event.payload
        to_sender += receiver_.send(Ack(len(got)))
        assert deliver(to_sender, sender_) == [Ack(len(got))]
    to_receiver += sender_.send(End(len(STREAM)))
    assert deliver(to_receiver, receiver_) == [End(len(STREAM))]
    to_sender += receiver_.send(Status(0, "ok"))
    assert deliver(to_sender, sender_) == [Status(0, "ok")]
    to_receiver += sender_.send(Bye())
    assert deliver(to_receiver, receiver_) == [Bye()]
    assert bytes(got) == STREAM


def test_a_frame_longer_than_the_limit_is_split() -> None:
    pieces = data_frames(bytes(MAX_FRAME + 10))
    assert [len(p) for p in pieces] == [5 + MAX_FRAME, 5 + 10]
    assert feed(receiver(), pieces) == [Data(memoryview(bytes(MAX_FRAME + 10)))]


# --- every unit cut at every position -------------------------------------------------------------------------------

UNITS: dict[str, tuple[bytes, list[Event]]] = {
    "end": (encode(End(0)), [End(0)]),
    "abort": (encode(Abort("gave up")), [Abort("gave up")]),
    "data header": (struct.pack(">cI", b"D", 0), []),
}


@pytest.mark.parametrize("unit", UNITS, ids=UNITS.keys())
def test_a_frame_cut_anywhere_gives_nothing_until_its_rest_comes(unit: str) -> None:
    wire, events = UNITS[unit]
    for cut in range(1, len(wire)):
        machine = receiver()
        assert machine.receive_data(wire[:cut]) == [], cut
        assert feed(machine, [wire[cut:]]) == events, cut


def test_a_data_frame_cut_anywhere_gives_its_bytes_as_they_come() -> None:
    payload = STREAM[:300]
    wire = encode(Data(memoryview(payload))) + encode(End(len(payload)))
    for cut in range(len(wire) + 1):
        machine = receiver()
        came = min(cut, 5 + len(payload)) - 5  # of the payload, in the first part
        whole = [End(len(payload))] if cut == len(wire) else []
        assert feed(machine, [wire[:cut]]) == ([Data(memoryview(payload[:came]))] if came > 0 else []) + whole, cut
        assert feed(receiver(), [wire[:cut], wire[cut:]]) == [Data(memoryview(payload)), End(len(payload))], cut


def test_the_hello_cut_anywhere_gives_nothing_until_its_rest_comes() -> None:
    wire = encode(Hello(IDENTITY))
    for cut in range(1, len(wire)):
        machine = ReceiverConnection()
        assert machine.receive_data(wire[:cut]) == [], cut
        assert machine.receive_data(wire[cut:]) == [Hello(IDENTITY)], cut


def test_every_line_cut_anywhere_gives_nothing_until_its_rest_comes() -> None:
    answer, ack, status = encode(Answer(5, 7)), encode(Ack(99)), status_bytes()
    for line, before, event in [(answer, b"", Answer(5, 7)), (ack, answer, Ack(99)), (status, answer, Status(1, "no"))]:
        for cut in range(1, len(line)):
            machine = sender()
            machine.receive_data(before)
            assert machine.receive_data(line[:cut]) == [], (line, cut)
            assert machine.receive_data(line[cut:]) == [event], (line, cut)


def status_bytes() -> bytes:
    return encode(Status(1, "no"))


# --- hostile bytes --------------------------------------------------------------------------------------------------

HOSTILE_AT_THE_RECEIVER = {
    "garbage first": (b"GET / HTTP/1.1\r\n\r\n", "nor a compression offer: b'GET / HTTP/1.1"),
    "bad JSON": (b"sendstream-session 1 {bad\n", "the session hello is not valid JSON"),
    "over-long hello": (b"sendstream-session 1 " + b"x" * MAX_LINE, f"longer than {MAX_LINE} bytes"),
    "another version": (b"sendstream-session 2 {}\n", "speaks session protocol version b'2', this end version 1"),
}


@pytest.mark.parametrize(("wire", "says"), HOSTILE_AT_THE_RECEIVER.values(), ids=HOSTILE_AT_THE_RECEIVER.keys())
def test_hostile_first_words_raise_our_error(wire: bytes, says: str) -> None:
    for how in ("whole", "random"):
        machine = ReceiverConnection()
        with pytest.raises(SessionError, match=says.replace("(", r"\(")):
            feed(machine, chunked(wire, how))
        with pytest.raises(SessionError, match=says.replace("(", r"\(")):  # and it stays failed
            machine.receive_data(b"\n")


HOSTILE_FRAMES = {
    "a frame over the limit": (struct.pack(">cI", b"D", MAX_FRAME + 1), f"expected at most {MAX_FRAME}"),
    "an unknown frame type": (b"Q", "unexpected frame type b'Q' at offset 0; expected D, E or X"),
    "a bye before the status": (b"B", "unexpected frame type b'B' at offset 0; expected D, E or X"),
    "an end at another offset": (encode(End(5)), "the sender ended at 5 bytes, 0 received"),
}


@pytest.mark.parametrize(("wire", "says"), HOSTILE_FRAMES.values(), ids=HOSTILE_FRAMES.keys())
def test_hostile_frames_raise_our_error(wire: bytes, says: str) -> None:
    with pytest.raises(SessionError, match=says.replace("(", r"\(")):
        feed(receiver(), chunked(wire, "bytes"))


def test_the_frame_limit_is_checked_before_the_payload_comes() -> None:
    machine = receiver()
    assert machine.receive_data(struct.pack(">cI", b"D", MAX_FRAME)) == []  # at the limit: taken
    assert machine.payload_left == MAX_FRAME


def test_a_line_of_the_limit_is_taken_and_one_byte_more_is_not() -> None:
    hello = encode(Hello(IDENTITY))
    padded = hello[:-1] + b" " * (MAX_LINE - len(hello)) + b"\n"
    assert len(padded) == MAX_LINE
    assert ReceiverConnection().receive_data(padded) == [Hello(IDENTITY)]
    with pytest.raises(SessionError, match=f"longer than {MAX_LINE} bytes"):
        ReceiverConnection().receive_data(padded[:-1] + b" \n")
    machine = sender()
    assert machine.receive_data(b"a" * (MAX_LINE - 1)) == []  # kept: no newline yet, not over the limit
    with pytest.raises(SessionError, match=f"longer than {MAX_LINE} bytes"):
        machine.receive_data(b"a")


HOSTILE_AT_THE_SENDER = {
    "bad JSON": (b"sendstream-session 1 {bad\n", "the receiver's answer is not valid JSON"),
    "not the protocol": (b"HTTP/1.1 200 OK\n", "the receiver does not speak the session protocol"),
    "over-long line": (b"x" * (MAX_LINE + 1), f"longer than {MAX_LINE} bytes"),
    "a bad status": ("sendstream-status ² failed\n".encode(), "malformed status line"),
    "an unexpected line": (encode(Answer(0, 0)) + b"hello\n", "expected an ack or a status"),
    "a malformed ack": (encode(Answer(0, 0)) + b"ack -1\n", "malformed acknowledgement"),
}


@pytest.mark.parametrize(("wire", "says"), HOSTILE_AT_THE_SENDER.values(), ids=HOSTILE_AT_THE_SENDER.keys())
def test_hostile_lines_raise_our_error_at_the_sender(wire: bytes, says: str) -> None:
    for how in ("whole", "random"):
        with pytest.raises(SessionError, match=says):
            feed(sender(), chunked(wire, how))


def test_payload_a_driver_received_in_place_counts_as_its_data() -> None:
    machine = receiver()
    assert machine.receive_data(struct.pack(">cI", b"D", 10)) == []
    assert machine.payload_left == 10
    machine.payload_received(4)
    assert machine.payload_left == 6
    assert feed(machine, [b"x" * 6 + encode(End(10))]) == [Data(memoryview(b"x" * 6)), End(10)]


# --- each machine takes only what its end asked for ------------------------------------------------------------------

SNAPSHOT = {"name": "home.20261201", "uuid": IDENTITY["uuid"], "ctransid": 7, "parent_uuid": None}

NOT_ASKED = {
    # a sender of a stream said its hello: a list is no answer to it, before or after the session's answer
    "a list line for the hello": (False, listed_line(SNAPSHOT), "a snapshot of a list, which a sender of a stream"),
    "a list line after the answer": (
        False,
        encode(Answer(0, 0)) + listed_line(SNAPSHOT),
        "a snapshot of a list, which a sender of a stream does not ask for; expected an ack or a status",
    ),
    # a client asked for its list: a session's answer or an ack is no answer to that
    "an answer for the list": (True, encode(Answer(0, 0)), "expected a snapshot of the list or a status"),
    "an ack for the list": (True, listed_line(SNAPSHOT) + b"ack 5\n", "expected a snapshot of the list or a status"),
}


@pytest.mark.parametrize(("listing", "wire", "says"), NOT_ASKED.values(), ids=NOT_ASKED.keys())
@pytest.mark.parametrize("how", ["whole", "bytes", "random"])
def test_an_answer_the_machine_did_not_ask_for_is_the_peers_protocol_error(
    listing: bool, wire: bytes, says: str, how: str
) -> None:
    machine = sender(listing=listing)
    with pytest.raises(SessionError, match=says):
        feed(machine, chunked(wire, how))
    with pytest.raises(SessionError, match=says):  # and it stays failed
        machine.receive_data(status_line(0, "ok"))


@pytest.mark.parametrize("how", ["whole", "bytes", "random"])
def test_a_listing_takes_snapshots_then_the_status(how: str) -> None:
    wire = listed_line(SNAPSHOT) + listed_line({**SNAPSHOT, "ctransid": 9}) + status_line(0, "2 snapshots")
    assert feed(sender(listing=True), chunked(wire, how)) == [
        Listed(SNAPSHOT),
        Listed({**SNAPSHOT, "ctransid": 9}),
        Status(0, "2 snapshots"),
    ]


# --- this end out of turn is the caller's misuse, never the peer's error ---------------------------------------------


def raw_sender() -> SenderConnection:
    """A sender machine that sends a raw stream: it waits for the status."""
    machine = SenderConnection()
    assert machine.send(RawStream()) == b""  # the stream's own header says it
    return machine


MISUSE: dict[str, tuple[Machine, Event, str]] = {
    "frames before the answer": (sender(), Data(memoryview(b"x")), "frames follow the answer to the hello"),
    "a second hello": (sender(), Hello(IDENTITY), "cannot send Hello in state greeted"),
    "a bye before the status": (sender(), Bye(), "a bye follows the receiver's status"),
    "a hello after a list request": (sender(listing=True), Hello(IDENTITY), "cannot send Hello in state listing"),
    "an end before the hello": (SenderConnection(), End(0), "frames follow the answer to the hello"),
    "an answer to no hello": (ReceiverConnection(), Answer(0, 0), "no hello to answer"),
    "an ack before the answer": (ReceiverConnection(), Ack(0), "no hello was answered"),
    "a list nobody asked for": (receiver(), Listed(SNAPSHOT), "no list was asked for"),
    "an answer to an offer not made": (receiver(), CompressAnswer("zstd"), "no compression offer to answer"),
    "an offer after the hello": (sender(), CompressOffer("zstd"), "an offer to compress comes first, once"),
}


@pytest.mark.parametrize(("machine", "event", "says"), MISUSE.values(), ids=MISUSE.keys())
def test_an_event_out_of_turn_is_a_local_misuse_that_moves_nothing(machine: Machine, event: Event, says: str) -> None:
    states = machine.sender_state, machine.receiver_state
    with pytest.raises(SessionMisuse, match=says):
        machine.send(event)
    assert (machine.sender_state, machine.receiver_state) == states


def test_after_its_status_the_receiver_says_nothing_more() -> None:
    machine = receiver()
    machine.send(Ack(0))
    machine.send(Status(0, "ok"))
    for event in (Ack(0), Status(0, "again"), Listed(SNAPSHOT)):
        with pytest.raises(SessionMisuse, match="in state closed"):
            machine.send(event)


def test_the_sender_machine_knows_what_it_asked_for() -> None:
    """A list request makes the receiver owe a list, a hello an answer, a raw stream a status; an offer an
    answer first, and then the first words, without a second offer."""
    asked: list[tuple[Event, ReceiverState]] = [
        (Hello(IDENTITY), ReceiverState.HELLO),
        (ListRequest(), ReceiverState.LISTING),
        (RawStream(), ReceiverState.RAW),
    ]
    for first, owed in asked:
        machine = SenderConnection()
        machine.send(first)
        assert machine.receiver_state is owed
    machine = SenderConnection()
    assert machine.send(CompressOffer("zstd")) == b"sendstream-compress zstd\n"
    assert machine.receive_data(b"sendstream-compress none\n") == [CompressAnswer("none")]
    assert machine.sender_state is SenderState.READY
    with pytest.raises(SessionMisuse, match="an offer to compress comes first, once"):
        machine.send(CompressOffer("zstd"))
    assert machine.send(Hello(IDENTITY)) == encode(Hello(IDENTITY))


PEER_OUT_OF_TURN: dict[str, tuple[Machine, bytes, str]] = {
    "more than a line before the answer": (
        ReceiverConnection(),
        encode(Hello(IDENTITY)) + encode(Data(memoryview(bytes(MAX_LINE)))),
        f"the sender sent more than {MAX_LINE} bytes before the answer to its hello",
    ),
    "a line nobody asked for": (SenderConnection(), encode(Answer(0, 0)), "expected nothing"),
    "an ack to a raw stream": (raw_sender(), encode(Ack(5)), "malformed status line"),
    "frames after the end": (receiver(), encode(End(0)) + encode(End(0)), "expected nothing"),
}


@pytest.mark.parametrize("how", ["whole", "bytes", "random"])
def test_frames_sent_before_the_answer_wait_for_it(how: str) -> None:
    """A sender that does not wait for the answer: its frames are read once the receiver answered (from
    the offset the answer names), never before, and a driver receives nothing in place meanwhile."""
    data = STREAM[:3000]
    machine = ReceiverConnection()
    events = feed(machine, chunked(encode(Hello(IDENTITY)) + frames(data, 1000), how))
    assert events == [Hello(IDENTITY)] and not machine.early and machine.payload_left == 0
    machine.send(Answer(0, 0))
    assert machine.early and machine.payload_left == 0
    assert feed(machine, [b""]) == [Data(memoryview(data)), End(len(data))]
    assert not machine.early


@pytest.mark.parametrize(("machine", "wire", "says"), PEER_OUT_OF_TURN.values(), ids=PEER_OUT_OF_TURN.keys())
def test_the_peer_out_of_turn_is_the_peers_session_error(machine: Machine, wire: bytes, says: str) -> None:
    with pytest.raises(SessionError, match=says) as raised:
        machine.receive_data(wire)
    assert not isinstance(raised.value, SessionMisuse)
