"""Final paths and per-stream statistics.

btrfs send creates every new inode under a temporary name ``o<ino>-<gen>-<seq>``
in the subvolume root and renames it into place later; an incremental moves
inodes that are in the way to such names too, and a directory may be filled
while it still has its temporary name. So the path a command names is the
path *at that moment*. :class:`PathTracker` follows the names of one
subvolume (renames, links, unlinks, rmdirs, creations) so that each command
can be reported with the path it finally affects.

What "final" means, for a tool that reads a stream once
    The path the affected file has when its subvolume's commands end (END,
    or the next SUBVOL/SNAPSHOT of an ``-e`` stream). Until then nobody can
    know it: a later RENAME of the file or of any directory above it changes
    it. :meth:`PathTracker.feed` therefore returns a :class:`Touched` record
    with the path at that moment and :class:`Entry` handles; a handle's
    :meth:`Entry.final_path` is the path at the time it is asked, which is
    the final one once the subvolume is done. :class:`PathResolver` (and
    :func:`resolve`) does the buffering for a whole input: it holds a
    compact record per command of the current subvolume (never data) and
    hands them out with their final paths when the subvolume ends.

    An entry that was unlinked or rmdir'ed has no final path of its own; a
    file that lives on under another hard link reports that name (the
    first in byte order); a file with no name left reports ``None``.

Known limits
    In an incremental stream the tracker sees only the names the stream
    uses: hard links that already existed in the parent are not known to
    be one inode, so a write through one name is reported under that name
    only. Clones from another subvolume name a path in that subvolume; it
    is reported as given (:attr:`Touched.clone_source`).

Memory
    Each name the stream uses, made-up ancestors of a path included, is one
    :class:`Entry` (and usually one :class:`Inode`): 140-200 bytes, and the
    name itself (a bytes object: 33 bytes and its length). A name is stored
    once: paths share their prefixes, and are built only when asked. No
    subvolume may use more than ``max_names`` names (a name longer than
    :data:`NAME_UNIT` bytes counts once per started :data:`NAME_UNIT`
    bytes), else :class:`~sendstream.errors.LimitExceeded`. What waits for
    the end of a subvolume (the records of :class:`PathResolver`, the paths
    of the changes of :mod:`sendstream.changes`, ~100 bytes a change besides)
    counts against ``max_held`` bytes. So memory stays under ``max_names``
    x 400 bytes plus ``max_held``, whatever the input's length.

For :mod:`sendstream.changes`, the tracker also keeps every entry of the
subvolume (:attr:`PathTracker.entries`, the removed ones included) and, for
an entry the stream did not create, its parent directory and name in the
parent snapshot (:attr:`Entry.origin_parent`, :attr:`Entry.origin_name`,
from which :attr:`Entry.origin` builds its path there), so a name's old and
new places can be compared when the subvolume ends.

:class:`Statistics` counts commands and bytes per command kind of each
stream of an input; :func:`record_line`, :func:`record_json` and
:func:`statistics_lines` present both (pure functions, for the CLI).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from array import array
from collections.abc import Iterable, Iterator
from typing import Any, NamedTuple

from .. import errors as e
from ..codec.decoder import Restart, StreamHeader
from ..format.command import Command
from ..format.layout import (
    A_DATA,
    ATTRIBUTE_NUMBERS,
    COMMAND_HEADER_SIZE,
    COMMAND_NUMBERS,
    TLV_HEADER_SIZE,
    TLV_TYPE,
    command_name,
)
from ..render.dump import escape, json_bytes

# Commands that make a new entry, remove one, or start a new name space.
_CREATE = frozenset({"mkfile", "mkdir", "mknod", "mkfifo", "mksock", "symlink"})
_REMOVE = frozenset({"unlink", "rmdir"})
_SUBVOLUME = frozenset({"subvol", "snapshot"})
_ORPHAN_PREFIX = b"o"
_A_PATH, _A_PATH_TO, _A_PATH_LINK, _A_CLONE_PATH = (
    ATTRIBUTE_NUMBERS[n] for n in ("path", "path_to", "path_link", "clone_path")
)

# A name longer than this counts once per started NAME_UNIT bytes against max_names.
NAME_UNIT = 64
# Names per subvolume: the tracker takes 140-200 bytes a name besides the name
# (a deep chain of short names the least, a directory of many the most) and
# `ls` and `diff` ~100 more for its change. At this limit, with 64-byte names,
# `ls` peaks at 243 MB (VmPeak) of the 300 MB that tests/test_memory_bounds.py allows,
# 270 MB with max_held full. Snapshots of 400k files and directories go through
# (the benchmark's metadata stream has ~137k); --max-names raises it.
MAX_NAMES = 400_000
# Bytes held until a subvolume ends: `paths` records (46 bytes each and the part
# of their path that differs from the record before: ~1.4 M commands) and the
# paths of the changes of `ls` and `diff` (33 bytes each and the path).
MAX_HELD = 64 << 20


def is_temporary_name(name: bytes) -> bool:
    """True for the kernel's orphan names ``o<ino>-<gen>-<seq>`` (a single component)."""
    if not name.startswith(_ORPHAN_PREFIX):
        return False
    parts = name[1:].split(b"-")
    return len(parts) == 3 and all(p.isdigit() for p in parts)


