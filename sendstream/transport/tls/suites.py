"""The TLS modes: what GnuTLS and the kernel are told for each, and which library does which."""

from __future__ import annotations

from typing import Final, NamedTuple

MODES: Final = ("none", "tls12-aes128-gcm", "tls12-aes256-gcm", "tls13-aes128-gcm", "tls13-aes256-gcm")
DEFAULT_MODE: Final = "tls13-aes128-gcm"

# TLS_AES_256_GCM_SHA384 binds an external PSK to SHA-384, which GnuTLS 3.7 cannot do: OpenSSL does this mode.
OPENSSL_MODES: Final = frozenset({"tls13-aes256-gcm"})

# gnutls.h
_GNUTLS_TLS1_2, _GNUTLS_TLS1_3 = 4, 5
_GNUTLS_AES_128_GCM, _GNUTLS_AES_256_GCM = 10, 11
# linux/tls.h
_KERNEL_AES_GCM_128, _KERNEL_AES_GCM_256 = 51, 52


class Suite(NamedTuple):
    """One TLS mode: what GnuTLS is told, and what the kernel is told."""

    priority: str
    version: int  # GnuTLS protocol number
    cipher: int  # GnuTLS cipher number
    wire_version: int
    kernel_cipher: int
    key_size: int

    @property
    def tls13(self) -> bool:
        return self.version == _GNUTLS_TLS1_3


def _priority(version: str, cipher: str) -> str:
    kx = "+ECDHE-PSK:+PSK" if version == "TLS1.3" else "+PSK"  # OpenSSL TLS 1.3 servers need psk_dhe_ke
    return f"NORMAL:-VERS-ALL:+VERS-{version}:-KX-ALL:{kx}:-CIPHER-ALL:+{cipher}"


SUITES: Final = {
    "tls12-aes128-gcm": Suite(
        _priority("TLS1.2", "AES-128-GCM"),
        _GNUTLS_TLS1_2,
        _GNUTLS_AES_128_GCM,
        0x0303,
        _KERNEL_AES_GCM_128,
        16,
    ),
    "tls12-aes256-gcm": Suite(
        _priority("TLS1.2", "AES-256-GCM"),
        _GNUTLS_TLS1_2,
        _GNUTLS_AES_256_GCM,
        0x0303,
        _KERNEL_AES_GCM_256,
        32,
    ),
    "tls13-aes128-gcm": Suite(
        _priority("TLS1.3", "AES-128-GCM"),
        _GNUTLS_TLS1_3,
        _GNUTLS_AES_128_GCM,
        0x0304,
        _KERNEL_AES_GCM_128,
        16,
    ),
    "tls13-aes256-gcm": Suite(
        _priority("TLS1.3", "AES-256-GCM"),
        _GNUTLS_TLS1_3,
        _GNUTLS_AES_256_GCM,
        0x0304,
        _KERNEL_AES_GCM_256,
        32,
    ),
}
