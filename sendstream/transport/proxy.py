"""The PROXY protocol version 2 header: the client's address, as a TCP balancer saw it, before its bytes.

Behind a TCP balancer (HAProxy's ``send-proxy-v2``, an AWS Network Load
Balancer, ...) every connection comes from the balancer; the header it sends
first names the client, so the service can log it and limit per source as
without a balancer. :func:`parse` reads the header from bytes (sans-IO,
incremental: ``None`` until it is whole); :func:`read_header` drives it on a
socket, taking exactly the header and leaving the TLS handshake that follows
in the socket. Anyone can send such a header: the caller accepts it only on
connections from its configured balancers' addresses.

Spec: https://www.haproxy.org/download/2.6/doc/proxy-protocol.txt (section 2.2). Only TCP over IPv4 or IPv6
is taken; the TLVs after the addresses are skipped.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass
from typing import Final

from .. import errors as e

SIGNATURE: Final = b"\r\n\r\n\x00\r\nQUIT\n"
HEADER_SIZE: Final = 16  # the signature, version and command, family and protocol, the length of the rest
# The longest rest we take: 216 bytes of addresses (AF_UNIX's, the longest) and TLVs. HAProxy's (ALPN, authority,
# a unique ID of at most 128 bytes, the SSL details) come to a few hundred bytes, and the spec keeps the whole
# header within one TCP segment: 1024 takes every real header and bounds what a peer makes us hold.
MAX_LENGTH: Final = 1024

_VERSION = 2
_LOCAL, _PROXY = 0, 1
_UNSPEC, _TCP4, _TCP6 = 0x00, 0x11, 0x21
_ADDRESS_BLOCKS: Final = {_TCP4: 12, _TCP6: 36}  # two addresses, then two ports
_FAMILIES: Final = {
    _UNSPEC: "UNSPEC",
    _TCP4: "TCP over IPv4",
    0x12: "UDP over IPv4",
    _TCP6: "TCP over IPv6",
    0x22: "UDP over IPv6",
    0x31: "UNIX stream",
    0x32: "UNIX datagram",
}


@dataclass(frozen=True)
class Proxied:
    """A whole header: the client's ``source`` (host, port), or None for the balancer's own connection (a
    LOCAL command, such as a health check, or an UNSPEC family); ``header_size`` bytes, TLVs included."""

    source: tuple[str, int] | None
    header_size: int


def parse(data: bytes | bytearray | memoryview) -> Proxied | None:
    """The header at the start of ``data``; None while it needs more bytes (call again with more).

    Raises :class:`~sendstream.errors.ProxyHeaderError` naming the byte at fault as soon as it arrives.
    """
    data = bytes(data[: _size(data)])
    _check_start(data)
    if len(data) < HEADER_SIZE:
        return None
    command, family, length = data[12] & 0x0F, data[13], int.from_bytes(data[14:16], "big")
    if length > MAX_LENGTH:
        raise _refused(14, f"a PROXY protocol length of at most {MAX_LENGTH} bytes", f"{length}")
    block = _ADDRESS_BLOCKS.get(family, 0) if command == _PROXY else 0  # LOCAL: the addresses are ignored
    if length < block:
        expected = f"a PROXY protocol length of at least {block} bytes (the addresses of {_FAMILIES[family]})"
        raise _refused(14, expected, f"{length}")
    if len(data) < HEADER_SIZE + length:
        return None
    if not block:
        return Proxied(None, HEADER_SIZE + length)
    size = (block - 4) // 2
    address = data[HEADER_SIZE : HEADER_SIZE + size]
    host = ipaddress.IPv4Address(address) if size == 4 else ipaddress.IPv6Address(address)
    port = int.from_bytes(data[HEADER_SIZE + 2 * size : HEADER_SIZE + 2 * size + 2], "big")
    return Proxied((str(host), port), HEADER_SIZE + length)


def read_header(sock: socket.socket, deadline: float) -> Proxied:
    """The header a balancer sends first on ``sock``, by ``deadline`` (``time.monotonic()``).

    Receives exactly the header's bytes, never one more: what follows stays in the socket. The socket's
    timeout is as it was after. Raises :class:`~sendstream.errors.ProxyHeaderError` for a wrong header, a
    close before its end, or the deadline.
    """
    data = b""
    before = sock.gettimeout()
    try:
        while (proxied := parse(data)) is None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _unfinished(data, "the deadline passed")
            sock.settimeout(left)
            try:
                more = sock.recv(_size(data) - len(data))
            except TimeoutError:
                raise _unfinished(data, "the deadline passed") from None
            if not more:
                raise _unfinished(data, "the balancer closed")
            data += more
        return proxied
    finally:
        sock.settimeout(before)


def _size(data: bytes | bytearray | memoryview) -> int:
    """How many bytes the header holds, as far as ``data`` tells: the fixed part, then all of it."""
    return HEADER_SIZE if len(data) < HEADER_SIZE else HEADER_SIZE + int.from_bytes(data[14:16], "big")


def _check_start(data: bytes) -> None:
    """Refuse the signature, the version and command, the family and protocol, each as soon as it is in."""
    start = data[: len(SIGNATURE)]
    if not SIGNATURE.startswith(start):
        wrong = next(i for i, (got, want) in enumerate(zip(start, SIGNATURE, strict=False)) if got != want)
        raise _refused(wrong, "a PROXY protocol v2 header", _described(data[:HEADER_SIZE]))
    if len(data) <= 12:
        return
    version, command = data[12] >> 4, data[12] & 0x0F
    if version != _VERSION:
        raise _refused(12, "PROXY protocol version 2 (0x2_)", f"version {version} (0x{data[12]:02x})")
    if command not in (_LOCAL, _PROXY):
        expected = "the PROXY protocol command LOCAL (0x20) or PROXY (0x21)"
        raise _refused(12, expected, f"command {command} (0x{data[12]:02x})")
    if len(data) > 13 and command == _PROXY and data[13] not in (_UNSPEC, *_ADDRESS_BLOCKS):
        family = _FAMILIES.get(data[13], "another family and protocol")
        only = ": only TCP is taken" if data[13] in _FAMILIES else ""
        expected = "the PROXY protocol family UNSPEC (0x00), TCP over IPv4 (0x11) or TCP over IPv6 (0x21)"
        raise _refused(13, expected, f"{family} (0x{data[13]:02x}){only}")


def _refused(offset: int, expected: str, got: str) -> e.ProxyHeaderError:
    return e.ProxyHeaderError(f"at byte {offset}: expected {expected}, got {got}")


def _described(data: bytes) -> str:
    """What a peer sent instead of the header, from its first bytes."""
    if data[:1] == b"\x16":
        return "a TLS ClientHello (byte 0x16): is send-proxy-v2 set on the balancer?"
    if data.startswith(b"PROXY"):
        return "a PROXY protocol v1 header (text): set send-proxy-v2 on the balancer, not send-proxy"
    if all(32 <= byte < 127 or byte in b"\t\r\n" for byte in data):
        return f"text '{e.shown(data)}'"
    return f"bytes {data.hex(' ')}"


def _unfinished(data: bytes, why: str) -> e.ProxyHeaderError:
    size = f"{'' if len(data) >= HEADER_SIZE else 'at least '}{_size(data)} bytes"
    return e.ProxyHeaderError(f"{why} after {len(data)} bytes of the PROXY protocol v2 header ({size})")
