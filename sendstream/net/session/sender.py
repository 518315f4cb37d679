"""The sending end of a session: connections that survive drops, with reconnects, retries and a resend window.

The sender keeps every byte after the last acknowledged offset in memory, up
to :data:`WINDOW_SIZE` (64 MiB) plus one write of the healer (at most one
command or one checked run of the input window) and waits for
acknowledgements before it takes more. On a drop it reconnects (``retries``
attempts per outage, ``retry_delay`` doubling up to :data:`~sendstream.io.retry.MAX_BACKOFF`),
says its hello again, and resends from where the receiver's answer says. A
sender resuming after a restart (``skip_to``, ``stream``: a receiver's
token) sends only what follows the token's offset. The wire format is
:mod:`.protocol`'s.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from ... import errors as e
from ...errors import ResumeError, SessionError
from ...io.retry import Retry
from ...io.threads import started
from ...ops.identity import describe, stream_identity
from ...ops.ledger import Checkpoint
from ..tls import Channel
from .connection import Dropped, Inbox, _close, _kill, transient
from .protocol import PREFIX_SIZE, Ack, Answer, SenderConnection, Status

WINDOW_SIZE = 64 << 20
PIECE_SIZE = 64 << 10  # the sender holds and waits for acknowledgements in pieces of this size
LINE_BUFFER = 64 << 10  # what one receive of the receiver's lines takes


class Backlog:
    """The bytes taken and not acknowledged yet, held for a resend: stream offsets ``base`` on."""

    def __init__(self, base: int) -> None:
        self.base = base
        self._pieces: deque[bytes] = deque()

    def append(self, piece: bytes) -> None:
        self._pieces.append(piece)

    def drop_before(self, offset: int) -> None:
        """Forget the pieces that end at or before ``offset``."""
        while self._pieces and self.base + len(self._pieces[0]) <= offset:
            self.base += len(self._pieces.popleft())

    def restart(self, offset: int) -> None:
        """Hold nothing; the next piece starts at ``offset``."""
        self._pieces.clear()
        self.base = offset

    def since(self, offset: int) -> Iterator[memoryview]:
        """The bytes held from ``offset`` on."""
        skip = offset - self.base
        for piece in list(self._pieces):
            if skip < len(piece):
                yield memoryview(piece)[skip:]
            skip = max(skip - len(piece), 0)


def _unexpected(what: str, sent: int | None = None) -> SessionError:
    """The receiver stands where this sender cannot follow: ``what`` it says, and what to do."""
    if sent is None:
        return SessionError(f"the receiver {what}: use the receiver's latest token")
    return SessionError(
        f"the receiver {what} of a transfer and this sender has sent {sent:,}: it is still in an earlier run "
        "of this transfer (or another one). To continue that run give `--resume TOKEN` (the receiver prints it "
        "when it stops, and keeps it in FILE.part.resume); to start over, restart the receiver"
    )


def _out_of_retries(what: str, retries: int, last: BaseException | None) -> SessionError:
    """``what`` happened, and ``retries`` more attempts failed (``last`` the last's error): what to do now."""
    return SessionError(
        f"{what}, and {retries} more attempt{'s' * (retries != 1)} failed; the last: {last}. Try again later "
        "(or with more --retries). A transfer that stopped on the way continues: to a sendstream serve, send the "
        "stream again with --resumable (the service keeps what it got); to a sendstream receive, with "
        "`send --resume TOKEN`, the token it prints when it stops"
    )


class SessionSender:
    """Sends the bytes given to :meth:`write` through sessions that survive drops.

    ``connect()`` makes a new channel (TCP connect and TLS handshake).
    """

    def __init__(
        self,
        connect: Callable[[], Channel],
        *,
        retries: int = 5,
        retry_delay: float = 1.0,
        window: int = WINDOW_SIZE,
        skip_to: int = 0,
        stream: dict[str, Any] | None = None,
        log: Callable[[str], object] | None = None,
        progress: Callable[[int], object] | None = None,
        notice: Callable[[str], object] | None = None,
        kept: Callable[[Checkpoint], object] | None = None,
    ) -> None:
        self._connect = connect
        self._kept = kept  # checks the stream at a receiver's kept checkpoint (no token here); we skip to it
        self.retries = retries
        self.retry_delay = retry_delay
        self.window = max(window, PREFIX_SIZE + PIECE_SIZE)
        # resuming after a restart: the receiver holds the bytes before skip_to,
        # of the stream whose identity is ``stream``
        self._skip_to = skip_to
        self._expected = stream
        self._log = log or (lambda text: None)
        self._progress = progress or (lambda n: None)
        self._notice = notice or (lambda text: None)  # a wait for a retry, as it begins
        self._cond = threading.Condition()
        self._held = Backlog(skip_to)
        self.acked = skip_to  # the receiver's verified offset: everything before it is dropped from memory
        self.written = 0  # stream bytes taken so far
        self.identity: dict[str, Any] | None = None
        self._prefix = bytearray()
        self._channel: Channel | None = None
        self._reader: threading.Thread | None = None
        self._dead = False
        self.status: tuple[int, str] | None = None
        self.reconnects = 0
        self.resent = 0  # bytes sent more than once
        self._sessions = 0
        self._attempted = False  # a connection was tried: abort() does not try another just to say why
        self._last: BaseException | None = None
        self._broken: SessionError | None = None
        self.describe = ""

    # the stream side

    def write(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), PIECE_SIZE):
            self._write(bytes(view[start : start + PIECE_SIZE]))

    def _write(self, data: bytes) -> None:
        if self.identity is None:
            self._prefix += data[: PREFIX_SIZE - len(self._prefix)]
        if self.written < self._skip_to:
            skip = min(len(data), self._skip_to - self.written)
            self.written += skip
            data = data[skip:]
            if not data:
                if self._channel is None and len(self._prefix) >= PREFIX_SIZE and self.written == self._skip_to:
                    self._open()
                return
        with self._cond:
            while (
                self._channel is not None
                and self.written - self.acked + len(data) > self.window
                and self.written > self.acked
            ):
                if self._dead or self.status is not None:
                    break
                self._cond.wait(1.0)
        if self.status is not None:
            self._fail_on_status()
        with self._cond:
            self._held.append(data)
            self.written += len(data)
        if self._channel is None:
            if len(self._prefix) >= PREFIX_SIZE:
                self._open()
            return
        if self._dead:
            self._reconnect()
            return
        try:
            self._send_frames(self._channel, data)
        except Exception as exc:
            if not transient(exc):
                raise
            self._reconnect()

    def finish(self) -> tuple[int, str]:
        """Send the end, wait for the receiver's status (reconnecting as needed)."""
        if self._channel is None and self.status is None:
            self._open()
        while self.status is None:
            channel = self._channel
            assert channel is not None
            try:
                if self._dead:
                    raise Dropped()
                channel.send_all(SenderConnection.end(self.written))
                with self._cond:
                    while self.status is None and not self._dead:
                        self._cond.wait(1.0)
                if self.status is None:
                    raise Dropped()
            except Exception as exc:
                if not transient(exc):
                    raise
                self._reconnect()
        # confirm: a ``B`` frame tells the receiver we got its status
        if self._channel is not None:
            with contextlib.suppress(Exception):
                self._channel.send_all(SenderConnection.bye())
                self._channel.shutdown_write()
            self._stop_reader()
            with contextlib.suppress(Exception):
                self._channel.close()
            self._channel = None
        return self.status

    def abort(self, reason: str | None = None) -> None:
        """Give up: tell the receiver why (an ``X`` frame) when the connection still works,
        or on a connection of its own when the stream failed before the first one."""
        if reason is not None and self._channel is None and not self._attempted and self.status is None:
            with contextlib.suppress(Exception):
                hello = SenderConnection.hello(self.identify())
                self._channel = self._connect()
                self._channel.send_all(hello)
                Inbox(self._channel, SenderConnection(), 4096).next_event()  # the receiver's answer
        if reason is not None and self._channel is not None and not self._dead:
            with contextlib.suppress(Exception):
                self._channel.send_all(SenderConnection.abort(reason))
                self._channel.shutdown_write()
        self._dead = True
        _kill(self._channel)
        self._stop_reader()
        _close(self._channel)
        self._channel = None

    @property
    def skipped(self) -> int:
        """Bytes not sent because the receiver had them before this sender started (resume after a restart)."""
        return self._skip_to

    def _fail_on_status(self) -> None:
        assert self.status is not None
        code, message = self.status
        raise e.RemoteError(f"the receiver failed: {message}", code or e.EXIT_CORRUPT)

    # connections

    def identify(self) -> dict[str, Any]:
        """The stream's identity (from what was written so far, at most its first bytes); checked when resuming."""
        if self.identity is None:
            self.identity = stream_identity(bytes(self._prefix))
            self._prefix = bytearray()
            if self._expected is not None and self.identity != self._expected:
                ours, theirs = describe(self.identity), describe(self._expected)
                if ours == theirs:
                    ours += f" whose first {self.identity['prefix']} bytes differ"
                raise ResumeError(f"this is not the stream the resume token is for: {ours}, not {theirs}")
        return self.identity

    def _open(self) -> None:
        self.identify()
        self._reconnect(first=True)

    def _send_frames(self, channel: Channel, data: bytes | memoryview) -> None:
        for frame in SenderConnection.data(data):
            channel.send_all(frame)
            self._progress(len(frame) - 5)

    def _stop_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=0.2)
            if self._reader.is_alive():
                _kill(self._channel)
                self._reader.join()
        self._reader = None

    def _drop(self) -> None:
        if self._channel is not None:
            self._dead = True
            _kill(self._channel)
            self._stop_reader()
            _close(self._channel)
            self._channel = None

    def _reconnect(self, *, first: bool = False) -> None:
        failures = 0
        self._attempted = True
        self._drop()
        if self._broken is not None:
            raise self._broken
        while True:
            if failures:
                if failures > self.retries:
                    raise _out_of_retries(
                        "no connection" if first else "the connection dropped", self.retries, self._last
                    )
                delay = Retry(self.retries, self.retry_delay).wait(failures)
                lost = "no connection" if first else "connection lost"
                self._notice(f"{lost}; retry {failures}/{self.retries} in {delay:g} s")
                time.sleep(delay)
            try:
                self._channel = self._connect()
                self._session(self._channel)
                return
            except Exception as exc:
                self._drop()
                if not transient(exc):
                    raise
                self._last = exc.with_traceback(None)
                failures += 1

    def _session(self, channel: Channel) -> None:
        """Hello, answer, resend (or the final status, from a receiver that finished)."""
        self.describe = channel.describe()
        channel.send_all(SenderConnection.hello(self.identity))
        inbox = Inbox(channel, SenderConnection(), LINE_BUFFER)
        answer = inbox.next_event()
        if isinstance(answer, Status):
            self.status = answer.code, answer.message
            self._dead = False
            return
        assert isinstance(answer, Answer)  # the machine's: a hello gets nothing else
        verified, resume = answer.verified, answer.resume
        with self._cond:
            kept = not self._skip_to and answer.ledger is not None and self._kept is not None
            if resume > self.written and (self._skip_to or kept) and not self._sessions:
                # a receiver still running got further with the sender before us, or one that kept an
                # earlier run of this transfer: check the stream against it there, and catch up
                if kept:
                    assert self._kept is not None and answer.ledger is not None and self.identity is not None
                    self._kept(Checkpoint(self.identity, resume, *answer.ledger))
                    self._log(f"session: the receiver kept {resume} bytes of an earlier run; resuming there")
                self._held.restart(resume)
                self._skip_to = resume
                self.acked = verified
            elif self._skip_to and resume < self._skip_to and not self._sessions:
                raise _unexpected(f"resumes at offset {resume}, before the token's {self._skip_to}")
            if max(verified, resume) > max(self.written, self._skip_to):
                raise _unexpected(f"already has {max(verified, resume):,} bytes", self.written)
            if not self._sessions:  # what a receiver had from an earlier run is not sent, nor counted as sent
                self._skip_to = max(self._skip_to, resume)
            self._advance(verified)
            if resume < self._held.base:
                raise SessionError(
                    f"the receiver asks to resume at offset {resume}, before offset {self._held.base}, "
                    "which is no longer held"
                )
            self._dead = False
        if self._sessions:
            again = self.written - resume
            self.reconnects, self.resent = self.reconnects + 1, self.resent + again
            self._log(f"session: receiver verified {verified:,} bytes; resuming at offset {resume} ({again:,} resent)")
        self._sessions += 1
        self._reader = started(self._read_acks, inbox)
        for piece in self._held.since(resume):
            self._send_frames(channel, piece)

    def _advance(self, offset: int) -> None:
        """Drop acknowledged bytes (holding the lock)."""
        if offset <= self.acked:
            return
        self.acked = offset
        self._held.drop_before(offset)
        self._cond.notify_all()

    def _read_acks(self, inbox: Inbox[SenderConnection]) -> None:
        try:
            while True:
                event = inbox.next_event()
                if isinstance(event, Ack):
                    with self._cond:
                        if event.verified > self.written:
                            raise SessionError(
                                f"the receiver acknowledged {event.verified} bytes of the {self.written} sent"
                            )
                        self._advance(event.verified)
                elif isinstance(event, Status):
                    with self._cond:
                        self.status = event.code, event.message
                        self._cond.notify_all()
                    return
        except Exception as exc:
            with self._cond:
                if isinstance(exc, SessionError):
                    self._broken = exc.with_traceback(None)  # no reconnect cures a receiver that breaks the protocol
                self._dead = True
                self._cond.notify_all()
