"""Throw-away btrfs filesystems on file-backed loop devices.

Used by the tests and by the fixture and benchmark generators of tools/
(which import it from here) to get a real, freshly made btrfs to run
``btrfs send`` on.  Standard library only.

    with btrfs_loop("512M", mount_opts="noatime") as mnt:
        ...  # mnt is a pathlib.Path to the mounted filesystem

Cleanup is careful: only the loop device this process attached is detached,
unmounting retries and falls back to a lazy unmount, and the backing file and
temporary directories are always removed.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence

__all__ = ["LoopFsError", "btrfs_loop", "require_btrfs"]


class LoopFsError(RuntimeError):
    """Setting up the loop-backed btrfs failed."""


def _run(cmd: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run *cmd*, capturing text output; raise LoopFsError on failure if *check*."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True)
    if check and proc.returncode != 0:
        raise LoopFsError(f"{' '.join(cmd)} failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


def require_btrfs() -> str | None:
    """Return why a real loop-mounted btrfs can't be used here, or None if it can."""
    if os.geteuid() != 0:
        return "not running as root"
    try:
        with open("/proc/filesystems", encoding="ascii", errors="replace") as f:
            fstypes = {line.split()[-1] for line in f if line.strip()}
    except OSError as exc:
        return f"cannot read /proc/filesystems: {exc}"
    if "btrfs" not in fstypes:
        # The module may still be loadable; mount would autoload it, but be strict.
        return "btrfs is not listed in /proc/filesystems"
    for tool in ("mkfs.btrfs", "losetup", "mount", "umount", "truncate"):
        if shutil.which(tool) is None:
            return f"{tool} not found in PATH"
    if not os.path.exists("/dev/loop-control"):
        return "/dev/loop-control does not exist"
    return None


def _attach(backing: pathlib.Path, attempts: int = 5) -> str:
    """Attach *backing* to a free loop device and return its path (retry races)."""
    last = ""
    for i in range(attempts):
        proc = _run(["losetup", "-f", "--show", str(backing)], check=False)
        dev = proc.stdout.strip()
        if proc.returncode == 0 and dev.startswith("/dev/"):
            return dev
        last = proc.stderr.strip()
        time.sleep(0.2 * (i + 1))  # another process may have grabbed the same device
    raise LoopFsError(f"losetup -f --show {backing} failed: {last}")


def _unescape_mountinfo(field: str) -> str:
    """Undo the kernel's octal escaping (``\\040`` for space) in mountinfo fields."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _is_mounted(path: pathlib.Path) -> bool:
    """True if *path* is currently a mount point (per /proc/self/mountinfo)."""
    target = os.path.realpath(path)
    try:
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields = line.split()
                if len(fields) > 4 and _unescape_mountinfo(fields[4]) == target:
                    return True
    except OSError:
        return os.path.ismount(path)
    return False


def _unmount(mnt: pathlib.Path, attempts: int = 10) -> None:
    """Unmount *mnt*, retrying while busy, then falling back to a lazy unmount."""
    for i in range(attempts):
        if not _is_mounted(mnt):
            return
        if _run(["umount", str(mnt)], check=False).returncode == 0:
            return
        time.sleep(0.2 * (i + 1))
    if _is_mounted(mnt):
        _run(["umount", "-l", str(mnt)], check=False)


def _detach(dev: str, backing: pathlib.Path, attempts: int = 10) -> None:
    """Detach loop device *dev*, but only while it is still backed by *backing*."""
    for i in range(attempts):
        proc = _run(["losetup", "-n", "-O", "BACK-FILE", dev], check=False)
        current = proc.stdout.strip()
        if proc.returncode != 0 or not current:
            return  # already detached (e.g. autoclear after a lazy unmount)
        # losetup may append " (deleted)"; compare the prefix only.
        if not current.startswith(str(backing)):
            return  # someone else's device now: leave it alone
        if _run(["losetup", "-d", dev], check=False).returncode == 0:
            return
        time.sleep(0.2 * (i + 1))


@contextlib.contextmanager
def btrfs_loop(
    size: str = "512M",
    mkfs_args: Sequence[str] = (),
    mount_opts: str = "",
    tmpdir: str | os.PathLike[str] | None = None,
) -> Iterator[pathlib.Path]:
    """Make, mount and yield a fresh btrfs of *size* on a loop device; always clean up.

    *size* is anything ``truncate -s`` accepts (the backing file is sparse);
    *mkfs_args* are extra arguments for ``mkfs.btrfs``; *mount_opts* is passed
    as ``mount -o`` when non-empty.  The backing file lives in a new temporary
    directory under *tmpdir* (default: $SENDSTREAM_LOOPFS_DIR, else /var/tmp,
    else the system temp dir).
    """
    reason = require_btrfs()
    if reason is not None:
        raise LoopFsError(f"cannot use a real btrfs here: {reason}")
    if tmpdir is None:
        tmpdir = os.environ.get("SENDSTREAM_LOOPFS_DIR") or ("/var/tmp" if os.path.isdir("/var/tmp") else None)
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="sendstream-loopfs-", dir=tmpdir))
    backing = workdir / "backing.img"
    mnt = workdir / "mnt"
    dev: str | None = None
    mounted = False
    try:
        mnt.mkdir()
        _run(["truncate", "-s", size, str(backing)])
        _run(["mkfs.btrfs", "-q", *mkfs_args, str(backing)])
        dev = _attach(backing)
        cmd = ["mount", "-t", "btrfs"]
        if mount_opts:
            cmd += ["-o", mount_opts]
        _run([*cmd, dev, str(mnt)])
        mounted = True
        yield mnt
    finally:
        try:
            if mounted or _is_mounted(mnt):
                _unmount(mnt)
        finally:
            try:
                if dev is not None:
                    _detach(dev, backing)
            finally:
                with contextlib.suppress(OSError):
                    backing.unlink()
                if not _is_mounted(mnt):
                    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":  # tiny self-check
    why = require_btrfs()
    if why:
        raise SystemExit(f"skip: {why}")
    with btrfs_loop("256M") as m:
        (m / "hello").write_text("hi\n")
        print("mounted at", m, os.listdir(m))
    print("cleaned up:", not m.exists())
