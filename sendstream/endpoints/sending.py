"""The sending end: dial the receiver, check and heal every command, send it, hear the receiver's status.

The bytes on the wire are the stream itself, inside TLS (or raw TCP when
asked). The sender checks and heals every command before it leaves (the
same :class:`~sendstream.ops.repair.Healer` as ``repair``); the receiver
checks every command again before it writes it downstream, and answers with
one status line before it closes, success or failure. A sender reports
success only on that explicit success status (:class:`PlainSender` reads it
while it sends). :func:`connector` dials, :func:`send` sends a whole stream.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, BinaryIO, cast

from .. import errors as e
from ..codec.framer import Framer
from ..io.readahead import ReadAhead
from ..io.retry import Retry
from ..io.threads import started
from ..io.windows import file_events, is_regular
from ..ops.repair import Healer
from ..session.connection import Inbox, transient
from ..session.offer import offer
from ..session.protocol import RawStream, SenderConnection, Status
from ..transfer.progress import Progress, Summary
from ..transport.tls import Channel

if TYPE_CHECKING:
    from ..transfer.ledger import Checkpoint
    from ..transport.address import Dialing


MAX_STATUS = 4096  # what one receive of the status takes


class PlainSender:
    """The plain stream through one channel, with the receiver's status read as it comes, in a thread.

    The receiver answers with one status line, success or failure, before
    it closes. A failure status that arrives while the stream is still being
    sent stops the sending at once: a send blocked on the socket is
    interrupted, and the failure is raised (as :class:`~sendstream.errors.RemoteError`)
    by the write, or by :meth:`finish`. Success needs the receiver's explicit
    success status; with ``expect_status=False`` (the peer is not sendstream:
    stunnel, socat, openssl) the stream counts as delivered once it is sent
    and closed.
    """

    reconnects = 0
    resent = 0

    def __init__(self, channel: Channel, *, expect_status: bool = True) -> None:
        self._channel = channel
        self.describe = channel.describe()
        self._expect = expect_status
        self.status: tuple[int, str] | None = None
        self._error: BaseException | None = None  # why no status came
        self._ended = False  # the receiver's end came without a status
        self._sent = threading.Event()  # our direction is closed: from now on waiting for the status is bounded
        self._reader = started(self._read_status)

    def write(self, data: Any) -> None:
        self._raise_failure()
        try:
            self._channel.send_all(data)
        except Exception as exc:
            self._failed(exc)
            raise

    def sendfile(self, fd: int, offset: int, count: int) -> int:
        """As :meth:`~sendstream.tls.Channel.sendfile`."""
        self._raise_failure()
        try:
            return self._channel.sendfile(fd, offset, count)
        except Exception as exc:
            self._failed(exc)
            raise

    def finish(self) -> tuple[int, str]:
        """End the stream (TLS: close_notify), wait for the receiver's status and close: ``(code, message)``."""
        self._raise_failure()
        try:
            self._channel.shutdown_write()
        except Exception as exc:
            self._failed(exc)
            raise
        self._sent.set()
        self._reader.join()
        with contextlib.suppress(Exception):
            self._channel.close()
        if self.status is not None:
            return self.status
        if not self._expect:
            return 0, ""
        why = f" ({self._error})" if self._error else ""
        raise e.RemoteError(f"the receiver sent no status: the stream may not have been stored{why}", e.EXIT_IO)

    def abort(self, reason: str | None = None) -> None:
        """Cut the connection without close_notify: the receiver sees a truncated stream (no room for ``reason``)."""
        self._channel.interrupt()
        self._reader.join()
        from ..session.connection import drop

        drop(self._channel)

    def _read_status(self) -> None:
        """The receiver's status line (in the reader thread), as the machine of a raw stream reads it; a
        failure interrupts the sending."""
        machine = SenderConnection()
        machine.send(RawStream())  # the stream's own bytes say it: the machine now waits for the status
        inbox = Inbox(self._channel, machine, MAX_STATUS)
        try:
            while self.status is None:
                try:
                    event = inbox.next_event()
                except TimeoutError:
                    if self._sent.is_set():
                        raise
                    continue  # while we send, the receiver has nothing to say
                assert isinstance(event, Status)  # the machine's: a raw stream gets nothing else
                self.status = event.code, event.message
        except EOFError:
            self._ended = True  # closed without a word
        except Exception as exc:
            self._error, self._ended = exc.with_traceback(None), True
        if self.status is not None and self.status[0]:
            self._channel.interrupt()

    def _raise_failure(self) -> None:
        if self.status is not None and self.status[0]:
            raise e.RemoteError(f"the receiver failed: {self.status[1]}", self.status[0])

    def _failed(self, exc: Exception) -> None:
        """A send failed: the receiver's status, when it sent one, says why better; a socket's error names
        the receiver (a broken pipe here is the receiver gone, never a reader of ours that left)."""
        self._reader.join(timeout=5.0)
        if self.status is not None and self.status[0]:
            raise e.RemoteError(f"the receiver failed: {self.status[1]}", self.status[0]) from exc
        where = f"sending to {self._channel.peer}"
        if isinstance(exc, (BrokenPipeError, ConnectionResetError)) or self._ended:
            # the receiver went away (its end, seen by the status reader first, or a broken pipe): said so,
            # whatever our write then ran into (TLS: a session invalidated)
            seen = e.reason(self._error or exc)
            raise e.RemoteError(
                f"{where}: the receiver went away before the whole stream was sent ({seen})", e.EXIT_IO
            ) from exc
        if isinstance(exc, OSError) and not isinstance(exc, e.SendStreamError):
            raise e.NetworkError(where, exc) from exc


