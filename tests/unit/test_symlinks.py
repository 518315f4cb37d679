"""The symlink tracker against a real directory tree: what it lets through never goes through a symlink.

Each case builds a parent tree, copies it as the subvolume (or starts empty,
as a full stream does), and applies random commands as ``btrfs receive``
applies them (the same calls, stopping at the first that fails), each first
given to the tracker. Before a command it lets through is applied, and after
it for every path of up to three names (asked of a second tracker, which must
answer each command as the first does), the tree on disk is walked name by
name: no directory of a path the tracker lets through is a symlink, and no
call that follows or opens its last name meets a symlink or a FIFO.
"""

from __future__ import annotations

import itertools
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sendstream.analysis.symlinks import ABSENT, SPECIAL, SYMLINK, Budget, SymlinkTracker
from sendstream.errors import LimitExceeded, UnsafePath
from sendstream.format.layout import ATTRIBUTE_NUMBERS, COMMAND_NUMBERS
from sendstream.stores.confine import lstat_kinds

NAMES = (b"a", b"b", b"l")
TARGETS = (b"..", b"../..", b"a", b"l")  # relative: an escape stays in the case's own directory
PATH = st.lists(st.sampled_from(NAMES), min_size=1, max_size=2).map(b"/".join)
PROBES = [b"/".join(p) for n in (1, 2, 3) for p in itertools.product(NAMES, repeat=n)]
ONE = ("mkfile", "mkdir", "mkfifo", "unlink", "rmdir", "write", "chmod", "truncate", "utimes")
COMMANDS = st.one_of(
    st.tuples(st.sampled_from(ONE), PATH),
    st.tuples(st.just("symlink"), PATH, st.sampled_from(TARGETS)),
    st.tuples(st.sampled_from(("rename", "link")), PATH, PATH),
)
TREE = st.dictionaries(PATH, st.sampled_from(("dir", "file", "fifo", *TARGETS)), max_size=8)
A = ATTRIBUTE_NUMBERS
OPENS = (SYMLINK, SPECIAL)  # what btrfs receive's open, creat and truncate must not meet; chmod, a symlink
FOLLOWING = {"write": OPENS, "truncate": OPENS, "mkfile": OPENS, "chmod": (SYMLINK,)}
RULES = {"utimes": (), "chmod": (SYMLINK,), "write": OPENS}


def build(root: str, tree: dict[bytes, str]) -> None:
    """Make ``tree`` (path -> dir, file, fifo or a symlink's target) below ``root``, directories first."""
    for path, what in sorted(tree.items(), key=lambda item: item[0].count(b"/")):
        full = os.path.join(os.fsencode(root), path)
        if not os.path.isdir(os.path.dirname(full)) or os.path.islink(os.path.dirname(full)):
            continue
        if what == "dir":
            os.mkdir(full)
        elif what == "file":
            open(full, "wb").close()
        elif what == "fifo":
            os.mkfifo(full)
        else:
            os.symlink(what, full)


def reached(root: str, path: bytes) -> int | None:
    """What the last name of ``path`` is when the system walks to it (ABSENT: it fails on the way), or None
    if a directory on the way is a symlink."""
    at = os.fsencode(root)
    parts = path.split(b"/")
    for name in parts[:-1]:
        at = os.path.join(at, name)
        try:
            mode = os.lstat(at).st_mode
        except OSError:
            return ABSENT
        if stat.S_ISLNK(mode):
            return None
        if not stat.S_ISDIR(mode):
            return ABSENT
    try:
        mode = os.lstat(os.path.join(at, parts[-1])).st_mode
    except OSError:
        return ABSENT
    return SYMLINK if stat.S_ISLNK(mode) else SPECIAL if stat.S_ISFIFO(mode) else ABSENT


