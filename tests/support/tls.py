"""TLS channels over loopback, and real TLS peers (OpenSSL) against ours: what the TLS tests share.

Every socket handed to a channel has a timeout and every peer is killed, so nothing waits for ever.
"""

from __future__ import annotations

import contextlib
import hashlib
import random
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sendstream.transport import tls
from sendstream.transport.tls.kernel import TCP_ULP
from support.net import free_port, wait_listening
from support.streams import SAMPLE

KEY = bytes(range(32))
IDENTITY = "sendstream-test"
UP = random.Random(1).randbytes(3 << 20)
DOWN = random.Random(2).randbytes(3 << 20)
IO_TIMEOUT = 20.0

# What OpenSSL is told, per mode: written out here, not taken from the module under test.
OPENSSL = {
    "tls12-aes128-gcm": ["-tls1_2", "-cipher", "PSK-AES128-GCM-SHA256"],
    "tls12-aes256-gcm": ["-tls1_2", "-cipher", "PSK-AES256-GCM-SHA384"],
    "tls13-aes128-gcm": ["-tls1_3", "-ciphersuites", "TLS_AES_128_GCM_SHA256"],
    "tls13-aes256-gcm": ["-tls1_3", "-ciphersuites", "TLS_AES_256_GCM_SHA384"],
}


def kernel_tls() -> bool:
    """Whether this kernel takes the "tls" upper-layer protocol (CONFIG_TLS)."""
    a, b = tcp_pair()
    with a, b:
        try:
            a.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
        except OSError:
            return False
    return True


def sha(data: bytes | bytearray) -> str:
    return hashlib.sha256(data).hexdigest()


def tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        client = socket.create_connection(server.getsockname())
        accepted, _ = server.accept()
    for s in (client, accepted):
        s.settimeout(IO_TIMEOUT)
    return client, accepted


def connect(port: int) -> socket.socket:
    """Connect to a peer that may not listen yet."""
    deadline = time.monotonic() + 10
    while True:
        try:
            sock = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
            continue
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


def in_thread(fn: Callable[[], object]) -> Callable[[], object]:
    """Run ``fn`` in a thread; the returned function joins it and returns its result or raises its error."""
    result: list[object] = []
    error: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as exc:
            error.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> object:
        thread.join(IO_TIMEOUT * 2)
        assert not thread.is_alive(), "thread still running"
        if error:
            raise error[0]
        return result[0]

    return join


def our_pair(
    client_mode: str, server_mode: str | None = None, *, key: bytes = KEY, keys: object = KEY, **kw: object
) -> tuple[tls.Channel, tls.Channel]:
    """Our client and our server over loopback."""
    c, s = tcp_pair()
    server = in_thread(lambda: tls.accept_channel(s, server_mode or client_mode, keys, **kw))  # type: ignore[arg-type]
    try:
        client = tls.connect_channel(c, client_mode, key, IDENTITY, **kw)  # type: ignore[arg-type]
    except BaseException:
        with contextlib.suppress(Exception):
            server()
        raise  # the client's error, not the server's
    accepted = server()
    assert isinstance(accepted, tls.Channel)
    return client, accepted


def exchange(channel: tls.Channel, send: bytes, expect: int | None) -> bytes:
    """Send ``send`` while receiving; return all that came until the clean end.

    Our close_notify goes once ``expect`` bytes came, or (None) after the peer's.
    """
    got = bytearray()
    enough = threading.Event()

    def receive() -> None:
        buf = memoryview(bytearray(256 << 10))
        try:
            while n := channel.recv_into(buf):
                got.extend(buf[:n])
                if expect is not None and len(got) >= expect:
                    enough.set()
        finally:
            enough.set()

    receiver = in_thread(receive)
    channel.send_all(send)
    enough.wait(IO_TIMEOUT)
    channel.shutdown_write()
    receiver()  # a TruncationError would come out here: the end must be clean
    assert len(got) >= (expect or 0), f"received {len(got)} of {expect} bytes"
    return bytes(got)


@contextlib.contextmanager
def peer(args: list[str], tmp_path: Path, **popen: object) -> Iterator[subprocess.Popen[bytes]]:
    """A peer process, killed whatever happens; its stderr is shown when the test fails."""
    if shutil.which(args[0]) is None:
        pytest.skip(f"{args[0]} is not installed (apt-get install openssl gnutls-bin stunnel4)")
    log = tmp_path / f"{args[0]}.log"
    with log.open("wb") as err:
        proc = subprocess.Popen(args, stderr=err, **popen)  # type: ignore[call-overload]
    try:
        yield proc
    except BaseException:
        print(f"--- {args[0]} stderr:\n{log.read_text(errors='replace')[-3000:]}")
        raise
    finally:
        proc.kill()
        proc.wait()
        if proc.stdin:
            with contextlib.suppress(OSError):
                proc.stdin.close()


