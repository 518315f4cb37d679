"""The layers of a channel (sendstream.transport: Compressing, Decompressing, Paced) over a real plain channel
on a socketpair: the bytes they put on the wire, the end of the zstd stream before the end of the direction,
a rate held on a clock of our own, and everything else handed to the channel below."""

from __future__ import annotations

import dataclasses
import os
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import zstandard

from sendstream.errors import SessionError, UsageError
from sendstream.transport.compression import Compressing, Decompressing, Tally
from sendstream.transport.pacing import Paced
from sendstream.transport.tls import PlainChannel

WRITES = [b"hello " * 1000, b"", bytes(200_000), os.urandom(70_000), b"x"]


@pytest.fixture
def pair() -> Iterator[tuple[PlainChannel, socket.socket]]:
    ours, theirs = socket.socketpair()
    ours.settimeout(10)
    theirs.settimeout(10)
    channel = PlainChannel(ours)
    with theirs:
        yield channel, theirs
        channel.close()


def drain(sock: socket.socket) -> Callable[[], bytes]:
    """Everything ``sock`` receives up to the end, read in a thread (the writer must not fill the buffers):
    call the result for it."""
    got = bytearray()

    def run() -> None:
        while chunk := sock.recv(1 << 16):
            got.extend(chunk)

    thread = threading.Thread(target=run)
    thread.start()

    def result() -> bytes:
        thread.join(10)
        assert not thread.is_alive()
        return bytes(got)

    return result


def zstd_as_sent(writes: list[bytes], *, ended: bool = True) -> bytes:
    """What the wire carries for ``writes``: one zstd stream (level 3), each write flushed to the end of a
    block; the end of the frame when ``ended``."""
    stream = zstandard.ZstdCompressor(level=3).compressobj()
    out = b"".join(stream.compress(w) + stream.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK) for w in writes)
    return out + stream.flush(zstandard.COMPRESSOBJ_FLUSH_FINISH) if ended else out


