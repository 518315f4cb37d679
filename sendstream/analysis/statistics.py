"""Counts and bytes per command kind of each stream of an input (``sendstream stats``), bounded by kinds and streams."""

from __future__ import annotations

import dataclasses
from typing import Any

from ..codec.events import StreamHeader
from ..format.command import Command, subvolume_of
from ..format.layout import (
    A_DATA,
    COMMAND_HEADER_SIZE,
    TLV_HEADER_SIZE,
    TLV_TYPE,
)


@dataclasses.dataclass(slots=True)
class CommandStats:
    """Totals for one command kind.

    ``wire_bytes``: the commands as encoded (10-byte header and every TLV);
    ``data_bytes``: the DATA attribute bytes they carry (file data as sent,
    compressed for ENCODED_WRITE); ``file_bytes``: the file bytes they
    affect (WRITE data, ENCODED_WRITE unencoded_file_len, CLONE clone_len,
    UPDATE_EXTENT and FALLOCATE size).
    """

    count: int = 0
    wire_bytes: int = 0
    data_bytes: int = 0
    file_bytes: int = 0


_FILE_LEN = {"encoded_write": "unencoded_file_len", "clone": "clone_len", "update_extent": "size", "fallocate": "size"}


@dataclasses.dataclass(slots=True)
class StreamStats:
    """Counts and bytes per command kind of one stream (header to END); every
    command number this library does not know counts as kind ``unknown``.
    ``streams`` is above 1 for the streams :class:`Statistics` adds up after
    its first :data:`MAX_STREAMS`."""

    offset: int
    version: int
    commands: dict[str, CommandStats] = dataclasses.field(default_factory=dict)
    streams: int = 1
    subvolume: str | None = None  # what its first command says it is (:func:`subvolume_of`)

    def add(self, command: Command) -> None:
        if not self.commands:
            self.subvolume = subvolume_of(command)
        # Unknown command numbers share one row: 65,000 of them must not make 65,000 rows.
        name = command.name if command.spec is not None else "unknown"
        stats = self.commands.get(name)
        if stats is None:
            stats = self.commands[name] = CommandStats()
        stats.count += 1
        stats.wire_bytes += wire_size(command, self.version)
        data = command.raw(A_DATA) if command.attributes is not None else None
        if data is not None:
            stats.data_bytes += len(data)
            if command.name == "write":
                stats.file_bytes += len(data)
        key = _FILE_LEN.get(command.name)
        if key is not None:
            stats.file_bytes += int(command.get(key, 0))

    @property
    def total(self) -> CommandStats:
        """All kinds together."""
        out = CommandStats()
        for s in self.commands.values():
            out.count += s.count
            out.wire_bytes += s.wire_bytes
            out.data_bytes += s.data_bytes
            out.file_bytes += s.file_bytes
        return out


def wire_size(command: Command, version: int) -> int:
    """The encoded size of ``command`` in a stream of ``version`` (header included)."""
    if command.attributes is None:
        return COMMAND_HEADER_SIZE + len(command.payload or b"")
    size = COMMAND_HEADER_SIZE
    for t, value in command.attributes:
        size += (TLV_TYPE.size if t == A_DATA and version >= 2 else TLV_HEADER_SIZE) + len(value)
    return size


# Streams listed one by one; the ones after them are added up in one row.
MAX_STREAMS = 1000


class Statistics:
    """Per-stream statistics of an input (several streams when concatenated).

    Memory is bounded: at most :data:`MAX_STREAMS` streams are kept one by
    one (each with at most one row per command kind), the rest in ``rest``.
    """

    def __init__(self) -> None:
        self.streams: list[StreamStats] = []
        self.rest: StreamStats | None = None

    def feed(self, event: Any) -> None:
        """Count one event of :func:`sendstream.files.file_events` or a Decoder."""
        if isinstance(event, StreamHeader):
            if len(self.streams) < MAX_STREAMS:
                self.streams.append(StreamStats(event.offset, event.version))
            elif self.rest is None:
                self.rest = StreamStats(event.offset, event.version)
            else:
                self.rest.streams += 1
                if self.rest.version != event.version:
                    self.rest.version = 0
        elif isinstance(event, Command) and self.streams:
            (self.rest or self.streams[-1]).add(event)

    def all(self) -> list[StreamStats]:
        """The streams listed one by one, then the rest added up (if any)."""
        return self.streams + ([self.rest] if self.rest is not None else [])
