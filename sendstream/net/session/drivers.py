"""The session layer: resumable transfers over a (TLS) channel.

Version 1 of the protocol, inside the channel (TLS or plain TCP):

sender -> receiver
    ``sendstream-session 1 {JSON}\\n``: the hello. JSON holds ``stream``,
    the stream identity: ``uuid``, ``ctransid``, ``parent_uuid``,
    ``parent_ctransid`` (null for a full send) and ``version`` of the first
    command (``subvol`` or ``snapshot``), and ``prefix`` / ``sha256``: the
    length and SHA-256 of the first bytes of the (healed) stream, up to
    :data:`PREFIX_SIZE`. A sender resuming after a restart
    (:mod:`sendstream.resume`) sends the same hello: the receiver's answer
    says where it stands.

    Then frames: ``D`` + u32 big-endian length + that many stream bytes;
    ``E`` + u64 big-endian total length of the stream: the end. A connection
    that ends (or fails, or stalls) before ``E`` is a drop, not an end, even
    on plain TCP.

receiver -> sender, lines
    ``sendstream-session 1 {"verified": V, "resume": R}\\n``: the answer to
    the hello. V is the offset of the last command boundary the receiver
    verified, wrote downstream and flushed (0 when new); R >= V is where the
    sender continues: the bytes between V and R already reached the
    receiver's verifier in this run (they came through the authenticated
    channel) and are not sent again.

    ``ack V\\n``: V as it grows, at least every :data:`ACK_BYTES` of output
    or :data:`ACK_SECONDS`, and every :data:`KEEPALIVE_SECONDS` anyway. A
    receiver that keeps a journal (:mod:`sendstream.resume`) reports as V
    only offsets it made durable, so a sender still holds what a restarted
    receiver may have lost.

    ``sendstream-status CODE MESSAGE\\n``: the end (CODE 0: the whole stream
    was verified and written). After a status the sender closes its
    ``B``: the sender got the status (then it closes). A receiver that
    sees no ``B`` answers a reconnecting sender's hello with the status
    again, for up to a minute.

A receiver that reads ``btrfs-stream`` first takes a raw stream (an older
sender, ``openssl s_client``, ``socat``): no session, no resume. A
connection must finish its handshake and these first words (a hello of at
most :data:`~sendstream.messages.MAX_LINE` bytes, or that header) within one
deadline (:func:`open_connection`); every line is parsed with limits, and a
malformed one raises :class:`SessionError` (:mod:`sendstream.messages`).

Reconnect within one run: the sender keeps every byte after the last
acknowledged offset in memory, up to :data:`WINDOW_SIZE` (64 MiB) plus one
write of the healer (at most one command or one checked run of the input
window) and waits for acknowledgements before it takes more. On a drop it
reconnects (``retries`` attempts per outage, ``retry_delay`` doubling up to
30 s), sends the hello again, and resends from R. The receiver keeps its
verifier, its output and its ``--exec`` child across connections, and a new
connection from the same stream supersedes the current one once it said
its hello (a stalled connection is dropped as soon as the sender
reconnects); one of another stream is refused, and the current one goes on.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ... import errors as e
from ...errors import ResumeError, SessionError, TlsError, TruncationError
from ...ops.identity import describe, printable, stream_identity
from ..listener import Listener
from ..tls import Channel
from .messages import (
    MAGIC,
    MAX_LINE,
    STATUS_PREFIX,
    VERSION,
    parse_ack,
    parse_answer,
    parse_hello,
    parse_status,
)

PREFIX_SIZE = 64 << 10
WINDOW_SIZE = 64 << 20
ACK_BYTES = 4 << 20
ACK_SECONDS = 0.5
KEEPALIVE_SECONDS = 5.0
MAX_FRAME = 16 << 20
PIECE_SIZE = 64 << 10  # the sender holds and waits for acknowledgements in pieces of this size
MAX_BACKOFF = 30.0
BUFFER_SIZE = 256 << 10
RAW_MAGIC = b"btrfs-stream\0"
_FRAME = struct.Struct(">cI")
_END = struct.Struct(">cQ")


class Dropped(Exception):
    """The current connection is gone (internal)."""


def transient(exc: BaseException) -> bool:
    """True for a failure a new connection may cure (a cut, a stall, a refused connect), by its cause."""
    if isinstance(exc, (Dropped, TimeoutError, ConnectionError, EOFError)):
        return True
    if isinstance(exc, TlsError):
        return exc.retryable
    return isinstance(exc, OSError)


def _json_line(head: bytes, obj: Any) -> bytes:
    return head + b" " + json.dumps(obj, sort_keys=True, separators=(",", ":")).encode() + b"\n"


class ChannelBuffer:
    """Buffered reads from a channel: exact reads, lines, and large reads straight into the caller's buffer."""

    def __init__(self, channel: Channel, size: int = BUFFER_SIZE) -> None:
        self.channel = channel
        self._buf = bytearray(size)
        self._view = memoryview(self._buf)
        self._pos = 0
        self._end = 0

    @property
    def buffered(self) -> int:
        return self._end - self._pos

    def grow(self, size: int) -> None:
        """Hold up to ``size`` bytes from now on, keeping what is buffered."""
        if size > len(self._buf):
            kept = self._buf[self._pos : self._end]
            self._buf = bytearray(size)
            self._buf[: len(kept)] = kept
            self._view = memoryview(self._buf)
            self._pos, self._end = 0, len(kept)

    def head(self, n: int) -> bytes:
        """Up to ``n`` of the bytes buffered, without taking them."""
        return bytes(self._buf[self._pos : self._pos + min(n, self.buffered)])

    def fill(self) -> None:
        """Receive what comes next into the buffer (at least one byte); EOFError at the end of the channel."""
        if self._pos == self._end:
            self._pos = self._end = 0
        elif self._end == len(self._buf):
            self._buf[: self._end - self._pos] = self._buf[self._pos : self._end]
            self._end -= self._pos
            self._pos = 0
        n = self.channel.recv_into(self._view[self._end :])
        if not n:
            raise EOFError("the connection ended")
        self._end += n

    def peek(self, n: int) -> bytes:
        while self.buffered < n:
            self.fill()
        return bytes(self._buf[self._pos : self._pos + n])

    def read_exact(self, n: int) -> bytes:
        data = self.peek(n)
        self._pos += n
        return data

    def readline(self, limit: int = MAX_LINE) -> bytes:
        """One line, ``\\n`` included, of at most ``limit`` bytes (and less than the buffer holds)."""
        limit = min(limit, len(self._buf) - 1)
        searched = 0  # bytes after _pos known to hold no newline: a line that trickles in is scanned once
        while True:
            i = self._buf.find(b"\n", self._pos + searched, self._end)
            if i >= 0:
                line = bytes(self._buf[self._pos : i + 1])
                self._pos = i + 1
                return line
            searched = self.buffered
            if searched >= limit:
                raise SessionError(f"a line of the session protocol is longer than {limit} bytes")
            self.fill()

    def readinto(self, view: memoryview) -> int:
        """Up to ``len(view)`` bytes; 0 at a clean end of the channel."""
        if self.buffered:
            n = min(self.buffered, len(view))
            view[:n] = self._view[self._pos : self._pos + n]
            self._pos += n
            return n
        return self.channel.recv_into(view)


