"""The receiving end of a session: opening a connection, the stream across reconnects, acknowledgements, the status.

A connection must finish its handshake and its first words (a hello of at
most :data:`~.messages.MAX_LINE` bytes, or the header of a raw stream)
within one deadline (:func:`open_connection`). The receiver acknowledges the
verified offset V as it grows, at least every :data:`ACK_BYTES` of output or
:data:`ACK_SECONDS`, and every :data:`KEEPALIVE_SECONDS` anyway; a receiver
that keeps a journal reports as V only offsets it made durable. It keeps its
verifier, its output and its ``--exec`` child across connections; a new
connection of the same stream supersedes the current one once it said its
hello (a stalled connection is dropped as soon as the sender reconnects);
one of another stream is refused, and the current one goes on. A receiver
that sees no ``B`` after its status answers a reconnecting sender's hello
with the status again, for up to a minute. The wire format is :mod:`.protocol`'s.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .. import errors as e
from ..errors import SessionError, TruncationError
from ..io.threads import started
from ..transfer.identity import Identity, describe
from ..transport.compression import METHOD, Decompressing
from ..transport.listener import Listener, describe_peer
from ..transport.tls import Channel
from .connection import BUFFER_SIZE, DRAIN_SECONDS, Inbox, close_quietly, cut, drain, drop, tell, transient
from .protocol import (
    Abort,
    Ack,
    Answer,
    Bye,
    CompressAnswer,
    CompressOffer,
    Data,
    End,
    Hello,
    ListRequest,
    ReceiverConnection,
    Status,
)

ACK_BYTES = 4 << 20
ACK_SECONDS = 0.5
KEEPALIVE_SECONDS = 5.0
OPENING_BUFFER = 4 << 10  # what one receive takes before the hello is whole (the machine keeps the hello's line)


@dataclass
class Opening:
    """An accepted connection that said what it is: a session hello, or the start of a raw stream."""

    channel: Channel
    inbox: Inbox[ReceiverConnection]
    identity: Identity | None  # the hello's stream; None: a raw stream (``btrfs-stream`` came first)
    peer: str = ""  # HOST:PORT
    listing: bool = False  # the client asked for its list of snapshots (:class:`.protocol.ListRequest`)

    def close(self) -> None:
        drop(self.channel)


def open_connection(
    sock: socket.socket,
    handshake: Callable[[socket.socket, float], Channel],
    deadline: float,
    *,
    timeout: float,
    idle_timeout: float | None,
    peer: tuple[str, int] | None = None,
) -> Opening:
    """Shake hands on accepted ``sock`` (``handshake(sock, seconds)``) and read the peer's first words, all
    before ``deadline`` (``time.monotonic()``; ``timeout`` is how long that was, for messages). The opening's
    peer is ``peer`` when given (the client a balancer's PROXY header named), else the socket's.

    The first words are a session hello (parsed by
    :func:`~.messages.parse_hello`) or the header of a raw stream. Anything
    else, a close or silence raises :class:`SessionError` (a failed
    handshake its own error); a peer that spoke out of turn is told why.
    Once open, each wait of the channel lasts at most ``idle_timeout``.
    """
    try:
        described = describe_peer(peer or sock.getpeername())
    except OSError:
        described = "a peer that left"
    channel = handshake(sock, max(deadline - time.monotonic(), 0.001))
    try:
        channel.set_deadline(deadline)
        inbox = Inbox(channel, ReceiverConnection(), OPENING_BUFFER)
        identity, listing = _first_words(inbox, timeout)
    except BaseException as exc:
        if isinstance(exc, SessionError):
            tell(channel, exc.exit_code, f"refused: {exc}")
        drop(channel)
        raise
    channel = inbox.channel  # a compressed stream's: one that decompresses
    channel.set_deadline(None)
    channel.settimeout(idle_timeout)
    return Opening(channel, inbox, identity, described, listing)


def _first_words(inbox: Inbox[ReceiverConnection], timeout: float) -> tuple[Identity | None, bool]:
    """The hello's stream identity (None for a raw stream or a list request), and whether the client asked
    for its list; a compression offer first is taken."""
    try:
        event = inbox.next_event()
        if isinstance(event, CompressOffer):
            taken = METHOD if event.method == METHOD else "none"
            inbox.channel.send_all(inbox.machine.send(CompressAnswer(taken)))
            if taken == METHOD:
                inbox.channel = Decompressing(inbox.channel)
            event = inbox.next_event()
    except (EOFError, TruncationError):
        raise SessionError("the connection ended before a session hello or a btrfs stream") from None
    except TimeoutError:
        raise SessionError(f"no session hello or btrfs stream within {timeout:g} s of connecting") from None
    return (event.stream if isinstance(event, Hello) else None), isinstance(event, ListRequest)


def admit(opening: Opening, identity: Identity | None) -> None:
    """Refuse an opening that is not a stream, or not of stream ``identity`` (when given): tell its sender
    why, raise :class:`SessionError`."""
    if opening.listing:
        why = "this receiver keeps no snapshots to list: --list asks a sendstream serve"
    elif identity is None or opening.identity == identity:
        return
    elif opening.identity is None:
        why = "a plain stream cannot join (or resume) a session: this receiver expects a session of its stream"
    else:
        why = f"a sender of another stream connected: {describe(opening.identity)}, not {describe(identity)}"
    tell(opening.channel, e.EXIT_USAGE, f"refused: {why}")
    raise SessionError(why)


class Acker:
    """``ack V`` to the sender, in a thread of its own: when V (``verified()``) grew, and every
    :data:`KEEPALIVE_SECONDS` anyway; at once when it grew by :data:`ACK_BYTES` (:meth:`nudge`)."""

    def __init__(self, verified: Callable[[], int], acked: int) -> None:
        self._verified = verified
        self.acked = acked
        self.lock = threading.Lock()  # one line at a time on the channel
        self._now = threading.Event()
        self._thread: threading.Thread | None = None
        self._channel: Channel | None = None
        self._stop = threading.Event()

    def start(self, inbox: Inbox[ReceiverConnection]) -> None:
        self._channel, self._stop = inbox.channel, threading.Event()
        self._thread = started(self._loop, inbox, self._stop)

    def nudge(self) -> None:
        if self._verified() - self.acked >= ACK_BYTES:
            self._now.set()

    def _loop(self, inbox: Inbox[ReceiverConnection], stop: threading.Event) -> None:
        last = time.monotonic()
        while True:
            self._now.wait(ACK_SECONDS / 2)
            self._now.clear()
            if stop.is_set():
                return
            now = time.monotonic()
            if self._verified() != self.acked or now - last >= KEEPALIVE_SECONDS:
                try:
                    with self.lock:
                        verified = self._verified()
                        inbox.channel.send_all(inbox.machine.send(Ack(verified)))
                        self.acked = verified
                except Exception:
                    return
                last = now

    def halt(self) -> None:
        if self._thread is not None:
            self._stop.set()
            self._now.set()
            self._thread.join(timeout=1.0)
            if self._thread.is_alive():
                cut(self._channel)
                self._thread.join()
            self._thread = None


class SessionReceiver:
    """The stream bytes of one sender, as a ``readinto`` source, across reconnects.

    ``opening`` is the sender's connection (:func:`open_connection`). With a
    ``listener`` (on the same listening socket) the sender may reconnect:
    each new connection of the same stream supersedes the current one; one
    of another stream, or a raw stream, is refused. Call :meth:`wrote` after
    every write downstream. ``flush`` pushes what was written downstream;
    then ``checkpoint(offset)`` may make it durable and returns the offset
    that is (acknowledged as verified). A receiver resuming after a restart
    starts at offset ``start`` of the stream ``identity``.
    """

    def __init__(
        self,
        opening: Opening,
        *,
        listener: Listener[Opening] | None = None,
        flush: Callable[[], object] | None = None,
        checkpoint: Callable[[int], int] | None = None,
        reconnect_timeout: float = 300.0,
        log: Callable[[str], object] | None = None,
        progress: Callable[[int], object] | None = None,
        start: int = 0,
        identity: Identity | None = None,
        ledger: tuple[int, str] | None = None,
    ) -> None:
        self._listener = listener
        self.flush = flush or (lambda: None)
        self.checkpoint = checkpoint
        self.reconnect_timeout = reconnect_timeout
        self._log = log or (lambda text: None)
        self.progress = progress or (lambda n: None)
        self.received = start  # stream bytes handed to the verifier (R)
        self.written = start  # stream bytes written downstream
        self.verified = start  # ... and flushed, and durable with a checkpoint (V, acknowledged)
        self._committed = start
        self._acker = Acker(lambda: self.verified, start)
        self.identity = identity
        self._start, self._ledger = start, ledger  # what was kept of an earlier run, told in the answer
        self.raw = opening.identity is None
        self.reconnects = 0
        self._done = False
        self._failed: e.RemoteError | None = None
        self.channel = opening.channel
        self._inbox = opening.inbox
        self._inbox.grow(BUFFER_SIZE)
        if identity is not None:
            admit(opening, identity)
        if self.raw:
            return
        self.identity = opening.identity
        self._answer_hello()
        if self._listener is not None:
            self._listener.serve(self._arrived)
        self._acker.start(self._inbox)

    def _answer_hello(self) -> None:
        ledger = self._ledger if self.received == self._start else None
        self.channel.send_all(self._inbox.machine.send(Answer(self.verified, self.received, ledger)))

    def _arrived(self, opening: Opening) -> None:
        """A new connection opened (in its own thread): refuse it, or let it supersede the current one."""
        assert self.identity is not None
        admit(opening, self.identity)
        cut(self.channel)

    # the stream

    def wrote(self, n: int) -> None:
        self.written += n
        if self.written - self._committed >= ACK_BYTES:
            self.commit()

    def durable(self, offset: int) -> None:
        """The stream is durable up to ``offset`` by the store's own time (an upload's part completed, after
        ``checkpoint`` said less): acknowledged now, not at the next commit."""
        if offset > self.verified:
            self.verified = offset
            self._acker.nudge()

    def commit(self) -> None:
        if self.written != self.verified:
            self.flush()
            self._committed = self.written
            self.verified = self.checkpoint(self.written) if self.checkpoint else self.written
            self._acker.nudge()

    def readinto(self, view: Any) -> int:
        view = memoryview(view).cast("B")
        if self._failed is not None:
            raise self._failed
        if self.raw:
            self.commit()
            try:
                n = self._read_raw(view)
            except (OSError, EOFError) as exc:  # a reset, the idle timeout
                raise e.TruncatedStream(f"the connection dropped: {exc}", offset=self.received) from exc
            self.received += n
            self.progress(n)
            return n
        total = 0
        while total < len(view):
            if self._done:
                break
            if total and not self._inbox.pending:
                break  # return what came rather than wait for more
            if not self._inbox.pending:
                self.commit()  # about to wait: what is written is verified
            try:
                n = self._read_some(view[total:])
            except e.RemoteError as exc:
                if total:
                    self._failed = exc  # raised by the next call, after the data before it
                    break
                raise
            except Exception as exc:
                if not transient(exc) and not isinstance(exc, SessionError):
                    raise
                if total:
                    break  # the drop is seen again by the next call
                self._dropped(exc)
                continue
            total += n
            self.received += n
        if total:
            self.progress(total)
        return total

    def _read_raw(self, view: memoryview) -> int:
        """Up to ``len(view)`` bytes of a raw stream; 0 at a clean end of the channel."""
        n = self._inbox.receive_payload(view)
        if n is not None:
            return n
        event = self._inbox.next_event()
        assert isinstance(event, Data)
        return self._inbox.take_data(event, view)

    def _read_some(self, view: memoryview) -> int:
        """Stream bytes into ``view``: how many (0 for a frame that carries none)."""
        n = self._inbox.receive_payload(view)
        if n is not None:
            if not n:
                raise EOFError("the connection ended inside a frame")
            return n
        event = self._inbox.next_event()
        if isinstance(event, Data):
            return self._inbox.take_data(event, view)
        self._done = True
        if isinstance(event, End):
            return 0
        assert isinstance(event, Abort)
        raise e.RemoteError(f"the sender gave up: {event.reason}", e.EXIT_CORRUPT)

    def _dropped(self, exc: BaseException) -> None:
        if self._listener is None:
            if isinstance(exc, SessionError):
                raise exc
            raise e.TruncatedStream(f"the connection dropped: {exc}", offset=self.received) from exc
        self._log(f"session: connection lost at {self.received} bytes ({exc}); waiting for the sender")
        self._acker.halt()
        drop(self.channel)
        self.commit()  # what is written is verified: the answer to the sender's return says so
        deadline = time.monotonic() + self.reconnect_timeout
        while True:
            opening = self._listener.next(deadline - time.monotonic())
            if opening is None:
                raise e.TruncatedStream(
                    f"the connection dropped and the sender did not come back within {self.reconnect_timeout:g} s",
                    offset=self.received,
                ) from exc
            self.channel, self._inbox = opening.channel, opening.inbox
            self._inbox.grow(BUFFER_SIZE)
            try:
                self._answer_hello()
            except Exception as bad:
                self._log(f"session: a new connection failed: {bad}")
                drop(self.channel)
                continue
            self.reconnects += 1
            self._acker.start(self._inbox)
            return

    # the end

    def answer(self, code: int, message: str, *, linger: float = 0.0) -> None:
        """Send the status; on success wait for the sender's confirmation (or its return).

        After a failure the sender's bytes still in flight are read and
        dropped (for at most :data:`DRAIN_SECONDS`): closing with them unread
        would reset the connection, and the status could be lost with it.
        """
        machine = self._inbox.machine
        if self.raw:
            try:
                self.channel.send_all(machine.send(Status(code, message)))
            finally:
                if code:
                    drain(self.channel)
                close_quietly(self.channel)
            return
        self._acker.halt()
        try:
            try:
                with self._acker.lock:
                    last = machine.send(Ack(self.verified)) if code == 0 else b""
                    self.channel.send_all(last + machine.send(Status(code, message)))
                confirmed = _confirmed(self._inbox)
            except Exception:
                confirmed = False
            drop(self.channel) if not confirmed else close_quietly(self.channel)
            deadline = time.monotonic() + linger
            while not confirmed and self._listener is not None and time.monotonic() < deadline:
                opening = self._listener.next(deadline - time.monotonic())
                if opening is None:
                    break
                try:
                    opening.channel.send_all(opening.inbox.machine.send(Status(code, message)))
                    confirmed = _confirmed(opening.inbox)
                except Exception:
                    pass
                drop(opening.channel) if not confirmed else close_quietly(opening.channel)
        finally:
            if self._listener is not None:
                self._listener.close()

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        self._acker.halt()
        drop(self.channel)


def _confirmed(inbox: Inbox[ReceiverConnection]) -> bool:
    """The sender's ``B`` after our status: it got it.

    Frames it sent before it saw the status are read and dropped: closing
    with them unread would reset the connection, and the status could be
    lost with it.
    """
    deadline = time.monotonic() + DRAIN_SECONDS
    inbox.channel.set_deadline(deadline)
    try:
        while time.monotonic() < deadline:  # a peer that never stops sending never makes us wait
            for event in inbox.events():
                if isinstance(event, Bye):
                    return True
                if not isinstance(event, Data | End):
                    return False
    except Exception:
        return False
    return False
