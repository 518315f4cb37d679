"""The commands that make, move and remove names: MKFILE, MKDIR, MKNOD, MKFIFO,
MKSOCK, SYMLINK, RENAME, LINK, UNLINK, RMDIR."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable

from ..errors import BadCommand
from ..format.command import Command
from .report import Skip
from .syscalls import mknod_or_file
from .tree import PATH_MAX, Tree, describe_mode, path_of

__all__ = ["NameHandlers"]


class NameHandlers:
    """The name commands of one subvolume, applied in its ``tree``; the last
    component is acted on with the ``*at`` calls that do not follow symlinks."""

    def __init__(self, tree: Tree, skip: Skip) -> None:
        self._tree = tree
        self._skip = skip
        # The commands it applies, by name.
        self.handlers: dict[str, Callable[[Command], None]] = {
            "mkfile": self.mkfile,
            "mkdir": self.mkdir,
            "mknod": self.mknod,
            "mkfifo": self.mkfifo,
            "mksock": self.mksock,
            "symlink": self.symlink,
            "rename": self.rename,
            "link": self.link,
            "unlink": self.unlink,
            "rmdir": self.rmdir,
        }

    def _create(self, cmd: Command, make: Callable[[int, bytes], None]) -> None:
        dirfd, name = self._tree.parent(path_of(cmd, root_ok=False))
        make(dirfd, name)

    def mkfile(self, cmd: Command) -> None:
        def make(dirfd: int, name: bytes) -> None:
            # O_EXCL: never truncate an existing file, never follow a symlink there.
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            os.close(os.open(name, flags, 0o600, dir_fd=dirfd))

        self._create(cmd, make)

    def mkdir(self, cmd: Command) -> None:
        self._create(cmd, lambda dirfd, name: os.mkdir(name, 0o700, dir_fd=dirfd))

    def mknod(self, cmd: Command) -> None:
        mode = int(cmd.get("mode"))
        rdev = int(cmd.get("rdev"))
        kind = stat.S_IFMT(mode)
        if kind not in (stat.S_IFCHR, stat.S_IFBLK, stat.S_IFIFO, stat.S_IFSOCK):
            raise BadCommand(
                f"mknod of a {describe_mode(mode)}", expected="a device, fifo or socket", actual=f"mode {mode:o}"
            )
        dirfd, name = self._tree.parent(path_of(cmd, root_ok=False))
        # RDEV is the kernel's new_encode_dev(), which is glibc's dev_t for
        # majors below 4096 and minors below 2**20; btrfs-progs passes it on as is.
        if not mknod_or_file(name, kind, rdev, dirfd):
            self._skip(
                cmd,
                bytes(cmd.get("path")),
                f"not permitted to make a {describe_mode(mode)} ({os.major(rdev)}, {os.minor(rdev)}): "
                "made an empty regular file in its place",
            )

    def mkfifo(self, cmd: Command) -> None:
        self._create(cmd, lambda dirfd, name: os.mkfifo(name, 0o600, dir_fd=dirfd))

    def mksock(self, cmd: Command) -> None:
        self._create(cmd, lambda dirfd, name: os.mknod(name, stat.S_IFSOCK | 0o600, 0, dir_fd=dirfd))

    def symlink(self, cmd: Command) -> None:
        target = bytes(cmd.get("path_link"))
        if not target or b"\0" in target or len(target) >= PATH_MAX:
            raise BadCommand("bad symlink target", expected=f"1 to {PATH_MAX - 1} bytes without NUL")
        self._create(cmd, lambda dirfd, name: os.symlink(target, name, dir_fd=dirfd))

    def rename(self, cmd: Command) -> None:
        src = path_of(cmd, root_ok=False)
        dst = path_of(cmd, "path_to", root_ok=False)
        sfd, sname = self._tree.parent(src)
        dfd, dname = self._tree.parent(dst)
        try:
            os.rename(sname, dname, src_dir_fd=sfd, dst_dir_fd=dfd)
        finally:  # what was at either path (and below) is not there any more
            self._tree.forget_under(src)
            self._tree.forget_under(dst)

    def link(self, cmd: Command) -> None:
        new = path_of(cmd, root_ok=False)
        old = path_of(cmd, "path_link", root_ok=False)
        ofd, oname = self._tree.parent(old)
        nfd, nname = self._tree.parent(new)
        os.link(oname, nname, src_dir_fd=ofd, dst_dir_fd=nfd, follow_symlinks=False)

    def unlink(self, cmd: Command) -> None:
        dirfd, name = self._tree.parent(path_of(cmd, root_ok=False))
        os.unlink(name, dir_fd=dirfd)

    def rmdir(self, cmd: Command) -> None:
        parts = path_of(cmd, root_ok=False)
        dirfd, name = self._tree.parent(parts)
        try:
            os.rmdir(name, dir_fd=dirfd)
        finally:
            self._tree.forget_under(parts)
