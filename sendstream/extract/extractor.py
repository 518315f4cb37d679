"""The Extractor: its life cycle, the events it takes, and each command's dispatch
and bookkeeping (errors located, skips reported, fds trimmed between commands)."""

from __future__ import annotations

import errno
import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar
from uuid import UUID

from ..codec.compression import MAX_UNENCODED
from ..codec.events import EndOfInput, Restart
from ..errors import ApplyError, BadCommand, ExtractError, LimitExceeded
from ..format.command import Command
from ..io.framed import FramedInput, StreamSource, Warn
from .copy import MAX_CLONE_COPY, CopyBudget, copy_parent
from .data import DataHandlers
from .report import ExtractReport, Skipped, Subvolume
from .sources import CloneSources
from .subvolume import OpenSubvolume, open_directory

__all__ = ["Extractor", "extract_stream"]

_Located = TypeVar("_Located", bound=ExtractError)


class Extractor:
    """Applies the commands of send streams to the directory ``dest``.

    Feed it every event of the input (:meth:`event`) in order, then
    :meth:`close` (or use it as a context manager). ``clone_sources`` maps
    the UUID of a clone-source subvolume to the directory holding its
    extraction; each directory of ``clone_dirs`` may hold such extractions
    in subdirectories named by UUID (``DIR/9db24a68-fcc1-...``). The
    subvolume being extracted is its own clone source. Where the file system
    cannot reflink, clones copy at most ``max_clone_copy`` bytes of data in
    all (:class:`sendstream.errors.LimitExceeded` past it). ``on_skip`` is
    called for every :class:`Skipped` as it happens.

    An incremental stream goes onto the extraction of its parent. An empty
    directory is the extraction of an empty parent, as ``btrfs receive``
    snapshots one; what guards against an empty directory that is not: the
    subvolume is marked :attr:`Subvolume.onto_empty` (the summary says so),
    and the stream may name nothing of the parent but its root. A command on
    a path the stream did not make fails with an error that names the path
    and says the directory is not the parent's extraction, before anything
    of that command is done.
    """

    def __init__(
        self,
        dest: str | os.PathLike[str],
        *,
        clone_sources: Mapping[UUID, str | os.PathLike[str]] | None = None,
        clone_dirs: Sequence[str | os.PathLike[str]] = (),
        per_subvolume: bool = False,
        max_unencoded: int = MAX_UNENCODED,
        max_clone_copy: int = MAX_CLONE_COPY,
        on_skip: Callable[[Skipped], None] | None = None,
    ) -> None:
        self.dest = os.fspath(dest)
        self.per_subvolume = per_subvolume
        self.max_unencoded = max_unencoded
        self.max_clone_copy = max_clone_copy
        self.report = ExtractReport()
        self._on_skip = on_skip
        given = {u: os.fspath(p) for u, p in (clone_sources or {}).items()}
        dirs = [os.fspath(d) for d in clone_dirs]
        self._dest_fd = os.open(self.dest, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        self._sources = CloneSources(self._dest_fd, given, dirs, per_subvolume=per_subvolume)
        self._budget = CopyBudget(max_clone_copy, self.report)
        self._current: OpenSubvolume | None = None

    # -- life cycle --

    def __enter__(self) -> Extractor:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def close(self) -> None:
        """Close every file descriptor (the extraction itself stays)."""
        self._close_subvolume()
        self._sources.close()
        if self._dest_fd >= 0:
            os.close(self._dest_fd)
            self._dest_fd = -1

    def _close_subvolume(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None

    # -- events --

    def event(self, event: Any) -> None:
        """Apply one event of :func:`sendstream.io.windows.file_events` (or a Decoder)."""
        self.report.statistics.feed(event)
        if isinstance(event, Command):
            self.apply(event)
        elif isinstance(event, Restart):
            raise BadCommand(
                f"the send restarted here after {event.commands} commands (`sendstream repair` fixes the stream)",
                offset=event.offset,
            )
        elif isinstance(event, EndOfInput) and self._current is not None:
            raise BadCommand("the input ended before END", offset=event.offset, expected="an END command")

    def apply(self, command: Command) -> None:
        """Apply one command; on any problem raise an :class:`ExtractError` for it."""
        path = None
        try:
            if command.attributes is None:
                self._skip(command, b"", f"unknown command number {command.cmd}: ignored, as btrfs receive does")
                return
            path = command.get("path", None)
            if command.spec is None:  # pragma: no cover - every known command has a handler
                self._skip(command, b"", "no handler")
                return
            self._let_go(command.name)
            self._handler(command.name)(command)
            self.report.applied += 1
        except ExtractError as exc:
            self._stop_writing()
            if exc.errno == errno.ENOENT:
                self._not_the_parent(command, path, exc)
            _locate(exc, command, path)
            raise
        except LimitExceeded:
            self._stop_writing()
            raise
        except KeyError as exc:
            self._stop_writing()
            missing = BadCommand(f"attribute {exc.args[0]} is missing", expected=f"attribute {exc.args[0]}")
            raise _locate(missing, command, path) from None
        except (OverflowError, ValueError) as exc:  # a value the system calls cannot take
            self._stop_writing()
            raise _locate(BadCommand(f"{command.name}: {exc}"), command, path) from None
        except OSError as exc:
            self._stop_writing()
            if exc.errno == errno.ENOENT:
                self._not_the_parent(command, path, exc)
            raise _locate(ApplyError(f"{command.name}: {exc.strerror or exc}", errno=exc.errno), command, path) from exc

    def _not_the_parent(self, command: Command, path: Any, exc: BaseException) -> None:
        """A path missing in an incremental onto an empty DIR: DIR is not the parent's extraction."""
        record = self.report.subvolumes[-1] if self._current is not None else None
        if record is not None and record.onto_empty:
            wrong = BadCommand(
                f"{record.directory!r} was empty, and the incremental names something of its parent "
                f"{record.parent_uuid} that is not there",
                expected="the extraction of the parent subvolume (empty only for an empty parent)",
            )
            raise _locate(wrong, command, path) from exc

    def _let_go(self, name: str) -> None:
        """Before the command ``name``: close the file kept open for writing (unless it is
        a data command, which may write on), and the fds the trees no longer need."""
        if self._current is not None:
            if name not in self._current.data.handlers:
                self._current.data.stop_writing()
            self._current.tree.trim()
        self._sources.trim()

    def _handler(self, name: str) -> Callable[[Command], None]:
        """What applies the command ``name``: SUBVOL and SNAPSHOT open a subvolume, every
        other command needs one open."""
        if name in ("subvol", "snapshot"):
            return functools.partial(self._begin, kind=name)
        if self._current is None:
            raise BadCommand(
                "a command outside a subvolume", expected="SUBVOL or SNAPSHOT first (and nothing after END)"
            )
        if name == "end":
            return self._end
        return self._current.handlers[name]

    def _skip(self, cmd: Command, path: bytes, reason: str) -> None:
        skipped = Skipped(cmd.offset, cmd.index, cmd.name, path, reason)
        self.report.add_skip(skipped)
        if self._on_skip is not None:
            self._on_skip(skipped)

    def _stop_writing(self) -> None:
        if self._current is not None:
            self._current.data.stop_writing()

    # -- subvolumes --

    def _begin(self, cmd: Command, kind: str) -> None:
        if self.report.subvolumes and not self.per_subvolume:
            raise BadCommand(
                "the input holds several subvolumes",
                expected="one subvolume, or per_subvolume=True (--per-subvolume) to put each in DIR/NAME",
            )
        self._close_subvolume()
        root, tree, directory, onto_empty = open_directory(
            cmd,
            kind,
            self.dest,
            self._dest_fd,
            per_subvolume=self.per_subvolume,
            copy_parent=lambda name: copy_parent(cmd, name, self._dest_fd, self._sources, self._budget, self._skip),
        )
        try:
            record = Subvolume(
                kind,
                bytes(cmd.get("path")),
                cmd.get("uuid"),
                cmd.get("clone_uuid") if kind == "snapshot" else None,
                directory,
                onto_empty,
            )
        except BaseException:
            tree.close()
            os.close(root)
            raise
        data = DataHandlers(
            tree,
            record,
            sources=self._sources,
            budget=self._budget,
            report=self.report,
            skip=self._skip,
            max_unencoded=self.max_unencoded,
        )
        self._current = OpenSubvolume(root, tree, data, self._skip, keep_root_times=kind == "snapshot")
        self.report.subvolumes.append(record)
        if self.per_subvolume:
            self._sources.remember(record)

    def _end(self, cmd: Command) -> None:
        if self._current is not None:
            self._current.end()
        self._close_subvolume()


def _locate(exc: _Located, cmd: Command, path: Any) -> _Located:
    """``exc`` with the place of ``cmd`` (and its ``path``) where it does not say it."""
    if exc.offset is None:
        exc.offset = cmd.offset
    if exc.index is None:
        exc.index = cmd.index
    if exc.command is None:
        exc.command = cmd.name
    if exc.path is None and path is not None:
        exc.path = bytes(path)
    return exc


def extract_stream(
    source: StreamSource,
    dest: str | os.PathLike[str],
    *,
    clone_sources: Mapping[UUID, str | os.PathLike[str]] | None = None,
    clone_dirs: Sequence[str | os.PathLike[str]] = (),
    per_subvolume: bool = False,
    max_clone_copy: int = MAX_CLONE_COPY,
    on_skip: Callable[[Skipped], None] | None = None,
    events: Iterable[Any] | None = None,
    max_command_size: int | None = None,
    warn: Warn | None = None,
) -> ExtractReport:
    """Apply every stream of ``source`` (a path, ``-``, or a binary file) to ``dest``;
    see :class:`Extractor`. The input's problems go to ``warn`` once it is applied.

    ``events`` replaces reading ``source`` (e.g. a Decoder's events).
    """
    with (
        FramedInput(source, max_command_size=max_command_size, warn=warn) as stream,
        Extractor(
            dest,
            clone_sources=clone_sources,
            clone_dirs=clone_dirs,
            per_subvolume=per_subvolume,
            max_clone_copy=max_clone_copy,
            on_skip=on_skip,
        ) as extractor,
    ):
        for event in events if events is not None else stream.events():
            extractor.event(event)
    return extractor.report
