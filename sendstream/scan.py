"""The batch scanner: one call walks every clean command in a buffer.

The native module (``_native.c``, built by ``pip install`` when a compiler
is there) does framing, the length limit, CRC-32C with the CPU's CRC
instructions and every TLV check for a whole buffer at once. It loads its
tables from :mod:`sendstream.format`, and it stops at anything unusual: the
Python :class:`~sendstream.decoder.Framer`, the reference, then handles that
one command, so errors and reports are the same on both paths.

``SENDSTREAM_PURE=1`` in the environment forces the pure-Python path.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from .decoder import Framer
from .errors import FormatError
from .format import ATTRIBUTES, COMMANDS, MAX_ATTRIBUTE, MAX_COMMAND, MAX_VERSION

NEED, END, STOP, FULL = 0, 1, 2, 3

_native: Any = None
if not os.environ.get("SENDSTREAM_PURE"):
    try:
        from . import _native  # type: ignore[attr-defined, no-redef]
    except ImportError:  # no compiler at install time: the Python path serves
        _native = None

if _native is not None:
    _native.configure(
        {v: {n: a.size for n, a in ATTRIBUTES.items() if n <= MAX_ATTRIBUTE[v]} for v in range(1, MAX_VERSION + 1)},
        {v: {n: True for n in COMMANDS if n <= MAX_COMMAND[v]} for v in range(1, MAX_VERSION + 1)},
        {n: sum(1 << a for a in s.required) for n, s in COMMANDS.items()},
    )

NATIVE = _native is not None
PATH = f"native ({_native.CRC})" if NATIVE else "python"


def native_scan(
    buf: Any,
    pos: int,
    version: int,
    max_len: int,
    offsets: Any = None,
    cmds: Any = None,
    lens: Any = None,
    base: int = 0,
) -> tuple[int, int, int, int, int]:
    """Scan from ``pos``: ``(pos, status, need, count, nbytes)``.

    status is NEED (a partial command at pos needs ``need`` bytes), END
    (pos is just after END), STOP (the command at pos needs the Python path)
    or FULL (the arrays are full). Only when :data:`NATIVE`.
    """
    return _native.scan(buf, pos, version, max_len, offsets, cmds, lens, base)  # type: ignore[no-any-return]


Batch = Callable[[Any, int, int, int], tuple[int, int, int, int, int]]


def run_batch(framer: Framer, batch: Batch, mv: memoryview, pos: int) -> tuple[int, int, int]:
    """Run a batch function from ``pos`` and count what it checked: ``(pos, status, need)``."""
    pos, status, need, count, nbytes = batch(mv, pos, framer.version, framer.limit)
    framer.skip(count, nbytes, ended=status == END)
    return pos, status, need


def python_scan(buf: Any, pos: int, version: int, max_len: int) -> tuple[int, int, int, int, int]:
    """The reference for :func:`native_scan`: the strict framer, command by command."""
    framer = Framer(strict=True, max_command_size=max_len)
    framer.start_stream(version)
    mv = memoryview(buf)
    count = nbytes = 0
    while True:
        try:
            _event, end, need = framer.step(mv, pos, False, 0)
        except FormatError:
            return pos, STOP, 0, count, nbytes
        if not framer.version:
            return end, END, 0, count + 1, nbytes + end - pos
        if need:
            return pos, NEED, need, count, nbytes
        count += 1
        nbytes += end - pos
        pos = end
