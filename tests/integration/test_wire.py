"""The wire: ``send --compress zstd`` (negotiated per connection, compressed before TLS, the receiver's
bytes as sent) and ``send --buffer SIZE`` (a bursty producer runs on while the network is slower)."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import threading
from pathlib import Path

import pytest
import zstandard
from support.net import CMD, announced, key_file, receiver, sender, transfer
from support.streams import SAMPLE

from sendstream.errors import SessionError
from sendstream.session.protocol import CompressAnswer, CompressOffer, Data, RawStream, ReceiverConnection
from sendstream.transfer.progress import size
from sendstream.transport.compression import MAX_LEVEL, parse_choice

# Real streams, one after another (as btrfs receive takes them): repeats that zstd finds.
STREAM = SAMPLE.read_bytes() * 12


def _ratio(text: str) -> float:
    match = re.search(r"zstd:3 ([0-9.]+):1", text)
    assert match, text
    return float(match.group(1))


@pytest.mark.parametrize("resumable", [False, True], ids=["plain", "resumable"])
@pytest.mark.parametrize("mode", ["none", "tls13-aes128-gcm"])
def test_a_compressed_transfer_delivers_the_stream(tmp_path: Path, mode: str, resumable: bool) -> None:
    out = tmp_path / "out"
    extra = ["--compress", "zstd", *(["--resumable"] if resumable else [])]
    sent, (code, err) = transfer(mode, key_file(tmp_path / "k"), out, STREAM, *extra)
    assert sent.returncode == 0 and code == 0, (sent.stderr, err)
    assert out.read_bytes() == STREAM
    assert _ratio(sent.stderr.decode()) > 5, sent.stderr
    assert b"zstd from the sender" in err, err


class Counter:
    """A TCP forwarder between sender and receiver that keeps what the sender put on the wire."""

    def __init__(self, target: int) -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.target = target
        self.upstream = bytearray()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        client, _ = self.server.accept()
        peer = socket.create_connection(("127.0.0.1", self.target))
        back = threading.Thread(target=self._pipe, args=(peer, client, None), daemon=True)
        back.start()
        self._pipe(client, peer, self.upstream)
        back.join(10)

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket, keep: bytearray | None) -> None:
        while data := src.recv(1 << 16):
            if keep is not None:
                keep += data
            dst.sendall(data)
        dst.shutdown(socket.SHUT_WR)


def test_the_wire_carries_zstd_not_the_stream(tmp_path: Path) -> None:
    recv = receiver("receive", "--listen", "127.0.0.1:0", "-o", str(tmp_path / "out"), "--tls", "none")
    try:
        port, _ = announced(recv)
        counter = Counter(port)
        sent = sender("--to", f"127.0.0.1:{counter.port}", "-", "--tls", "none", "--compress", "zstd", data=STREAM)
        _, err = recv.communicate(timeout=60)
    finally:
        recv.kill()
    assert sent.returncode == 0 and recv.returncode == 0, (sent.stderr, err)
    wire = bytes(counter.upstream)
    assert wire.startswith(b"sendstream-compress zstd\n"), wire[:40]
    compressed = wire[len(b"sendstream-compress zstd\n") :]
    assert zstandard.ZstdDecompressor().decompressobj().decompress(compressed) == STREAM
    assert len(wire) < len(STREAM) / 5, len(wire)
    assert f"({size(len(compressed))}, {len(compressed):,} bytes on the wire)" in sent.stderr.decode(), sent.stderr


# the receiver's side, without I/O


def test_the_receiver_machine_takes_one_offer_then_the_first_words() -> None:
    machine = ReceiverConnection()
    assert machine.receive_data(b"sendstream-compress zstd\n") == [CompressOffer("zstd")]
    assert machine.send(CompressAnswer("zstd")) == b"sendstream-compress zstd\n"
    assert [type(e) for e in machine.receive_data(b"btrfs-stream\0")] == [RawStream, Data]
    with pytest.raises(SessionError, match="no compression offer to answer"):
        ReceiverConnection().send(CompressAnswer("zstd"))


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"sendstream-compress zstd\nbtrfs-stream\0", "sent more before its compression offer was answered"),
        (b"sendstream-compress ZSTD!\n", "malformed compression line from the sender"),
        (b"sendstream-compress " + b"z" * 70000, "longer than"),
    ],
    ids=["data-before-answer", "bad-method", "endless-line"],
)
def test_the_receiver_machine_refuses_a_bad_offer(data: bytes, message: str) -> None:
    with pytest.raises(SessionError, match=message):
        ReceiverConnection().receive_data(data)


def test_a_second_offer_is_not_first_words() -> None:
    machine = ReceiverConnection()
    machine.receive_data(b"sendstream-compress zstd\n")
    machine.send(CompressAnswer("none"))
    with pytest.raises(SessionError, match=r"neither a session hello nor a btrfs stream: b'sendstream-compress"):
        machine.receive_data(b"sendstream-compress zstd\n")
    fresh = ReceiverConnection()
    fresh.receive_data(b"sendstream-compress lz4\n")
    fresh.send(CompressAnswer("none"))
    assert [type(e) for e in fresh.receive_data(b"btrfs-stream\0")] == [RawStream, Data]


# hostile senders: the receiver refuses the connection, says why, and goes on


def _offer_then(port: int, payload: bytes) -> bytes:
    """What the receiver says to a compression offer and then ``payload``. It may refuse and close before
    it has read all of it: its status comes, then a reset, which ends our sending and our reading."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"sendstream-compress zstd\n")
        answer = sock.recv(100)
        with contextlib.suppress(OSError):
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        sock.settimeout(20)
        told = bytearray(answer)
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(4096):
                told += chunk
        return bytes(told)


