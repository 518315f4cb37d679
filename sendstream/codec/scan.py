"""Batch scanning: runs of clean commands checked in one call.

:func:`run_batch` drives a batch function (the native scanner, or the native
dump printer) and counts what it checked in a framer; :func:`python_scan` is
the reference the native scanner is tested against.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..errors import FormatError
from .backend import pure
from .events import Restart
from .framer import Framer
from .native import END, NEED, STOP

# batch(window, pos, version, limit, origin, unknown) -> (pos, status, need, count, nbytes);
# ``unknown`` is None or the lenient counters of native_scan, to pass on.
Batch = Callable[[Any, int, int, int, int, Any], tuple[int, int, int, int, int]]


def run_batch(framer: Framer, batch: Batch, mv: memoryview, pos: int, origin: int) -> tuple[int, int, int]:
    """Run a batch function from ``pos`` and count what it checked: ``(pos, status, need)``."""
    unknown = framer.lenient()
    pos, status, need, count, nbytes = batch(mv, pos, framer.version, framer.limit, origin, unknown)
    framer.skip(count, nbytes, ended=status == END, unknown=unknown)
    return pos, status, need


def python_scan(buf: Any, pos: int, version: int, max_len: int) -> tuple[int, int, int, int, int]:
    """The reference for :meth:`Backend.scan <sendstream.codec.backend.Backend.scan>`: the strict
    framer on the pure backend, command by command."""
    framer = Framer(strict=True, max_command_size=max_len, backend=pure())
    framer.start_stream(version)
    mv = memoryview(buf)
    count = nbytes = 0
    while True:
        try:
            event, end, need = framer.step(mv, pos, False, 0)
        except FormatError:
            return pos, STOP, 0, count, nbytes
        if event.__class__ is Restart:  # a restart is the framer's to find: the scanner stops before it
            return pos, STOP, 0, count, nbytes
        if not framer.version:
            return end, END, 0, count + 1, nbytes + end - pos
        if need:
            # a command the scanner can judge whole (all there, or too long) that the framer only waits
            # on to look for a restart inside it: the scanner stops there and leaves that to the framer
            length = int.from_bytes(mv[pos : pos + 4], "little") if len(mv) - pos >= 10 else -1
            judged = length > max_len or 0 <= length <= len(mv) - pos - 10
            return (pos, STOP, 0, count, nbytes) if judged else (pos, NEED, need, count, nbytes)
        count += 1
        nbytes += end - pos
        pos = end
