"""The sending end of a session: the threads and the connections of a :class:`~.resume.Resumption`.

The sender keeps every byte after the last acknowledged offset in memory, up
to :data:`~.resume.WINDOW_SIZE` (64 MiB) plus one write of the healer (at most one
command or one checked run of the input window) and waits for
acknowledgements before it takes more. On a drop it reconnects (``retries``
attempts per outage, ``retry_delay`` doubling up to :data:`~sendstream.io.retry.MAX_BACKOFF`),
says its hello again, and resends from where the receiver's answer says. A
sender resuming after a restart (``skip_to``, ``stream``: a receiver's
token) sends only what follows the token's offset. What to send, resend,
check and when to give up is :class:`~.resume.Resumption`'s; this driver
connects, moves bytes and sleeps. The wire format is :mod:`.protocol`'s.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from .. import errors as e
from ..io.threads import started
from ..transfer.identity import Identity
from ..transfer.ledger import Checkpoint
from ..transport.tls import Channel
from .connection import Dropped, Inbox, cut, drop, transient
from .protocol import Abort, Ack, Answer, Bye, Data, End, Hello, SenderConnection, Status
from .resume import PIECE_SIZE, WINDOW_SIZE, Resumption

LINE_BUFFER = 64 << 10  # what one receive of the receiver's lines takes


class SessionSender:
    """Sends the bytes given to :meth:`write` through sessions that survive drops.

    ``connect()`` makes a new channel (TCP connect and TLS handshake);
    ``kept`` checks the stream at a checkpoint a receiver kept of an earlier
    run (without a token: the sender then skips to it).
    """

    def __init__(
        self,
        connect: Callable[[], Channel],
        *,
        retries: int = 5,
        retry_delay: float = 1.0,
        window: int = WINDOW_SIZE,
        skip_to: int = 0,
        stream: Identity | None = None,
        log: Callable[[str], object] | None = None,
        progress: Callable[[int], object] | None = None,
        notice: Callable[[str], object] | None = None,
        kept: Callable[[Checkpoint], object] | None = None,
    ) -> None:
        self._connect = connect
        self._kept = kept
        self.plan = Resumption(
            skip_to=skip_to,
            stream=stream,
            window=window,
            retries=retries,
            retry_delay=retry_delay,
            checks_kept=kept is not None,
        )
        self._log = log or (lambda text: None)
        self._progress = progress or (lambda n: None)
        self._notice = notice or (lambda text: None)  # a wait for a retry, as it begins
        self._cond = threading.Condition()  # guards the plan between the writer and the reader of acks
        self._channel: Channel | None = None
        self._machine = SenderConnection()  # the current connection's
        self._reader: threading.Thread | None = None
        self._dead = False
        self.status: tuple[int, str] | None = None
        self._attempted = False  # a connection was tried: abort() does not try another just to say why
        self.describe = ""

    @property
    def written(self) -> int:
        """Stream bytes taken so far."""
        return self.plan.written

    @property
    def acked(self) -> int:
        """The receiver's verified offset."""
        return self.plan.acked

    @property
    def reconnects(self) -> int:
        return self.plan.reconnects

    @property
    def resent(self) -> int:
        """Bytes sent more than once."""
        return self.plan.resent

    @property
    def skipped(self) -> int:
        """Bytes not sent because the receiver had them before this sender started (resume after a restart)."""
        return self.plan.skip_to

    # the stream side

    def write(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), PIECE_SIZE):
            self._write(bytes(view[start : start + PIECE_SIZE]))

    def _write(self, data: bytes) -> None:
        data = self.plan.take(data)
        if not data:
            if self._channel is None and self.plan.known and self.plan.caught_up:
                self._open()
            return
        with self._cond:
            while self._channel is not None and not self.plan.fits(len(data)):
                if self._dead or self.status is not None:
                    break
                self._cond.wait(1.0)
        if self.status is not None:
            self._fail_on_status()
        with self._cond:
            self.plan.hold(data)
        if self._channel is None:
            if self.plan.known:
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
                channel.send_all(self._machine.send(End(self.plan.written)))
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
                self._channel.send_all(self._machine.send(Bye()))
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
                self._machine = SenderConnection()
                hello = self._machine.send(Hello(self.identify()))
                self._channel = self._connect()
                self._channel.send_all(hello)
                Inbox(self._channel, self._machine, 4096).next_event()  # the receiver's answer
        if reason is not None and self._channel is not None and not self._dead:
            with contextlib.suppress(Exception):
                self._channel.send_all(self._machine.send(Abort(reason)))
                self._channel.shutdown_write()
        self._dead = True
        cut(self._channel)
        self._stop_reader()
        drop(self._channel)
        self._channel = None

    def _fail_on_status(self) -> None:
        assert self.status is not None
        code, message = self.status
        raise e.RemoteError(f"the receiver failed: {message}", code or e.EXIT_CORRUPT)

    # connections

    def identify(self) -> Identity:
        """The stream's identity (:meth:`.resume.Resumption.identify`)."""
        return self.plan.identify()

    def _open(self) -> None:
        self.identify()
        self._reconnect(first=True)

    def _send_frames(self, channel: Channel, data: bytes | memoryview) -> None:
        channel.send_all(self._machine.send(Data(memoryview(data))))
        self._progress(len(data))

    def _stop_reader(self) -> None:
        if self._reader is not None:
            self._reader.join(timeout=0.2)
            if self._reader.is_alive():
                cut(self._channel)
                self._reader.join()
        self._reader = None

    def _drop(self) -> None:
        if self._channel is not None:
            self._dead = True
            cut(self._channel)
            self._stop_reader()
            drop(self._channel)
            self._channel = None

    def _reconnect(self, *, first: bool = False) -> None:
        self._attempted = True
        self._drop()
        self.plan.reconnecting()
        while True:
            try:
                self._channel = self._connect()
                self._session(self._channel)
                return
            except Exception as exc:
                self._drop()
                if not transient(exc):
                    raise
                wait = self.plan.failed(exc, first=first)
                self._notice(wait.notice)
                time.sleep(wait.seconds)

    def _session(self, channel: Channel) -> None:
        """Hello, answer, resend (or the final status, from a receiver that finished)."""
        self.describe = channel.describe()
        self._machine = SenderConnection()
        channel.send_all(self._machine.send(Hello(self.identify())))
        inbox = Inbox(channel, self._machine, LINE_BUFFER)
        answer = inbox.next_event()
        if isinstance(answer, Status) and answer.code and answer.message.startswith("busy:"):
            # the receiver has no room now, or another service holds the stream: a later connection may
            raise e.PeerBusy(f"the receiver answered: {answer.message}")
        if isinstance(answer, Status):
            self.status = answer.code, answer.message
            self._dead = False
            return
        assert isinstance(answer, Answer)  # the machine's: a hello gets nothing else
        with self._cond:
            resume = self.plan.answered(answer)
            self._cond.notify_all()
            if resume.kept is not None:
                assert self._kept is not None
                self._kept(resume.kept)
            self._dead = False
        if resume.note:
            self._log(resume.note)
        self._reader = started(self._read_acks, inbox)
        for piece in self.plan.held.since(resume.offset):
            self._send_frames(channel, piece)

    def _read_acks(self, inbox: Inbox[SenderConnection]) -> None:
        try:
            while True:
                event = inbox.next_event()
                if isinstance(event, Ack):
                    with self._cond:
                        if self.plan.acked_to(event.verified):
                            self._cond.notify_all()
                elif isinstance(event, Status):
                    with self._cond:
                        self.status = event.code, event.message
                        self._cond.notify_all()
                    return
        except Exception as exc:
            with self._cond:
                self.plan.lost(exc)
                self._dead = True
                self._cond.notify_all()