def send_stream(source: BinaryIO, channel: Channel, progress: Progress, *, expect_status: bool = True) -> Summary:
    """Check, heal and send a whole stream through a :class:`PlainSender`; returns once the receiver answered."""
    sender = PlainSender(channel, expect_status=expect_status)

    def write(data: Any) -> None:
        sender.write(data)
        progress.add(len(data))

    copy_range = None
    if channel.tx_path == "kernel" and is_regular(source):
        fd, base = source.fileno(), source.tell()

        def copy_range(offset: int, length: int) -> None:
            # zero-copy: the kernel reads the page cache and encrypts
            while length:
                sent = sender.sendfile(fd, base + offset, length)
                if not sent:
                    raise e.TruncatedStream("the input file shrank while being sent", offset=offset)
                offset += sent
                length -= sent
                progress.add(sent)

    healer = Healer(write, copy_range=copy_range)
    try:
        for event in file_events(source, Framer(), healer.batch):
            healer.event(event)
        code, message = sender.finish()
    except BaseException:
        sender.abort()
        raise
    progress.done()
    summary = Summary(healer.written, progress.seconds, channel.describe(), healer.restart_count, f"{code} {message}")
    if code:
        raise e.RemoteError(f"the receiver failed: {message}", code)
    return summary


def send_resumable(
    source: BinaryIO,
    connect: Callable[[], Channel],
    progress: Progress,
    *,
    retries: int = 5,
    retry_delay: float = 1.0,
    window: int | None = None,
    log: Callable[[str], object] | None = None,
    resume: Checkpoint | None = None,
) -> Summary:
    """Check, heal and send a whole stream in a session (:mod:`sendstream.session`) that survives drops.

    With ``resume`` (from a receiver's token) the stream must be the token's
    up to its offset, and only what follows is sent.
    """
    from ..session.resume import WINDOW_SIZE
    from ..session.sender import SessionSender
    from ..transfer.ledger import Ledger

    ledger = Ledger(resume)
    sender = SessionSender(
        connect,
        retries=retries,
        retry_delay=retry_delay,
        window=window or WINDOW_SIZE,
        skip_to=resume.offset if resume else 0,
        stream=resume.stream if resume else None,
        log=log,
        progress=progress.add,
        notice=progress.note,
        kept=lambda checkpoint: ledger.expect(checkpoint, "what the receiver kept"),
    )
    healer = Healer(sender.write, ledger=ledger)
    try:
        for event in file_events(source, Framer(), healer.batch):
            healer.event(event)
        sender.identify()  # a short stream: the identity first, it says more than the ledger
        ledger.finish()
        code, message = sender.finish()
    except BaseException as exc:
        sender.abort(str(exc) if isinstance(exc, e.SendStreamError) else None)
        raise
    progress.done()
    skipped = sender.skipped
    summary = Summary(
        healer.written - skipped,
        progress.seconds,
        sender.describe,
        healer.restart_count,
        f"{code} {message}",
        sender.reconnects,
        sender.resent,
        skipped,
    )
    if code:
        raise e.RemoteError(f"the receiver failed: {message}", code)
    return summary


