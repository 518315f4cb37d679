"""The receiver's journal: ``FILE.part`` written in place with durable checkpoints, and a token in ``FILE.part.resume``.

A receiver writing a session to ``-o FILE`` keeps the part and, at least
every :data:`CHECKPOINT_BYTES` or :data:`CHECKPOINT_SECONDS`, fsyncs it and
writes a resume token (:mod:`sendstream.transfer.tokens`) for its last durable
command boundary; after a restart of either side ``receive --resume`` cuts
the part back to it and checks the kept prefix again against the ledger.
"""

from __future__ import annotations

import contextlib
import io
import os
import stat
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from .. import errors as e
from ..errors import ResumeError
from ..io.outputs import OutputDirectory, OutputFile
from ..io.threads import started
from .ledger import Checkpoint, Ledger
from .tokens import MAX_TOKEN, make_token, read_token

if TYPE_CHECKING:
    from .identity import Identity

STATE_SUFFIX = ".resume"


PART_SUFFIX = ".part"


CHECKPOINT_BYTES = 16 << 20  # durable at least this often: well inside the sender's 64 MiB window


CHECKPOINT_SECONDS = 1.0


def after(
    offset: int, write: Callable[[Any], object], before: Callable[[Any], object] | None = None
) -> Callable[[Any], None]:
    """``write`` for the bytes from stream offset ``offset`` on; earlier ones go to ``before``, or are dropped."""
    position = 0

    def gate(data: Any) -> None:
        nonlocal position
        n = len(data)
        if position + n <= offset:
            position += n
            if before is not None:
                before(data)
            return
        skip = max(0, offset - position)
        position += n
        if skip and before is not None:
            before(memoryview(data)[:skip])
        write(memoryview(data)[skip:] if skip else data)

    return gate


def state_path(path: str) -> str:
    """Where a receiver writing ``path`` keeps its resume token."""
    return path + PART_SUFFIX + STATE_SUFFIX


def load_state(path: str, key: bytes | None) -> Checkpoint:
    """The checkpoint of an unfinished transfer to ``path``."""
    state = state_path(path)
    with OutputDirectory(path) as directory:
        try:
            fd = directory.open_ours(os.path.basename(state), os.O_RDONLY)
        except e.OutputError as exc:
            if directory.lstat(os.path.basename(state)) is None:
                raise ResumeError(f"nothing to resume: no {state}") from None
            raise ResumeError(f"cannot read {state}: {exc}") from None
    with os.fdopen(fd, "rb") as f:
        raw = f.read(MAX_TOKEN + 1)
    try:
        token = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        raise ResumeError(f"{state} holds no resume token") from None
    return read_token(token, key)


def refuse_unfinished(path: str) -> None:
    """Fail when an unfinished transfer to ``path`` would be overwritten."""
    if os.path.lexists(state_path(path)):
        raise ResumeError(
            f"{state_path(path)} holds an unfinished transfer: add --resume to continue it, "
            f"or remove it and {path + PART_SUFFIX}"
        )


