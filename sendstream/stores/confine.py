"""What a client's stream may name before ``btrfs receive`` sees it: paths in its subvolume, UUIDs of its own.

``btrfs receive`` joins every path of a stream to its subvolume as given,
so a ``..`` would reach out of the subvolume into the client's place (its
``--chroot``). :class:`UuidGuard` sees every command before it goes on and
refuses ``..``, an absolute path and a NUL in every path of every command
(a symlink's target aside: it may say anything), and through each
subvolume's :class:`~sendstream.analysis.symlinks.SymlinkTracker` a path
through a symlink, or to one (or a device) that ``btrfs receive`` would
follow or open. An incremental stream's parent is read on disk for that.

``btrfs receive`` finds a SNAPSHOT's parent and a CLONE's source by UUID
(received UUID first, then UUID) across the whole file system, not in the
directory it writes to. A crafted stream could so clone another client's
data into its own subvolume, or claim another client's snapshot as its
parent. The guard allows a parent or clone source only when it is one of
the client's own subvolumes (a subvolume directly in its place) and no
subvolume outside the place carries that UUID too; the stream's own
subvolume may not carry a UUID found outside the place either, or a later
lookup could pick the wrong one. A clone from the subvolume being received
is always allowed. The file system is read again for each subvolume of the
stream, after its UUID is claimed, so that a UUID another transfer received
meanwhile is seen.

The subvolumes are read from the file system's tree of roots (as ``btrfs
subvolume list`` does), not from that tool's text: a name is data, and a
name with a newline would forge a line.
"""

from __future__ import annotations

import dataclasses
import fcntl
import os
import re
import stat
import struct
from collections.abc import Callable, Iterator
from typing import Any, NoReturn
from uuid import UUID

from .. import errors as e
from ..analysis.paths import MAX_NAMES
from ..analysis.symlinks import (
    ABSENT,
    DIR,
    PLAIN,
    SPECIAL,
    SYMLINK,
    Base,
    Budget,
    SymlinkTracker,
)
from ..codec.attributes import split_attributes
from ..extract.tree import PATH_MAX, split_path
from ..format.command import Command
from ..format.layout import (
    A_DATA,
    ATTRIBUTE_NUMBERS,
    COMMAND_HEADER,
    COMMAND_HEADER_SIZE,
    COMMAND_NUMBERS,
    STREAM_HEADER,
    STREAM_MAGIC,
    TLV_HEADER,
    TLV_HEADER_SIZE,
    attribute_name,
    command_name,
)

