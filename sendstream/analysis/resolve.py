"""Every command of a stream with the path it finally affects, held compactly until its subvolume ends."""

from __future__ import annotations

import dataclasses
import uuid
from array import array
from collections.abc import Iterable, Iterator
from typing import Any

from .. import errors as e
from ..codec.events import Restart
from ..format.command import Command
from ..format.layout import (
    command_name,
)
from .paths import (
    C_CLONE,
    C_LINK,
    C_RENAME,
    MAX_HELD,
    MAX_NAMES,
    SUBVOLUME,
    Entry,
    Inode,
    PathTracker,
    Touched,
    limit_error,
)


@dataclasses.dataclass(frozen=True, slots=True)
class CommandPaths:
    """One command with the paths it names, at the time and finally.

    ``final`` is None for a command without a path (SUBVOL, END, ...) and
    for a file that no longer has any name when its subvolume ends.
    ``subvolume`` is the path SUBVOL or SNAPSHOT gave (None before one).
    """

    index: int
    offset: int
    command: str
    subvolume: bytes | None
    path: bytes | None
    final: bytes | None
    other_path: bytes | None = None
    other_final: bytes | None = None
    clone_uuid: uuid.UUID | None = None

    @property
    def renamed(self) -> bool:
        """True when the final path differs from the path the command names."""
        return self.path is not None and self.final != self.path


# What one held record costs PathResolver: its columns (offset, index, number,
# shared prefix, other path's length, end in the blob: 30 bytes) and two references.
_RECORD_BYTES = 46


# A final path PathResolver keeps for a directory or an inode while it hands out records.
_MEMO_BYTES = 120


