"""ls and diff against an independent diff (support.trees_diff) of the trees btrfs receive made
before and after the incremental; the same on extracted trees is tests/unit/test_changes_model.py."""

from __future__ import annotations

import os

import pytest
from support.streams import FIXTURES
from support.trees_diff import expected_diff, one, our_diff, snapshot


@pytest.mark.btrfs
@pytest.mark.parametrize("v", ["v1", "v2"])
def test_diff_matches_btrfs_receive(v: str) -> None:
    """The same with real btrfs receive: the received child is a snapshot of the received
    parent, so inode numbers carry over and btrfs never reuses one within a subvolume."""
    import shutil
    import subprocess

    from support.btrfs import need_root_btrfs
    from support.loopfs import btrfs_loop

    need_root_btrfs()
    with btrfs_loop("1G") as mnt:
        where = mnt / "r"
        where.mkdir()
        for name in (f"rich-full-{v}", f"rich-incr-{v}"):
            proc = subprocess.run(
                ["btrfs", "receive", "-q", "-f", str(FIXTURES / f"{name}.stream"), str(where)], capture_output=True
            )
            assert proc.returncode == 0, proc.stderr
        before, fds = snapshot(where / "rich_base")
        after, more = snapshot(where / "rich_incr")
        for fd in fds + more:
            os.close(fd)
        for sub in ("rich_incr", "rich_base"):
            subprocess.run(["btrfs", "subvolume", "delete", str(where / sub)], capture_output=True)
        shutil.rmtree(where, ignore_errors=True)
    assert our_diff(one(FIXTURES / f"rich-incr-{v}.stream")) == expected_diff(before, after)
