"""The two ends of a channel, `connect_channel` and `accept_channel`: the one place that picks the library."""

from __future__ import annotations

import os
import socket
from collections.abc import Callable
from typing import Final

from ...errors import TlsCause, TlsError, UsageError
from .channel import Channel, PlainChannel
from .kernel import TlsChannel
from .keys import ServerKeys, encode_identity
from .suites import MODES, OPENSSL_MODES

HANDSHAKE_TIMEOUT: Final = 30.0


def _library(mode: str) -> type[TlsChannel]:
    """The channel of the library that does TLS mode ``mode``.

    A library's module loads here, on first use, with cffi: plain TCP, and
    the commands that make no connection, never load it.
    """
    if mode in OPENSSL_MODES:
        from .openssl import OpenSslChannel

        return OpenSslChannel
    from .gnutls import GnuTlsChannel

    return GnuTlsChannel


def why_unavailable(mode: str) -> str | None:
    """Why ``mode`` cannot be used on this system, or None when it can."""
    if mode not in MODES:
        return f"unknown TLS mode {mode!r}; choose one of {', '.join(MODES)}"
    if mode == "none":
        return None
    return _library(mode).why_unavailable(mode)


def _check_mode(mode: str) -> None:
    reason = why_unavailable(mode)
    if reason and mode not in MODES:
        raise UsageError(reason)
    if reason:
        raise TlsError(reason, TlsCause.SETUP)


def _new_channel(sock: socket.socket, mode: str, *, client: bool, ktls: bool | None) -> TlsChannel:
    """The channel of the library that does ``mode``; it owns ``sock`` from here on.

    ``ktls`` None means: unless ``SENDSTREAM_NO_KTLS=1``.
    """
    if ktls is None:
        ktls = os.environ.get("SENDSTREAM_NO_KTLS", "") in ("", "0")
    try:
        return _library(mode)(sock, mode, client=client, ktls=ktls)
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
    raw_identity = encode_identity(identity)
    channel = _new_channel(sock, mode, client=True, ktls=ktls)
    channel.start_client(key, raw_identity, handshake_timeout)
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
    channel = _new_channel(sock, mode, client=False, ktls=ktls)
    channel.start_server(ServerKeys(keys), handshake_timeout)
    return channel
