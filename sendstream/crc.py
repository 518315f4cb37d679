"""CRC-32C as btrfs uses it: initial value 0 and no final xor.

crcmod's definition is the reference; the ``crc32c`` package (SSE4.2 or
ARMv8 CRC instructions, a software table elsewhere) is the fast path, and
the tests cross-check the two on real streams.
"""

from __future__ import annotations

from collections.abc import Callable

import crc32c as _fast
import crcmod

Buffer = bytes | bytearray | memoryview

# Reflected Castagnoli polynomial, init 0, no xorout: the kernel's raw crc32c(0, ...).
reference_crc32c: Callable[..., int] = crcmod.mkCrcFun(0x11EDC6F41, initCrc=0, rev=True, xorOut=0)
"""``reference_crc32c(data: bytes, crc=0)``: crcmod's pure definition."""

_MASK = 0xFFFFFFFF
_standard = _fast.crc32c


def crc32c(data: Buffer, crc: int = 0) -> int:
    """The btrfs CRC of ``data``, continuing from ``crc`` (chainable)."""
    # The package computes the standard CRC (pre- and post-inverted); feeding
    # the inverted seed and inverting the result gives the raw CRC.
    return int(_standard(data, crc ^ _MASK)) ^ _MASK


HARDWARE = bool(_fast.hardware_based)
IMPLEMENTATION = "crc32c (hardware)" if HARDWARE else "crc32c (software)"
