"""ls and diff against an independent diff of the trees before and after the incremental.

The expected diff is built from the file system alone: the parent stream is
extracted (sendstream.extract.extractor), every inode of it is held open (so no inode
number is reused), the incremental is applied in place, and the two trees
are compared by inode number: a name (parent directory inode, name) that
moved is a rename, a gone inode's names are removed, a new inode's names are
added, content and mode/owner/xattrs are compared per inode.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.streams import FIXTURES

from sendstream.analysis.changes import Change, SubvolumeChanges, changes
from sendstream.extract import extract_stream as extract
from sendstream.io.windows import file_events
from sendstream.render.changes import diff_json, diff_lines, ls_json, ls_lines


@dataclass
class Node:
    names: set[tuple[int, bytes]] = field(default_factory=set)
    paths: dict[tuple[int, bytes], bytes] = field(default_factory=dict)
    content: object = None
    meta: dict[str, object] = field(default_factory=dict)


def snapshot(root: Path) -> tuple[dict[int, Node], list[int]]:
    """Inodes of the tree by number; and O_PATH descriptors holding every inode."""
    nodes: dict[int, Node] = {}
    fds: list[int] = []
    broot = os.fsencode(root)

    def visit(path: bytes, rel: bytes, parent_ino: int, name: bytes) -> None:
        st = os.lstat(path)
        node = nodes.setdefault(st.st_ino, Node())
        if not node.names:
            fds.append(os.open(path, os.O_PATH | os.O_NOFOLLOW))
            if stat.S_ISREG(st.st_mode):
                node.content = hashlib.sha256(Path(os.fsdecode(path)).read_bytes()).hexdigest()
            elif stat.S_ISLNK(st.st_mode):
                node.content = os.readlink(path)
            node.meta = {
                "mode": stat.S_IMODE(st.st_mode),
                "owner": (st.st_uid, st.st_gid),
                "xattrs": {
                    x: os.getxattr(path, x, follow_symlinks=False) for x in os.listxattr(path, follow_symlinks=False)
                },
            }
        node.names.add((parent_ino, name))
        node.paths[(parent_ino, name)] = rel
        if stat.S_ISDIR(st.st_mode):
            for child in sorted(os.listdir(path)):
                visit(path + b"/" + child, rel + b"/" + child if rel else child, st.st_ino, child)

    visit(broot, b"", 0, b"")
    return nodes, fds


def expected_diff(before: dict[int, Node], after: dict[int, Node]) -> dict[str, set[object]]:
    out: dict[str, set[object]] = {k: set() for k in ("added", "removed", "renamed", "modified", "metadata")}
    for ino in before.keys() | after.keys():
        b, a = before.get(ino), after.get(ino)
        if a is None:
            assert b is not None
            out["removed"] |= set(b.paths.values())
            continue
        if b is None:
            out["added"] |= set(a.paths.values())
            continue
        gone = sorted(b.names - a.names)
        new = sorted(a.names - b.names)
        assert len(gone) <= 1 or len(new) <= 1, "ambiguous pairing"
        for g, n in zip(gone, new, strict=False):
            out["renamed"].add((b.paths[g], a.paths[n]))
        out["removed"] |= {b.paths[g] for g in gone[len(new) :]}
        out["added"] |= {a.paths[n] for n in new[len(gone) :]}
        stays = [a.paths[n] for n in sorted(a.names) if n in b.names or n in new[: len(gone)]]
        if a.content != b.content:
            out["modified"] |= set(stays)
        kinds = frozenset(k for k in a.meta if a.meta[k] != b.meta[k])
        if kinds:
            out["metadata"] |= {(p, kinds) for p in stays}
    return out


# What a stream cannot say the same way as a tree: times (UTIMES is sent around every
# change, often with the same times) and inode flags (the extraction ignores FILEATTR).
NOT_IN_TREE = {"times", "fileattr"}


def our_diff(result: SubvolumeChanges) -> dict[str, set[object]]:
    d = result.diff()

    def meta(c: Change) -> frozenset[str]:
        return frozenset(c.metadata) - NOT_IN_TREE

    renamed_or_kept = [c for c in result.changes if c.action in ("renamed", "modified", "metadata")]
    return {
        "added": {c.path for c in d.added},
        "removed": {c.old_path for c in d.removed},
        "renamed": {(c.old_path, c.path) for c in d.renamed},
        "modified": {c.path for c in d.modified},
        "metadata": {(c.path, meta(c)) for c in renamed_or_kept if meta(c)},
    }


def one(path: Path) -> SubvolumeChanges:
    with path.open("rb") as f:
        (result,) = changes(file_events(f))
    return result


@pytest.fixture(scope="module", params=["v1", "v2"])
def trees(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, object]]:
    v = request.param
    root = tmp_path_factory.mktemp(f"tree-{v}") / "t"
    root.mkdir()
    with (FIXTURES / f"rich-full-{v}.stream").open("rb") as f:
        extract(f, root)
    before, fds = snapshot(root)
    try:
        with (FIXTURES / f"rich-incr-{v}.stream").open("rb") as f:
            extract(f, root)
        after, more = snapshot(root)
        fds += more
        yield v, (before, after)
    finally:
        for fd in fds:
            os.close(fd)


def test_diff_matches_the_trees(trees: tuple[str, object]) -> None:
    v, (before, after) = trees  # type: ignore[misc]
    expected = expected_diff(before, after)
    ours = our_diff(one(FIXTURES / f"rich-incr-{v}.stream"))
    # the tree side sees metadata only where it really differs; the stream only what it sends
    assert ours == expected
    # the interesting cases of MANIFEST.md are all there
    assert (b"swap/a", b"swap/b") in ours["renamed"] and (b"swap/b", b"swap/a") in ours["renamed"]
    assert (b"dswap/x", b"dswap/y") in ours["renamed"] and (b"dswap/y", b"dswap/x") in ours["renamed"]
    assert {(b"nest/outer/inner", b"nest/inner"), (b"nest/outer", b"nest/inner/outer")} <= ours["renamed"]
    assert (b"overwrite/new", b"overwrite/old") in ours["renamed"] and b"overwrite/old" in ours["removed"]
    assert {b"doomed", b"doomed/sub/f2", b"empty-dir", b"delete-me.txt"} <= ours["removed"]  # type: ignore[operator]
    assert b"links/new-hardlink-to-hello" in ours["added"]
    assert b"link-retarget" in ours["added"] and b"link-retarget" in ours["removed"]  # a new symlink
    assert {b"append.log", b"truncate-me.bin", b"sparse.bin", b"random-reflink.bin"} <= ours["modified"]  # type: ignore[operator]


def test_temporary_names_never_show() -> None:
    for v in ("v1", "v2"):
        for c in one(FIXTURES / f"rich-incr-{v}.stream").changes + one(FIXTURES / f"rich-full-{v}.stream").changes:
            for p in (c.path, c.old_path):
                assert p is None or not p.split(b"/")[0].startswith(b"o3"), c


def test_full_stream_creates_every_path(tmp_path: Path) -> None:
    for v in ("v1", "v2"):
        root = tmp_path / v
        root.mkdir()
        with (FIXTURES / f"rich-full-{v}.stream").open("rb") as f:
            extract(f, root)
        nodes, fds = snapshot(root)
        for fd in fds:
            os.close(fd)
        on_disk = {p for n in nodes.values() for p in n.paths.values()} - {b""}
        result = one(FIXTURES / f"rich-full-{v}.stream")
        assert not result.incremental
        assert {c.path for c in result.changes if c.action in ("created", "linked")} == on_disk
        assert {c.action for c in result.changes} == {"created", "linked", "metadata"}
        links = [c for c in result.changes if c.action == "linked"]
        assert links and all(c.link_to in on_disk for c in links)


def test_v2_commands_count_as_changes() -> None:
    result = one(FIXTURES / "rich-incr-v2.stream")
    by_path = {c.path: c for c in result.changes if c.path is not None}
    assert by_path[b"random-reflink.bin"].data  # FALLOCATE punch hole
    assert "fileattr" in by_path[b"immutable"].metadata and not by_path[b"immutable"].data
    comp = one(FIXTURES / "compressed-v2.stream")
    assert all(c.data for c in comp.changes if c.kind == "file")  # ENCODED_WRITE


def test_several_subvolumes_and_text_and_json() -> None:
    for name in ("two-e-v1", "two-concat-v2"):
        with (FIXTURES / f"{name}.stream").open("rb") as f:
            results = list(changes(file_events(f)))
        assert [r.subvolume for r in results] == [b"two_a_snap", b"two_b_snap"]
    result = one(FIXTURES / "rich-incr-v1.stream")
    text = b"".join(diff_lines(result.diff()))
    assert b"R swap/b -> swap/a [times]\n" in text
    assert b"R names/rename-me-\\351 -> names/renamed-\\377 [times]\n" in text
    assert b"A links/new-hardlink-to-hello (hard link to hello.txt)\n" in text
    assert b"D doomed/sub/f2\n" in text
    ls = b"".join(ls_lines(result))
    assert b"renamed   dir      nest/inner from nest/outer/inner [times]\n" in ls
    data = json.loads(json.dumps(diff_json(result)))
    assert {"from": "swap/a", "to": "swap/b"}.items() <= data["renamed"][-1].items() or any(
        r["from"] == "swap/a" and r["to"] == "swap/b" for r in data["renamed"]
    )
    assert any(r["to"] == {"base64": "bmFtZXMvcmVuYW1lZC3/"} for r in data["renamed"])
    listing = ls_json(result)
    assert listing["incremental"] is True and listing["subvolume"] == "rich_incr"


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
