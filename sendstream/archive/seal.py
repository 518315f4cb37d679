"""Encryption at rest: each part sealed with AES-256-GCM before it leaves, opened and checked on the way back.

A part is sealed in segments of :data:`SEGMENT` bytes (the last one
shorter), each a random 96-bit nonce, then the ciphertext and its 16-byte
tag; so a reader opens and checks one segment at a time, whatever the size
of the part. The associated data binds each segment to its stream and its
place in it (``sendstream-archive-2``, the stream's name, the part's number
among all its parts, the segment's number in the part), so segments cannot
be swapped, moved between streams, or dropped from the middle without the
open failing. The key is a 32-byte key file
(``sendstream key new FILE``); the manifest names the cipher and the key's
fingerprint, never the key. What a manifest of a sealed stream shows: its
identity (UUIDs, ctransids), sizes, SHA-256 and ledger of the clean stream;
not the snapshot's name, and nothing of the content.
"""

from __future__ import annotations

import os
from typing import Any

from .. import errors as e
from ..transport.tls.keys import fingerprint

CIPHER = "AES-256-GCM"
NONCE = 12
SEAL_OVERHEAD = NONCE + 16  # of each segment
SEGMENT = 8 << 20  # bytes of a part sealed together
SEALED_SEGMENT = SEGMENT + SEAL_OVERHEAD


def sealed_size(size: int) -> int:
    """The size of a part of ``size`` bytes (at least 1) once sealed."""
    return size + SEAL_OVERHEAD * -(-size // SEGMENT)


def segment_count(sealed: int) -> int:
    """How many segments a sealed part of ``sealed`` bytes holds; ValueError when no part seals to that size."""
    whole, rest = divmod(sealed, SEALED_SEGMENT)
    if 0 < rest <= SEAL_OVERHEAD or sealed == 0:
        raise ValueError(f"no part seals to {sealed} bytes")
    return whole + (rest > 0)


def opened_size(sealed: int) -> int:
    """The size of a sealed part of ``sealed`` bytes once opened."""
    return sealed - SEAL_OVERHEAD * segment_count(sealed)


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
        return {"cipher": CIPHER, "key": self.fingerprint, "segment": SEGMENT}

    def seal(self, part: Any, name: str, index: int) -> bytes:
        """Part ``index`` of stream ``name``, sealed (:func:`sealed_size` bytes)."""
        view = memoryview(part).cast("B")
        sealed: list[bytes] = []
        for number, start in enumerate(range(0, len(view), SEGMENT)):
            nonce = os.urandom(NONCE)
            sealed += (nonce, self._aead.encrypt(nonce, view[start : start + SEGMENT], _bound(name, index, number)))
        return b"".join(sealed)

    def open(self, sealed: bytes, name: str, index: int, number: int, offset: int) -> bytes:
        """The content of segment ``number`` of part ``index`` of stream ``name`` (stream offset
        ``offset``), checked."""
        from cryptography.exceptions import InvalidTag

        try:
            return bytes(self._aead.decrypt(sealed[:NONCE], sealed[NONCE:], _bound(name, index, number)))
        except InvalidTag:
            raise e.ManifestMismatch(
                f"part {index} does not open (segment {number}): damaged, moved, or sealed with another key",
                offset=offset,
                expected=f"a part sealed with key {self.fingerprint}",
            ) from None


def _bound(name: str, index: int, number: int) -> bytes:
    return f"sendstream-archive-2 {name} {index} {number}".encode()
