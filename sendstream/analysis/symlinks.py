"""Which names of a subvolume being received are symlinks or special files, so that no path goes through one.

``btrfs receive`` joins each path of a stream to its subvolume's path and
hands it to the system, which follows a symlink in every component but the
last; in the last one too where it opens or changes the file: ``creat``
(MKFILE), ``open`` (WRITE, CLONE and its source, ENCODED_WRITE, FALLOCATE,
ENABLE_VERITY), ``truncate`` and ``chmod``. (``rename``, ``link``,
``unlink``, ``rmdir``, ``symlink``, ``mkdir``, ``mknod``, ``lchown``,
``lsetxattr``, ``lremovexattr`` and ``utimensat(AT_SYMLINK_NOFOLLOW)`` do
not follow the last one; FILEATTR and UPDATE_EXTENT do nothing.) A special
file the stream made is opened as what it is: a device node is the disk
itself. :class:`SymlinkTracker` follows, command by command, which names
are symlinks (``SYMLINK``) or devices, FIFOs and sockets (``SPECIAL``),
through renames and links, and refuses (:class:`~sendstream.errors.UnsafePath`)
a path whose directories include one, or whose last name is one where the
call would follow or open it.

What it holds
    Only what a later path could meet: the symlinks and special files, the
    directories above them, the parent's directories walked through, and
    the names of the parent (the ``base``, read on demand) that an
    incremental stream moved, removed or replaced. A name it does not hold
    is, in a directory the stream made, a regular file, a directory with
    no symlink below, or nothing; in a directory of the parent, what the
    parent has there, or (where the parent has nothing) one of those. So a
    full stream of regular files and directories holds nothing, and every
    name held counts against the :class:`Budget` of the input.

What it assumes
    Each command succeeds: ``btrfs receive`` (without ``--max-errors``)
    stops at the first that fails, so what the tracker believes after a
    failed command is never acted on. One exception is kept in mind: a
    rename of a name onto another name of the same inode does nothing, so a
    symlink renamed onto a symlink (or special file) stays where it was too.
"""

from __future__ import annotations

from collections.abc import Callable

from .. import errors as e
from ..format.layout import ATTRIBUTE_NUMBERS, COMMAND_NUMBERS, attribute_name

# What a name is: nothing known (in a directory the stream made: a regular file, a directory with no
# symlink below, or nothing; from the parent: nothing), a regular file or a directory with no symlink
# below it, a directory whose names are held or come from the parent, a symlink, a device, FIFO or socket.
ABSENT, PLAIN, DIR, SYMLINK, SPECIAL = range(5)
HAZARDS = (SYMLINK, SPECIAL)

# What a command does with the last name of its path: nothing that follows it, follow it (chmod), open it.
UNFOLLOWED: tuple[int, ...] = ()
FOLLOWED = (SYMLINK,)
OPENED = HAZARDS

_C = COMMAND_NUMBERS
# What btrfs receive's call does with the last name of a command's path
_LAST: dict[int, tuple[int, ...]] = {
    _C[name]: OPENED for name in ("mkfile", "write", "clone", "truncate", "fallocate", "encoded_write", "enable_verity")
}
_LAST[_C["chmod"]] = FOLLOWED
_MADE = {_C["mkfile"]: PLAIN, _C["mkdir"]: PLAIN, _C["symlink"]: SYMLINK}
_MADE.update({_C[name]: SPECIAL for name in ("mknod", "mkfifo", "mksock")})
_RENAME, _LINK, _CLONE = _C["rename"], _C["link"], _C["clone"]
_REMOVES = {_C["unlink"], _C["rmdir"]}
_CHANGES = {*_MADE, *_REMOVES, _RENAME, _LINK}  # the commands that make, move or remove a name
_A_PATH, _A_PATH_TO, _A_PATH_LINK, _A_CLONE_PATH = (
    ATTRIBUTE_NUMBERS[name] for name in ("path", "path_to", "path_link", "clone_path")
)

_WHAT = {SYMLINK: "a symlink", SPECIAL: "a device, FIFO or socket"}

Base = Callable[[bytes], int]
"""The kind of a path (``a/b``) in the parent snapshot."""


class Budget:
    """The names that the trackers of one input may hold at once; ``option`` names what raises ``limit``."""

    __slots__ = ("held", "limit", "option")

    def __init__(self, limit: int, option: str) -> None:
        self.limit, self.option = limit, option
        self.held = 0


class _Leaf:
    """A name that holds no names: one shared object a kind."""

    __slots__ = ("kind",)

    def __init__(self, kind: int) -> None:
        self.kind = kind


