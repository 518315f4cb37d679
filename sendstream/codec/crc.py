"""CRC-32C as btrfs uses it: initial value 0 and no final xor.

crcmod's definition is the reference. The fast path is the native module's
(SSE4.2 or ARMv8 CRC instructions in interleaved lanes) when it is built,
else the ``crc32c`` package (CPU instructions or its own table): each
backend has its own (:mod:`.backend`); the tests cross-check all of them on
real streams.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from .backend import default


def reference_crc32c(data: bytes, crc: int = 0) -> int:
    """The btrfs CRC of ``data`` by crcmod's pure definition, continuing from ``crc`` (loaded on first use:
    only the tests and a library's caller want it, not a command's start)."""
    return int(_reference()(data, crc))


@functools.cache
def _reference() -> Callable[..., int]:
    import crcmod

    # Reflected Castagnoli polynomial, init 0, no xorout: the kernel's raw crc32c(0, ...).
    return crcmod.mkCrcFun(0x11EDC6F41, initCrc=0, rev=True, xorOut=0)  # type: ignore[no-any-return]


crc32c: Callable[..., int] = default().crc32c
"""``crc32c(data, crc=0)``: the btrfs CRC of ``data``, continuing from ``crc`` (chainable), by the
default backend (:func:`~sendstream.codec.backend.default`)."""