def _kill(channel: Channel | None) -> None:
    """Make every thread blocked on ``channel`` return (the owner closes it)."""
    if channel is not None:
        with contextlib.suppress(OSError):
            channel._sock.shutdown(socket.SHUT_RDWR)


def _close(channel: Channel | None) -> None:
    if channel is not None:
        _kill(channel)
        with contextlib.suppress(Exception):
            channel._tx_failed = True  # no close_notify on a dropped connection
            channel.close()
        _forget_error(channel)


def _forget_error(channel: Channel) -> None:
    """Break the cycle channel -> its saved receive error -> traceback -> frame -> channel.

    The frame holds a cffi ``from_buffer`` export of a memoryview; when the
    cycle is left to the garbage collector, clearing that memoryview fails
    ("memoryview has 1 exported buffer") and the process can crash (seen
    with GnuTLS receive errors on dropped connections).
    """
    error = getattr(channel, "_rx_error", None)
    if error is not None:
        error.__traceback__ = None
        channel._rx_error = None  # type: ignore[attr-defined]


# --- the sender -----------------------------------------------------------------------------------------------------


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
    ) -> None:
        self._connect = connect
        self.retries = retries
        self.retry_delay = retry_delay
        self.window = max(window, PREFIX_SIZE + PIECE_SIZE)
        # resuming after a restart: the receiver holds the bytes before skip_to,
        # of the stream whose identity is ``stream``
        self._skip_to = skip_to
        self._expected = stream
        self._log = log or (lambda text: None)
        self._progress = progress or (lambda n: None)
        self._cond = threading.Condition()
        self._chunks: deque[bytes] = deque()
        self.acked = skip_to  # the receiver's verified offset: everything before it is dropped from memory
        self._base = skip_to  # stream offset of the first byte of self._chunks
        self.written = 0  # stream bytes taken so far
        self.identity: dict[str, Any] | None = None
        self._prefix = bytearray()
        self._channel: Channel | None = None
        self._reader: threading.Thread | None = None
        self._dead = False
        self._ended = False
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
            self._chunks.append(data)
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
        self._ended = True
        if self._channel is None and self.status is None:
            self._open()
        while self.status is None:
            channel = self._channel
            assert channel is not None
            try:
                if self._dead:
                    raise Dropped()
                channel.send_all(_END.pack(b"E", self.written))
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
                self._channel.send_all(b"B")
                self._channel.shutdown_write()
            self._stop_reader()
            with contextlib.suppress(Exception):
                self._channel.close()
            _forget_error(self._channel)
            self._channel = None
        return self.status

    def abort(self, reason: str | None = None) -> None:
        """Give up: tell the receiver why (an ``X`` frame) when the connection still works,
        or on a connection of its own when the stream failed before the first one."""
        if reason is not None and self._channel is None and not self._attempted and self.status is None:
            with contextlib.suppress(Exception):
                self.identify()
                self._channel = self._connect()
                self._channel.send_all(self._hello())
                ChannelBuffer(self._channel, 4096).readline()  # the receiver's answer
        if reason is not None and self._channel is not None and not self._dead:
            message = reason.encode("utf-8", "replace")[:4096]
            with contextlib.suppress(Exception):
                self._channel.send_all(_FRAME.pack(b"X", len(message)) + message)
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

    def _hello(self) -> bytes:
        return _json_line(MAGIC + b" %d" % VERSION, {"stream": self.identity})

    def _open(self) -> None:
        self.identify()
        self._reconnect(first=True)

    def _send_frames(self, channel: Channel, data: bytes | memoryview) -> None:
        view = memoryview(data)
        for start in range(0, len(view), MAX_FRAME):
            piece = view[start : start + MAX_FRAME]
            channel.send_all(_FRAME.pack(b"D", len(piece)) + piece)  # one write: no tiny TLS record
            self._progress(len(piece))

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
                    what = "connecting" if first else "the connection dropped and"
                    raise SessionError(
                        f"{what} {self.retries} reconnect attempt{'s' * (self.retries != 1)} failed; "
                        f"last error: {self._last}"
                    )
                time.sleep(min(self.retry_delay * 2 ** (failures - 1), MAX_BACKOFF))
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
        channel.send_all(self._hello())
        buf = ChannelBuffer(channel, 64 << 10)
        line = buf.readline()
        if line.startswith(STATUS_PREFIX):
            self.status = parse_status(line)
            self._dead = False
            return
        verified, resume = parse_answer(line)
        with self._cond:
            if resume > self.written and self._skip_to and not self._sessions:
                # a receiver still running got further with the sender before us: catch up
                self._chunks.clear()
                self._base = self._skip_to = resume
                self.acked = verified
            elif self._skip_to and resume < self._skip_to and not self._sessions:
                raise SessionError(
                    f"the receiver resumes at offset {resume}, before the token's {self._skip_to}: "
                    "use the receiver's latest token"
                )
            if max(verified, resume) > max(self.written, self._skip_to):
                raise SessionError(f"the receiver has {resume} bytes, more than the {self.written} sent")
            self._advance(verified)
            if resume < self._base:
                raise SessionError(
                    f"the receiver asks to resume at offset {resume}, before offset {self._base}, "
                    "which is no longer held"
                )
            self._dead = False
        if self._sessions:
            self.reconnects += 1
            self.resent += self.written - resume
            self._log(f"session: receiver verified {verified} bytes, resuming at {resume} of {self.written}")
        self._sessions += 1
        self._reader = threading.Thread(target=self._read_acks, args=(buf,), daemon=True)
        self._reader.start()
        skip = resume - self._base
        for piece in list(self._chunks):
            if skip >= len(piece):
                skip -= len(piece)
                continue
            self._send_frames(channel, memoryview(piece)[skip:])
            skip = 0

    def _advance(self, offset: int) -> None:
        """Drop acknowledged bytes (holding the lock)."""
        if offset <= self.acked:
            return
        self.acked = offset
        while self._chunks and self._base + len(self._chunks[0]) <= offset:
            self._base += len(self._chunks.popleft())
        self._cond.notify_all()

    def _read_acks(self, buf: ChannelBuffer) -> None:
        try:
            while True:
                line = buf.readline()
                if line.startswith(b"ack "):
                    offset = parse_ack(line)
                    with self._cond:
                        if offset > self.written:
                            raise SessionError(f"the receiver acknowledged {offset} bytes of the {self.written} sent")
                        self._advance(offset)
                elif line.startswith(STATUS_PREFIX):
                    status = parse_status(line)
                    with self._cond:
                        self.status = status
                        self._cond.notify_all()
                    return
                else:
                    raise SessionError(f"unexpected line from the receiver: {printable(repr(line[:60]))}")
        except Exception as exc:
            with self._cond:
                if isinstance(exc, SessionError):
                    self._broken = exc.with_traceback(None)  # no reconnect cures a receiver that breaks the protocol
                self._dead = True
                self._cond.notify_all()


