"""Moving streams over the network: addresses, taking a sender, the send and receive loops.

The bytes on the wire are the stream itself, inside TLS (or raw TCP when
asked). The sender checks and heals every command before it leaves (the
same :class:`~sendstream.repair.Healer` as ``repair``); the receiver checks
every command again before it writes it downstream, and answers with one
status line before it closes, success or failure. A sender reports success
only on that explicit success status (:class:`PlainSender` reads it while it
sends). :func:`accept_sender` takes the first connection that shakes hands
and says hello; the others are refused (:mod:`sendstream.listener`).
"""

from __future__ import annotations

import contextlib
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

from .. import errors as e
from ..codec.decoder import Framer
from ..io.files import file_events, is_regular
from ..ops.repair import Healer
from .listener import MAX_PENDING
from .session.messages import STATUS_PREFIX
from .tls import Channel

if TYPE_CHECKING:
    from ..ops.resume import Checkpoint, Journal
    from .session.drivers import SessionReceiver

CONNECT_TIMEOUT = 30.0
BACKLOG = 16  # the accept loop takes connections at once: this only absorbs bursts
MAX_STATUS = 4096


def parse_address(text: str, *, listen: bool = False) -> tuple[str, int]:
    """``HOST:PORT``, ``[IPv6]:PORT``; for listening ``*:PORT`` means every address."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise e.UsageError(f"expected HOST:PORT, got {text!r}")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not host:
        raise e.UsageError(f"no host in {text!r}: name one (or '*' to listen on every address)")
    if host == "*":
        if not listen:
            raise e.UsageError("'*' only makes sense with --listen")
        host = "::"
    return host, int(port)


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket; ``::`` listens on every IPv6 and IPv4 address."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    last: OSError | None = None
    for family, kind, proto, _, address in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6 and host == "::":
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.bind(address)
            sock.listen(BACKLOG)
            return sock
        except OSError as exc:
            sock.close()
            last = exc
    raise last or OSError(f"cannot listen on {host}:{port}")


def accept_sender(
    server: socket.socket,
    handshake: Callable[[socket.socket, float], Channel],
    *,
    timeout: float,
    idle_timeout: float | None,
    warn: Callable[[str], object],
    log: Callable[[str], object] | None = None,
    reconnect_timeout: float | None = None,
    resume: Checkpoint | None = None,
    max_pending: int = MAX_PENDING,
) -> SessionReceiver:
    """The session of the first connection to ``server`` that shakes hands and says hello, or sends a raw stream.

    ``handshake(sock, seconds)`` makes the channel of an accepted socket
    (:func:`~sendstream.tls.accept_channel`). Connections are opened
    concurrently by a :class:`~sendstream.listener.Listener`, each within
    ``timeout`` seconds of its accept; every one that fails is refused and
    named to ``warn``, and the wait goes on for ever. Once open, each read
    of the transfer waits at most ``idle_timeout``. With
    ``reconnect_timeout`` the sender may reconnect after a drop; with
    ``resume`` only a session of that checkpoint's stream is taken, and it
    starts at the checkpoint's offset.
    """
    from .listener import Listener
    from .session.drivers import Opening, SessionReceiver, admit, open_connection

    def open_one(sock: socket.socket, deadline: float) -> Opening:
        return open_connection(sock, handshake, deadline, timeout=timeout, idle_timeout=idle_timeout)

    listener = Listener(server, open_one, Opening.close, timeout=timeout, log=warn, max_pending=max_pending)
    expected = resume.stream if resume else None
    try:
        while True:
            opening = listener.first((lambda o: admit(o, expected)) if expected is not None else None)
            try:
                session = SessionReceiver(
                    opening,
                    listener=listener if reconnect_timeout is not None else None,
                    reconnect_timeout=reconnect_timeout or 0.0,
                    log=log,
                    start=resume.offset if resume else 0,
                    identity=expected,
                )
            except Exception as exc:  # the answer to its hello could not be sent: that connection is gone
                opening.close()
                warn(f"the connection that opened first failed: {exc}")
                continue
            if reconnect_timeout is None:
                listener.close()
            return session
    except BaseException:
        listener.close()
        raise


def connect(host: str, port: int, timeout: float = CONNECT_TIMEOUT) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


class ChannelReader:
    """A channel as a ``readinto`` source for :class:`~sendstream.files.BufferedWindows`."""

    def __init__(self, channel: Channel, progress: Progress | None = None) -> None:
        self._channel = channel
        self._progress = progress

    def readinto(self, buf: memoryview) -> int:
        n = self._channel.recv_into(buf)
        if self._progress:
            self._progress.add(n)
        return n


class Progress:
    """A one-line progress report on a terminal; silent otherwise."""

    def __init__(self, label: str, *, enabled: bool | None = None, stream: Any = None) -> None:
        self._stream = stream or sys.stderr
        self._enabled = self._stream.isatty() if enabled is None else enabled
        self._label = label
        self.bytes = 0
        self.started = time.monotonic()
        self._shown = 0.0

    def add(self, n: int) -> None:
        self.bytes += n
        if self._enabled and (now := time.monotonic()) - self._shown >= 0.25:
            self._shown = now
            rate = self.bytes / max(now - self.started, 1e-9) / 1e6
            self._stream.write(f"\r{self._label}: {self.bytes / 1e6:,.1f} MB, {rate:,.1f} MB/s ")
            self._stream.flush()

    def done(self) -> None:
        if self._enabled:
            self._stream.write("\r\x1b[K")
            self._stream.flush()

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


@dataclass
class Summary:
    """What a transfer did."""

    bytes: int
    seconds: float
    path: str
    restarts: int = 0
    status: str = ""
    reconnects: int = 0
    resent: int = 0
    skipped: int = 0  # resumed after a restart: the bytes before this offset were not sent

    def line(self, verb: str) -> str:
        rate = self.bytes / max(self.seconds, 1e-9) / 1e6
        text = f"{verb} {self.bytes} bytes in {self.seconds:.2f} s ({rate:,.1f} MB/s); {self.path}"
        if self.skipped:
            text += f"; resumed at offset {self.skipped}"
        if self.restarts:
            text += f"; {self.restarts} restart{'s' * (self.restarts != 1)} healed"
        if self.reconnects:
            text += f"; resumed after {self.reconnects} drop{'s' * (self.reconnects != 1)}"
            if self.resent:
                text += f" ({self.resent} bytes sent again)"
        return text


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
        self._sent = threading.Event()  # our direction is closed: from now on waiting for the status is bounded
        self._reader = threading.Thread(target=self._read_status, daemon=True)
        self._reader.start()

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
        from .session.drivers import _close

        _close(self._channel)

    def _read_status(self) -> None:
        """The receiver's status line (in the reader thread); a failure interrupts the sending."""
        got = bytearray()
        buf = bytearray(MAX_STATUS)
        try:
            while len(got) < MAX_STATUS and b"\n" not in got:
                try:
                    n = self._channel.recv_into(buf)
                except TimeoutError:
                    if self._sent.is_set():
                        raise
                    continue  # while we send, the receiver has nothing to say
                if not n:
                    break
                got += buf[:n]
            if got.startswith(STATUS_PREFIX) or (got and self._expect):
                from .session.messages import parse_status

                self.status = parse_status(bytes(got).split(b"\n", 1)[0])
        except Exception as exc:
            self._error = exc.with_traceback(None)
        if self.status is not None and self.status[0]:
            self._channel.interrupt()

    def _raise_failure(self) -> None:
        if self.status is not None and self.status[0]:
            raise e.RemoteError(f"the receiver failed: {self.status[1]}", self.status[0])

    def _failed(self, exc: Exception) -> None:
        """A send failed: the receiver's status, when it sent one, says why better."""
        self._reader.join(timeout=5.0)
        if self.status is not None and self.status[0]:
            raise e.RemoteError(f"the receiver failed: {self.status[1]}", self.status[0]) from exc


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
    from ..ops.resume import Ledger
    from .session.drivers import WINDOW_SIZE, SessionSender

    sender = SessionSender(
        connect,
        retries=retries,
        retry_delay=retry_delay,
        window=window or WINDOW_SIZE,
        skip_to=resume.offset if resume else 0,
        stream=resume.stream if resume else None,
        log=log,
        progress=progress.add,
    )
    ledger = Ledger(resume) if resume else None
    healer = Healer(sender.write, ledger=ledger)
    try:
        for event in file_events(source, Framer(), healer.batch):
            healer.event(event)
        if ledger is not None:
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


