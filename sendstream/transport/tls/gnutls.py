"""GnuTLS (``libgnutls.so.30``) through a small cffi binding in ABI mode, and :class:`GnuTlsChannel` on it.

Every mode but ``tls13-aes256-gcm``: GnuTLS 3.7 binds external PSKs to
SHA-256 (``credentials2``, which takes another hash, came in 3.8.10). The
kernel gets each direction's keys, IVs and sequence numbers from
``gnutls_record_get_state``. Our sessions never send a KeyUpdate
(``GNUTLS_NO_AUTO_REKEY``: like the kernel's own TX, they do not rekey
after 2^24 records) and take no session tickets.
"""

from __future__ import annotations

import errno
import math
import os
import select
import socket
import time
import weakref
from typing import Any, Final

import cffi  # type: ignore[import-untyped]

from ...errors import HandshakeError, TlsCause, TlsError, TruncationError
from .binding import Binding
from .kernel import ALERT_CAUSES, TRUNCATED, TlsChannel
from .keys import ServerKeys

_CDEF = """
typedef struct gnutls_session_int *gnutls_session_t;
typedef struct gnutls_psk_client_credentials_st *gnutls_psk_client_credentials_t;
typedef struct gnutls_psk_server_credentials_st *gnutls_psk_server_credentials_t;
typedef struct { unsigned char *data; unsigned int size; } gnutls_datum_t;
typedef int gnutls_psk_server_credentials_function(gnutls_session_t, const char *, gnutls_datum_t *);

extern void *(*gnutls_malloc)(size_t);
int gnutls_global_init(void);
const char *gnutls_strerror(int error);
int gnutls_error_is_fatal(int error);

int gnutls_init(gnutls_session_t *session, unsigned int flags);
void gnutls_deinit(gnutls_session_t session);
int gnutls_priority_set_direct(gnutls_session_t session, const char *priorities, const char **err_pos);
int gnutls_credentials_set(gnutls_session_t session, int type, void *cred);
void gnutls_transport_set_int2(gnutls_session_t session, int r, int s);
void gnutls_session_set_ptr(gnutls_session_t session, void *ptr);
void *gnutls_session_get_ptr(gnutls_session_t session);

int gnutls_psk_allocate_client_credentials(gnutls_psk_client_credentials_t *sc);
void gnutls_psk_free_client_credentials(gnutls_psk_client_credentials_t sc);
int gnutls_psk_set_client_credentials(gnutls_psk_client_credentials_t res, const char *username,
                                      const gnutls_datum_t *key, int flags);
int gnutls_psk_allocate_server_credentials(gnutls_psk_server_credentials_t *sc);
void gnutls_psk_free_server_credentials(gnutls_psk_server_credentials_t sc);
void gnutls_psk_set_server_credentials_function(gnutls_psk_server_credentials_t cred,
                                                gnutls_psk_server_credentials_function *func);
const char *gnutls_psk_server_get_username(gnutls_session_t session);

void gnutls_handshake_set_timeout(gnutls_session_t session, unsigned int ms);
int gnutls_handshake(gnutls_session_t session);
int gnutls_record_get_direction(gnutls_session_t session);
int gnutls_alert_get(gnutls_session_t session);
const char *gnutls_alert_get_name(int alert);
int gnutls_alert_send_appropriate(gnutls_session_t session, int err);
int gnutls_protocol_get_version(gnutls_session_t session);
int gnutls_cipher_get(gnutls_session_t session);
int gnutls_record_get_state(gnutls_session_t session, unsigned read, gnutls_datum_t *mac_key,
                            gnutls_datum_t *iv, gnutls_datum_t *cipher_key, unsigned char seq_number[8]);

ssize_t gnutls_record_send(gnutls_session_t session, const void *data, size_t data_size);
ssize_t gnutls_record_recv(gnutls_session_t session, void *data, size_t data_size);
size_t gnutls_record_check_pending(gnutls_session_t session);
int gnutls_bye(gnutls_session_t session, int how);
"""

