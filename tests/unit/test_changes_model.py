"""ls and diff against an independent diff of the trees before and after the incremental.

The expected diff is built from the file system alone: the parent stream is
extracted (sendstream.extract.extractor), every inode of it is held open (so no inode
number is reused), the incremental is applied in place, and the two trees
are compared by inode number: a name (parent directory inode, name) that
moved is a rename, a gone inode's names are removed, a new inode's names are
added, content and mode/owner/xattrs are compared per inode.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.streams import FIXTURES
from support.trees_diff import Trees, expected_diff, one, our_diff, snapshot

from sendstream.analysis.changes import changes
from sendstream.extract import extract_stream as extract
from sendstream.io.windows import file_events
from sendstream.render.changes import diff_json, diff_lines, ls_json, ls_lines


@pytest.fixture(scope="module", params=["v1", "v2"])
def trees(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Trees]]:
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


def test_diff_matches_the_trees(trees: tuple[str, Trees]) -> None:
    v, (before, after) = trees
    expected = expected_diff(before, after)
    ours = our_diff(one(FIXTURES / f"rich-incr-{v}.stream"))
    # the tree side sees metadata only where it really differs; the stream only what it sends
    assert ours == expected
    # the interesting cases of MANIFEST.md are all there
    assert (b"swap/a", b"swap/b") in ours["renamed"] and (b"swap/b", b"swap/a") in ours["renamed"]
    assert (b"dswap/x", b"dswap/y") in ours["renamed"] and (b"dswap/y", b"dswap/x") in ours["renamed"]
    assert {(b"nest/outer/inner", b"nest/inner"), (b"nest/outer", b"nest/inner/outer")} <= ours["renamed"]
    assert (b"overwrite/new", b"overwrite/old") in ours["renamed"] and b"overwrite/old" in ours["removed"]
    assert {b"doomed", b"doomed/sub/f2", b"empty-dir", b"delete-me.txt"} <= ours["removed"]
    assert b"links/new-hardlink-to-hello" in ours["added"]
    assert b"link-retarget" in ours["added"] and b"link-retarget" in ours["removed"]  # a new symlink
    assert {b"append.log", b"truncate-me.bin", b"sparse.bin", b"random-reflink.bin"} <= ours["modified"]


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
