"""The kernel's TLS (kTLS) under a :class:`TlsChannel`: each direction goes to the kernel where it takes it.

:class:`TlsChannel` is the base both libraries share: after the library's
handshake it offers each direction's keys to the kernel (``TCP_ULP "tls"``,
then ``TLS_TX`` and ``TLS_RX``), sends and receives through the kernel or
the library, sends close_notify and files (``sendfile``) through the kernel.
:class:`KernelReceiver` reads a kTLS RX socket: data records, and the
non-data records the kernel hands out with their type.
"""

from __future__ import annotations

import abc
import errno
import select
import socket
import struct
import time
from collections.abc import Callable
from typing import Final

from ...errors import HandshakeError, PeerBusy, TlsCause, TlsError, TruncationError, UsageError
from .channel import SocketChannel, read_and_send
from .keys import ServerKeys, fingerprint
from .suites import SUITES

# The kernel's TLS interface (linux/tls.h, linux/tcp.h); Python 3.11's socket module has none of these.
SOL_TLS: Final = 282
TCP_ULP: Final = 31
TLS_TX: Final = 1
TLS_RX: Final = 2
TLS_SET_RECORD_TYPE: Final = 1
TLS_GET_RECORD_TYPE: Final = 2
_ALERT, _HANDSHAKE, _APPLICATION_DATA = 21, 22, 23
_CLOSE_NOTIFY = b"\x01\x00"  # level warning, description close_notify
_NEW_SESSION_TICKET, _KEY_UPDATE = 4, 24
_CMSG_SPACE = socket.CMSG_SPACE(1)
_MAX_RECORD = 1 << 14  # TLS plaintext limit: a kernel read of this size holds any whole record

TRUNCATED: Final = "the connection ended without a TLS close_notify: the data may be truncated"
# What a failed handshake most likely means by the alert the peer sent, whichever library reports it.
ALERT_CAUSES: Final = {
    20: TlsCause.KEY,  # bad_record_mac
    47: TlsCause.KEY,  # illegal_parameter
    51: TlsCause.KEY,  # decrypt_error
    115: TlsCause.KEY,  # unknown_psk_identity
    # handshake_failure: OpenSSL's answer to an unknown TLS 1.3 identity, and GnuTLS's to a cipher it lacks
    40: TlsCause.IDENTITY_OR_MODE,
    70: TlsCause.MODE,  # protocol_version
    71: TlsCause.MODE,  # insufficient_security
    80: TlsCause.BUSY,  # internal_error: what sendstream serve answers a handshake it has no room for
}
# A plaintext fatal internal_error alert: what a TLS client can read before the handshake, and ours takes as busy.
BUSY_ALERT: Final = bytes((_ALERT, 3, 3, 0, 2, 2, 80))


def opens_handshake(first: bytes) -> bool:
    """Whether a peer's ``first`` bytes open a TLS handshake (every TLS ClientHello does; a session
    hello or a btrfs stream never does)."""
    return first[:1] == bytes((_HANDSHAKE,))


