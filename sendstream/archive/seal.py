"""Encryption at rest: each part sealed with AES-256-GCM before it leaves, opened and checked on the way back.

A sealed part is a random 96-bit nonce, then the ciphertext and its 16-byte
tag. The associated data binds it to its stream and its place in it
(``sendstream-archive-1``, the stream's name, the part's number among all
its parts), so parts cannot be swapped, moved between streams, or dropped
from the middle without the open failing. The key is a 32-byte key file
(``sendstream key new FILE``); the manifest names the cipher and the key's
fingerprint, never the key. What a manifest of a sealed stream shows: its
identity (UUIDs, ctransids), sizes, SHA-256 and ledger of the clean stream;
not the snapshot's name, and nothing of the content.
"""

from __future__ import annotations

import os
from typing import Any

from .. import errors as e
from ..net.tls.keys import fingerprint

CIPHER = "AES-256-GCM"
NONCE = 12
SEAL_OVERHEAD = NONCE + 16


class Sealer:
    """Seals and opens the parts of streams with one 32-byte key."""

    def __init__(self, key: bytes) -> None:
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ImportError:
            raise e.UsageError("encryption needs cryptography: pip install 'sendstream[s3]'") from None
        if len(key) != 32:
            raise e.UsageError(f"an encryption key is 32 bytes (sendstream key new FILE makes one), not {len(key)}")
        self._aead = AESGCM(key)
        self.key = key  # for a process of its own to make its sealer from
        self.fingerprint = fingerprint(key)

    @property
    def description(self) -> dict[str, Any]:
        return {"cipher": CIPHER, "key": self.fingerprint}

    def seal(self, part: Any, name: str, index: int) -> bytes:
        nonce = os.urandom(NONCE)
        return nonce + self._aead.encrypt(nonce, bytes(part), _bound(name, index))

    def open(self, sealed: bytes, name: str, index: int, offset: int) -> bytes:
        """The content of part ``index`` of stream ``name`` (stream offset ``offset``), checked."""
        from cryptography.exceptions import InvalidTag

        try:
            return bytes(self._aead.decrypt(sealed[:NONCE], sealed[NONCE:], _bound(name, index)))
        except InvalidTag:
            raise e.ManifestMismatch(
                f"part {index} does not open: damaged, moved, or sealed with another key",
                offset=offset,
                expected=f"a part sealed with key {self.fingerprint}",
            ) from None


def _bound(name: str, index: int) -> bytes:
    return f"sendstream-archive-1 {name} {index}".encode()
