"""A byte stream over a connected TCP socket: the :class:`Channel` every transfer uses, its layers, and plain TCP.

A channel is a stack: at the bottom a :class:`SocketChannel` that moves
bytes (plain TCP here, TLS in :mod:`.kernel`), and over it at most a few
:class:`Wrapping` layers that change what goes through (zstd,
:mod:`~sendstream.transport.compression`; pacing,
:mod:`~sendstream.transport.pacing`). The caller holds the top one.

The socket channel owns the socket from the start: it puts it in
non-blocking mode and waits with ``poll``, so that the socket's timeout at
the time of the call bounds every later wait (``None``: wait for ever;
:meth:`Channel.settimeout` changes it, :meth:`Channel.set_deadline` adds an
absolute limit).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import errno
import math
import os
import select
import socket
import time
from collections.abc import Callable

from ...errors import TlsError, UsageError
from ..listener import describe_peer

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


@dataclasses.dataclass
class Ends:
    """Where a connection's two directions are: one record, shared by a channel and every layer over it."""

    tx_done: bool = False  # shutdown_write() began
    tx_failed: bool = False  # a send failed: the peer must see the stream as cut short
    rx_done: bool = False  # the peer ended its direction cleanly


class Channel(abc.ABC):
    """A byte stream, plain or inside TLS, maybe with layers over it (:class:`Wrapping`).

    One thread may send while another receives. :meth:`recv_into` returns 0
    only at a clean end; :meth:`shutdown_write` ends our direction (TLS:
    close_notify) and receiving can go on; :meth:`close` does both ends.

    The public methods are said once, here, in terms of a layer's primitives
    (:meth:`write`, :meth:`write_file`, :meth:`end_tx`, :meth:`half_close`,
    :meth:`release`), which a layer does and hands on to the one below.
    """

    identity: str | None  # TLS: the PSK identity (the client's, on the server)
    ends: Ends
    peer: str  # the other end, as errors name it (``HOST:PORT``)

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

    @abc.abstractmethod
    def recv_into(self, buf: bytearray | memoryview) -> int:
        """Receive up to ``len(buf)`` bytes; 0 only at a clean end (TLS: the peer's close_notify)."""

    @abc.abstractmethod
    def settimeout(self, seconds: float | None) -> None:
        """Bound every later wait to send or receive by ``seconds`` (``None``: wait for ever)."""

    @abc.abstractmethod
    def set_deadline(self, deadline: float | None) -> None:
        """Fail every wait that would end after ``deadline`` (``time.monotonic()``; ``None``: no deadline)."""

    @abc.abstractmethod
    def interrupt(self) -> None:
        """Make every thread blocked on the channel return with an error; the owner still closes it."""

    # a layer's primitives: unchecked, each does its part and hands on to the layer below

    @abc.abstractmethod
    def write(self, view: memoryview) -> None:
        """Send all of ``view`` (bytes)."""

    @abc.abstractmethod
    def write_file(self, fd: int, offset: int, count: int) -> int:
        """As :meth:`sendfile`."""

    @abc.abstractmethod
    def end_tx(self) -> None:
        """Tell the peer we are done sending (before the TCP half-close): the end of a zstd frame, close_notify."""

    @abc.abstractmethod
    def half_close(self) -> None:
        """The TCP half-close of our direction."""

    @abc.abstractmethod
    def release(self) -> None:
        """Close the socket as it is, nothing said."""

    # the public methods, over the primitives

    def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send every byte of ``data``."""
        self._check_send()
        with memoryview(data) as view:
            try:
                self.write(view.cast("B"))
            except BaseException:
                self.ends.tx_failed = True
                raise

    def sendfile(self, fd: int, offset: int, count: int) -> int:
        """Send ``count`` bytes of file ``fd`` from ``offset``; fewer only when the file ends first."""
        self._check_send()
        try:
            return self.write_file(fd, offset, count)
        except BaseException:
            self.ends.tx_failed = True
            raise

    def shutdown_write(self) -> None:
        """End our direction, then half-close TCP. Receiving goes on.

        TLS ends with close_notify, unless a send failed: the peer must then
        see the data as truncated, not as complete.
        """
        if self.ends.tx_done:
            return
        self.ends.tx_done = True
        if not self.ends.tx_failed:
            self.end_tx()
        self.half_close()

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
            if not self.ends.rx_done and exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise
        except TlsError:
            if not self.ends.rx_done:
                raise
        finally:
            self.release()

    def abandon(self) -> None:
        """Close a dropped connection: no close_notify, so that the peer sees what it got as cut short."""
        self.ends.tx_failed = True
        self.close()

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_send(self) -> None:
        if self.ends.tx_done:
            raise UsageError("send on a channel after shutdown_write()")
        if self.ends.tx_failed:
            raise UsageError("send on a channel after a failed send: the stream is broken")


class Wrapping(Channel):
    """A layer over ``channel``: by default each primitive and the rest go to it unchanged; a subclass
    changes what it changes (:class:`~sendstream.transport.compression.Compressing`, ...)."""

    def __init__(self, channel: Channel) -> None:
        self.inner = channel
        self.ends = channel.ends

    @property
    def identity(self) -> str | None:
        return self.inner.identity

    @identity.setter
    def identity(self, value: str | None) -> None:
        self.inner.identity = value

    @property
    def peer(self) -> str:  # type: ignore[override]
        return self.inner.peer

    @property
    def tx_path(self) -> str:
        return self.inner.tx_path

    @property
    def rx_path(self) -> str:
        return self.inner.rx_path

    def describe(self) -> str:
        return self.inner.describe()

    def recv_into(self, buf: bytearray | memoryview) -> int:
        return self.inner.recv_into(buf)

    def settimeout(self, seconds: float | None) -> None:
        self.inner.settimeout(seconds)

    def set_deadline(self, deadline: float | None) -> None:
        self.inner.set_deadline(deadline)

    def interrupt(self) -> None:
        self.inner.interrupt()

    def write(self, view: memoryview) -> None:
        self.inner.write(view)

    def write_file(self, fd: int, offset: int, count: int) -> int:
        return self.inner.write_file(fd, offset, count)

    def end_tx(self) -> None:
        self.inner.end_tx()

    def half_close(self) -> None:
        self.inner.half_close()

    def release(self) -> None:
        self.inner.release()


def peer_name(sock: socket.socket) -> str:
    """The other end of ``sock`` as errors name it (:func:`~sendstream.transport.listener.describe_peer`)."""
    try:
        return describe_peer(sock.getpeername())
    except OSError:
        return "the peer"


class SocketChannel(Channel):
    """The bottom of a channel: bytes over a connected TCP socket, plain or inside TLS."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._timeout = sock.gettimeout()
        self._deadline: float | None = None
        sock.setblocking(False)
        self.identity = None
        self.ends = Ends()
        self.peer = peer_name(sock)

    def settimeout(self, seconds: float | None) -> None:
        self._timeout = seconds

    def set_deadline(self, deadline: float | None) -> None:
        self._deadline = deadline

    def interrupt(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def half_close(self) -> None:
        self._sock.shutdown(socket.SHUT_WR)

    def release(self) -> None:
        self._sock.close()

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


class PlainChannel(SocketChannel):
    """Mode ``"none"``: plain TCP. A TCP EOF is a clean end (nothing can tell truncation)."""

    @property
    def tx_path(self) -> str:
        return "plain"

    @property
    def rx_path(self) -> str:
        return "plain"

    def describe(self) -> str:
        return "none (plain TCP, unencrypted)"

    def write(self, view: memoryview) -> None:
        self._socket_send_all(view)

    def recv_into(self, buf: bytearray | memoryview) -> int:
        while True:
            try:
                n = self._sock.recv_into(buf)
            except BlockingIOError:
                self._wait_io(select.POLLIN)
                continue
            self.ends.rx_done = n == 0
            return n

    def write_file(self, fd: int, offset: int, count: int) -> int:
        return self._socket_sendfile(fd, offset, count)

    def end_tx(self) -> None:
        pass
