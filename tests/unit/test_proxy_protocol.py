"""The PROXY protocol v2 header (sendstream.transport.proxy): headers built by hand from the spec's bytes, fed
whole and byte by byte; every refusal names its byte as soon as that byte is in; the driver on a socketpair takes
the header and nothing after it, and fails on a close or the deadline."""

from __future__ import annotations

import ipaddress
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from sendstream.errors import ProxyHeaderError, SessionError
from sendstream.transport.proxy import HEADER_SIZE, MAX_LENGTH, SIGNATURE, Proxied, parse, read_header

SPEC_SIGNATURE = b"\x0d\x0a\x0d\x0a\x00\x0d\x0a\x51\x55\x49\x54\x0a"  # section 2.2, byte by byte
LOCAL, PROXY = 0x20, 0x21  # version 2 in the high nibble, the command in the low one
UNSPEC, TCP4, UDP4, TCP6, UDP6, UNIX_STREAM, UNIX_DGRAM = 0x00, 0x11, 0x12, 0x21, 0x22, 0x31, 0x32
CLIENT_HELLO = b"\x16\x03\x01\x00\xc8\x01\x00\x00\xc4\x03\x03" + bytes(32)  # a TLS record, a ClientHello's start


def header(ver_cmd: int, family: int, rest: bytes) -> bytes:
    """A v2 header as the spec lays it out: signature, version and command, family, length, the rest."""
    return SPEC_SIGNATURE + bytes((ver_cmd, family)) + struct.pack("!H", len(rest)) + rest


def ipv4(source: str, source_port: int, rest: bytes = b"") -> bytes:
    addresses = socket.inet_pton(socket.AF_INET, source) + socket.inet_pton(socket.AF_INET, "203.0.113.9")
    return header(PROXY, TCP4, addresses + struct.pack("!HH", source_port, 443) + rest)


def ipv6(source: str, source_port: int, rest: bytes = b"") -> bytes:
    addresses = socket.inet_pton(socket.AF_INET6, source) + socket.inet_pton(socket.AF_INET6, "2001:db8::443")
    return header(PROXY, TCP6, addresses + struct.pack("!HH", source_port, 443) + rest)


def tlv(kind: int, value: bytes) -> bytes:
    return bytes((kind,)) + struct.pack("!H", len(value)) + value


TLVS = tlv(0x01, b"h2") + tlv(0x02, b"backup.example.com") + tlv(0x05, b"id-42") + tlv(0x04, bytes(7))

# (header, what parse gives)
WHOLE = {
    "ipv4": (ipv4("192.0.2.7", 51234), Proxied(("192.0.2.7", 51234), 28)),
    "ipv6": (ipv6("2001:db8:0:0:0:0:0:7", 40000), Proxied(("2001:db8::7", 40000), 52)),
    "ipv4-mapped": (ipv6("::ffff:192.0.2.7", 1), Proxied((str(ipaddress.ip_address("::ffff:192.0.2.7")), 1), 52)),
    "local": (header(LOCAL, UNSPEC, b""), Proxied(None, 16)),
    "local-with-addresses": (header(LOCAL, TCP4, bytes(12)), Proxied(None, 28)),  # skipped, not assumed zero
    "local-udp": (header(LOCAL, UDP4, bytes(12)), Proxied(None, 28)),  # LOCAL: the family is ignored
    "local-short": (header(LOCAL, TCP6, bytes(3)), Proxied(None, 19)),
    "local-tlvs": (header(LOCAL, UNSPEC, TLVS), Proxied(None, 16 + len(TLVS))),
    "unspec": (header(PROXY, UNSPEC, b""), Proxied(None, 16)),
    "unspec-with-bytes": (header(PROXY, UNSPEC, b"whatever"), Proxied(None, 24)),
    "ipv4-tlvs": (ipv4("198.51.100.1", 7, TLVS), Proxied(("198.51.100.1", 7), 28 + len(TLVS))),
    "ipv6-tlvs": (ipv6("2001:db8::1", 65535, TLVS), Proxied(("2001:db8::1", 65535), 52 + len(TLVS))),
    "tlv-garbage": (ipv4("192.0.2.1", 2, b"\xff\xff\xff"), Proxied(("192.0.2.1", 2), 31)),  # TLVs: not parsed
    "max-length": (
        ipv4("192.0.2.1", 3, tlv(0x04, bytes(MAX_LENGTH - 12 - 3))),
        Proxied(("192.0.2.1", 3), HEADER_SIZE + MAX_LENGTH),
    ),
}


def test_the_constants_are_the_specs() -> None:
    assert SIGNATURE == SPEC_SIGNATURE
    assert HEADER_SIZE == 16
    assert 216 <= MAX_LENGTH <= 1024  # room for AF_UNIX's addresses, at most what the module says it takes
    assert issubclass(ProxyHeaderError, SessionError)


