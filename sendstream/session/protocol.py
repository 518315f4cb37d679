"""The session protocol as two state machines, without I/O: bytes in, events out; calls in, bytes to send.

Version 1, inside the channel (TLS or plain TCP):

sender -> receiver
    ``sendstream-session 1 {JSON}\\n``: the hello. JSON holds ``speaks`` (the
    versions of this protocol the sender speaks: ``[1]``), ``stream``,
    the stream identity: ``uuid``, ``ctransid``, ``parent_uuid``,
    ``parent_ctransid`` (null for a full send) and ``version`` of the first
    command (``subvol`` or ``snapshot``), and ``prefix`` / ``sha256``: the
    length and SHA-256 of the first bytes of the (healed) stream, up to
    :data:`PREFIX_SIZE`. A sender resuming after a restart sends the same
    hello: the receiver's answer says where it stands.

    Then frames: ``D`` + u32 big-endian length (at most :data:`MAX_FRAME`)
    + that many stream bytes; ``E`` + u64 big-endian total length of the
    stream: the end; ``X`` + u32 length + the reason the sender gives up
    (at most :data:`MAX_REASON` bytes of it are read); ``B``: the sender got
    the receiver's status (then it closes). A connection that ends before
    ``E`` is a drop, not an end, even on plain TCP.

receiver -> sender, lines of at most :data:`~sendstream.session.messages.MAX_LINE` bytes
    ``sendstream-session 1 {"resume": R, "verified": V}\\n``: the answer to
    the hello. V is the offset of the last command boundary the receiver
    verified, wrote downstream and flushed (0 when new); R >= V is where the
    sender continues.

    ``ack V\\n``: V as it grows.

    ``sendstream-status CODE MESSAGE\\n``: the end (CODE 0: the whole stream
    was verified and written).

A receiver that reads ``btrfs-stream`` first takes a raw stream (an older
sender, ``openssl s_client``, ``socat``): no session, every byte is stream data.

Instead of either, a client of ``sendstream serve`` may ask what the service
holds for it: ``sendstream-list\n``, and nothing more; the answer is
``sendstream-list {JSON}\n`` lines, one per snapshot, then the status.

Before either, a sender may offer compression: ``sendstream-compress zstd\n``,
and nothing more until the receiver answers with the method it takes
(``sendstream-compress zstd\n`` or ``... none\n``). After ``zstd`` the
sender's bytes (the hello or the raw stream, and all that follows) are one
zstd stream (:mod:`sendstream.transport.compression`); the receiver's are not.

:class:`ReceiverConnection` and :class:`SenderConnection` are one connection
each, seen from either end, as h11's ``Connection``: both track where the
sender stands (:class:`SenderState`) and where the receiver stands
(:class:`ReceiverState`), and check every event, either way, against one
transition table (:data:`SENDER`, :data:`RECEIVER`). ``send(event)`` returns
the bytes of an event this end may say now, and raises
:class:`~sendstream.errors.SessionMisuse` (a bug of the caller) for one it
may not. ``receive_data(data)`` takes what the channel gave and returns the
events it completes (none for an incomplete line or frame: the machine keeps
the part, bounded by the limits above, checked before anything is kept); it
raises :class:`~sendstream.errors.SessionError` naming the peer for bytes
that break the protocol, and from then on for every call. Threads, sockets,
clocks and retries live in the drivers (:mod:`.sender`, :mod:`.receiver`)
that feed them; what a sender decides across connections is :mod:`.resume`'s.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ..errors import SessionError, SessionMisuse
from ..format.layout import STREAM_MAGIC
from ..transfer.identity import Identity, printable
from .messages import (
    MAGIC,
    MAX_LINE,
    OFFER,
    STATUS_PREFIX,
    VERSION,
    parse_ack,
    parse_answer,
    parse_hello,
    parse_listed,
    parse_offer,
    parse_status,
)

SPEAKS = [VERSION]  # the session versions this release speaks: a later one keeps every earlier one
PREFIX_SIZE = 64 << 10  # the hello's identity covers at most this many first bytes of the stream
MAX_FRAME = 16 << 20
MAX_REASON = 4096  # of an ``X`` frame's reason, what is read (the sender sends no more)
RAW_MAGIC = STREAM_MAGIC
HELLO_START = MAGIC + b" "
LIST_REQUEST = b"sendstream-list\n"
LIST_PREFIX = b"sendstream-list "
RAW_DATA = 1 << 62  # how much of a raw stream is data: all of it
FIRST_WORDS = max(len(RAW_MAGIC), len(HELLO_START), len(OFFER), len(LIST_REQUEST))  # what tells them apart
_FRAME = struct.Struct(">cI")
_END = struct.Struct(">cQ")


# --- events ---------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Hello:
    """The sender's hello: the identity of its stream."""

    stream: Identity