def limit_error(message: str, limit: int, option: str, command: Command | None) -> e.LimitExceeded:
    """A :class:`~sendstream.errors.LimitExceeded` at ``command`` (None: no place)."""
    if command is None or command.offset < 0:
        return e.LimitExceeded(message, limit=limit, option=option)
    return e.LimitExceeded(
        message, limit=limit, option=option, offset=command.offset, index=command.index, command=command.name
    )


class Inode:
    """One inode as far as the stream shows it: the entries that name it.

    ``info`` belongs to the tracker's user (what :mod:`sendstream.changes`
    saw done to the inode, the size :mod:`sendstream.downgrade` knows).
    """

    __slots__ = ("_entries", "info")

    def __init__(self) -> None:
        self.info: Any = None
        # Most inodes have one name: the entry itself, a list only for hard links.
        self._entries: Entry | list[Entry] | None = None

    @property
    def entries(self) -> list[Entry]:
        """Every entry that named this inode, in creation order."""
        held = self._entries
        if held is None:
            return []
        return list(held) if isinstance(held, list) else [held]

    @property
    def first(self) -> Entry | None:
        """The first entry that named this inode."""
        held = self._entries
        return held[0] if isinstance(held, list) else held

    def _add(self, entry: Entry) -> None:
        held = self._entries
        if held is None:
            self._entries = entry
        elif isinstance(held, list):
            held.append(entry)
        else:
            self._entries = [held, entry]

    def final_paths(self) -> list[bytes]:
        """Every path that names this inode now, sorted."""
        return sorted(p for e in self.entries if (p := e.path()) is not None)


_JOIN_PARTS = 256


def _joined(names: list[bytes]) -> bytes:
    """``names`` (from the file up to the top directory) as a path. bytes.join
    takes ~90 bytes per part while it works: a deep path is joined in pieces."""
    names.reverse()
    if len(names) <= _JOIN_PARTS:
        return b"/".join(names)
    return b"/".join([b"/".join(names[i : i + _JOIN_PARTS]) for i in range(0, len(names), _JOIN_PARTS)])


# The children of a directory whose last child went: shared, never changed.
_NO_CHILDREN: dict[bytes, Entry] = {}


