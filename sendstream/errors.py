"""The one exception hierarchy of sendstream.

Corrupt input (:class:`FormatError` and its leaves) and caller misuse
(:class:`UsageError`) are separate branches of :class:`SendStreamError`.
Every format error carries the byte offset, the command index and name, and
what was expected, plus the exit code the CLI maps it to.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

# Exit codes, documented in the README; the CLI maps errors to them in one place.
EXIT_OK = 0
EXIT_CORRUPT = 1
EXIT_USAGE = 2
EXIT_TRUNCATED = 3
EXIT_IO = 4
EXIT_RESTARTED = 5
EXIT_TLS = 6
EXIT_CHILD = 7
EXIT_LIMIT = 8


class SendStreamError(Exception):
    """Root of every error sendstream raises on purpose."""

    exit_code = EXIT_CORRUPT


class UsageError(SendStreamError):
    """The caller misused the library (not a problem of the stream)."""

    exit_code = EXIT_USAGE


class RemoteError(SendStreamError):
    """The peer reported a failure (its exit code is kept)."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class OutputError(SendStreamError):
    """An output file could not be made or written; names the file, not a temporary name."""

    exit_code = EXIT_IO

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        super().__init__(f"cannot write {path!r}: {reason}")


class InputChanged(SendStreamError):
    """A regular input file lost data while it was read (truncated, rewritten, or an I/O error)."""

    exit_code = EXIT_IO

    def __init__(self, offset: int, size: int | None) -> None:
        self.offset = offset
        now = f" (it has {size} bytes now)" if size is not None else ""
        super().__init__(
            f"offset {offset}: the input file has no data here any more{now}: it was truncated or "
            "rewritten while it was read, or reading it failed"
        )


class ChildFailed(SendStreamError):
    """The command given to ``receive --exec`` failed."""

    exit_code = EXIT_CHILD


class LimitExceeded(SendStreamError):
    """The input asks for more than a limit allows (memory, output, copies).

    ``option`` names the command-line option that raises ``limit``; the
    input may be legitimate, just larger than the default allows.
    """

    exit_code = EXIT_LIMIT

    def __init__(
        self,
        message: str,
        *,
        limit: int,
        option: str,
        offset: int | None = None,
        index: int | None = None,
        command: str | None = None,
    ) -> None:
        self.message = message
        self.limit = limit
        self.option = option
        self.offset = offset
        self.index = index
        self.command = command
        super().__init__(str(self))

    def __str__(self) -> str:
        where = ""
        if self.offset is not None:
            where = f"offset {self.offset}"
            if self.index is not None:
                where += f", command #{self.index}"
            if self.command is not None:
                where += f" ({self.command})"
            where += ": "
        return f"{where}limit reached: {self.message} (the limit is {self.limit}; {self.option} raises it)"


class FormatError(SendStreamError):
    """The stream breaks the send-stream format."""

    exit_code = EXIT_CORRUPT
    kind = "format error"

    def __init__(
        self,
        message: str,
        *,
        offset: int,
        index: int | None = None,
        command: str | None = None,
        attribute: str | None = None,
        expected: object = None,
        actual: object = None,
    ) -> None:
        self.message = message
        self.offset = offset
        self.index = index
        self.command = command
        self.attribute = attribute
        self.expected = expected
        self.actual = actual
        super().__init__(str(self))

    def __str__(self) -> str:
        where = f"offset {self.offset}"
        if self.index is not None:
            where += f", command #{self.index}"
        if self.command is not None:
            where += f" ({self.command})"
        text = f"{where}: {self.kind}: {self.message}"
        if self.attribute is not None:
            text += f" [attribute {self.attribute}]"
        if self.expected is not None:
            text += f"; expected {self.expected}"
            if self.actual is not None:
                text += f", got {self.actual}"
        return text


class BadStreamHeader(FormatError):
    kind = "bad stream header"


class CommandTooLarge(FormatError):
    kind = "command too large"


class CrcMismatch(FormatError):
    kind = "crc32c mismatch"


class BadAttribute(FormatError):
    kind = "bad attribute"


class DuplicateAttribute(BadAttribute):
    kind = "duplicate attribute"


class UnknownAttribute(BadAttribute):
    kind = "unknown attribute"


class MissingAttribute(BadAttribute):
    kind = "missing attribute"


class AttributeSize(BadAttribute):
    kind = "bad attribute size"


class UnsafeValue(BadAttribute):
    """A name or path with a NUL byte: the kernel never writes one, and btrfs
    receive would cut the path there and apply another one (``verify`` reports it)."""

    kind = "cannot be applied safely"


class UnknownCommand(FormatError):
    kind = "unknown command"


class StreamRestarted(FormatError):
    """A new stream header in the middle of a stream: the send ioctl restarted."""

    exit_code = EXIT_RESTARTED
    kind = "restarted send (`sendstream repair` writes the clean stream)"


class ReplayDiverges(FormatError):
    """After a restart, the replayed commands are not the ones written before."""

    exit_code = EXIT_RESTARTED
    kind = "replay differs"


class TrailingData(FormatError):
    kind = "trailing data"


class TruncatedStream(FormatError):
    """The input ended inside a header or command, or before END."""

    exit_code = EXIT_TRUNCATED
    kind = "truncated stream"


class ProblemLog(Sequence[FormatError]):
    """The problems found in one input: every one counted, the first ``keep`` kept.

    A hostile input can hold millions of problems (a stream of unknown
    commands), so memory stays at ``keep`` errors (and the first of each kind), whatever
    the input; ``total`` is exact. Iteration and indexing see the kept ones.
    """

    KEEP = 100

    def __init__(self, keep: int = KEEP) -> None:
        self._keep = keep
        self._kept: list[FormatError] = []
        self.total = 0
        # the first of each kind, kept whatever the count: the exit code is chosen by kind
        self.first_of: dict[type[FormatError], FormatError] = {}

    def append(self, problem: FormatError) -> None:
        self.total += 1
        self.first_of.setdefault(type(problem), problem)
        if len(self._kept) < self._keep:
            self._kept.append(problem)

    def counts_only(self, kind: type[FormatError]) -> bool:
        """True when a problem of ``kind`` would not be kept: then :meth:`tally` it
        instead of making the error (a hostile input holds millions)."""
        return len(self._kept) >= self._keep and kind in self.first_of

    def tally(self, n: int = 1) -> None:
        """Count ``n`` more problems of a kind for which :meth:`counts_only` is true."""
        self.total += n

    @property
    def dropped(self) -> int:
        """Problems counted but not kept."""
        return self.total - len(self._kept)

    @overload
    def __getitem__(self, i: int) -> FormatError: ...

    @overload
    def __getitem__(self, i: slice) -> Sequence[FormatError]: ...

    def __getitem__(self, i: int | slice) -> FormatError | Sequence[FormatError]:
        return self._kept[i]

    def __len__(self) -> int:
        return len(self._kept)

    def __iter__(self) -> Iterator[FormatError]:
        return iter(self._kept)

    def __repr__(self) -> str:
        return f"<ProblemLog {self.total} problems, {len(self._kept)} kept>"
