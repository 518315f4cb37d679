"""What a stream changes: ``ls`` (every name it touches, with how) and ``diff``.

Built on :class:`sendstream.paths.PathTracker`, which follows names through
btrfs' temporary orphan names ``o<ino>-<gen>-<seq>``, directory renames,
swaps and nesting inversions. For each subvolume the stream holds,
:class:`ChangeTracker` records per inode what the commands did (created,
data, metadata) and, when the subvolume ends, compares every name's place
in the parent snapshot (where the stream shows it) with its final place:

- a name the stream created is ``created`` (the first name of a new inode)
  or ``linked`` (another name of it, ``link_to``);
- a name that existed before and is gone is ``deleted``;
- a name that existed before and is now elsewhere (another directory or
  another name) is ``renamed``; btrfs often expresses a rename as LINK of
  the new name then UNLINK of the old one, which is paired the same way;
  the contents of a renamed directory are not listed again;
- a new name of an existing inode is ``linked`` (a new hard link);
- a name kept in place is ``modified`` when its data changed (WRITE,
  ENCODED_WRITE, CLONE, TRUNCATE, FALLOCATE, UPDATE_EXTENT) and ``metadata``
  when only its metadata did: ``mode`` (CHMOD), ``owner`` (CHOWN),
  ``times`` (UTIMES), ``xattrs`` (SET/REMOVE_XATTR), ``fileattr`` (FILEATTR),
  ``verity`` (ENABLE_VERITY);
- a name created and removed within the stream is ``transient`` (ls only).

Renamed entries carry ``data`` and ``metadata`` too. A file replaced under
the same name (btrfs does this for a symlink's new target) shows as the
old name ``deleted`` and the new file ``created``.

Limits, from what a stream says: an incremental names only what changed,
so hard links that already existed in the parent are not known to be one
inode (a change through one name is reported under that name only); UTIMES
is sent for every inode whose ctime changed and for the directories around
a changed name, so ``times`` may appear with the same times as before;
kinds of pre-existing files are known only when a command shows them
(``rmdir``: a directory, file data: a regular file); else ``None``.

Memory: the names of one subvolume (``max_names``, see :mod:`sendstream.paths`)
and its changes, whose paths count against ``max_held`` bytes; a subvolume's
changes are handed out when it ends (:func:`each_subvolume`, or
:func:`read_changes` from an input), and the presentation functions write
them one at a time.
"""

from __future__ import annotations

import dataclasses
import functools
import stat
from collections.abc import Iterable, Iterator
from operator import attrgetter, itemgetter
from typing import Any, NamedTuple

from .. import errors as e
from ..codec.backend import Backend
from ..codec.events import EndOfInput, Restart
from ..format.command import Command
from ..io.framed import FramedInput, StreamSource, Warn
from .paths import MAX_HELD, MAX_NAMES, Inode, PathTracker, limit_error

DATA_COMMANDS = frozenset({"write", "encoded_write", "clone", "truncate", "fallocate", "update_extent"})


METADATA_COMMANDS = {
    "chmod": "mode",
    "chown": "owner",
    "utimes": "times",
    "set_xattr": "xattrs",
    "remove_xattr": "xattrs",
    "fileattr": "fileattr",
    "enable_verity": "verity",
}


_CREATE_KIND = {"mkfile": "file", "mkdir": "dir", "mkfifo": "fifo", "mksock": "socket", "symlink": "symlink"}


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    """One name a stream touched.

    ``path`` is the final path (None when ``deleted`` or ``transient``),
    ``old_path`` the path in the parent snapshot (None for a new name; for a
    transient name, its last one: where it was removed, under its directory's
    final place if that moved after). ``kind`` is ``file``,
    ``dir``, ``symlink``, ``fifo``, ``socket``, ``chardev``, ``blockdev`` or
    None when the stream does not show it.
    """

    action: str  # created, linked, deleted, renamed, modified, metadata, transient
    path: bytes | None
    old_path: bytes | None = None
    kind: str | None = None
    data: bool = False
    metadata: tuple[str, ...] = ()
    link_to: bytes | None = None

    @property
    def sort_key(self) -> bytes:
        return self.path if self.path is not None else self.old_path or b""


class _InodeInfo(NamedTuple):
    """What the commands did to one inode (on :attr:`Inode.info`; :func:`_after`
    gives one shared instance per distinct value, so millions of inodes cost no more)."""

    created: bool = False
    kind: str | None = None
    data: bool = False
    metadata: tuple[str, ...] = ()  # sorted


