"""TLS channels: keys, every mode against real peers (OpenSSL, GnuTLS, stunnel), failures, throughput.

Peers run on 127.0.0.1 with random free ports and are always killed; every
socket handed to a channel has a timeout, so nothing waits for ever. On a
kernel with kTLS the same tests run through it (and check that they do);
``SENDSTREAM_TLS_BENCH_MB`` sizes the throughput run (256 MiB by default;
keep it small in a slow VM).
"""

from __future__ import annotations

import base64
import contextlib
import os
import random
import socket
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from support.net import free_port
from support.tls import (
    DOWN,
    IDENTITY,
    IO_TIMEOUT,
    KEY,
    OPENSSL,
    UP,
    connect,
    exchange,
    feed,
    in_thread,
    kernel_tls,
    openssl_s_client_to_our_server,
    our_client_to_openssl_s_server,
    our_pair,
    peer,
    sendstream_send_to_openssl_s_server,
    sha,
    tcp_pair,
    write_key,
)

from sendstream.errors import HandshakeError, KeyFileError, TlsError, TruncationError, UsageError
from sendstream.transport import tls
from sendstream.transport.tls.kernel import TlsChannel

TLS_MODES = [m for m in tls.MODES if m != "none"]
BENCH_MB = int(os.environ.get("SENDSTREAM_TLS_BENCH_MB", "256"))

GNUTLS_MISSING = tls.why_unavailable("tls12-aes128-gcm")
needs_gnutls = pytest.mark.skipif(GNUTLS_MISSING is not None, reason=f"no usable libgnutls.so.30: {GNUTLS_MISSING}")

# What the peers are told, per mode: written out here, not taken from the module under test.
PRIORITY = {
    "tls12-aes128-gcm": "NORMAL:-VERS-ALL:+VERS-TLS1.2:-KX-ALL:+PSK:-CIPHER-ALL:+AES-128-GCM",
    "tls12-aes256-gcm": "NORMAL:-VERS-ALL:+VERS-TLS1.2:-KX-ALL:+PSK:-CIPHER-ALL:+AES-256-GCM",
    "tls13-aes128-gcm": "NORMAL:-VERS-ALL:+VERS-TLS1.3:-KX-ALL:+ECDHE-PSK:+PSK:-CIPHER-ALL:+AES-128-GCM",
    "tls13-aes256-gcm": "NORMAL:-VERS-ALL:+VERS-TLS1.3:-KX-ALL:+ECDHE-PSK:+PSK:-CIPHER-ALL:+AES-256-GCM",
}
STUNNEL = {
    "tls12-aes128-gcm": ("TLSv1.2", "ciphers = PSK-AES128-GCM-SHA256"),
    "tls12-aes256-gcm": ("TLSv1.2", "ciphers = PSK-AES256-GCM-SHA384"),
    "tls13-aes128-gcm": ("TLSv1.3", "ciphersuites = TLS_AES_128_GCM_SHA256"),
    "tls13-aes256-gcm": ("TLSv1.3", "ciphersuites = TLS_AES_256_GCM_SHA384"),
}
SHA256_PSK_ONLY = (
    "TLS 1.3 with AES-256-GCM needs a SHA-384 external PSK: OpenSSL's -psk (and so stunnel) and GnuTLS 3.7.9 "
    "bind external PSKs to SHA-256; tests/system/test_tls_openssl.py runs this mode against openssl -psk_session"
)


# --- helpers ------------------------------------------------------------------------------------------------------


def skip_unavailable(mode: str) -> None:
    reason = tls.why_unavailable(mode)
    if reason:
        pytest.skip(reason)


def skip_sha384_psk(mode: str) -> None:
    if mode == "tls13-aes256-gcm":
        pytest.skip(SHA256_PSK_ONLY)


# --- keys ---------------------------------------------------------------------------------------------------------


def test_raw_key_is_the_file_exactly(tmp_path: Path) -> None:
    assert tls.load_key(write_key(tmp_path / "k", KEY)) == KEY
    assert tls.load_key(write_key(tmp_path / "nl", b"secret\n")) == b"secret\n"  # no newline stripped