# gnutls.h
_SERVER, _CLIENT, _NO_SIGNAL, _NO_TICKETS, _NO_AUTO_REKEY = 1, 2, 1 << 6, 1 << 10, 1 << 15
_CRD_PSK = 4
_PSK_KEY_RAW = 0
_SHUT_WR = 1
_E_AGAIN = -28
_E_INTERRUPTED = -52
_E_PULL_ERROR = -54
_E_PUSH_ERROR = -53
_E_PREMATURE_TERMINATION = -110
_E_UNEXPECTED_PACKET_LENGTH = -9
_E_FATAL_ALERT_RECEIVED = -12
_E_TIMEDOUT = -319
# What a failed handshake most likely means, by GnuTLS error.
_CAUSES: Final = {
    -24: TlsCause.KEY,  # decryption failed (TLS 1.2 Finished under the wrong key)
    -18: TlsCause.KEY,  # error in Finished
    -55: TlsCause.KEY,  # illegal parameter received: a TLS 1.3 binder made with another key
    -8: TlsCause.MODE,  # unsupported version
    -21: TlsCause.MODE,  # unknown cipher suite
    -87: TlsCause.MODE,  # no supported cipher suites
    -32: TlsCause.MODE,  # insufficient credentials: no PSK suite in common
    _E_UNEXPECTED_PACKET_LENGTH: TlsCause.NOT_TLS,
    -15: TlsCause.NOT_TLS,  # unexpected packet
    -19: TlsCause.NOT_TLS,  # unexpected handshake packet
    -417: TlsCause.NOT_TLS,  # record overflow
}


class _GnuTLS:
    """libgnutls.so.30 in cffi ABI mode, loaded once on first use."""

    def __init__(self) -> None:
        self.ffi = cffi.FFI()
        self.ffi.cdef(_CDEF)
        self.lib = self.ffi.dlopen("libgnutls.so.30")
        self.check(self.lib.gnutls_global_init(), "gnutls_global_init")
        # One callback for every server session; it finds the session's keys through the session pointer.
        self.server_key = self.ffi.callback("gnutls_psk_server_credentials_function", self._server_key)

    def check(self, ret: int, what: str) -> None:
        if ret < 0:
            raise TlsError(f"{what} failed: {self.strerror(ret)}", TlsCause.SETUP)

    def strerror(self, ret: int) -> str:
        return str(self.ffi.string(self.lib.gnutls_strerror(ret)).decode()).rstrip(".")

    def _server_key(self, session: Any, username: Any, out: Any) -> int:
        """0 with the key in ``out``; 1 for an unknown identity (GnuTLS then fails as with a wrong key); -1."""
        keys: ServerKeys = self.ffi.from_handle(self.lib.gnutls_session_get_ptr(session))
        key = keys.find(self.ffi.string(username))
        if key is None:
            return -1 if keys.error is not None else 1
        data = self.lib.gnutls_malloc(len(key))
        if data == self.ffi.NULL:
            return -1
        self.ffi.memmove(data, key, len(key))
        out.data = self.ffi.cast("unsigned char *", data)
        out.size = len(key)
        return 0


_gnutls = Binding(_GnuTLS, "TLS needs GnuTLS: cannot load libgnutls.so.30 ({}); install libgnutls30")


def _free_session(gnutls: _GnuTLS, session: Any, credentials: Any, client: bool) -> None:
    gnutls.lib.gnutls_deinit(session)
    if client:
        gnutls.lib.gnutls_psk_free_client_credentials(credentials)
    else:
        gnutls.lib.gnutls_psk_free_server_credentials(credentials)


