"""A byte stream over a connected TCP socket: the :class:`Channel` every transfer uses, and plain TCP.

The channel owns the socket from the start: it puts it in non-blocking mode
and waits with ``poll``, so that the socket's timeout at the time of the
call bounds every later wait (``None``: wait for ever;
:meth:`Channel.settimeout` changes it, :meth:`Channel.set_deadline` adds an
absolute limit).
"""

from __future__ import annotations

import abc
import contextlib
import errno
import math
import os
import select
import socket
import time
from collections.abc import Callable

from ...errors import TlsError, UsageError
from ..compression import Compressor, Decompressor, Tally
from ..pacing import TokenBucket

SENDFILE_CHUNK = 256 << 10


def read_and_send(fd: int, offset: int, count: int, send: Callable[[memoryview], object]) -> int:
    """``sendfile`` where the kernel cannot send the file itself: ``count`` bytes of ``fd`` from ``offset``,
    read and given to ``send`` a piece at a time; fewer only when the file ends first."""
    buf = memoryview(bytearray(min(count, SENDFILE_CHUNK)))
    sent = 0
    while sent < count:
        n = os.preadv(fd, [buf[: min(len(buf), count - sent)]], offset + sent)
        if n == 0:
            break
        send(buf[:n])
        sent += n
    return sent