class Entry:
    """A directory entry: a name in a parent directory, naming an inode.

    The entry keeps its identity through renames (of itself or of any
    directory above it), so a handle taken at a command answers later where
    that command's file went.
    """

    __slots__ = ("_children", "alive", "inode", "name", "origin_name", "origin_parent", "parent")

    def __init__(self, name: bytes, parent: Entry | None, inode: Inode) -> None:
        self.name = name
        self.parent = parent
        self.inode = inode
        self.alive = True  # has a path now: neither it nor a directory above it was removed
        # None while no entry was ever placed here; the only child itself; else a dict by name.
        self._children: Entry | dict[bytes, Entry] | None = None
        # For an entry the stream did not create (it existed in the parent
        # snapshot): its parent and name there; None for a created entry.
        self.origin_parent: Entry | None = None
        self.origin_name: bytes | None = None
        inode._add(self)

    def child(self, name: bytes) -> Entry | None:
        """The entry named ``name`` in this directory now."""
        kids = self._children
        if kids is None or isinstance(kids, dict):
            return kids.get(name) if kids else None
        return kids if kids.name == name else None

    def children(self) -> list[Entry]:
        """The entries in this directory now."""
        kids = self._children
        if kids is None or isinstance(kids, dict):
            return list(kids.values()) if kids else []
        return [kids]

    @property
    def is_parent(self) -> bool:
        """True once an entry was placed in this one: it is a directory."""
        return self._children is not None

    def _adopt(self, entry: Entry) -> None:
        """Hold ``entry`` under its name (replacing what was there)."""
        kids = self._children
        if kids is None or kids is _NO_CHILDREN or (isinstance(kids, Entry) and kids.name == entry.name):
            self._children = entry
        elif isinstance(kids, Entry):
            self._children = {kids.name: kids, entry.name: entry}
        else:
            kids[entry.name] = entry

    def _release(self, entry: Entry) -> None:
        kids = self._children
        if kids is entry:
            self._children = _NO_CHILDREN
        elif isinstance(kids, dict) and kids.get(entry.name) is entry:
            del kids[entry.name]

    @property
    def origin(self) -> bytes | None:
        """The path in the parent snapshot (``b""`` for the root); None for a created entry."""
        if self.origin_name is None:
            return None
        parts: list[bytes] = []
        node = self
        while node.origin_parent is not None and node.origin_name is not None:
            parts.append(node.origin_name)
            node = node.origin_parent
        return _joined(parts)

    @property
    def moved(self) -> bool:
        """True for a pre-existing entry now under another name or directory."""
        if self.origin_name is None:
            return False
        return self.parent is not self.origin_parent or self.name != self.origin_name

    def path(self) -> bytes | None:
        """The current path (``b""`` for the subvolume root), or None once removed."""
        return self.last_path() if self.alive else None

    def last_path(self) -> bytes:
        """The path now, or for a removed entry the path under its last parent
        (that parent's place now, or its own last one if it went too)."""
        parts: list[bytes] = []
        node: Entry | None = self
        while node is not None and node.parent is not None:
            parts.append(node.name)
            node = node.parent
        return _joined(parts)

    def final_path(self) -> bytes | None:
        """This entry's path; if it is gone, another name of its inode; else None."""
        own = self.path()
        if own is not None:
            return own
        others = self.inode.final_paths()
        return others[0] if others else None

    def __repr__(self) -> str:
        return f"<Entry {self.path()!r}>"


class Touched(NamedTuple):
    """What one command names: ``entry`` (its PATH) and, for RENAME, LINK and a
    clone within the subvolume, ``other`` (PATH_TO, PATH_LINK, CLONE_PATH).

    ``path`` and ``other_path`` are the names as the command gives them;
    ``entry.final_path()`` is where the file ends up once the subvolume is done.
    A clone from another subvolume has ``clone_source = (uuid, path)`` instead.
    """

    path: bytes
    entry: Entry
    other_path: bytes | None = None
    other: Entry | None = None
    clone_source: tuple[uuid.UUID, bytes] | None = None


def _string(command: Command, number: int) -> bytes:
    """A string attribute (checked present by the decoder) as bytes."""
    return bytes(command.raw(number) or b"")