@pytest.mark.parametrize("name", WHOLE)
def test_a_whole_header(name: str) -> None:
    data, expected = WHOLE[name]
    assert parse(data) == expected
    assert parse(memoryview(data)) == expected
    assert expected.header_size == len(data)


@pytest.mark.parametrize("name", WHOLE)
def test_the_bytes_after_the_header_are_not_its(name: str) -> None:
    data, expected = WHOLE[name]
    assert parse(data + CLIENT_HELLO) == expected


@pytest.mark.parametrize("name", WHOLE)
def test_byte_by_byte_nothing_until_the_last(name: str) -> None:
    data, expected = WHOLE[name]
    for end in range(len(data)):
        assert parse(data[:end]) is None, end
        assert parse(memoryview(data)[:end]) is None, end
    assert parse(data) == expected


# (bytes, offset of the byte at fault, words of the message)
REFUSED = {
    "tls": (CLIENT_HELLO, 0, ["a PROXY protocol v2 header", "TLS ClientHello", "send-proxy-v2"]),
    "http": (b"GET / HTTP/1.1\r\nHost: x\r\n", 0, ["a PROXY protocol v2 header", "text 'GET / HTTP/1.1\\r\\n"]),
    "v1": (
        b"PROXY TCP4 192.0.2.7 203.0.113.9 51234 443\r\n",
        0,
        ["a PROXY protocol v2 header", "v1", "not send-proxy"],
    ),
    "signature-byte-5": (
        SPEC_SIGNATURE[:5] + b"\x0a\x0d",
        5,
        ["a PROXY protocol v2 header", "bytes 0d 0a 0d 0a 00 0a"],
    ),
    "signature-byte-11": (SPEC_SIGNATURE[:11] + b"\x00", 11, ["a PROXY protocol v2 header", "bytes"]),
    "version-1": (header(0x11, TCP4, bytes(12)), 12, ["version 2", "version 1 (0x11)"]),
    "version-3": (header(0x31, TCP4, bytes(12)), 12, ["version 2", "version 3 (0x31)"]),
    "command-2": (header(0x22, TCP4, bytes(12)), 12, ["LOCAL (0x20) or PROXY (0x21)", "command 2 (0x22)"]),
    "command-15": (header(0x2F, TCP4, bytes(12)), 12, ["LOCAL (0x20) or PROXY (0x21)", "command 15"]),
    "udp4": (header(PROXY, UDP4, bytes(12)), 13, ["TCP over IPv4 (0x11)", "UDP over IPv4 (0x12)", "only TCP"]),
    "udp6": (header(PROXY, UDP6, bytes(36)), 13, ["TCP over IPv6 (0x21)", "UDP over IPv6 (0x22)", "only TCP"]),
    "unix-stream": (header(PROXY, UNIX_STREAM, bytes(216)), 13, ["UNIX stream (0x31)", "only TCP"]),
    "unix-dgram": (header(PROXY, UNIX_DGRAM, bytes(216)), 13, ["UNIX datagram (0x32)", "only TCP"]),
    "family-unknown": (header(PROXY, 0x41, bytes(12)), 13, ["UNSPEC (0x00)", "another family", "(0x41)"]),
    "inet-unspec-protocol": (header(PROXY, 0x10, bytes(12)), 13, ["another family", "(0x10)"]),
    "ipv4-short": (header(PROXY, TCP4, bytes(11)), 14, ["at least 12 bytes", "TCP over IPv4", "got 11"]),
    "ipv4-empty": (header(PROXY, TCP4, b""), 14, ["at least 12 bytes", "got 0"]),
    "ipv6-short": (header(PROXY, TCP6, bytes(35)), 14, ["at least 36 bytes", "TCP over IPv6", "got 35"]),
    "ipv6-with-ipv4-length": (header(PROXY, TCP6, bytes(12)), 14, ["at least 36 bytes", "got 12"]),
    "too-long": (header(PROXY, TCP4, bytes(MAX_LENGTH + 1)), 14, [f"at most {MAX_LENGTH} bytes", "got 1025"]),
    "longest": (SPEC_SIGNATURE + b"\x21\x11\xff\xff", 14, [f"at most {MAX_LENGTH} bytes", "got 65535"]),
    "too-long-local": (header(LOCAL, UNSPEC, bytes(MAX_LENGTH + 1)), 14, [f"at most {MAX_LENGTH} bytes"]),
}


@pytest.mark.parametrize("name", REFUSED)
def test_refused_naming_the_byte_and_what_was_expected(name: str) -> None:
    data, offset, words = REFUSED[name]
    with pytest.raises(ProxyHeaderError) as caught:
        parse(data)
    message = str(caught.value)
    assert message.startswith(f"at byte {offset}: expected "), message
    for word in words:
        assert word in message, message