class Channel(abc.ABC):
    """A byte stream over a connected TCP socket, plain or inside TLS.

    One thread may send while another receives. :meth:`recv_into` returns 0
    only at a clean end; :meth:`shutdown_write` ends our direction (TLS:
    close_notify) and receiving can go on; :meth:`close` does both ends.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._timeout = sock.gettimeout()
        self._deadline: float | None = None
        sock.setblocking(False)
        self.identity: str | None = None  # TLS: the PSK identity (the client's, on the server)
        self._tx_done = False
        self._tx_failed = False
        self._rx_done = False
        self._bucket: TokenBucket | None = None
        self._deflate: Compressor | None = None
        self._inflate: Decompressor | None = None

    @property
    @abc.abstractmethod
    def tx_path(self) -> str:
        """Who writes records: ``"kernel"``, ``"userspace"`` or ``"plain"``."""

    @property
    @abc.abstractmethod
    def rx_path(self) -> str:
        """Who reads records: ``"kernel"``, ``"userspace"`` or ``"plain"``."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for the user, e.g. ``"tls13-aes128-gcm, TX kernel, RX userspace"``."""

    def recv_into(self, buf: bytearray | memoryview) -> int:
        """Receive up to ``len(buf)`` bytes; 0 only at a clean end (TLS: the peer's close_notify).

        After :meth:`decompress`, the bytes are those of the peer's zstd stream, decompressed.
        """
        if self._inflate is not None:
            return self._inflate.readinto(buf)
        return self._recv_into(buf)

    @abc.abstractmethod
    def _recv_into(self, buf: bytearray | memoryview) -> int:
        """As :meth:`recv_into`, what came on the wire."""

    def compress(self, tally: Tally) -> None:
        """Send one zstd stream from now on (:mod:`~sendstream.net.compression`), counted in ``tally``."""
        self._deflate = Compressor(tally)

    def decompress(self) -> None:
        """Take the peer's bytes as one zstd stream from now on, and receive them decompressed."""
        self._inflate = Decompressor(self._recv_into)

    @property
    def compressed(self) -> bool:
        """Whether the peer's bytes come compressed."""
        return self._inflate is not None

    def limit_rate(self, bytes_per_second: float) -> None:
        """Send no faster than ``bytes_per_second`` from now on, evenly (see :class:`TokenBucket`)."""
        self._bucket = TokenBucket(bytes_per_second, time.monotonic())

    def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send every byte of ``data``."""
        self._check_send()
        with memoryview(data) as view:
            try:
                flat = view.cast("B")
                self._paced(memoryview(self._deflate.compress(flat)) if self._deflate is not None else flat)
            except BaseException:
                self._tx_failed = True
                raise

    def _paced(self, flat: memoryview) -> None:
        if self._bucket is None:
            self._send(flat)
            return
        step = self._bucket.burst
        for start in range(0, len(flat), step):
            piece = flat[start : start + step]
            self._pace(len(piece))
            self._send(piece)

    def sendfile(self, fd: int, offset: int, count: int) -> int:
        """Send ``count`` bytes of file ``fd`` from ``offset``; fewer only when the file ends first."""
        if self._deflate is not None:
            return read_and_send(fd, offset, count, self.send_all)
        self._check_send()
        try:
            if self._bucket is None:
                return self._sendfile(fd, offset, count)
            sent = 0
            while sent < count:
                piece = min(self._bucket.burst, count - sent)
                self._pace(piece)
                n = self._sendfile(fd, offset + sent, piece)
                sent += n
                if n < piece:
                    break
            return sent
        except BaseException:
            self._tx_failed = True
            raise

    def _pace(self, n: int) -> None:
        assert self._bucket is not None
        if wait := self._bucket.delay(n, time.monotonic()):
            time.sleep(wait)

    def settimeout(self, seconds: float | None) -> None:
        """Bound every later wait to send or receive by ``seconds`` (``None``: wait for ever)."""
        self._timeout = seconds

    def set_deadline(self, deadline: float | None) -> None:
        """Fail every wait that would end after ``deadline`` (``time.monotonic()``; ``None``: no deadline)."""
        self._deadline = deadline

    def interrupt(self) -> None:
        """Make every thread blocked on the channel return with an error; the owner still closes it."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def shutdown_write(self) -> None:
        """End our direction, then half-close TCP. Receiving goes on.

        TLS ends with close_notify, unless a send failed: the peer must then
        see the data as truncated, not as complete.
        """
        if self._tx_done:
            return
        self._tx_done = True
        if not self._tx_failed:
            if self._deflate is not None:
                self._paced(memoryview(self._deflate.finish()))
            self._end_tx()
        self._sock.shutdown(socket.SHUT_WR)

    @abc.abstractmethod
    def _send(self, view: memoryview) -> None:
        """Send all of ``view`` (bytes)."""

    @abc.abstractmethod
    def _sendfile(self, fd: int, offset: int, count: int) -> int:
        """As :meth:`sendfile`."""

    @abc.abstractmethod
    def _end_tx(self) -> None:
        """Tell the peer we are done sending (before the TCP half-close)."""

    def close(self) -> None:
        """End our direction if still open, then close the socket.

        A peer that is gone, or has ended cleanly, cannot be told that we are
        done too: that is no error here (:meth:`shutdown_write` reports it).
        A TLS session is freed with the channel object, so that a thread
        still inside :meth:`recv_into` gets an error, never freed memory.
        """
        try:
            self.shutdown_write()
        except OSError as exc:
            if not self._rx_done and exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise
        except TlsError:
            if not self._rx_done:
                raise
        finally:
            self._sock.close()

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_send(self) -> None:
        if self._tx_done:
            raise UsageError("send on a channel after shutdown_write()")
        if self._tx_failed:
            raise UsageError("send on a channel after a failed send: the stream is broken")

    def _wait(self, events: int, timeout: float | None) -> bool:
        """Wait until the socket is ready for ``events``; False when ``timeout`` passes first."""
        poller = select.poll()
        poller.register(self._fd, events)
        return bool(poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000))))

    def _wait_io(self, events: int) -> None:
        """Wait within the timeout and before the deadline, as a socket operation would."""
        timeout, what = self._timeout, "send" if events & select.POLLOUT else "receive"
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if timeout is None or left < timeout:
                if left <= 0 or not self._wait(events, left):
                    raise TimeoutError(f"the deadline passed while waiting to {what}")
                return
        if not self._wait(events, timeout):
            raise TimeoutError(f"timed out after {timeout:g} s waiting to {what}")

    def _socket_send_all(self, view: memoryview) -> None:
        """Plain TCP, or records the kernel makes (kTLS TX)."""
        while view:
            try:
                view = view[self._sock.send(view) :]
            except BlockingIOError:
                self._wait_io(select.POLLOUT)

    def _socket_sendfile(self, fd: int, offset: int, count: int) -> int:
        """``sendfile(2)``: only on plain TCP or a kTLS TX socket, never under userspace TLS."""
        sent = 0
        while sent < count:
            try:
                n = os.sendfile(self._fd, fd, offset + sent, count - sent)
            except BlockingIOError:
                self._wait_io(select.POLLOUT)
                continue
            if n == 0:
                break
            sent += n
        return sent


class PlainChannel(Channel):
    """Mode ``"none"``: plain TCP. A TCP EOF is a clean end (nothing can tell truncation)."""

    @property
    def tx_path(self) -> str:
        return "plain"

    @property
    def rx_path(self) -> str:
        return "plain"

    def describe(self) -> str:
        return "none (plain TCP, unencrypted)"

    def _send(self, view: memoryview) -> None:
        self._socket_send_all(view)

    def _recv_into(self, buf: bytearray | memoryview) -> int:
        while True:
            try:
                n = self._sock.recv_into(buf)
            except BlockingIOError:
                self._wait_io(select.POLLIN)
                continue
            self._rx_done = n == 0
            return n

    def _sendfile(self, fd: int, offset: int, count: int) -> int:
        return self._socket_sendfile(fd, offset, count)

    def _end_tx(self) -> None:
        pass