_NOTHING = _InodeInfo()


@functools.cache
def _after(info: _InodeInfo, command: str, kind: str | None) -> _InodeInfo:
    """What ``info`` becomes after ``command`` (``kind``: what MKNOD makes)."""
    if command in _CREATE_KIND or command == "mknod":
        return info._replace(created=True, kind=_CREATE_KIND.get(command) or kind)
    if command in DATA_COMMANDS:
        return info._replace(data=True, kind=info.kind or "file")
    if command in METADATA_COMMANDS:
        return info._replace(metadata=tuple(sorted({*info.metadata, METADATA_COMMANDS[command]})))
    if command == "rmdir":
        return info._replace(kind="dir")
    return info


@dataclasses.dataclass(frozen=True, slots=True)
class Diff:
    """The change of an incremental as a diff: lists sorted by path."""

    added: list[Change]
    removed: list[Change]
    renamed: list[Change]
    modified: list[Change]
    metadata: list[Change]


@dataclasses.dataclass(frozen=True, slots=True)
class SubvolumeChanges:
    """Every name one subvolume's commands touched, sorted by path."""

    subvolume: bytes | None
    incremental: bool
    changes: list[Change]

    def diff(self) -> Diff:
        added = [c for c in self.changes if c.action in ("created", "linked")]
        removed = [c for c in self.changes if c.action == "deleted"]
        renamed = [c for c in self.changes if c.action == "renamed"]
        modified = [c for c in self.changes if c.data and c.action in ("modified", "renamed")]
        metadata = [c for c in self.changes if c.action == "metadata"]
        return Diff(added, removed, renamed, modified, metadata)


# What a path costs in a change besides its bytes (a bytes object), against max_held.
_BYTES = 33


class ChangeTracker:
    """Sans-IO: :meth:`feed` commands; :meth:`finish` at the end of each subvolume.

    What the commands did is kept on the tracker's inodes, so it goes with
    them when a subvolume starts. A subvolume has at most one change per
    name (``max_names``, see :mod:`sendstream.paths`); the paths in its
    changes count against ``max_held`` bytes.
    """

    def __init__(self, *, max_names: int = MAX_NAMES, max_held: int = MAX_HELD) -> None:
        self.tracker = PathTracker(max_names=max_names)
        self.max_held = max_held
        self.incremental = False
        self.started = False
        self._last: Command | None = None

    def feed(self, command: Command) -> SubvolumeChanges | None:
        """Follow one command; returns the finished subvolume at END or at a new SUBVOL/SNAPSHOT."""
        self._last = command
        name = command.name
        done = None
        if name in ("subvol", "snapshot"):
            if self.started:
                done = self.finish()
            self.incremental = name == "snapshot"
            self.started = True
        touched = self.tracker.feed(command)
        if touched is not None:
            inode = touched.entry.inode
            kind = _device_kind(int(command.get("mode", 0))) if name == "mknod" else None
            inode.info = _after(inode.info or _NOTHING, name, kind)
        if name == "end":
            done = self.finish()
        return done

    def finish(self) -> SubvolumeChanges:
        """The changes of the current subvolume; the tracker then starts afresh."""
        held = _Held(self.max_held, self._last)
        out: list[Change] = []
        for entry in self.tracker.entries:
            inode = entry.inode
            if inode.first is not entry:
                continue  # an inode is looked at once, with all its names
            for change in self._inode_changes(inode):
                paths = (change.path, change.old_path, change.link_to)
                held.charge(sum(_BYTES + len(p) for p in paths if p is not None))
                out.append(change)
        out.sort(key=attrgetter("action"))
        out.sort(key=attrgetter("sort_key"))  # stable: by path, then action
        result = SubvolumeChanges(self.tracker.subvolume, self.incremental, out)
        self.tracker.start(b"", None)
        self.tracker.subvolume = None
        self.started = False
        return result

    def _inode_changes(self, inode: Inode) -> Iterator[Change]:
        info: _InodeInfo = inode.info or _NOTHING
        entries = inode.entries
        if info == _NOTHING and all(en.origin_name is not None and en.alive and not en.moved for en in entries):
            return  # names that were there before, still in place, and nothing done to them
        kind = info.kind
        if kind is None and any(en.is_parent for en in entries):
            kind = "dir"
        meta = info.metadata
        alive = sorted(((en.last_path(), en) for en in entries if en.alive), key=itemgetter(0))
        if info.created:
            if not alive:
                for en in entries:
                    yield Change("transient", None, en.last_path(), kind, info.data, meta)
                return
            first = alive[0][0]
            yield Change("created", first, None, kind, info.data, meta)
            for p, _ in alive[1:]:
                yield Change("linked", p, None, kind, link_to=first)
            return
        gone = [en for en in entries if en.origin_name is not None and not en.alive]
        new = [(p, en) for p, en in alive if en.origin_name is None]
        moved = [(p, en) for p, en in alive if en.origin_name is not None and en.moved]
        kept = [(p, en) for p, en in alive if en.origin_name is not None and not en.moved]
        for old, (p, _) in zip(gone, new, strict=False):
            yield Change("renamed", p, old.origin, kind, info.data, meta)
        for old in gone[len(new) :]:
            yield Change("deleted", None, old.origin, kind)
        for p, en in moved:
            yield Change("renamed", p, en.origin, kind, info.data, meta)
        anchors = kept or moved or alive
        anchor = anchors[0][0] if anchors else None
        for p, _ in new[len(gone) :]:
            yield Change("linked", p, None, kind, link_to=anchor)
        if info.data or meta:
            for p, _ in kept:
                yield Change("modified" if info.data else "metadata", p, p, kind, info.data, meta)