def test_what_came_instead_is_shown_in_its_first_bytes() -> None:
    with pytest.raises(ProxyHeaderError) as caught:
        parse(b"GET / HTTP/1.1\r\n" + b"x" * 100_000)
    assert str(caught.value).endswith("got text 'GET / HTTP/1.1\\r\\n'")


@pytest.mark.parametrize("name", REFUSED)
def test_refused_as_soon_as_the_byte_is_in(name: str) -> None:
    """Up to the byte at fault, more is awaited; with it (both bytes of the length), the header is refused: a
    length above MAX_LENGTH before any of its bytes came."""
    data, offset, _ = REFUSED[name]
    arrived = HEADER_SIZE if offset == 14 else offset + 1
    assert parse(data[: arrived - 1]) is None
    with pytest.raises(ProxyHeaderError, match=f"^at byte {offset}: "):
        parse(data[:arrived])


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    """The service's end of a connection and the balancer's."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.settimeout(10)
        yield ours, theirs


def soon(seconds: float = 10.0) -> float:
    return time.monotonic() + seconds


@pytest.mark.parametrize("name", WHOLE)
def test_read_header_leaves_what_follows_in_the_socket(name: str, pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    data, expected = WHOLE[name]
    theirs.sendall(data + CLIENT_HELLO)
    assert read_header(ours, soon()) == expected
    ours.settimeout(10)
    assert ours.recv(4096) == CLIENT_HELLO


def test_read_header_from_a_balancer_that_sends_byte_by_byte(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    data, expected = WHOLE["ipv6-tlvs"]

    def trickle() -> None:
        for i in range(len(data)):
            theirs.sendall(data[i : i + 1])
            time.sleep(0.001)
        theirs.sendall(CLIENT_HELLO)

    sender = threading.Thread(target=trickle)
    sender.start()
    try:
        assert read_header(ours, soon()) == expected
    finally:
        sender.join()
    ours.settimeout(10)
    assert ours.recv(4096) == CLIENT_HELLO


def test_read_header_keeps_the_sockets_timeout(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    ours.settimeout(7.5)
    theirs.sendall(WHOLE["ipv4"][0])
    read_header(ours, soon())
    assert ours.gettimeout() == 7.5


@pytest.mark.parametrize(
    ("sent", "said"),
    [
        (b"", "after 0 bytes of the PROXY protocol v2 header (at least 16 bytes)"),
        (SPEC_SIGNATURE[:5], "after 5 bytes of the PROXY protocol v2 header (at least 16 bytes)"),
        (WHOLE["ipv4"][0][:20], "after 20 bytes of the PROXY protocol v2 header (28 bytes)"),
        (WHOLE["ipv4-tlvs"][0][:-1], f"after {27 + len(TLVS)} bytes of the PROXY protocol v2 header"),
    ],
)
def test_read_header_refuses_a_close_before_the_end(
    sent: bytes, said: str, pair: tuple[socket.socket, socket.socket]
) -> None:
    ours, theirs = pair
    theirs.sendall(sent)
    theirs.shutdown(socket.SHUT_WR)
    with pytest.raises(ProxyHeaderError) as caught:
        read_header(ours, soon())
    assert str(caught.value).startswith(f"the balancer closed {said}"), caught.value


def test_read_header_refuses_at_the_deadline(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    theirs.sendall(WHOLE["ipv6"][0][:30])
    start = time.monotonic()
    with pytest.raises(ProxyHeaderError, match=r"^the deadline passed after 30 bytes .* \(52 bytes\)"):
        read_header(ours, start + 0.2)
    assert 0.15 <= time.monotonic() - start < 10


def test_read_header_refuses_a_deadline_passed(pair: tuple[socket.socket, socket.socket]) -> None:
    ours, theirs = pair
    theirs.sendall(WHOLE["ipv4"][0])
    with pytest.raises(ProxyHeaderError, match=r"^the deadline passed after 0 bytes "):
        read_header(ours, time.monotonic() - 1)


@pytest.mark.parametrize("name", ["tls", "v1", "too-long", "udp4"])
def test_read_header_refuses_at_once(name: str, pair: tuple[socket.socket, socket.socket]) -> None:
    """A wrong header is refused as soon as the byte at fault is in: not at the deadline, and a length above
    MAX_LENGTH before its bytes (the balancer sends no more than the 16 bytes, and does not close)."""
    ours, theirs = pair
    data, offset, _ = REFUSED[name]
    theirs.sendall(data[: HEADER_SIZE if offset == 14 else offset + 1])
    start = time.monotonic()
    with pytest.raises(ProxyHeaderError, match=f"^at byte {offset}: "):
        read_header(ours, start + 30)
    assert time.monotonic() - start < 10
