"""The one exception hierarchy of sendstream, and the exit codes the CLI maps it to.

Corrupt input (:class:`FormatError` and its leaves) and caller misuse
(:class:`UsageError`) are separate branches of :class:`SendStreamError`.
Every error about a place in a stream (a format error, an extraction that
failed, a limit reached) says where with one mixin, :class:`Located`: the
byte offset, the command index and name, and what was expected. Causes are
data, not text to parse: a :class:`TlsError` has a :class:`TlsCause`, and
whether a new connection may cure it (``retryable``).
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterator, Sequence
from typing import overload

# Exit codes, documented in docs/reference/exit-codes.md and the manual page; the CLI maps errors to them in one place.
EXIT_OK = 0
EXIT_CORRUPT = 1
EXIT_USAGE = 2
EXIT_TRUNCATED = 3
EXIT_IO = 4
EXIT_RESTARTED = 5
EXIT_TLS = 6
EXIT_CHILD = 7
EXIT_LIMIT = 8
EXIT_NOT_FOUND = 9
EXIT_BACKUP_FAILED = 10
EXIT_STALE = 11
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports Ctrl-C


class SendStreamError(Exception):
    """Root of every error sendstream raises on purpose."""

    exit_code = EXIT_CORRUPT


class UsageError(SendStreamError):
    """The caller misused the library (not a problem of the stream)."""

    exit_code = EXIT_USAGE


class BadPolicy(UsageError):
    """A retention setting that does not parse: which ``setting``, its ``value``, what was ``expected``."""

    def __init__(self, setting: str, value: object, expected: str) -> None:
        super().__init__(f"{setting} = {value!r}: expected {expected}")
        self.setting, self.value, self.expected = setting, value, expected


class ConfigError(UsageError):
    """A settings file is wrong: ``where`` is ``FILE:LINE`` (or ``FILE``)."""

    def __init__(self, where: str, message: str) -> None:
        super().__init__(f"{where}: {message}")
        self.where = where


class BackupFailed(SendStreamError):
    """What failed in a backup run (the rest was done): ``failed`` names each target (or a subvolume's
    snapshot taken or deleted), with why."""

    exit_code = EXIT_BACKUP_FAILED

    def __init__(self, failed: dict[str, str]) -> None:
        super().__init__(f"{len(failed)} failed: " + "; ".join(f"{n}: {w}" for n, w in failed.items()))
        self.failed = failed


class Stale(SendStreamError):
    """``backup status`` found targets whose newest snapshot is older than their ``warn_after`` (or none):
    ``stale`` names each (``SUBVOLUME -> TARGET``)."""

    exit_code = EXIT_STALE

    def __init__(self, stale: list[str]) -> None:
        super().__init__(f"behind: {', '.join(stale)}")
        self.stale = stale


class RunLocked(SendStreamError):
    """Another backup run holds the lock (``path``, by process ``holder``)."""

    exit_code = EXIT_IO

    def __init__(self, path: str, holder: str) -> None:
        super().__init__(f"another backup run holds {path} (process {holder}): this one stops")
        self.path, self.holder = path, holder


class AttributeNotFound(UsageError, KeyError):
    """``Command.get`` of an attribute the command does not have, or a name no attribute has;
    ``has`` lists the attributes the command has. A :class:`KeyError`, as a mapping's would be."""

    def __init__(self, key: str | int, command: str, has: list[str], known: bool = True) -> None:
        super().__init__(key)
        self.key, self.command, self.has = key, command, has
        self.message = (
            f"{command} has no attribute {key!r}; it has: {', '.join(has) or 'none'}"
            if known
            else f"no attribute is called {key!r}; {command} has: {', '.join(has) or 'none'}"
        )

    def __str__(self) -> str:
        return self.message


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


def shown(raw: bytes) -> str:
    """A name or path of a stream in a message: undecodable bytes and control characters escaped."""
    text = raw.decode("utf-8", "backslashreplace")
    return text if text.isprintable() else "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def escaped(text: str) -> str:
    """A name as Python holds it (its undecodable bytes as surrogates, :func:`os.fsdecode`) in a message,
    a log or a label: printable, escaped as :func:`shown` escapes."""
    if text.isprintable():
        return text
    try:
        return shown(os.fsencode(text))
    except UnicodeEncodeError:  # a surrogate that stands for no byte
        return shown(text.encode("utf-8", "backslashreplace"))


