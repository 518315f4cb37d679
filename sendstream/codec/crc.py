"""CRC-32C as btrfs uses it: initial value 0 and no final xor.

crcmod's definition is the reference. The fast path is the native module's
(SSE4.2 or ARMv8 CRC instructions in interleaved lanes) when it is built,
else the ``crc32c`` package (CPU instructions or its own table); the tests
cross-check all of them on real streams.
"""

from __future__ import annotations

from collections.abc import Callable

import crcmod

from . import native

Buffer = bytes | bytearray | memoryview

# Reflected Castagnoli polynomial, init 0, no xorout: the kernel's raw crc32c(0, ...).
reference_crc32c: Callable[..., int] = crcmod.mkCrcFun(0x11EDC6F41, initCrc=0, rev=True, xorOut=0)
"""``reference_crc32c(data: bytes, crc=0)``: crcmod's pure definition."""

_MASK = 0xFFFFFFFF


def _package() -> tuple[Callable[..., int], str]:
    import crc32c as package

    standard = package.crc32c

    def crc32c(data: Buffer, crc: int = 0) -> int:
        # The package computes the standard CRC (pre- and post-inverted):
        # feeding the inverted seed and inverting the result gives the raw one.
        return int(standard(data, crc ^ _MASK)) ^ _MASK

    return crc32c, "crc32c package (hardware)" if package.hardware_based else "crc32c package (software)"


crc32c, IMPLEMENTATION = (native.module.crc32c, native.PATH) if native.NATIVE else _package()
"""``crc32c(data, crc=0)``: the btrfs CRC of ``data``, continuing from ``crc`` (chainable)."""
