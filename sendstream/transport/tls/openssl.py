"""``tls13-aes256-gcm`` through OpenSSL: TLS 1.3, TLS_AES_256_GCM_SHA384, an external PSK bound to SHA-384.

GnuTLS 3.7 binds external PSKs to SHA-256 only, and this suite needs
SHA-384 binders. OpenSSL 3.0 (``libssl.so.3``, through a small cffi binding
in ABI mode, like GnuTLS in :mod:`.gnutls`) takes an external PSK as
an ``SSL_SESSION`` whose master key is the PSK and whose cipher sets the
hash: the client's ``psk_use_session`` callback and the server's
``psk_find_session`` callback hand one over. Only TLS 1.3, only that
suite, no session tickets; OpenSSL never sends a KeyUpdate on its own.

kTLS: Debian builds OpenSSL 3.0 with kTLS, which puts TLS 1.3 TX in the
kernel itself (``SSL_OP_ENABLE_KTLS``) but not RX (OpenSSL 3.2 does).
A direction OpenSSL left in user space is handed over here
(:meth:`TlsChannel._offload`) with keys derived from its traffic secret,
which the keylog callback reports: HKDF-Expand-Label with SHA-384, sequence
number 0, since nothing was sent under those keys yet (no tickets).
"""

from __future__ import annotations

import errno
import hashlib
import hmac
import select
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final

import cffi  # type: ignore[import-untyped]

from ...errors import HandshakeError, TlsCause, TlsError, TruncationError
from .binding import Binding
from .kernel import ALERT_CAUSES, TRUNCATED, TlsChannel
from .keys import ServerKeys

_CDEF = """
typedef struct ssl_st SSL;
typedef struct ssl_ctx_st SSL_CTX;
typedef struct ssl_method_st SSL_METHOD;
typedef struct ssl_session_st SSL_SESSION;
typedef struct ssl_cipher_st SSL_CIPHER;
typedef struct evp_md_st EVP_MD;
typedef struct bio_st BIO;
typedef int (*SSL_psk_use_session_cb_func)(SSL *ssl, const EVP_MD *md, const unsigned char **id, size_t *idlen,
                                           SSL_SESSION **sess);
typedef int (*SSL_psk_find_session_cb_func)(SSL *ssl, const unsigned char *identity, size_t identity_len,
                                            SSL_SESSION **sess);
typedef void (*SSL_CTX_keylog_cb_func)(const SSL *ssl, const char *line);

unsigned long ERR_get_error(void);
void ERR_clear_error(void);
const char *ERR_reason_error_string(unsigned long e);

const SSL_METHOD *TLS_client_method(void);
const SSL_METHOD *TLS_server_method(void);
SSL_CTX *SSL_CTX_new(const SSL_METHOD *method);
void SSL_CTX_free(SSL_CTX *ctx);
long SSL_CTX_ctrl(SSL_CTX *ctx, int cmd, long larg, void *parg);
uint64_t SSL_CTX_set_options(SSL_CTX *ctx, uint64_t options);
int SSL_CTX_set_ciphersuites(SSL_CTX *ctx, const char *str);
int SSL_CTX_set_num_tickets(SSL_CTX *ctx, size_t num_tickets);
void SSL_CTX_set_psk_use_session_callback(SSL_CTX *ctx, SSL_psk_use_session_cb_func cb);
void SSL_CTX_set_psk_find_session_callback(SSL_CTX *ctx, SSL_psk_find_session_cb_func cb);
void SSL_CTX_set_keylog_callback(SSL_CTX *ctx, SSL_CTX_keylog_cb_func cb);

SSL *SSL_new(SSL_CTX *ctx);
void SSL_free(SSL *ssl);
int SSL_set_fd(SSL *ssl, int fd);
int SSL_set_ex_data(SSL *ssl, int idx, void *data);
void *SSL_get_ex_data(const SSL *ssl, int idx);
int SSL_connect(SSL *ssl);
int SSL_accept(SSL *ssl);
int SSL_get_error(const SSL *ssl, int ret);
int SSL_version(const SSL *ssl);
const SSL_CIPHER *SSL_get_current_cipher(const SSL *ssl);
const SSL_CIPHER *SSL_CIPHER_find(SSL *ssl, const unsigned char *ptr);
const EVP_MD *SSL_CIPHER_get_handshake_digest(const SSL_CIPHER *c);
uint32_t SSL_CIPHER_get_id(const SSL_CIPHER *c);
const char *SSL_alert_desc_string_long(int value);
BIO *SSL_get_rbio(const SSL *ssl);
BIO *SSL_get_wbio(const SSL *ssl);
long BIO_ctrl(BIO *bio, int cmd, long larg, void *parg);

SSL_SESSION *SSL_SESSION_new(void);
void SSL_SESSION_free(SSL_SESSION *session);
int SSL_SESSION_set1_master_key(SSL_SESSION *session, const unsigned char *in, size_t len);
int SSL_SESSION_set_cipher(SSL_SESSION *session, const SSL_CIPHER *cipher);
int SSL_SESSION_set_protocol_version(SSL_SESSION *session, int version);

int SSL_read_ex(SSL *ssl, void *buf, size_t num, size_t *readbytes);
int SSL_write_ex(SSL *ssl, const void *buf, size_t num, size_t *written);
int SSL_has_pending(const SSL *ssl);
int SSL_shutdown(SSL *ssl);
"""