class PathTracker:
    """Follows the names of the current subvolume, one command at a time.

    At most ``max_names`` names per subvolume (see the module's Memory).
    """

    def __init__(self, *, max_names: int = MAX_NAMES) -> None:
        self.max_names = max_names
        self.names = 0
        self._command: Command | None = None  # the one being fed, for errors
        self.start(b"", None)
        self.subvolume: bytes | None = None

    def start(self, path: bytes, subvolume_uuid: uuid.UUID | None) -> None:
        """A new subvolume (SUBVOL or SNAPSHOT): a fresh, empty name space."""
        self.subvolume = path
        self.uuid = subvolume_uuid
        self.names = 1
        self.root = Entry(b"", None, Inode())
        self.root.origin_name = b""
        self.entries: list[Entry] = [self.root]  # every entry of the subvolume, in creation order

    def _entry(self, name: bytes, parent: Entry, inode: Inode) -> Entry:
        """A new entry, counted against ``max_names``."""
        self.names += 1 + max(0, len(name) - 1) // NAME_UNIT
        if self.names > self.max_names:
            raise limit_error(
                f"the subvolume uses more than {self.max_names} names (every directory above a path counts)",
                self.max_names,
                "--max-names",
                self._command,
            )
        entry = Entry(name, parent, inode)
        entry.alive = parent.alive  # dead only under a removed subvolume root
        self.entries.append(entry)
        return entry

    def lookup(self, path: bytes) -> Entry:
        """The entry at ``path`` now, made up (as a file that already existed
        in the parent) when the stream has not named it before."""
        node = self.root
        if not path:
            return node
        for name in path.split(b"/"):
            child = node.child(name)
            if child is None:
                child = self._entry(name, node, Inode())
                if node.origin_name is not None:
                    child.origin_parent = node
                    child.origin_name = name
                node._adopt(child)
            node = child
        return node

    def _parent_and_name(self, path: bytes) -> tuple[Entry, bytes]:
        head, _, name = path.rpartition(b"/")
        return self.lookup(head), name

    def _remove(self, entry: Entry) -> None:
        """``entry`` and everything under it have no path any more."""
        if entry.parent is not None:
            entry.parent._release(entry)
        todo = [entry]
        while todo:
            gone = todo.pop()
            if gone.alive:  # a subtree that went before was marked then
                gone.alive = False
                todo += gone.children()

    def _place(self, entry: Entry, parent: Entry, name: bytes) -> None:
        """Put ``entry`` at ``name`` in ``parent``; an entry already there is replaced (gone)."""
        old = parent.child(name)
        if old is not None and old is not entry:
            self._remove(old)
        if entry.parent is not None:
            entry.parent._release(entry)
        entry.parent = parent
        entry.name = name
        parent._adopt(entry)

    def feed(self, command: Command) -> Touched | None:
        """Update the names for ``command``; None for commands without a path."""
        self._command = command
        name = command.name
        if name in _SUBVOLUME:
            self.start(bytes(command.get("path")), command.get("uuid", None))
            return None
        if command.attributes is None or name == "end":
            return None
        raw = command.raw(_A_PATH)
        if raw is None:
            return None
        path = bytes(raw)
        if name in _CREATE:
            parent, base = self._parent_and_name(path)
            entry = self._entry(base, parent, Inode())
            self._place(entry, parent, base)  # replaces whatever the tracker had there
            return Touched(path, entry)
        if name == "rename":
            to = _string(command, _A_PATH_TO)
            entry = self.lookup(path)
            parent, base = self._parent_and_name(to)
            node: Entry | None = parent
            while node is not None:
                if node is entry:  # the kernel refuses it (EINVAL); following it would make a cycle
                    raise e.FormatError(
                        "a directory renamed into itself",
                        offset=command.offset,
                        index=command.index,
                        command=name,
                        expected="a path_to outside the path renamed",
                    )
                node = node.parent
            self._place(entry, parent, base)
            return Touched(path, entry, to, entry)
        if name == "link":
            target_path = _string(command, _A_PATH_LINK)
            target = self.lookup(target_path)
            parent, base = self._parent_and_name(path)
            entry = self._entry(base, parent, target.inode)
            self._place(entry, parent, base)
            return Touched(path, entry, target_path, target)
        if name in _REMOVE:
            entry = self.lookup(path)
            self._remove(entry)
            return Touched(path, entry)
        entry = self.lookup(path)
        if name == "clone":
            clone_uuid = command.get("clone_uuid")
            clone_path = _string(command, _A_CLONE_PATH)
            if clone_uuid == self.uuid:
                return Touched(path, entry, clone_path, self.lookup(clone_path))
            return Touched(path, entry, clone_path, None, (clone_uuid, clone_path))
        return Touched(path, entry)


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
_C_RENAME, _C_LINK, _C_CLONE = COMMAND_NUMBERS["rename"], COMMAND_NUMBERS["link"], COMMAND_NUMBERS["clone"]


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
        if event.name in _SUBVOLUME or event.name == "end":
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
            other_path = bytes(blob[split:end]) if cmd in (_C_RENAME, _C_LINK, _C_CLONE) else None
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


