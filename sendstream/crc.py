"""CRC-32C as btrfs uses it: initial value 0 and no final xor.

crcmod's definition is the reference; the ``crc32c`` package (SSE4.2 or
ARMv8 CRC instructions) is the fast path and is cross-checked against it in
the tests.
"""

from __future__ import annotations

from collections.abc import Callable

import crcmod

try:
    import crc32c as _hw
except ImportError:  # pragma: no cover - the package is a dependency
    _hw = None

Buffer = bytes | bytearray | memoryview

# Reflected Castagnoli polynomial, init 0, no xorout: the kernel's raw crc32c(0, ...).
reference_crc32c: Callable[[Buffer], int] = crcmod.mkCrcFun(0x11EDC6F41, initCrc=0, rev=True, xorOut=0)
_reference_chain = crcmod.mkCrcFun(0x11EDC6F41, initCrc=0, rev=True, xorOut=0)

_MASK = 0xFFFFFFFF


def _hw_crc32c(data: Buffer, crc: int = 0) -> int:
    # The package computes the standard CRC (pre- and post-inverted); feeding
    # the inverted seed and inverting the result gives the raw CRC, chainable.
    return _hw.crc32c(data, crc ^ _MASK) ^ _MASK  # type: ignore[union-attr]


def _ref_crc32c(data: Buffer, crc: int = 0) -> int:
    return int(_reference_chain(bytes(data), crc))


crc32c: Callable[..., int] = _hw_crc32c if _hw is not None else _ref_crc32c
"""``crc32c(data, crc=0)``: the btrfs CRC of ``data``, continuing from ``crc``."""

HARDWARE = bool(_hw is not None and _hw.hardware_based)
IMPLEMENTATION = ("crc32c (hardware)" if HARDWARE else "crc32c (software)") if _hw is not None else "crcmod"
