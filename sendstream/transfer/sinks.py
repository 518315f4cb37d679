"""Where a receiver writes the checked stream: a file (or standard output), the journal, a child process.

A sink is entered before the first byte and left after the last: on success
it completes the output (the temporary file renamed into place, the part
made the file, the child's exit checked); on an error it leaves no half
output behind (a journal keeps its part and token for ``--resume``). A sink
is given only what the receiver checked, and ``flush`` pushes it on before
the receiver acknowledges it.
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import fcntl
import struct
import subprocess
import termios
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import TYPE_CHECKING, BinaryIO, Self

from .. import errors as e
from ..io.outputs import atomic_output, is_special
from ..io.pipes import widen
from ..io.threads import started
from .journal import Journal, load_state, refuse_unfinished
from .ledger import Checkpoint, Ledger

if TYPE_CHECKING:
    from .identity import Identity

Data = bytes | bytearray | memoryview
CHILD_GRACE = 5.0  # after a failed transfer, how long the child may take to end once its input ended


class Sink(abc.ABC):
    """What every sink does: take checked bytes, push them on, end well or badly."""

    journal: Journal | None = None  # the journal of a sink that keeps one: the receiver checkpoints it
    ledger: Ledger | None = None  # what digests the commands written (the journal's, from its checkpoint on)
    stopped_at: tuple[int, Identity | None, Ledger] | None = None  # see stopped()
    replay: Callable[[Data], object] | None = None  # given a resumed journal's kept part, when the reader needs it

    @abc.abstractmethod
    def write(self, data: Data) -> None:
        """Take the next checked bytes."""

    @abc.abstractmethod
    def flush(self) -> None:
        """Push on what was written (before it is acknowledged)."""

    def __enter__(self) -> Self:
        return self

    def stopped(self, offset: int, stream: Identity | None, ledger: Ledger | None) -> None:
        """The transfer stops at ``offset``, the end of the last command written (``ledger`` digests them):
        a sink that keeps a journal makes it durable there as it stops."""
        if ledger is not None:
            self.stopped_at = offset, stream, ledger

    @abc.abstractmethod
    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        """Complete the output, or (on an error) leave nothing half done."""


class FileSink(Sink):
    """``path`` written through a temporary file renamed into place on success; ``-`` is standard output
    (:func:`~sendstream.io.outputs.atomic_output`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._output: contextlib.AbstractContextManager[BinaryIO] | None = None
        self._out: BinaryIO | None = None

    def __enter__(self) -> Self:
        self._output = atomic_output(self.path)
        self._out = self._output.__enter__()
        return self

    def write(self, data: Data) -> None:
        assert self._out is not None
        self._out.write(data)

    def flush(self) -> None:
        assert self._out is not None
        self._out.flush()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        assert self._output is not None
        self._output.__exit__(kind, exc, tb)


class JournalSink(Sink):
    """``path`` as ``path.part`` with durable checkpoints and a resume token
    (:class:`~sendstream.transfer.journal.Journal`).

    From ``checkpoint`` on, when a stopped transfer is resumed. On an error
    the part and the token stay, and ``notify`` is told how to continue
    (both commands, the token). A new ``path`` gets 0666 less the umask, as
    any other output (:func:`~sendstream.io.outputs.atomic_output`).
    """

    def __init__(self, path: str, key: bytes, checkpoint: Checkpoint | None, notify: Callable[[str], object]) -> None:
        self.path = path
        self._key = key
        self._checkpoint = checkpoint
        self._notify = notify

    def __enter__(self) -> Self:
        self.journal = Journal(self.path, self._key, self._checkpoint, mode=0o666)
        self.ledger = Ledger(self.journal.checkpoint)
        return self

    def write(self, data: Data) -> None:
        assert self.journal is not None
        self.journal.write(data)

    def flush(self) -> None:
        """Nothing to do: the receiver's checkpoint (:meth:`~sendstream.transfer.journal.Journal.commit`) flushes."""

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        journal = self.journal
        assert journal is not None
        if kind is None:
            try:
                journal.finish()
                return
            except BaseException:
                self._keep(journal)
                raise
        self._keep(journal)

    def _keep(self, journal: Journal) -> None:
        """Stop on an error: the part and the token stay, up to where the transfer stopped when that is
        known; say how to go on."""
        if self.stopped_at is not None:
            journal.stop(*self.stopped_at)
        else:
            journal.close()
        if journal.token is not None:
            self._notify(
                f"{journal.part} holds the stream up to offset {journal.offset}; to continue, run\n"
                f"  sendstream receive --resume -o {self.path} ... here, and on the sending side\n"
                f"  sendstream send --resume {journal.token} ..."
            )


class ChildSink(Sink):
    """The standard input of ``command``, run by ``sh -c`` as ``ssh host CMD`` runs it
    (``btrfs receive DIR``, ``zstd -d | btrfs receive DIR``).

    Nothing unchecked is written: on an error the child sees its input end
    early, and one that has not ended :data:`CHILD_GRACE` seconds later is
    terminated (then killed). A child that stops reading, or exits
    non-zero, is a :class:`~sendstream.errors.ChildFailed` that names the
    command.
    """

    def __init__(
        self, command: str, stderr: Callable[[str], object] | None = None, *, stdout_too: bool = False
    ) -> None:
        self.command = command
        self._stderr = stderr
        self._stdout_too = stdout_too and stderr is not None  # its standard output to ``stderr`` as well
        self._child: subprocess.Popen[bytes] | None = None
        self._relay: threading.Thread | None = None

    def __enter__(self) -> Self:
        piped = subprocess.PIPE if self._stderr else None
        out: int | None = None
        err = piped
        if self._stdout_too:  # (btrfs receive says `At snapshot NAME` on its standard output)
            out, err = subprocess.PIPE, subprocess.STDOUT
        self._child = subprocess.Popen(["/bin/sh", "-c", self.command], stdin=subprocess.PIPE, stdout=out, stderr=err)
        assert self._child.stdin is not None
        widen(self._child.stdin.fileno())
        said = self._child.stdout if self._stdout_too else self._child.stderr
        if said is not None:
            self._relay = started(self._pass_stderr, said)
        return self

    def _pass_stderr(self, pipe: BinaryIO) -> None:
        assert self._stderr is not None
        with pipe:
            for line in pipe:
                self._stderr(line.decode(errors="surrogateescape").rstrip("\n"))  # a name is any bytes

    def write(self, data: Data) -> None:
        assert self._child is not None and self._child.stdin is not None
        self._child.stdin.write(data)

    def flush(self) -> None:
        assert self._child is not None and self._child.stdin is not None
        self._child.stdin.flush()

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        child = self._child
        assert child is not None and child.stdin is not None
        unread = 0
        with contextlib.suppress(BrokenPipeError):
            child.stdin.flush()
            if kind is None:
                unread = _drained(child)
            child.stdin.close()
        code = child.wait() if kind is None else _ended(child)
        if self._relay is not None:
            # every line the child wrote is shown before our own last words (a killed one's grandchildren
            # may hold its stderr open: not for ever)
            self._relay.join(None if kind is None else CHILD_GRACE)
        hint = ": sh found no such command" if code == 127 else ""
        if isinstance(exc, BrokenPipeError) or unread:
            raise e.ChildFailed(
                f"{self.command!r} exited (status {code}{hint}) before it read the whole stream"
            ) from exc
        if kind is None and code:
            raise e.ChildFailed(f"{self.command!r} exited with status {code}{hint}")


def _ended(child: subprocess.Popen[bytes]) -> int:
    """The status of ``child``, whose input ended early: terminated, then killed, when it does not end."""
    for stop in (child.terminate, child.kill):
        try:
            return child.wait(CHILD_GRACE)
        except subprocess.TimeoutExpired:
            stop()
    return child.wait()


def _drained(child: subprocess.Popen[bytes]) -> int:
    """Wait until ``child`` has read all its pipe holds, or exited; the bytes it left unread.

    The pipe holds up to a megabyte (see :mod:`sendstream.io.pipes`): a child
    that exits early with status 0 (``head -c 100``) no longer makes our last
    write fail, so what it left in the pipe is what tells.
    """
    assert child.stdin is not None
    fd, pause = child.stdin.fileno(), 0.0005
    while (left := _pending(fd)) and child.poll() is None:
        time.sleep(pause)
        pause = min(pause * 2, 0.05)
    return left


def _pending(fd: int) -> int:
    return struct.unpack("i", fcntl.ioctl(fd, termios.FIONREAD, b"\0\0\0\0"))[0]  # type: ignore[no-any-return]


@dataclasses.dataclass(frozen=True)
class Target:
    """Where ``receive`` writes: the standard input of ``command``, else ``output`` (a
    file, ``-`` for standard output). A file of an encrypted session is journaled
    (``FILE.part``, resumable: the key signs its token); ``resume`` continues one."""

    output: str | None = None
    command: str | None = None
    encrypted: bool = True
    resume: bool = False

    def __post_init__(self) -> None:
        if self.output and self.command:
            raise e.UsageError("give -o or --exec, not both")
        if self.resume and not self.journaled:
            raise e.UsageError("--resume continues a file: give -o FILE and a TLS mode (its key signs the token)")

    @property
    def journaled(self) -> bool:
        out = self.output
        return bool(out) and out != "-" and self.encrypted and not is_special(out or "")

    def start(self, key: bytes | None) -> Checkpoint | None:
        """Before anyone connects: the checkpoint to resume from (with ``resume``), else
        refuse a journaled FILE whose unfinished transfer a new one would overwrite."""
        if self.resume:
            assert self.output and key
            return load_state(self.output, key)
        if self.journaled:
            assert self.output
            refuse_unfinished(self.output)
        return None

    def sink(
        self,
        raw: bool,
        key: bytes | None,
        checkpoint: Checkpoint | None,
        notify: Callable[[str], object],
        journaling: Callable[[], object] = lambda: None,
        child_stderr: Callable[[str], object] | None = None,
    ) -> Sink:
        """The sink for a sender (``raw``: one without a session, so without an identity
        to keep a journal of); ``journaling`` is called when a journal starts; a child's
        stderr goes line by line to ``child_stderr`` when given, else to ours."""
        if self.command:
            return ChildSink(self.command, child_stderr)
        if self.journaled and not raw:
            assert self.output and key
            journaling()
            return JournalSink(self.output, key, checkpoint, notify=notify)
        return FileSink(self.output or "-")