# --- statistics -------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class CommandStats:
    """Totals for one command kind.

    ``wire_bytes``: the commands as encoded (10-byte header and every TLV);
    ``data_bytes``: the DATA attribute bytes they carry (file data as sent,
    compressed for ENCODED_WRITE); ``file_bytes``: the file bytes they
    affect (WRITE data, ENCODED_WRITE unencoded_file_len, CLONE clone_len,
    UPDATE_EXTENT and FALLOCATE size).
    """

    count: int = 0
    wire_bytes: int = 0
    data_bytes: int = 0
    file_bytes: int = 0


_FILE_LEN = {"encoded_write": "unencoded_file_len", "clone": "clone_len", "update_extent": "size", "fallocate": "size"}


@dataclasses.dataclass(slots=True)
class StreamStats:
    """Counts and bytes per command kind of one stream (header to END); every
    command number this library does not know counts as kind ``unknown``.
    ``streams`` is above 1 for the streams :class:`Statistics` adds up after
    its first :data:`MAX_STREAMS`."""

    offset: int
    version: int
    commands: dict[str, CommandStats] = dataclasses.field(default_factory=dict)
    streams: int = 1

    def add(self, command: Command) -> None:
        # Unknown command numbers share one row: 65,000 of them must not make 65,000 rows.
        name = command.name if command.spec is not None else "unknown"
        stats = self.commands.get(name)
        if stats is None:
            stats = self.commands[name] = CommandStats()
        stats.count += 1
        stats.wire_bytes += wire_size(command, self.version)
        data = command.raw(A_DATA) if command.attributes is not None else None
        if data is not None:
            stats.data_bytes += len(data)
            if command.name == "write":
                stats.file_bytes += len(data)
        key = _FILE_LEN.get(command.name)
        if key is not None:
            stats.file_bytes += int(command.get(key, 0))

    @property
    def total(self) -> CommandStats:
        """All kinds together."""
        out = CommandStats()
        for s in self.commands.values():
            out.count += s.count
            out.wire_bytes += s.wire_bytes
            out.data_bytes += s.data_bytes
            out.file_bytes += s.file_bytes
        return out


def wire_size(command: Command, version: int) -> int:
    """The encoded size of ``command`` in a stream of ``version`` (header included)."""
    if command.attributes is None:
        return COMMAND_HEADER_SIZE + len(command.payload or b"")
    size = COMMAND_HEADER_SIZE
    for t, value in command.attributes:
        size += (TLV_TYPE.size if t == A_DATA and version >= 2 else TLV_HEADER_SIZE) + len(value)
    return size


# Streams listed one by one; the ones after them are added up in one row.
MAX_STREAMS = 1000