def test_pem_key_is_its_base64_body(tmp_path: Path) -> None:
    body = base64.encodebytes(KEY).decode()
    pem = f"# a comment\n-----BEGIN SENDSTREAM PSK-----\n{body}-----END SENDSTREAM PSK-----\n"
    assert tls.load_key(write_key(tmp_path / "k.pem", pem.encode())) == KEY


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o601])
def test_key_open_to_group_or_others_is_refused(tmp_path: Path, mode: int) -> None:
    path = write_key(tmp_path / "k", KEY, mode)
    with pytest.raises(KeyFileError, match=f"accessible by group or others \\(mode 0{mode:o}\\).*chmod 600"):
        tls.load_key(path)


def test_bad_key_files(tmp_path: Path) -> None:
    with pytest.raises(KeyFileError, match="cannot read key file"):
        tls.load_key(tmp_path / "missing")
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.raises(KeyFileError, match="cannot read key file"):
        tls.load_key(tmp_path / "dir")
    with pytest.raises(KeyFileError, match="holds no key"):
        tls.load_key(write_key(tmp_path / "empty", b""))
    bad = b"-----BEGIN X-----\nnot*base64\n-----END X-----\n"
    with pytest.raises(KeyFileError, match="bad base64"):
        tls.load_key(write_key(tmp_path / "bad.pem", bad))
    assert issubclass(KeyFileError, TlsError)
    assert KeyFileError("x").exit_code == 6


def test_derive_key_is_deterministic() -> None:
    key = tls.derive_key("correct horse", "alice")
    assert len(key) == 32
    assert key == tls.derive_key("correct horse", b"sendstream-psk:alice")
    assert key != tls.derive_key("correct horse", "bob")
    assert key != tls.derive_key("correct horsf", "alice")
    with pytest.raises(UsageError):
        tls.derive_key("", "alice")


# --- our client and our server ------------------------------------------------------------------------------------


