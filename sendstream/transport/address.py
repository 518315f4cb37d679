"""Addresses and how a leg's connections are made: where to listen or dial, with which TLS, how long to wait.

``HOST:PORT``, ``[IPv6]:PORT``, and for listening ``*:PORT`` for every address.
"""

from __future__ import annotations

import errno
import socket
from dataclasses import dataclass

from .. import errors as e
from .compression import Tally
from .pacing import Paced
from .tls import Channel, accept_channel, connect_channel

CONNECT_TIMEOUT = 30.0


BACKLOG = 16  # the accept loop takes connections at once: this only absorbs bursts


MAX_LINGER = 60.0  # after success, the longest wait for a sender that missed the status to come back for it


def listen(host: str, port: int) -> socket.socket:
    """A listening TCP socket; ``::`` listens on every IPv6 and IPv4 address."""
    where = f"listening on {_show(host, port)}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError as exc:
        raise e.NetworkError(where, exc, f"cannot resolve {host!r}") from None
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
    assert last is not None  # getaddrinfo gives at least one address or raises
    raise cannot_listen(host, port, last) from None


def cannot_listen(host: str, port: int, exc: OSError, what: str = "listening") -> e.NetworkError:
    """The error of a failed bind or listen on ``host:port`` (``what`` the listening is for), with what to do."""
    hint = "another process listens there: stop it or choose another port" if exc.errno == errno.EADDRINUSE else ""
    return e.NetworkError(f"{what} on {_show(host, port)}", exc, hint)


def connect(host: str, port: int, timeout: float = CONNECT_TIMEOUT) -> socket.socket:
    """A connected TCP socket; a failure names the address and the operation."""
    where = f"connecting to {_show(host, port)}"
    try:
        sock = socket.create_connection((host, port), timeout=timeout)
    except socket.gaierror as exc:
        raise e.NetworkError(where, exc, f"cannot resolve {host!r}") from None
    except TimeoutError:
        raise e.NetworkError(where, TimeoutError(errno.ETIMEDOUT, f"no answer within {timeout:g} s")) from None
    except OSError as exc:
        hint = "is a receiver listening there?" if exc.errno == errno.ECONNREFUSED else ""
        raise e.NetworkError(where, exc, hint) from None
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _show(host: str, port: int) -> str:
    """``host:port`` as a person writes it: ``*`` for every address, IPv6 in brackets."""
    if host == "::":
        return f"*:{port}"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@dataclass(frozen=True)
class Address:
    """A TCP address; the host ``::`` (written ``*``) listens on every address."""

    host: str
    port: int

    @classmethod
    def parse(cls, text: str, *, listen: bool = False, any_port: bool = False) -> Address:
        """``HOST:PORT``, ``[IPv6]:PORT``; for listening ``*:PORT`` means every address. With ``any_port``
        (a listener that reports the port it got) port 0 asks the system for a free one."""
        host, sep, port = text.rpartition(":")
        # ASCII digits only: '²' is a digit that int() refuses
        if not sep or not (port.isascii() and port.isdigit()) or not (0 if any_port else 1) <= int(port) < 65536:
            raise e.UsageError(f"expected HOST:PORT, got {text!r}")
        if host.startswith("[") and host.endswith("]"):
            host = host[1:-1]
        if "[" in host or "]" in host:
            raise e.UsageError(f"expected HOST:PORT or [IPv6]:PORT, got {text!r}")
        if not host:
            raise e.UsageError(f"no host in {text!r}: name one (or '*' to listen on every address)")
        if host == "*":
            if not listen:
                raise e.UsageError("'*' only makes sense with --listen")
            host = "::"
        return cls(host, int(port))

    @property
    def shown(self) -> str:
        """``host:port`` as a person writes it: ``*`` for every address, IPv6 in brackets."""
        return _show(self.host, self.port)


@dataclass(frozen=True)
class TlsSettings:
    """A leg's TLS: the mode (``none``: plain TCP), the pre-shared key and the name it goes by."""

    mode: str
    key: bytes | None
    identity: str

    def accept(self, sock: socket.socket, seconds: float) -> Channel:
        """The server end over accepted ``sock``, within ``seconds``: only ``identity`` has a key."""
        key, identity = self.key, self.identity
        keys = (lambda name: key if name == identity else None) if key else None
        return accept_channel(sock, self.mode, keys, handshake_timeout=seconds)

    def connect(self, sock: socket.socket, seconds: float) -> Channel:
        """The client end over connected ``sock``, within ``seconds``."""
        return connect_channel(sock, self.mode, self.key, self.identity, handshake_timeout=seconds)


@dataclass(frozen=True)
class Listening:
    """How a receiver takes its sender: where, with which TLS, and how long each wait lasts.

    ``timeout`` bounds a new connection's handshake and hello, together;
    ``idle_timeout`` each later wait for the sender's next byte (None: for
    ever); with ``reconnect_timeout`` the sender may come back within it
    after a drop (None: one connection only).
    """

    address: Address
    tls: TlsSettings
    timeout: float
    idle_timeout: float | None
    reconnect_timeout: float | None = None

    @property
    def linger(self) -> float:
        """After success, how long a sender that missed the status may take to come back for it."""
        return min(self.reconnect_timeout or 0.0, MAX_LINGER)


@dataclass(frozen=True)
class Dialing:
    """How a sender reaches its receiver: where, with which TLS, how long a connection and handshake may
    take, and how fast it may send."""

    address: Address
    tls: TlsSettings
    timeout: float = CONNECT_TIMEOUT
    rate: float | None = None  # bytes a second at most, evenly; None: as fast as it goes
    compress: Tally | None = None  # offered on every connection (by the sending end); what it saved, over all of them

    def open(self) -> Channel:
        """A new channel: TCP connect and handshake (the offer to compress is the session's)."""
        sock = connect(self.address.host, self.address.port, timeout=self.timeout)
        sock.settimeout(self.timeout)
        channel = self.tls.connect(sock, self.timeout)
        return Paced(channel, self.rate) if self.rate else channel
