"""The framer: one event at a time from a window of input its caller owns.

Frame first, check second: a command header's length is checked against
the stream's limit before its payload is waited for, then its CRC, then its
attributes (:mod:`.attributes`). On the native backend (:mod:`.backend`)
its scanner checks runs of commands ahead and the framer hands those out
unchecked again. A command that cannot be framed may be a restarted send
(:mod:`.restart`). :class:`~sendstream.codec.decoder.Decoder` buffers for
it; :mod:`sendstream.ops.verify` drives it over reused aligned buffers.
"""

from __future__ import annotations

from array import array

from .. import errors as e
from ..format.command import Command
from ..format.layout import (
    C_END,
    COMMAND_HEADER,
    COMMAND_HEADER_SIZE,
    MAX_COMMAND,
    MAX_VERSION,
    STREAM_HEADER,
    STREAM_HEADER_SIZE,
    STREAM_MAGIC,
    command_name,
)
from .attributes import ATTRIBUTE_SIZES, REQUIRED_ATTRIBUTES, Where, check_attributes, split_attributes
from .backend import Backend, default
from .events import NEED_DATA, EndOfInput, Event, NeedData, Restart, StreamHeader
from .limits import default_max_command_size
from .native import LENIENT_ATTRS, LENIENT_COMMANDS, LENIENT_STRICT
from .restart import RESTART_LENGTH, find_restart

_HDR_CRC_CACHE_MAX = 1 << 16
_CLEAN_AHEAD = 1024
_unpack_cmd = COMMAND_HEADER.unpack_from
_pack_cmd = COMMAND_HEADER.pack


def read_stream_header(
    mv: memoryview, pos: int, eof: bool, origin: int, streams: int
) -> StreamHeader | EndOfInput | int:
    """The stream header at ``pos``, the end of the input, or how many bytes from ``pos`` it needs.

    ``streams`` is how many streams came before: after one, the input may
    end, and anything but a header is trailing data.
    """
    avail = len(mv) - pos
    offset = origin + pos
    if avail < STREAM_HEADER_SIZE:
        head = bytes(mv[pos : pos + len(STREAM_MAGIC)])
        if not eof:
            if head == STREAM_MAGIC[: len(head)]:
                return STREAM_HEADER_SIZE
            raise _not_a_header(mv, pos, offset, streams)
        if avail == 0:
            if streams:
                return EndOfInput(offset)
            raise e.TruncatedStream("the input is empty", offset=offset, expected="a stream header")
        if head == STREAM_MAGIC[: len(head)]:
            raise e.TruncatedStream(
                "the input ends inside a stream header",
                offset=offset,
                expected=f"{STREAM_HEADER_SIZE} bytes",
                actual=avail,
            )
        raise _not_a_header(mv, pos, offset, streams)
    magic, version = STREAM_HEADER.unpack_from(mv, pos)
    if magic != STREAM_MAGIC:
        raise _not_a_header(mv, pos, offset, streams)
    if not 1 <= version <= MAX_VERSION:
        raise e.BadStreamHeader(
            "unsupported stream version", offset=offset, expected=f"1 to {MAX_VERSION}", actual=version
        )
    return StreamHeader(offset, version)


def _not_a_header(mv: memoryview, pos: int, offset: int, streams: int) -> e.FormatError:
    if streams:
        return e.TrailingData(
            f"{len(mv) - pos}+ bytes after the END of stream {streams}",
            offset=offset,
            expected="end of input or another stream header",
            actual=repr(bytes(mv[pos : pos + 16])),
        )
    return e.BadStreamHeader(
        "not a btrfs send stream",
        offset=offset,
        expected=repr(STREAM_MAGIC),
        actual=repr(bytes(mv[pos : pos + len(STREAM_MAGIC)])),
    )