class Journal:
    """``path`` written in place as ``path.part``, with durable checkpoints in ``path.part.resume``.

    From ``checkpoint`` on (a resumed transfer) ``path.part`` is cut back to
    the checkpoint's offset: what came after it was never made durable. Every
    file is made or opened relative to the directory, opened once, without
    following symlinks (:class:`~sendstream.files.OutputDirectory`); an
    existing part that is not a regular file of ours is refused. The part is
    made with ``mode`` (less the umask), a kept one is narrowed to it; the
    state is 0600. Write errors name ``shown`` (the file the user knows:
    ``path`` unless given). ``timer`` (monotonic seconds) times the checkpoints.
    """

    def __init__(
        self,
        path: str,
        key: bytes,
        checkpoint: Checkpoint | None = None,
        *,
        mode: int = 0o600,
        shown: str = "",
        timer: Callable[[], float] = time.monotonic,
    ) -> None:
        self.path = path
        self.shown = shown or path
        self.part = path + PART_SUFFIX
        self.state = state_path(path)
        self._dir = OutputDirectory(path)
        self._part_name = os.path.basename(self.part)
        self._state_name = os.path.basename(self.state)
        self._key = key
        self.checkpoint = checkpoint
        self.token = make_token(checkpoint, key) if checkpoint else None
        self._durable = self._pending = self._end = checkpoint.offset if checkpoint else 0
        self._clock = timer
        self._pending_at = timer()
        self._syncer: threading.Thread | None = None
        self._failure: BaseException | None = None
        try:
            if checkpoint is None:
                self._dir.remove_stale(self._part_name)
                self._raw = OutputFile(self._dir.create(self._part_name, mode), self.shown)
            else:
                if self._dir.lstat(self._part_name) is None:
                    raise ResumeError(f"nothing to resume: {self.part} is gone")
                self._raw = OutputFile(self._dir.open_ours(self._part_name, os.O_RDWR), self.shown)
                st = os.fstat(self._raw.fileno())
                os.fchmod(self._raw.fileno(), stat.S_IMODE(st.st_mode) & mode)  # made before it was 0600
                size = st.st_size
                if size < checkpoint.offset:
                    self._raw.close()
                    raise ResumeError(
                        f"{self.part} has {size} bytes, fewer than the {checkpoint.offset} its resume state says"
                    )
                self._raw.truncate(checkpoint.offset)
                self._raw.fsync()
                self._raw.seek(checkpoint.offset)
        except BaseException:
            self._dir.close()
            raise
        self.file = io.BufferedWriter(self._raw, 1 << 20)

    @property
    def offset(self) -> int:
        """The last durable command boundary."""
        return self._durable

    def prefix(self) -> _Prefix:
        """The kept prefix, to be checked again against the ledger."""
        return _Prefix(os.dup(self._raw.fileno()), self._durable)

    def write(self, data: Any) -> None:
        self.file.write(data)
        self._end += len(data)

    def commit(self, offset: int, stream: Identity | None, ledger: Ledger) -> int:
        """Flush; every ``CHECKPOINT_BYTES`` or seconds start making ``offset`` durable.

        The fsyncs run in a thread while the transfer goes on. Returns the
        offset that is durable now.
        """
        self.file.flush()
        if self._failure is not None:
            raise self._failure
        now = self._clock()
        due = offset - self._pending >= CHECKPOINT_BYTES or now - self._pending_at >= CHECKPOINT_SECONDS
        busy = self._syncer is not None and self._syncer.is_alive()
        if stream is not None and offset != self._pending and due and not busy:
            checkpoint = Checkpoint(stream, offset, ledger.commands, ledger.digest())
            self._pending, self._pending_at = offset, now
            self._syncer = started(self._sync, checkpoint)
        return self._durable

    def _sync(self, checkpoint: Checkpoint) -> None:
        try:
            self._raw.fsync()  # everything before the checkpoint was flushed to the file
            token = make_token(checkpoint, self._key)
            tmp, fd = self._dir.create_temporary(0o600)
            with OutputFile(fd, self.shown) as f:
                f.write((token + "\n").encode("ascii"))
                f.fsync()
            self._dir.replace(tmp, self._state_name)
            self._dir.sync()
        except (OSError, e.SendStreamError) as exc:
            self._failure = exc
            return
        self.checkpoint, self.token, self._durable = checkpoint, token, checkpoint.offset

    def _settle(self) -> None:
        if self._syncer is not None:
            self._syncer.join()

    def finish(self) -> None:
        """The whole stream is in: ``path.part`` becomes ``path``; the state goes."""
        self._settle()
        self.file.flush()
        self._raw.fsync()
        size = os.fstat(self._raw.fileno()).st_size
        if size != self._end:
            raise e.OutputError(self.shown, f"it holds {size} bytes of the {self._end} written to it: a write was lost")
        self._dir.replace(self._part_name, self._dir.name, self._raw.fileno())
        self.file.close()
        self._dir.unlink(self._state_name)
        self._dir.sync()
        self._dir.close()

    def discard(self) -> None:
        """The whole stream went where it goes: the part and the state are not needed any more."""
        self._settle()
        self.file.close()
        self._dir.unlink(self._part_name)
        self._dir.unlink(self._state_name)
        self._dir.sync()
        self._dir.close()

    def stop(self, offset: int, stream: Identity | None, ledger: Ledger) -> None:
        """Stop (on an error) at ``offset``, the end of the last command written, made durable first when
        it can be, so that the next run of this transfer loses nothing that came; then :meth:`close`."""
        self._settle()
        with contextlib.suppress(ValueError, OSError):
            commands, digest = ledger.at(offset)  # ValueError: the ledger went on past a write that failed
            if stream is not None and offset > self._durable and self._failure is None:
                self.file.flush()
                self._sync(Checkpoint(stream, offset, commands, digest))
        self.close()

    def close(self) -> None:
        """Stop (on an error): the part and the state stay for ``--resume``; a part
        with no checkpoint yet has nothing to resume from and goes."""
        self._settle()
        with contextlib.suppress(OSError):
            self.file.close()
        if self.checkpoint is None:
            self._dir.unlink(self._part_name)
        self._dir.close()


class _Prefix:
    """The first ``size`` bytes of the file ``fd`` (which it closes), as a reader."""

    def __init__(self, fd: int, size: int) -> None:
        self._fd = fd
        self._at = 0
        self._left = size

    def readinto(self, view: Any) -> int:
        view = memoryview(view).cast("B")[: self._left]
        if not view:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            return 0
        n = os.preadv(self._fd, [view], self._at)
        if not n:
            raise ResumeError("the kept part file shrank while it was checked again")
        self._at += n
        self._left -= n
        return n


class Chain:
    """Reads ``first`` to its end, then ``second``."""

    def __init__(self, first: Any, second: Any) -> None:
        self._first: Any = first
        self._second = second

    def readinto(self, view: Any) -> int:
        if self._first is not None:
            n: int = self._first.readinto(view)
            if n:
                return n
            self._first = None
        return int(self._second.readinto(view))