# ssl.h, tls1.h, bio.h, err.h, sslerr.h (OpenSSL 3.0)
_TLS1_3_VERSION = 0x0304
_SUITE_ID = b"\x13\x02"  # TLS_AES_256_GCM_SHA384 on the wire
_SUITE_NAME = b"TLS_AES_256_GCM_SHA384"
_CIPHER_ID = 0x03000000 | 0x1302  # SSL_CIPHER_get_id
_CTRL_MODE, _CTRL_SET_MIN_PROTO_VERSION, _CTRL_SET_MAX_PROTO_VERSION = 33, 123, 124
_MODE_ACCEPT_MOVING_WRITE_BUFFER = 0x2
_OP_ENABLE_KTLS = 1 << 3
_BIO_CTRL_GET_KTLS_SEND, _BIO_CTRL_GET_KTLS_RECV = 73, 76
_ERROR_SSL, _ERROR_WANT_READ, _ERROR_WANT_WRITE, _ERROR_SYSCALL, _ERROR_ZERO_RETURN = 1, 2, 3, 5, 6
_ERR_SYSTEM_FLAG = 1 << 31
_ERR_REASON_MASK = 0x7FFFFF
_AD_REASON_OFFSET = 1000  # reason 1000 + n: the peer sent alert n
_R_UNEXPECTED_EOF_WHILE_READING = 294
_MAX_PSK = 512  # TLS13_MAX_RESUMPTION_PSK_LENGTH: SSL_SESSION_set1_master_key takes no more
_ILLEGAL_PARAMETER = 47
_CLIENT_SECRET, _SERVER_SECRET = "CLIENT_TRAFFIC_SECRET_0", "SERVER_TRAFFIC_SECRET_0"  # keylog labels
_TRAFFIC_SECRETS = (_CLIENT_SECRET, _SERVER_SECRET)
# What a failed handshake most likely means, by OpenSSL reason code.
_CAUSES: Final = {
    253: TlsCause.KEY,  # binder does not verify: a PSK made with another key
    281: TlsCause.KEY,  # decryption failed or bad record mac
    193: TlsCause.MODE,  # no shared cipher
    # bad extension: a PSK binder of another hash (a SHA-256 PSK, as OpenSSL's -psk and GnuTLS 3.7 make)
    110: TlsCause.MODE,
    258: TlsCause.MODE,  # unsupported protocol
    102: TlsCause.MODE,  # unsupported protocol version
    267: TlsCause.NOT_TLS,  # wrong version number
    198: TlsCause.NOT_TLS,  # packet length too long
    156: TlsCause.NOT_TLS,  # http request
    244: TlsCause.NOT_TLS,  # unexpected message
    443: TlsCause.NOT_TLS,  # bad record type
}


