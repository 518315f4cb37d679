"""Addresses, listening and dialing: ``HOST:PORT``, ``[IPv6]:PORT``, ``*:PORT`` for every address."""

from __future__ import annotations

import socket

from .. import errors as e

CONNECT_TIMEOUT = 30.0


BACKLOG = 16  # the accept loop takes connections at once: this only absorbs bursts


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


def connect(host: str, port: int, timeout: float = CONNECT_TIMEOUT) -> socket.socket:
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock
