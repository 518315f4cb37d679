"""The TLS layer of the network transport: PSK sessions by GnuTLS or OpenSSL, records by the kernel when it can.

A :class:`Channel` is a byte stream over a connected TCP socket, handed out
by :func:`connect_channel` and :func:`accept_channel`. Mode ``"none"`` is
plain TCP. The TLS modes shake hands with a pre-shared key in GnuTLS
(``libgnutls.so.30``, through a small cffi binding in ABI mode: no compiler
needed), except ``tls13-aes256-gcm``, which OpenSSL's ``libssl.so.3`` does
(:mod:`sendstream.openssl`). Then each direction's record layer is offered
to the kernel (kTLS): ``TCP_ULP "tls"``, then ``TLS_TX`` and ``TLS_RX`` with
the keys, IVs and sequence numbers read from ``gnutls_record_get_state``
(OpenSSL: its own kTLS, or keys derived from the traffic secrets). A
direction the kernel refuses (no ``tls`` module, a cipher it lacks, records
already buffered in the library) stays in the library. Each direction uses
exactly one path: once TX is in the kernel, the library is only asked to
receive, which never makes it write here (no session tickets, no automatic
key update, no renegotiation); once RX is, it only sends, which never reads.
``SENDSTREAM_NO_KTLS=1`` keeps both directions in the library.

The channel owns the socket from the call on: it puts it in non-blocking
mode and waits with ``poll``, so that the socket's timeout at the time of
the call bounds every later wait (``None``: wait for ever; :meth:`Channel.settimeout`
changes it, :meth:`Channel.set_deadline` adds an absolute limit), and closes
it on :meth:`Channel.close` or when the handshake fails.

Facts this relies on (GnuTLS 3.7.9, OpenSSL 3.0, Linux 6.1; see ``TRANSPORT.md``):

- GnuTLS 3.7 binds external PSKs to SHA-256 (``credentials2``, which takes
  another hash, came in 3.8.10), so TLS 1.3 with AES-256-GCM
  (``TLS_AES_256_GCM_SHA384``, SHA-384 binders) is OpenSSL's: an external
  PSK there is an ``SSL_SESSION`` of that suite. OpenSSL's ``-psk`` options
  and stunnel (the legacy PSK callbacks) bind to SHA-256 too, so of the
  usual peers only ``openssl s_server``/``s_client -psk_session`` speak
  this mode. :func:`why_unavailable` says when ``libssl.so.3`` is missing.
- A kernel RX socket returns non-data records with their type in a cmsg;
  a record of at most 16 KiB fits whole into a buffer of that size.
- A TLS 1.3 KeyUpdate cannot be followed by kernels before ~6.14 (RX keys
  are set once), so ours never sends one (``GNUTLS_NO_AUTO_REKEY``: like the
  kernel's own TX, it does not rekey after 2^24 records), and a peer's
  KeyUpdate on a kernel RX socket is a clear error.
"""

from __future__ import annotations

import abc
import base64
import binascii
import contextlib
import errno
import hashlib
import math
import os
import re
import select
import socket
import struct
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, Generic, NoReturn, TypeVar

import cffi  # type: ignore[import-untyped]

from ...errors import HandshakeError, KeyFileError, TlsCause, TlsError, TruncationError, UsageError

MODES: Final = ("none", "tls12-aes128-gcm", "tls12-aes256-gcm", "tls13-aes128-gcm", "tls13-aes256-gcm")
DEFAULT_MODE: Final = "tls13-aes128-gcm"
HANDSHAKE_TIMEOUT: Final = 30.0
MAX_IDENTITY: Final = 128  # bytes of UTF-8; OpenSSL and GnuTLS accept at least this much
SALT_PREFIX: Final = b"sendstream-psk:"

_MAX_KEY_FILE = 64 << 10
_SENDFILE_CHUNK = 256 << 10
_MAX_RECORD = 1 << 14  # TLS plaintext limit: a kernel read of this size holds any whole record
_TRUNCATED = "the connection ended without a TLS close_notify: the data may be truncated"
_B = TypeVar("_B")
_PEM = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n(.*?)-----END \1-----", re.DOTALL)


# --- keys ---------------------------------------------------------------------------------------------------------