# --- the receiver ---------------------------------------------------------------------------------------------------

HELLO_BUFFER = MAX_LINE + (4 << 10)  # what a connection may make us hold before it said what it is
DRAIN_SECONDS = 10.0
_HELLO_START = MAGIC + b" "


@dataclass
class Opening:
    """An accepted connection that said what it is: a session hello, or the start of a raw stream."""

    channel: Channel
    buffer: ChannelBuffer
    identity: dict[str, Any] | None  # the hello's stream; None: a raw stream (``btrfs-stream`` came first)

    def close(self) -> None:
        _close(self.channel)


def open_connection(
    sock: socket.socket,
    handshake: Callable[[socket.socket, float], Channel],
    deadline: float,
    *,
    timeout: float,
    idle_timeout: float | None,
) -> Opening:
    """Shake hands on accepted ``sock`` (``handshake(sock, seconds)``) and read the peer's first words, all
    before ``deadline`` (``time.monotonic()``; ``timeout`` is how long that was, for messages).

    The first words are a session hello (at most :data:`MAX_LINE` bytes,
    parsed by :func:`~sendstream.messages.parse_hello`) or the header of a
    raw stream. Anything else, a close or silence raises :class:`SessionError`
    (a failed handshake its own error); a peer that spoke out of turn is told
    why. Once open, each wait of the channel lasts at most ``idle_timeout``.
    """
    channel = handshake(sock, max(deadline - time.monotonic(), 0.001))
    try:
        channel.set_deadline(deadline)
        buf = ChannelBuffer(channel, HELLO_BUFFER)
        identity = _first_words(buf, timeout)
    except BaseException as exc:
        if isinstance(exc, SessionError):
            tell(channel, exc.exit_code, f"refused: {exc}")
        _close(channel)
        raise
    channel.set_deadline(None)
    channel.settimeout(idle_timeout)
    return Opening(channel, buf, identity)


