"""The sans-IO decoder: bytes in, events out.

:class:`Framer` steps through a window of input that its caller owns and
returns one event at a time; :class:`Decoder` owns its buffering on top of
it, and :mod:`sendstream.verify` drives the same framer over reused aligned
buffers. Neither touches a file or a socket.
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass

from .. import errors as e
from ..format.command import Command
from ..format.layout import (
    A_DATA,
    ATTRIBUTES,
    C_END,
    COMMAND_HEADER,
    COMMAND_HEADER_SIZE,
    COMMANDS,
    MAX_ATTRIBUTE,
    MAX_COMMAND,
    MAX_VERSION,
    SEND_BUF_SIZE,
    STREAM_HEADER,
    STREAM_HEADER_SIZE,
    STREAM_MAGIC,
    TLV_HEADER,
    TLV_HEADER_SIZE,
    TLV_TYPE,
    attribute_name,
    command_name,
)
from . import native
from .crc import crc32c


@dataclass(frozen=True, slots=True)
class StreamHeader:
    """A stream header ("btrfs-stream", version) at ``offset``."""

    offset: int
    version: int


@dataclass(frozen=True, slots=True)
class Restart:
    """A restarted send at ``offset``: a new header of ``version`` after
    ``commands`` complete commands of the stream and ``partial`` bytes of an
    unfinished one. The whole stream follows again."""

    offset: int
    version: int
    commands: int
    partial: int

    def error(self, index: int) -> e.StreamRestarted:
        """The problem this restart is, found before command ``index`` of the input."""
        return e.StreamRestarted(
            f"stream restarted at offset {self.offset} after {self.commands} complete commands; "
            f"{self.partial} bytes of a partial command before it",
            offset=self.offset,
            index=index,
        )


@dataclass(frozen=True, slots=True)
class EndOfInput:
    """The input ended cleanly after a complete stream, at ``offset``."""

    offset: int


class NeedData:
    """Returned when the next event needs more input."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA = NeedData()
Event = StreamHeader | Command | Restart | EndOfInput

# The header of the stream's next command is the start of a new stream header:
# what a restarted send ioctl leaves behind (see FORMAT.md).
RESTART_LENGTH = int.from_bytes(STREAM_MAGIC[:4], "little")

_HDR_CRC_CACHE_MAX = 1 << 16
_CLEAN_AHEAD = 1024
# A restart header can begin in the last bytes of a command that happen to
# equal its first ones; windows keep this many bytes before their position.
HISTORY = 16
_unpack_cmd = COMMAND_HEADER.unpack_from
_unpack_tlv = TLV_HEADER.unpack_from
_unpack_type = TLV_TYPE.unpack_from
_pack_cmd = COMMAND_HEADER.pack
_END_COMMAND = _pack_cmd(0, C_END, crc32c(_pack_cmd(0, C_END, 0)))

# Per version: known attribute number -> fixed value size (None: variable).
_ATTR_SIZES: dict[int, dict[int, int | None]] = {
    v: {n: a.size for n, a in ATTRIBUTES.items() if n <= MAX_ATTRIBUTE[v]} for v in range(1, MAX_VERSION + 1)
}
# Names and paths: the kernel never writes a NUL in them.
_STRINGS = frozenset(n for n, a in ATTRIBUTES.items() if a.kind == "string")
# Per version: known command number -> required attribute numbers.
_REQUIRED: dict[int, dict[int, frozenset[int]]] = {
    v: {n: frozenset(s.required) for n, s in COMMANDS.items() if n <= MAX_COMMAND[v]} for v in range(1, MAX_VERSION + 1)
}


@dataclass(frozen=True, slots=True)
class _Where:
    """Where a command sits, for its errors: window origin and position, index, number, stream version."""

    origin: int
    pos: int
    index: int
    cmd: int
    version: int = MAX_VERSION

    def error(
        self,
        cls: type[e.FormatError],
        message: str,
        at: int,
        attr: int | None,
        expected: object,
        actual: object = None,
    ) -> e.FormatError:
        return cls(
            message,
            offset=self.origin + at,
            index=self.index,
            command=command_name(self.cmd),
            attribute=None if attr is None else attribute_name(attr, self.version),
            expected=expected,
            actual=actual,
        )