class Framer:
    """Finds and checks one event at a time in a window its caller owns.

    :meth:`step` returns ``(event, new_pos, 0)`` or ``(NEED_DATA, pos,
    bytes_needed_from_pos)``, or raises :class:`~sendstream.errors.FormatError`.
    Values in returned commands are memoryviews into the caller's window.
    ``backend`` checks the commands (:func:`~sendstream.codec.backend.default` without one).
    """

    def __init__(
        self,
        *,
        strict: bool = False,
        check_names: bool = False,
        keep_going: bool = False,
        max_command_size: int | None = None,
        backend: Backend | None = None,
    ) -> None:
        if max_command_size is not None and max_command_size <= 0:
            raise e.UsageError(f"max_command_size must be a positive number of bytes, not {max_command_size}")
        self.strict = strict
        # With check_names, a name or path with a NUL is a warning (UnsafeValue): the
        # kernel never writes one, and btrfs receive would apply another path.
        self.check_names = check_names
        self.warnings = e.ProblemLog()
        # With keep_going, a framed command that fails its checks is recorded
        # in ``problems`` and returned raw, so checking goes on after it.
        self.keep_going = keep_going
        self.max_command_size = max_command_size
        self.version = 0  # 0: a stream header is expected next
        self.streams = 0
        self.commands = 0
        self.bytes = 0
        self.problems = e.ProblemLog()
        self.restarts = 0
        self._stream_start = 0
        self._limit = 0
        # On the native backend its scanner checks runs of commands ahead; the
        # offsets of those found clean wait here and skip the Python checks.
        self.backend = backend or default()
        self._crc32c = self.backend.crc32c
        self._clean = array("Q", bytes(8 * _CLEAN_AHEAD))
        self._clean_in: memoryview | None = None
        self._clean_next = self._clean_count = 0
        self._clean_lenient = False
        self._unknown = array("Q", [0, 0, 0])  # a lenient scan's flags and counts (Backend.scan)
        self._hdr_crc: dict[int, int] = {}

    @property
    def limit(self) -> int:
        """The length limit of the current stream (0 between streams)."""
        return self._limit if self.version else 0

    def start_stream(self, version: int) -> None:
        """Expect the commands of a stream of ``version`` next."""
        self._stream_start = self.commands
        self.version = version
        self._limit = self.max_command_size or default_max_command_size(version)

    def skip(self, commands: int, nbytes: int, *, ended: bool, unknown: array[int] | None = None) -> None:
        """Count commands a batch scanner checked; ``ended``: the last was END; ``unknown``:
        the counters of a lenient scan (:meth:`lenient`), whose problems are counted."""
        self.commands += commands
        self.bytes += nbytes
        self._clean_in = None  # what was checked ahead is behind the batch now; and the window may go
        if unknown is not None:
            self.problems.tally(unknown[1] + unknown[2])
        if ended:
            self.version = 0

    def lenient(self) -> array[int] | None:
        """Counters for a native scan that lets unknown commands and attributes through, when
        their problems are only counted by now (see ``ProblemLog.counts_only``); else None."""
        flags = LENIENT_COMMANDS if self.problems.counts_only(e.UnknownCommand) else 0
        if self.problems.counts_only(e.UnknownAttribute):
            flags |= LENIENT_ATTRS
        if not flags:
            return None
        if self.strict:
            flags |= LENIENT_STRICT
        self._unknown[0], self._unknown[1], self._unknown[2] = flags, 0, 0
        return self._unknown

    def step(self, mv: memoryview, pos: int, eof: bool, origin: int) -> tuple[Event | NeedData, int, int]:
        if self.version:
            return self._command(mv, pos, eof, origin)
        return self._stream_header(mv, pos, eof, origin)

    def _stream_header(self, mv: memoryview, pos: int, eof: bool, origin: int) -> tuple[Event | NeedData, int, int]:
        header = read_stream_header(mv, pos, eof, origin, self.streams)
        if isinstance(header, int):
            return NEED_DATA, pos, header
        if isinstance(header, EndOfInput):
            return header, pos, 0
        self.start_stream(header.version)
        self.streams += 1
        self.bytes += STREAM_HEADER_SIZE
        return header, pos + STREAM_HEADER_SIZE, 0

    def _command(self, mv: memoryview, pos: int, eof: bool, origin: int) -> tuple[Event | NeedData, int, int]:
        if self.backend.is_native and self._checked_ahead(mv, pos):
            return self._clean_command(mv, pos, origin)
        avail = len(mv) - pos
        if avail < COMMAND_HEADER_SIZE:
            if eof:
                return self._damaged(mv, pos, eof, origin, pos + avail, self._truncated(origin + pos, 10, avail))
            return NEED_DATA, pos, COMMAND_HEADER_SIZE
        length, cmd, crc = _unpack_cmd(mv, pos)
        if length > self._limit:
            return self._damaged(
                mv, pos, eof, origin, pos + COMMAND_HEADER_SIZE, self._too_large(pos, origin, length, cmd)
            )
        total = COMMAND_HEADER_SIZE + length
        if avail < total:
            if eof:
                return self._damaged(
                    mv, pos, eof, origin, pos + avail, self._truncated(origin + pos, total, avail, cmd)
                )
            return NEED_DATA, pos, total
        start = pos + COMMAND_HEADER_SIZE
        end = pos + total
        try:
            command = self._check(mv, pos, start, end, origin, length, cmd, crc)
        except e.FormatError as exc:
            restart = self._restart(mv, pos, eof, origin, end)
            if restart is not None:
                return restart
            if not self.keep_going:
                raise
            self.problems.append(exc.with_traceback(None))
            command = Command(
                cmd, None, payload=mv[start:end], offset=origin + pos, index=self.commands, crc=crc,
                version=self.version,
            )  # fmt: skip
        self.commands += 1
        self.bytes += total
        if cmd == C_END:
            self.version = 0
        return command, end, 0

    def _damaged(
        self, mv: memoryview, pos: int, eof: bool, origin: int, span_end: int, error: e.FormatError
    ) -> tuple[Event | NeedData, int, int]:
        """The command at ``pos`` cannot be framed: a restart, or ``error``."""
        restart = self._restart(mv, pos, eof, origin, span_end)
        if restart is None:
            raise error
        return restart

    def _restart(
        self, mv: memoryview, pos: int, eof: bool, origin: int, span_end: int
    ) -> tuple[Event | NeedData, int, int] | None:
        """A restarted stream whose header starts in ``[pos, span_end)``, or None (see :func:`find_restart`)."""
        found = find_restart(mv, pos, eof, origin, span_end, self.commands)
        if found is None:
            return None
        if isinstance(found, int):
            return NEED_DATA, pos, found
        event = Restart(origin + found.at, found.version, self.commands - self._stream_start, max(0, found.at - pos))
        self.problems.append(event.error(self.commands))
        self.restarts += 1
        self.bytes += found.at - pos + STREAM_HEADER_SIZE
        self.start_stream(found.version)
        return event, found.at + STREAM_HEADER_SIZE, 0

    def _checked_ahead(self, mv: memoryview, pos: int) -> bool:
        i = self._clean_next
        if i >= self._clean_count or self._clean_in is not mv or self._clean[i] != pos:
            unknown = self.lenient()
            self._clean_count = self.backend.scan(mv, pos, self.version, self._limit, self._clean, unknown=unknown)[3]
            self._clean_lenient = unknown is not None  # then counted as each command is handed out
            self._clean_in = mv
            self._clean_next = 0
        return self._clean_next < self._clean_count

    def _clean_command(self, mv: memoryview, pos: int, origin: int) -> tuple[Command, int, int]:
        self._clean_next += 1
        length, cmd, crc = _unpack_cmd(mv, pos)
        start = pos + COMMAND_HEADER_SIZE
        end = start + length
        if self._clean_lenient and cmd not in REQUIRED_ATTRIBUTES[self.version]:
            self.problems.tally()
            attrs = None
        else:
            attrs = split_attributes(mv, start, end, self.version, self.commands, None)
            if self._clean_lenient:
                sizes = ATTRIBUTE_SIZES[self.version]
                if unknown := sum(t not in sizes for t, _ in attrs):
                    if self.strict:
                        unknown = 1  # one problem, and the command raw, as the strict framer leaves it
                        attrs = None
                    self.problems.tally(unknown)
        command = Command(
            cmd, attrs, payload=None if attrs is not None else mv[start:end], offset=origin + pos,
            index=self.commands, crc=crc, version=self.version,
        )  # fmt: skip
        self.commands += 1
        self.bytes += end - pos
        if cmd == C_END:
            self.version = 0
            self._clean_in = None
        return command, end, 0

    def _check(
        self, mv: memoryview, pos: int, start: int, end: int, origin: int, length: int, cmd: int, crc: int
    ) -> Command:
        key = length << 16 | cmd
        seed = self._hdr_crc.get(key)
        if seed is None:
            if len(self._hdr_crc) >= _HDR_CRC_CACHE_MAX:
                self._hdr_crc.clear()
            seed = self._hdr_crc[key] = self._crc32c(_pack_cmd(length, cmd, 0))
        actual = self._crc32c(mv[start:end], seed)
        index = self.commands
        if actual != crc:
            raise e.CrcMismatch(
                "the command's bytes do not match its crc field",
                offset=origin + pos,
                index=index,
                command=command_name(cmd),
                expected=f"crc 0x{crc:08x} (from the header)",
                actual=f"0x{actual:08x}",
            )
        required = REQUIRED_ATTRIBUTES[self.version].get(cmd)
        if required is None:
            if not self.strict and self.problems.counts_only(e.UnknownCommand):
                self.problems.tally()
                return Command(
                    cmd, None, payload=mv[start:end], offset=origin + pos, index=index, crc=crc, version=self.version
                )
            problem = e.UnknownCommand(
                f"command number {cmd} is not defined in stream version {self.version}",
                offset=origin + pos,
                index=index,
                command=command_name(cmd),
                expected=f"1 to {MAX_COMMAND[self.version]}",
                actual=cmd,
            )
            if self.strict:
                raise problem
            self.problems.append(problem)
            return Command(
                cmd, None, payload=mv[start:end], offset=origin + pos, index=index, crc=crc, version=self.version
            )
        where = Where(origin, pos, index, cmd, self.version)
        attrs = check_attributes(
            mv, start, end, where, required,
            strict=self.strict, check_names=self.check_names, problems=self.problems, warnings=self.warnings,
        )  # fmt: skip
        return Command(cmd, attrs, offset=origin + pos, index=index, crc=crc, version=self.version)

    def _too_large(self, pos: int, origin: int, length: int, cmd: int) -> e.FormatError:
        hint = ""
        if length == RESTART_LENGTH:
            hint = " (these are the bytes 'btrf': a new stream header where a command should be)"
        return e.CommandTooLarge(
            f"command length {length} is over the limit{hint}",
            offset=origin + pos,
            index=self.commands,
            command=command_name(cmd),
            expected=f"at most {self._limit} bytes",
            actual=length,
        )

    def _truncated(self, offset: int, needed: int, avail: int, cmd: int | None = None) -> e.FormatError:
        return e.TruncatedStream(
            "the input ends inside a command" if avail else "the input ends before the stream's END command",
            offset=offset,
            index=self.commands,
            command=None if cmd is None else command_name(cmd),
            expected=f"{needed} bytes" if avail else "another command",
            actual=f"{avail} bytes" if avail else "end of input",
        )
