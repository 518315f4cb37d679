"""Resumable transfers: a fault-injecting TCP proxy between sender and receiver.

The proxy cuts connections at seeded random byte positions (inside the TLS
handshake or the session hello, inside a command, right after a chunk from
the receiver such as an acknowledgement or the final status) and stalls
them; every transfer must end with output sha256-identical to the source.
"""

from __future__ import annotations

import hashlib
import json
import random
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.net import CMD, announced, tls_args
from support.proxy import RECEIVER, SEED, SENDER, Proxy, plan
from support.streams import FIXTURES, SAMPLE

from sendstream.transfer.identity import stream_identity
from sendstream.transport.tls import PlainChannel

DATA = SAMPLE.read_bytes()
SHA = hashlib.sha256(DATA).hexdigest()


def plain(sock: socket.socket, seconds: float) -> PlainChannel:
    """The handshake of mode none."""
    return PlainChannel(sock)


def faulty_transfer(
    mode: str, key: Path, out: Path, faults: list[tuple[Any, ...]], source: Path = SAMPLE
) -> tuple[Proxy, subprocess.CompletedProcess[bytes], tuple[int, bytes]]:
    recv = subprocess.Popen(
        [*CMD, "receive", "--listen", "127.0.0.1:0", "-o", str(out), *tls_args(mode, key), "-q", "-v", *RECEIVER],
        stderr=subprocess.PIPE,
    )
    port, said = announced(recv)
    proxy = Proxy(port, faults)
    try:
        sent = subprocess.run(
            [
                *CMD,
                "send",
                "--resumable",
                "--to",
                f"127.0.0.1:{proxy.port}",
                str(source),
                *tls_args(mode, key),
                "-v",
                *SENDER,
            ],
            capture_output=True,
            timeout=90,
        )
        _, err = recv.communicate(timeout=60)
    finally:
        recv.kill()
        proxy.close()
    return proxy, sent, (recv.returncode, said + err)


def test_200_seeded_cuts_all_resume_to_identical_output(key: Path, tmp_path: Path) -> None:
    rng = random.Random(SEED)
    modes = ["tls13-aes128-gcm", "none", "tls12-aes128-gcm"]
    total_cuts = total_stalls = transfers = 0
    started = time.monotonic()
    while total_cuts < 200:
        assert time.monotonic() - started < 400, f"too slow: {total_cuts} cuts in {transfers} transfers"
        mode = modes[transfers % len(modes)]
        out = tmp_path / f"out-{transfers}.stream"
        faults = plan(rng, 8, mode)
        proxy, sent, (code, err) = faulty_transfer(mode, key, out, faults)
        context = f"transfer {transfers} ({mode}, seed {SEED}, faults {faults}): {sent.stderr!r} {err!r}"
        assert sent.returncode == 0 and code == 0, context
        assert hashlib.sha256(out.read_bytes()).hexdigest() == SHA, context
        total_cuts += proxy.cuts
        total_stalls += proxy.stalls
        transfers += 1
        out.unlink()
    print(f"{total_cuts} cuts and {total_stalls} stalls over {transfers} transfers, all resumed")


def test_a_pipe_source_and_one_child_across_reconnects(key: Path, tmp_path: Path) -> None:
    """`btrfs send | sendstream send` (a pipe) into `receive --exec`: the child is started once."""
    faults = [("c2s", 20_000, True), ("c2s", 150_000, False), ("s2c", 2, True)]
    target, starts = tmp_path / "via-child.stream", tmp_path / "starts"
    child = f"sh -c 'echo started >> {starts}; cat > {target}'"
    recv = subprocess.Popen(
        [*CMD, "receive", "--listen", "127.0.0.1:0", "--key", str(key), "--exec", child, "-v"],
        stderr=subprocess.PIPE,
    )
    proxy = Proxy(announced(recv)[0], faults)
    try:
        sent = subprocess.run(
            [
                *CMD,
                "send",
                "--resumable",
                "--to",
                f"127.0.0.1:{proxy.port}",
                "-",
                "--key",
                str(key),
                "--retry-delay",
                "0.05",
                "-v",
            ],
            input=DATA,
            capture_output=True,
            timeout=60,
        )
        _, err = recv.communicate(timeout=60)
    finally:
        recv.kill()
        proxy.close()
    assert sent.returncode == 0 and recv.returncode == 0, (sent.stderr, err)
    assert proxy.cuts >= 1, (proxy.connections, sent.stderr, err)
    assert target.read_bytes() == DATA
    assert starts.read_text() == "started\n"
    assert b"resumed after" in sent.stderr and b"connection lost" in err


