"""What a resumable sender decides across connections (:mod:`sendstream.session.resume`), in-process and
byte by byte: the machines of both ends talk through bytes handed over by hand, a connection is dropped
by handing over only part of them, and the next connection's answer says where the sender resumes.
No socket, thread or clock.
"""

from __future__ import annotations

import pytest
from support.streams import FIXTURES, partial_identity

from sendstream.errors import ResumeError, SessionError
from sendstream.session.protocol import (
    PREFIX_SIZE,
    Ack,
    Answer,
    Data,
    End,
    Event,
    Hello,
    ReceiverConnection,
    SenderConnection,
    Status,
)
from sendstream.session.resume import PIECE_SIZE, Resume, Resumption
from sendstream.transfer.identity import stream_identity
from sendstream.transfer.ledger import Checkpoint

STREAM = (FIXTURES / "rich-full-v2.stream").read_bytes()
IDENTITY = stream_identity(STREAM[:PREFIX_SIZE])
OTHER = (FIXTURES / "rich-incr-v2.stream").read_bytes()
LEDGER = (7, "ab" * 32)


def taken(plan: Resumption, data: bytes, piece: int = PIECE_SIZE) -> None:
    """``data`` given to ``plan`` as a driver gives it: in pieces, what is to be sent held."""
    for start in range(0, len(data), piece):
        plan.hold(plan.take(data[start : start + piece]))


class Receiver:
    """A receiver across connections: what it got of the stream, verified as it came."""

    def __init__(self, start: int = 0) -> None:
        self.got = bytearray(STREAM[:start])
        self.machine = ReceiverConnection()
        self.ended = False

    def connection(self, hello: bytes) -> bytes:
        """A new connection's hello: the answer (it verified and resumes where its bytes end)."""
        self.machine = ReceiverConnection()
        [event] = self.machine.receive_data(hello)
        assert isinstance(event, Hello)
        return self.machine.send(Answer(len(self.got), len(self.got)))

    def take(self, wire: bytes) -> None:
        for event in self.machine.receive_data(wire):
            if isinstance(event, Data):
                self.got += event.payload
            else:
                self.ended = event == End(len(self.got))


def connect(plan: Resumption, receiver: Receiver) -> tuple[SenderConnection, Resume]:
    """A new connection: the hello, the receiver's answer, and what the plan makes of it."""
    machine = SenderConnection()
    answer = machine.receive_data(receiver.connection(machine.send(Hello(plan.identify()))))
    assert len(answer) == 1 and isinstance(answer[0], Answer)
    return machine, plan.answered(answer[0])


def resend(plan: Resumption, machine: SenderConnection, resume: Resume) -> bytes:
    """What the driver sends on a connection: the held bytes from the answer's offset on, then the end."""
    frames = b"".join(machine.send(Data(piece)) for piece in plan.held.since(resume.offset))
    return frames + machine.send(End(plan.written))


