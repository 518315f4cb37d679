"""An independent diff of two trees by inode number: the oracle of ls and diff (tests/unit/test_changes_model.py)."""

from __future__ import annotations

import hashlib
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path

from sendstream.analysis.changes import Change, SubvolumeChanges, changes
from sendstream.io.windows import file_events


@dataclass
class Node:
    names: set[tuple[int, bytes]] = field(default_factory=set)
    paths: dict[tuple[int, bytes], bytes] = field(default_factory=dict)
    content: object = None
    meta: dict[str, object] = field(default_factory=dict)


Trees = tuple[dict[int, Node], dict[int, Node]]  # the tree before and after the incremental


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