BIG_WINDOW = zstandard.ZstdCompressor(
    compression_params=zstandard.ZstdCompressionParameters(window_log=27, compression_level=3)
).compressobj()


@pytest.mark.parametrize(
    ("payload", "why"),
    [
        (b"\x28\xb5\x2f\xfd" + b"x" * 40, "the sender's zstd stream is damaged"),
        (b"not zstd at all" * 4, "the sender's zstd stream is damaged"),
        (BIG_WINDOW.compress(STREAM) + BIG_WINDOW.flush(), "the sender's zstd stream is damaged"),
    ],
    ids=["bad-frame", "not-zstd", "window-over-8-MiB"],
)
def test_a_bad_zstd_stream_is_refused_and_the_receiver_goes_on(tmp_path: Path, payload: bytes, why: str) -> None:
    out = tmp_path / "out"
    recv = receiver("receive", "--listen", "127.0.0.1:0", "-o", str(out), "--tls", "none")
    try:
        port, _ = announced(recv)
        told = _offer_then(port, payload)
        assert told.startswith(b"sendstream-compress zstd\nsendstream-status "), told
        assert why.encode() in told, told
        sent = sender("--to", f"127.0.0.1:{port}", str(SAMPLE), "--tls", "none", "--compress", "zstd:19")
        _, err = recv.communicate(timeout=60)
    finally:
        recv.kill()
    assert sent.returncode == 0 and recv.returncode == 0, (sent.stderr, err)
    assert out.read_bytes() == SAMPLE.read_bytes()
    assert why.encode() in err, err


# senders meeting receivers that do not compress


def _peer(answer: bytes, got: list[bytes]) -> tuple[int, threading.Thread]:
    """A receiver that answers the offer with ``answer`` and, after a ``none``, takes a raw stream."""
    server = socket.create_server(("127.0.0.1", 0))

    def run() -> None:
        conn, _ = server.accept()
        with conn, server:
            conn.recv(100)
            conn.sendall(answer)
            if answer.startswith(b"sendstream-status"):
                return
            data = b"".join(iter(lambda: conn.recv(1 << 16), b""))
            got.append(data)
            conn.sendall(b"sendstream-status 0 ok\n")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return server.getsockname()[1], thread