@needs_gnutls
@pytest.mark.parametrize("mode", tls.MODES)
def test_our_client_and_server(mode: str, capsys: pytest.CaptureFixture[str]) -> None:
    """Both directions at once, a half-close each way, then BENCH_MB one way for the throughput."""
    skip_unavailable(mode)
    client, server = our_pair(mode)
    with client, server:
        if mode == "none":
            assert client.tx_path == client.rx_path == "plain"
        else:
            assert server.identity == client.identity == IDENTITY
            ktls = kernel_tls() and os.environ.get("SENDSTREAM_NO_KTLS", "") in ("", "0")
            kernel = "kernel" if ktls else "userspace"
            assert client.describe().startswith(f"{mode}, TX {kernel}, RX {kernel}"), client.describe()
            assert (client.tx_path, client.rx_path, server.tx_path, server.rx_path) == (kernel,) * 4
        back = in_thread(lambda: exchange(server, DOWN, len(UP)))
        assert sha(exchange(client, UP, len(DOWN))) == sha(DOWN)
        assert sha(back()) == sha(UP)  # type: ignore[arg-type]
        assert client.recv_into(bytearray(10)) == 0  # the end stays clean
        with pytest.raises(UsageError):
            client.send_all(b"x")

    client, server = our_pair(mode)
    with client, server:
        total = BENCH_MB << 20
        chunk = memoryview(random.Random(3).randbytes(256 << 10))

        def receive() -> int:
            buf, n = memoryview(bytearray(256 << 10)), 0
            while got := server.recv_into(buf):
                n += got
            return n

        receiver = in_thread(receive)
        start = time.perf_counter()
        for _ in range(total // len(chunk)):
            client.send_all(chunk)
        client.shutdown_write()
        assert receiver() == total
        seconds = time.perf_counter() - start
    with capsys.disabled():
        print(f"\n  {client.describe()}: {BENCH_MB} MiB in {seconds:.2f} s, {total / seconds / 1e6:.0f} MB/s")


@needs_gnutls
@pytest.mark.parametrize("mode", tls.MODES)
def test_sendfile(mode: str, tmp_path: Path) -> None:
    skip_unavailable(mode)
    path = tmp_path / "data"
    path.write_bytes(UP)
    client, server = our_pair(mode)
    with client, server, path.open("rb") as f:
        receiver = in_thread(lambda: exchange(server, b"", (1 << 20) + 10))
        assert client.sendfile(f.fileno(), 1000, 1 << 20) == 1 << 20
        assert client.sendfile(f.fileno(), len(UP) - 10, 100) == 10  # the file ends first
        client.shutdown_write()
        assert sha(receiver()) == sha(UP[1000 : 1000 + (1 << 20)] + UP[-10:])  # type: ignore[arg-type]


@needs_gnutls
def test_ktls_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENDSTREAM_NO_KTLS", "1")
    client, server = our_pair("tls13-aes128-gcm")
    with client, server:
        assert client.describe() == "tls13-aes128-gcm, TX userspace, RX userspace (kTLS off)"


@needs_gnutls
@pytest.mark.skipif(not kernel_tls(), reason="this kernel has no kTLS (CONFIG_TLS): TCP_ULP tls fails")
@pytest.mark.parametrize("mode", TLS_MODES)
def test_kernel_records_talk_to_userspace_records(mode: str) -> None:
    """Client in the kernel both ways, server in GnuTLS: each side reads what the other's path wrote."""
    skip_unavailable(mode)
    c, s = tcp_pair()
    server = in_thread(lambda: tls.accept_channel(s, mode, KEY, ktls=False))
    client = tls.connect_channel(c, mode, KEY, IDENTITY, ktls=True)
    accepted = server()
    assert isinstance(accepted, tls.Channel)
    with client, accepted:
        assert (client.tx_path, client.rx_path, accepted.tx_path) == ("kernel", "kernel", "userspace")
        back = in_thread(lambda: exchange(accepted, DOWN, len(UP)))
        assert sha(exchange(client, UP, len(DOWN))) == sha(DOWN)
        assert sha(back()) == sha(UP)  # type: ignore[arg-type]


@needs_gnutls
@pytest.mark.parametrize("mode", TLS_MODES)
def test_crypto_info_drives_records_as_the_kernel_would(mode: str) -> None:
    """The crypto_info structs, used the way the kernel uses them, talk to GnuTLS: TX records, close_notify, RX."""
    skip_unavailable(mode)
    aead = pytest.importorskip("cryptography.hazmat.primitives.ciphers.aead")
    client, server = our_pair(mode, ktls=False)
    assert isinstance(client, TlsChannel)
    tls13 = mode.startswith("tls13")
    size = 16 if "aes128" in mode else 32
    layout = struct.Struct(f"=HH8s{size}s4s8s")

    def unpack(info: bytes) -> tuple[object, bytes, bytes, int]:
        version, cipher, iv, key, salt, seq = layout.unpack(info)
        assert version == (0x0304 if tls13 else 0x0303)
        assert cipher == (51 if size == 16 else 52)
        return aead.AESGCM(key), salt, iv, int.from_bytes(seq, "big")

    def nonce(salt: bytes, iv: bytes, seq: int) -> bytes:
        if tls13:
            return bytes(a ^ b for a, b in zip(salt + iv, bytes(4) + seq.to_bytes(8, "big"), strict=True))
        return salt + iv

    gcm, salt, iv, seq = unpack(client._crypto_info(read=False))
    if not tls13:  # GnuTLS used the sequence numbers as explicit nonces so far: going on from there never repeats one
        assert iv == seq.to_bytes(8, "big")
    wire = bytearray()
    for i, (kind, payload) in enumerate([(23, b"from the kernel " * 1000), (21, b"\x01\x00")]):
        if tls13:
            header = struct.pack(">BHH", 23, 0x0303, len(payload) + 1 + 16)
            wire += header + gcm.encrypt(nonce(salt, iv, seq + i), payload + bytes([kind]), header)  # type: ignore[attr-defined]
        else:  # the explicit nonce starts at "iv" and counts with the records
            explicit = (int.from_bytes(iv, "big") + i).to_bytes(8, "big")
            aad = (seq + i).to_bytes(8, "big") + struct.pack(">BHH", kind, 0x0303, len(payload))
            sealed = gcm.encrypt(salt + explicit, payload, aad)  # type: ignore[attr-defined]
            wire += struct.pack(">BHH", kind, 0x0303, 8 + len(sealed)) + explicit + sealed
    client._sock.settimeout(IO_TIMEOUT)
    client._sock.sendall(wire)
    buf = memoryview(bytearray(1 << 16))
    got = bytearray()
    while n := server.recv_into(buf):
        got += buf[:n]
    assert got == b"from the kernel " * 1000  # and close_notify ended it cleanly

    gcm, salt, iv, seq = unpack(client._crypto_info(read=True))
    server.send_all(b"from GnuTLS")
    header = client._sock.recv(5, socket.MSG_WAITALL)
    kind, _, length = struct.unpack(">BHH", header)
    body = client._sock.recv(length, socket.MSG_WAITALL)
    if tls13:
        inner = gcm.decrypt(nonce(salt, iv, seq), body, header).rstrip(b"\0")  # type: ignore[attr-defined]
        assert (kind, inner[-1], inner[:-1]) == (23, 23, b"from GnuTLS")
    else:
        aad = seq.to_bytes(8, "big") + struct.pack(">BHH", 23, 0x0303, length - 8 - 16)
        assert gcm.decrypt(salt + body[:8], body[8:], aad) == b"from GnuTLS"  # type: ignore[attr-defined]
    client.close()
    server.close()


# --- real peers ---------------------------------------------------------------------------------------------------


@needs_gnutls
@pytest.mark.parametrize("mode", TLS_MODES)
def test_our_client_to_openssl_s_server(mode: str, tmp_path: Path) -> None:
    skip_sha384_psk(mode)
    our_client_to_openssl_s_server(mode, ["-psk", KEY.hex()], tmp_path)


@needs_gnutls
@pytest.mark.parametrize("mode", TLS_MODES)
def test_openssl_s_client_to_our_server(mode: str, tmp_path: Path) -> None:
    skip_sha384_psk(mode)
    openssl_s_client_to_our_server(mode, ["-psk", KEY.hex()], tmp_path)


@needs_gnutls
@pytest.mark.parametrize("no_status", [True, False], ids=["no-status", "expects-status"])
@pytest.mark.parametrize("mode", TLS_MODES)
def test_sendstream_send_to_openssl_s_server(mode: str, no_status: bool, tmp_path: Path) -> None:
    skip_sha384_psk(mode)
    sendstream_send_to_openssl_s_server(mode, ["-psk", KEY.hex()], no_status, tmp_path)


@needs_gnutls
@pytest.mark.parametrize("mode", TLS_MODES)
def test_our_client_to_gnutls_serv(mode: str, tmp_path: Path) -> None:
    """gnutls-serv echoes text, one record at a time: base64 lines, in lockstep."""
    skip_sha384_psk(mode)
    port = free_port()
    passwd = tmp_path / "psk.passwd"
    passwd.write_text(f"{IDENTITY}:{KEY.hex()}\n")
    text = base64.b64encode(UP)
    lines = [text[i : i + 16383] + b"\n" for i in range(0, len(text), 16383)]
    args = ["--echo", "--crlf", "-q", "-p", str(port), "--pskpasswd", str(passwd), "--priority", PRIORITY[mode]]
    with (
        peer(["gnutls-serv", *args], tmp_path, stdout=subprocess.DEVNULL),
        tls.connect_channel(connect(port), mode, KEY, IDENTITY) as channel,
    ):
        buf = memoryview(bytearray(1 << 16))
        echoed = bytearray()
        for line in lines:
            channel.send_all(line)
            end = len(echoed) + len(line)
            while len(echoed) < end:
                n = channel.recv_into(buf)
                assert n, "gnutls-serv ended early"
                echoed += buf[:n]
        channel.shutdown_write()
        assert channel.recv_into(buf) == 0
    assert sha(echoed) == sha(b"".join(lines))


@needs_gnutls
@pytest.mark.parametrize("mode", TLS_MODES)
def test_gnutls_cli_to_our_server(mode: str, tmp_path: Path) -> None:
    """gnutls-cli sends close_notify at the end of its input, and leaves without one when it gets ours."""
    skip_sha384_psk(mode)
    out = tmp_path / "received"
    with socket.create_server(("127.0.0.1", 0)) as listener, out.open("wb") as sink:
        listener.settimeout(IO_TIMEOUT)
        args = ["--pskusername", IDENTITY, "--pskkey", KEY.hex(), "--priority", PRIORITY[mode]]
        args += ["--logfile", str(tmp_path / "cli.log"), "-p", str(listener.getsockname()[1]), "127.0.0.1"]
        with peer(["gnutls-cli", *args], tmp_path, stdin=subprocess.PIPE, stdout=sink) as proc:
            feed(proc, UP, close=True)
            sock, _ = listener.accept()
            sock.settimeout(IO_TIMEOUT)
            with tls.accept_channel(sock, mode, KEY) as channel:
                assert sha(exchange(channel, DOWN, None)) == sha(UP)
            assert proc.wait(IO_TIMEOUT) == 0
    assert sha(out.read_bytes()) == sha(DOWN)


def send_and_half_close(sock: socket.socket, data: bytes) -> None:
    sock.sendall(data)
    sock.shutdown(socket.SHUT_WR)


def stunnel_config(tmp_path: Path, mode: str, service: str) -> Path:
    secrets = write_key(tmp_path / "psk.secrets", f"{IDENTITY}:{KEY.hex()}\n".encode())
    version, ciphers = STUNNEL[mode]
    conf = tmp_path / "stunnel.conf"
    conf.write_text(
        "foreground = yes\npid =\n[sendstream]\n"
        f"{service}\nPSKsecrets = {secrets}\nsslVersionMin = {version}\nsslVersionMax = {version}\n{ciphers}\n"
    )
    return conf


@needs_gnutls
@pytest.mark.parametrize("mode", TLS_MODES)
def test_our_client_to_stunnel_server(mode: str, tmp_path: Path) -> None:
    """Our client -> stunnel (TLS server) -> a plain TCP sink, which also sends back."""
    skip_sha384_psk(mode)
    port = free_port()
    with socket.create_server(("127.0.0.1", 0)) as sink:
        sink.settimeout(IO_TIMEOUT)
        service = f"accept = 127.0.0.1:{port}\nconnect = 127.0.0.1:{sink.getsockname()[1]}"

        def plain_end() -> bytes:
            conn, _ = sink.accept()
            with conn:
                conn.settimeout(IO_TIMEOUT)
                writer = in_thread(lambda: send_and_half_close(conn, DOWN))
                got = b"".join(iter(lambda: conn.recv(1 << 18), b""))
                writer()
                return got

        with peer(["stunnel", str(stunnel_config(tmp_path, mode, service))], tmp_path, stdout=subprocess.DEVNULL):
            plain = in_thread(plain_end)
            with tls.connect_channel(connect(port), mode, KEY, IDENTITY) as channel:
                assert sha(exchange(channel, UP, len(DOWN))) == sha(DOWN)
            assert sha(plain()) == sha(UP)  # type: ignore[arg-type]


@needs_gnutls
@pytest.mark.parametrize("mode", TLS_MODES)
def test_stunnel_client_to_our_server(mode: str, tmp_path: Path) -> None:
    """A plain TCP client -> stunnel (TLS client) -> our server."""
    skip_sha384_psk(mode)
    port = free_port()
    with socket.create_server(("127.0.0.1", 0)) as listener:
        listener.settimeout(IO_TIMEOUT)
        service = f"client = yes\naccept = 127.0.0.1:{port}\nconnect = 127.0.0.1:{listener.getsockname()[1]}"
        service += f"\nPSKidentity = {IDENTITY}"

        def plain_end() -> bytes:
            with connect(port) as conn:
                writer = in_thread(lambda: send_and_half_close(conn, UP))
                got = b"".join(iter(lambda: conn.recv(1 << 18), b""))
                writer()
                return got

        with peer(["stunnel", str(stunnel_config(tmp_path, mode, service))], tmp_path, stdout=subprocess.DEVNULL):
            plain = in_thread(plain_end)
            sock, _ = listener.accept()
            sock.settimeout(IO_TIMEOUT)
            with tls.accept_channel(sock, mode, {IDENTITY: KEY}.get) as channel:
                assert sha(exchange(channel, DOWN, len(UP))) == sha(UP)
            assert sha(plain()) == sha(DOWN)  # type: ignore[arg-type]


# --- failures -----------------------------------------------------------------------------------------------------


@needs_gnutls
@pytest.mark.parametrize("mode", ["tls12-aes128-gcm", "tls13-aes128-gcm"])
def test_wrong_key(mode: str) -> None:
    with pytest.raises(
        HandshakeError,
        match=r"TLS handshake failed: wrong key or identity \(local fingerprint sha256:[0-9a-f]{16}, identity ",
    ) as client:
        our_pair(mode, key=bytes(32))
    assert client.value.exit_code == 6


@needs_gnutls
def test_unknown_identity_and_failing_lookup() -> None:
    with pytest.raises(HandshakeError, match="wrong key or identity"):
        our_pair("tls13-aes128-gcm", keys={"someone else": KEY}.get)
    c, s = tcp_pair()
    server = in_thread(lambda: tls.accept_channel(s, "tls13-aes128-gcm", {"someone else": KEY}.get))
    with pytest.raises(HandshakeError):
        tls.connect_channel(c, "tls13-aes128-gcm", KEY, IDENTITY)
    with pytest.raises(HandshakeError, match=f"unknown PSK identity '{IDENTITY}'"):
        server()

    def broken(identity: str) -> bytes:
        raise LookupError("key store offline")

    c, s = tcp_pair()
    server = in_thread(lambda: tls.accept_channel(s, "tls12-aes128-gcm", broken))
    with pytest.raises(HandshakeError):
        tls.connect_channel(c, "tls12-aes128-gcm", KEY, IDENTITY)
    with pytest.raises(LookupError, match="key store offline"):
        server()


@needs_gnutls
@pytest.mark.parametrize("mode", ["tls12-aes128-gcm", "tls13-aes128-gcm"])
def test_wrong_key_with_openssl(mode: str, tmp_path: Path) -> None:
    port = free_port()
    args = ["-accept", str(port), "-psk", bytes(32).hex(), "-psk_identity", IDENTITY, "-nocert", "-num_tickets", "0"]
    with (
        peer(["openssl", "s_server", *args, *OPENSSL[mode], "-quiet"], tmp_path, stdin=subprocess.PIPE),
        pytest.raises(
            HandshakeError,
            match=r"TLS handshake failed: wrong key or identity \(local fingerprint sha256:[0-9a-f]{16}, identity ",
        ),
    ):
        tls.connect_channel(connect(port), mode, KEY, IDENTITY)


@needs_gnutls
@pytest.mark.parametrize(
    ("client", "server"),
    [("tls12-aes128-gcm", "tls13-aes128-gcm"), ("tls13-aes128-gcm", "tls12-aes128-gcm")],
)
def test_mismatched_modes(client: str, server: str, tmp_path: Path) -> None:
    with pytest.raises(HandshakeError, match=f"does the peer use {client} too"):
        our_pair(client, server)
    port = free_port()
    args = ["-accept", str(port), "-psk", KEY.hex(), "-psk_identity", IDENTITY, "-nocert", "-num_tickets", "0"]
    with (
        peer(["openssl", "s_server", *args, *OPENSSL[server], "-quiet"], tmp_path, stdin=subprocess.PIPE),
        pytest.raises(HandshakeError, match=f"protocol version.*does the peer use {client} too"),
    ):
        tls.connect_channel(connect(port), client, KEY, IDENTITY)


def plain_server(act: Callable[[socket.socket], object]) -> tuple[socket.socket, Callable[[], object]]:
    """A connection to a plain TCP server that does ``act`` with its end."""
    client, accepted = tcp_pair()

    def serve() -> None:
        with accepted:
            act(accepted)

    return client, in_thread(serve)


@needs_gnutls
@pytest.mark.parametrize("mode", ["tls12-aes128-gcm", "tls13-aes128-gcm"])
def test_peer_not_speaking_tls(mode: str) -> None:
    sock, done = plain_server(lambda s: s.sendall(b"SSH-2.0-OpenSSH_9.2p1 Debian-2\r\n" * 20))
    with pytest.raises(HandshakeError, match=r"TLS handshake failed: .*\(does the peer speak TLS\?\)"):
        tls.connect_channel(sock, mode, KEY, IDENTITY)
    done()
    sock, done = plain_server(lambda s: None)
    with pytest.raises(HandshakeError, match=r"the peer closed the connection .*speak TLS"):
        tls.connect_channel(sock, mode, KEY, IDENTITY)
    done()

    def read_and_wait(s: socket.socket) -> None:
        s.recv(1000)
        time.sleep(1.5)

    sock, done = plain_server(read_and_wait)
    with pytest.raises(HandshakeError, match=r"timed out after 0.5 s \(does the peer speak TLS\?\)"):
        tls.connect_channel(sock, mode, KEY, IDENTITY, handshake_timeout=0.5)
    done()
    assert sock.fileno() == -1  # the channel closed the socket it was given

    client, accepted = tcp_pair()
    client.sendall(b"GET / HTTP/1.1\r\nHost: sendstream\r\n\r\n")
    with client, pytest.raises(HandshakeError, match="does the peer speak TLS"):
        tls.accept_channel(accepted, mode, KEY)


@needs_gnutls
@pytest.mark.parametrize("mode", ["tls12-aes128-gcm", "tls13-aes128-gcm", "tls13-aes256-gcm"])
def test_truncation(mode: str) -> None:
    """The peer's TCP ends after data but without close_notify: the data arrives, then TruncationError."""
    c, s = tcp_pair()
    raw = s.dup()
    server = in_thread(lambda: tls.accept_channel(s, mode, KEY))
    with tls.connect_channel(c, mode, KEY, IDENTITY) as client, raw:
        accepted = server()
        assert isinstance(accepted, tls.Channel)
        accepted.send_all(DOWN[:100000])
        raw.shutdown(socket.SHUT_WR)  # a FIN, and no close_notify before it
        got = bytearray()
        buf = memoryview(bytearray(1 << 16))
        with pytest.raises(TruncationError, match="without a TLS close_notify") as error:
            while n := client.recv_into(buf):
                got += buf[:n]
        with contextlib.suppress(OSError):
            accepted.close()
        assert got == DOWN[:100000]
        assert error.value.exit_code == 6
        with pytest.raises(TruncationError):
            client.recv_into(buf)  # it stays failed


@needs_gnutls
@pytest.mark.parametrize("mode", ["tls12-aes128-gcm", "tls13-aes128-gcm", "tls13-aes256-gcm"])
def test_failed_send_is_not_ended_cleanly(mode: str) -> None:
    """A send that times out half-way: no close_notify follows, so the peer cannot take the data as complete."""
    c, s = tcp_pair()
    c.settimeout(0.3)  # the channel's I/O timeout
    server = in_thread(lambda: tls.accept_channel(s, mode, KEY))
    client = tls.connect_channel(c, mode, KEY, IDENTITY)
    accepted = server()
    assert isinstance(accepted, tls.Channel)
    with accepted:
        with pytest.raises(TimeoutError, match=r"timed out after 0\.3 s waiting to send"):
            client.send_all(bytes(64 << 20))  # nobody reads yet
        with pytest.raises(UsageError, match="after a failed send"):
            client.send_all(b"more")
        client.close()
        buf = memoryview(bytearray(1 << 20))
        with pytest.raises(TruncationError):
            while accepted.recv_into(buf):
                pass


@needs_gnutls
def test_misuse() -> None:
    c, s = tcp_pair()
    with c, s:
        with pytest.raises(UsageError, match="unknown TLS mode 'tls14'"):
            tls.connect_channel(c, "tls14", KEY, IDENTITY)
        with pytest.raises(UsageError, match="needs a key"):
            tls.connect_channel(c, "tls13-aes128-gcm", None, IDENTITY)
        with pytest.raises(UsageError, match="needs a key"):
            tls.accept_channel(s, "tls13-aes128-gcm", None)
        with pytest.raises(UsageError, match="PSK identity"):
            tls.connect_channel(c, "tls13-aes128-gcm", KEY, "")