@dataclass(frozen=True)
class RawStream:
    """The peer sent the header of a raw stream: every byte from here on, the header first, comes as :class:`Data`."""


@dataclass(frozen=True)
class ListRequest:
    """The client asks which snapshots the service holds for it (and says nothing more)."""


@dataclass(frozen=True)
class CompressOffer:
    """The sender offers to compress what it sends with ``method``; it waits for the answer."""

    method: str


@dataclass(frozen=True)
class CompressAnswer:
    """The receiver's answer to a :class:`CompressOffer`: the method it takes (``none``: nothing)."""

    method: str


@dataclass(frozen=True)
class Data:
    """Stream bytes: a view of the bytes given to ``receive_data`` (or of a copy); copy them to keep them."""

    payload: memoryview


@dataclass(frozen=True)
class End:
    """The sender's end: the stream has ``total`` bytes (checked against the bytes received)."""

    total: int


@dataclass(frozen=True)
class Abort:
    """The sender gave up, for ``reason`` (printable, at most :data:`MAX_REASON` bytes of it)."""

    reason: str


@dataclass(frozen=True)
class Bye:
    """The sender got the receiver's status."""


@dataclass(frozen=True)
class Answer:
    """The receiver's answer to the hello: what it verified, where the sender continues and, from a
    receiver that kept an earlier run of the transfer, the command count and ledger there."""

    verified: int
    resume: int
    ledger: tuple[int, str] | None = None


@dataclass(frozen=True)
class Listed:
    """One snapshot the service holds for the client (the answer to a :class:`ListRequest`)."""

    snapshot: dict[str, Any]


@dataclass(frozen=True)
class Ack:
    """The receiver verified the stream up to ``verified``."""

    verified: int


@dataclass(frozen=True)
class Status:
    """The receiver's last word: ``code`` 0 when the whole stream was verified and written."""

    code: int
    message: str


Event = (
    Hello
    | RawStream
    | ListRequest
    | CompressOffer
    | CompressAnswer
    | Data
    | End
    | Abort
    | Bye
    | Answer
    | Listed
    | Ack
    | Status
)


