"""The optional native module, loaded once.

``_native.c`` is built by ``pip install`` when a compiler is there. It
frames and checks whole buffers (CRC-32C with the CPU's CRC instructions,
every TLV rule) and prints dump text, with the tables of ``_layout.h``,
which ``python -m sendstream.format`` generates from the declarations, so
the layout stays declared in one place. It stops at anything unusual, and
the Python framer (the reference) handles that command.
``SENDSTREAM_PURE=1`` in the environment turns it off.
"""

from __future__ import annotations

import os
from typing import Any

# What a scan reports: a partial command at pos (needing ``need`` bytes),
# pos just after END, a command at pos for the Python path, arrays full.
NEED, END, STOP, FULL = 0, 1, 2, 3
# What a lenient scan lets through (and counts): unknown commands, unknown attributes;
# strict: a command with unknown attributes is one problem, as the strict framer sees it.
LENIENT_COMMANDS, LENIENT_ATTRS, LENIENT_STRICT = 1, 2, 4

module: Any = None
if not os.environ.get("SENDSTREAM_PURE"):
    try:
        from . import _native as module  # type: ignore[attr-defined,no-redef]
    except ImportError:  # no compiler at install time
        module = None

NATIVE: bool = module is not None
PATH: str = f"native ({module.CRC})" if NATIVE else "python"


def native_scan(
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
    unknown commands (:data:`LENIENT_COMMANDS`) and attributes
    (:data:`LENIENT_ATTRS`) through as clean and adds how many to it.
    Only when :data:`NATIVE`.
    """
    return module.scan(buf, pos, version, max_len, offsets, cmds, lens, base, crcs, unknown)  # type: ignore[no-any-return]
