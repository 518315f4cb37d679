"""Accepting connections until one proves itself: many may knock, the first to open wins.

A :class:`Listener` accepts on a listening socket in a thread of its own and
opens each connection in a thread of the connection's own, with
``open(sock, deadline)``: for sendstream the TLS handshake and the peer's
first words (:func:`sendstream.session.open_connection`). One deadline,
``timeout`` seconds after the accept, covers all of it, however slowly the
peer sends. A connection that fails to open (no key or a wrong one, an
unknown identity, another TLS version, garbage, silence, a close) is closed
and logged in one line, and the listener goes on; so one bad client cannot
stop the service, nor hold it.

At most ``max_pending`` connections are being opened at a time, at most
``max_per_source`` of them from one source (an address; for IPv6 its /64,
which one host commonly holds; ``serve`` takes :data:`MAX_PER_SOURCE`), and
at most ``max_pending`` opened ones wait to be taken. When every place is
taken, a connection from a source that holds fewer openings than another
takes the place of that other's oldest opening, which is cut (so sources
that fill the places between them cannot keep a new one out: each new
source finds room). Any other is refused for load: with ``busy`` it is told
so in its own language once its first bytes come (within
:data:`BUSY_SECONDS`; at most :data:`MAX_BUSY` wait for that, the oldest
going first, unanswered), else it is closed at once. So silent connections
cannot lock the others out, and a client refused for load hears that the
service is busy. Memory is bounded
by ``2 * max_pending`` times what one opening holds (for sendstream: a TLS
session and a 68 KiB buffer), plus one thread each, plus :data:`MAX_BUSY`
sockets. Refusals are logged in full up to :data:`LOG_BURST` per
:data:`LOG_WINDOW` seconds, then counted, and the count is logged when
its window ends, so a flood of connections cannot flood the log.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import math
import queue
import select
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from ..errors import QuietClose
from ..io.threads import started

T = TypeVar("T")

MAX_PENDING = 64
MAX_PER_SOURCE = 16  # what a service lets one source open at a time
MAX_BUSY = 64  # connections refused for load that wait for their first bytes, to be told so
BUSY_SECONDS = 1.0  # how long one of them may take to say them (a real client speaks at once)
LOG_BURST = 20
LOG_WINDOW = 10.0
HALT_SECONDS = 2.0  # how long halting waits for the interrupted openings to end (and say why)


def describe_peer(address: Any) -> str:
    """``HOST:PORT`` of an accepted peer; ``[HOST]:PORT`` for IPv6; an IPv4-mapped address as IPv4."""
    if not isinstance(address, tuple) or len(address) < 2:
        return str(address) or "a local peer"
    host, port = str(address[0]), address[1]
    if host.startswith("::ffff:") and "." in host:
        host = host[len("::ffff:") :]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def source(address: Any) -> str:
    """Where an accepted peer connects from, for the bound of each source: its address, an IPv4-mapped one
    as IPv4; for IPv6 its /64, which one host commonly holds whole."""
    host = str(address[0]).split("%", 1)[0] if isinstance(address, tuple) and address else ""
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return host or "a local peer"
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, 64), strict=False))
    return str(ip)


class _Attempt:
    """A connection being opened."""

    def __init__(self, sock: socket.socket, peer: str, source: str, deadline: float, generation: int) -> None:
        self.sock = sock
        self.peer = peer
        self.source = source
        self.deadline = deadline
        self.generation = generation
        self.why = ""  # set when the listener stops it
        self.evicted = False  # cut to make room for another source: no longer counted as its source's
        self.thread: threading.Thread  # the opening's: set before the attempt is pending


class Listener(Generic[T]):
    """Accepts on ``server`` and opens every connection concurrently; the opened ones are taken in order.

    ``open(sock, deadline)`` returns the opened connection (it owns ``sock``
    from the call on) or raises: the exception's text is the reason logged, but a
    :class:`~sendstream.errors.QuietClose` closes the connection unlogged (no client: a health check).
    ``discard(item)`` closes an opened connection nobody takes. ``arrived``
    (given to :meth:`first` or :meth:`serve`) sees each opened connection
    in its own thread before it is queued, and may refuse it by raising.
    ``busy(first, why)`` is what a connection refused for load is told, from
    the first bytes it sent and the reason.
    """

    def __init__(
        self,
        server: socket.socket,
        open: Callable[[socket.socket, float], T],
        discard: Callable[[T], object],
        *,
        timeout: float,
        log: Callable[[str], object],
        max_pending: int = MAX_PENDING,
        max_per_source: int | None = None,
        busy: Callable[[bytes, str], bytes] | None = None,
    ) -> None:
        self._server = server
        self._open = open
        self._discard = discard
        self.timeout = timeout
        self._log = log
        self.max_pending = max_pending
        self.max_per_source = max_per_source or max_pending
        self._busy = busy
        self._lock = threading.Lock()
        self._pending: set[_Attempt] = set()
        self._sources: Counter[str] = Counter()  # of the pending attempts (the evicted ones left out)
        self._evicted = 0  # pending attempts cut to make room, whose threads have not ended yet
        self._opened: queue.Queue[T] = queue.Queue(max_pending)
        self._generation = 0
        self._arrived: Callable[[T], object] | None = None
        self._accepting: threading.Thread | None = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._log_lock = threading.Lock()
        self._window = time.monotonic()
        self._shown = 0
        self._suppressed = 0

    # taking connections

    def first(self, arrived: Callable[[T], object] | None = None) -> T:
        """Accept until a connection opens; then stop accepting, close every other one, and return it."""
        self.serve(arrived)
        while True:
            try:
                item = self._opened.get(timeout=1.0)  # a timeout: signals reach the main thread
                break
            except queue.Empty:
                continue
        self.halt("another connection opened first")
        return item

    def serve(self, arrived: Callable[[T], object] | None = None) -> None:
        """Accept in the background; opened connections wait for :meth:`next`."""
        self.halt("")
        self._arrived = arrived
        self._accepting = started(self._accept_loop, self._generation)

    def next(self, timeout: float) -> T | None:
        """The next opened connection, or None when none opened within ``timeout`` seconds."""
        try:
            return self._opened.get(timeout=max(timeout, 0.001))
        except queue.Empty:
            return None

    def halt(self, why: str) -> None:
        """Stop accepting, close the connections being opened (logging ``why``) and those not taken."""
        with self._lock:
            self._generation += 1
        if self._accepting is not None:
            self._wake_w.send(b"!")
            self._accepting.join()  # no opening starts after this
            self._accepting = None
            with contextlib.suppress(BlockingIOError):
                self._wake_r.recv(4096, socket.MSG_DONTWAIT)
        with self._lock:
            pending = list(self._pending)
            for attempt in pending:
                attempt.why = attempt.why or why or "the listener stopped"
        for attempt in pending:
            with contextlib.suppress(OSError):
                attempt.sock.shutdown(socket.SHUT_RDWR)  # its thread fails, closes it and says why
        deadline = time.monotonic() + HALT_SECONDS
        for attempt in pending:
            attempt.thread.join(max(deadline - time.monotonic(), 0))
        while True:
            try:
                self._discard(self._opened.get_nowait())
            except queue.Empty:
                break

    def close(self) -> None:
        """Stop for good (the owner closes the listening socket)."""
        self.halt("the listener closed")
        self._wake_r.close()
        self._wake_w.close()
        with self._log_lock:
            self._flush_log()

    # the accept loop and the openings

    def _accept_loop(self, generation: int) -> None:
        poller = select.poll()
        poller.register(self._server.fileno(), select.POLLIN)
        poller.register(self._wake_r.fileno(), select.POLLIN)
        refused = _Refusals(poller, self._busy)
        self._server.setblocking(False)
        try:
            while True:
                ready = {fd for fd, _ in poller.poll(self._next_wait(refused))}
                if self._wake_r.fileno() in ready:
                    with contextlib.suppress(BlockingIOError):
                        self._wake_r.recv(4096, socket.MSG_DONTWAIT)
                if generation != self._generation:  # halted (else woken to count refusals by the clock)
                    return
                refused.answer(ready)
                self._log_window()
                if self._server.fileno() not in ready:
                    continue
                try:
                    sock, address = self._server.accept()
                except BlockingIOError:
                    continue
                except OSError as exc:
                    if exc.errno in (errno.EBADF, errno.EINVAL):
                        return
                    time.sleep(0.05)  # ECONNABORTED (a connection reset in the backlog), EMFILE: go on
                    continue
                why = self._start(sock, describe_peer(address), source(address), generation)
                if why:
                    refused.add(sock, why)
        finally:
            refused.close()

    def _next_wait(self, refused: _Refusals) -> int:
        """Milliseconds until the accept loop has something to do by the clock (-1: nothing)."""
        waits = [refused.wait()]
        with self._log_lock:
            if self._suppressed:
                waits.append(self._window + LOG_WINDOW - time.monotonic())
        due = [w for w in waits if w is not None]
        return max(math.ceil(min(due) * 1000), 0) if due else -1

    def _start(self, sock: socket.socket, peer: str, source: str, generation: int) -> str:
        """Open ``sock`` in a thread of its own; or, the service busy, refuse it: the reason ("" when not).

        When every place is taken, a source that holds fewer than another takes the place of that one's
        oldest opening (which is cut, and says why): so no few sources can keep the others out."""
        attempt = _Attempt(sock, peer, source, time.monotonic() + self.timeout, generation)
        attempt.thread = threading.Thread(target=self._open_one, args=(attempt,), daemon=True)
        evicted = None
        with self._lock:
            if len(self._pending) - self._evicted >= self.max_pending:
                evicted = self._evict_for(source)
            why = (
                f"{self.max_pending} connections are already opening"
                if len(self._pending) - self._evicted >= self.max_pending or len(self._pending) >= 2 * self.max_pending
                else f"{self.max_per_source} connections from {source} are already opening"
                if self._sources[source] >= self.max_per_source
                else ""
            )
            if not why:
                self._pending.add(attempt)
                self._sources[source] += 1
        if evicted is not None:
            with contextlib.suppress(OSError):
                evicted.sock.shutdown(socket.SHUT_RDWR)  # its thread fails, closes it and says why
        if why:
            self._refused(peer, f"busy: {why}")
            return why
        attempt.thread.start()
        return ""

    def _evict_for(self, source: str) -> _Attempt | None:
        """With the lock held and every place taken: cut the oldest opening of the source that holds the
        most, when it holds more than ``source``; that opening (None when none is cut)."""
        busiest = self._sources.most_common(1)
        if not busiest or busiest[0][1] <= self._sources[source]:
            return None
        crowd = busiest[0][0]
        oldest = min((a for a in self._pending if a.source == crowd and not a.evicted), key=lambda a: a.deadline)
        oldest.evicted = True
        oldest.why = f"making room for {source}: {crowd} holds {busiest[0][1]} of the {self.max_pending} openings"
        self._sources[crowd] -= 1
        if not self._sources[crowd]:
            del self._sources[crowd]
        self._evicted += 1
        return oldest

    def _open_one(self, attempt: _Attempt) -> None:
        try:
            try:
                item = self._open(attempt.sock, attempt.deadline)
            except Exception as exc:
                if attempt.why or not isinstance(exc, QuietClose):
                    self._refused(attempt.peer, attempt.why or str(exc) or type(exc).__name__)
                attempt.sock.close()  # after the log: a peer that sees the close finds its refusal counted
                return
            if attempt.generation == self._generation and self._arrived is not None:
                try:
                    self._arrived(item)
                except Exception as exc:
                    self._discard(item)
                    self._refused(attempt.peer, str(exc))
                    return
            with self._lock:
                taken = attempt.generation == self._generation
                if taken:
                    try:
                        self._opened.put_nowait(item)
                    except queue.Full:
                        taken = False
            if not taken:
                self._discard(item)
                stopped = attempt.why or (attempt.generation != self._generation and "the listener stopped")
                self._refused(attempt.peer, stopped or f"{self.max_pending} opened connections wait already")
        finally:
            with self._lock:
                self._pending.discard(attempt)
                if attempt.evicted:
                    self._evicted -= 1
                else:
                    self._sources[attempt.source] -= 1
                    if not self._sources[attempt.source]:
                        del self._sources[attempt.source]

    # the log

    def _refused(self, peer: str, reason: str) -> None:
        """One line per refused connection, at most :data:`LOG_BURST` per :data:`LOG_WINDOW` seconds."""
        with self._log_lock:
            if time.monotonic() - self._window >= LOG_WINDOW:
                self._flush_log()
                self._window = time.monotonic()
            if self._shown < LOG_BURST:
                self._shown += 1
                self._log(f"connection from {peer} refused: {reason}")
                return
            self._suppressed += 1
            first = self._suppressed == 1
        if first:  # the accept loop logs the count when the window ends: it sets its clock for that now
            with contextlib.suppress(OSError):
                self._wake_w.send(b".")

    def _log_window(self) -> None:
        """Log the count of the refusals not shown once their window ended, without waiting for another."""
        with self._log_lock:
            if self._suppressed and time.monotonic() - self._window >= LOG_WINDOW:
                self._flush_log()
                self._window = time.monotonic()

    def _flush_log(self) -> None:
        if self._suppressed:
            self._log(f"{self._suppressed} more connections refused within {LOG_WINDOW:g} s (not shown)")
        self._shown = self._suppressed = 0


class _Refusals:
    """Connections refused for load, each told so (``busy(first, why)``) once its first bytes come, in the
    accept loop's ``poller``; one silent for :data:`BUSY_SECONDS` is closed without a word, and beyond
    :data:`MAX_BUSY` the oldest goes first. Without ``busy`` each is closed at once."""

    def __init__(self, poller: select.poll, busy: Callable[[bytes, str], bytes] | None) -> None:
        self._poller = poller
        self._busy = busy
        self._waiting: dict[int, tuple[socket.socket, str, float]] = {}  # by descriptor, the oldest first

    def add(self, sock: socket.socket, why: str) -> None:
        if self._busy is None:
            sock.close()
            return
        if len(self._waiting) >= MAX_BUSY:
            self._drop(next(iter(self._waiting)))
        sock.setblocking(False)
        self._waiting[sock.fileno()] = (sock, why, time.monotonic() + BUSY_SECONDS)
        self._poller.register(sock.fileno(), select.POLLIN)

    def wait(self) -> float | None:
        """Seconds until the oldest one is due; None when none waits."""
        oldest = next(iter(self._waiting.values()), None)
        return None if oldest is None else oldest[2] - time.monotonic()

    def answer(self, ready: set[int]) -> None:
        """Tell those whose first bytes came (``ready``) why they are refused; close those due."""
        now = time.monotonic()
        for fd, (sock, why, due) in list(self._waiting.items()):
            if fd in ready and self._busy is not None:
                with contextlib.suppress(OSError):
                    first = sock.recv(4096)  # all it sent: closing with bytes unread would reset the answer
                    sock.send(self._busy(first, why))
                self._drop(fd)
            elif due <= now:
                self._drop(fd)

    def close(self) -> None:
        for fd in list(self._waiting):
            self._drop(fd)

    def _drop(self, fd: int) -> None:
        sock = self._waiting.pop(fd)[0]
        self._poller.unregister(fd)
        sock.close()
