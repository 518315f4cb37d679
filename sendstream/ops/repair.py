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
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from .. import errors as e
from ..analysis.statistics import wire_size
from ..codec.backend import Backend, default
from ..codec.encoder import encode_command, encode_stream_header
from ..codec.events import EndOfInput, Event, Restart, StreamHeader
from ..codec.scan import Batch
from ..format.command import Command
from ..format.layout import COMMAND_HEADER_SIZE, command_name
from ..io.framed import FramedInput, StreamSource, Warn
from ..io.outputs import atomic_output

if TYPE_CHECKING:
    from ..transfer.ledger import Ledger

_RUN = 1 << 16
_KEEP_RESTARTS = 100


class Replay:
    """The length and CRC of every command of the current stream, and, after a
    restart, which of them the replay must repeat next: what :class:`Healer`
    (bytes) and :func:`healed` (events) both check a replay with."""

    def __init__(self) -> None:
        self.lens = array("I")
        self.crcs = array("I")
        self.next: int | None = None  # index of the next command a replay must repeat
        self.restart_at = 0

    def header(self) -> None:
        """A new stream begins: nothing to repeat."""
        self.lens, self.crcs, self.next = array("I"), array("I"), None

    def restarted(self, event: Restart, version: int) -> None:
        """The stream of ``version`` restarted: what follows repeats what was handed on."""
        self.restart_at = event.offset
        if event.version != version:
            raise e.ReplayDiverges(
                f"the stream restarted at offset {event.offset} with another version",
                offset=event.offset,
                expected=f"version {version}",
                actual=event.version,
            )
        if len(self.lens):
            self.next = 0

    def repeated(self, lens: array[int], crcs: array[int]) -> tuple[int, int | None]:
        """How many of these commands (a run) repeat the replay, and the index in the run of the
        first that should have and does not (None when all did); the new ones are recorded."""
        repeated = 0
        if self.next is not None:
            k = self.next
            repeated = min(len(lens), len(self.lens) - k)
            if lens[:repeated] != self.lens[k : k + repeated] or crcs[:repeated] != self.crcs[k : k + repeated]:
                return 0, next(i for i in range(repeated) if (lens[i], crcs[i]) != (self.lens[k + i], self.crcs[k + i]))
            self.next = None if k + repeated == len(self.lens) else k + repeated
        if repeated < len(lens):
            self.lens.extend(lens[repeated:])
            self.crcs.extend(crcs[repeated:])
        return repeated, None

    def diverges(self, index: int, length: int, crc: int, offset: int, command: str) -> e.ReplayDiverges:
        """The error for the command at ``offset`` that should have repeated command #``index``."""
        return e.ReplayDiverges(
            f"the stream replayed after the restart at offset {self.restart_at} is not the one written before it",
            offset=offset,
            index=index,
            command=command,
            expected=f"command #{index} of length {self.lens[index]} and crc 0x{self.crcs[index]:08x}",
            actual=f"length {length} and crc 0x{crc:08x}",
        )

    def unfinished(self, offset: int) -> e.TruncatedStream | None:
        """The error for an input that ends while a replay is under way, else None."""
        if self.next is None:
            return None
        return e.TruncatedStream(
            f"the input ends while the stream is replayed after the restart at offset {self.restart_at}",
            offset=offset,
            expected=f"{len(self.lens)} replayed commands",
            actual=self.next,
        )


