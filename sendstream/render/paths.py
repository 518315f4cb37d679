"""Presentation of ``paths`` and ``stats``: text and JSON lines, pure functions of the records;
:func:`write_paths` and :func:`write_stats` write those of a whole input."""

from __future__ import annotations

import json
from typing import Any, BinaryIO

from ..analysis.paths import MAX_HELD, MAX_NAMES
from ..analysis.resolve import CommandPaths, resolve
from ..analysis.statistics import Statistics
from ..codec.backend import Backend
from ..io.framed import FramedInput, StreamSource, Warn
from .dump import escape
from .jsonlines import json_bytes


def _name(raw: bytes | None) -> bytes:
    return b"-" if raw is None else escape(raw) or b"."


def record_line(record: CommandPaths) -> bytes:
    """One record as text: index, command, the final path (``-`` when the file
    is gone, ``.`` for the root), then ``was=PATH`` when the command named
    another path, and ``other=FINAL`` for RENAME, LINK and CLONE."""
    if record.path is None:
        return b"%d %s\n" % (record.index, record.command.encode())
    line = b"%d %-14s %s" % (record.index, record.command.encode(), _name(record.final))
    if record.renamed:
        line += b" was=" + _name(record.path)
    if record.other_path is not None:
        line += b" other=" + (str(record.clone_uuid).encode() + b":" if record.clone_uuid else b"")
        line += _name(record.other_final)
    return line + b"\n"


def record_json(record: CommandPaths) -> dict[str, Any]:
    """One record as a JSON-ready dict (byte strings as in ``dump --json``)."""
    out: dict[str, Any] = {"offset": record.offset, "index": record.index, "command": record.command}
    if record.subvolume is not None:
        out["subvolume"] = json_bytes(record.subvolume)
    if record.path is not None:
        out["path"] = json_bytes(record.path)
        out["final"] = None if record.final is None else json_bytes(record.final)
    if record.other_path is not None:
        out["other_path"] = json_bytes(record.other_path)
        out["other_final"] = None if record.other_final is None else json_bytes(record.other_final)
    if record.clone_uuid is not None:
        out["clone_uuid"] = str(record.clone_uuid)
    return out


def record_json_line(record: CommandPaths) -> bytes:
    """:func:`record_json` as one line of JSON."""
    return json.dumps(record_json(record), separators=(",", ":")).encode() + b"\n"


def statistics_lines(statistics: Statistics) -> list[str]:
    """A table per stream: count, wire bytes, data bytes and file bytes per command kind."""
    lines = []
    for number, s in enumerate(statistics.all(), 1):
        if s.streams == 1:
            said = f" {s.subvolume}" if s.subvolume else ""
            lines.append(f"stream {number} at offset {s.offset}, version {s.version}:{said}")
        else:
            version = f"version {s.version}" if s.version else "several versions"
            lines.append(f"streams {number} to {number + s.streams - 1} from offset {s.offset}, {version}:")
        lines.append(f"  {'command':<14} {'count':>8} {'wire bytes':>14} {'data bytes':>14} {'file bytes':>14}")
        for name, c in sorted(s.commands.items(), key=lambda kv: (-kv[1].wire_bytes, kv[0])):
            lines.append(f"  {name:<14} {c.count:>8} {c.wire_bytes:>14} {c.data_bytes:>14} {c.file_bytes:>14}")
        t = s.total
        lines.append(f"  {'total':<14} {t.count:>8} {t.wire_bytes:>14} {t.data_bytes:>14} {t.file_bytes:>14}")
    return lines


def write_paths(
    source: StreamSource,
    out: BinaryIO,
    *,
    as_json: bool = False,
    max_names: int = MAX_NAMES,
    max_held: int = MAX_HELD,
    max_command_size: int | None = None,
    warn: Warn | None = None,
    backend: Backend | None = None,
) -> None:
    """Write every command of the stream at ``source`` with its final paths to ``out``
    (:func:`record_line`, or a JSON line each); the limits are
    :func:`~sendstream.analysis.resolve.resolve`'s, problems go to ``warn``; ``backend`` reads
    and checks (the default one without it)."""
    line = record_json_line if as_json else record_line
    with FramedInput(source, max_command_size=max_command_size, warn=warn, backend=backend) as stream:
        try:
            for record in resolve(stream.events(flush_before_read=out), max_names=max_names, max_held=max_held):
                out.write(line(record))
        finally:
            out.flush()


def write_stats(
    source: StreamSource,
    out: BinaryIO,
    *,
    max_command_size: int | None = None,
    warn: Warn | None = None,
    backend: Backend | None = None,
) -> None:
    """Write the :func:`statistics_lines` of the stream at ``source`` to ``out``, then tell its problems to
    ``warn``; ``backend`` reads and checks (the default one without it)."""
    statistics = Statistics()
    with FramedInput(source, max_command_size=max_command_size, warn=warn, backend=backend) as stream:
        for event in stream.events():
            statistics.feed(event)
        out.write(("\n".join(statistics_lines(statistics)) + "\n").encode())
        out.flush()
