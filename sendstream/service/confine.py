"""What a client's stream may name by UUID before ``btrfs receive`` sees it.

``btrfs receive`` finds a SNAPSHOT's parent and a CLONE's source by UUID
(received UUID first, then UUID) across the whole file system, not in the
directory it writes to. A crafted stream could so clone another client's
data into its own subvolume, or claim another client's snapshot as its
parent. :class:`UuidGuard` sees every command before it goes on and allows
a parent or clone source only when it is one of the client's own
subvolumes (a subvolume directly in its place) and no subvolume outside the
place carries that UUID too; the stream's own subvolume may not carry a
UUID found outside the place either, or a later lookup could pick the
wrong one. A clone from the subvolume being received is always allowed.
"""

from __future__ import annotations

import fcntl
import os
import re
import struct
import subprocess
import uuid
from collections.abc import Callable
from typing import Any

from .. import errors as e
from ..codec.attributes import split_attributes
from ..format.command import Command
from ..format.layout import COMMAND_HEADER, COMMAND_HEADER_SIZE, COMMAND_NUMBERS, STREAM_HEADER, STREAM_MAGIC

_SUBVOL, _SNAPSHOT, _CLONE = COMMAND_NUMBERS["subvol"], COMMAND_NUMBERS["snapshot"], COMMAND_NUMBERS["clone"]
_WATCHED = {_SUBVOL, _SNAPSHOT, _CLONE}
_INO_LOOKUP = 0xD0009412  # BTRFS_IOC_INO_LOOKUP: _IOWR(0x94, 18, struct btrfs_ioctl_ino_lookup_args), 4096 bytes
_FIRST_FREE_OBJECTID = 256  # the inode of a subvolume's root directory
_LIST = re.compile(r"^ID (\d+) .* received_uuid (\S+)\s+uuid (\S+) ")


class Refused(e.FormatError):
    """A stream names a subvolume that is not its client's."""

    exit_code = e.EXIT_USAGE
    kind = "refused"


def subvolumes(place: str) -> tuple[set[uuid.UUID], set[uuid.UUID]]:
    """The UUIDs and received UUIDs of the subvolumes directly in ``place``, and those of every other
    subvolume of its file system."""
    mine = set()
    with os.scandir(place) as entries:
        for entry in entries:
            # (readdir gives a subvolume's entry the subvolume's ID as its inode; stat gives its root's)
            if entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_ino == _FIRST_FREE_OBJECTID:
                mine.add(_root_id(entry.path))
    listed = subprocess.run(
        ["btrfs", "subvolume", "list", "-a", "-u", "-R", place], capture_output=True, text=True, check=False
    )
    if listed.returncode != 0:
        raise e.OutputError(place, f"btrfs subvolume list failed: {listed.stderr.strip() or listed.returncode}")
    own: set[uuid.UUID] = set()
    foreign: set[uuid.UUID] = set()
    for line in listed.stdout.splitlines():
        match = _LIST.match(line)
        if match is None:
            continue
        ids = {uuid.UUID(u) for u in match.group(2, 3) if u != "-"}
        (own if int(match.group(1)) in mine else foreign).update(ids)
    return own, foreign


def leftover(path: str, subvolume: uuid.UUID) -> bool:
    """Whether ``path`` is a subvolume that a cut ``btrfs receive`` of ``subvolume`` left: begun and not
    finished (writable, no received UUID), or finished as that one (its received UUID)."""
    shown = subprocess.run(["btrfs", "subvolume", "show", path], capture_output=True, text=True, check=False)
    if shown.returncode != 0:
        return False
    fields = dict(line.strip().split(":", 1) for line in shown.stdout.splitlines() if ":" in line)
    received, flags = fields.get("Received UUID", "").strip(), fields.get("Flags", "").strip()
    if received == "-":
        return "readonly" not in flags
    return received == str(subvolume)


def _root_id(path: str) -> int:
    """The subvolume ID of the subvolume whose root is ``path`` (as ``btrfs inspect-internal rootid``)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        args = bytearray(struct.pack("<QQ", 0, _FIRST_FREE_OBJECTID) + bytes(4080))
        fcntl.ioctl(fd, _INO_LOOKUP, args)
        return int(struct.unpack_from("<Q", args)[0])
    finally:
        os.close(fd)


class UuidGuard:
    """Sees what goes to ``btrfs receive`` before it goes: a stream header, or whole commands.

    ``own`` and ``foreign`` are from :func:`subvolumes`; ``claim(uuid,
    name)`` is asked for each stream's own subvolume (its UUID, and its name
    in the place: one path component) and may refuse it by raising (another
    transfer holds that UUID or name now, or the name is taken).
    """

    def __init__(self, own: set[uuid.UUID], foreign: set[uuid.UUID], claim: Callable[[uuid.UUID, str], object]) -> None:
        self.own = set(own)
        self.foreign = foreign
        self._claim = claim
        self._current: uuid.UUID | None = None
        self._version = 0
        self.offset = 0  # of the output
        self.index = -1  # of the command, in the output

    def __call__(self, data: Any) -> None:
        view = memoryview(data).cast("B")
        if view[: len(STREAM_MAGIC)] == STREAM_MAGIC:
            self._version = STREAM_HEADER.unpack_from(view)[1]
            if self._current is not None:
                self.own.add(self._current)  # a later stream of the input may build on it
            self.offset += len(view)
            return
        pos = 0
        while pos < len(view):
            length, cmd, _ = COMMAND_HEADER.unpack_from(view, pos)
            self.index += 1
            if cmd in _WATCHED:
                end = pos + COMMAND_HEADER_SIZE + length
                attrs = split_attributes(view, pos + COMMAND_HEADER_SIZE, end, self._version, self.index, None)
                self._check(Command(cmd, attrs, version=self._version), self.offset + pos)
            pos += COMMAND_HEADER_SIZE + length
        if pos != len(view):  # the healer writes whole commands: anything else would go unchecked
            raise e.UsageError(f"the UUID guard got part of a command at output offset {self.offset + len(view)}")
        self.offset += len(view)

    def _check(self, command: Command, offset: int) -> None:
        if command.cmd in (_SUBVOL, _SNAPSHOT):
            subvolume = command.get("uuid")
            if subvolume in self.foreign:
                self._refuse(command, offset, "uuid", subvolume, "a UUID no subvolume outside this client's place has")
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
            self._claim(subvolume, os.fsdecode(name))
            self._current = subvolume
        if command.cmd in (_SNAPSHOT, _CLONE):
            source = command.get("clone_uuid")
            if source == self._current and command.cmd == _CLONE:
                return
            if source not in self.own or source in self.foreign:
                what = "its parent" if command.cmd == _SNAPSHOT else "a clone source"
                self._refuse(command, offset, "clone_uuid", source, f"{what} among this client's own subvolumes")

    def _refuse(self, command: Command, offset: int, attribute: str, value: uuid.UUID, expected: str) -> None:
        raise Refused(
            f"{command.name} names subvolume {value}, which is not this client's",
            offset=offset,
            index=self.index,
            command=command.name,
            attribute=attribute,
            expected=expected,
            actual=str(value),
        )
