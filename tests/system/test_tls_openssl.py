"""``tls13-aes256-gcm`` through OpenSSL: our ends, ``openssl s_server``/``s_client -psk_session``, failures.

The channel tests of tests/system/test_tls.py (both directions, sendfile, the
kernel's crypto_info against user-space records, truncation, a failed send)
run this mode too; here is what is particular to it. gnutls-cli/gnutls-serv 3.7.9 and stunnel (OpenSSL's
legacy PSK callbacks, which TLS 1.3 binds to SHA-256) cannot make a SHA-384
external PSK: tests/system/test_tls.py skips them in this mode with that reason.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import cffi  # type: ignore[import-untyped]
import pytest
from support.net import CMD, free_port, sender, transfer
from support.streams import SAMPLE
from support.tls import (
    DOWN,
    IDENTITY,
    KEY,
    OPENSSL,
    UP,
    connect,
    exchange,
    in_thread,
    kernel_tls,
    openssl_s_client_to_our_server,
    our_client_to_openssl_s_server,
    our_pair,
    peer,
    sendstream_send_to_openssl_s_server,
    sha,
    tcp_pair,
)

from sendstream.errors import HandshakeError, TlsError
from sendstream.transport import tls
from sendstream.transport.tls import openssl

MODE = "tls13-aes256-gcm"
pytestmark = pytest.mark.skipif(tls.why_unavailable(MODE) is not None, reason=f"{tls.why_unavailable(MODE)}")

# A PEM SSL_SESSION for openssl's -psk_session, written by libssl itself (not by the module under test).
_SESSION_CDEF = """
typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_method_st SSL_METHOD;
typedef struct ssl_session_st SSL_SESSION;
typedef struct ssl_cipher_st SSL_CIPHER;
typedef struct bio_st BIO;
const SSL_METHOD *TLS_method(void);
SSL_CTX *SSL_CTX_new(const SSL_METHOD *method);
void SSL_CTX_free(SSL_CTX *ctx);
SSL *SSL_new(SSL_CTX *ctx);
void SSL_free(SSL *ssl);
const SSL_CIPHER *SSL_CIPHER_find(SSL *ssl, const unsigned char *ptr);
SSL_SESSION *SSL_SESSION_new(void);
void SSL_SESSION_free(SSL_SESSION *session);
int SSL_SESSION_set1_master_key(SSL_SESSION *session, const unsigned char *in, size_t len);
int SSL_SESSION_set_cipher(SSL_SESSION *session, const SSL_CIPHER *cipher);
int SSL_SESSION_set_protocol_version(SSL_SESSION *session, int version);
BIO *BIO_new_file(const char *filename, const char *mode);
int BIO_free(BIO *bio);
int PEM_write_bio_SSL_SESSION(BIO *bio, const SSL_SESSION *session);
"""


def psk_session(path: Path, psk: bytes) -> Path:
    """``path`` holding an SSL_SESSION: TLS 1.3, TLS_AES_256_GCM_SHA384, master key ``psk``."""
    ffi = cffi.FFI()
    ffi.cdef(_SESSION_CDEF)
    lib = ffi.dlopen("libssl.so.3")
    ctx = lib.SSL_CTX_new(lib.TLS_method())
    ssl = lib.SSL_new(ctx)
    session = lib.SSL_SESSION_new()
    bio = lib.BIO_new_file(str(path).encode(), b"w")
    try:
        assert lib.SSL_SESSION_set1_master_key(session, psk, len(psk)) == 1
        assert lib.SSL_SESSION_set_cipher(session, lib.SSL_CIPHER_find(ssl, b"\x13\x02")) == 1
        assert lib.SSL_SESSION_set_protocol_version(session, 0x0304) == 1
        assert lib.PEM_write_bio_SSL_SESSION(bio, session) == 1
    finally:
        lib.BIO_free(bio)
        lib.SSL_SESSION_free(session)
        lib.SSL_free(ssl)
        lib.SSL_CTX_free(ctx)
    assert path.read_text().startswith("-----BEGIN SSL SESSION PARAMETERS-----")
    return path


def expected_path() -> str:
    return "kernel" if kernel_tls() else "userspace"


def test_our_send_to_our_receive(key: Path, tmp_path: Path) -> None:
    out = tmp_path / "out.stream"
    sent, (code, err) = transfer(MODE, key, out, SAMPLE.read_bytes())
    assert sent.returncode == 0, sent.stderr
    assert code == 0, err
    assert out.read_bytes() == SAMPLE.read_bytes()
    paths = f"{MODE}, TX {expected_path()}, RX {expected_path()}"
    assert paths.encode() in sent.stderr and paths.encode() in err, (sent.stderr, err)


def test_channel_uses_openssl() -> None:
    client, server = our_pair(MODE)
    with client, server:
        assert isinstance(client, openssl.OpenSslChannel) and isinstance(server, openssl.OpenSslChannel)
        assert server.identity == IDENTITY
        assert (client.tx_path, client.rx_path, server.tx_path, server.rx_path) == (expected_path(),) * 4


def test_ktls_can_be_switched_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SENDSTREAM_NO_KTLS", "1")
    client, server = our_pair(MODE)
    with client, server:
        assert client.describe() == f"{MODE}, TX userspace, RX userspace (kTLS off)"
        back = in_thread(lambda: exchange(server, DOWN, len(UP)))
        assert sha(exchange(client, UP, len(DOWN))) == sha(DOWN)
        assert sha(back()) == sha(UP)  # type: ignore[arg-type]


def test_our_client_to_openssl_s_server(tmp_path: Path) -> None:
    psk = ["-psk_session", str(psk_session(tmp_path / "psk.pem", KEY))]
    our_client_to_openssl_s_server(MODE, psk, tmp_path)


def test_openssl_s_client_to_our_server(tmp_path: Path) -> None:
    psk = ["-psk_session", str(psk_session(tmp_path / "psk.pem", KEY))]
    openssl_s_client_to_our_server(MODE, psk, tmp_path)


@pytest.mark.parametrize("no_status", [True, False], ids=["no-status", "expects-status"])
def test_sendstream_send_to_openssl_s_server(no_status: bool, tmp_path: Path) -> None:
    psk = ["-psk_session", str(psk_session(tmp_path / "psk.pem", KEY))]
    sendstream_send_to_openssl_s_server(MODE, psk, no_status, tmp_path)


def test_wrong_key() -> None:
    with pytest.raises(
        HandshakeError,
        match=r"TLS handshake failed: wrong key or identity, or the peer does not use tls13-aes256-gcm "
        r"\(local fingerprint sha256:",
    ) as client:
        our_pair(MODE, key=bytes(32))
    assert client.value.exit_code == 6
    c, s = tcp_pair()
    server = in_thread(lambda: tls.accept_channel(s, MODE, KEY))
    with pytest.raises(HandshakeError):
        tls.connect_channel(c, MODE, bytes(32), IDENTITY)
    with pytest.raises(
        HandshakeError, match=r"TLS handshake failed: wrong key or identity \(local fingerprint sha256:"
    ):
        server()


def test_wrong_key_with_openssl_s_server(tmp_path: Path) -> None:
    port = free_port()
    session = psk_session(tmp_path / "psk.pem", bytes(32))
    args = ["-accept", str(port), "-psk_session", str(session), "-psk_identity", IDENTITY, "-nocert", "-quiet"]
    with (
        peer(["openssl", "s_server", *args, *OPENSSL[MODE]], tmp_path, stdin=subprocess.PIPE),
        pytest.raises(
            HandshakeError,
            match=r"wrong key or identity, or the peer does not use tls13-aes256-gcm \(local fingerprint sha256:",
        ),
    ):
        tls.connect_channel(connect(port), MODE, KEY, IDENTITY)


def test_wrong_key_fails_the_sender_and_the_receiver_waits_on(key: Path, tmp_path: Path) -> None:
    other = tmp_path / "other.key"
    other.write_bytes(bytes(32))
    other.chmod(0o600)
    port = free_port()
    out = tmp_path / "o"
    tls_args = ["--tls", MODE, "-v"]
    recv = subprocess.Popen(
        [*CMD, "receive", "--listen", f"127.0.0.1:{port}", "-o", str(out), "--key", str(key), *tls_args],
        stderr=subprocess.PIPE,
    )
    try:
        wrong = sender("--to", f"127.0.0.1:{port}", str(SAMPLE), "--key", str(other), *tls_args)
        assert wrong.returncode == 6 and b"wrong key or identity" in wrong.stderr, wrong.stderr
        assert recv.poll() is None and not out.exists()
        right = sender("--to", f"127.0.0.1:{port}", str(SAMPLE), "--key", str(key), *tls_args)
        _, err = recv.communicate(timeout=60)
    finally:
        recv.kill()
    assert (right.returncode, recv.returncode) == (0, 0), (right.stderr, err)
    assert b"refused: TLS handshake failed" in err and b"wrong key or identity" in err, err
    assert out.read_bytes() == SAMPLE.read_bytes()


def test_unknown_identity_and_failing_lookup() -> None:
    c, s = tcp_pair()
    server = in_thread(lambda: tls.accept_channel(s, MODE, {"someone else": KEY}.get))
    with pytest.raises(HandshakeError, match="unknown identity"):
        tls.connect_channel(c, MODE, KEY, IDENTITY)
    with pytest.raises(HandshakeError, match=f"unknown PSK identity '{IDENTITY}'"):
        server()

    def broken(identity: str) -> bytes:
        raise LookupError("key store offline")

    c, s = tcp_pair()
    server = in_thread(lambda: tls.accept_channel(s, MODE, broken))
    with pytest.raises(HandshakeError):
        tls.connect_channel(c, MODE, KEY, IDENTITY)
    with pytest.raises(LookupError, match="key store offline"):
        server()


def test_key_longer_than_openssl_takes() -> None:
    c, s = tcp_pair()
    with s, pytest.raises(TlsError, match="at most 512 bytes; this one has 513"):
        tls.connect_channel(c, MODE, bytes(513), IDENTITY)
    client, server = our_pair(MODE, key=bytes(512), keys=bytes(512))
    client.close()
    server.close()


@pytest.mark.parametrize(("client", "server"), [(MODE, "tls13-aes128-gcm"), ("tls13-aes128-gcm", MODE)])
def test_against_tls13_aes128(client: str, server: str) -> None:
    """The SHA-256 mode and this one: a clear error naming the mode on our side of each."""
    c, s = tcp_pair()
    accepted = in_thread(lambda: tls.accept_channel(s, server, KEY))
    with pytest.raises(HandshakeError, match=f"(does the peer not use|or the peer does not use) {client}"):
        tls.connect_channel(c, client, KEY, IDENTITY)
    if server == MODE:
        with pytest.raises(HandshakeError, match=f"no shared cipher \\(does the peer use {MODE} too\\?\\)"):
            accepted()
    else:
        with pytest.raises(HandshakeError):
            accepted()


def test_peer_not_speaking_tls() -> None:
    client, accepted = tcp_pair()
    client.sendall(b"GET / HTTP/1.1\r\nHost: sendstream\r\n\r\n")
    with client, pytest.raises(HandshakeError, match=r"http request \(does the peer speak TLS\?\)"):
        tls.accept_channel(accepted, MODE, KEY)
    client, accepted = tcp_pair()
    with accepted, pytest.raises(HandshakeError, match=r"timed out after 0.5 s \(does the peer speak TLS\?\)"):
        tls.connect_channel(client, MODE, KEY, IDENTITY, handshake_timeout=0.5)
    assert client.fileno() == -1  # the channel closed the socket it was given


def test_libssl_missing_is_a_clear_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_library(self: object, name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(openssl._openssl, "_loaded", None)
    monkeypatch.setattr(cffi.FFI, "dlopen", no_library)
    reason = tls.why_unavailable(MODE)
    assert reason is not None
    assert "tls13-aes256-gcm needs OpenSSL, since GnuTLS 3.7 lacks SHA-384 PSK binders" in reason
    assert "cannot load OpenSSL's libssl.so.3" in reason and "install libssl3" in reason
    c, s = tcp_pair()
    with c, s, pytest.raises(TlsError, match="needs OpenSSL"):
        tls.connect_channel(c, MODE, KEY, IDENTITY)