def _shared_prefix(a: bytes, b: bytes) -> int:
    """The length of the longest common prefix of ``a`` and ``b`` (memcmp speed)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:  # a[:lo] == b[:lo]; the answer is at most hi
        mid = (lo + hi + 1) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class PathResolver:
    """Sans-IO :func:`resolve`: :meth:`feed` events, each call returns the
    records that are ready; :meth:`close` at the end of the input.

    A command with a path waits for the end of its subvolume, in compact
    columns: a path is kept as the part that differs from the record
    before (a run of commands on one file keeps its name once). Those
    records and the final paths remembered while they are handed out count
    against ``max_held`` bytes. A command without a path (SUBVOL, SNAPSHOT,
    END, a command number the library does not know) needs no final path:
    it is returned at once, so an unknown command in the middle of a
    subvolume comes before the held records that precede it.
    """

    def __init__(self, *, max_names: int = MAX_NAMES, max_held: int = MAX_HELD) -> None:
        self.max_held = max_held
        self.tracker = PathTracker(max_names=max_names)
        self._clear()

    def _clear(self) -> None:
        self._offsets = array("q")  # -1 for commands not read from a stream
        self._indexes = array("q")
        self._cmds = array("H")
        self._shared = array("H")
        self._other_len = array("H")
        self._ends = array("Q")
        self._refs: list[Entry | None] = []  # two per record: the entry and the other one
        self._foreign: dict[int, uuid.UUID] = {}  # record -> clone source of another subvolume
        self._blob = bytearray()
        self._last_path = b""
        self.held = 0

    def _charge(self, nbytes: int, command: Command | None) -> None:
        self.held += nbytes
        if self.held > self.max_held:
            raise limit_error(
                f"the commands of one subvolume need more than {self.max_held} bytes until its end",
                self.max_held,
                "--max-held",
                command,
            )

    def feed(self, event: Any) -> Iterator[CommandPaths]:
        """The records ready after ``event`` (of :func:`sendstream.files.file_events`),
        one at a time; use them all before the next call."""
        if isinstance(event, Restart):
            raise e.StreamRestarted(
                f"a new stream header after {event.commands} commands: repair the stream first",
                offset=event.offset,
            )
        if not isinstance(event, Command):
            return
        if event.name in SUBVOLUME or event.name == "end":
            yield from self.flush(event)
        touched = self.tracker.feed(event)
        if touched is None:
            yield CommandPaths(event.index, event.offset, event.name, self.tracker.subvolume, None, None)
        else:
            self._hold(event, touched)

    def close(self) -> Iterator[CommandPaths]:
        """The records still held at the end of the input."""
        return self.flush(None)

    def _hold(self, command: Command, touched: Touched) -> None:
        path = touched.path
        shared = _shared_prefix(self._last_path, path)
        other = touched.other_path or b""
        self._charge(_RECORD_BYTES + len(path) - shared + len(other), command)
        self._last_path = path
        self._offsets.append(command.offset)
        self._indexes.append(command.index)
        self._cmds.append(command.cmd)
        self._shared.append(shared)
        self._other_len.append(len(other))
        self._blob += memoryview(path)[shared:]
        self._blob += other
        self._ends.append(len(self._blob))
        self._refs.append(touched.entry)
        self._refs.append(touched.other)
        if touched.clone_source is not None:
            self._charge(_MEMO_BYTES, command)
            self._foreign[len(self._cmds) - 1] = touched.clone_source[0]

    def flush(self, command: Command | None) -> Iterator[CommandPaths]:
        """Every held record with its final paths (the subvolume ends at ``command``)."""
        finals = _FinalPaths(self, command)
        subvolume = self.tracker.subvolume
        blob = self._blob
        path = b""
        start = 0
        for i, cmd in enumerate(self._cmds):
            end = self._ends[i]
            split = end - self._other_len[i]
            path = path[: self._shared[i]] + blob[start:split]
            entry, other = self._refs[2 * i], self._refs[2 * i + 1]
            other_path = bytes(blob[split:end]) if cmd in (C_RENAME, C_LINK, C_CLONE) else None
            clone_uuid = self._foreign.get(i)
            other_final = other_path if clone_uuid is not None else finals.of(other)
            yield CommandPaths(
                self._indexes[i],
                self._offsets[i],
                command_name(cmd),
                subvolume,
                path,
                finals.of(entry),
                other_path,
                other_final,
                clone_uuid,
            )
            start = end
        self._clear()


class _FinalPaths:
    """Final paths while a subvolume's records are handed out: each directory's
    path (and each removed file's other name) is built once, counted against
    the resolver's ``max_held``."""

    def __init__(self, resolver: PathResolver, command: Command | None) -> None:
        self._resolver = resolver
        self._command = command
        self._dirs: dict[Entry, bytes] = {}
        self._others: dict[Inode, bytes | None] = {}

    def _remember(self, path: bytes | None) -> None:
        self._resolver._charge(_MEMO_BYTES + len(path or b""), self._command)

    def _path(self, entry: Entry) -> bytes | None:
        parent = entry.parent
        if not entry.alive:
            return None
        if parent is None:
            return b""
        if parent.parent is None:
            return entry.name
        head = self._dirs.get(parent)
        if head is None:
            head = self._dirs[parent] = parent.last_path()
            self._remember(head)
        return head + b"/" + entry.name

    def of(self, entry: Entry | None) -> bytes | None:
        """``entry.final_path()``."""
        if entry is None:
            return None
        own = self._path(entry)
        if own is not None:
            return own
        inode = entry.inode
        if inode not in self._others:
            paths = [p for en in inode.entries if (p := self._path(en)) is not None]
            self._others[inode] = min(paths) if paths else None
            self._remember(self._others[inode])
        return self._others[inode]


def resolve(events: Iterable[Any], *, max_names: int = MAX_NAMES, max_held: int = MAX_HELD) -> Iterator[CommandPaths]:
    """Every command of ``events`` with its final paths (see :class:`PathResolver`).

    Works on the events of :func:`sendstream.files.file_events` (values are
    copied, not kept).
    """
    resolver = PathResolver(max_names=max_names, max_held=max_held)
    for event in events:
        yield from resolver.feed(event)
    yield from resolver.close()