class _OpenSSL:
    """libssl.so.3 in cffi ABI mode, loaded once on first use; the callbacks every session shares."""

    def __init__(self) -> None:
        self.ffi = ffi = cffi.FFI()
        ffi.cdef(_CDEF)
        self.lib = ffi.dlopen("libssl.so.3")
        # Each callback finds its handshake's _Psk through the SSL object's ex_data slot 0 (SSL_set_app_data).
        self.use_session = ffi.callback("SSL_psk_use_session_cb_func", self._use_session, error=0)
        self.find_session = ffi.callback("SSL_psk_find_session_cb_func", self._find_session, error=0)
        self.keylog = ffi.callback("SSL_CTX_keylog_cb_func", self._keylog)

    def _psk(self, ssl: Any) -> _Psk:
        psk: _Psk = self.ffi.from_handle(self.lib.SSL_get_ex_data(ssl, 0))
        return psk

    def _session(self, ssl: Any, key: bytes) -> Any:
        """A new SSL_SESSION holding ``key`` as a TLS 1.3 external PSK for the suite; NULL on failure."""
        lib = self.lib
        session = lib.SSL_SESSION_new()
        if session == self.ffi.NULL:
            return session
        cipher = lib.SSL_CIPHER_find(ssl, _SUITE_ID)
        if not (
            cipher != self.ffi.NULL
            and lib.SSL_SESSION_set1_master_key(session, key, len(key))
            and lib.SSL_SESSION_set_cipher(session, cipher)
            and lib.SSL_SESSION_set_protocol_version(session, _TLS1_3_VERSION)
        ):
            lib.SSL_SESSION_free(session)
            return self.ffi.NULL
        return session

    def _use_session(self, ssl: Any, md: Any, identity: Any, identity_len: Any, session: Any) -> int:
        """The client's PSK, offered when the hash fits (``md`` is NULL before a HelloRetryRequest)."""
        psk = self._psk(ssl)
        cipher = self.lib.SSL_CIPHER_find(ssl, _SUITE_ID)
        if md != self.ffi.NULL and (cipher == self.ffi.NULL or self.lib.SSL_CIPHER_get_handshake_digest(cipher) != md):
            identity[0], identity_len[0], session[0] = self.ffi.NULL, 0, self.ffi.NULL
            return 1
        assert psk.key is not None
        new = self._session(ssl, psk.key)
        if new == self.ffi.NULL:
            return 0
        identity[0] = self.ffi.cast("unsigned char *", psk.identity)
        identity_len[0], session[0] = psk.identity_len, new
        return 1

    def _find_session(self, ssl: Any, identity: Any, identity_len: int, session: Any) -> int:
        """The server's key for the client's identity; an unknown one leaves the handshake without a PSK."""
        psk = self._psk(ssl)
        assert psk.keys is not None
        raw = bytes(self.ffi.buffer(identity, identity_len))
        key = psk.keys.find(raw)
        if key is not None:
            try:
                _check_key_size(key)
            except TlsError as exc:
                psk.keys.error, key = exc, None
        if key is None:
            session[0] = self.ffi.NULL
            return 0 if psk.keys.error is not None else 1
        new = self._session(ssl, key)
        if new == self.ffi.NULL:
            return 0
        psk.found = raw
        session[0] = new
        return 1

    def _keylog(self, ssl: Any, line: Any) -> None:
        """Keep the application traffic secrets: ``LABEL CLIENT_RANDOM SECRET``, in hex."""
        label, _, rest = self.ffi.string(line).decode("ascii", "replace").partition(" ")
        if label in _TRAFFIC_SECRETS:
            self._psk(ssl).secrets[label] = bytes.fromhex(rest.rpartition(" ")[2])


class _Psk:
    """One handshake's key material, reached from the callbacks."""

    def __init__(self) -> None:
        self.key: bytes | None = None  # client
        self.identity: Any = None  # client: a cffi char array, alive as long as the channel
        self.identity_len = 0
        self.keys: ServerKeys | None = None  # server
        self.found = b""  # server: the identity whose key was used
        self.secrets: dict[str, bytes] = {}  # keylog label -> secret