def load_key(path: str | os.PathLike[str]) -> bytes:
    """The pre-shared key in ``path``: a PEM block's base64 body, else the file's bytes exactly.

    Raw bytes are used as stored, with no newline stripped: a key is binary,
    and a random key ends in ``\\n`` once in 256 times. Like ssh with private
    keys, a file that group or others may access in any way is refused.
    """
    try:
        with open(path, "rb") as f:
            mode = os.fstat(f.fileno()).st_mode
            if mode & 0o077:
                raise KeyFileError(
                    f"key file {os.fspath(path)!r} is accessible by group or others (mode {mode & 0o777:04o}); "
                    f"run: chmod 600 {os.fspath(path)}"
                )
            data = f.read(_MAX_KEY_FILE + 1)
    except OSError as exc:
        raise KeyFileError(f"cannot read key file {os.fspath(path)!r}: {exc.strerror}") from exc
    if len(data) > _MAX_KEY_FILE:
        raise KeyFileError(f"key file {os.fspath(path)!r} is larger than {_MAX_KEY_FILE} bytes: not a key")
    pem = _PEM.search(data)
    if pem:
        try:
            data = base64.b64decode(b"".join(pem.group(2).split()), validate=True)
        except binascii.Error as exc:
            raise KeyFileError(f"key file {os.fspath(path)!r}: bad base64 in the PEM block ({exc})") from exc
    if not data:
        raise KeyFileError(f"key file {os.fspath(path)!r} holds no key")
    return data


def derive_key(password: str, salt: bytes | str) -> bytes:
    """A 32-byte pre-shared key from a password: scrypt with n=2**15, r=8, p=1.

    Both ends must use the same salt. A ``str`` is taken as the PSK identity
    and turned into the salt ``b"sendstream-psk:" + identity.encode()``, which
    is what sendstream uses; ``bytes`` are used as given.
    """
    if not password:
        raise UsageError("empty password")
    if isinstance(salt, str):
        salt = SALT_PREFIX + salt.encode("utf-8")
    return hashlib.scrypt(password.encode("utf-8"), salt=salt, n=1 << 15, r=8, p=1, maxmem=64 << 20, dklen=32)


# --- the GnuTLS binding -------------------------------------------------------------------------------------------

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
_TLS1_2, _TLS1_3 = 4, 5
_CIPHER_AES_128_GCM, _CIPHER_AES_256_GCM = 10, 11
_E_AGAIN = -28
_E_INTERRUPTED = -52
_E_PULL_ERROR = -54
_E_PUSH_ERROR = -53
_E_PREMATURE_TERMINATION = -110
_E_UNEXPECTED_PACKET_LENGTH = -9
_E_FATAL_ALERT_RECEIVED = -12
_E_TIMEDOUT = -319
# What a failed handshake most likely means, by GnuTLS error and by the alert the peer sent.
_KEY, _MODE, _IDENTITY_OR_MODE, _NOT_TLS = TlsCause.KEY, TlsCause.MODE, TlsCause.IDENTITY_OR_MODE, TlsCause.NOT_TLS
_KEY_OR_MODE = TlsCause.KEY_OR_MODE
_CAUSES = {
    -24: _KEY,  # decryption failed (TLS 1.2 Finished under the wrong key)
    -18: _KEY,  # error in Finished
    -55: _KEY,  # illegal parameter received: a TLS 1.3 binder made with another key
    -8: _MODE,  # unsupported version
    -21: _MODE,  # unknown cipher suite
    -87: _MODE,  # no supported cipher suites
    -32: _MODE,  # insufficient credentials: no PSK suite in common
    _E_UNEXPECTED_PACKET_LENGTH: _NOT_TLS,
    -15: _NOT_TLS,  # unexpected packet
    -19: _NOT_TLS,  # unexpected handshake packet
    -417: _NOT_TLS,  # record overflow
}
# handshake_failure: OpenSSL's answer to an unknown TLS 1.3 identity, and GnuTLS's to a cipher it lacks.
_ALERT_CAUSES = {20: _KEY, 47: _KEY, 51: _KEY, 115: _KEY, 40: _IDENTITY_OR_MODE, 70: _MODE, 71: _MODE}

# The kernel's TLS interface (linux/tls.h, linux/tcp.h); Python 3.11's socket module has none of these.
SOL_TLS: Final = 282
TCP_ULP: Final = 31
TLS_TX: Final = 1
TLS_RX: Final = 2
TLS_SET_RECORD_TYPE: Final = 1
TLS_GET_RECORD_TYPE: Final = 2
_CIPHER_KERNEL_AES_GCM_128, _CIPHER_KERNEL_AES_GCM_256 = 51, 52
_ALERT, _HANDSHAKE, _APPLICATION_DATA = 21, 22, 23
_CLOSE_NOTIFY = b"\x01\x00"  # level warning, description close_notify
_NEW_SESSION_TICKET, _KEY_UPDATE = 4, 24
_CMSG_SPACE = socket.CMSG_SPACE(1)