def apply(root: str, command: tuple[bytes | str, ...]) -> None:
    """Do what btrfs receive does for ``command`` below ``root`` (OSError when the call fails)."""
    name, path, *other = command
    assert isinstance(path, bytes)
    full = os.path.join(os.fsencode(root), path)
    second = os.path.join(os.fsencode(root), other[0]) if other and isinstance(other[0], bytes) else b""
    if name == "mkfile":  # (creat, but a FIFO it should never meet would not block the test)
        os.close(os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK, 0o600))
    elif name == "mkdir":
        os.mkdir(full, 0o700)
    elif name == "mkfifo":
        os.mkfifo(full, 0o600)
    elif name == "symlink":
        os.symlink(other[0], full)
    elif name == "rename":
        os.rename(full, second)
    elif name == "link":  # link PATH to PATH_LINK: ``link(path_link, path)``, no symlink followed
        os.link(second, full, follow_symlinks=False)
    elif name == "unlink":
        os.unlink(full)
    elif name == "rmdir":
        os.rmdir(full)
    elif name == "write":
        fd = os.open(full, os.O_RDWR)
        try:
            os.pwrite(fd, b"x", 0)
        finally:
            os.close(fd)
    elif name == "chmod":
        os.chmod(full, 0o644)
    elif name == "truncate":
        os.truncate(full, 0)
    else:
        os.utime(full, (0, 0), follow_symlinks=False)


def probe(tracker: SymlinkTracker, root: str, after: tuple[bytes | str, ...]) -> None:
    """Every path the tracker lets through now, by every rule, reaches what the rule allows."""
    for path, (name, rule) in itertools.product(PROBES, RULES.items()):
        try:
            tracker.check(path, rule)
        except UnsafePath:
            continue
        last = reached(root, path)
        assert last is not None and last not in rule, (after, name, path, last)


def paths_of(command: tuple[bytes | str, ...]) -> dict[int, bytes]:
    name, path, *other = command
    assert isinstance(path, bytes) and isinstance(name, str)
    if name in ("rename", "link"):
        assert isinstance(other[0], bytes)
        return {A["path"]: path, A["path_to" if name == "rename" else "path_link"]: other[0]}
    return {A["path"]: path}


def replay(full: bool, tree: dict[bytes, str], commands: list[tuple[bytes | str, ...]]) -> str:
    """Apply ``commands`` to a subvolume made of ``tree`` (or empty, ``full``), each given to the tracker
    first, checking what it lets through; how it ended: ``refused N``, ``failed N`` or ``done``."""
    with tempfile.TemporaryDirectory() as case:
        parent, sub = os.path.join(case, "p", "parent"), os.path.join(case, "p", "sub")
        os.makedirs(parent)
        os.mkdir(sub)
        build(parent, tree)
        if not full:
            build(sub, tree)
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            # the same twice: one probed after each command, whose answers may not differ
            tracker, prober = (
                SymlinkTracker(None if full else lstat_kinds(fd, parent), Budget(1000, "max")) for _ in "12"
            )
            for i, command in enumerate(commands):
                name = str(command[0])
                answers = []
                for each in (tracker, prober):
                    try:
                        each.feed(COMMAND_NUMBERS[name], paths_of(command))
                        answers.append(True)
                    except UnsafePath:
                        answers.append(False)
                assert answers[0] == answers[1], (command, "let through only by the probed one" if answers[1] else "")
                if not answers[0]:
                    return f"refused {i}"  # the transfer ends here
                for number, path in paths_of(command).items():
                    last = reached(sub, path)
                    assert last is not None, (command, "a directory of", path, "is a symlink")
                    if number == A["path"]:
                        assert last not in FOLLOWING.get(name, ()), (command, "ends at", last)
                try:
                    apply(sub, command)
                except OSError:
                    return f"failed {i}"  # btrfs receive stops at the first call that fails
                probe(prober, sub, command)
        finally:
            os.close(fd)
    return "done"


@pytest.mark.parametrize("full", [True, False], ids=["full", "incremental"])
@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tree=TREE, commands=st.lists(COMMANDS, max_size=14))
def test_no_command_let_through_goes_through_a_symlink(
    full: bool, tree: dict[bytes, str], commands: list[tuple[bytes | str, ...]]
) -> None:
    replay(full, tree, commands)