class Clock:
    """Time that passes only when someone sleeps."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


def test_compressing_over_pacing_sends_one_zstd_stream_flushed_at_each_write(
    pair: tuple[PlainChannel, socket.socket],
) -> None:
    plain, theirs = pair
    received = drain(theirs)
    tally = Tally(level=3)
    channel = Compressing(Paced(plain, 50e6), tally)
    for w in WRITES:
        channel.send_all(w)
    channel.shutdown_write()  # the end of the frame, then the half-close
    wire = received()
    assert wire == zstd_as_sent(WRITES)
    assert zstandard.ZstdDecompressor().decompressobj().decompress(wire) == b"".join(WRITES)
    assert (tally.raw, tally.wire) == (sum(map(len, WRITES)), len(wire))


def test_a_compressed_sendfile_is_read_and_compressed(pair: tuple[PlainChannel, socket.socket], tmp_path: Path) -> None:
    plain, theirs = pair
    data = b"abc" * 200_000  # three pieces of read_and_send
    path = tmp_path / "f"
    path.write_bytes(data)
    received = drain(theirs)
    channel = Compressing(plain, Tally(level=3))
    with open(path, "rb") as f:
        assert channel.sendfile(f.fileno(), 3, len(data)) == len(data) - 3  # the file ends first
    channel.shutdown_write()
    assert received() == zstd_as_sent(
        [data[3 : 3 + (256 << 10)], data[3 + (256 << 10) : 3 + (512 << 10)], data[3 + (512 << 10) :]]
    )


def test_the_zstd_stream_ends_before_the_direction_and_not_when_abandoned(
    pair: tuple[PlainChannel, socket.socket],
) -> None:
    plain, theirs = pair
    channel = Compressing(plain, Tally(level=3))
    channel.send_all(b"data")
    received = drain(theirs)
    assert zstd_as_sent([b"data"], ended=False) != zstd_as_sent([b"data"])
    channel.abandon()  # dropped: no end of frame, so the peer sees the stream cut short
    assert received() == zstd_as_sent([b"data"], ended=False) != zstd_as_sent([b"data"])
    with pytest.raises(UsageError, match="after shutdown_write"):
        channel.send_all(b"more")


def test_a_failed_send_breaks_every_layer(pair: tuple[PlainChannel, socket.socket]) -> None:
    plain, theirs = pair
    channel = Compressing(Paced(plain, 1e9), Tally(level=3))
    theirs.close()
    with pytest.raises(OSError):
        for _ in range(100):
            channel.send_all(os.urandom(1 << 16))
    with pytest.raises(UsageError, match="after a failed send"):
        channel.send_all(b"x")
    with pytest.raises(UsageError, match="after a failed send"):
        plain.send_all(b"x")  # one record of the two ends, for the layers and the channel below
    channel.close()  # no end of frame tried: the peer is gone, and the stream is broken anyway


def test_pacing_holds_the_rate_in_bursts(pair: tuple[PlainChannel, socket.socket], tmp_path: Path) -> None:
    plain, theirs = pair
    clock = Clock()
    rate = 100_000.0
    channel = Paced(plain, rate, clock=clock, sleep=clock.sleep)
    burst = 5000  # 50 ms of the rate
    received = drain(theirs)
    channel.send_all(bytes(burst))  # a full bucket at the start
    assert clock.slept == []
    channel.send_all(bytes(3 * burst + 1))
    assert clock.slept == pytest.approx([0.05, 0.05, 0.05, 0.00001])
    path = tmp_path / "f"
    path.write_bytes(os.urandom(2 * burst + 10))
    with open(path, "rb") as f:
        assert channel.sendfile(f.fileno(), 0, 4 * burst) == 2 * burst + 10  # the file ends first
    assert clock.slept[4:] == pytest.approx([0.05, 0.05, 0.05])  # each piece paced before it goes, as asked
    assert clock.now - 100.0 == pytest.approx((burst + 3 * burst + 1 + 3 * burst - burst) / rate)
    channel.shutdown_write()
    assert received() == bytes(4 * burst + 1) + path.read_bytes()


def test_decompressing_receives_the_peers_stream_decompressed(pair: tuple[PlainChannel, socket.socket]) -> None:
    plain, theirs = pair
    channel = Decompressing(plain)
    theirs.sendall(zstd_as_sent([b"hello", b" world"]))
    theirs.shutdown(socket.SHUT_WR)
    got, buf = bytearray(), bytearray(4)
    while n := channel.recv_into(buf):
        got += buf[:n]
    assert got == b"hello world"


def test_decompressing_a_damaged_stream_says_so(pair: tuple[PlainChannel, socket.socket]) -> None:
    plain, theirs = pair
    channel = Decompressing(plain)
    theirs.sendall(b"this is no zstd frame" * 4)
    theirs.shutdown(socket.SHUT_WR)
    with pytest.raises(SessionError, match="the sender's zstd stream is damaged"):
        channel.recv_into(bytearray(16))


def test_a_layer_hands_everything_else_to_the_channel_below(pair: tuple[PlainChannel, socket.socket]) -> None:
    plain, theirs = pair
    channel = Paced(Compressing(Decompressing(plain), Tally(level=1)), 1e6)
    channel.identity = "alpha"
    assert (plain.identity, channel.identity) == ("alpha", "alpha")
    assert (channel.tx_path, channel.rx_path, channel.describe()) == ("plain", "plain", plain.describe())
    channel.settimeout(0.05)
    with pytest.raises(TimeoutError, match=r"timed out after 0\.05 s waiting to receive"):
        channel.recv_into(bytearray(16))
    channel.set_deadline(0.0)
    with pytest.raises(TimeoutError, match="the deadline passed"):
        channel.recv_into(bytearray(16))
    channel.set_deadline(None)
    channel.interrupt()
    assert channel.recv_into(bytearray(16)) == 0  # shut down both ways: the end
    with channel:
        pass
    assert plain.ends.tx_done and theirs.recv(16) == b""  # closed below, the end of frame forgiven


def test_the_service_tells_an_unencrypted_connection_under_its_layers(
    pair: tuple[PlainChannel, socket.socket],
) -> None:
    """A client trusted to send unencrypted from an address, no longer trusted after a reload, is told so
    whether its connection is compressed or not (the channel the opening holds is then a layer)."""
    import ipaddress

    from sendstream.service.config import Client, Config
    from sendstream.service.openings import why_revoked
    from sendstream.session.connection import Inbox
    from sendstream.session.protocol import ReceiverConnection
    from sendstream.session.receiver import Opening
    from sendstream.transport.address import Address

    plain, _ = pair
    client = Client("alpha", bytes(32), "/srv/alpha", trusted=(ipaddress.ip_network("192.0.2.0/24"),))
    config = Config("serve.toml", Address("0.0.0.0", 1), "none", {"alpha": client}, 1, 1, 1.0, None)
    reloaded = Config(
        "serve.toml", Address("0.0.0.0", 1), "none", {"alpha": dataclasses.replace(client, trusted=())}, 1, 1, 1.0, None
    )
    for channel in (plain, Decompressing(plain)):
        opening = Opening(channel, Inbox(channel, ReceiverConnection(), 16), None, "192.0.2.7:5000")
        assert why_revoked(client, opening, config) == ""
        assert (
            why_revoked(client, opening, reloaded)
            == "192.0.2.7 is no longer among the trusted addresses of client alpha"
        )