def feed(proc: subprocess.Popen[bytes], data: bytes, *, close: bool) -> None:
    """Write ``data`` to the peer's stdin in the background; keep stdin open unless ``close``."""

    def write() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(OSError, ValueError):  # the peer may be gone, its stdin closed
            proc.stdin.write(data)
            proc.stdin.flush()
            if close:
                proc.stdin.close()

    threading.Thread(target=write, daemon=True).start()


def write_key(path: Path, data: bytes, mode: int = 0o600) -> Path:
    path.write_bytes(data)
    path.chmod(mode)
    return path


def our_client_to_openssl_s_server(mode: str, psk: list[str], tmp_path: Path) -> None:
    """Both directions with ``openssl s_server``, its key given by ``psk`` (``-psk HEX`` or ``-psk_session FILE``)."""
    port = free_port()
    args = ["-accept", str(port), *psk, "-psk_identity", IDENTITY, "-nocert", "-num_tickets", "0"]
    out = tmp_path / "received"
    with (
        out.open("wb") as sink,
        peer(
            ["openssl", "s_server", *args, *OPENSSL[mode], "-quiet", "-naccept", "1"],
            tmp_path,
            stdin=subprocess.PIPE,
            stdout=sink,
        ) as proc,
    ):
        feed(proc, DOWN, close=False)
        with tls.connect_channel(connect(port), mode, KEY, IDENTITY) as channel:
            assert sha(exchange(channel, UP, len(DOWN))) == sha(DOWN)
        assert proc.wait(IO_TIMEOUT) == 0
    assert sha(out.read_bytes()) == sha(UP)


def openssl_s_client_to_our_server(mode: str, psk: list[str], tmp_path: Path) -> None:
    """Both directions with ``openssl s_client``, its key given by ``psk``."""
    out = tmp_path / "received"
    with socket.create_server(("127.0.0.1", 0)) as listener, out.open("wb") as sink:
        listener.settimeout(IO_TIMEOUT)
        address = f"127.0.0.1:{listener.getsockname()[1]}"
        args = ["-connect", address, *psk, "-psk_identity", IDENTITY, "-quiet", "-nocommands"]
        with peer(["openssl", "s_client", *args, *OPENSSL[mode]], tmp_path, stdin=subprocess.PIPE, stdout=sink) as proc:
            feed(proc, UP, close=False)
            sock, _ = listener.accept()
            sock.settimeout(IO_TIMEOUT)
            with tls.accept_channel(sock, mode, {IDENTITY: KEY}.get) as channel:
                assert channel.identity == IDENTITY
                assert sha(exchange(channel, DOWN, len(UP))) == sha(UP)
            assert proc.wait(IO_TIMEOUT) == 0
    assert sha(out.read_bytes()) == sha(DOWN)


def sendstream_send_to_openssl_s_server(mode: str, psk: list[str], no_status: bool, tmp_path: Path) -> None:
    """`sendstream send --no-status` delivers to a peer that is not sendstream; without it the sender cannot
    call the stream stored: that peer sends no status."""
    port = free_port()
    args = ["-accept", str(port), *psk, "-psk_identity", IDENTITY, "-nocert", "-num_tickets", "0"]
    out, key = tmp_path / "received", write_key(tmp_path / "cli.key", KEY)
    send = ["--to", f"127.0.0.1:{port}", str(SAMPLE), "--tls", mode, "--key", str(key), "--identity", IDENTITY]
    with (
        out.open("wb") as sink,
        peer(
            ["openssl", "s_server", *args, *OPENSSL[mode], "-quiet", "-naccept", "1"],
            tmp_path,
            stdin=subprocess.PIPE,
            stdout=sink,
        ) as proc,
    ):
        wait_listening(port)  # a probe connection would count as its one accept
        sent = subprocess.run(
            [sys.executable, "-m", "sendstream", "send", *send, *(["--no-status"] if no_status else [])],
            capture_output=True,
            timeout=60,
        )
        assert proc.wait(IO_TIMEOUT) == 0
    assert sha(out.read_bytes()) == sha(SAMPLE.read_bytes())
    if no_status:
        assert sent.returncode == 0, sent.stderr
    else:
        assert sent.returncode == 4 and b"the receiver sent no status" in sent.stderr, sent.stderr
