"""The commands that change an inode's metadata: SET_XATTR, REMOVE_XATTR, CHMOD,
CHOWN, UTIMES, FILEATTR, ENABLE_VERITY."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable

from ..errors import BadCommand, UnsafePath
from ..format.command import Command
from .report import Skip, show
from .syscalls import enable_verity
from .tree import NAME_MAX, Tree, path_of, proc_path

__all__ = ["MetadataHandlers"]

_NSEC = 1_000_000_000


class MetadataHandlers:
    """The metadata commands of one subvolume: on names of its ``tree`` without
    following symlinks, on its root through ``root_fd`` (O_RDONLY, for the f* calls)."""

    def __init__(self, tree: Tree, root_fd: int, skip: Skip) -> None:
        self._tree = tree
        self._root_fd = root_fd
        self._skip = skip
        # The commands it applies, by name.
        self.handlers: dict[str, Callable[[Command], None]] = {
            "set_xattr": self.set_xattr,
            "remove_xattr": self.remove_xattr,
            "chmod": self.chmod,
            "chown": self.chown,
            "utimes": self.utimes,
            "fileattr": self.fileattr,
            "enable_verity": self.enable_verity,
        }

    def _xattr_target(self, parts: tuple[bytes, ...]) -> int | bytes:
        if not parts:
            return self._root_fd
        dirfd, name = self._tree.parent(parts)
        return proc_path(dirfd, name)

    @staticmethod
    def _xattr_name(cmd: Command) -> bytes:
        name = bytes(cmd.get("xattr_name"))
        if not name or b"\0" in name or len(name) > NAME_MAX:
            raise BadCommand("bad xattr name", expected=f"1 to {NAME_MAX} bytes without NUL")
        return name

    def set_xattr(self, cmd: Command) -> None:
        parts = path_of(cmd)
        name = self._xattr_name(cmd)
        value = bytes(cmd.get("xattr_data"))
        target = self._xattr_target(parts)
        try:
            if isinstance(target, int):
                os.setxattr(target, name, value)
            else:
                os.setxattr(target, name, value, follow_symlinks=False)
        except OSError as exc:
            self._xattr_refused(cmd, exc, name)

    def remove_xattr(self, cmd: Command) -> None:
        parts = path_of(cmd)
        name = self._xattr_name(cmd)
        target = self._xattr_target(parts)
        try:
            if isinstance(target, int):
                os.removexattr(target, name)
            else:
                os.removexattr(target, name, follow_symlinks=False)
        except OSError as exc:
            self._xattr_refused(cmd, exc, name)

    def _xattr_refused(self, cmd: Command, exc: OSError, name: bytes) -> None:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOTSUP, errno.EPERM):
            self._skip(cmd, bytes(cmd.get("path")), f"xattr {show(name)}: {exc.strerror}")
            return
        raise exc

    def chmod(self, cmd: Command) -> None:
        parts = path_of(cmd)
        mode = int(cmd.get("mode")) & 0o7777
        if not parts:
            os.fchmod(self._root_fd, mode)
            return
        dirfd, name = self._tree.parent(parts)
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dirfd)
        try:
            if stat.S_ISLNK(os.fstat(fd).st_mode):
                raise UnsafePath("chmod of a symlink (it would change the symlink's target)", expected="no symlink")
            os.chmod(proc_path(fd), mode)
        finally:
            os.close(fd)

    def chown(self, cmd: Command) -> None:
        parts = path_of(cmd)
        uid, gid = int(cmd.get("uid")), int(cmd.get("gid"))
        if uid >= 0xFFFFFFFF or gid >= 0xFFFFFFFF:
            raise BadCommand("uid or gid out of range", expected="below 4294967295", actual=f"{uid}:{gid}")
        try:
            if not parts:
                os.fchown(self._root_fd, uid, gid)
            else:
                dirfd, name = self._tree.parent(parts)
                os.chown(name, uid, gid, dir_fd=dirfd, follow_symlinks=False)
        except PermissionError as exc:
            if os.geteuid() == 0:
                raise
            self._skip(cmd, bytes(cmd.get("path")), f"chown to {uid}:{gid}: {exc.strerror} (not root)")

    def utimes(self, cmd: Command) -> None:
        parts = path_of(cmd)
        times = []
        for key in ("atime", "mtime"):
            ts = cmd.get(key)
            if not 0 <= ts.nsec < _NSEC:
                raise BadCommand(f"{key} nanoseconds out of range", expected=f"below {_NSEC}", actual=ts.nsec)
            times.append(ts.sec * _NSEC + ts.nsec)
        ns = (times[0], times[1])
        if not parts:
            os.utime(self._root_fd, ns=ns)
        else:
            dirfd, name = self._tree.parent(parts)
            os.utime(name, ns=ns, dir_fd=dirfd, follow_symlinks=False)

    def fileattr(self, cmd: Command) -> None:
        path_of(cmd)
        self._skip(
            cmd,
            bytes(cmd.get("path")),
            f"fileattr 0x{int(cmd.get('fileattr')):x}: ignored, as btrfs receive 6.2 does",
        )

    def enable_verity(self, cmd: Command) -> None:
        parts = path_of(cmd, root_ok=False)
        fd = self._tree.open_regular(parts, os.O_RDONLY, "file to protect")
        try:
            enable_verity(
                fd,
                int(cmd.get("verity_algorithm")),
                int(cmd.get("verity_block_size")),
                bytes(cmd.get("verity_salt_data")),
                bytes(cmd.get("verity_sig_data")),
            )
        except OSError as exc:
            self._skip(cmd, bytes(cmd.get("path")), f"enable_verity: {exc.strerror or exc}")
        finally:
            os.close(fd)