_SUBVOL, _SNAPSHOT, _CLONE = COMMAND_NUMBERS["subvol"], COMMAND_NUMBERS["snapshot"], COMMAND_NUMBERS["clone"]
_WATCHED = {_SUBVOL, _SNAPSHOT, _CLONE}
_LINK = COMMAND_NUMBERS["link"]
_PATHS = frozenset(ATTRIBUTE_NUMBERS[name] for name in ("path", "path_to", "clone_path"))
_LINK_PATHS = _PATHS | {ATTRIBUTE_NUMBERS["path_link"]}  # a LINK's path_link is a path; a SYMLINK's, a target
_NAMED = {_SUBVOL, _SNAPSHOT, _LINK}  # a SUBVOL's and SNAPSHOT's path is their subvolume's name (_subvolume)
# A fast path for most paths: plain names, none that starts with a dot or is longer than NAME_MAX; any
# other path is judged by split_path (which takes ".profile", and refuses "..")
_PLAIN = re.compile(rb"(?:[^/\0.][^/\0]{0,254}/)*[^/\0.][^/\0]{0,254}|")
_KINDS = {stat.S_IFREG: PLAIN, stat.S_IFDIR: DIR, stat.S_IFLNK: SYMLINK}
_INO_LOOKUP = 0xD0009412  # BTRFS_IOC_INO_LOOKUP: _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args), 4096 bytes
_TREE_SEARCH = 0xD0009411  # BTRFS_IOC_TREE_SEARCH: _IOWR(0x94, 17, struct btrfs_ioctl_search_args), 4096 bytes
_SEARCH_KEY = struct.Struct("<7Q3I36x")  # btrfs_ioctl_search_key: tree, objectid, offset, transid ranges, types, count
_SEARCH_HEADER = struct.Struct("<QQQII")  # btrfs_ioctl_search_header: transid, objectid, offset, type, len
_ROOT_ITEM = struct.Struct("<160xQ40xQ")  # btrfs_root_item: generation, flags
# generation_v2, uuid, parent_uuid, received_uuid, stransid; rtime's seconds and nanoseconds (when it was received)
_ROOT_ITEM_UUIDS = struct.Struct("<239xQ16s16s16s16xQ44xQI")
_ROOT_ITEM_SIZE = 439  # a root item with UUIDs (since Linux 3.6)
_ROOT_REF = struct.Struct("<Q8xH")  # btrfs_root_ref: dirid, sequence, name_len; the name follows
_ROOT_TREE, _ROOT_ITEM_KEY, _ROOT_BACKREF_KEY = 1, 132, 144
_FIRST_FREE_OBJECTID = 256  # the inode of a subvolume's root directory, and the first subvolume ID
_LAST_FREE_OBJECTID = 2**64 - 256
_READONLY = 1  # BTRFS_ROOT_SUBVOL_RDONLY
_MAX = 2**64 - 1
_NOT_OURS = "is not this client's"
_UNIQUE = "a UUID no subvolume outside this client's place has"


_RootItem = tuple[UUID | None, UUID | None, UUID | None, int, float | None, bool]


class Refused(e.FormatError):
    """A stream names a subvolume that is not its client's, or a path out of its subvolume."""

    exit_code = e.EXIT_USAGE
    kind = "refused"


@dataclasses.dataclass(frozen=True, slots=True)
class Subvolume:
    """A subvolume as its root item says (UUIDs None where btrfs shows ``-``), and where it is: the
    subvolume it is in, the directory there and its name."""

    id: int
    uuid: UUID | None
    parent_uuid: UUID | None
    received_uuid: UUID | None
    send_transid: int
    received_at: float | None  # when ``btrfs receive`` finished it (the root item's rtime, seconds since the epoch)
    readonly: bool
    parent_id: int
    dirid: int
    name: bytes