def test_a_receiver_that_takes_none_gets_the_plain_stream() -> None:
    got: list[bytes] = []
    port, thread = _peer(b"sendstream-compress none\n", got)
    sent = sender("--to", f"127.0.0.1:{port}", str(SAMPLE), "--tls", "none", "--compress", "zstd")
    thread.join(20)
    assert sent.returncode == 0, sent.stderr
    assert got == [SAMPLE.read_bytes()]
    assert b"not compressed: the receiver takes no zstd" in sent.stderr, sent.stderr


def test_an_older_receiver_that_refuses_the_offer_is_named() -> None:
    refusal = b"sendstream-status 2 refused: neither a session hello nor a btrfs stream: b'sendstream-c'\n"
    port, thread = _peer(refusal, [])
    sent = sender("--to", f"127.0.0.1:{port}", str(SAMPLE), "--tls", "none", "--compress", "zstd")
    thread.join(20)
    assert sent.returncode == 2, sent.stderr
    lines = sent.stderr.decode().strip().splitlines()
    assert "refused to take a compressed stream" in lines[-1] and "without --compress" in lines[-1], lines


@pytest.mark.parametrize("value", ["lz4", "zstd:0", f"zstd:{MAX_LEVEL + 1}", "zstd:x"])
def test_a_bad_compress_value_is_a_usage_error(value: str) -> None:

    result = subprocess.run(
        [*CMD, "send", "--to", "127.0.0.1:1", str(SAMPLE), "--compress", value], capture_output=True
    )
    assert result.returncode == 2 and b"Traceback" not in result.stderr
    assert b"Invalid value for '--compress'" in result.stderr and b"expected" in result.stderr, result.stderr


def test_levels() -> None:
    assert parse_choice("zstd") == 3 and parse_choice("zstd:19") == 19
    with pytest.raises(ValueError, match="1 to 19"):
        parse_choice("zstd:22")


# --buffer


def _received_when_written(tmp_path: Path, *extra: str) -> float:
    """How much of a burst written into ``send`` at 4 MiB/s the receiver had when the producer's write
    returned, as a share of the burst (an event, not a time: the rate limit paces what can arrive)."""
    data = SAMPLE.read_bytes() * 40  # 11 MB: 2.7 s at 4 MiB/s
    out = tmp_path / f"out{len(extra)}"
    recv = receiver("receive", "--listen", "127.0.0.1:0", "-o", str(out), "--tls", "none")
    try:
        port, _ = announced(recv)
        argv = [*CMD, "send", "--to", f"127.0.0.1:{port}", "-", "--tls", "none", "--rate-limit", "4M", *extra]
        send = subprocess.Popen(argv, stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        assert send.stdin is not None
        send.stdin.write(data)
        send.stdin.close()
        received = sum(p.stat().st_size for p in tmp_path.glob(f".{out.name}.*.tmp"))  # the output being written
        send.wait(timeout=60)
        assert send.stderr is not None
        err = send.stderr.read()
        recv.communicate(timeout=60)
    finally:
        recv.kill()
    assert send.returncode == 0 and recv.returncode == 0, err
    assert out.read_bytes() == data
    return received / len(data)


def test_a_buffer_lets_a_bursty_producer_run_on(tmp_path: Path) -> None:
    assert _received_when_written(tmp_path, "--buffer", "16M") < 0.5  # 0.01-0.03 measured
    assert _received_when_written(tmp_path) > 0.6  # without it, the producer waits for the network (0.84)


def test_a_channel_that_decompresses_is_freed_with_its_last_reference() -> None:
    """The zstd reader (a C object) holds its source without telling the garbage collector: a source that
    led back to the channel kept every compressed transfer's channel, TLS session and window for ever."""
    import gc
    import weakref

    from sendstream.transport.compression import Decompressing
    from sendstream.transport.tls import PlainChannel

    ours, theirs = socket.socketpair()
    with theirs:
        channel = Decompressing(PlainChannel(ours))
        theirs.sendall(zstandard.ZstdCompressor().compress(b"hello"))
        buf = bytearray(16)
        assert channel.recv_into(buf) == 5 and buf[:5] == b"hello"
        channel.close()
        gone = weakref.ref(channel)
        del channel
        gc.collect()
    assert gone() is None
