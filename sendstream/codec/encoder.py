"""The writer: commands in, bytes out, with correct CRCs.

Attributes are written in the order the command holds them, so writing what
the decoder read gives the same bytes back.
"""

from __future__ import annotations

from .. import errors as e
from ..format.command import Command
from ..format.layout import (
    A_DATA,
    C_END,
    COMMAND_HEADER,
    MAX_VERSION,
    STREAM_HEADER,
    STREAM_MAGIC,
    TLV_HEADER,
    TLV_TYPE,
)
from .crc import crc32c
from .events import EndOfInput, Event, Restart, StreamHeader

_TLV_MAX = 0xFFFF


def encode_stream_header(version: int) -> bytes:
    if not 1 <= version <= MAX_VERSION:
        raise e.UsageError(f"stream version must be 1 to {MAX_VERSION}, not {version}")
    return STREAM_HEADER.pack(STREAM_MAGIC, version)


def encode_command(command: Command, version: int) -> bytes:
    """One command with its header and a CRC computed over the result."""
    out = bytearray(COMMAND_HEADER.size)
    if command.attributes is None:
        out += command.payload or b""
    else:
        for t, value in command.attributes:
            if t == A_DATA and version >= 2:
                out += TLV_TYPE.pack(t)
            elif len(value) > _TLV_MAX:
                raise e.UsageError(f"attribute {t} of {command.name}: {len(value)} bytes do not fit a TLV")
            else:
                out += TLV_HEADER.pack(t, len(value))
            out += value
    length = len(out) - COMMAND_HEADER.size
    COMMAND_HEADER.pack_into(out, 0, length, command.cmd, 0)
    COMMAND_HEADER.pack_into(out, 0, length, command.cmd, crc32c(out))
    return bytes(out)


class Encoder:
    """Turns decoder events (or built commands) back into stream bytes."""

    def __init__(self) -> None:
        self.version = 0

    def send(self, event: Event) -> bytes:
        if isinstance(event, StreamHeader):
            self.version = event.version
            return encode_stream_header(event.version)
        if isinstance(event, EndOfInput):
            return b""
        if isinstance(event, Restart):
            raise e.UsageError(f"the stream restarted at offset {event.offset}: repair it instead of rewriting it")
        if not self.version:
            raise e.UsageError(f"command {event.name} before a stream header")
        data = encode_command(event, self.version)
        if event.cmd == C_END:
            self.version = 0
        return data
