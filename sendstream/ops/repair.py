"""Healing restarted streams, in files and in flight.

When ``btrfs send`` is stopped and continued while the kernel is blocked on
a pipe, the send ioctl restarts: a new header and the whole stream again
follow what was written, often after part of a command (FORMAT.md).
:class:`Healer` hands out each command only once its CRC is checked; after
a restart it compares every replayed command with the length and CRC of the
one handed out before, drops the duplicates and the partial command, and
carries on where the stream stopped. It keeps 8 bytes per command, never
the commands themselves. No file or socket inside: bytes go to ``write``;
:func:`repair` runs one from an input to an output file.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import errors as e
from ..codec.encoder import encode_command, encode_stream_header
from ..codec.events import EndOfInput, Event, Restart, StreamHeader
from ..codec.native import NATIVE, native_scan
from ..codec.scan import Batch
from ..format.command import Command
from ..format.layout import COMMAND_HEADER_SIZE, command_name
from ..io.framed import FramedInput, StreamSource, Warn
from ..io.outputs import atomic_output

if TYPE_CHECKING:
    from .ledger import Ledger

_RUN = 1 << 16
_KEEP_RESTARTS = 100


class Healer:
    """Turns the events and clean runs of a (possibly restarted) stream into
    the clean stream.

    Use :meth:`batch` as the batch function of
    :func:`~sendstream.files.file_events` (when the native module is built)
    and give every event it yields to :meth:`event`. With ``keep_last``, a
    restart discards everything of its stream written so far (through
    ``truncate(offset)``) instead of checking the replay against it.
    """

    def __init__(
        self,
        write: Callable[[Any], object],
        *,
        keep_last: bool = False,
        truncate: Callable[[int], object] | None = None,
        copy_range: Callable[[int, int], object] | None = None,
        ledger: Ledger | None = None,
    ) -> None:
        if keep_last and truncate is None:
            raise e.UsageError("keeping only the last restart needs an output that can be truncated")
        if keep_last and ledger is not None:
            raise e.UsageError("a ledger cannot follow an output that is truncated")
        self._write = write
        self._ledger = ledger  # told of every header and command before it is written
        # copy_range(offset, length) passes input bytes on without reading
        # them (sendfile from the input file), for the runs the scanner checked
        self._copy_range = copy_range
        self._keep_last = keep_last
        self._truncate = truncate
        self.written = 0
        self.restarts: list[Restart] = []  # the first ones; ``restart_count`` counts all
        self.restart_count = 0
        self.dropped = 0  # bytes of replayed and partial commands left out
        self._version = 0
        self._stream_body = 0  # output offset of the current stream's first command
        self._lens = array("I")  # length and CRC of every command written in the current stream
        self._crcs = array("I")
        self._replay: int | None = None  # index of the next command a replay must repeat
        self._restart_at = 0
        self._run_lens = array("I", bytes(4 * _RUN))
        self._run_crcs = array("I", bytes(4 * _RUN))

    @property
    def batch(self) -> Batch | None:
        """The batch function for clean runs (None without the native module)."""
        return self._batch if NATIVE else None

    def _batch(
        self, mv: Any, pos: int, version: int, limit: int, origin: int, unknown: Any
    ) -> tuple[int, int, int, int, int]:
        result = native_scan(mv, pos, version, limit, None, None, self._run_lens, 0, self._run_crcs, unknown)
        count = result[3]
        if count:
            self._run(mv, pos, origin + pos, self._run_lens[:count], self._run_crcs[:count], result[4], True)
        return result

    def _out(self, data: Any) -> None:
        self._write(data)
        self.written += len(data)

    def _run(
        self, mv: Any, start: int, offset: int, lens: array[int], crcs: array[int], nbytes: int, in_input: bool = False
    ) -> None:
        """A run of checked commands at ``mv[start:]`` (input ``offset``): write,
        or match against the replay."""
        repeated = 0
        if self._replay is not None:
            k = self._replay
            repeated = min(len(lens), len(self._lens) - k)
            if lens[:repeated] != self._lens[k : k + repeated] or crcs[:repeated] != self._crcs[k : k + repeated]:
                i = next(i for i in range(repeated) if (lens[i], crcs[i]) != (self._lens[k + i], self._crcs[k + i]))
                skip = sum(lens[:i]) + COMMAND_HEADER_SIZE * i
                self._diverges(k + i, lens[i], crcs[i], mv, start + skip, offset + skip)
            self._replay = k + repeated
            if self._replay == len(self._lens):
                self._replay = None
        skip = sum(lens[:repeated]) + COMMAND_HEADER_SIZE * repeated
        self.dropped += skip
        if repeated < len(lens):
            if self._ledger is not None:
                self._ledger.run(lens[repeated:], crcs[repeated:])
            if in_input and self._copy_range is not None:
                self._copy_range(offset + skip, nbytes - skip)
                self.written += nbytes - skip
            else:
                self._out(mv[start + skip : start + nbytes])
            self._lens.extend(lens[repeated:])
            self._crcs.extend(crcs[repeated:])

    def _diverges(self, index: int, length: int, crc: int, mv: Any, at: int, offset: int) -> None:
        cmd = int.from_bytes(bytes(mv[at + 4 : at + 6]), "little")
        raise e.ReplayDiverges(
            f"the stream replayed after the restart at offset {self._restart_at} is not the one written before it",
            offset=offset,
            index=index,
            command=command_name(cmd),
            expected=f"command #{index} of length {self._lens[index]} and crc 0x{self._crcs[index]:08x}",
            actual=f"length {length} and crc 0x{crc:08x}",
        )

    def event(self, event: Event) -> None:
        """Take one event of the framer (or decoder)."""
        if isinstance(event, StreamHeader):
            if self._ledger is not None:
                self._ledger.header(event.version)
            self._out(encode_stream_header(event.version))
            self._version = event.version
            self._stream_body = self.written
            self._lens = array("I")
            self._crcs = array("I")
            self._replay = None
        elif isinstance(event, Command):
            raw = encode_command(event, self._version)
            lens, crcs = array("I", [len(raw) - COMMAND_HEADER_SIZE]), array("I", [event.crc or 0])
            self._run(memoryview(raw), 0, event.offset, lens, crcs, len(raw))
        elif isinstance(event, Restart):
            self._restarted(event)
        elif isinstance(event, EndOfInput) and self._replay is not None:
            raise e.TruncatedStream(
                f"the input ends while the stream is replayed after the restart at offset {self._restart_at}",
                offset=event.offset,
                expected=f"{len(self._lens)} replayed commands",
                actual=self._replay,
            )

    def _restarted(self, event: Restart) -> None:
        self.restart_count += 1
        if len(self.restarts) < _KEEP_RESTARTS:
            self.restarts.append(event)
        self.dropped += event.partial + len(encode_stream_header(event.version))
        self._restart_at = event.offset
        if event.version != self._version:
            raise e.ReplayDiverges(
                f"the stream restarted at offset {event.offset} with another version",
                offset=event.offset,
                expected=f"version {self._version}",
                actual=event.version,
            )
        if self._keep_last:
            assert self._truncate is not None
            self._truncate(self._stream_body)
            self.dropped += self.written - self._stream_body
            self.written = self._stream_body
            self._lens = array("I")
            self._crcs = array("I")
        elif len(self._lens):
            self._replay = 0


def repair(
    source: StreamSource,
    target: str,
    *,
    keep_last: bool = False,
    max_command_size: int | None = None,
    warn: Warn | None = None,
) -> Healer:
    """Write the clean stream of ``source`` (a restarted ``btrfs send``) to the file ``target``
    (``-``: standard output), which appears only when the whole input was repaired.

    With ``keep_last`` only what follows the last restart is kept (``target`` must be
    seekable). The input's problems go to ``warn``, its restarts are in the healer returned.
    """
    skip = (e.StreamRestarted,)  # told in the healer's restarts
    with (
        FramedInput(source, max_command_size=max_command_size, warn=warn, skip=skip) as stream,
        atomic_output(target) as out,
    ):
        if keep_last and not out.seekable():
            raise e.UsageError("--keep-last needs OUT to be a file")

        def truncate(offset: int) -> None:
            out.flush()
            out.seek(offset)
            out.truncate(offset)

        healer = Healer(out.write, keep_last=keep_last, truncate=truncate if keep_last else None)
        for event in stream.events(healer.batch, flush_before_read=out):
            healer.event(event)
    return healer


def summary_lines(healer: Healer) -> list[str]:
    """What a repair did: a line for each restart kept, then one with the counts."""
    lines = [
        f"restart at offset {r.offset} after {r.commands} complete commands, "
        f"{r.partial} bytes of a partial command before it"
        for r in healer.restarts
    ]
    count = healer.restart_count
    lines.append(
        f"{count} restart{'s' * (count != 1)} repaired; {healer.written} bytes written, {healer.dropped} dropped"
    )
    return lines
