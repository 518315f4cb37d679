"""The send-stream layout as the runtime uses it, without construct.

:mod:`sendstream.format` declares the layout with construct; ``python -m
sendstream.format`` writes what the runtime needs from it (struct formats,
value sizes, the command and attribute tables) to ``_layout.py``, and a test
checks that file against the declarations. Importing construct costs more
than a quarter of the start-up of a short ``sendstream verify``, so nothing
on the runtime path imports it.
"""

from __future__ import annotations

import struct
import uuid
from typing import Any

from . import _layout as g
from .specs import AttributeSpec, CommandSpec, Timespec

STREAM_MAGIC: bytes = g.STREAM_MAGIC
MAX_VERSION: int = g.MAX_VERSION

ATTRIBUTES: dict[int, AttributeSpec] = {row[0]: AttributeSpec(*row) for row in g.ATTRIBUTES}
COMMANDS: dict[int, CommandSpec] = {row[0]: CommandSpec(*row) for row in g.COMMANDS}
# Highest attribute and command number valid in each stream version (send.h A_MAX_V*, C_MAX_V*).
MAX_ATTRIBUTE: dict[int, int] = g.MAX_ATTRIBUTE
MAX_COMMAND: dict[int, int] = g.MAX_COMMAND
# The largest command payload each version's kernel can write.
SEND_BUF_SIZE: dict[int, int] = g.SEND_BUF_SIZE

ATTRIBUTE_NUMBERS: dict[str, int] = {a.name: n for n, a in ATTRIBUTES.items()}
A = ATTRIBUTE_NUMBERS
A_DATA = A["data"]
COMMAND_NUMBERS: dict[str, int] = {s.name: n for n, s in COMMANDS.items()}
C_END = COMMAND_NUMBERS["end"]

STREAM_HEADER = struct.Struct(g.STREAM_HEADER)
COMMAND_HEADER = struct.Struct(g.COMMAND_HEADER)
TLV_HEADER = struct.Struct(g.TLV_HEADER)
TLV_TYPE = struct.Struct(g.TLV_TYPE)
STREAM_HEADER_SIZE = STREAM_HEADER.size
COMMAND_HEADER_SIZE = COMMAND_HEADER.size
TLV_HEADER_SIZE = TLV_HEADER.size
_VALUE_STRUCTS: dict[str, struct.Struct] = {kind: struct.Struct(fmt) for kind, fmt in g.VALUE_FORMATS.items()}


def command_name(number: int) -> str:
    spec = COMMANDS.get(number)
    return spec.name if spec else f"unknown({number})"


def attribute_spec(number: int, version: int = MAX_VERSION) -> AttributeSpec | None:
    """Attribute ``number`` as stream ``version`` defines it; None where that version does not."""
    spec = ATTRIBUTES.get(number)
    return spec if spec is not None and spec.version <= version else None


def attribute_name(number: int, version: int = MAX_VERSION) -> str:
    spec = attribute_spec(number, version)
    return spec.name if spec else f"unknown({number})"


def decode_value(kind: str, raw: memoryview) -> Any:
    """Decode an attribute value of ``kind`` (checked to have the right size)."""
    st = _VALUE_STRUCTS.get(kind)
    if st is not None:
        v = st.unpack(raw)
        return Timespec(*v) if kind == "timespec" else v[0]
    if kind == "uuid":
        return uuid.UUID(bytes=bytes(raw))
    if kind == "string":
        return bytes(raw)
    return raw


def encode_value(kind: str, value: Any) -> bytes:
    """Encode a typed attribute value back into its raw bytes."""
    st = _VALUE_STRUCTS.get(kind)
    if st is not None:
        return st.pack(*value) if kind == "timespec" else st.pack(value)
    if kind == "uuid":
        return bytes(value.bytes)
    return bytes(value)
