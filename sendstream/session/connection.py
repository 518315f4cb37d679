"""What both session drivers do with a connection: feed its machine, tell a peer why, close, judge a failure."""

from __future__ import annotations

import contextlib
import time
from collections import deque
from typing import Generic, TypeVar

from .. import errors as e
from ..errors import TlsError
from ..transport.tls import Channel
from ..transport.tls.kernel import BUSY_ALERT, opens_handshake
from .protocol import Data, Event, ReceiverConnection, SenderConnection, status_line

BUFFER_SIZE = 256 << 10
DRAIN_SECONDS = 10.0
M = TypeVar("M", ReceiverConnection, SenderConnection)


class Dropped(Exception):
    """The current connection is gone (internal)."""


def transient(exc: BaseException) -> bool:
    """True for a failure a new connection may cure (a cut, a stall, a refused connect), by its cause."""
    if isinstance(exc, (Dropped, TimeoutError, ConnectionError, EOFError)):
        return True
    if isinstance(exc, TlsError):
        return exc.retryable
    return isinstance(exc, OSError)


class Inbox(Generic[M]):
    """The events of what ``channel`` receives, as ``machine`` parses them: the driver's side of ``receive_data``.

    Received bytes land in a buffer of ``size`` bytes; the :class:`Data`
    events of one receive are views of it, so it is reused only once they
    are all taken.
    """

    def __init__(self, channel: Channel, machine: M, size: int) -> None:
        self.channel = channel
        self.machine: M = machine
        self._buffer = memoryview(bytearray(size))
        self._events: deque[Event] = deque()

    @property
    def pending(self) -> bool:
        """Events received and not taken yet."""
        return bool(self._events)

    def grow(self, size: int) -> None:
        """Receive up to ``size`` bytes at once from now on."""
        if size > len(self._buffer):
            self._buffer = memoryview(bytearray(size))  # the pending events keep the old one alive

    def events(self) -> list[Event]:
        """The pending events, or those of one receive (maybe none); EOFError at the end of the channel."""
        if not self._events:
            if self.machine.early:  # what the peer said before it was answered, first
                return self.machine.receive_data(b"")
            n = self.channel.recv_into(self._buffer)
            if not n:
                raise EOFError("the connection ended")
            return self.machine.receive_data(self._buffer[:n])
        events = list(self._events)
        self._events.clear()
        return events

    def next_event(self) -> Event:
        while not self._events:
            self._events.extend(self.events())
        return self._events.popleft()

    def unread(self, event: Event) -> None:
        """Put ``event`` back: the next to take."""
        self._events.appendleft(event)

    def receive_payload(self, view: memoryview) -> int | None:
        """Receive stream data straight into ``view`` when nothing is pending and the next bytes are data:
        how many came (0 at the end of the channel); None when the events come first."""
        if self._events or not isinstance(self.machine, ReceiverConnection) or not self.machine.payload_left:
            return None
        left = self.machine.payload_left
        n = self.channel.recv_into(view[: min(left, len(view))])
        self.machine.payload_received(n)
        return n

    def take_data(self, event: Data, view: memoryview) -> int:
        """Copy what fits of ``event`` into ``view``; the rest is the next event."""
        n = min(len(event.payload), len(view))
        view[:n] = event.payload[:n]
        if n < len(event.payload):
            self.unread(Data(event.payload[n:]))
        return n


def cut(channel: Channel | None) -> None:
    """Make every thread blocked on ``channel`` return (the owner closes it)."""
    if channel is not None:
        channel.interrupt()


def drop(channel: Channel | None) -> None:
    """Cut a dropped connection and close it without close_notify (the peer sees it cut short)."""
    if channel is not None:
        cut(channel)
        with contextlib.suppress(Exception):
            channel.abandon()


def close_quietly(channel: Channel) -> None:
    """Close with close_notify when the channel still works."""
    with contextlib.suppress(Exception):
        channel.close()


def tell(channel: Channel, code: int, message: str, seconds: float = 1.0) -> None:
    """Send a status to a peer we are about to close on, if it takes it within ``seconds``."""
    channel.set_deadline(time.monotonic() + seconds)
    with contextlib.suppress(Exception):
        channel.send_all(status_line(code, message))


def drain(channel: Channel, seconds: float = DRAIN_SECONDS) -> None:
    """End our direction, then read and drop what the peer still sends until it closes, for at most
    ``seconds``: closing with its bytes unread would reset the connection, and our last word with it."""
    with contextlib.suppress(Exception):
        channel.shutdown_write()
        deadline = time.monotonic() + seconds
        channel.set_deadline(deadline)
        scratch = bytearray(64 << 10)
        while channel.recv_into(scratch) and time.monotonic() < deadline:
            pass


def busy_answer(first: bytes, why: str) -> bytes:
    """What a connection refused for load (:class:`~sendstream.transport.listener.Listener`) is told, in the
    language of its ``first`` bytes: a TLS client, before any handshake, only an alert (which our sender
    takes as busy); any other a status."""
    if opens_handshake(first):
        return BUSY_ALERT
    return status_line(e.EXIT_IO, f"busy: {why}; try again later")


def failure_status(exc: BaseException) -> tuple[int, str]:
    """What a receiver answers when ``exc`` stopped it: the exit code the CLI gives it, and its text."""
    if isinstance(exc, e.SendStreamError):
        return exc.exit_code, str(exc)
    if isinstance(exc, OSError):
        return e.EXIT_IO, str(exc)
    return e.EXIT_CORRUPT, f"{type(exc).__name__}: {exc}"