class _Held:
    """Bytes of paths held until a subvolume's changes are printed, against ``max_held``."""

    def __init__(self, limit: int, command: Command | None) -> None:
        self.limit = limit
        self.command = command
        self.bytes = 0

    def charge(self, nbytes: int) -> None:
        self.bytes += nbytes
        if self.bytes > self.limit:
            raise limit_error(
                f"the paths of one subvolume's changes need more than {self.limit} bytes until they are printed",
                self.limit,
                "--max-held",
                self.command,
            )


_S_IFMT = 0o170000


_DEVICE_KINDS = {stat.S_IFCHR: "chardev", stat.S_IFBLK: "blockdev", stat.S_IFIFO: "fifo", stat.S_IFSOCK: "socket"}


def _device_kind(mode: int) -> str:
    # MODE is a u64 on the wire: mask in Python (stat.S_IS*() take a C mode_t).
    return _DEVICE_KINDS.get(mode & _S_IFMT, "device")


def each_subvolume(
    events: Iterable[Any], *, max_names: int = MAX_NAMES, max_held: int = MAX_HELD
) -> Iterator[tuple[SubvolumeChanges, bool]]:
    """The changes of every subvolume of ``events``, each with whether the
    input has several subvolumes: known when the next event after it is
    read, so only one subvolume's changes are held at a time."""
    tracker = ChangeTracker(max_names=max_names, max_held=max_held)
    ready: SubvolumeChanges | None = None
    several = False
    for event in events:
        if ready is not None:
            several = several or not isinstance(event, EndOfInput)
            yield ready, several
            ready = None
        if isinstance(event, Restart):
            raise e.StreamRestarted(
                f"a new stream header after {event.commands} commands: repair the stream first",
                offset=event.offset,
            )
        if isinstance(event, Command):
            ready = tracker.feed(event)
            several = several or (ready is not None and event.name != "end")  # a SUBVOL ended the one before
    if ready is not None:
        yield ready, several
    if tracker.started:
        yield tracker.finish(), several


def changes(
    events: Iterable[Any], *, max_names: int = MAX_NAMES, max_held: int = MAX_HELD
) -> Iterator[SubvolumeChanges]:
    """The changes of every subvolume of ``events`` (e.g. :func:`sendstream.files.file_events`)."""
    for result, _ in each_subvolume(events, max_names=max_names, max_held=max_held):
        yield result


def read_changes(
    source: StreamSource,
    *,
    max_names: int = MAX_NAMES,
    max_held: int = MAX_HELD,
    max_command_size: int | None = None,
    warn: Warn | None = None,
    backend: Backend | None = None,
) -> Iterator[tuple[SubvolumeChanges, bool]]:
    """:func:`each_subvolume` of the stream at ``source`` (read and checked by ``backend``, the default
    one without it); its problems go to ``warn`` once it is read."""
    with FramedInput(source, max_command_size=max_command_size, warn=warn, backend=backend) as stream:
        yield from each_subvolume(stream.events(), max_names=max_names, max_held=max_held)