def _first_words(buf: ChannelBuffer, timeout: float) -> dict[str, Any] | None:
    """The hello's stream identity, or None for a raw stream."""
    try:
        while True:
            head = buf.head(len(_HELLO_START))
            if head.startswith(RAW_MAGIC):
                return None
            if head == _HELLO_START:
                return parse_hello(buf.readline())
            if not (RAW_MAGIC.startswith(head) or _HELLO_START.startswith(head)):
                raise SessionError(f"neither a session hello nor a btrfs stream: {printable(repr(head))}")
            buf.fill()
    except (EOFError, TruncationError):
        raise SessionError("the connection ended before a session hello or a btrfs stream") from None
    except TimeoutError:
        raise SessionError(f"no session hello or btrfs stream within {timeout:g} s of connecting") from None


def status_line(code: int, message: str) -> bytes:
    """``sendstream-status CODE MESSAGE``, on one line whatever ``message`` holds."""
    return STATUS_PREFIX + f"{code} {printable(message)}".encode() + b"\n"


def tell(channel: Channel, code: int, message: str, seconds: float = 1.0) -> None:
    """Send a status to a peer we are about to close on, if it takes it within ``seconds``."""
    channel.set_deadline(time.monotonic() + seconds)
    with contextlib.suppress(Exception):
        channel.send_all(status_line(code, message))


