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
    the final one once the subvolume is done. :func:`resolve` does the
    buffering for a whole input: it holds one small record per command of
    the current subvolume (never data) and yields them with their final
    paths when the subvolume ends.

    An entry that was unlinked or rmdir'ed has no final path of its own; a
    file that lives on under another hard link reports that name (the
    first in byte order); a file with no name left reports ``None``.

Known limits
    In an incremental stream the tracker sees only the names the stream
    uses: hard links that already existed in the parent are not known to
    be one inode, so a write through one name is reported under that name
    only. Clones from another subvolume name a path in that subvolume; it
    is reported as given (:attr:`Touched.clone_source`).

For :mod:`sendstream.changes`, the tracker also keeps every entry of the
subvolume (:attr:`PathTracker.entries`, the removed ones included) and, for
an entry the stream did not create, its path and parent directory in the
parent snapshot (:attr:`Entry.origin`, :attr:`Entry.origin_parent`), so a
name's old and new places can be compared when the subvolume ends.

:class:`Statistics` counts commands and bytes per command kind of each
stream of an input; :func:`record_line`, :func:`record_json` and
:func:`statistics_lines` present both (pure functions, for the CLI).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from collections.abc import Iterable, Iterator
from typing import Any

from . import errors as e
from .command import Command
from .decoder import Restart, StreamHeader
from .dump import escape, json_bytes
from .layout import A_DATA, COMMAND_HEADER_SIZE, TLV_HEADER_SIZE, TLV_TYPE

# Commands that make a new entry, remove one, or start a new name space.
_CREATE = frozenset({"mkfile", "mkdir", "mknod", "mkfifo", "mksock", "symlink"})
_REMOVE = frozenset({"unlink", "rmdir"})
_SUBVOLUME = frozenset({"subvol", "snapshot"})
_ORPHAN_PREFIX = b"o"


def is_temporary_name(name: bytes) -> bool:
    """True for the kernel's orphan names ``o<ino>-<gen>-<seq>`` (a single component)."""
    if not name.startswith(_ORPHAN_PREFIX):
        return False
    parts = name[1:].split(b"-")
    return len(parts) == 3 and all(p.isdigit() for p in parts)


class Inode:
    """One inode as far as the stream shows it: the entries that name it."""

    __slots__ = ("entries", "ino")

    def __init__(self, ino: int | None = None) -> None:
        self.ino = ino
        self.entries: list[Entry] = []

    def final_paths(self) -> list[bytes]:
        """Every path that names this inode now, sorted."""
        return sorted(p for e in self.entries if (p := e.path()) is not None)


class Entry:
    """A directory entry: a name in a parent directory, naming an inode.

    The entry keeps its identity through renames (of itself or of any
    directory above it), so a handle taken at a command answers later where
    that command's file went.
    """

    __slots__ = ("alive", "children", "inode", "name", "origin", "origin_parent", "parent")

    def __init__(self, name: bytes, parent: Entry | None, inode: Inode) -> None:
        self.name = name
        self.parent = parent
        self.inode = inode
        self.alive = True
        self.children: dict[bytes, Entry] = {}
        # For an entry the stream did not create (it existed in the parent
        # snapshot): its path and parent there; None for a created entry.
        self.origin: bytes | None = None
        self.origin_parent: Entry | None = None
        inode.entries.append(self)

    @property
    def moved(self) -> bool:
        """True for a pre-existing entry now under another name or directory."""
        if self.origin is None:
            return False
        return self.parent is not self.origin_parent or self.name != self.origin.rpartition(b"/")[2]

    def path(self) -> bytes | None:
        """The current path (``b""`` for the subvolume root), or None once removed."""
        parts: list[bytes] = []
        node: Entry | None = self
        while node is not None and node.parent is not None:
            if not node.alive:
                return None
            parts.append(node.name)
            node = node.parent
        if node is None or not node.alive:
            return None
        return b"/".join(reversed(parts))

    def final_path(self) -> bytes | None:
        """This entry's path; if it is gone, another name of its inode; else None."""
        own = self.path()
        if own is not None:
            return own
        others = self.inode.final_paths()
        return others[0] if others else None

    def __repr__(self) -> str:
        return f"<Entry {self.path()!r}>"


@dataclasses.dataclass(frozen=True, slots=True)
class Touched:
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