def payload_before(cut: int, size: int) -> int:
    """How many stream bytes the first ``cut`` bytes of a resend of ``size`` bytes carry (one 5-byte frame
    header per piece)."""
    pos = had = 0
    for piece in [PIECE_SIZE] * (size // PIECE_SIZE) + [size % PIECE_SIZE]:
        had += max(min(cut - pos - 5, piece), 0)
        pos += 5 + piece
    return had


# Where the first connection drops, in its bytes: in the first frame's header, its payload, between frames,
# in the last frame, in the end.
CUTS = [0, 1, 4, 5, 6, 1000, PIECE_SIZE + 4, PIECE_SIZE + 5, PIECE_SIZE + 6, 3 * (PIECE_SIZE + 5) + 17]


@pytest.mark.parametrize("cut", [*CUTS, -9, -1])
def test_a_drop_anywhere_resumes_where_the_receiver_stands(cut: int) -> None:
    data = STREAM[: 4 * PIECE_SIZE + 321]
    plan, receiver = Resumption(), Receiver()
    taken(plan, data)
    machine, first = connect(plan, receiver)
    assert first == Resume(0)
    wire = resend(plan, machine, first)
    receiver.take(wire[:cut])  # the rest is lost with the connection
    had = len(receiver.got)
    assert not receiver.ended and had == payload_before(cut % len(wire), len(data)), "each frame's bytes as they came"
    machine, again = connect(plan, receiver)
    assert again.offset == had, "the sender resumes where the receiver's answer says"
    assert again.note.endswith(f"resuming at offset {had} ({len(data) - had:,} resent)")
    receiver.take(resend(plan, machine, again))
    assert receiver.ended and bytes(receiver.got) == data
    assert (plan.reconnects, plan.resent) == (1, len(data) - had)


def test_acks_let_go_of_what_was_verified_and_a_resume_before_it_is_refused() -> None:
    plan, receiver = Resumption(), Receiver()
    taken(plan, STREAM[:5000], piece=1000)
    machine, resume = connect(plan, receiver)
    receiver.take(resend(plan, machine, resume)[:2500])
    for event in machine.receive_data(receiver.machine.send(Ack(2000))):
        assert event == Ack(2000)
        assert plan.acked_to(event.verified)
    assert (plan.acked, plan.held.base) == (2000, 2000)
    assert not plan.acked_to(1500), "an older ack lets nothing go"
    with pytest.raises(SessionError, match="the receiver acknowledged 5001 bytes of the 5000 sent"):
        plan.acked_to(5001)
    with pytest.raises(SessionError, match="resume at offset 1000, before offset 2000, which is no longer held"):
        plan.answered(Answer(1000, 1000))


def test_a_token_sends_only_what_follows_its_offset() -> None:
    skip = 3 * PIECE_SIZE + 11
    plan, receiver = Resumption(skip_to=skip, stream=IDENTITY), Receiver(start=skip)
    taken(plan, STREAM[: 4 * PIECE_SIZE])
    assert plan.held.base == skip and plan.written == 4 * PIECE_SIZE
    machine, resume = connect(plan, receiver)
    assert resume == Resume(skip)
    receiver.take(resend(plan, machine, resume))
    assert receiver.ended and bytes(receiver.got) == STREAM[: 4 * PIECE_SIZE]
    assert (plan.reconnects, plan.resent, plan.skip_to) == (0, 0, skip)


def test_a_receiver_ahead_of_the_token_is_caught_up_with() -> None:
    """A receiver still running got further with the sender before this one: skip to where it stands."""
    plan = Resumption(skip_to=1000, stream=IDENTITY)
    taken(plan, STREAM[:PREFIX_SIZE])
    assert plan.answered(Answer(90_000, 100_000)) == Resume(100_000)
    assert (plan.skip_to, plan.acked, plan.held.base) == (100_000, 90_000, 100_000)
    assert not plan.acked_to(90_000), "an ack of what the receiver had is no ack of bytes not sent"
    taken(plan, STREAM[PREFIX_SIZE:110_000])
    assert b"".join(plan.held.since(100_000)) == STREAM[100_000:110_000]


def test_a_receiver_that_kept_an_earlier_run_names_the_checkpoint_to_check() -> None:
    plan = Resumption(checks_kept=True)
    taken(plan, STREAM[:PREFIX_SIZE])
    resume = plan.answered(Answer(70_000, 80_000, LEDGER))
    assert resume == Resume(
        80_000,
        Checkpoint(IDENTITY, 80_000, *LEDGER),
        "session: the receiver kept 80000 bytes of an earlier run; resuming there",
    )
    without = Resumption()  # a driver that cannot check it does not skip to it
    taken(without, STREAM[:PREFIX_SIZE])
    with pytest.raises(SessionError, match="already has 80,000 bytes of a transfer and this sender has sent 65,536"):
        without.answered(Answer(70_000, 80_000, LEDGER))


REFUSED_ANSWERS: dict[str, tuple[Resumption, Answer, str]] = {
    "ahead of what was sent": (Resumption(), Answer(0, 70_000), "already has 70,000 bytes of a transfer"),
    "verified beyond what was sent": (Resumption(), Answer(65_537, 65_537), "already has 65,537 bytes"),
    "before the token's offset": (
        Resumption(skip_to=1000, stream=IDENTITY),
        Answer(500, 500),
        "resumes at offset 500, before the token's 1000: use the receiver's latest token",
    ),
}


@pytest.mark.parametrize(("plan", "answer", "says"), REFUSED_ANSWERS.values(), ids=REFUSED_ANSWERS.keys())
def test_an_answer_this_sender_cannot_follow_is_refused(plan: Resumption, answer: Answer, says: str) -> None:
    taken(plan, STREAM[:PREFIX_SIZE])
    with pytest.raises(SessionError, match=says):
        plan.answered(answer)


@pytest.mark.parametrize(
    ("stream", "says"),
    [
        (stream_identity(OTHER[:PREFIX_SIZE]), "not the stream the resume token is for: subvol of .*, not snapshot of"),
        ({**IDENTITY, "sha256": "0" * 64}, f"whose first {PREFIX_SIZE} bytes differ"),
    ],
    ids=["another stream", "same first command, other bytes"],
)
def test_a_token_for_another_stream_is_refused_before_a_connection(stream: dict[str, object], says: str) -> None:
    plan = Resumption(skip_to=1000, stream=partial_identity(**stream))
    taken(plan, STREAM[:PREFIX_SIZE])
    with pytest.raises(ResumeError, match=says):
        plan.identify()


def test_a_status_for_the_hello_ends_the_transfer_without_a_resume() -> None:
    """A receiver that finished answers a returning sender's hello with its status: nothing is resent."""
    machine = SenderConnection()
    machine.send(Hello(IDENTITY))
    events: list[Event] = machine.receive_data(ReceiverConnection().send(Status(0, "ok")))
    assert events == [Status(0, "ok")]


def test_retries_double_their_wait_and_give_up_with_the_last_error() -> None:
    plan = Resumption(retries=3, retry_delay=0.5)
    plan.reconnecting()
    waits = [plan.failed(ConnectionRefusedError("refused"), first=True) for _ in range(3)]
    assert [(w.seconds, w.notice) for w in waits] == [
        (0.5, "no connection; retry 1/3 in 0.5 s"),
        (1.0, "no connection; retry 2/3 in 1 s"),
        (2.0, "no connection; retry 3/3 in 2 s"),
    ]
    with pytest.raises(SessionError, match="no connection, and 3 more attempts failed; the last: refused"):
        plan.failed(ConnectionRefusedError("refused"), first=True)
    plan.reconnecting()  # a new outage counts from one
    assert plan.failed(TimeoutError("stalled"), first=False).notice == "connection lost; retry 1/3 in 0.5 s"


def test_a_receiver_that_broke_the_protocol_is_not_tried_again() -> None:
    plan = Resumption()
    plan.lost(ConnectionResetError("reset"))
    plan.reconnecting()  # a drop: a new connection may cure it
    broken = SessionError("malformed acknowledgement from the receiver")
    plan.lost(broken)
    with pytest.raises(SessionError, match="malformed acknowledgement"):
        plan.reconnecting()