def receive_resumable(
    session: Any, write: Callable[[Any], object], progress: Progress, journal: Journal | None = None
) -> Summary:
    """Receive through a :class:`~sendstream.session.SessionReceiver`: check every command, write only checked ones.

    With a ``journal`` the output is made durable at checkpoints; a resumed
    journal's kept prefix is checked again first, and the session's bytes
    follow it.
    """
    from ..ops.resume import Chain, Ledger, after

    def counted(data: Any) -> None:
        write(data)
        session.wrote(len(data))

    source: Any = session
    out: Callable[[Any], object] = counted
    ledger = None
    if journal is not None:
        ledger = Ledger(journal.checkpoint)
        session.checkpoint = lambda offset: journal.commit(offset, session.identity, ledger)
        if journal.checkpoint is not None:
            source, out = Chain(journal.prefix(), session), after(journal.offset, counted)
    healer = Healer(out, ledger=ledger)
    session.progress = progress.add
    for event in file_events(source, Framer(), healer.batch):
        healer.event(event)
    session.commit()
    progress.done()
    return Summary(
        progress.bytes, progress.seconds, session.channel.describe(), healer.restart_count, "", session.reconnects
    )


def receive_stream(channel: Channel, write: Callable[[Any], object], progress: Progress) -> Summary:
    """Receive a stream, check every command and write only checked ones."""
    healer = Healer(write)
    reader = ChannelReader(channel, progress)
    for event in file_events(reader, Framer(), healer.batch):  # type: ignore[arg-type]
        healer.event(event)
    progress.done()
    return Summary(progress.bytes, progress.seconds, channel.describe(), healer.restart_count)