class GnuTlsChannel(TlsChannel):
    """:class:`TlsChannel` through GnuTLS: every mode but ``tls13-aes256-gcm``."""

    _library = "GnuTLS"

    @classmethod
    def why_unavailable(cls, mode: str) -> str | None:
        return _gnutls.why_unavailable()

    def __init__(self, sock: socket.socket, mode: str, *, client: bool, ktls: bool) -> None:
        super().__init__(sock, mode, client=client, ktls=ktls)
        self._gnutls = gnutls = _gnutls()
        ffi, lib = gnutls.ffi, gnutls.lib
        flags = (_CLIENT if client else _SERVER) | _NO_TICKETS | _NO_AUTO_REKEY | _NO_SIGNAL
        session_p = ffi.new("gnutls_session_t *")
        gnutls.check(lib.gnutls_init(session_p, flags), "gnutls_init")
        self._session = session_p[0]
        if client:
            cred_p = ffi.new("gnutls_psk_client_credentials_t *")
            ret = lib.gnutls_psk_allocate_client_credentials(cred_p)
        else:
            cred_p = ffi.new("gnutls_psk_server_credentials_t *")
            ret = lib.gnutls_psk_allocate_server_credentials(cred_p)
        if ret < 0:
            lib.gnutls_deinit(self._session)
            gnutls.check(ret, "allocating PSK credentials")
        self._credentials = cred_p[0]
        self._free = weakref.finalize(self, _free_session, gnutls, self._session, self._credentials, client)
        gnutls.check(lib.gnutls_priority_set_direct(self._session, self._suite.priority.encode(), ffi.NULL), mode)
        gnutls.check(lib.gnutls_credentials_set(self._session, _CRD_PSK, self._credentials), "gnutls_credentials_set")
        lib.gnutls_transport_set_int2(self._session, self._fd, self._fd)

    # handshake and hand-off

    def _client_handshake(self, key: bytes, identity: bytes, timeout: float | None) -> None:
        ffi, lib = self._gnutls.ffi, self._gnutls.lib
        datum = ffi.new("gnutls_datum_t *")
        key_buf = ffi.from_buffer(key)
        datum.data, datum.size = ffi.cast("unsigned char *", key_buf), len(key)
        ret = lib.gnutls_psk_set_client_credentials(self._credentials, identity, datum, _PSK_KEY_RAW)
        self._gnutls.check(ret, "setting the PSK")
        self._handshake(timeout)

    def _server_handshake(self, keys: ServerKeys, timeout: float | None) -> str:
        ffi, lib = self._gnutls.ffi, self._gnutls.lib
        handle = ffi.new_handle(keys)
        lib.gnutls_psk_set_server_credentials_function(self._credentials, self._gnutls.server_key)
        lib.gnutls_session_set_ptr(self._session, handle)
        try:
            self._handshake(timeout)
        finally:
            lib.gnutls_session_set_ptr(self._session, ffi.NULL)
        return str(ffi.string(lib.gnutls_psk_server_get_username(self._session)).decode("utf-8", "backslashreplace"))

    def _handshake(self, timeout: float | None) -> None:
        lib = self._gnutls.lib
        lib.gnutls_handshake_set_timeout(self._session, 0 if timeout is None else math.ceil(timeout * 1000))
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            ret = lib.gnutls_handshake(self._session)
            if ret == 0:
                break
            if ret == _E_AGAIN:
                events = select.POLLOUT if lib.gnutls_record_get_direction(self._session) else select.POLLIN
                self._wait_handshake(events, deadline, timeout)
            elif lib.gnutls_error_is_fatal(ret):
                lib.gnutls_alert_send_appropriate(self._session, ret)  # best effort: tell the peer why
                raise self._handshake_error(ret, timeout)
        version, cipher = lib.gnutls_protocol_get_version(self._session), lib.gnutls_cipher_get(self._session)
        if (version, cipher) != (self._suite.version, self._suite.cipher):
            raise HandshakeError(f"TLS handshake negotiated protocol {version}, cipher {cipher}, not {self.mode}")

    def _handshake_error(self, ret: int, timeout: float | None) -> HandshakeError:
        gnutls = self._gnutls
        if ret == _E_TIMEDOUT:
            return self._timed_out(timeout)
        what, cause = gnutls.strerror(ret), _CAUSES.get(ret)
        if ret == _E_FATAL_ALERT_RECEIVED:
            alert = gnutls.lib.gnutls_alert_get(self._session)
            what, cause = self._said_alert(alert), ALERT_CAUSES.get(alert)
        elif ret in (_E_PREMATURE_TERMINATION, _E_PULL_ERROR):
            what = "the peer closed the connection"
        return HandshakeError(f"TLS handshake failed: {what} ({self._hint(cause)})", cause)

    def _library_ktls(self) -> tuple[bool, bool]:
        return False, False  # Debian's GnuTLS is built without its own kTLS

    def _crypto_info(self, *, read: bool) -> bytes:
        """From GnuTLS's record state of that direction."""
        ffi, lib = self._gnutls.ffi, self._gnutls.lib
        mac, iv, key = ffi.new("gnutls_datum_t *"), ffi.new("gnutls_datum_t *"), ffi.new("gnutls_datum_t *")
        seq = ffi.new("unsigned char[8]")
        self._gnutls.check(lib.gnutls_record_get_state(self._session, int(read), mac, iv, key, seq), "record state")
        iv_bytes, key_bytes = ffi.buffer(iv.data, iv.size)[:], ffi.buffer(key.data, key.size)[:]
        seq_bytes = ffi.buffer(seq)[:]
        if self._suite.tls13:  # 12-byte IV: the first 4 are the salt, the other 8 the kernel's "iv"
            return self._pack_crypto_info(key_bytes, iv_bytes[:4], iv_bytes[4:], seq_bytes)
        # 4-byte implicit IV; the explicit nonce is the sequence number
        return self._pack_crypto_info(key_bytes, iv_bytes, seq_bytes, seq_bytes)

    def _user_pending(self) -> bool:
        return bool(self._gnutls.lib.gnutls_record_check_pending(self._session))

    # records in GnuTLS

    def _user_send_all(self, view: memoryview) -> None:
        ffi, lib = self._gnutls.ffi, self._gnutls.lib
        size = view.nbytes
        # released on the way out, an exception's too: a traceback left in a cycle must not hold an export of
        # the view (the collector then fails to clear it, and the process can crash)
        with ffi.from_buffer(view) as ptr:
            sent = 0
            while sent < size:
                # One record (up to 16 KiB) per call; after E_AGAIN the same arguments again, as GnuTLS asks.
                ret = lib.gnutls_record_send(self._session, ptr + sent, size - sent)
                if ret > 0:
                    sent += ret
                elif ret == _E_AGAIN:
                    self._wait_io(select.POLLOUT)
                elif ret != _E_INTERRUPTED:
                    raise self._record_error(ret, "send")

    def _user_recv_into(self, view: memoryview) -> int:
        ffi, lib = self._gnutls.ffi, self._gnutls.lib
        size = view.nbytes
        with ffi.from_buffer(view, require_writable=True) as ptr:
            got = 0
            while got < size:
                ret = lib.gnutls_record_recv(self._session, ptr + got, size - got)
                if ret > 0:
                    got += ret
                elif ret == 0:
                    self.ends.rx_done = True
                    break
                elif ret == _E_AGAIN:
                    if got:
                        break
                    self._wait_io(select.POLLIN)
                elif ret != _E_INTERRUPTED and lib.gnutls_error_is_fatal(ret):
                    self._rx_error = self._record_error(ret, "receive")
                    if got:  # the error comes with the next call, after the data that came before it
                        break
                    raise self._rx_error
            return got

    def _user_end_tx(self) -> None:
        lib = self._gnutls.lib
        while True:
            ret = lib.gnutls_bye(self._session, _SHUT_WR)
            if ret == 0:
                return
            if ret == _E_AGAIN:
                self._wait_io(select.POLLOUT)
            elif ret != _E_INTERRUPTED:
                raise self._record_error(ret, "close_notify")

    def _alert_name(self, alert: int) -> str:
        return str(self._gnutls.ffi.string(self._gnutls.lib.gnutls_alert_get_name(alert)).decode())

    def _record_error(self, ret: int, what: str) -> Exception:
        """The exception for a fatal GnuTLS record error: socket errors stay OSErrors."""
        err = self._gnutls.ffi.errno
        if ret == _E_PREMATURE_TERMINATION or (ret == _E_PULL_ERROR and err == errno.ECONNRESET):
            return TruncationError(TRUNCATED)
        if ret == _E_UNEXPECTED_PACKET_LENGTH and self._at_eof():  # the connection ended inside a record
            return TruncationError(TRUNCATED)
        if ret in (_E_PUSH_ERROR, _E_PULL_ERROR) and err:
            return OSError(err, f"TLS {what} failed: {os.strerror(err)}")
        if ret == _E_FATAL_ALERT_RECEIVED:
            alert = self._gnutls.lib.gnutls_alert_get(self._session)
            return TlsError(f"TLS {what} failed: {self._said_alert(alert)}", TlsCause.ALERT)
        return TlsError(f"TLS {what} failed: {self._gnutls.strerror(ret)}")

    def _at_eof(self) -> bool:
        try:
            return self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except ConnectionResetError:
            return True
        except OSError:
            return False