_openssl = Binding(_OpenSSL, "cannot load OpenSSL's libssl.so.3 ({}); install libssl3")


def _check_key_size(key: bytes) -> None:
    if len(key) > _MAX_PSK:
        raise TlsError(f"OpenSSL takes pre-shared keys of at most {_MAX_PSK} bytes; this one has {len(key)}")


def _expand_label(secret: bytes, label: bytes, length: int) -> bytes:
    """TLS 1.3's HKDF-Expand-Label with SHA-384 and an empty context (RFC 8446, 7.1); at most 48 bytes."""
    full = b"tls13 " + label
    info = struct.pack(">HB", length, len(full)) + full + b"\0"
    return hmac.new(secret, info + b"\x01", hashlib.sha384).digest()[:length]


def _free(openssl: _OpenSSL, ctx: Any, ssl: Any) -> None:
    if ssl != openssl.ffi.NULL:
        openssl.lib.SSL_free(ssl)
    openssl.lib.SSL_CTX_free(ctx)


class OpenSslChannel(TlsChannel):
    """:class:`TlsChannel` through OpenSSL, for ``tls13-aes256-gcm``.

    OpenSSL's ``SSL`` objects are not safe to call from two threads at once,
    and a channel may send in one thread while it receives in another: every
    call into the session holds a lock. Calls never block (the socket is
    non-blocking), and waiting happens outside the lock.
    """

    _library = "OpenSSL"

    @classmethod
    def why_unavailable(cls, mode: str) -> str | None:
        missing = _openssl.why_unavailable()
        if missing is None:
            return None
        return f"{mode} needs OpenSSL, since GnuTLS 3.7 lacks SHA-384 PSK binders: {missing}"

    def __init__(self, sock: socket.socket, mode: str, *, client: bool, ktls: bool) -> None:
        super().__init__(sock, mode, client=client, ktls=ktls)
        self._openssl = openssl = _openssl()
        ffi, lib = openssl.ffi, openssl.lib
        self._lock = threading.Lock()
        ctx = lib.SSL_CTX_new(lib.TLS_client_method() if client else lib.TLS_server_method())
        if ctx == ffi.NULL:
            raise self._error("SSL_CTX_new")
        self._free = weakref.finalize(self, _free, openssl, ctx, ffi.NULL)
        # SSL_new copies the settings and callbacks: they go on the context first.
        if client:
            lib.SSL_CTX_set_psk_use_session_callback(ctx, openssl.use_session)
        else:
            lib.SSL_CTX_set_psk_find_session_callback(ctx, openssl.find_session)
        lib.SSL_CTX_set_keylog_callback(ctx, openssl.keylog)
        if ktls:
            lib.SSL_CTX_set_options(ctx, _OP_ENABLE_KTLS)
        lib.SSL_CTX_ctrl(ctx, _CTRL_MODE, _MODE_ACCEPT_MOVING_WRITE_BUFFER, ffi.NULL)
        if not (
            lib.SSL_CTX_ctrl(ctx, _CTRL_SET_MIN_PROTO_VERSION, _TLS1_3_VERSION, ffi.NULL)
            and lib.SSL_CTX_ctrl(ctx, _CTRL_SET_MAX_PROTO_VERSION, _TLS1_3_VERSION, ffi.NULL)
            and lib.SSL_CTX_set_ciphersuites(ctx, _SUITE_NAME)
            and lib.SSL_CTX_set_num_tickets(ctx, 0)
        ):
            raise self._error(f"setting up {mode}")
        self._ssl = ssl = lib.SSL_new(ctx)
        if ssl == ffi.NULL:
            raise self._error("SSL_new")
        self._free.detach()
        self._free = weakref.finalize(self, _free, openssl, ctx, ssl)
        self._psk = _Psk()
        self._handle = ffi.new_handle(self._psk)
        if not (lib.SSL_set_fd(ssl, self._fd) and lib.SSL_set_ex_data(ssl, 0, self._handle)):
            raise self._error("SSL_set_fd")

    def _error(self, what: str) -> TlsError:
        code = self._openssl.lib.ERR_get_error()
        return TlsError(f"OpenSSL: {what} failed: {self._reason(code)}")

    def _reason(self, code: int) -> str:
        text = self._openssl.lib.ERR_reason_error_string(code)
        return "unknown error" if text == self._openssl.ffi.NULL else str(self._openssl.ffi.string(text).decode())

    def _call(self, fn: Callable[..., int], *args: Any) -> tuple[int, int, int, int]:
        """``fn(ssl, *args)`` under the lock: its result, SSL_get_error's, the first OpenSSL error and errno."""
        lib = self._openssl.lib
        with self._lock:
            lib.ERR_clear_error()
            ret = fn(self._ssl, *args)
            if ret > 0:
                return ret, 0, 0, 0
            sys_errno = self._openssl.ffi.errno
            error = lib.SSL_get_error(self._ssl, ret)
            code = lib.ERR_get_error()
            lib.ERR_clear_error()
        return ret, error, code, sys_errno

    # handshake and hand-off

    def _client_handshake(self, key: bytes, identity: bytes, timeout: float | None) -> None:
        _check_key_size(key)
        self._psk.key = key
        self._psk.identity, self._psk.identity_len = self._openssl.ffi.new("char[]", identity), len(identity)
        self._handshake(self._openssl.lib.SSL_connect, timeout)

    def _server_handshake(self, keys: ServerKeys, timeout: float | None) -> str:
        self._psk.keys = keys
        self._handshake(self._openssl.lib.SSL_accept, timeout)
        return self._psk.found.decode("utf-8", "backslashreplace")

    def _handshake(self, step: Callable[[Any], int], timeout: float | None) -> None:
        lib = self._openssl.lib
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ret, error, code, sys_errno = self._call(step)
            if ret == 1:
                break
            if error == _ERROR_WANT_READ:
                self._wait_handshake(select.POLLIN, deadline, timeout)
            elif error == _ERROR_WANT_WRITE:
                self._wait_handshake(select.POLLOUT, deadline, timeout)
            else:
                raise self._handshake_error(error, code, sys_errno)
        version, cipher = lib.SSL_version(self._ssl), lib.SSL_CIPHER_get_id(lib.SSL_get_current_cipher(self._ssl))
        if (version, cipher) != (_TLS1_3_VERSION, _CIPHER_ID):
            raise HandshakeError(f"TLS handshake negotiated protocol {version:#x}, cipher {cipher:#x}, not {self.mode}")

    def _handshake_error(self, error: int, code: int, sys_errno: int) -> HandshakeError:
        reason = 0 if code & _ERR_SYSTEM_FLAG else code & _ERR_REASON_MASK
        what, cause = self._reason(code), _CAUSES.get(reason)
        if reason == _R_UNEXPECTED_EOF_WHILE_READING or (error == _ERROR_SYSCALL and not code):
            what = "the peer closed the connection"
        elif _AD_REASON_OFFSET < reason < _AD_REASON_OFFSET + 256:
            alert = reason - _AD_REASON_OFFSET
            what, cause = self._said_alert(alert), ALERT_CAUSES.get(alert)
            if alert == _ILLEGAL_PARAMETER:  # GnuTLS's answer to a binder of another key, or of SHA-256
                cause = TlsCause.KEY_OR_MODE
        elif error == _ERROR_SYSCALL and sys_errno:
            what = f"{errno.errorcode.get(sys_errno, sys_errno)}: the peer closed the connection"
        return HandshakeError(f"TLS handshake failed: {what} ({self._hint(cause)})", cause)

    def _library_ktls(self) -> tuple[bool, bool]:
        lib, null = self._openssl.lib, self._openssl.ffi.NULL
        tx = lib.BIO_ctrl(lib.SSL_get_wbio(self._ssl), _BIO_CTRL_GET_KTLS_SEND, 0, null)
        rx = lib.BIO_ctrl(lib.SSL_get_rbio(self._ssl), _BIO_CTRL_GET_KTLS_RECV, 0, null)
        return bool(tx), bool(rx)

    def _crypto_info(self, *, read: bool) -> bytes:
        """From the traffic secret of that direction (the client's is the one the client sends with)."""
        label = _SERVER_SECRET if read == self._client else _CLIENT_SECRET
        secret = self._psk.secrets.get(label)
        if secret is None:
            raise OSError(errno.EINVAL, f"OpenSSL reported no {label}")
        key, iv = _expand_label(secret, b"key", self._suite.key_size), _expand_label(secret, b"iv", 12)
        return self._pack_crypto_info(key, iv[:4], iv[4:], bytes(8))

    def _user_pending(self) -> bool:
        return bool(self._openssl.lib.SSL_has_pending(self._ssl))

    # records in OpenSSL

    def _user_send_all(self, view: memoryview) -> None:
        ffi, lib = self._openssl.ffi, self._openssl.lib
        written = ffi.new("size_t *")
        with ffi.from_buffer(view) as ptr:  # released on the way out, an exception's too (see gnutls.py)
            while view.nbytes:
                # All of it in one call, as many records as that takes; after WANT_WRITE the same arguments again.
                ret, error, code, sys_errno = self._call(lib.SSL_write_ex, ptr, view.nbytes, written)
                if ret > 0:
                    return
                if error in (_ERROR_WANT_WRITE, _ERROR_WANT_READ):
                    self._wait_io(select.POLLOUT if error == _ERROR_WANT_WRITE else select.POLLIN)
                else:
                    raise self._record_error(error, code, sys_errno, "send")

    def _user_recv_into(self, view: memoryview) -> int:
        ffi, lib = self._openssl.ffi, self._openssl.lib
        read = ffi.new("size_t *")
        with ffi.from_buffer(view, require_writable=True) as ptr:
            got = 0
            while got < view.nbytes:
                ret, error, code, sys_errno = self._call(lib.SSL_read_ex, ptr + got, view.nbytes - got, read)
                if ret > 0:
                    got += read[0]
                elif error == _ERROR_ZERO_RETURN:
                    self.ends.rx_done = True
                    break
                elif error in (_ERROR_WANT_READ, _ERROR_WANT_WRITE):
                    if got:
                        break
                    self._wait_io(select.POLLIN if error == _ERROR_WANT_READ else select.POLLOUT)
                else:
                    self._rx_error = self._record_error(error, code, sys_errno, "receive")
                    if got:  # the error comes with the next call, after the data that came before it
                        break
                    raise self._rx_error
            return got

    def _user_end_tx(self) -> None:
        """close_notify; none after a failed receive, when OpenSSL sends nothing more (the caller had that error)."""
        if self._rx_error is not None:
            return
        while True:
            ret, error, code, sys_errno = self._call(self._openssl.lib.SSL_shutdown)
            if ret >= 0:  # 0: our close_notify is out; 1: the peer's came too
                return
            if error == _ERROR_WANT_WRITE:
                self._wait_io(select.POLLOUT)
            else:
                raise self._record_error(error, code, sys_errno, "close_notify")

    def _record_error(self, error: int, code: int, sys_errno: int, what: str) -> Exception:
        """The exception for a failed record call: socket errors stay OSErrors."""
        reason = 0 if code & _ERR_SYSTEM_FLAG else code & _ERR_REASON_MASK
        if reason == _R_UNEXPECTED_EOF_WHILE_READING or (
            error == _ERROR_SYSCALL and sys_errno in (0, errno.ECONNRESET) and not code
        ):
            return TruncationError(TRUNCATED)
        if error == _ERROR_SYSCALL and sys_errno:
            return OSError(sys_errno, f"TLS {what} failed: {errno.errorcode.get(sys_errno, sys_errno)}")
        if _AD_REASON_OFFSET < reason < _AD_REASON_OFFSET + 256:
            alert = reason - _AD_REASON_OFFSET
            return TlsError(f"TLS {what} failed: {self._said_alert(alert)}", TlsCause.ALERT)
        return TlsError(f"TLS {what} failed: {self._reason(code)}")

    def _alert_name(self, alert: int) -> str:
        return str(self._openssl.ffi.string(self._openssl.lib.SSL_alert_desc_string_long(alert)).decode())