class Statistics:
    """Per-stream statistics of an input (several streams when concatenated).

    Memory is bounded: at most :data:`MAX_STREAMS` streams are kept one by
    one (each with at most one row per command kind), the rest in ``rest``.
    """

    def __init__(self) -> None:
        self.streams: list[StreamStats] = []
        self.rest: StreamStats | None = None

    def feed(self, event: Any) -> None:
        """Count one event of :func:`sendstream.files.file_events` or a Decoder."""
        if isinstance(event, StreamHeader):
            if len(self.streams) < MAX_STREAMS:
                self.streams.append(StreamStats(event.offset, event.version))
            elif self.rest is None:
                self.rest = StreamStats(event.offset, event.version)
            else:
                self.rest.streams += 1
                if self.rest.version != event.version:
                    self.rest.version = 0
        elif isinstance(event, Command) and self.streams:
            (self.rest or self.streams[-1]).add(event)

    def all(self) -> list[StreamStats]:
        """The streams listed one by one, then the rest added up (if any)."""
        return self.streams + ([self.rest] if self.rest is not None else [])


# --- presentation -------------------------------------------------------------


def _name(raw: bytes | None) -> bytes:
    return b"-" if raw is None else escape(raw) or b"."


def record_line(record: CommandPaths) -> bytes:
    """One record as text: index, command, the final path (``-`` when the file
    is gone, ``.`` for the root), then ``was=PATH`` when the command named
    another path, and ``other=FINAL`` for RENAME, LINK and CLONE."""
    if record.path is None:
        return b"%d %s\n" % (record.index, record.command.encode())
    line = b"%d %-14s %s" % (record.index, record.command.encode(), _name(record.final))
    if record.renamed:
        line += b" was=" + _name(record.path)
    if record.other_path is not None:
        line += b" other=" + (str(record.clone_uuid).encode() + b":" if record.clone_uuid else b"")
        line += _name(record.other_final)
    return line + b"\n"


def record_json(record: CommandPaths) -> dict[str, Any]:
    """One record as a JSON-ready dict (byte strings as in ``dump --json``)."""
    out: dict[str, Any] = {"offset": record.offset, "index": record.index, "command": record.command}
    if record.subvolume is not None:
        out["subvolume"] = json_bytes(record.subvolume)
    if record.path is not None:
        out["path"] = json_bytes(record.path)
        out["final"] = None if record.final is None else json_bytes(record.final)
    if record.other_path is not None:
        out["other_path"] = json_bytes(record.other_path)
        out["other_final"] = None if record.other_final is None else json_bytes(record.other_final)
    if record.clone_uuid is not None:
        out["clone_uuid"] = str(record.clone_uuid)
    return out


def record_json_line(record: CommandPaths) -> bytes:
    """:func:`record_json` as one line of JSON."""
    return json.dumps(record_json(record), separators=(",", ":")).encode() + b"\n"


def statistics_lines(statistics: Statistics) -> list[str]:
    """A table per stream: count, wire bytes, data bytes and file bytes per command kind."""
    lines = []
    for number, s in enumerate(statistics.all(), 1):
        if s.streams == 1:
            lines.append(f"stream {number} at offset {s.offset}, version {s.version}:")
        else:
            version = f"version {s.version}" if s.version else "several versions"
            lines.append(f"streams {number} to {number + s.streams - 1} from offset {s.offset}, {version}:")
        lines.append(f"  {'command':<14} {'count':>8} {'wire bytes':>14} {'data bytes':>14} {'file bytes':>14}")
        for name, c in sorted(s.commands.items(), key=lambda kv: (-kv[1].wire_bytes, kv[0])):
            lines.append(f"  {name:<14} {c.count:>8} {c.wire_bytes:>14} {c.data_bytes:>14} {c.file_bytes:>14}")
        t = s.total
        lines.append(f"  {'total':<14} {t.count:>8} {t.wire_bytes:>14} {t.data_bytes:>14} {t.file_bytes:>14}")
    return lines
