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
) -> tuple[int, Tree, str, bool]:
    """The directory the subvolume of ``cmd`` (``kind`` "subvol" or "snapshot") goes
    to: an O_RDONLY fd of it (for the f* calls), its tree, its place, and whether an
    incremental goes onto an empty one.

    Per subvolume it is DIR/NAME, made empty for a SUBVOL and by ``copy_parent(NAME)``
    for a SNAPSHOT; otherwise DIR (``dest``, ``dest_fd``) itself, which must be empty
    for a full stream and holds the extraction of the parent for an incremental one
    (empty for an empty parent: see :class:`~sendstream.extract.Extractor`).
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
        tree_fd = os.open(".", DIR_FLAGS, dir_fd=root)
    except BaseException:
        os.close(root)
        raise
    tree = Tree(tree_fd, f"subvolume {name.decode(errors='backslashreplace')}")
    return root, tree, directory, kind == "snapshot" and empty and not per_subvolume


class OpenSubvolume:
    """The subvolume being extracted: its ``tree``, the O_RDONLY fd of its root (for
    the f* calls), and ``handlers``, its commands by name: those on names, on
    metadata, and on ``data`` (which keeps a file open across data commands).
    Closing it closes every fd it holds.

    With ``keep_root_times`` (an incremental), the root's atime and mtime as they
    are now, the parent's, are put back at :meth:`end` unless the stream sent a
    UTIMES of the root: the kernel sends none when the root did not change, even
    after it made and renamed away a new inode under a temporary name there, which
    moved the root's times here (btrfs receive keeps the time of the receive).
    """

    def __init__(self, root_fd: int, tree: Tree, data: DataHandlers, skip: Skip, *, keep_root_times: bool) -> None:
        self.tree = tree
        self.data = data
        self._root_fd = root_fd
        self._metadata = MetadataHandlers(tree, root_fd, skip)
        self._root_times: tuple[int, int] | None = None
        if keep_root_times:
            st = os.fstat(root_fd)
            self._root_times = (st.st_atime_ns, st.st_mtime_ns)
        self.handlers = {
            **NameHandlers(tree, skip).handlers,
            **self._metadata.handlers,
            **self.data.handlers,
            "utimes": self._utimes,
        }

    def _utimes(self, cmd: Command) -> None:
        self._metadata.utimes(cmd)
        if not bytes(cmd.get("path")):
            self._root_times = None  # the stream says the root's times

    def end(self) -> None:
        """At END: the parent's root times back where the stream sent none."""
        if self._root_times is not None:
            os.utime(self._root_fd, ns=self._root_times)

    def close(self) -> None:
        self.data.stop_writing()
        self.tree.close()
        os.close(self._root_fd)
