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

receiver -> sender, lines of at most :data:`~sendstream.net.session.messages.MAX_LINE` bytes
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
zstd stream (:mod:`sendstream.net.compression`); the receiver's are not.

:class:`ReceiverConnection` and :class:`SenderConnection` are one connection
each, seen from either end. ``receive_data(data)`` takes what the channel
gave and returns the events it completes (none for an incomplete line or
frame: the machine keeps the part, bounded by the limits above, checked
before anything is kept); it raises :class:`~sendstream.errors.SessionError`
for bytes that break the protocol, and from then on for every call. The
other methods return the bytes to send. Threads, sockets, clocks and
retries live in the drivers (:mod:`.sender`, :mod:`.receiver`) that feed them.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from typing import Any

from ...errors import SessionError
from ...format.layout import STREAM_MAGIC
from ...ops.identity import printable
from ..compression import OFFER, offer_line, parse_line
from .messages import (
    MAGIC,
    MAX_LINE,
    STATUS_PREFIX,
    VERSION,
    parse_ack,
    parse_answer,
    parse_hello,
    parse_listed,
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

    stream: dict[str, Any]


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


Event = Hello | RawStream | ListRequest | CompressOffer | Data | End | Abort | Bye | Answer | Listed | Ack | Status


def json_line(obj: Any) -> bytes:
    """``sendstream-session 1 {JSON}``: a hello or an answer; each says which versions its end speaks."""
    body = {**obj, "speaks": SPEAKS}
    return MAGIC + b" %d " % VERSION + json.dumps(body, sort_keys=True, separators=(",", ":")).encode() + b"\n"


def status_line(code: int, message: str) -> bytes:
    """``sendstream-status CODE MESSAGE``, on one line whatever ``message`` holds."""
    return STATUS_PREFIX + f"{code} {printable(message)}".encode() + b"\n"


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
    """What both ends share: ``receive_data`` feeds :meth:`_next` until the bytes are used up or the machine is done."""

    def __init__(self, state: str) -> None:
        self._input = _Input()
        self._state = state

    def receive_data(self, data: bytes | bytearray | memoryview) -> list[Event]:
        """The events ``data`` completes; SessionError (now and on every later call) when it breaks the protocol."""
        if self._input.error is not None:
            raise self._input.error
        view = memoryview(data).cast("B")
        events: list[Event] = []
        pos = 0
        try:
            while pos < len(view) and self._state != "done":
                pos = self._next(view, pos, events)
        except SessionError as exc:
            self._input.error = exc
            raise
        return events

    def _next(self, data: memoryview, pos: int, events: list[Event]) -> int:
        """Parse what comes at ``pos``, add the events it completes; the position after it."""
        raise NotImplementedError


class ReceiverConnection(_Machine):
    """One connection, at the receiver: the sender's first words (hello or raw stream), its frames, its ``B``.

    ``offset`` is the stream offset of the next data byte (set by :meth:`answer`).
    """

    def __init__(self) -> None:
        # first, offer (its line), offered (until answered), listing, hello, frames, raw, closing (after our
        # status), done (after B)
        super().__init__("first")
        self._answered = False  # a compression offer was answered: no second one
        self.offset = 0
        self._payload = 0  # bytes of the current D frame still to come
        self._reason: int | None = None  # the size of the X frame whose reason is being read
        self._skip = 0  # bytes of an over-long reason still to drop

    @property
    def payload_left(self) -> int:
        """How many of the next bytes are stream data whatever they hold (a driver may receive them in place)."""
        return RAW_DATA if self._state == "raw" else self._payload if self._state == "frames" else 0

    def payload_received(self, n: int) -> None:
        """``n`` of the next :attr:`payload_left` bytes went straight where the data goes: as if they came as Data."""
        if self._state == "frames":
            self._payload -= n
            self.offset += n

    def _next(self, data: memoryview, pos: int, events: list[Event]) -> int:
        if self._payload:
            n = min(self._payload, len(data) - pos)
            self._payload -= n
            if self._state == "frames":  # closing: frames sent before the sender saw our status are dropped
                self.offset += n
                events.append(Data(data[pos : pos + n]))
            return pos + n
        if self._skip:
            n = min(self._skip, len(data) - pos)
            self._skip -= n
            return pos + n
        if self._state == "raw":
            events.append(Data(data[pos:]))
            return len(data)
        if self._state == "first":
            return self._first_words(data, pos, events)
        if self._state == "offer":
            line, pos = self._input.line(data, pos)
            if line is not None:
                events.append(CompressOffer(parse_line(line, "the sender")))
                self._state = "offered"
            return pos
        if self._state == "offered":
            raise SessionError("the sender sent more before its compression offer was answered")
        if self._state == "listing":
            raise SessionError("the client sent more after asking for its list")
        if self._state == "hello":
            line, pos = self._input.line(data, pos)
            if line is not None:
                events.append(Hello(parse_hello(line)))
                self._state = "frames"
            return pos
        return self._frame(data, pos, events)

    def _first_words(self, data: memoryview, pos: int, events: list[Event]) -> int:
        kept = self._input.kept
        n = min(FIRST_WORDS - len(kept), len(data) - pos)
        kept += data[pos : pos + n]
        starts = (RAW_MAGIC, HELLO_START, LIST_REQUEST) + (() if self._answered else (OFFER,))
        if kept.startswith(LIST_REQUEST):
            self._state = "listing"
            events.append(ListRequest())
            extra = len(kept) - len(LIST_REQUEST)  # of this call's bytes: they break the protocol next
            kept.clear()
            return pos + n - extra
        if kept.startswith(RAW_MAGIC):
            self._state = "raw"
            events += [RawStream(), Data(memoryview(bytes(kept)))]
            kept.clear()
        elif kept.startswith(HELLO_START):
            self._state = "hello"  # the line goes on from what is kept
        elif kept.startswith(OFFER) and not self._answered:
            self._state = "offer"
        elif not any(start.startswith(kept) for start in starts):
            offer = "" if self._answered else " nor a compression offer"
            raise SessionError(f"neither a session hello nor a btrfs stream{offer}: {printable(repr(bytes(kept)))}")
        return pos + n

    def _frame(self, data: memoryview, pos: int, events: list[Event]) -> int:
        if self._reason is not None:
            return self._abort(data, pos, events, self._reason)
        kind = bytes(self._input.kept[:1] or data[pos : pos + 1])
        if kind == b"B" and self._state == "closing":
            events.append(Bye())
            self._state = "done"
            return pos + 1
        if kind not in (b"D", b"E", b"X"):
            expected = "B, D, E or X" if self._state == "closing" else "D, E or X"
            raise SessionError(f"unexpected frame type {kind!r} at offset {self.offset}; expected {expected}")
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
        elif self._state != "closing":
            if value != self.offset:
                raise SessionError(f"the sender ended at {value} bytes, {self.offset} received")
            events.append(End(value))
        return pos

    def _abort(self, data: memoryview, pos: int, events: list[Event], size: int) -> int:
        """The reason of an ``X`` frame of ``size`` bytes: the first :data:`MAX_REASON`, the rest dropped."""
        reason, pos = self._input.take(data, pos, min(size, MAX_REASON))
        if reason is not None:
            self._reason, self._skip = None, size - len(reason)
            events.append(Abort(printable(reason.decode("utf-8", "replace"))))
        return pos

    # what the receiver sends

    def take_offer(self, method: str) -> bytes:
        """The answer to a :class:`CompressOffer`: ``method`` is what the receiver takes (``none``: nothing)."""
        if self._state != "offered":
            raise SessionError("no compression offer to answer")
        self._state, self._answered = "first", True
        return offer_line(method)

    def answer(self, verified: int, resume: int, ledger: tuple[int, str] | None = None) -> bytes:
        """The answer to the hello; the frames that follow carry the stream from ``resume`` on. ``ledger``
        (commands, digest) lets a sender without a token check its stream against what was kept."""
        self.offset = resume
        body: dict[str, Any] = {"verified": verified, "resume": resume}
        if ledger is not None:
            body["ledger"] = {"commands": ledger[0], "digest": ledger[1]}
        return json_line(body)

    @staticmethod
    def ack(verified: int) -> bytes:
        return b"ack %d\n" % verified

    def status(self, code: int, message: str) -> bytes:
        """The last word; from now on the sender's frames in flight are dropped until its ``B``."""
        if self._state == "frames":
            self._state = "closing"
        return status_line(code, message)


class SenderConnection(_Machine):
    """One connection, at the sender: the receiver's answer (or its status), its acks, its status; or, with
    ``listing`` (the connection asked for the service's list), its snapshots and its status. Whatever the
    receiver says that this end did not ask for breaks the protocol."""

    def __init__(self, *, listing: bool = False) -> None:
        super().__init__("listing" if listing else "answer")  # answer, lines, listing, done (after the status)

    def _next(self, data: memoryview, pos: int, events: list[Event]) -> int:
        line, pos = self._input.line(data, pos)
        if line is not None:
            events.append(self._line(line))
        return pos

    def _line(self, line: bytes) -> Event:
        if line.startswith(STATUS_PREFIX):
            self._state = "done"
            return Status(*parse_status(line))
        if self._state == "listing":
            if line.startswith(LIST_PREFIX):
                return Listed(parse_listed(line[len(LIST_PREFIX) :]))
            expected = "a snapshot of the list or a status: is it sendstream serve?"
            raise SessionError(f"unexpected line from the receiver: {printable(repr(line[:60]))}; expected {expected}")
        if line.startswith(LIST_PREFIX):
            raise SessionError(
                "the receiver sent a snapshot of a list, which a sender of a stream does not ask for; expected "
                + ("the answer to the hello" if self._state == "answer" else "an ack")
                + " or a status"
            )
        if self._state == "answer":
            self._state = "lines"
            return Answer(*parse_answer(line))
        if line.startswith(b"ack "):
            return Ack(parse_ack(line))
        raise SessionError(
            f"unexpected line from the receiver: {printable(repr(line[:60]))}; expected an ack or a status"
        )

    # what the sender sends

    @staticmethod
    def hello(stream: dict[str, Any] | None) -> bytes:
        return json_line({"stream": stream})

    @staticmethod
    def data(payload: bytes | memoryview) -> list[bytes]:
        """``D`` frames of ``payload``, each one write (header and bytes: no tiny TLS record)."""
        view = memoryview(payload)
        return [
            _FRAME.pack(b"D", len(view[i : i + MAX_FRAME])) + view[i : i + MAX_FRAME]
            for i in range(0, len(view), MAX_FRAME)
        ]

    @staticmethod
    def end(total: int) -> bytes:
        return _END.pack(b"E", total)

    @staticmethod
    def abort(reason: str) -> bytes:
        message = reason.encode("utf-8", "replace")[:MAX_REASON]
        return _FRAME.pack(b"X", len(message)) + message

    @staticmethod
    def bye() -> bytes:
        return b"B"

    @staticmethod
    def list_request() -> bytes:
        return LIST_REQUEST


def listed_line(snapshot: dict[str, Any]) -> bytes:
    """``sendstream-list {JSON}``: one snapshot the service holds."""
    return LIST_PREFIX + json.dumps(snapshot, sort_keys=True, separators=(",", ":")).encode() + b"\n"