class PathTracker:
    """Follows the names of the current subvolume, one command at a time."""

    def __init__(self) -> None:
        self.subvolume: bytes | None = None
        self.uuid: uuid.UUID | None = None
        self.root = Entry(b"", None, Inode())
        self.root.origin = b""
        self._by_ino: dict[int, Inode] = {}
        self.entries: list[Entry] = [self.root]  # every entry of the subvolume, in creation order

    def start(self, path: bytes, subvolume_uuid: uuid.UUID | None) -> None:
        """A new subvolume (SUBVOL or SNAPSHOT): a fresh, empty name space."""
        self.subvolume = path
        self.uuid = subvolume_uuid
        self.root = Entry(b"", None, Inode())
        self.root.origin = b""
        self._by_ino = {}
        self.entries = [self.root]

    def lookup(self, path: bytes) -> Entry:
        """The entry at ``path`` now, made up (as a file that already existed
        in the parent) when the stream has not named it before."""
        node = self.root
        if not path:
            return node
        for name in path.split(b"/"):
            child = node.children.get(name)
            if child is None:
                child = Entry(name, node, Inode())
                if node.origin is not None:
                    child.origin = node.origin + b"/" + name if node.origin else name
                    child.origin_parent = node
                node.children[name] = child
                self.entries.append(child)
            node = child
        return node

    def _parent_and_name(self, path: bytes) -> tuple[Entry, bytes]:
        head, _, name = path.rpartition(b"/")
        return self.lookup(head), name

    def _detach(self, entry: Entry) -> None:
        parent = entry.parent
        if parent is not None and parent.children.get(entry.name) is entry:
            del parent.children[entry.name]

    def _place(self, entry: Entry, path: bytes) -> None:
        """Put ``entry`` at ``path``; an entry already there is replaced (gone)."""
        parent, name = self._parent_and_name(path)
        old = parent.children.get(name)
        if old is not None and old is not entry:
            old.alive = False
        self._detach(entry)
        entry.parent = parent
        entry.name = name
        entry.alive = True
        parent.children[name] = entry

    def feed(self, command: Command) -> Touched | None:
        """Update the names for ``command``; None for commands without a path."""
        name = command.name
        if name in _SUBVOLUME:
            self.start(bytes(command.get("path")), command.get("uuid", None))
            return None
        if command.attributes is None or name == "end":
            return None
        path = command.get("path", None)
        if path is None:
            return None
        path = bytes(path)
        if name in _CREATE:
            ino = command.get("ino", None)
            inode = Inode(ino)
            if ino is not None:
                self._by_ino[ino] = inode
            parent, base = self._parent_and_name(path)
            entry = Entry(base, parent, inode)
            self.entries.append(entry)
            self._place(entry, path)  # replaces whatever the tracker had there
            return Touched(path, entry)
        if name == "rename":
            to = bytes(command.get("path_to"))
            entry = self.lookup(path)
            node: Entry | None = self._parent_and_name(to)[0]
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
            self._place(entry, to)
            return Touched(path, entry, to, entry)
        if name == "link":
            target_path = bytes(command.get("path_link"))
            target = self.lookup(target_path)
            parent, base = self._parent_and_name(path)
            entry = Entry(base, parent, target.inode)
            self.entries.append(entry)
            self._place(entry, path)
            return Touched(path, entry, target_path, target)
        if name in _REMOVE:
            entry = self.lookup(path)
            entry.alive = False
            self._detach(entry)
            return Touched(path, entry)
        entry = self.lookup(path)
        if name == "clone":
            clone_uuid = command.get("clone_uuid")
            clone_path = bytes(command.get("clone_path"))
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


def resolve(events: Iterable[Any]) -> Iterator[CommandPaths]:
    """Every command of ``events`` with its final paths, in stream order.

    Records are yielded when their subvolume ends (END, the next SUBVOL or
    SNAPSHOT, or the end of the input); memory is one small record per
    command of that subvolume. Works on the events of
    :func:`sendstream.files.file_events` (values are copied, not kept).
    """
    tracker = PathTracker()
    pending: list[tuple[int, int, str, bytes | None, Touched | None]] = []

    def flush() -> Iterator[CommandPaths]:
        for index, offset, name, subvolume, touched in pending:
            if touched is None:
                yield CommandPaths(index, offset, name, subvolume, None, None)
                continue
            other_final = touched.other.final_path() if touched.other is not None else None
            if touched.clone_source is not None:
                other_final = touched.clone_source[1]
            yield CommandPaths(
                index,
                offset,
                name,
                subvolume,
                touched.path,
                touched.entry.final_path(),
                touched.other_path,
                other_final,
                touched.clone_source[0] if touched.clone_source else None,
            )
        pending.clear()

    for event in events:
        if isinstance(event, Restart):
            raise e.StreamRestarted(
                f"a new stream header after {event.commands} commands: repair the stream first",
                offset=event.offset,
            )
        if not isinstance(event, Command):
            continue
        if event.name in _SUBVOLUME:
            yield from flush()
        touched = tracker.feed(event)
        pending.append((event.index, event.offset, event.name, tracker.subvolume, touched))
        if event.name == "end":
            yield from flush()
    yield from flush()


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
    command number this library does not know counts as kind ``unknown``."""

    offset: int
    version: int
    commands: dict[str, CommandStats] = dataclasses.field(default_factory=dict)

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


class Statistics:
    """Per-stream statistics of an input (several streams when concatenated)."""

    def __init__(self) -> None:
        self.streams: list[StreamStats] = []

    def feed(self, event: Any) -> None:
        """Count one event of :func:`sendstream.files.file_events` or a Decoder."""
        if isinstance(event, StreamHeader):
            self.streams.append(StreamStats(event.offset, event.version))
        elif isinstance(event, Command) and self.streams:
            self.streams[-1].add(event)


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
    for number, s in enumerate(statistics.streams, 1):
        lines.append(f"stream {number} at offset {s.offset}, version {s.version}:")
        lines.append(f"  {'command':<14} {'count':>8} {'wire bytes':>14} {'data bytes':>14} {'file bytes':>14}")
        for name, c in sorted(s.commands.items(), key=lambda kv: (-kv[1].wire_bytes, kv[0])):
            lines.append(f"  {name:<14} {c.count:>8} {c.wire_bytes:>14} {c.data_bytes:>14} {c.file_bytes:>14}")
        t = s.total
        lines.append(f"  {'total':<14} {t.count:>8} {t.wire_bytes:>14} {t.data_bytes:>14} {t.file_bytes:>14}")
    return lines
