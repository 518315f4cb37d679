"""Who a connection to the service is: TLS or plain by its first byte, a plain one by its trusted address,
and whether a configuration still lets a proved client in (after a reload)."""

from __future__ import annotations

import select
import socket

from .. import errors as e
from ..session.connection import drain, tell
from ..session.receiver import Opening
from ..transport.listener import describe_peer
from ..transport.tls import Channel, PlainChannel
from ..transport.tls.kernel import opens_handshake
from .config import Client, Config


def why_revoked(client: Client, opening: Opening, config: Config) -> str:
    """Why ``config`` no longer lets the connection of ``opening``, which proved ``client``, in ("" if it does):
    the client is gone, its key changed, or its address is no longer trusted to send unencrypted."""
    now = config.clients.get(client.identity)
    if now is None:
        return f"the configuration no longer has client {client.identity}"
    if now.key != client.key:
        return f"the key of client {client.identity} changed"
    host = opening.peer.rsplit(":", 1)[0].strip("[]")
    unencrypted = opening.channel.rx_path == "plain"  # under its layers, if any (zstd)
    trusting = config.trusting(host) if unencrypted else now
    if trusting is None or trusting.identity != client.identity:
        return f"{host} is no longer among the trusted addresses of client {client.identity}"
    return ""


def speaks_tls(sock: socket.socket, seconds: float) -> bool:
    """Whether the peer's first byte opens a TLS handshake (it is read again by whoever takes the socket)."""
    poller = select.poll()  # not select(): a service's descriptors pass FD_SETSIZE
    poller.register(sock, select.POLLIN)
    if not poller.poll(seconds * 1000):
        raise e.SessionError(f"nothing within {seconds:.3g} s of connecting")
    first = sock.recv(1, socket.MSG_PEEK)
    if not first:
        raise e.SessionError("the connection ended before a TLS handshake or a session hello")
    return opens_handshake(first)


def unencrypted(sock: socket.socket, config: Config, seconds: float, peer: tuple[str, int] | None = None) -> Channel:
    """A connection without TLS: the client whose ``trusted`` addresses hold the peer's (``peer``, the one a
    balancer's PROXY header named, else the socket's), or refused (and told, its bytes drained for at most
    ``seconds`` so that a reset does not lose what it was told)."""
    channel = PlainChannel(sock)
    peer = peer or sock.getpeername()
    client = config.trusting(peer[0])
    if client is None:
        why = (
            f"unencrypted from {describe_peer(peer)}, which no client's trusted addresses hold: "
            f"send with --tls {config.tls} and the client's key"
        )
        tell(channel, e.EXIT_TLS, f"refused: {why}")
        drain(channel, seconds)
        channel.close()
        raise e.SessionError(why)
    channel.identity = client.identity
    return channel
