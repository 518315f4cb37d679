"""The TLS layer of the network transport: PSK sessions by GnuTLS or OpenSSL, records by the kernel when it can.

A :class:`Channel` is a byte stream over a connected TCP socket, handed out
by :func:`connect_channel` and :func:`accept_channel`. Mode ``"none"`` is
plain TCP. The TLS modes shake hands with a pre-shared key in GnuTLS, except
``tls13-aes256-gcm``, which OpenSSL does (both through small cffi bindings in
ABI mode: no compiler needed). Then each direction's record layer is offered
to the kernel (kTLS). A direction the kernel refuses (no ``tls`` module, a
cipher it lacks, records already buffered in the library) stays in the
library. Each direction uses exactly one path: once TX is in the kernel, the
library is only asked to receive, which never makes it write here (no session
tickets, no automatic key update, no renegotiation); once RX is, it only
sends, which never reads. ``SENDSTREAM_NO_KTLS=1`` keeps both directions in
the library.

Facts this relies on (GnuTLS 3.7.9, OpenSSL 3.0, Linux 6.1; see ``TRANSPORT.md``):

- GnuTLS 3.7 binds external PSKs to SHA-256, so TLS 1.3 with AES-256-GCM
  (SHA-384 binders) is OpenSSL's: an external PSK there is an
  ``SSL_SESSION`` of that suite. OpenSSL's ``-psk`` options and stunnel (the
  legacy PSK callbacks) bind to SHA-256 too, so of the usual peers only
  ``openssl s_server``/``s_client -psk_session`` speak this mode.
  :func:`why_unavailable` says when a library is missing.
- A kernel RX socket returns non-data records with their type in a cmsg;
  a record of at most 16 KiB fits whole into a buffer of that size.
- A TLS 1.3 KeyUpdate cannot be followed by kernels before ~6.14 (RX keys
  are set once), so ours never sends one, and a peer's KeyUpdate on a
  kernel RX socket is a clear error.

The modules, bottom to top: ``keys`` (key files, passwords, identities),
``suites`` (the modes), ``channel`` (the channel, its layers' base, and plain TCP), ``binding``
(loading a library once), ``kernel`` (kTLS under the base of the TLS
channels), ``gnutls`` and ``openssl`` (a library each), ``connect`` (the
two ends, and which library does a mode).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .suites import DEFAULT_MODE, MODES

if TYPE_CHECKING:
    from .channel import Channel, PlainChannel
    from .connect import accept_channel, connect_channel, why_unavailable
    from .keys import derive_key, load_key

# The rest loads on first use: a command that never opens a connection (verify, dump) does not pay
# for sockets, the channels and cffi (~10 ms of start-up, docs/contributing/benchmarks.md).
_WHERE = {
    "Channel": "channel",
    "PlainChannel": "channel",
    "accept_channel": "connect",
    "connect_channel": "connect",
    "why_unavailable": "connect",
    "derive_key": "keys",
    "load_key": "keys",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)


__all__ = [
    "DEFAULT_MODE",
    "MODES",
    "Channel",
    "PlainChannel",
    "accept_channel",
    "connect_channel",
    "derive_key",
    "load_key",
    "why_unavailable",
]