CASES: dict[str, tuple[dict[bytes, str], list[tuple[bytes | str, ...]], str]] = {
    # a rename onto another name of the same inode does nothing: the symlink stays under its old name too
    "a symlink renamed onto a hard link of it": (
        {},
        [("symlink", b"l", b".."), ("link", b"b", b"l"), ("rename", b"l", b"b"), ("mkdir", b"l/a")],
        "refused 3",
    ),
    "a symlink renamed onto another, then a directory renamed to its old name": (
        {},
        [
            *[("symlink", name, b"..") for name in (b"a", b"b")],
            ("rename", b"a", b"b"),
            ("mkdir", b"l"),
            ("rename", b"l", b"a"),
            ("mkdir", b"a/a"),
        ],
        "done",
    ),
    "the parent's symlink renamed away and back": (
        {b"a": "dir", b"a/l": ".."},
        [("rename", b"a", b"b"), ("rename", b"b/l", b"l"), ("mkdir", b"a"), ("mkdir", b"l/a")],
        "refused 3",
    ),
    "the parent's symlink replaced by a directory": (
        {b"l": ".."},
        [("unlink", b"l"), ("mkdir", b"l"), ("mkdir", b"l/a"), ("write", b"a")],
        "failed 3",
    ),
    "a symlink made in a directory made, then written": (
        {},
        [("mkdir", b"a"), ("symlink", b"a/l", b"../.."), ("write", b"a/l")],
        "refused 2",
    ),
    "a directory of the parent holding a symlink, renamed away, then a file": (
        {b"a": "dir", b"a/l": ".."},
        [("utimes", b"a/l"), ("rename", b"a", b"b"), ("mkdir", b"a"), ("mkfile", b"a/l"), ("write", b"b/l")],
        "refused 4",
    ),
    "a FIFO of the parent, written": ({b"a": "fifo"}, [("write", b"a")], "refused 0"),
    "a FIFO made, then a file made over it": ({}, [("mkfifo", b"a"), ("mkfile", b"a")], "refused 1"),
    "a symlink made, then chmod": ({}, [("symlink", b"l", b"a"), ("chmod", b"l")], "refused 1"),
    "a symlink made, then utimes": ({}, [("symlink", b"l", b"a"), ("utimes", b"l")], "done"),
    "a symlink made, then utimes and chmod": (
        {},
        [("symlink", b"l", b"a"), ("utimes", b"l"), ("chmod", b"l")],
        "refused 2",
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_cases_on_disk(case: str) -> None:
    tree, commands, how = CASES[case]
    assert replay(not tree, dict(tree), commands) == how


def test_a_symlink_is_followed_through_renames_of_the_directories_above_it(tmp_path: Path) -> None:
    """A symlink made, moved into a directory that is then renamed twice, and reached by its new path."""
    tracker = SymlinkTracker(None, Budget(100, "max"))
    steps = [
        ("mkdir", b"o257-7-0"),
        ("symlink", b"o258-7-0", b".."),
        ("rename", b"o258-7-0", b"o257-7-0/up"),
        ("rename", b"o257-7-0", b"d"),
        ("rename", b"d", b"e"),
    ]
    for step in steps:
        tracker.feed(COMMAND_NUMBERS[str(step[0])], paths_of(step))
    with pytest.raises(UnsafePath, match="'e/up' is a symlink"):
        tracker.feed(COMMAND_NUMBERS["mkdir"], {A["path"]: b"e/up/escaped"})
    tracker.feed(COMMAND_NUMBERS["mkdir"], {A["path"]: b"d"})  # the old names lead nowhere
    tracker.feed(COMMAND_NUMBERS["mkdir"], {A["path"]: b"d/up"})


def test_what_is_held_is_bounded() -> None:
    """Symlinks count against the budget while they are held; a full stream of files and directories holds
    nothing, and a symlink removed frees its place."""
    budget = Budget(3, "max")
    tracker = SymlinkTracker(None, budget)
    for i in range(1000):
        tracker.feed(COMMAND_NUMBERS["mkdir"], {A["path"]: b"d%d" % i})
        tracker.feed(COMMAND_NUMBERS["mkfile"], {A["path"]: b"d%d/f" % i})
        tracker.feed(COMMAND_NUMBERS["symlink"], {A["path"]: b"s"})
        tracker.feed(COMMAND_NUMBERS["unlink"], {A["path"]: b"s"})
    assert budget.held == 0
    for i in range(3):
        tracker.feed(COMMAND_NUMBERS["symlink"], {A["path"]: b"s%d" % i})
    with pytest.raises(LimitExceeded, match=r"than are followed \(the limit is 3; max raises it\)"):
        tracker.feed(COMMAND_NUMBERS["symlink"], {A["path"]: b"s3"})