class Located:
    """Where in a stream an error happened, and what was expected there.

    ``offset`` (of the command, or of the attribute at fault), ``index`` and
    ``command`` (its number among the input's commands, and its name), and
    where it applies ``attribute``, ``path``, ``expected`` and ``actual``.
    """

    kind = "error"
    message: str
    offset: int | None
    index: int | None = None
    command: str | None = None
    attribute: str | None = None
    path: bytes | None = None
    expected: object = None
    actual: object = None

    def where(self) -> str:
        """``offset 705, command #12 (write), path 'f'``, as far as known."""
        parts = []
        if self.offset is not None:
            parts.append(f"offset {self.offset}")
        if self.index is not None:
            parts.append(f"command #{self.index}")
        if self.command is not None:
            if parts:
                parts[-1] += f" ({self.command})"
            else:
                parts.append(self.command)
        if self.path is not None:
            parts.append(f"path '{shown(self.path)}'")
        return ", ".join(parts)

    def __str__(self) -> str:
        where = self.where()
        text = f"{where}: " if where else ""
        text += f"{self.kind}: {self.message}"
        if self.attribute is not None:
            text += f" [attribute {self.attribute}]"
        if self.expected is not None:
            text += f"; expected {self.expected}"
            if self.actual is not None:
                text += f", got {self.actual}"
        return text


class LimitExceeded(Located, SendStreamError):
    """The input asks for more than a limit allows (memory, output, copies).

    ``option`` names the command-line option that raises ``limit``; the
    input may be legitimate, just larger than the default allows.
    """

    exit_code = EXIT_LIMIT
    kind = "limit reached"

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
        self.message = f"{message} (the limit is {limit}; {option} raises it)"
        self.limit = limit
        self.option = option
        self.offset = offset
        self.index = index
        self.command = command
        super().__init__(str(self))


class FormatError(Located, SendStreamError):
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


class ManifestMismatch(FormatError):
    """A stored stream checks clean command by command, but is not what its manifest says it is."""

    kind = "differs from its manifest"


class DowngradeError(FormatError):
    """A command that cannot be expressed in v1 (encrypted data, bad compressed data)."""

    kind = "cannot downgrade"


class PrefixDiffers(FormatError):
    """The stream read again is not the one the resume token is for."""

    exit_code = EXIT_USAGE
    kind = "another stream"


class ResumeError(SendStreamError):
    """A resume token or resume state that cannot be used."""

    exit_code = EXIT_USAGE


class StoreError(SendStreamError):
    """An object store refused or failed a request; names the object (``s3://BUCKET/KEY``) and why."""

    exit_code = EXIT_IO

    def __init__(self, where: str, reason: str, retryable: bool = False) -> None:
        self.where, self.reason, self.retryable = where, reason, retryable  # retryable: it may work later
        super().__init__(escaped(f"{where}: {reason}"))  # a listed key may hold any character


class ClusterError(SendStreamError):
    """The cluster a check was given to (``verify --scheduler``) could not be reached, or could not check a
    stream: its scheduler, its workers, or the engine itself."""

    exit_code = EXIT_IO


class NothingFound(SendStreamError):
    """Nothing is where a command was told to look: a prefix with no archived stream, a snapshot no
    stream makes (a typo, under cron, must not pass as an empty success)."""

    exit_code = EXIT_NOT_FOUND


class RestoreStopped(SendStreamError):
    """A restore stopped inside one stream of its chain: ``cause`` says why, ``left`` what its consumer
    was left with (the stream's END is held back until the stream is its manifest's)."""

    def __init__(self, stream: str, cause: SendStreamError, left: str) -> None:
        self.stream, self.cause, self.left = stream, cause, left
        self.exit_code = cause.exit_code
        super().__init__(f"{stream}: {cause}" + (f"; {left}" if left else ""))


class BadManifest(SendStreamError):
    """An archive holds manifests that cannot be taken as they are: one that is not ours or says another
    stream than its name, or streams whose parents go round in a circle. ``streams``: their names.
    The rest of the archive is read all the same; the command exits with this code at its end."""

    exit_code = EXIT_CORRUPT

    def __init__(self, where: str, reason: str, streams: tuple[str, ...] = ()) -> None:
        self.where, self.reason, self.streams = where, reason, streams
        super().__init__(f"{where}: {reason}")


# --- extraction ---------------------------------------------------------------------------------------------------


class ExtractError(Located, SendStreamError):
    """Applying a stream failed at a command; nothing of that command was done.

    Like :class:`FormatError` it says where (:class:`Located`), plus the
    ``path`` the command names and, for an error of the file system, its
    ``errno``; the extractor fills in the place when it is not given.
    """

    kind = "cannot extract"
    exit_code = EXIT_CORRUPT

    def __init__(
        self,
        message: str,
        *,
        offset: int | None = None,
        index: int | None = None,
        command: str | None = None,
        path: bytes | None = None,
        expected: object = None,
        actual: object = None,
        errno: int | None = None,
    ) -> None:
        self.message = message
        self.offset = offset
        self.index = index
        self.command = command
        self.path = path
        self.expected = expected
        self.actual = actual
        self.errno = errno
        super().__init__(message)


