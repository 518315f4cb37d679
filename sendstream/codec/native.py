"""The optional native module's interface: what its scans report.

``_native.c`` is built by ``pip install`` when a compiler is there. It
frames and checks whole buffers (CRC-32C with the CPU's CRC instructions,
every TLV rule) and prints dump text, with the tables of ``_layout.h``,
which ``python -m sendstream.format`` generates from the declarations, so
the layout stays declared in one place. It stops at anything unusual, and
the Python framer (the reference) handles that command. It is loaded as a
backend (:func:`sendstream.codec.backend.native`).
"""

from __future__ import annotations

# What a scan reports: a partial command at pos (needing ``need`` bytes),
# pos just after END, a command at pos for the Python path, arrays full.
NEED, END, STOP, FULL = 0, 1, 2, 3
# What a lenient scan lets through (and counts): unknown commands, unknown attributes;
# strict: a command with unknown attributes is one problem, as the strict framer sees it.
LENIENT_COMMANDS, LENIENT_ATTRS, LENIENT_STRICT = 1, 2, 4