@dataclass(frozen=True)
class _Suite:
    """One TLS mode: what GnuTLS is told, and what the kernel is told."""

    priority: str
    version: int  # GnuTLS protocol number
    cipher: int  # GnuTLS cipher number
    wire_version: int
    kernel_cipher: int
    key_size: int

    @property
    def tls13(self) -> bool:
        return self.version == _TLS1_3


def _priority(version: str, cipher: str) -> str:
    kx = "+ECDHE-PSK:+PSK" if version == "TLS1.3" else "+PSK"  # OpenSSL TLS 1.3 servers need psk_dhe_ke
    return f"NORMAL:-VERS-ALL:+VERS-{version}:-KX-ALL:{kx}:-CIPHER-ALL:+{cipher}"


_SUITES: Final = {
    "tls12-aes128-gcm": _Suite(
        _priority("TLS1.2", "AES-128-GCM"),
        _TLS1_2,
        _CIPHER_AES_128_GCM,
        0x0303,
        _CIPHER_KERNEL_AES_GCM_128,
        16,
    ),
    "tls12-aes256-gcm": _Suite(
        _priority("TLS1.2", "AES-256-GCM"),
        _TLS1_2,
        _CIPHER_AES_256_GCM,
        0x0303,
        _CIPHER_KERNEL_AES_GCM_256,
        32,
    ),
    "tls13-aes128-gcm": _Suite(
        _priority("TLS1.3", "AES-128-GCM"),
        _TLS1_3,
        _CIPHER_AES_128_GCM,
        0x0304,
        _CIPHER_KERNEL_AES_GCM_128,
        16,
    ),
    "tls13-aes256-gcm": _Suite(
        _priority("TLS1.3", "AES-256-GCM"),
        _TLS1_3,
        _CIPHER_AES_256_GCM,
        0x0304,
        _CIPHER_KERNEL_AES_GCM_256,
        32,
    ),
}


# TLS_AES_256_GCM_SHA384 binds an external PSK to SHA-384, which GnuTLS 3.7 cannot do: OpenSSL does this mode.
_OPENSSL_MODES: Final = frozenset({"tls13-aes256-gcm"})


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
        keys: _ServerKeys = self.ffi.from_handle(self.lib.gnutls_session_get_ptr(session))
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


class _Binding(Generic[_B]):
    """A library binding made once, on first use; a library that cannot be loaded is a TlsError."""

    def __init__(self, make: Callable[[], _B], failure: str) -> None:
        self._make = make
        self._failure = failure  # the message; "{}" is the loader's error
        self._loaded: _B | None = None
        self._lock = threading.Lock()

    def __call__(self) -> _B:
        with self._lock:
            if self._loaded is None:
                try:
                    self._loaded = self._make()
                except OSError as exc:
                    raise TlsError(self._failure.format(exc), TlsCause.SETUP) from exc
            return self._loaded


_gnutls = _Binding(_GnuTLS, "TLS needs GnuTLS: cannot load libgnutls.so.30 ({}); install libgnutls30")


def why_unavailable(mode: str) -> str | None:
    """Why ``mode`` cannot be used on this system, or None when it can."""
    if mode not in MODES:
        return f"unknown TLS mode {mode!r}; choose one of {', '.join(MODES)}"
    if mode == "none":
        return None
    if mode in _OPENSSL_MODES:
        from .openssl import why_unavailable as openssl_missing

        return openssl_missing(mode)
    try:
        _gnutls()
    except TlsError as exc:
        return str(exc)
    return None


class _ServerKeys:
    """The server's key lookup during one handshake, called from the TLS library's callback."""

    def __init__(self, keys: Callable[[str], bytes | None] | bytes) -> None:
        self.keys = keys
        self.unknown: str | None = None
        self.error: BaseException | None = None

    def find(self, raw_identity: bytes) -> bytes | None:
        """The key for ``raw_identity``; None for an unknown identity (kept in ``unknown``) or a failed lookup."""
        try:
            identity = raw_identity.decode("utf-8", "backslashreplace")
            key = self.keys(identity) if callable(self.keys) else self.keys
        except BaseException as exc:  # raised again after the handshake, not inside the TLS library
            self.error = exc
            return None
        if not key:
            self.unknown = identity
            return None
        return key


# --- channels ------------------------------------------------------------------------------------------------------