# The largest --max-command-size: a command is held whole in memory before it is checked.
MAX_COMMAND_SIZE = 256 << 20  # (the library takes any limit its caller chooses)


def default_max_command_size(version: int) -> int:
    """The largest payload the kernel can write in a stream of ``version``."""
    return SEND_BUF_SIZE[min(max(version, 1), MAX_VERSION)]


class Framer:
    """Finds and checks one event at a time in a window its caller owns.

    :meth:`step` returns ``(event, new_pos, 0)`` or ``(NEED_DATA, pos,
    bytes_needed_from_pos)``, or raises :class:`~sendstream.errors.FormatError`.
    Values in returned commands are memoryviews into the caller's window.
    """

    def __init__(
        self,
        *,
        strict: bool = False,
        check_names: bool = False,
        keep_going: bool = False,
        max_command_size: int | None = None,
        batch: bool = native.NATIVE,
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
        # With batch, the native scanner checks runs of commands ahead; the
        # offsets of those found clean wait here and skip the Python checks.
        self._batch = batch
        self._clean = array("Q", bytes(8 * _CLEAN_AHEAD))
        self._clean_in: memoryview | None = None
        self._clean_next = self._clean_count = 0
        self._clean_lenient = False
        self._unknown = array("Q", [0, 0, 0])  # a lenient scan's flags and counts (native.native_scan)
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
        if unknown is not None:
            self.problems.tally(unknown[1] + unknown[2])
        if ended:
            self.version = 0

    def lenient(self) -> array[int] | None:
        """Counters for a native scan that lets unknown commands and attributes through, when
        their problems are only counted by now (see ``ProblemLog.counts_only``); else None."""
        flags = native.LENIENT_COMMANDS if self.problems.counts_only(e.UnknownCommand) else 0
        if self.problems.counts_only(e.UnknownAttribute):
            flags |= native.LENIENT_ATTRS
        if not flags:
            return None
        if self.strict:
            flags |= native.LENIENT_STRICT
        self._unknown[0], self._unknown[1], self._unknown[2] = flags, 0, 0
        return self._unknown

    def step(self, mv: memoryview, pos: int, eof: bool, origin: int) -> tuple[Event | NeedData, int, int]:
        if self.version:
            return self._command(mv, pos, eof, origin)
        return self._stream_header(mv, pos, eof, origin)

    def _stream_header(self, mv: memoryview, pos: int, eof: bool, origin: int) -> tuple[Event | NeedData, int, int]:
        avail = len(mv) - pos
        offset = origin + pos
        if avail < STREAM_HEADER_SIZE:
            head = bytes(mv[pos : pos + len(STREAM_MAGIC)])
            if not eof:
                if head == STREAM_MAGIC[: len(head)]:
                    return NEED_DATA, pos, STREAM_HEADER_SIZE
                return self._bad_start(mv, pos, offset)
            if avail == 0:
                if self.streams:
                    return EndOfInput(offset), pos, 0
                raise e.TruncatedStream("the input is empty", offset=offset, expected="a stream header")
            if head == STREAM_MAGIC[: len(head)]:
                raise e.TruncatedStream(
                    "the input ends inside a stream header",
                    offset=offset,
                    expected=f"{STREAM_HEADER_SIZE} bytes",
                    actual=avail,
                )
            return self._bad_start(mv, pos, offset)
        magic, version = STREAM_HEADER.unpack_from(mv, pos)
        if magic != STREAM_MAGIC:
            return self._bad_start(mv, pos, offset)
        if not 1 <= version <= MAX_VERSION:
            raise e.BadStreamHeader(
                "unsupported stream version", offset=offset, expected=f"1 to {MAX_VERSION}", actual=version
            )
        self.start_stream(version)
        self.streams += 1
        self.bytes += STREAM_HEADER_SIZE
        return StreamHeader(offset, version), pos + STREAM_HEADER_SIZE, 0

    def _bad_start(self, mv: memoryview, pos: int, offset: int) -> tuple[Event | NeedData, int, int]:
        if self.streams:
            raise e.TrailingData(
                f"{len(mv) - pos}+ bytes after the END of stream {self.streams}",
                offset=offset,
                expected="end of input or another stream header",
                actual=repr(bytes(mv[pos : pos + 16])),
            )
        raise e.BadStreamHeader(
            "not a btrfs send stream",
            offset=offset,
            expected=repr(STREAM_MAGIC),
            actual=repr(bytes(mv[pos : pos + len(STREAM_MAGIC)])),
        )

    def _command(self, mv: memoryview, pos: int, eof: bool, origin: int) -> tuple[Event | NeedData, int, int]:
        if self._batch and self._checked_ahead(mv, pos):
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
        """Look for a restarted stream: a new header starting in ``[pos, span_end)``.

        A restarted send ioctl writes a fresh header (and the whole stream
        again) after what it wrote before, often after part of a command. A
        header counts only when the command after it checks out.
        """
        end = len(mv)
        lo = max(0, pos - len(STREAM_MAGIC) + 1)  # it may begin in the last bytes before pos
        hi = min(end, span_end + STREAM_HEADER_SIZE)
        found = bytes(mv[lo:hi]).find(STREAM_MAGIC)
        at = lo + found if found >= 0 else -1
        if at < 0 or at >= span_end:
            window = bytes(mv[lo:hi])
            if not eof:
                # a header may still start where the data runs out, in the last bytes before pos too
                for h in range(max(lo, hi - len(STREAM_MAGIC) + 1), span_end):
                    if STREAM_MAGIC.startswith(window[h - lo :]):
                        return NEED_DATA, pos, h - pos + STREAM_HEADER_SIZE + COMMAND_HEADER_SIZE
            tail = next((k for k in range(len(STREAM_MAGIC) - 1, 3, -1) if window.endswith(STREAM_MAGIC[:k])), 0)
            if eof and tail and hi == end and hi - tail < span_end:
                raise e.TruncatedStream(
                    "the input ends inside a restarted stream header",
                    offset=origin + end - tail,
                    index=self.commands,
                    expected=f"{STREAM_HEADER_SIZE} bytes",
                    actual=f"{tail} bytes",
                )
            return None
        if mv[max(0, at - COMMAND_HEADER_SIZE) : at] == _END_COMMAND:
            return None  # the next of several streams back to back, not a restart
        first = at + STREAM_HEADER_SIZE
        if end - first >= COMMAND_HEADER_SIZE:
            version = int.from_bytes(mv[at + 13 : first], "little")
            if not 1 <= version <= MAX_VERSION:
                return None
            length, cmd, crc = _unpack_cmd(mv, first)
            if length > default_max_command_size(version):
                return None
            body_end = first + COMMAND_HEADER_SIZE + length
            if body_end <= end:
                if crc32c(mv[first + COMMAND_HEADER_SIZE : body_end], crc32c(_pack_cmd(length, cmd, 0))) != crc:
                    return None
                return self._restarted(origin, pos, at, version)
        else:
            body_end = first + COMMAND_HEADER_SIZE
        if eof:
            raise e.TruncatedStream(
                "the input ends inside a restarted stream",
                offset=origin + at,
                index=self.commands,
                expected="a stream header and a complete first command",
                actual=f"{end - at} bytes",
            )
        return NEED_DATA, pos, body_end - pos

    def _restarted(self, origin: int, pos: int, at: int, version: int) -> tuple[Event, int, int]:
        event = Restart(origin + at, version, self.commands - self._stream_start, max(0, at - pos))
        self.problems.append(event.error(self.commands))
        self.restarts += 1
        self.bytes += at - pos + STREAM_HEADER_SIZE
        self.start_stream(version)
        return event, at + STREAM_HEADER_SIZE, 0

    def _checked_ahead(self, mv: memoryview, pos: int) -> bool:
        i = self._clean_next
        if i >= self._clean_count or self._clean_in is not mv or self._clean[i] != pos:
            unknown = self.lenient()
            self._clean_count = native.native_scan(mv, pos, self.version, self._limit, self._clean, unknown=unknown)[3]
            self._clean_lenient = unknown is not None  # then counted as each command is handed out
            self._clean_in = mv
            self._clean_next = 0
        return self._clean_next < self._clean_count

    def _clean_command(self, mv: memoryview, pos: int, origin: int) -> tuple[Command, int, int]:
        self._clean_next += 1
        length, cmd, crc = _unpack_cmd(mv, pos)
        start = pos + COMMAND_HEADER_SIZE
        end = start + length
        if self._clean_lenient and cmd not in _REQUIRED[self.version]:
            self.problems.tally()
            attrs = None
        else:
            attrs = self._split(mv, start, end, None)
            if self._clean_lenient:
                sizes = _ATTR_SIZES[self.version]
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
            seed = self._hdr_crc[key] = crc32c(_pack_cmd(length, cmd, 0))
        actual = crc32c(mv[start:end], seed)
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
        required = _REQUIRED[self.version].get(cmd)
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
        attrs = self._attributes(mv, start, end, _Where(origin, pos, index, cmd, self.version), required)
        return Command(cmd, attrs, offset=origin + pos, index=index, crc=crc, version=self.version)

    def _split(
        self, mv: memoryview, p: int, end: int, where: _Where | None, offsets: list[int] | None = None
    ) -> list[tuple[int, memoryview | bytes]]:
        """The TLVs of a payload, in order; ``offsets`` gets where each starts.

        ``where`` is None for commands the native scanner found clean, which
        cannot fail here."""
        data_rest = self.version >= 2
        attrs: list[tuple[int, memoryview | bytes]] = []
        while p < end:
            if offsets is not None:
                offsets.append(p)
            if data_rest and end - p >= 2 and _unpack_type(mv, p)[0] == A_DATA:
                attrs.append((A_DATA, mv[p + 2 : end]))
                break
            if end - p < TLV_HEADER_SIZE:
                raise (where or _Where(0, p, self.commands, 0)).error(
                    e.BadAttribute,
                    "the command ends inside an attribute header",
                    p,
                    None,
                    f"{TLV_HEADER_SIZE} bytes",
                    end - p,
                )
            t, n = _unpack_tlv(mv, p)
            if p + TLV_HEADER_SIZE + n > end:
                raise (where or _Where(0, p, self.commands, 0)).error(
                    e.BadAttribute, "the attribute runs past the end of its command", p, t,
                    f"at most {end - p - TLV_HEADER_SIZE} bytes", n,
                )  # fmt: skip
            p += TLV_HEADER_SIZE
            attrs.append((t, mv[p : p + n]))
            p += n
        return attrs

    def _attributes(
        self, mv: memoryview, p: int, end: int, where: _Where, required: frozenset[int]
    ) -> list[tuple[int, memoryview | bytes]]:
        """The TLVs of a payload, with every rule of the version checked.

        Problems and warnings are recorded only once the whole command passed:
        a command that fails may be checked again when more input comes (a
        restart may begin in it), and must not be counted twice.
        """
        offsets: list[int] = []
        attrs = self._split(mv, p, end, where, offsets)
        sizes = _ATTR_SIZES[self.version]
        seen: set[int] = set()
        problems: list[e.FormatError] = []
        counted = 0
        unsafe: list[e.FormatError] = []
        for (t, value), at in zip(attrs, offsets, strict=True):
            if t in seen:
                raise where.error(e.DuplicateAttribute, "the attribute appears twice", at, t, "each attribute once")
            seen.add(t)
            if t not in sizes:
                if not self.strict and self.problems.counts_only(e.UnknownAttribute):
                    counted += 1
                    continue
                problem = where.error(
                    e.UnknownAttribute, f"attribute type {t} is not defined in stream version {self.version}", at, t,
                    f"1 to {MAX_ATTRIBUTE[self.version]}", t,
                )  # fmt: skip
                if self.strict:
                    raise problem
                problems.append(problem)
            elif (size := sizes[t]) is not None and len(value) != size:
                raise where.error(e.AttributeSize, "the value has the wrong size", at, t, f"{size} bytes", len(value))
            elif self.check_names and t in _STRINGS and b"\0" in bytes(value):
                unsafe.append(
                    where.error(
                        e.UnsafeValue, "it holds a NUL byte, where btrfs receive would cut it and use another path",
                        at, t, "no NUL byte", f"a NUL at byte {bytes(value).index(0)}",
                    )
                )  # fmt: skip
        if not required <= seen:
            raise where.error(
                e.MissingAttribute, "a required attribute is absent", where.pos, min(required - seen), "present"
            )
        for problem in problems:
            self.problems.append(problem)
        self.problems.tally(counted)
        for warning in unsafe:
            self.warnings.append(warning)
        return attrs

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


class Decoder:
    """Sans-IO send-stream decoder.

    Feed bytes with :meth:`receive_data` (``b""`` means end of input) and
    call :meth:`next_event` until it returns :data:`NEED_DATA`. Events are
    :class:`StreamHeader`, :class:`~sendstream.command.Command` (END
    included) and, once, :class:`EndOfInput`. Several streams may follow
    each other. ``next_event`` returns an event or raises
    :class:`~sendstream.errors.FormatError`; anything else is a bug. After an
    error the decoder stays failed.

    Memory is bounded: a command header's length is checked against
    ``max_command_size`` (default: the kernel's limit for the stream's
    version) before its payload is waited for.
    """

    def __init__(self, *, strict: bool = False, max_command_size: int | None = None, offset: int = 0) -> None:
        self._framer = Framer(strict=strict, max_command_size=max_command_size)
        self._data: bytes = b""
        self._mv = memoryview(self._data)
        self._pos = 0
        self._origin = offset  # input offset of _data[0] (or of _pending[0])
        self._pending = bytearray()  # a partial event being completed
        self._need = 0
        self._skip = 0  # where _pending's next event starts, after the kept history
        self._eof = False
        self._error: e.FormatError | None = None
        self._done = False

    @property
    def framer(self) -> Framer:
        """Counters (streams, commands, bytes) and lenient-mode problems."""
        return self._framer

    @property
    def offset(self) -> int:
        """Input offset of the next byte not yet turned into an event."""
        return self._origin + self._pos

    def receive_data(self, data: bytes | bytearray | memoryview) -> None:
        if self._eof:
            raise e.UsageError("receive_data() after the end of input")
        if not data:
            self._eof = True
            return
        if not self._pending:
            keep = min(self._pos, HISTORY)
            self._pending += self._mv[self._pos - keep :]
            self._origin += self._pos - keep
            self._skip = keep
            self._reset(b"")
        self._pending += data

    def _reset(self, data: bytes) -> None:
        self._data = data
        self._mv = memoryview(data)
        self._pos = 0

    def next_event(self) -> Event | NeedData:
        if self._error is not None:
            raise self._error
        if self._done:
            return NEED_DATA
        if self._pending:
            if len(self._pending) - self._skip < self._need and not self._eof:
                return NEED_DATA
            self._reset(bytes(self._pending))
            self._pos = self._skip
            self._pending.clear()
        try:
            event, pos, need = self._framer.step(self._mv, self._pos, self._eof, self._origin)
        except e.FormatError as exc:
            self._error = exc
            raise
        self._pos = pos
        self._need = need
        if isinstance(event, EndOfInput):
            self._done = True
        return event

    def events(self) -> list[Event]:
        """Every event available now (convenience for tests and small inputs)."""
        out: list[Event] = []
        while not isinstance(ev := self.next_event(), NeedData):
            out.append(ev)
            if isinstance(ev, EndOfInput):
                break
        return out