def test_the_sender_holds_at_most_the_window(tmp_path: Path) -> None:
    """Resending never exceeds the window: everything before it was acknowledged."""
    from sendstream.endpoints.receiving import accept_sender
    from sendstream.session.sender import SessionSender
    from sendstream.transport.address import connect, listen
    from sendstream.transport.tls import PlainChannel

    server = listen("127.0.0.1", 0)
    port = server.getsockname()[1]
    out = bytearray()
    window = 128 << 10  # the smallest: the first 64 KiB and a piece of 64 KiB

    def receive() -> None:
        session = accept_sender(server, plain, timeout=5, idle_timeout=10, warn=print, reconnect_timeout=10)
        view = memoryview(bytearray(7000))
        while n := session.readinto(view):
            out.extend(view[:n])
            session.wrote(n)
        session.commit()
        session.answer(0, "ok", linger=5)
        session.close()

    thread = threading.Thread(target=receive, daemon=True)
    thread.start()
    cuts = iter([100_000, 180_000, 250_000])
    sockets: list[socket.socket] = []

    def connect_once() -> PlainChannel:
        sock = connect("127.0.0.1", port)
        sock.settimeout(5)
        sockets.append(sock)
        return PlainChannel(sock)

    sender = SessionSender(connect_once, retries=3, retry_delay=0.01, window=window)
    next_cut = next(cuts)
    maximum = 0
    for start in range(0, len(DATA), 1000):
        sender.write(DATA[start : start + 1000])
        maximum = max(maximum, sender.written - sender.acked)
        if sender.written >= next_cut:
            sockets[-1].shutdown(socket.SHUT_RDWR)  # a cut
            next_cut = next(cuts, 1 << 40)
    assert sender.finish() == (0, "ok")
    thread.join(10)
    server.close()
    assert bytes(out) == DATA
    assert sender.reconnects == 3
    assert maximum <= window
    assert sender.resent <= 3 * window


def test_a_sender_of_another_stream_is_refused(tmp_path: Path) -> None:
    """A reconnect must announce the same stream identity."""
    assert stream_identity(DATA[:65536]) != stream_identity((FIXTURES / "rich-incr-v2.stream").read_bytes()[:65536])
    ident = stream_identity(DATA[:65536])
    assert ident["command"] == "subvol" and ident["uuid"] and ident["parent_uuid"] is None
    incr = stream_identity((FIXTURES / "rich-incr-v2.stream").read_bytes()[:65536])
    assert incr["command"] == "snapshot" and incr["parent_uuid"] == "5751d173-386b-2e48-a1ec-5e5bd918dd22"


def test_raw_stream_still_accepted(tmp_path: Path) -> None:
    """An old-style sender (the raw stream, no session) still works."""
    out = tmp_path / "o"
    recv = subprocess.Popen(
        [*CMD, "receive", "--listen", "127.0.0.1:0", "--tls", "none", "-o", str(out)], stderr=subprocess.PIPE
    )
    port, _ = announced(recv)
    sent = subprocess.run(
        [*CMD, "send", "--to", f"127.0.0.1:{port}", str(SAMPLE), "--tls", "none"], capture_output=True
    )
    recv.communicate(timeout=30)
    assert sent.returncode == 0 and recv.returncode == 0, sent.stderr
    assert out.read_bytes() == DATA


_ = sys


def test_a_sender_giving_up_right_after_data_is_reported_with_its_reason() -> None:
    """An ``X`` frame that arrives with the data before it: the data first, then the sender's reason."""
    from sendstream.errors import RemoteError
    from sendstream.session.messages import MAGIC
    from sendstream.session.receiver import SessionReceiver, open_connection

    ours, theirs = socket.socketpair()
    reason = b"input: offset 42: bad crc"
    hello = MAGIC + b" 1 " + json.dumps({"stream": stream_identity(DATA[:65536])}).encode() + b"\n"
    ours.sendall(hello + struct.pack(">cI", b"D", 1000) + DATA[:1000] + struct.pack(">cI", b"X", len(reason)) + reason)
    session = SessionReceiver(open_connection(theirs, plain, time.monotonic() + 5, timeout=5, idle_timeout=5))
    try:
        view = memoryview(bytearray(4096))
        assert bytes(view[: session.readinto(view)]) == DATA[:1000]
        with pytest.raises(RemoteError, match="the sender gave up: input: offset 42: bad crc"):
            session.readinto(view)
    finally:
        session.close()
        ours.close()
