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

import uuid
from typing import Any, NamedTuple

from .. import errors as e
from ..format.command import Command
from ..format.layout import (
    ATTRIBUTE_NUMBERS,
    COMMAND_NUMBERS,
)

# Commands that make a new entry, remove one, or start a new name space.
_CREATE = frozenset({"mkfile", "mkdir", "mknod", "mkfifo", "mksock", "symlink"})


_REMOVE = frozenset({"unlink", "rmdir"})


SUBVOLUME = frozenset({"subvol", "snapshot"})


_ORPHAN_PREFIX = b"o"


_A_PATH, _A_PATH_TO, _A_PATH_LINK, _A_CLONE_PATH = (
    ATTRIBUTE_NUMBERS[n] for n in ("path", "path_to", "path_link", "clone_path")
)


# A name longer than this counts once per started NAME_UNIT bytes against max_names.
NAME_UNIT = 64


# Names per subvolume: the tracker takes 140-200 bytes a name besides the name
# (a deep chain of short names the least, a directory of many the most) and
# `ls` and `diff` ~100 more for its change. At this limit, with 64-byte names,
# `ls` peaks at 243 MB (VmPeak) of the 300 MB that tests/soak/test_memory_bounds.py allows,
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
        if name in SUBVOLUME:
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


C_RENAME, C_LINK, C_CLONE = COMMAND_NUMBERS["rename"], COMMAND_NUMBERS["link"], COMMAND_NUMBERS["clone"]