class _Dir:
    """A directory that holds names; ``origin`` is its path in the parent when its other names are the
    parent's (None: a directory the stream made, whose other names are plain)."""

    __slots__ = ("names", "origin")
    kind = DIR

    def __init__(self, origin: bytes | None) -> None:
        self.names: dict[bytes, _Dir | _Leaf] = {}
        self.origin = origin


_Node = _Dir | _Leaf
_LEAF = {kind: _Leaf(kind) for kind in (PLAIN, SYMLINK, SPECIAL)}
_Found = tuple[_Dir | None, int, _Node | None]


def _join(origin: bytes, name: bytes) -> bytes:
    return origin + b"/" + name if origin else name


class SymlinkTracker:
    """Follows the symlinks and special files of one subvolume: its parent's (``base``, None for a full
    stream) and what the stream makes, moves and removes. Paths are as ``split_path`` takes them (``b""``
    is the root)."""

    def __init__(self, base: Base | None, budget: Budget) -> None:
        self._base = base
        self._budget = budget
        self.root = _Dir(b"" if base is not None else None)
        # while nothing changes: the last directory walked to and its held node, the last path and its kind
        self._directory: tuple[bytes, _Dir | None] = (b"", self.root)
        self._seen: tuple[bytes, int | None] = (b"\0", None)

    def feed(self, cmd: int, paths: dict[int, bytes], source: SymlinkTracker | None = None) -> None:
        """Check the ``paths`` of command ``cmd`` (by attribute number; a CLONE's ``clone_path`` in ``source``,
        this subvolume if None), then follow what it makes, moves or removes. A refusal is
        :class:`~sendstream.errors.UnsafePath` with the ``attribute`` at fault."""
        number = _A_PATH
        try:
            if cmd not in _CHANGES and len(paths) == 1:  # most commands: one path, often the one before again
                ((number, path),) = paths.items()
                last = _LAST.get(cmd, UNFOLLOWED) if number == _A_PATH else UNFOLLOWED
                seen, kind = self._seen
                if path != seen or (last and kind is None):
                    if last:
                        kind = self.kind(path)
                    else:
                        self._parent(path)  # (its directories only)
                    self._seen = (path, kind)
                if kind in last:
                    raise _ends(kind, last)
                return
            for number, path in paths.items():
                if not path and cmd in _CHANGES:
                    raise e.UnsafePath("it names the subvolume itself", expected="a name in the subvolume")
                if number == _A_CLONE_PATH and cmd == _CLONE:
                    (source or self).check(path, OPENED)
                else:
                    self.check(path, _LAST.get(cmd, UNFOLLOWED) if number == _A_PATH else UNFOLLOWED)
            number = _A_PATH
            if cmd not in _CHANGES or _A_PATH not in paths:
                return  # (btrfs receive stops at a command that lacks its path)
            path, to, target = paths[_A_PATH], paths.get(_A_PATH_TO), paths.get(_A_PATH_LINK)
            if cmd in _MADE:
                self._put(path, _LEAF[_MADE[cmd]])
            elif cmd == _RENAME and to is not None:
                self._rename(path, to)
            elif cmd == _LINK and target is not None:
                kind = self.kind(target)
                self._put(path, _LEAF[kind if kind in HAZARDS else PLAIN])
            elif cmd in _REMOVES:
                holder, _, node = self._find(path)
                self._gone(path, holder, node)
        except e.UnsafePath as exc:
            exc.attribute = attribute_name(number)
            raise

    def check(self, path: bytes, last: tuple[int, ...] = UNFOLLOWED) -> None:
        """Refuse ``path`` if a directory on it is a symlink, or its last name is of a kind in ``last``."""
        if last:
            kind = self.kind(path)
            if kind in last:
                raise _ends(kind, last)
        else:
            self._parent(path)

    def _rename(self, path: bytes, to: bytes) -> None:
        """The name moves, and replaces what ``to`` named (RENAME)."""
        holder, kind, node = self._find(path)
        if node is None:  # not held: the parent's, or plain
            origin = holder.origin if holder is not None else None
            name = path.rpartition(b"/")[2]
            node = _Dir(_join(origin, name)) if kind == DIR and origin is not None else _LEAF.get(kind)
        # a rename onto another name of the same inode does nothing: a symlink onto a symlink may stay
        if not (kind in HAZARDS and self.kind(to) in HAZARDS):
            self._gone(path, holder, node if holder is not None else None)
        self._put(to, node or _LEAF[PLAIN])

    def _put(self, path: bytes, node: _Node) -> None:
        """``node`` at ``path``, replacing what was there. A plain name is held only where it hides one."""
        holder, kind, held = self._find(path)
        head, _, name = path.rpartition(b"/")
        if node.kind == PLAIN:
            if held is None and (holder is None or holder.origin is None or kind == ABSENT):
                return  # it hides nothing: an unheld name is plain here
            if held is not None and holder is not None and holder.origin is None:
                self._drop(holder, name)
                return
        self._set(self._holder(head), name, node)

    def _gone(self, path: bytes, holder: _Dir | None, held: object) -> None:
        """``path`` names nothing now: a name of the parent is hidden, a name held is dropped."""
        head, _, name = path.rpartition(b"/")
        origin = holder.origin if holder is not None else None
        if origin is not None and self._base is not None and self._base(_join(origin, name)) != ABSENT:
            self._set(self._holder(head), name, _LEAF[PLAIN])
        elif holder is not None and held is not None:
            self._drop(holder, name)

    def _set(self, holder: _Dir, name: bytes, node: _Node) -> None:
        self._directory, self._seen = (b"", self.root), (b"\0", None)
        if name not in holder.names:
            budget = self._budget
            budget.held += 1
            if budget.held > budget.limit:
                raise e.LimitExceeded(
                    "the stream has more symlinks, special files and directories above them than are followed",
                    limit=budget.limit,
                    option=budget.option,
                )
        holder.names[name] = node

    def _drop(self, holder: _Dir, name: bytes) -> None:
        self._directory, self._seen = (b"", self.root), (b"\0", None)
        if holder.names.pop(name, None) is not None:
            self._budget.held -= 1

    def kind(self, path: bytes) -> int:
        """The kind of ``path``'s last name (``DIR`` for the root): this subvolume as the base of another."""
        return self._find(path)[1] if path else DIR

    def _find(self, path: bytes) -> _Found:
        """For the last name of ``path`` (not the root): the held directory it is in (None: in none, so
        it is plain), its kind, and its node if held."""
        name = path.rpartition(b"/")[2]
        holder = self._parent(path)
        if holder is None:
            return None, ABSENT, None
        node = holder.names.get(name)
        if node is not None:
            return holder, node.kind, node
        if holder.origin is not None and self._base is not None:
            return holder, self._base(_join(holder.origin, name)), None
        return holder, ABSENT, None

    def _parent(self, path: bytes) -> _Dir | None:
        """The held directory that ``path``'s last name is in, None if it is in none (a file or nothing is
        on the way, or a directory of plain names). A symlink on the way is refused; a directory of the
        parent on the way is held from then on."""
        head = path.rpartition(b"/")[0]
        seen, node = self._directory
        if head == seen:
            return node
        node = self.root
        at = 0
        for name in head.split(b"/") if head else ():
            child = node.names.get(name)
            kind = (
                child.kind
                if child is not None
                else self._base(_join(node.origin, name))
                if (node.origin is not None and self._base is not None)
                else ABSENT
            )
            at += len(name) + 1
            if kind == SYMLINK:
                raise e.UnsafePath(f"'{e.shown(head[: at - 1])}' is a symlink", expected=_DIRECTORIES)
            if kind != DIR:  # a file or nothing: the call fails there, and nothing below it is held
                node = None
                break
            if child is None:
                assert node.origin is not None
                child = _Dir(_join(node.origin, name))
                self._set(node, name, child)
            assert isinstance(child, _Dir)
            node = child
        self._directory = (head, node)
        return node

    def _holder(self, head: bytes) -> _Dir:
        """The held directory at ``head``, made held (with the directories above it) if it was not: a
        directory of the parent, or one the stream made (or a file, and the call fails)."""
        node = self.root
        for name in head.split(b"/") if head else ():
            child = node.names.get(name)
            if not isinstance(child, _Dir):
                origin = None
                if child is None and node.origin is not None and self._base is not None:
                    path = _join(node.origin, name)
                    origin = path if self._base(path) == DIR else None
                child = _Dir(origin)
                self._set(node, name, child)
            node = child
        return node


def _ends(kind: int, last: tuple[int, ...]) -> e.UnsafePath:
    verb = "open" if SPECIAL in last else "follow"
    return e.UnsafePath(f"it ends at {_WHAT[kind]}, which btrfs receive would {verb}", expected=_FILE)


_FILE = "a regular file or a directory, not a symlink, device, FIFO or socket"
_DIRECTORIES = "a path whose directories are directories, not symlinks"
