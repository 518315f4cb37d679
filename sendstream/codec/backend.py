"""The codec's backend as a value: the native module, or pure Python.

:data:`PURE` frames and checks every command in Python and takes its CRC
from the ``crc32c`` package; :func:`native` (None when the module was not
built) also checks runs of clean commands in one call, prints dump text and
guards mapped windows (:mod:`.native`). The framer, the windows and the
operations that decode take a ``backend``; without one they use
:func:`default`: native when built, unless ``SENDSTREAM_PURE`` is set.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_MASK = 0xFFFFFFFF


@dataclass(frozen=True)
class Backend:
    """How commands are checked: ``module`` is the native module, or None for pure Python."""

    module: Any
    crc32c: Callable[..., int]
    """``crc32c(data, crc=0)``: the btrfs CRC of ``data``, continuing from ``crc`` (chainable)."""
    crc_name: str
    """Which CRC-32C implementation ``crc32c`` is."""

    @property
    def is_native(self) -> bool:
        return self.module is not None

    @property
    def path(self) -> str:
        """What ``verify -v`` names: ``native (its CRC instructions)`` or ``python``."""
        return self.crc_name if self.is_native else "python"

    def scan(
        self,
        buf: Any,
        pos: int,
        version: int,
        max_len: int,
        offsets: Any = None,
        cmds: Any = None,
        lens: Any = None,
        base: int = 0,
        crcs: Any = None,
        unknown: Any = None,
    ) -> tuple[int, int, int, int, int]:
        """Check every clean command from ``pos``: ``(pos, status, need, count, nbytes)``.

        Optional arrays (``array('Q')``, ``array('H')``, ``array('I')``,
        ``array('I')``) receive each command's offset (plus ``base``), number,
        payload length and CRC; the scan stops with FULL when they are full.
        ``unknown``, an ``array('Q')`` of ``[flags, commands, attributes]``, lets
        unknown commands (:data:`~.native.LENIENT_COMMANDS`) and attributes
        (:data:`~.native.LENIENT_ATTRS`) through as clean and adds how many to it.
        Only on the native backend.
        """
        return self.module.scan(buf, pos, version, max_len, offsets, cmds, lens, base, crcs, unknown)  # type: ignore[no-any-return]


def _package_crc32c() -> tuple[Callable[..., int], str]:
    import crc32c as package

    standard = package.crc32c

    def crc32c(data: Any, crc: int = 0) -> int:
        # The package computes the standard CRC (pre- and post-inverted):
        # feeding the inverted seed and inverting the result gives the raw one.
        return int(standard(data, crc ^ _MASK)) ^ _MASK

    return crc32c, "crc32c package (hardware)" if package.hardware_based else "crc32c package (software)"


@functools.cache
def pure() -> Backend:
    """The pure-Python backend (the reference), always there."""
    return Backend(None, *_package_crc32c())


@functools.cache
def native() -> Backend | None:
    """The native backend, or None when the module was not built (no compiler at install time).

    Its CRC-32C is the fastest kernel the processor has (``_native.KERNELS``, fastest last: ``table``,
    ``sse4.2``, ``vpclmulqdq``), unless ``SENDSTREAM_CRC`` names another (tests and benchmarks)."""
    try:
        from . import _native  # type: ignore[attr-defined]
    except ImportError:
        return None
    name = _native.CRC
    if wanted := os.environ.get("SENDSTREAM_CRC"):
        if wanted not in _native.KERNELS:
            from ..errors import UsageError

            kernels = ", ".join(_native.KERNELS)
            raise UsageError(f"SENDSTREAM_CRC={wanted}: this processor's CRC-32C kernels are {kernels}")
        name = _native.use_crc(wanted)
    return Backend(_native, _native.crc32c, f"native ({name})")


def available() -> tuple[Backend, ...]:
    """The backends there are: the native one (when built), then the pure one."""
    return tuple(b for b in (native(), pure()) if b is not None)


def default() -> Backend:
    """The native backend when it is built and ``SENDSTREAM_PURE`` is not set, else the pure one."""
    return (None if os.environ.get("SENDSTREAM_PURE") else native()) or pure()
