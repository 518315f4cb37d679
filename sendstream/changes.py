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
"""

from __future__ import annotations

import dataclasses
import json
import stat
from collections.abc import Iterable, Iterator
from typing import Any

from . import errors as e
from .command import Command
from .decoder import Restart
from .dump import escape, json_bytes
from .paths import Inode, PathTracker

__all__ = [
    "Change",
    "ChangeTracker",
    "Diff",
    "SubvolumeChanges",
    "changes",
    "diff_json",
    "diff_lines",
    "json_line",
    "ls_json",
    "ls_lines",
]

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
    transient name, the path it had when removed). ``kind`` is ``file``,
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


@dataclasses.dataclass(slots=True)
class _InodeInfo:
    created: bool = False
    kind: str | None = None
    data: bool = False
    metadata: set[str] = dataclasses.field(default_factory=set)


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


class ChangeTracker:
    """Sans-IO: :meth:`feed` commands; :meth:`finish` at the end of each subvolume."""

    def __init__(self) -> None:
        self.tracker = PathTracker()
        self._info: dict[int, _InodeInfo] = {}
        self._removed_at: dict[int, bytes] = {}
        self._parents: set[int] = set()
        self.incremental = False
        self.started = False

    def _of(self, inode: Inode) -> _InodeInfo:
        info = self._info.get(id(inode))
        if info is None:
            info = self._info[id(inode)] = _InodeInfo()
        return info

    def feed(self, command: Command) -> SubvolumeChanges | None:
        """Follow one command; returns the finished subvolume at END or at a new SUBVOL/SNAPSHOT."""
        name = command.name
        done = None
        if name in ("subvol", "snapshot"):
            if self.started:
                done = self.finish()
            self.incremental = name == "snapshot"
            self.started = True
        touched = self.tracker.feed(command)
        if touched is not None:
            info = self._of(touched.entry.inode)
            if name in _CREATE_KIND or name == "mknod":
                info.created = True
                info.kind = _CREATE_KIND.get(name) or _device_kind(int(command.get("mode", 0)))
            elif name in DATA_COMMANDS:
                info.data = True
                info.kind = info.kind or "file"
            elif name in METADATA_COMMANDS:
                info.metadata.add(METADATA_COMMANDS[name])
            elif name == "rmdir":
                info.kind = "dir"
                self._removed_at[id(touched.entry)] = touched.path
            elif name == "unlink":
                self._removed_at[id(touched.entry)] = touched.path
        if name == "end":
            done = self.finish()
        return done

    def finish(self) -> SubvolumeChanges:
        """The changes of the current subvolume; the tracker then starts afresh."""
        out: list[Change] = []
        seen: set[int] = set()
        self._parents = {id(p) for en in self.tracker.entries for p in (en.parent, en.origin_parent) if p is not None}
        for entry in self.tracker.entries:
            inode = entry.inode
            if id(inode) in seen:
                continue
            seen.add(id(inode))
            out.extend(self._inode_changes(inode))
        out.sort(key=lambda c: (c.sort_key, c.action))
        result = SubvolumeChanges(self.tracker.subvolume, self.incremental, out)
        self.tracker.start(b"", None)
        self.tracker.subvolume = None
        self._info.clear()
        self._removed_at.clear()
        self.started = False
        return result

    def _inode_changes(self, inode: Inode) -> Iterator[Change]:
        info = self._info.get(id(inode)) or _InodeInfo()
        kind = info.kind
        if kind is None and any(id(en) in self._parents for en in inode.entries):
            kind = "dir"
        meta = tuple(sorted(info.metadata))
        alive = sorted((p, en) for en in inode.entries if (p := en.path()) is not None)
        if info.created:
            if not alive:
                for en in inode.entries:
                    yield Change("transient", None, self._removed_at.get(id(en)), kind, info.data, meta)
                return
            first = alive[0][0]
            yield Change("created", first, None, kind, info.data, meta)
            for p, _ in alive[1:]:
                yield Change("linked", p, None, kind, link_to=first)
            return
        gone = [en for en in inode.entries if en.origin is not None and en.path() is None]
        new = [(p, en) for p, en in alive if en.origin is None]
        moved = [(p, en) for p, en in alive if en.origin is not None and en.moved]
        kept = [(p, en) for p, en in alive if en.origin is not None and not en.moved]
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


def _device_kind(mode: int) -> str:
    if stat.S_ISCHR(mode):
        return "chardev"
    if stat.S_ISBLK(mode):
        return "blockdev"
    if stat.S_ISFIFO(mode):
        return "fifo"
    if stat.S_ISSOCK(mode):
        return "socket"
    return "device"


def changes(events: Iterable[Any]) -> Iterator[SubvolumeChanges]:
    """The changes of every subvolume of ``events`` (e.g. :func:`sendstream.files.file_events`)."""
    tracker = ChangeTracker()
    for event in events:
        if isinstance(event, Restart):
            raise e.StreamRestarted(
                f"a new stream header after {event.commands} commands: repair the stream first",
                offset=event.offset,
            )
        if isinstance(event, Command):
            done = tracker.feed(event)
            if done is not None:
                yield done
    if tracker.started:
        yield tracker.finish()


# --- presentation ---------------------------------------------------------------


def _show(raw: bytes | None) -> bytes:
    return b"-" if raw is None else escape(raw) or b"."


def _flags(change: Change) -> bytes:
    parts = []
    if change.data:
        parts.append(b"data")
    if change.metadata:
        parts.append(b",".join(m.encode() for m in change.metadata))
    return b" [" + b" ".join(parts) + b"]" if parts else b""


def ls_lines(result: SubvolumeChanges) -> Iterator[bytes]:
    """One line per name: action, kind, path, then ``from OLD`` / ``to TARGET`` and ``[data mode,...]``."""
    for c in result.changes:
        line = b"%-9s %-8s " % (c.action.encode(), (c.kind or "-").encode())
        if c.action in ("deleted", "transient"):
            line += _show(c.old_path)
        else:
            line += _show(c.path)
        if c.action == "renamed":
            line += b" from " + _show(c.old_path)
        if c.link_to is not None:
            line += b" to " + _show(c.link_to)
        yield line + _flags(c) + b"\n"


def diff_lines(diff: Diff) -> Iterator[bytes]:
    """Text in the manner of ``git diff --name-status``: A, D, R (old -> new), M (data), m (metadata only)."""
    rows: list[tuple[bytes, bytes]] = []
    for c in diff.added:
        extra = b" (hard link to " + _show(c.link_to) + b")" if c.link_to is not None else b""
        rows.append((c.sort_key, b"A " + _show(c.path) + extra))
    for c in diff.removed:
        rows.append((c.sort_key, b"D " + _show(c.old_path)))
    for c in diff.renamed:
        rows.append((c.sort_key, b"R " + _show(c.old_path) + b" -> " + _show(c.path) + _flags(c)))
    for c in diff.modified:
        if c.action != "renamed":
            rows.append((c.sort_key, b"M " + _show(c.path) + _flags(c)))
    for c in diff.metadata:
        rows.append((c.sort_key, b"m " + _show(c.path) + _flags(c)))
    for _, row in sorted(rows):
        yield row + b"\n"


def _change_json(c: Change) -> dict[str, Any]:
    out: dict[str, Any] = {"action": c.action}
    if c.path is not None:
        out["path"] = json_bytes(c.path)
    if c.old_path is not None and c.old_path != c.path:
        out["old_path"] = json_bytes(c.old_path)
    out["kind"] = c.kind
    if c.link_to is not None:
        out["link_to"] = json_bytes(c.link_to)
    out["data"] = c.data
    out["metadata"] = list(c.metadata)
    return out


def ls_json(result: SubvolumeChanges) -> dict[str, Any]:
    """A JSON-ready dict: subvolume, incremental, and every change."""
    return {
        "subvolume": None if result.subvolume is None else json_bytes(result.subvolume),
        "incremental": result.incremental,
        "changes": [_change_json(c) for c in result.changes],
    }


def diff_json(result: SubvolumeChanges) -> dict[str, Any]:
    """A JSON-ready dict: added, removed, renamed (from, to), modified, metadata."""
    d = result.diff()
    return {
        "subvolume": None if result.subvolume is None else json_bytes(result.subvolume),
        "incremental": result.incremental,
        "added": [
            {"path": json_bytes(c.path or b""), "kind": c.kind}
            | ({"link_to": json_bytes(c.link_to)} if c.link_to is not None else {})
            for c in d.added
        ],
        "removed": [{"path": json_bytes(c.old_path or b""), "kind": c.kind} for c in d.removed],
        "renamed": [
            {
                "from": json_bytes(c.old_path or b""),
                "to": json_bytes(c.path or b""),
                "kind": c.kind,
                "data": c.data,
                "metadata": list(c.metadata),
            }
            for c in d.renamed
        ],
        "modified": [{"path": json_bytes(c.path or b""), "metadata": list(c.metadata)} for c in d.modified],
        "metadata": [{"path": json_bytes(c.path or b""), "metadata": list(c.metadata)} for c in d.metadata],
    }


def json_line(obj: dict[str, Any]) -> bytes:
    """One object as a line of JSON."""
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"
