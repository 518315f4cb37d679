"""The system calls Python does not wrap, and those that need care: fallocate,
fs-verity, reflinks, copies that keep holes, hole punching, whole writes."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import os
import struct
from collections.abc import Iterator
from typing import Any

__all__ = [
    "FALLOC_FL_KEEP_SIZE",
    "FALLOC_FL_PUNCH_HOLE",
    "FALLOC_FL_ZERO_RANGE",
    "FICLONERANGE",
    "FS_IOC_ENABLE_VERITY",
    "copy_range",
    "data_ranges",
    "enable_verity",
    "fallocate",
    "free_space",
    "mknod_or_file",
    "pwrite_all",
    "reflink",
]

# fallocate(2) modes the kernel sends, and ZERO_RANGE.
FALLOC_FL_KEEP_SIZE = 0x01
FALLOC_FL_PUNCH_HOLE = 0x02
FALLOC_FL_ZERO_RANGE = 0x10

FICLONERANGE = 0x4020940D  # _IOW(0x94, 13, struct file_clone_range)
FS_IOC_ENABLE_VERITY = 0x40806685  # _IOW('f', 133, struct fsverity_enable_arg)

_libc: Any = None


def fallocate(fd: int, mode: int, offset: int, length: int) -> None:
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if _libc.fallocate(fd, mode, offset, length) != 0:
        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def enable_verity(fd: int, algorithm: int, block_size: int, salt: bytes, sig: bytes) -> None:
    salt_buf = ctypes.create_string_buffer(salt, len(salt) or 1)
    sig_buf = ctypes.create_string_buffer(sig, len(sig) or 1)
    arg = struct.pack(
        "<IIIIQIIQ88x",
        1,
        algorithm,
        block_size,
        len(salt),
        ctypes.addressof(salt_buf) if salt else 0,
        len(sig),
        0,
        ctypes.addressof(sig_buf) if sig else 0,
    )
    fcntl.ioctl(fd, FS_IOC_ENABLE_VERITY, arg)


def free_space(fd: int) -> int:
    """The bytes free for us in the file system of ``fd`` (root may use the reserve)."""
    fs = os.fstatvfs(fd)
    return fs.f_frsize * (fs.f_bfree if os.geteuid() == 0 else fs.f_bavail)


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset``: a short write goes on with the rest; one that takes nothing fails."""
    while data:
        n = os.pwrite(fd, data, offset)
        if not n:
            raise OSError(errno.EIO, f"the file took none of {len(data)} bytes at offset {offset}")
        data = data[n:]
        offset += n


def reflink(src: int, src_offset: int, length: int, dst: int, dst_offset: int) -> bool:
    """Share ``src[src_offset:+length]`` at ``dst_offset``; False where the file system cannot."""
    try:
        fcntl.ioctl(dst, FICLONERANGE, struct.pack("<qQQQ", src, src_offset, length, dst_offset))
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOTTY, errno.EXDEV, errno.EINVAL, errno.ENOSYS):
            raise
        return False
    return True


def data_ranges(fd: int, start: int, end: int) -> Iterator[tuple[int, int]]:
    """The ranges of ``fd`` between ``start`` and ``end`` that hold data (not holes)."""
    pos = start
    while pos < end:
        try:
            data = os.lseek(fd, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno != errno.ENXIO:
                raise
            return
        if data >= end:
            return
        hole = min(os.lseek(fd, data, os.SEEK_HOLE), end)
        yield data, hole
        pos = hole


def copy_range(src: int, src_offset: int, length: int, dst: int, dst_offset: int) -> int:
    """Make ``dst[dst_offset:+length]`` what ``src[src_offset:+length]`` is, holes
    included; the data bytes copied."""
    dst_size = os.fstat(dst).st_size
    shift = dst_offset - src_offset
    pos = src_offset
    copied = 0
    for data, hole in data_ranges(src, src_offset, src_offset + length):
        if data > pos:  # a hole in the source: a hole in the destination
            _punch(dst, pos + shift, data - pos, dst_size)
        _copy(src, data, dst, data + shift, hole - data)
        copied += hole - data
        pos = hole
    if pos < src_offset + length:
        _punch(dst, pos + shift, src_offset + length - pos, dst_size)
    if dst_size < dst_offset + length:
        os.ftruncate(dst, max(os.fstat(dst).st_size, dst_offset + length))
    return copied


def _punch(fd: int, offset: int, length: int, size: int) -> None:
    length = min(length, size - offset)  # nothing to punch beyond the end
    if length <= 0:
        return
    try:
        fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, offset, length)
    except OSError as exc:
        if exc.errno not in (errno.EOPNOTSUPP, errno.ENOSYS):
            raise
        zeros = bytes(min(length, 1 << 20))
        while length > 0:
            n = min(length, len(zeros))
            pwrite_all(fd, memoryview(zeros)[:n], offset)
            offset += n
            length -= n


def _copy(src: int, src_offset: int, dst: int, dst_offset: int, length: int) -> None:
    """Copy ``length`` bytes, all of them: a source that ends before them (it shrank) fails."""
    while length > 0:
        try:
            n = os.copy_file_range(src, dst, length, src_offset, dst_offset)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):
                raise
            n = 0
        if n == 0:  # not here, or (some file systems) not for this file: read and write
            chunk = os.pread(src, min(length, 1 << 20), src_offset)
            if not chunk:
                shrank = f"the source ended at offset {src_offset}, {length} bytes early (it shrank while copied)"
                raise OSError(errno.EIO, shrank)
            pwrite_all(dst, memoryview(chunk), dst_offset)
            n = len(chunk)
        src_offset += n
        dst_offset += n
        length -= n


def mknod_or_file(name: bytes, mode: int, device: int, dir_fd: int) -> bool:
    """Make the node ``name`` (a device, fifo or socket) in ``dir_fd``; where that is
    not permitted (not root), an empty regular file in its place, and False."""
    try:
        os.mknod(name, mode, device, dir_fd=dir_fd)
    except PermissionError:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        os.close(os.open(name, flags, 0o600, dir_fd=dir_fd))
        return False
    return True