def list_held(connect: Callable[[], Channel]) -> list[dict[str, Any]]:
    """Ask a ``sendstream serve`` which snapshots it holds for us (the identity our key proves)."""
    from ..session.connection import BUFFER_SIZE
    from ..session.protocol import Listed, ListRequest

    snapshots: list[dict[str, Any]] = []
    machine = SenderConnection()
    with connect() as channel:
        channel.send_all(machine.send(ListRequest()))
        inbox = Inbox(channel, machine, BUFFER_SIZE)
        while True:
            try:
                event = inbox.next_event()
            except EOFError:
                raise e.RemoteError("the receiver closed without a list: is it sendstream serve?", e.EXIT_IO) from None
            if isinstance(event, Status):
                if event.code:
                    raise e.RemoteError(f"the receiver refused: {event.message.removeprefix('refused: ')}", event.code)
                return snapshots
            assert isinstance(event, Listed)  # the machine's: a listing gets nothing else
            snapshots.append(event.snapshot)


def connector(dialing: Dialing, log: Callable[[str], object] | None = None) -> Callable[[], Channel]:
    """A new channel (:meth:`~sendstream.transport.address.Dialing.open`, then the offer to compress when
    ``dialing.compress``) on every call; the first is described to ``log``."""
    shown = False

    def connect() -> Channel:
        nonlocal shown
        channel = dialing.open()
        if dialing.compress is not None:
            try:
                channel = offer(channel, dialing.compress, dialing.timeout)
            except BaseException:
                with contextlib.suppress(Exception):
                    channel.close()
                raise
        if not shown:
            shown = True
            if log is not None:
                log(channel.describe())
        return channel

    return connect


def send(
    source: BinaryIO,
    connect: Callable[[], Channel],
    progress: Progress,
    *,
    resumable: bool = False,
    resume: Checkpoint | None = None,
    expect_status: bool = True,
    retries: int = 5,
    retry_delay: float = 1.0,
    log: Callable[[str], object] | None = None,
    read_ahead: int = 0,
) -> Summary:
    """Check, heal and send ``source``: the plain stream through one channel (:func:`send_stream`), or,
    ``resumable`` or from a receiver's ``resume`` checkpoint, in a session that survives drops
    (:func:`send_resumable`). Returns once the receiver reported success.

    With ``read_ahead`` a source that is not a regular file is read up to that
    many bytes ahead in a thread (:class:`~sendstream.io.readahead.ReadAhead`).
    """
    if is_regular(source):
        if progress.total is None:
            progress.total = os.fstat(source.fileno()).st_size - source.tell()
    elif read_ahead:
        source = cast(BinaryIO, ReadAhead(source, read_ahead))
    if not resumable and resume is None:
        # nothing of the stream is sent before the first connection: a refused or busy one is tried again
        first = Retry(retries, retry_delay).call(connect, transient, progress.note)
        with first as channel:
            return send_stream(source, channel, progress, expect_status=expect_status)
    return send_resumable(source, connect, progress, retries=retries, retry_delay=retry_delay, log=log, resume=resume)