def json_line(obj: Any) -> bytes:
    """``sendstream-session 1 {JSON}``: a hello or an answer; each says which versions its end speaks."""
    body = {**obj, "speaks": SPEAKS}
    return MAGIC + b" %d " % VERSION + json.dumps(body, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def status_line(code: int, message: str) -> bytes:
    """``sendstream-status CODE MESSAGE``, on one line whatever ``message`` holds."""
    return STATUS_PREFIX + f"{code} {printable(message)}".encode() + b"\n"


def listed_line(snapshot: dict[str, Any]) -> bytes:
    """``sendstream-list {JSON}``: one snapshot the service holds."""
    return LIST_PREFIX + json.dumps(snapshot, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def _data_frames(event: Data) -> bytes:
    """The frames of ``event``: one write (no tiny TLS record), one copy of a payload that fits one frame."""
    if len(event.payload) <= MAX_FRAME:
        return _FRAME.pack(b"D", len(event.payload)) + event.payload
    return b"".join(data_frames(event.payload))


def data_frames(payload: bytes | memoryview) -> list[bytes]:
    """``D`` frames of ``payload``, each of at most :data:`MAX_FRAME` bytes."""
    view = memoryview(payload)
    return [
        _FRAME.pack(b"D", len(view[i : i + MAX_FRAME])) + view[i : i + MAX_FRAME]
        for i in range(0, len(view), MAX_FRAME)
    ]


def _offer_line(method: str) -> bytes:
    """``sendstream-compress METHOD``: the sender's offer, or the receiver's answer."""
    return OFFER + method.encode() + b"\n"


def _answer_line(event: Answer) -> bytes:
    body: dict[str, Any] = {"verified": event.verified, "resume": event.resume}
    if event.ledger is not None:
        body["ledger"] = {"commands": event.ledger[0], "digest": event.ledger[1]}
    return json_line(body)


def _abort_frame(event: Abort) -> bytes:
    message = event.reason.encode("utf-8", "replace")[:MAX_REASON]
    return _FRAME.pack(b"X", len(message)) + message


_WRITERS: dict[type[Any], Callable[[Any], bytes]] = {
    Hello: lambda ev: json_line({"stream": ev.stream}),
    RawStream: lambda ev: b"",  # the stream's own header says it
    ListRequest: lambda ev: LIST_REQUEST,
    CompressOffer: lambda ev: _offer_line(ev.method),
    CompressAnswer: lambda ev: _offer_line(ev.method),
    Data: _data_frames,
    End: lambda ev: _END.pack(b"E", ev.total),
    Abort: _abort_frame,
    Bye: lambda ev: b"B",
    Answer: _answer_line,
    Listed: lambda ev: listed_line(ev.snapshot),
    Ack: lambda ev: b"ack %d\n" % ev.verified,
    Status: lambda ev: status_line(ev.code, ev.message),
}


def encode(event: Event) -> bytes:
    """The bytes of ``event``, unchecked (a machine's :meth:`~_Machine.send` checks it is this end's turn)."""
    return _WRITERS[type(event)](event)


# --- the states, and one transition table for both ends --------------------------------------------------------------


class SenderState(Enum):
    """Where the sender stands, by what it said."""

    IDLE = "idle"  # nothing said: an offer to compress or its first words come next
    OFFERED = "offered"  # offered to compress: nothing more until the answer
    READY = "ready"  # its offer was answered: its first words come next, no second offer
    GREETED = "greeted"  # said its hello: nothing more until the answer (or a status)
    SENDING = "sending"  # the frames of the stream, from where the answer said
    ABORTED = "aborted"  # gave up (``X``)
    ENDED = "ended"  # said its end (``E``)
    LISTING = "listing"  # asked for its list: nothing more
    RAW = "raw"  # sends a raw stream: every byte is stream data
    DONE = "done"  # got the status and said ``B``: nothing more


class ReceiverState(Enum):
    """Where the receiver stands, by what the sender asked of it and what it said."""

    IDLE = "idle"  # owes nothing yet
    OFFER = "offer"  # owes the answer to an offer to compress
    HELLO = "hello"  # owes the answer to a hello
    ACKING = "acking"  # answered the hello: acks until the status
    LISTING = "listing"  # owes the snapshots of the list, then the status
    RAW = "raw"  # takes a raw stream: only the status
    CLOSED = "closed"  # said its status: nothing more


S, R = SenderState, ReceiverState

SENDER: dict[SenderState, dict[type[Any], SenderState]] = {
    S.IDLE: {CompressOffer: S.OFFERED, Hello: S.GREETED, ListRequest: S.LISTING, RawStream: S.RAW},
    S.READY: {Hello: S.GREETED, ListRequest: S.LISTING, RawStream: S.RAW},
    S.GREETED: {Bye: S.DONE},
    S.SENDING: {Data: S.SENDING, End: S.ENDED, Abort: S.ABORTED, Bye: S.DONE},
    S.ABORTED: {End: S.ENDED, Bye: S.DONE},
    S.ENDED: {Bye: S.DONE},
    S.RAW: {Data: S.RAW},
}
"""What the sender may say in each state, and where it then stands."""

RECEIVER: dict[ReceiverState, dict[type[Any], ReceiverState]] = {
    R.IDLE: {Status: R.CLOSED},  # a refusal (busy, not a client) before it was asked anything
    R.OFFER: {CompressAnswer: R.IDLE, Status: R.CLOSED},
    R.HELLO: {Answer: R.ACKING, Status: R.CLOSED},
    R.ACKING: {Ack: R.ACKING, Status: R.CLOSED},
    R.LISTING: {Listed: R.LISTING, Status: R.CLOSED},
    R.RAW: {Status: R.CLOSED},
}
"""What the receiver may say in each state, and where it then stands."""

OWED: dict[type[Any], ReceiverState] = {
    CompressOffer: R.OFFER,
    Hello: R.HELLO,
    ListRequest: R.LISTING,
    RawStream: R.RAW,
}
"""What a sender's event makes the receiver owe."""

ANSWERED: dict[type[Any], SenderState] = {CompressAnswer: S.READY, Answer: S.SENDING}
"""Where a receiver's answer lets the sender go on."""

_WHEN = {
    CompressOffer: "an offer to compress comes first, once",
    Hello: "a hello comes first",
    ListRequest: "a list request comes first",
    RawStream: "a raw stream comes first",
    CompressAnswer: "no compression offer to answer",
    Answer: "no hello to answer",
    Listed: "no list was asked for",
    Ack: "no hello was answered",
    Status: "the status was said",
    Data: "frames follow the answer to the hello",
    End: "frames follow the answer to the hello",
    Abort: "frames follow the answer to the hello",
    Bye: "a bye follows the receiver's status",
}


class _Conversation:
    """Where both ends stand, moved by the events of either, checked against :data:`SENDER` and :data:`RECEIVER`."""

    def __init__(self) -> None:
        self.sender, self._sender_may = S.IDLE, SENDER[S.IDLE]
        self.receiver, self._receiver_may = R.IDLE, RECEIVER[R.IDLE]

    def may(self, kind: type[Any], *, of_sender: bool) -> bool:
        """Whether the sender (or the receiver) may say an event of ``kind`` now."""
        if of_sender:
            return kind in self._sender_may and (kind is not Bye or self.receiver is R.CLOSED)
        return kind in self._receiver_may

    def said(self, event: Event, *, by_sender: bool) -> bool:
        """Move both ends on by ``event`` (which :meth:`may` allowed): whether the receiver's state changed.
        The frames and acks that keep an end where it stands write nothing, so a driver may send them in
        one thread while another receives."""
        kind = type(event)
        if by_sender:
            self._sender_is(self._sender_may[kind])
            return kind in OWED and self._receiver_is(OWED[kind])
        moved = self._receiver_is(self._receiver_may[kind])
        if kind in ANSWERED:
            self._sender_is(ANSWERED[kind])
        return moved

    def _sender_is(self, state: SenderState) -> None:
        if state is not self.sender:
            self.sender, self._sender_may = state, SENDER.get(state, {})

    def _receiver_is(self, state: ReceiverState) -> bool:
        if state is self.receiver:
            return False
        self.receiver, self._receiver_may = state, RECEIVER.get(state, {})
        return True


class _Input:
    """What a machine keeps of an incomplete unit (a line, a frame header): bounded, and checked before it is kept."""

    def __init__(self) -> None:
        self.kept = bytearray()
        self.error: SessionError | None = None

    def take(self, data: memoryview, pos: int, n: int) -> tuple[bytes | None, int]:
        """The next ``n`` bytes (with those kept) and the position after them; None when they are not all there."""
        if not self.kept and len(data) - pos >= n:
            return bytes(data[pos : pos + n]), pos + n
        want = n - len(self.kept)
        if len(data) - pos < want:
            self.kept += data[pos:]
            return None, len(data)
        unit = bytes(self.kept + data[pos : pos + want])
        self.kept.clear()
        return unit, pos + want

    def line(self, data: memoryview, pos: int, limit: int = MAX_LINE) -> tuple[bytes | None, int]:
        """The next line, ``\\n`` included, of at most ``limit`` bytes; None when it is not all there."""
        end = bytes(data[pos : pos + limit - len(self.kept)]).find(b"\n")
        if end < 0:
            if len(self.kept) + len(data) - pos >= limit:
                raise SessionError(f"a line of the session protocol is longer than {limit} bytes")
            self.kept += data[pos:]
            return None, len(data)
        return self.take(data, pos, len(self.kept) + end + 1)


class _Machine:
    """What both ends share: the conversation, :meth:`send`, and ``receive_data`` feeding :meth:`_next` until
    the bytes are used up or the peer has nothing more to say."""

    _sender = True  # which end this machine is

    def __init__(self) -> None:
        self._input = _Input()
        self._talk = _Conversation()
        self._early = bytearray()  # what the peer sent before this end answered it, kept until it did
        self._silent = False  # the peer has nothing more to say: what follows is not read
        self._waiting = False  # the peer is owed an answer before what it says next can be read

    @property
    def sender_state(self) -> SenderState:
        return self._talk.sender

    @property
    def receiver_state(self) -> ReceiverState:
        return self._talk.receiver

    def send(self, event: Event) -> bytes:
        """The bytes of ``event``; :class:`SessionMisuse` when this end may not say it now."""
        if not self._talk.may(type(event), of_sender=self._sender):
            end, state = ("sender", self._talk.sender) if self._sender else ("receiver", self._talk.receiver)
            raise SessionMisuse(
                f"the {end} cannot send {type(event).__name__} in state {state.value}: {_WHEN[type(event)]}"
            )
        self._moved(self._talk.said(event, by_sender=self._sender))
        return encode(event)

    def _heard(self, event: Event, events: list[Event]) -> None:
        """The peer said ``event`` (its parser checked the peer may): move on, and hand it out."""
        self._moved(self._talk.said(event, by_sender=not self._sender))
        events.append(event)

    def _moved(self, receiver: bool) -> None:
        """An event moved the conversation (``receiver``: the receiver's state too): what reading depends
        on is worked out again, once, rather than on every frame."""
        raise NotImplementedError

    @property
    def early(self) -> bool:
        """Bytes the peer sent before it was answered are kept, and can be read now: ``receive_data(b"")``."""
        return bool(self._early) and not self._waiting

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """The events ``data`` completes; SessionError (now and on every later call) when it breaks the protocol.

        What the peer sends while it is owed an answer (a sender's frames
        right after its hello) is kept, at most :data:`MAX_LINE` bytes of it,
        and read on the first call after the answer (see :attr:`early`).
        """
        if self._input.error is not None:
            raise self._input.error
        view = memoryview(data).cast("B")
        if self._early and not self._waiting:
            view, self._early = memoryview(bytes(self._early + view)), bytearray()
        events: list[Event] = []
        pos = 0
        try:
            while pos < len(view) and not self._silent:
                if self._waiting:
                    if len(self._early) + len(view) - pos > MAX_LINE:
                        raise SessionError(f"the sender sent more than {MAX_LINE} bytes before the answer to its hello")
                    self._early += view[pos:]
                    break
                pos = self._next(view, pos, events)
        except SessionError as exc:
            self._input.error = exc
            raise
        return events

    def _next(self, data: memoryview, pos: int, events: list[Event]) -> int:
        """Parse what comes at ``pos``, add the events it completes; the position after it."""
        raise NotImplementedError


_FRAMES: dict[bytes, type[Any]] = {b"B": Bye, b"D": Data, b"E": End, b"X": Abort}


class ReceiverConnection(_Machine):
    """One connection, at the receiver: the sender's first words (an offer, a hello, a list request or a raw
    stream), its frames, its ``B``; and what the receiver says to them.

    ``offset`` is the stream offset of the next data byte (set by the :class:`Answer` sent).
    """

    _sender = False

    def __init__(self) -> None:
        super().__init__()
        self._line_of: type[Any] | None = None  # the first words said a line of this event; its rest comes
        self.offset = 0
        self._payload = 0  # bytes of the current D frame still to come
        self._reason: int | None = None  # the size of the X frame whose reason is being read
        self._skip = 0  # bytes of an over-long reason still to drop
        self._closed = False  # the receiver said its status: frames sent before the sender saw it are dropped

    def _moved(self, receiver: bool) -> None:
        # one thread reads and answers; another only acks, which moves nothing
        sender, self._closed = self._talk.sender, self._talk.receiver is R.CLOSED and self._talk.sender is not S.RAW
        self._silent = sender is S.DONE
        self._waiting = sender is S.GREETED and self._talk.receiver is R.HELLO

    @property
    def payload_left(self) -> int:
        """How many of the next bytes are stream data whatever they hold (a driver may receive them in place)."""
        if self._talk.sender is S.RAW:
            return RAW_DATA
        return 0 if self._closed or self._early else self._payload

    def payload_received(self, n: int) -> None:
        """``n`` of the next :attr:`payload_left` bytes went straight where the data goes: as if they came as Data."""
        if self._talk.sender is not S.RAW and not self._closed:
            self._payload -= n
            self.offset += n

    def send(self, event: Event) -> bytes:
        if isinstance(event, Answer) and self._talk.receiver is R.HELLO:
            self.offset = event.resume  # the frames that follow carry the stream from here
        return super().send(event)

    def _next(self, data: memoryview, pos: int, events: list[Event]) -> int:
        if self._payload:
            n = min(self._payload, len(data) - pos)
            self._payload -= n
            if not self._closed:  # frames sent before the sender saw our status are dropped
                self.offset += n
                events.append(Data(data[pos : pos + n]))
            return pos + n
        if self._skip:
            n = min(self._skip, len(data) - pos)
            self._skip -= n
            return pos + n
        state = self._talk.sender
        if state is S.SENDING:  # the common case first
            return self._frame(data, pos, events)
        if state is S.RAW:
            events.append(Data(data[pos:]))
            return len(data)
        if self._line_of is not None:
            return self._line(data, pos, events)
        if state in (S.IDLE, S.READY):
            return self._first_words(data, pos, events)
        if state is S.OFFERED:
            raise SessionError("the sender sent more before its compression offer was answered")
        if state is S.LISTING:
            raise SessionError("the client sent more after asking for its list")
        return self._frame(data, pos, events)

    def _line(self, data: memoryview, pos: int, events: list[Event]) -> int:
        """The rest of the offer's or the hello's line."""
        line, pos = self._input.line(data, pos)
        if line is not None:
            kind, self._line_of = self._line_of, None
            self._heard(
                CompressOffer(parse_offer(line, "the sender")) if kind is CompressOffer else Hello(parse_hello(line)),
                events,
            )
        return pos

    def _first_words(self, data: memoryview, pos: int, events: list[Event]) -> int:
        kept = self._input.kept
        n = min(FIRST_WORDS - len(kept), len(data) - pos)
        kept += data[pos : pos + n]
        offer = self._talk.may(CompressOffer, of_sender=True)
        starts = (RAW_MAGIC, HELLO_START, LIST_REQUEST) + ((OFFER,) if offer else ())
        if kept.startswith(LIST_REQUEST):
            self._heard(ListRequest(), events)
            extra = len(kept) - len(LIST_REQUEST)  # of this call's bytes: they break the protocol next
            kept.clear()
            return pos + n - extra
        if kept.startswith(RAW_MAGIC):
            self._heard(RawStream(), events)
            events.append(Data(memoryview(bytes(kept))))
            kept.clear()
        elif kept.startswith(HELLO_START):
            self._line_of = Hello  # the line goes on from what is kept
        elif kept.startswith(OFFER) and offer:
            self._line_of = CompressOffer
        elif not any(start.startswith(kept) for start in starts):
            nor = " nor a compression offer" if offer else ""
            raise SessionError(f"neither a session hello nor a btrfs stream{nor}: {printable(repr(bytes(kept)))}")
        return pos + n

    def _frame(self, data: memoryview, pos: int, events: list[Event]) -> int:
        if self._reason is not None:
            return self._abort(data, pos, events, self._reason)
        kind = bytes(self._input.kept[:1] or data[pos : pos + 1])
        dropped = self._closed and kind in (b"D", b"E", b"X")
        common = kind == b"D" and self._talk.sender is S.SENDING  # needs no look-up
        if not common and not dropped and not (kind in _FRAMES and self._talk.may(_FRAMES[kind], of_sender=True)):
            allowed = [k for k, event in _FRAMES.items() if self._talk.may(event, of_sender=True)]
            if self._closed:
                allowed = sorted({*allowed, b"D", b"E", b"X"})
            letters = [k.decode() for k in allowed]
            expected = " or ".join([", ".join(letters[:-1]), letters[-1]] if len(letters) > 1 else letters)
            raise SessionError(
                f"unexpected frame type {kind!r} at offset {self.offset}; expected {expected or 'nothing'}"
            )
        if kind == b"B":
            self._heard(Bye(), events)
            return pos + 1
        header, pos = self._input.take(data, pos, _END.size if kind == b"E" else _FRAME.size)
        if header is None:
            return pos
        _, value = (_END if kind == b"E" else _FRAME).unpack(header)
        if kind == b"X":
            self._reason = value
            return self._abort(data, pos, events, value)
        if kind == b"D":
            if value > MAX_FRAME:
                raise SessionError(f"a frame of {value} bytes at offset {self.offset}; expected at most {MAX_FRAME}")
            self._payload = value
        elif not dropped:
            if value != self.offset:
                raise SessionError(f"the sender ended at {value} bytes, {self.offset} received")
            self._heard(End(value), events)
        return pos

    def _abort(self, data: memoryview, pos: int, events: list[Event], size: int) -> int:
        """The reason of an ``X`` frame of ``size`` bytes: the first :data:`MAX_REASON`, the rest dropped."""
        reason, pos = self._input.take(data, pos, min(size, MAX_REASON))
        if reason is not None:
            self._reason, self._skip = None, size - len(reason)
            if not self._closed:
                self._heard(Abort(printable(reason.decode("utf-8", "replace"))), events)
        return pos


_LINES: tuple[tuple[bytes, type[Any]], ...] = (
    (STATUS_PREFIX, Status),
    (LIST_PREFIX, Listed),
    (b"ack ", Ack),
    (OFFER, CompressAnswer),
)
_PARSERS: dict[type[Any], Callable[[bytes], Event]] = {
    Status: lambda line: Status(*parse_status(line)),
    Listed: lambda line: Listed(parse_listed(line[len(LIST_PREFIX) :])),
    Ack: lambda line: Ack(parse_ack(line)),
    CompressAnswer: lambda line: CompressAnswer(parse_offer(line, "the receiver")),
    Answer: lambda line: Answer(*parse_answer(line)),
}
_ANY_LINE: dict[ReceiverState, type[Any]] = {R.OFFER: CompressAnswer, R.HELLO: Answer, R.RAW: Status}
"""In these states a line of no known word is read as the one the sender waits for (whose parser says what is
wrong with it)."""
_EXPECTED = {
    R.HELLO: "the answer to the hello",
    R.ACKING: "an ack",
    R.LISTING: "a snapshot of the list",
}


class SenderConnection(_Machine):
    """One connection, at the sender: what the sender says, and the receiver's lines, each read as what this
    end asked for (the answer to an offer, to a hello, a list, the status of a raw stream). Whatever the
    receiver says that this end did not ask for breaks the protocol."""

    def _moved(self, receiver: bool) -> None:
        # the sender's frames (in one thread) move only the sender's state; the receiver's lines (in
        # another) the receiver's, on which alone reading depends
        if receiver:
            self._silent = self._talk.receiver is R.CLOSED

    def _next(self, data: memoryview, pos: int, events: list[Event]) -> int:
        line, pos = self._input.line(data, pos)
        if line is not None:
            self._heard(self._line(line), events)
        return pos

    def _line(self, line: bytes) -> Event:
        state = self._talk.receiver
        kind = next((kind for word, kind in _LINES if line.startswith(word)), None)
        if kind is not None and self._talk.may(kind, of_sender=False):
            return _PARSERS[kind](line)
        if kind is Listed and state in (R.HELLO, R.ACKING):
            raise SessionError(
                "the receiver sent a snapshot of a list, which a sender of a stream does not ask for; expected "
                f"{_EXPECTED[state]} or a status"
            )
        if state in _ANY_LINE:
            return _PARSERS[_ANY_LINE[state]](line)
        serve = ": is it sendstream serve?" if state is R.LISTING else ""
        expected = f"{_EXPECTED[state]} or a status{serve}" if state in _EXPECTED else "nothing"
        raise SessionError(f"unexpected line from the receiver: {printable(repr(line[:60]))}; expected {expected}")