class Healer:
    """Turns the events and clean runs of a (possibly restarted) stream into
    the clean stream.

    Use :meth:`batch` as the batch function of
    :func:`~sendstream.io.windows.file_events` (on the native ``backend``: the
    default one without it) and give every event it yields to :meth:`event`. With ``keep_last``, a
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
        backend: Backend | None = None,
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
        self._replay = Replay()
        self._run_lens = array("I", bytes(4 * _RUN))
        self._run_crcs = array("I", bytes(4 * _RUN))
        self._backend = backend or default()

    @property
    def batch(self) -> Batch | None:
        """The batch function for clean runs (None on the pure backend)."""
        return self._batch if self._backend.is_native else None

    def _batch(
        self, mv: Any, pos: int, version: int, limit: int, origin: int, unknown: Any
    ) -> tuple[int, int, int, int, int]:
        result = self._backend.scan(mv, pos, version, limit, None, None, self._run_lens, 0, self._run_crcs, unknown)
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
        k = self._replay.next
        repeated, bad = self._replay.repeated(lens, crcs)
        if bad is not None:
            assert k is not None
            at = sum(lens[:bad]) + COMMAND_HEADER_SIZE * bad
            cmd = int.from_bytes(bytes(mv[start + at + 4 : start + at + 6]), "little")
            raise self._replay.diverges(k + bad, lens[bad], crcs[bad], offset + at, command_name(cmd))
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

    def event(self, event: Event) -> None:
        """Take one event of the framer (or decoder)."""
        if isinstance(event, StreamHeader):
            if self._ledger is not None:
                self._ledger.header(event.version)
            self._out(encode_stream_header(event.version))
            self._version = event.version
            self._stream_body = self.written
            self._replay.header()
        elif isinstance(event, Command):
            raw = encode_command(event, self._version)
            lens, crcs = array("I", [len(raw) - COMMAND_HEADER_SIZE]), array("I", [event.crc or 0])
            self._run(memoryview(raw), 0, event.offset, lens, crcs, len(raw))
        elif isinstance(event, Restart):
            self._restarted(event)
        elif isinstance(event, EndOfInput) and (unfinished := self._replay.unfinished(event.offset)):
            raise unfinished

    def _restarted(self, event: Restart) -> None:
        self.restart_count += 1
        if len(self.restarts) < _KEEP_RESTARTS:
            self.restarts.append(event)
        self.dropped += event.partial + len(encode_stream_header(event.version))
        self._replay.restarted(event, self._version)
        if self._keep_last:
            assert self._truncate is not None
            self._truncate(self._stream_body)
            self.dropped += self.written - self._stream_body
            self.written = self._stream_body
            self._replay.header()


def healed(events: Iterable[Event]) -> Iterator[Event]:
    """``events`` as those of the clean stream: a ``Restart`` is still yielded, but the replayed
    commands after it are not, each checked first against the one it repeats (length and CRC), as
    :class:`Healer` checks them; a replay that differs raises
    :class:`~sendstream.errors.ReplayDiverges`."""
    replay, version = Replay(), 0
    for event in events:
        if isinstance(event, StreamHeader):
            replay.header()
            version = event.version
        elif isinstance(event, Command):
            length, crc, k = wire_size(event, version) - COMMAND_HEADER_SIZE, event.crc or 0, replay.next
            repeated, bad = replay.repeated(array("I", [length]), array("I", [crc]))
            if bad is not None:
                assert k is not None
                raise replay.diverges(k, length, crc, event.offset, event.name)
            if repeated:
                continue
        elif isinstance(event, Restart):
            replay.restarted(event, version)
        elif isinstance(event, EndOfInput) and (unfinished := replay.unfinished(event.offset)):
            raise unfinished
        yield event


def repair(
    source: StreamSource,
    target: str,
    *,
    keep_last: bool = False,
    max_command_size: int | None = None,
    warn: Warn | None = None,
    backend: Backend | None = None,
) -> Healer:
    """Write the clean stream of ``source`` (a restarted ``btrfs send``) to the file ``target``
    (``-``: standard output), which appears only when the whole input was repaired.

    With ``keep_last`` only what follows the last restart is kept (``target`` must be
    seekable). The input's problems go to ``warn``, its restarts are in the healer returned.
    ``backend`` reads and checks (the default one without it).
    """
    skip = (e.StreamRestarted,)  # told in the healer's restarts
    with (
        FramedInput(source, max_command_size=max_command_size, warn=warn, skip=skip, backend=backend) as stream,
        atomic_output(target) as out,
    ):
        if keep_last and not out.seekable():
            raise e.UsageError("--keep-last needs OUT to be a file")

        def truncate(offset: int) -> None:
            out.flush()
            out.seek(offset)
            out.truncate(offset)

        healer = Healer(
            out.write, keep_last=keep_last, truncate=truncate if keep_last else None, backend=stream.framer.backend
        )
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