class KernelReceiver:
    """``recvmsg`` on a kTLS RX socket: data records, or one whole non-data record with its type in a cmsg.

    A record holds at most 16 KiB: a smaller buffer of the caller's is
    filled from a whole record read into a scratch buffer. The channel's
    methods come with each call (holding them here would make a cycle that
    keeps the channel, and its TLS session, alive until the next collection).
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._scratch: memoryview | None = None
        self._pending = memoryview(b"")

    def recv_into(self, view: memoryview, wait_io: Callable[[int], None], said_alert: Callable[[int], str]) -> int:
        """Data into ``view``; 0 at the peer's close_notify; TlsError for what the stream cannot go on after.

        ``wait_io`` waits for the socket as the channel does; ``said_alert`` names a peer's alert in a message.
        """
        if self._pending:
            n = min(len(self._pending), len(view))
            view[:n] = self._pending[:n]
            self._pending = self._pending[n:]
            return n
        target = view
        if len(view) < _MAX_RECORD:
            if self._scratch is None:
                self._scratch = memoryview(bytearray(_MAX_RECORD))
            target = self._scratch
        while True:
            try:
                n, ancdata, _, _ = self._sock.recvmsg_into([target], _CMSG_SPACE)
            except BlockingIOError:
                wait_io(select.POLLIN)
                continue
            except OSError as exc:
                raise _receive_error(exc) from exc
            kind = _APPLICATION_DATA
            for level, ctype, cdata in ancdata:
                if level == SOL_TLS and ctype == TLS_GET_RECORD_TYPE:
                    kind = cdata[0]
            if kind == _APPLICATION_DATA:
                if n == 0 and not ancdata:
                    raise TruncationError(TRUNCATED)
                if n == 0:
                    continue  # an empty record
                if target is view:
                    return n
                self._pending = target[:n]
                return self.recv_into(view, wait_io, said_alert)
            if _control_record(kind, bytes(target[:n]), said_alert):
                return 0


def _control_record(kind: int, record: bytes, said_alert: Callable[[int], str]) -> bool:
    """Act on a non-data record: True at close_notify, False to go on; raise on anything we cannot follow."""
    if kind == _ALERT and len(record) == 2:
        level, alert = record
        if alert == 0:
            return True
        if level == 1:  # a warning (user_canceled): close_notify follows
            return False
        raise TlsError(f"TLS receive failed: {said_alert(alert)}", TlsCause.ALERT)
    if kind == _HANDSHAKE:
        pos = 0
        while pos + 4 <= len(record):
            message, length = record[pos], int.from_bytes(record[pos + 1 : pos + 4], "big")
            if message == _KEY_UPDATE:
                raise TlsError(
                    "the peer sent a TLS 1.3 KeyUpdate, which this kernel's TLS receive path cannot follow; "
                    "run the receiver with SENDSTREAM_NO_KTLS=1"
                )
            if message != _NEW_SESSION_TICKET:  # a ticket is harmless: we never resume
                break
            pos += 4 + length
        if pos == len(record):
            return False
    raise TlsError(f"unexpected TLS record of type {kind} ({len(record)} bytes) after the handshake")


def _receive_error(exc: OSError) -> TlsError:
    if exc.errno in (errno.ECONNRESET, errno.EPIPE):
        return TruncationError(TRUNCATED)
    if exc.errno == errno.EBADMSG:
        return TlsError(
            "a TLS record failed authentication in the kernel (corrupted or forged data)", TlsCause.AUTHENTICATION
        )
    return TlsError(f"TLS receive failed in the kernel: {exc.strerror}")


class TlsChannel(SocketChannel):
    """A PSK TLS session; each direction in the kernel (kTLS) or in the TLS library (user space).

    A subclass binds one library: the handshake, records in user space, and
    the key material of each direction for the kernel. The kernel's side
    (offload, receiving records with their type, close_notify, sendfile) is
    here, and so is what a failed handshake's message suggests to check.
    """

    _library: str  # the library's name, for messages
    _free: Callable[[], object]  # frees the library's session: a weakref.finalize

    def __init__(self, sock: socket.socket, mode: str, *, client: bool, ktls: bool) -> None:
        super().__init__(sock)
        self.mode = mode
        self._suite = SUITES[mode]
        self._client = client
        self._ktls = ktls
        self._tx_kernel = False
        self._rx_kernel = False
        self._ktls_note = ""
        self._rx_error: Exception | None = None  # raised again by every later recv_into
        self._kernel_rx = KernelReceiver(sock)

    @classmethod
    @abc.abstractmethod
    def why_unavailable(cls, mode: str) -> str | None:
        """Why the library cannot do ``mode`` here, or None."""

    # what a library provides

    @abc.abstractmethod
    def _client_handshake(self, key: bytes, identity: bytes, timeout: float | None) -> None:
        """Shake hands as the client with ``key`` named ``identity``; HandshakeError on failure."""

    @abc.abstractmethod
    def _server_handshake(self, keys: ServerKeys, timeout: float | None) -> str:
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

    def start_client(self, key: bytes, identity: bytes, timeout: float | None) -> None:
        """Shake hands as the client, then offload; on failure, free the session and close the socket."""
        try:
            try:
                self._client_handshake(key, identity, timeout)
            except HandshakeError as exc:
                if exc.cause is TlsCause.BUSY:
                    raise PeerBusy(
                        "the receiver is busy: it refused the connection (TLS alert 80, internal_error, which "
                        "sendstream serve sends when it has no room for one more); try again later"
                    ) from exc
                raise self._name_key(exc, key, identity.decode("utf-8", "backslashreplace")) from exc
            self.identity = identity.decode("utf-8")
            self._offload()
        except BaseException:
            self._abort()
            raise

    def start_server(self, keys: ServerKeys, timeout: float | None) -> None:
        """Shake hands as the server, then offload; on failure, free the session and close the socket."""
        try:
            try:
                self.identity = self._server_handshake(keys, timeout)
            except HandshakeError as exc:
                failure = keys.lookup_failure()
                if failure is None and keys.found is not None:
                    failure = self._name_key(exc, keys.found[1], keys.found[0])
                if failure is None or failure is exc:
                    raise
                raise failure from exc
            self._offload()
        except BaseException:
            self._abort()
            raise

    def _wait_handshake(self, events: int, deadline: float | None, timeout: float | None) -> None:
        """Wait for the socket during the handshake, until ``deadline`` (``time.monotonic``)."""
        left = None if deadline is None else deadline - time.monotonic()
        if (left is not None and left <= 0) or not self._wait(events, left):
            raise self._timed_out(timeout)

    def _timed_out(self, timeout: float | None) -> HandshakeError:
        cause = TlsCause.NOT_TLS
        return HandshakeError(f"TLS handshake timed out after {timeout:.3g} s ({self._hint(cause)})", cause)

    def _name_key(self, exc: HandshakeError, key: bytes, identity: str) -> HandshakeError:
        """A handshake that failed on the key, told as such with the local key's fingerprint
        (which both ends can compare), instead of the alert that said so."""
        if exc.cause not in (TlsCause.KEY, TlsCause.KEY_OR_MODE):
            return exc
        mode = f", or the peer does not use {self.mode}" if exc.cause is TlsCause.KEY_OR_MODE else ""
        return HandshakeError(
            f"TLS handshake failed: wrong key or identity{mode} (local fingerprint {fingerprint(key)}, "
            f"identity {identity!r}; compare `sendstream key fingerprint FILE` on both ends)",
            exc.cause,
        )

    def _hint(self, cause: TlsCause | None) -> str:
        """What to check, for the message of a failed handshake."""
        if cause == TlsCause.KEY:
            return "wrong key or identity?"
        if cause == TlsCause.MODE:
            return f"does the peer use {self.mode} too?"
        if cause == TlsCause.IDENTITY_OR_MODE:
            return f"unknown identity, or does the peer not use {self.mode}?"
        if cause == TlsCause.KEY_OR_MODE:
            return f"wrong key or identity, or does the peer not use {self.mode}?"
        if cause == TlsCause.NOT_TLS:
            return "does the peer speak TLS?"
        return f"does the peer speak TLS, in {self.mode}, with the same key and identity?"

    def _said_alert(self, alert: int) -> str:
        return f"the peer sent alert {alert} ({self._alert_name(alert)})"

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

    def write(self, view: memoryview) -> None:
        if self._tx_kernel:
            self._socket_send_all(view)
        else:
            self._user_send_all(view)

    def recv_into(self, buf: bytearray | memoryview) -> int:
        if self._rx_error is not None:
            raise self._rx_error
        if self.ends.rx_done:
            return 0
        with memoryview(buf) as view:
            view = view.cast("B")
            if not view:
                raise UsageError("recv_into() needs a non-empty buffer")
            if not self._rx_kernel:
                return self._user_recv_into(view)
            try:
                n = self._kernel_rx.recv_into(view, self._wait_io, self._said_alert)
            except TlsError as exc:
                self._rx_error = exc
                raise
            self.ends.rx_done = n == 0
            return n

    def write_file(self, fd: int, offset: int, count: int) -> int:
        if self._tx_kernel:
            return self._socket_sendfile(fd, offset, count)
        return read_and_send(fd, offset, count, self._user_send_all)

    def end_tx(self) -> None:
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