class Channel(abc.ABC):
    """A byte stream over a connected TCP socket, plain or inside TLS.

    One thread may send while another receives. :meth:`recv_into` returns 0
    only at a clean end; :meth:`shutdown_write` ends our direction (TLS:
    close_notify) and receiving can go on; :meth:`close` does both ends.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._fd = sock.fileno()
        self._timeout = sock.gettimeout()
        self._deadline: float | None = None
        sock.setblocking(False)
        self.identity: str | None = None  # TLS: the PSK identity (the client's, on the server)
        self._tx_done = False
        self._tx_failed = False
        self._rx_done = False

    @property
    @abc.abstractmethod
    def tx_path(self) -> str:
        """Who writes records: ``"kernel"``, ``"userspace"`` or ``"plain"``."""

    @property
    @abc.abstractmethod
    def rx_path(self) -> str:
        """Who reads records: ``"kernel"``, ``"userspace"`` or ``"plain"``."""

    @abc.abstractmethod
    def describe(self) -> str:
        """One line for the user, e.g. ``"tls13-aes128-gcm, TX kernel, RX userspace"``."""

    @abc.abstractmethod
    def recv_into(self, buf: bytearray | memoryview) -> int:
        """Receive up to ``len(buf)`` bytes; 0 only at a clean end (TLS: the peer's close_notify)."""

    def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Send every byte of ``data``."""
        self._check_send()
        with memoryview(data) as view:
            try:
                self._send(view.cast("B"))
            except BaseException:
                self._tx_failed = True
                raise

    def sendfile(self, fd: int, offset: int, count: int) -> int:
        """Send ``count`` bytes of file ``fd`` from ``offset``; fewer only when the file ends first."""
        self._check_send()
        try:
            return self._sendfile(fd, offset, count)
        except BaseException:
            self._tx_failed = True
            raise

    def settimeout(self, seconds: float | None) -> None:
        """Bound every later wait to send or receive by ``seconds`` (``None``: wait for ever)."""
        self._timeout = seconds

    def set_deadline(self, deadline: float | None) -> None:
        """Fail every wait that would end after ``deadline`` (``time.monotonic()``; ``None``: no deadline)."""
        self._deadline = deadline

    def interrupt(self) -> None:
        """Make every thread blocked on the channel return with an error; the owner still closes it."""
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)

    def shutdown_write(self) -> None:
        """End our direction, then half-close TCP. Receiving goes on.

        TLS ends with close_notify, unless a send failed: the peer must then
        see the data as truncated, not as complete.
        """
        if self._tx_done:
            return
        self._tx_done = True
        if not self._tx_failed:
            self._end_tx()
        self._sock.shutdown(socket.SHUT_WR)

    @abc.abstractmethod
    def _send(self, view: memoryview) -> None:
        """Send all of ``view`` (bytes)."""

    @abc.abstractmethod
    def _sendfile(self, fd: int, offset: int, count: int) -> int:
        """As :meth:`sendfile`."""

    @abc.abstractmethod
    def _end_tx(self) -> None:
        """Tell the peer we are done sending (before the TCP half-close)."""

    def close(self) -> None:
        """End our direction if still open, then close the socket.

        A peer that is gone, or has ended cleanly, cannot be told that we are
        done too: that is no error here (:meth:`shutdown_write` reports it).
        A TLS session is freed with the channel object, so that a thread
        still inside :meth:`recv_into` gets an error, never freed memory.
        """
        try:
            self.shutdown_write()
        except OSError as exc:
            if not self._rx_done and exc.errno not in (errno.EPIPE, errno.ECONNRESET, errno.ENOTCONN):
                raise
        except TlsError:
            if not self._rx_done:
                raise
        finally:
            self._sock.close()
            # A saved receive error's traceback holds a frame with a cffi
            # buffer export; left to the garbage collector that cycle can crash.
            saved = getattr(self, "_rx_error", None)
            if saved is not None:
                saved.__traceback__ = None

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _check_send(self) -> None:
        if self._tx_done:
            raise UsageError("send on a channel after shutdown_write()")
        if self._tx_failed:
            raise UsageError("send on a channel after a failed send: the stream is broken")

    def _wait(self, events: int, timeout: float | None) -> bool:
        """Wait until the socket is ready for ``events``; False when ``timeout`` passes first."""
        poller = select.poll()
        poller.register(self._fd, events)
        return bool(poller.poll(None if timeout is None else max(0, math.ceil(timeout * 1000))))

    def _wait_io(self, events: int) -> None:
        """Wait within the timeout and before the deadline, as a socket operation would."""
        timeout, what = self._timeout, "send" if events & select.POLLOUT else "receive"
        if self._deadline is not None:
            left = self._deadline - time.monotonic()
            if timeout is None or left < timeout:
                if left <= 0 or not self._wait(events, left):
                    raise TimeoutError(f"the deadline passed while waiting to {what}")
                return
        if not self._wait(events, timeout):
            raise TimeoutError(f"timed out after {timeout:g} s waiting to {what}")

    def _socket_send_all(self, view: memoryview) -> None:
        """Plain TCP, or records the kernel makes (kTLS TX)."""
        while view:
            try:
                view = view[self._sock.send(view) :]
            except BlockingIOError:
                self._wait_io(select.POLLOUT)

    def _socket_sendfile(self, fd: int, offset: int, count: int) -> int:
        """``sendfile(2)``: only on plain TCP or a kTLS TX socket, never under userspace TLS."""
        sent = 0
        while sent < count:
            try:
                n = os.sendfile(self._fd, fd, offset + sent, count - sent)
            except BlockingIOError:
                self._wait_io(select.POLLOUT)
                continue
            if n == 0:
                break
            sent += n
        return sent


class PlainChannel(Channel):
    """Mode ``"none"``: plain TCP. A TCP EOF is a clean end (nothing can tell truncation)."""

    @property
    def tx_path(self) -> str:
        return "plain"

    @property
    def rx_path(self) -> str:
        return "plain"

    def describe(self) -> str:
        return "none (plain TCP, unencrypted)"

    def _send(self, view: memoryview) -> None:
        self._socket_send_all(view)

    def recv_into(self, buf: bytearray | memoryview) -> int:
        while True:
            try:
                n = self._sock.recv_into(buf)
            except BlockingIOError:
                self._wait_io(select.POLLIN)
                continue
            self._rx_done = n == 0
            return n

    def _sendfile(self, fd: int, offset: int, count: int) -> int:
        return self._socket_sendfile(fd, offset, count)

    def _end_tx(self) -> None:
        pass


class TlsChannel(Channel):
    """A PSK TLS session; each direction in the kernel (kTLS) or in the TLS library (user space).

    A subclass binds one library: the handshake, records in user space, and
    the key material of each direction for the kernel. The kernel's side
    (receiving records with their type, close_notify, sendfile) is here.
    """

    _library: str  # the library's name, for messages
    _free: Callable[[], object]  # frees the library's session: a weakref.finalize

    def __init__(self, sock: socket.socket, mode: str, *, client: bool, ktls: bool) -> None:
        super().__init__(sock)
        self.mode = mode
        self._suite = _SUITES[mode]
        self._client = client
        self._ktls = ktls
        self._tx_kernel = False
        self._rx_kernel = False
        self._ktls_note = ""
        self._rx_error: Exception | None = None  # raised again by every later recv_into
        self._rx_scratch: memoryview | None = None  # kernel RX: a whole record when the caller's buffer is small
        self._rx_pending = memoryview(b"")

    # what a library provides

    @abc.abstractmethod
    def _client_handshake(self, key: bytes, identity: bytes, timeout: float | None) -> None:
        """Shake hands as the client with ``key`` named ``identity``; HandshakeError on failure."""

    @abc.abstractmethod
    def _server_handshake(self, keys: _ServerKeys, timeout: float | None) -> str:
        """Shake hands as the server, keys from ``keys``; the client's identity."""

    @abc.abstractmethod
    def _library_ktls(self) -> tuple[bool, bool]:
        """Whether the library itself put TX, and RX, in the kernel during the handshake."""

    @abc.abstractmethod
    def _crypto_info(self, *, read: bool) -> bytes:
        """``struct tls12_crypto_info_aes_gcm_{128,256}`` for one direction (see :meth:`_pack_crypto_info`)."""

    @abc.abstractmethod
    def _user_pending(self) -> bool:
        """Whether received records wait in the library (then RX cannot move to the kernel)."""

    @abc.abstractmethod
    def _user_send_all(self, view: memoryview) -> None:
        """Send all of ``view`` through the library."""

    @abc.abstractmethod
    def _user_recv_into(self, view: memoryview) -> int:
        """As many records as are there through the library, without waiting once something came."""

    @abc.abstractmethod
    def _user_end_tx(self) -> None:
        """close_notify through the library."""

    @abc.abstractmethod
    def _alert_name(self, alert: int) -> str:
        """The name of TLS alert ``alert``."""

    # handshake and hand-off

    def _wait_handshake(self, events: int, deadline: float | None, timeout: float | None) -> None:
        """Wait for the socket during the handshake, until ``deadline`` (``time.monotonic``)."""
        left = None if deadline is None else deadline - time.monotonic()
        if (left is not None and left <= 0) or not self._wait(events, left):
            raise self._timed_out(timeout)

    def _timed_out(self, timeout: float | None) -> HandshakeError:
        return HandshakeError(f"TLS handshake timed out after {timeout:.3g} s ({self._hint(_NOT_TLS)})", _NOT_TLS)

    def _hint(self, cause: TlsCause | None) -> str:
        if cause == _KEY:
            return "wrong key or identity?"
        if cause == _MODE:
            return f"does the peer use {self.mode} too?"
        if cause == _IDENTITY_OR_MODE:
            return f"unknown identity, or does the peer not use {self.mode}?"
        if cause == _KEY_OR_MODE:
            return f"wrong key or identity, or does the peer not use {self.mode}?"
        if cause == _NOT_TLS:
            return "does the peer speak TLS?"
        return f"does the peer speak TLS, in {self.mode}, with the same key and identity?"

    def _offload(self) -> None:
        """Hand each direction to the kernel where it takes it; the rest stays in the library."""
        if not self._ktls:
            self._ktls_note = "kTLS off"
            return
        self._tx_kernel, self._rx_kernel = self._library_ktls()
        if not (self._tx_kernel or self._rx_kernel):
            try:
                self._sock.setsockopt(socket.IPPROTO_TCP, TCP_ULP, b"tls")
            except OSError as exc:
                self._ktls_note = f"no kTLS: TCP_ULP tls: {exc.strerror}"
                return
        notes = []
        if not self._tx_kernel:
            try:
                self._sock.setsockopt(SOL_TLS, TLS_TX, self._crypto_info(read=False))
                self._tx_kernel = True
            except OSError as exc:
                notes.append(f"kTLS TX: {exc.strerror}")
        if self._rx_kernel:
            pass
        elif self._user_pending():
            notes.append(f"kTLS RX: records already buffered in {self._library}")
        else:
            try:
                self._sock.setsockopt(SOL_TLS, TLS_RX, self._crypto_info(read=True))
                self._rx_kernel = True
            except OSError as exc:
                notes.append(f"kTLS RX: {exc.strerror}")
        self._ktls_note = "; ".join(notes)

    def _pack_crypto_info(self, key: bytes, salt: bytes, explicit: bytes, seq: bytes) -> bytes:
        """The kernel's crypto_info: the 4-byte salt and 8-byte explicit IV, the key, the next sequence number."""
        suite = self._suite
        if len(salt) != 4 or len(explicit) != 8 or len(key) != suite.key_size:
            sizes = f"IV {len(salt + explicit)}, key {len(key)} bytes"
            raise OSError(errno.EINVAL, f"unexpected {self._library} key material ({sizes})")
        return struct.pack(
            f"=HH8s{suite.key_size}s4s8s", suite.wire_version, suite.kernel_cipher, explicit, key, salt, seq
        )

    def _abort(self) -> None:
        """Give up after a failed set-up: free the session, close the socket."""
        self._free()
        self._sock.close()

    # the channel

    @property
    def tx_path(self) -> str:
        return "kernel" if self._tx_kernel else "userspace"

    @property
    def rx_path(self) -> str:
        return "kernel" if self._rx_kernel else "userspace"

    def describe(self) -> str:
        note = f" ({self._ktls_note})" if self._ktls_note else ""
        return f"{self.mode}, TX {self.tx_path}, RX {self.rx_path}{note}"

    def _send(self, view: memoryview) -> None:
        if self._tx_kernel:
            self._socket_send_all(view)
        else:
            self._user_send_all(view)

    def recv_into(self, buf: bytearray | memoryview) -> int:
        if self._rx_error is not None:
            raise self._rx_error
        if self._rx_done:
            return 0
        with memoryview(buf) as view:
            view = view.cast("B")
            if not view:
                raise UsageError("recv_into() needs a non-empty buffer")
            return self._kernel_recv_into(view) if self._rx_kernel else self._user_recv_into(view)

    def _kernel_recv_into(self, view: memoryview) -> int:
        """recvmsg on a kTLS RX socket: data records, or one whole non-data record with its type in a cmsg."""
        if self._rx_pending:
            n = min(len(self._rx_pending), len(view))
            view[:n] = self._rx_pending[:n]
            self._rx_pending = self._rx_pending[n:]
            return n
        target = view
        if len(view) < _MAX_RECORD:
            if self._rx_scratch is None:
                self._rx_scratch = memoryview(bytearray(_MAX_RECORD))
            target = self._rx_scratch
        while True:
            try:
                n, ancdata, _, _ = self._sock.recvmsg_into([target], _CMSG_SPACE)
            except BlockingIOError:
                self._wait_io(select.POLLIN)
                continue
            except OSError as exc:
                self._fail_rx(self._kernel_rx_error(exc))
            kind = _APPLICATION_DATA
            for level, ctype, cdata in ancdata:
                if level == SOL_TLS and ctype == TLS_GET_RECORD_TYPE:
                    kind = cdata[0]
            if kind == _APPLICATION_DATA:
                if n == 0 and not ancdata:
                    self._fail_rx(TruncationError(_TRUNCATED))
                if n == 0:
                    continue  # an empty record
                if target is view:
                    return n
                self._rx_pending = target[:n]
                return self._kernel_recv_into(view)
            if self._control_record(kind, bytes(target[:n])):
                return 0

    def _control_record(self, kind: int, record: bytes) -> bool:
        """Act on a non-data record from the kernel: True at close_notify; raise on anything we cannot follow."""
        if kind == _ALERT and len(record) == 2:
            level, alert = record
            if alert == 0:
                self._rx_done = True
                return True
            if level == 1:  # a warning (user_canceled): close_notify follows
                return False
            self._fail_rx(
                TlsError(f"TLS receive failed: the peer sent alert {alert} ({self._alert_name(alert)})", TlsCause.ALERT)
            )
        if kind == _HANDSHAKE:
            pos = 0
            while pos + 4 <= len(record):
                message, length = record[pos], int.from_bytes(record[pos + 1 : pos + 4], "big")
                if message == _KEY_UPDATE:
                    self._fail_rx(
                        TlsError(
                            "the peer sent a TLS 1.3 KeyUpdate, which this kernel's TLS receive path cannot follow; "
                            "run the receiver with SENDSTREAM_NO_KTLS=1"
                        )
                    )
                if message != _NEW_SESSION_TICKET:  # a ticket is harmless: we never resume
                    break
                pos += 4 + length
            if pos == len(record):
                return False
        self._fail_rx(TlsError(f"unexpected TLS record of type {kind} ({len(record)} bytes) after the handshake"))

    def _fail_rx(self, error: Exception) -> NoReturn:
        self._rx_error = error
        raise error

    def _at_eof(self) -> bool:
        try:
            return self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except ConnectionResetError:
            return True
        except OSError:
            return False

    def _kernel_rx_error(self, exc: OSError) -> TlsError:
        if exc.errno in (errno.ECONNRESET, errno.EPIPE):
            return TruncationError(_TRUNCATED)
        if exc.errno == errno.EBADMSG:
            return TlsError(
                "a TLS record failed authentication in the kernel (corrupted or forged data)", TlsCause.AUTHENTICATION
            )
        return TlsError(f"TLS receive failed in the kernel: {exc.strerror}")

    def _sendfile(self, fd: int, offset: int, count: int) -> int:
        if self._tx_kernel:
            return self._socket_sendfile(fd, offset, count)
        buf = memoryview(bytearray(min(count, _SENDFILE_CHUNK)))
        sent = 0
        while sent < count:
            n = os.preadv(fd, [buf[: min(len(buf), count - sent)]], offset + sent)
            if n == 0:
                break
            self._user_send_all(buf[:n])
            sent += n
        return sent

    def _end_tx(self) -> None:
        if not self._tx_kernel:
            self._user_end_tx()
            return
        # Only on a socket whose TX is confirmed in the kernel: plain TCP would send the alert in clear.
        while True:
            try:
                self._sock.sendmsg([_CLOSE_NOTIFY], [(SOL_TLS, TLS_SET_RECORD_TYPE, bytes([_ALERT]))])
                return
            except BlockingIOError:
                self._wait_io(select.POLLOUT)


def _free_session(gnutls: _GnuTLS, session: Any, credentials: Any, client: bool) -> None:
    gnutls.lib.gnutls_deinit(session)
    if client:
        gnutls.lib.gnutls_psk_free_client_credentials(credentials)
    else:
        gnutls.lib.gnutls_psk_free_server_credentials(credentials)


class GnuTlsChannel(TlsChannel):
    """:class:`TlsChannel` through GnuTLS: every mode but ``tls13-aes256-gcm`` (see :func:`why_unavailable`)."""

    _library = "GnuTLS"

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

    def _server_handshake(self, keys: _ServerKeys, timeout: float | None) -> str:
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
            what, cause = f"the peer sent alert {alert} ({self._alert_name(alert)})", _ALERT_CAUSES.get(alert)
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
        ptr = ffi.from_buffer(view)
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
        ptr = ffi.from_buffer(view, require_writable=True)
        got = 0
        while got < size:
            ret = lib.gnutls_record_recv(self._session, ptr + got, size - got)
            if ret > 0:
                got += ret
            elif ret == 0:
                self._rx_done = True
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
            return TruncationError(_TRUNCATED)
        if ret == _E_UNEXPECTED_PACKET_LENGTH and self._at_eof():  # the connection ended inside a record
            return TruncationError(_TRUNCATED)
        if ret in (_E_PUSH_ERROR, _E_PULL_ERROR) and err:
            return OSError(err, f"TLS {what} failed: {os.strerror(err)}")
        if ret == _E_FATAL_ALERT_RECEIVED:
            alert = self._gnutls.lib.gnutls_alert_get(self._session)
            name = self._alert_name(alert)
            return TlsError(f"TLS {what} failed: the peer sent alert {alert} ({name})", TlsCause.ALERT)
        return TlsError(f"TLS {what} failed: {self._gnutls.strerror(ret)}")


def _check_mode(mode: str) -> None:
    reason = why_unavailable(mode)
    if reason and mode not in MODES:
        raise UsageError(reason)
    if reason:
        raise TlsError(reason, TlsCause.SETUP)


def _ktls_wanted(ktls: bool | None) -> bool:
    return os.environ.get("SENDSTREAM_NO_KTLS", "") in ("", "0") if ktls is None else ktls


def _new_channel(sock: socket.socket, mode: str, *, client: bool, ktls: bool | None) -> TlsChannel:
    """The channel of the library that does ``mode``; it owns ``sock`` from here on."""
    try:
        if mode in _OPENSSL_MODES:
            from .openssl import OpenSslChannel

            return OpenSslChannel(sock, mode, client=client, ktls=_ktls_wanted(ktls))
        return GnuTlsChannel(sock, mode, client=client, ktls=_ktls_wanted(ktls))
    except BaseException:
        sock.close()
        raise


def connect_channel(
    sock: socket.socket,
    mode: str,
    key: bytes | None,
    identity: str,
    *,
    handshake_timeout: float | None = HANDSHAKE_TIMEOUT,
    ktls: bool | None = None,
) -> Channel:
    """The client end over connected ``sock``: a finished handshake, kTLS where the kernel takes it.

    ``ktls`` None means: unless ``SENDSTREAM_NO_KTLS=1``. Once the arguments
    are checked, the channel owns ``sock``, and closes it if the handshake fails.
    """
    if mode == "none":
        return PlainChannel(sock)
    _check_mode(mode)
    if not key:
        raise UsageError(f"TLS mode {mode} needs a key")
    raw_identity = identity.encode("utf-8")
    if not 0 < len(raw_identity) <= MAX_IDENTITY or b"\0" in raw_identity:
        raise UsageError(f"the PSK identity must be 1 to {MAX_IDENTITY} bytes of UTF-8 without NUL: {identity!r}")
    channel = _new_channel(sock, mode, client=True, ktls=ktls)
    try:
        channel._client_handshake(key, raw_identity, handshake_timeout)
        channel.identity = identity
        channel._offload()
    except BaseException:
        channel._abort()
        raise
    return channel


def accept_channel(
    sock: socket.socket,
    mode: str,
    keys: Callable[[str], bytes | None] | bytes | None,
    *,
    handshake_timeout: float | None = HANDSHAKE_TIMEOUT,
    ktls: bool | None = None,
) -> Channel:
    """The server end over accepted ``sock``; ``keys`` maps the client's identity to its key (None: unknown).

    A single ``bytes`` key serves any identity. Otherwise as :func:`connect_channel`.
    """
    if mode == "none":
        return PlainChannel(sock)
    _check_mode(mode)
    if keys is None:
        raise UsageError(f"TLS mode {mode} needs a key")
    server_keys = _ServerKeys(keys)
    channel = _new_channel(sock, mode, client=False, ktls=ktls)
    try:
        try:
            channel.identity = channel._server_handshake(server_keys, handshake_timeout)
        except HandshakeError as exc:
            if server_keys.error is not None:
                raise server_keys.error from exc
            if server_keys.unknown is not None:
                raise HandshakeError(
                    f"TLS handshake failed: unknown PSK identity {server_keys.unknown!r}", TlsCause.KEY
                ) from exc
            raise
        channel._offload()
    except BaseException:
        channel._abort()
        raise
    return channel
