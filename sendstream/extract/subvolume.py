"""The subvolume being extracted: where a SUBVOL or SNAPSHOT goes (DIR, or DIR/NAME
per subvolume), checked and opened, and the handlers of its commands."""

from __future__ import annotations

import os
from collections.abc import Callable

from ..errors import BadCommand, UnsafePath
from ..format.command import Command
from .data import DataHandlers
from .metadata import MetadataHandlers
from .names import NameHandlers
from .report import Skip
from .tree import DIR_FLAGS, Tree, is_empty, split_path

__all__ = ["OpenSubvolume", "open_directory"]


def open_directory(
    cmd: Command,
    kind: str,
    dest: str,
    dest_fd: int,
    *,
    per_subvolume: bool,
    copy_parent: Callable[[bytes], None],
) -> tuple[int, Tree, str]:
    """The directory the subvolume of ``cmd`` (``kind`` "subvol" or "snapshot") goes
    to: an O_RDONLY fd of it (for the f* calls), its tree, and its place.

    Per subvolume it is DIR/NAME, made empty for a SUBVOL and by ``copy_parent(NAME)``
    for a SNAPSHOT; otherwise DIR (``dest``, ``dest_fd``) itself, which must be empty
    for a full stream and must not be for an incremental one.
    """
    name = bytes(cmd.get("path"))
    if per_subvolume:
        parts = split_path(name, what="subvolume name")
        if len(parts) != 1:
            raise UnsafePath("the subvolume name is not a single name", expected="one path component")
        if kind == "subvol":
            os.mkdir(parts[0], 0o700, dir_fd=dest_fd)
        else:
            copy_parent(parts[0])
        root = os.open(parts[0], os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dest_fd)
        directory = os.path.join(dest, os.fsdecode(parts[0]))
    else:
        root = os.dup(dest_fd)
        directory = dest
    try:
        empty = is_empty(root)
        if kind == "subvol" and not empty:
            raise BadCommand(f"{directory!r} is not empty", expected="an empty directory for a full stream (SUBVOL)")
        if kind == "snapshot" and empty and not per_subvolume:
            raise BadCommand(
                f"{directory!r} is empty",
                expected=f"the extraction of the parent subvolume {cmd.get('clone_uuid')} (incremental stream)",
            )
        tree_fd = os.open(".", DIR_FLAGS, dir_fd=root)
    except BaseException:
        os.close(root)
        raise
    return root, Tree(tree_fd, f"subvolume {name.decode(errors='backslashreplace')}"), directory


class OpenSubvolume:
    """The subvolume being extracted: its ``tree``, the O_RDONLY fd of its root (for
    the f* calls), and ``handlers``, its commands by name: those on names, on
    metadata, and on ``data`` (which keeps a file open across data commands).
    Closing it closes every fd it holds."""

    def __init__(self, root_fd: int, tree: Tree, data: DataHandlers, skip: Skip) -> None:
        self.tree = tree
        self.data = data
        self._root_fd = root_fd
        self.handlers = {
            **NameHandlers(tree, skip).handlers,
            **MetadataHandlers(tree, root_fd, skip).handlers,
            **self.data.handlers,
        }

    def close(self) -> None:
        self.data.stop_writing()
        self.tree.close()
        os.close(self._root_fd)