class UnsafePath(ExtractError):
    """The stream names a path that leaves DIR or goes through a symlink."""

    kind = "unsafe path"


class BadCommand(ExtractError):
    """A command's values cannot be applied (out of range, bad compressed data, a command out of place)."""

    kind = "bad command"


class ApplyError(ExtractError):
    """The file system refused the command (the errno is kept)."""

    kind = "cannot apply"
    exit_code = EXIT_IO


class CloneSourceMissing(ExtractError):
    """A CLONE names a subvolume that was not given as a clone source."""

    kind = "clone source not found"
    exit_code = EXIT_USAGE


# --- the network --------------------------------------------------------------------------------------------------


class TlsCause(enum.Enum):
    """Why a TLS session failed, as far as the library and the peer's alerts tell."""

    KEY = "wrong key or identity"
    MODE = "the peer uses another TLS mode"
    IDENTITY_OR_MODE = "unknown identity, or another TLS mode"
    KEY_OR_MODE = "wrong key or identity, or another TLS mode"
    NOT_TLS = "the peer does not speak TLS, or said nothing in time"
    ALERT = "the peer sent an alert"
    AUTHENTICATION = "a record failed authentication"
    TRUNCATED = "the connection ended without close_notify"
    BUSY = "the peer is busy"
    SETUP = "the TLS library cannot be set up"
    OTHER = "other"

    @property
    def retryable(self) -> bool:
        """Whether a new connection may cure it: not a wrong key, mode or forged data."""
        return self in (TlsCause.NOT_TLS, TlsCause.TRUNCATED, TlsCause.BUSY, TlsCause.OTHER)


class TlsError(SendStreamError):
    """A TLS session could not be set up, or broke; ``cause`` says why."""

    exit_code = EXIT_TLS
    default_cause = TlsCause.OTHER

    def __init__(self, message: str, cause: TlsCause | None = None) -> None:
        super().__init__(message)
        self.cause = cause or self.default_cause

    @property
    def retryable(self) -> bool:
        return self.cause.retryable


class HandshakeError(TlsError):
    """The handshake failed: wrong key or identity, another mode, or a peer that does not speak TLS."""


class PeerBusy(HandshakeError):
    """The peer refused the handshake for load: nothing is wrong with the key, a connection later may get in."""

    exit_code = EXIT_IO
    default_cause = TlsCause.BUSY


class TruncationError(TlsError):
    """The TCP connection ended without a TLS close_notify: the data may be cut short."""

    default_cause = TlsCause.TRUNCATED


class KeyFileError(TlsError):
    """A key file that is malformed, or open to group or others."""

    default_cause = TlsCause.SETUP


class KeyFileUnreadable(KeyFileError):
    """A key file that cannot be read or written (missing, no permission): an I/O error."""

    exit_code = EXIT_IO


class NetworkError(SendStreamError, OSError):
    """A network operation failed: ``operation`` (e.g. ``connecting to backup:7000``) and why, as an
    :class:`OSError` with its errno, so that a retry loop treats it as any other."""

    exit_code = EXIT_IO

    def __init__(self, operation: str, cause: OSError, hint: str = "") -> None:
        OSError.__init__(self, cause.errno, cause.strerror)
        self.operation = operation
        self.reason = reason(cause)
        self.hint = hint

    def __str__(self) -> str:
        return f"{self.operation}: {self.reason}{f' ({self.hint})' if self.hint else ''}"


def reason(cause: BaseException) -> str:
    """``cause`` as words: an OSError's strerror in lower case, without ``[Errno N]``; another's own text."""
    if not isinstance(cause, OSError) or isinstance(cause, SendStreamError):
        return str(cause)
    text = cause.strerror or str(cause) or type(cause).__name__
    return text[:1].lower() + text[1:]


class SessionError(SendStreamError):
    """The peer broke the session protocol, or the session cannot continue."""

    exit_code = EXIT_IO


class ProxyHeaderError(SessionError):
    """A connection from a balancer that did not begin with a valid PROXY protocol v2 header."""


class QuietClose(SessionError):
    """No client, nothing to log: raised by a :class:`~sendstream.transport.listener.Listener`'s opener to
    close a connection without a "refused" line (a balancer's health check, a PROXY protocol LOCAL header)."""


class SessionMisuse(SessionError):
    """This end asked its session machine to say something out of turn (a hello twice, data before the
    answer): a bug of the caller, never the peer's fault, so nothing reports it to the peer."""


class DownstreamFailed(RemoteError):
    """A relay's downstream leg failed: its receiver reported a failure, or the connection could not go on."""


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