def failure_status(exc: BaseException) -> tuple[int, str]:
    """What a receiver answers when ``exc`` stopped it: the exit code the CLI gives it, and its text."""
    if isinstance(exc, e.SendStreamError):
        return exc.exit_code, str(exc)
    if isinstance(exc, OSError):
        return e.EXIT_IO, str(exc)
    return e.EXIT_CORRUPT, f"{type(exc).__name__}: {exc}"


def admit(opening: Opening, identity: dict[str, Any]) -> None:
    """Refuse an opening that is not of stream ``identity``: tell its sender why, raise :class:`SessionError`."""
    if opening.identity == identity:
        return
    if opening.identity is None:
        why = "a plain stream cannot join (or resume) a session: this receiver expects a session of its stream"
    else:
        why = f"a sender of another stream connected: {describe(opening.identity)}, not {describe(identity)}"
    tell(opening.channel, e.EXIT_USAGE, f"refused: {why}")
    raise SessionError(why)


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
        identity: dict[str, Any] | None = None,
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
        self._acked = start
        self.identity = identity
        self.raw = opening.identity is None
        self.reconnects = 0
        self._frame_left = 0
        self._done = False
        self._failed: e.RemoteError | None = None
        self._send_lock = threading.Lock()
        self._ack_now = threading.Event()
        self._acker: threading.Thread | None = None
        self.channel = opening.channel
        self._buf = opening.buffer
        self._buf.grow(BUFFER_SIZE)
        if self.raw:
            if identity is not None:
                admit(opening, identity)
            return
        if identity is not None:
            admit(opening, identity)
        self.identity = opening.identity
        self._answer_hello(opening.channel)
        if self._listener is not None:
            self._listener.serve(self._arrived)
        self._start_acker()

    def _answer_hello(self, channel: Channel) -> None:
        self._frame_left = 0
        channel.send_all(_json_line(MAGIC + b" %d" % VERSION, {"verified": self.verified, "resume": self.received}))

    def _arrived(self, opening: Opening) -> None:
        """A new connection opened (in its own thread): refuse it, or let it supersede the current one."""
        assert self.identity is not None
        admit(opening, self.identity)
        _kill(self.channel)

    # acknowledgements

    def _start_acker(self) -> None:
        self._stop_acker = threading.Event()
        self._acker = threading.Thread(target=self._ack_loop, args=(self.channel, self._stop_acker), daemon=True)
        self._acker.start()

    def _ack_loop(self, channel: Channel, stop: threading.Event) -> None:
        last = time.monotonic()
        while True:
            self._ack_now.wait(ACK_SECONDS / 2)
            self._ack_now.clear()
            if stop.is_set():
                return
            now = time.monotonic()
            if self.verified != self._acked or now - last >= KEEPALIVE_SECONDS:
                try:
                    self._send_ack(channel)
                except Exception:
                    return
                last = now

    def _send_ack(self, channel: Channel) -> None:
        with self._send_lock:
            verified = self.verified
            channel.send_all(b"ack %d\n" % verified)
            self._acked = verified

    def _halt_acker(self) -> None:
        if self._acker is not None:
            self._stop_acker.set()
            self._ack_now.set()
            self._acker.join(timeout=1.0)
            if self._acker.is_alive():
                _kill(self.channel)
                self._acker.join()
            self._acker = None

    # the stream

    def wrote(self, n: int) -> None:
        self.written += n
        if self.written - self._committed >= ACK_BYTES:
            self.commit()

    def commit(self) -> None:
        if self.written != self.verified:
            self.flush()
            self._committed = self.written
            self.verified = self.checkpoint(self.written) if self.checkpoint else self.written
            if self.verified - self._acked >= ACK_BYTES:
                self._ack_now.set()

    def readinto(self, view: Any) -> int:
        view = memoryview(view).cast("B")
        if self._failed is not None:
            raise self._failed
        if self.raw:
            self.commit()
            try:
                n = self._buf.readinto(view)
            except (OSError, EOFError) as exc:  # a reset, the idle timeout
                raise e.TruncatedStream(f"the connection dropped: {exc}", offset=self.received) from exc
            self.received += n
            self.progress(n)
            return n
        total = 0
        while total < len(view):
            if self._done:
                break
            if total and not self._buf.buffered:
                break  # return what came rather than wait for more
            if not self._buf.buffered:
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
            if n:
                total += n
                self.received += n
        if total:
            self.progress(total)
        return total

    def _read_some(self, view: memoryview) -> int:
        if self._frame_left == 0:
            kind = self._buf.read_exact(1)
            if kind == b"D":
                (self._frame_left,) = struct.unpack(">I", self._buf.read_exact(4))
                if self._frame_left > MAX_FRAME:
                    raise SessionError(f"a frame of {self._frame_left} bytes")
                return 0
            if kind == b"E":
                (total,) = struct.unpack(">Q", self._buf.read_exact(8))
                if total != self.received:
                    raise SessionError(f"the sender ended at {total} bytes, {self.received} received")
                self._done = True
                return 0
            if kind == b"X":
                (length,) = struct.unpack(">I", self._buf.read_exact(4))
                reason = printable(self._buf.read_exact(min(length, 4096)).decode("utf-8", "replace"))
                self._done = True
                raise e.RemoteError(f"the sender gave up: {reason}", e.EXIT_CORRUPT)
            raise SessionError(f"unexpected frame type {kind!r}")
        n = self._buf.readinto(view[: self._frame_left])
        if not n:
            raise EOFError("the connection ended inside a frame")
        self._frame_left -= n
        return n

    def _dropped(self, exc: BaseException) -> None:
        if self._listener is None:
            if isinstance(exc, SessionError):
                raise exc
            raise e.TruncatedStream(f"the connection dropped: {exc}", offset=self.received) from exc
        self._log(f"session: connection lost at {self.received} bytes ({exc}); waiting for the sender")
        self._halt_acker()
        _close(self.channel)
        self.commit()  # what is written is verified: the answer to the sender's return says so
        deadline = time.monotonic() + self.reconnect_timeout
        while True:
            opening = self._listener.next(deadline - time.monotonic())
            if opening is None:
                raise e.TruncatedStream(
                    f"the connection dropped and the sender did not come back within {self.reconnect_timeout:g} s",
                    offset=self.received,
                ) from exc
            self.channel, self._buf = opening.channel, opening.buffer
            self._buf.grow(BUFFER_SIZE)
            try:
                self._answer_hello(self.channel)
            except Exception as bad:
                self._log(f"session: a new connection failed: {bad}")
                _close(self.channel)
                continue
            self.reconnects += 1
            self._start_acker()
            return

    # the end

    def answer(self, code: int, message: str, *, linger: float = 0.0) -> None:
        """Send the status; on success wait for the sender's confirmation (or its return).

        After a failure the sender's bytes still in flight are read and
        dropped (for at most :data:`DRAIN_SECONDS`): closing with them unread
        would reset the connection, and the status could be lost with it.
        """
        status = status_line(code, message)
        if self.raw:
            try:
                self.channel.send_all(status)
            finally:
                if code:
                    _drain(self.channel)
                self._quiet_close(self.channel)
            return
        self._halt_acker()
        try:
            try:
                with self._send_lock:
                    if code == 0:
                        self.channel.send_all(b"ack %d\n" % self.verified)
                    self.channel.send_all(status)
                confirmed = self._confirmed(self._buf, self._frame_left)
            except Exception:
                confirmed = False
            _close(self.channel) if not confirmed else self._quiet_close(self.channel)
            deadline = time.monotonic() + linger
            while not confirmed and self._listener is not None and time.monotonic() < deadline:
                opening = self._listener.next(deadline - time.monotonic())
                if opening is None:
                    break
                try:
                    opening.channel.send_all(status)
                    confirmed = self._confirmed(opening.buffer)
                except Exception:
                    pass
                _close(opening.channel) if not confirmed else self._quiet_close(opening.channel)
        finally:
            if self._listener is not None:
                self._listener.close()

    def _quiet_close(self, channel: Channel) -> None:
        with contextlib.suppress(Exception):
            channel.close()
        _forget_error(channel)

    @staticmethod
    def _confirmed(buf: ChannelBuffer, frame_left: int = 0) -> bool:
        """The sender's ``B`` after our status: it got it.

        Frames it sent before it saw the status are read and dropped: closing
        with them unread would reset the connection, and the status could be
        lost with it.
        """
        deadline = time.monotonic() + DRAIN_SECONDS
        buf.channel.set_deadline(deadline)
        scratch = memoryview(bytearray(64 << 10))
        try:
            while time.monotonic() < deadline:  # a peer that never stops sending never makes us wait
                while frame_left:
                    n = buf.readinto(scratch[: min(frame_left, len(scratch))])
                    if not n:
                        return False
                    frame_left -= n
                kind = buf.read_exact(1)
                if kind == b"B":
                    return True
                if kind == b"D":
                    (frame_left,) = struct.unpack(">I", buf.read_exact(4))
                elif kind == b"E":
                    buf.read_exact(8)
                else:
                    return False
        except Exception:
            return False
        return False

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        self._halt_acker()
        _close(self.channel)


def _drain(channel: Channel, seconds: float = DRAIN_SECONDS) -> None:
    """End our direction, then read and drop what the peer still sends until it closes, for at most ``seconds``."""
    with contextlib.suppress(Exception):
        channel.shutdown_write()
        deadline = time.monotonic() + seconds
        channel.set_deadline(deadline)
        scratch = bytearray(64 << 10)
        while channel.recv_into(scratch) and time.monotonic() < deadline:
            pass