@dataclasses.dataclass(frozen=True, slots=True)
class Subvolumes:
    """The subvolumes of a place's file system: the UUIDs and received UUIDs of those directly in the
    place (``own``), and of every other one (``foreign``, with its ID)."""

    place: str
    all: dict[int, Subvolume]
    own: set[UUID]
    foreign: dict[UUID, int]
    names: dict[int, str]  # of those directly in the place, by ID

    def where(self, found: UUID) -> str:
        """The path (from the file system's top level, escaped) of the foreign subvolume that has ``found``."""
        parts: list[bytes] = []
        at = self.foreign[found]
        try:
            fd = os.open(self.place, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:
                while (subvolume := self.all.get(at)) is not None and len(parts) < len(self.all):
                    parts.append(_ino_lookup(fd, subvolume.parent_id, subvolume.dirid)[1] + subvolume.name)
                    at = subvolume.parent_id
            finally:
                os.close(fd)
        except OSError:  # deleted meanwhile
            return f"of ID {self.foreign[found]}"
        return "<FS_TREE>/" + e.shown(b"/".join(reversed(parts)))


def placed(place: str) -> tuple[dict[str, Subvolume], dict[int, Subvolume]]:
    """The subvolumes directly in ``place`` by their names there, and every subvolume of its file system."""
    try:
        everything = subvolumes_of(place)
    except OSError as exc:
        raise e.OutputError(place, f"cannot read the subvolumes of its file system: {exc.strerror}") from None
    mine = {}
    with os.scandir(place) as entries:
        for entry in entries:
            try:  # (readdir gives a subvolume's entry the subvolume's ID as its inode; stat gives its root's)
                if (
                    entry.is_dir(follow_symlinks=False)
                    and entry.stat(follow_symlinks=False).st_ino == _FIRST_FREE_OBJECTID
                ):
                    found = everything.get(_ino_lookup_root(entry.path))
                    if found is not None:
                        mine[entry.name] = found
            except FileNotFoundError:  # deleted meanwhile (a failed transfer of the client's)
                continue
    return mine, everything


def subvolumes(place: str) -> Subvolumes:
    """The subvolumes of ``place``'s file system, the place's own apart."""
    mine, everything = placed(place)
    ids = {s.id: name for name, s in mine.items()}
    own: set[UUID] = set()
    foreign: dict[UUID, int] = {}
    for s in everything.values():
        for found in (s.uuid, s.received_uuid):
            if found is not None:
                if s.id in ids:
                    own.add(found)
                else:
                    foreign[found] = s.id
    return Subvolumes(place, everything, own, foreign, ids)


def leftover(path: str, subvolume: UUID) -> bool:
    """Whether ``path`` is a subvolume that a cut ``btrfs receive`` of ``subvolume`` left: begun and not
    finished (writable, no received UUID), or finished as that one (its received UUID)."""
    try:
        if not (stat.S_ISDIR((found := os.lstat(path)).st_mode) and found.st_ino == _FIRST_FREE_OBJECTID):
            return False
        root = _ino_lookup_root(path)
        left = subvolumes_of(path, root, root).get(root)
    except OSError:
        return False
    if left is None:
        return False
    if left.received_uuid is None:
        return not left.readonly
    return left.received_uuid == subvolume


def lstat_kinds(fd: int, shown: str) -> Base:
    """The kinds of the paths below the directory ``fd`` (a read-only subvolume, ``shown`` in errors), as
    ``lstat`` tells them."""

    def kind(path: bytes) -> int:
        try:
            mode = os.lstat(path, dir_fd=fd).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return ABSENT
        except OSError as exc:
            raise e.OutputError(shown, f"cannot read {e.shown(path)!r} in it: {exc.strerror}") from None
        return _KINDS.get(stat.S_IFMT(mode), SPECIAL)

    return kind


def subvolumes_of(
    path: str, first: int = _FIRST_FREE_OBJECTID, last: int = _LAST_FREE_OBJECTID
) -> dict[int, Subvolume]:
    """The subvolumes of ``path``'s file system with IDs from ``first`` to ``last``, by ID (a deleted one that
    is not cleaned up yet has no place in the tree, and is left out, as ``btrfs subvolume list`` does)."""
    items: dict[int, _RootItem] = {}
    refs: dict[int, tuple[int, int, bytes]] = {}
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for objectid, kind, offset, data in _search(fd, first, last):
            if kind == _ROOT_BACKREF_KEY and len(data) >= _ROOT_REF.size:
                dirid, length = _ROOT_REF.unpack_from(data)
                refs[objectid] = (offset, dirid, data[_ROOT_REF.size : _ROOT_REF.size + length])
            elif kind == _ROOT_ITEM_KEY and len(data) >= _ROOT_ITEM.size:
                items[objectid] = _root_item(data)
    finally:
        os.close(fd)
    return {i: Subvolume(i, *item, *refs[i]) for i, item in items.items() if i in refs}


def _root_item(data: bytes) -> _RootItem:
    """A root item's UUID, parent UUID, received UUID, send transid, receive time and read-only flag."""
    generation, flags = _ROOT_ITEM.unpack_from(data)
    readonly = bool(flags & _READONLY)
    # older than UUIDs, or an old kernel wrote it since (it keeps generation_v2 as it was): no UUIDs
    if len(data) < _ROOT_ITEM_SIZE or _ROOT_ITEM_UUIDS.unpack_from(data)[0] != generation:
        return None, None, None, 0, None, readonly
    _, *raw, send_transid, seconds, nanoseconds = _ROOT_ITEM_UUIDS.unpack_from(data)
    found, parent, received = (UUID(bytes=r) if any(r) else None for r in raw)
    return found, parent, received, send_transid, (seconds + nanoseconds / 1e9) if seconds else None, readonly


def _search(fd: int, first: int, last: int) -> Iterator[tuple[int, int, int, bytes]]:
    """The root items and back references in the tree of roots, of objects ``first`` to ``last``."""
    key = (first, _ROOT_ITEM_KEY, 0)
    while key[0] <= last:
        args = bytearray(4096)
        _SEARCH_KEY.pack_into(args, 0, _ROOT_TREE, key[0], last, key[2], _MAX, 0, _MAX, key[1], _ROOT_BACKREF_KEY, 4096)
        fcntl.ioctl(fd, _TREE_SEARCH, args)
        count = _SEARCH_KEY.unpack_from(args)[9]
        if not count:
            return
        pos = _SEARCH_KEY.size
        for _ in range(count):
            _, objectid, offset, kind, length = _SEARCH_HEADER.unpack_from(args, pos)
            pos += _SEARCH_HEADER.size
            yield objectid, kind, offset, bytes(args[pos : pos + length])
            pos += length
        key = (
            (objectid, kind, offset + 1)
            if offset < _MAX
            else (objectid, kind + 1, 0)
            if kind < 255
            else (objectid + 1, 0, 0)
        )


def _ino_lookup(fd: int, tree: int, objectid: int) -> tuple[int, bytes]:
    """The tree of ``fd``'s subvolume (``tree`` 0) or ``tree``, and the path of directory ``objectid`` in it
    (``b""`` for its root, else with a trailing ``/``), as ``btrfs inspect-internal rootid`` finds them."""
    args = bytearray(struct.pack("<QQ", tree, objectid) + bytes(4080))
    fcntl.ioctl(fd, _INO_LOOKUP, args)
    return int(struct.unpack_from("<Q", args)[0]), bytes(args[16:]).split(b"\0", 1)[0]


def _ino_lookup_root(path: str) -> int:
    """The subvolume ID of the subvolume whose root is ``path``."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return _ino_lookup(fd, 0, _FIRST_FREE_OBJECTID)[0]
    finally:
        os.close(fd)


class UuidGuard:
    """Sees what goes to ``btrfs receive`` in ``place`` before it goes: a stream header, or whole commands.

    ``claim(uuid, name)`` is asked for each stream's own subvolume (its UUID,
    and its name in the place: one path component) and may refuse it by
    raising (another transfer holds that UUID or name now, or the name is
    taken); then the file system is read (:func:`subvolumes`). Every path
    goes through the :class:`~sendstream.analysis.symlinks.SymlinkTracker`
    of its subvolume; a parent or clone source on disk is read through a
    directory descriptor, closed when the guard is left (``with``).
    """

    def __init__(self, place: str, claim: Callable[[UUID, str], object], max_names: int = MAX_NAMES) -> None:
        self.place = place
        self._claim = claim
        self._seen: Subvolumes | None = None
        self._budget = Budget(max_names, "UuidGuard's max_names")
        self._tracker: SymlinkTracker | None = None  # of the subvolume being received
        self._made: dict[UUID, SymlinkTracker] = {}  # the subvolumes of this input's earlier streams
        self._made_names: set[str] = set()
        self._sources: dict[UUID, SymlinkTracker] = {}  # clone sources on disk, read since the subvolume began
        self._fds: dict[int, int] = {}  # of subvolumes on disk, by ID
        self._current: UUID | None = None
        self._version = 0
        self.offset = 0  # of the output
        self.index = -1  # of the command, in the output

    def __call__(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        if view[: len(STREAM_MAGIC)] == STREAM_MAGIC:
            self._version = STREAM_HEADER.unpack_from(view)[1]
            self.offset += len(view)
            return
        pos, stop = 0, A_DATA if self._version >= 2 else -1  # (a version-2 DATA has no length: it runs to the end)
        command_at, attribute_at, plain = COMMAND_HEADER.unpack_from, TLV_HEADER.unpack_from, _PLAIN.fullmatch
        while pos < len(view):  # (one loop, not a call a command: every command of every stream goes through it)
            length, cmd, _ = command_at(view, pos)
            self.index += 1
            start = at = pos + COMMAND_HEADER_SIZE
            end = start + length
            paths = _PATHS if cmd not in _NAMED else _LINK_PATHS if cmd == _LINK else ()
            named = {}  # the paths, the last of each attribute as btrfs receive takes it
            while end - at >= TLV_HEADER_SIZE:
                number, size = attribute_at(view, at)
                if number == stop:
                    break
                at += TLV_HEADER_SIZE
                if number in paths:
                    value = named[number] = bytes(view[at : at + size])
                    if size >= PATH_MAX or plain(value) is None:
                        self._path(value, cmd, number, self.offset + pos)
                at += size
            source = None
            if cmd in _WATCHED:
                attrs = split_attributes(view, start, end, self._version, self.index, None)
                command = Command(cmd, attrs, version=self._version)
                if cmd != _CLONE:
                    self._subvolume(command, self.offset + pos)
                if cmd != _SUBVOL:
                    source = self._source(command, self.offset + pos)
            if named:
                self._follow(cmd, named, source, self.offset + pos)
            pos = end
        if pos != len(view):  # the healer writes whole commands: anything else would go unchecked
            raise e.UsageError(f"the UUID guard got part of a command at output offset {self.offset + len(view)}")
        self.offset += len(view)

    def __enter__(self) -> UuidGuard:
        return self

    def __exit__(self, *exc: object) -> None:
        """Close the descriptors of the subvolumes read on disk."""
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def _follow(self, cmd: int, named: dict[int, bytes], source: SymlinkTracker | None, offset: int) -> None:
        """Give the command's paths to its subvolume's tracker, which refuses a path through a symlink."""
        try:
            if self._tracker is None:
                raise e.UnsafePath("it comes before the stream's subvolume", expected="a SUBVOL or SNAPSHOT first")
            self._tracker.feed(cmd, named, source)
        except e.UnsafePath as exc:
            number = ATTRIBUTE_NUMBERS[exc.attribute or "path"]
            self._refused(exc, named.get(number, b""), cmd, number, offset)
        except e.LimitExceeded as exc:
            exc.offset, exc.index, exc.command = offset, self.index, command_name(cmd)
            raise

    def _path(self, value: bytes, cmd: int, number: int, offset: int) -> None:
        """Refuse a path that :func:`~sendstream.extract.tree.split_path` refuses."""
        try:
            split_path(value, what=attribute_name(number).replace("_", " "))
        except e.UnsafePath as exc:
            self._refused(exc, value, cmd, number, offset)

    def _refused(self, exc: e.UnsafePath, value: bytes, cmd: int, number: int, offset: int) -> NoReturn:
        raise Refused(
            f"{command_name(cmd)} names a path out of its subvolume: {exc.message} ('{e.shown(value)}')",
            offset=offset,
            index=self.index,
            command=command_name(cmd),
            attribute=attribute_name(number),
            expected=exc.expected,
        ) from None

    def _subvolume(self, command: Command, offset: int) -> None:
        subvolume = command.get("uuid")
        name = command.get("path")
        if not name or b"/" in name or name in (b".", b"..") or b"\0" in name:
            raise Refused(
                f"{command.name} names its subvolume {name!r}, not one name in this client's place",
                offset=offset,
                index=self.index,
                command=command.name,
                attribute="path",
                expected="one path component",
                actual=name,
            )
        if self._current is not None and self._tracker is not None:
            self._made[self._current] = self._tracker  # a later subvolume of the input may build on it
        self._claim(subvolume, os.fsdecode(name))
        self._current = subvolume
        self._made_names.add(os.fsdecode(name))
        self._tracker = SymlinkTracker(None, self._budget) if command.cmd == _SUBVOL else None
        self._sources.clear()
        self._seen = subvolumes(self.place)  # after the claim: what another transfer received meanwhile too
        if subvolume in self._seen.foreign:
            self._refuse(command, offset, "uuid", subvolume, _UNIQUE, _outside(self._seen.where(subvolume)))

    def _source(self, command: Command, offset: int) -> SymlinkTracker:
        """The parent of a SNAPSHOT (its tracker is begun on it) or the source of a CLONE: one of this
        client's subvolumes, as ``btrfs receive`` finds it (by received UUID, else by UUID)."""
        source = command.get("clone_uuid")
        if command.cmd == _CLONE:
            if source == self._current and self._tracker is not None:
                return self._tracker
            if source in self._sources:
                return self._sources[source]
        seen = self._seen = self._seen or subvolumes(self.place)
        what = "its parent" if command.cmd == _SNAPSHOT else "a clone source"
        ours = f"{what} among this client's own subvolumes"
        if source not in seen.own and source not in self._made:
            self._refuse(command, offset, "clone_uuid", source, ours)
        if source in seen.foreign:
            self._refuse(command, offset, "clone_uuid", source, _UNIQUE, _outside(seen.where(source)))
        mine = [s for s in seen.all.values() if s.id in seen.names and seen.names[s.id] not in self._made_names]
        found = [s for s in mine if s.received_uuid == source] or [s for s in mine if s.uuid == source]
        if len(found) + (source in self._made) > 1:
            names = [e.escaped(seen.names[s.id]) for s in found] + (
                ["one of this input"] if source in self._made else []
            )
            whose = f"more than one subvolume of this client's has ({', '.join(names)})"
            self._refuse(command, offset, "clone_uuid", source, f"{what}: one subvolume", whose)
        base: Base
        if source in self._made:
            tracker = self._made[source]
            base = tracker.kind
        elif not found:
            self._refuse(command, offset, "clone_uuid", source, ours)
        elif not found[0].readonly:
            self._refuse(command, offset, "clone_uuid", source, f"{what}: a read-only subvolume", "is not read-only")
        else:
            base = self._on_disk(found[0], seen.names[found[0].id])
            tracker = SymlinkTracker(base, self._budget)
        if command.cmd == _SNAPSHOT:
            self._tracker = SymlinkTracker(base, self._budget)
        else:
            self._sources[source] = tracker
        return tracker

    def _on_disk(self, subvolume: Subvolume, name: str) -> Base:
        """The kinds of the paths of ``subvolume`` (``name`` in the place, read-only), read by ``lstat``."""
        fd = self._fds.get(subvolume.id)
        path = os.path.join(self.place, name)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
                self._fds[subvolume.id] = fd
                if _ino_lookup(fd, 0, _FIRST_FREE_OBJECTID)[0] != subvolume.id:
                    raise OSError(0, "it is another subvolume now")
            except OSError as exc:
                raise e.OutputError(path, f"cannot read the subvolume: {exc.strerror}") from None

        return lstat_kinds(fd, path)

    def _refuse(
        self, command: Command, offset: int, attribute: str, value: UUID, expected: str, whose: str = _NOT_OURS
    ) -> NoReturn:
        """Refuse ``command`` for the UUID ``value``: ``whose`` says why (not this client's, by default)."""
        raise Refused(
            f"{command.name} names subvolume {value}, which {whose}",
            offset=offset,
            index=self.index,
            command=command.name,
            attribute=attribute,
            expected=expected,
            actual=str(value),
        )


def _outside(where: str) -> str:
    return f"the subvolume {where} outside this client's place has too"
