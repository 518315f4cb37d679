"""The send-stream layout, declared once with construct.

The kernel's ``fs/btrfs/send.h`` is the authority for every number here.
construct is slow to import and to run, so the runtime never uses it:
``python -m sendstream.format`` (:mod:`.generate`) writes what the runtime
needs from these declarations to ``_layout.py``, which :mod:`.layout`
loads, and to ``codec/_layout.h``, which ``_native.c`` includes (tests keep
both current). Nothing there is written by hand.
"""

from __future__ import annotations

import uuid
from typing import Any

import construct as c

from ..errors import FormatError
from .specs import AttributeSpec, CommandSpec, Timespec

STREAM_MAGIC = b"btrfs-stream\0"
MAX_VERSION = 3

StreamHeader = c.Struct("magic" / c.Const(STREAM_MAGIC), "version" / c.Int32ul)
CommandHeader = c.Struct("len" / c.Int32ul, "cmd" / c.Int16ul, "crc" / c.Int32ul)
TlvHeader = c.Struct("type" / c.Int16ul, "len" / c.Int16ul)
TimespecStruct = c.Struct("sec" / c.Int64sl, "nsec" / c.Int32ul)


class _UuidAdapter(c.Adapter):  # type: ignore[misc]
    def _decode(self, obj: bytes, context: Any, path: Any) -> uuid.UUID:
        return uuid.UUID(bytes=bytes(obj))

    def _encode(self, obj: uuid.UUID, context: Any, path: Any) -> bytes:
        return obj.bytes


class _TimespecAdapter(c.Adapter):  # type: ignore[misc]
    def _decode(self, obj: Any, context: Any, path: Any) -> Timespec:
        return Timespec(obj.sec, obj.nsec)

    def _encode(self, obj: Timespec, context: Any, path: Any) -> dict[str, int]:
        return {"sec": obj.sec, "nsec": obj.nsec}


# Value kinds: the construct of each attribute value, by kind name.
VALUE_KINDS: dict[str, c.Construct] = {
    "u8": c.Int8ul,
    "u32": c.Int32ul,
    "u64": c.Int64ul,
    "uuid": _UuidAdapter(c.Bytes(16)),
    "timespec": _TimespecAdapter(TimespecStruct),
    "string": c.GreedyBytes,  # raw bytes: names need not be UTF-8
    "bytes": c.GreedyBytes,
}


def value_size(kind: str) -> int | None:
    """The fixed size of a value kind, or None for variable-length values."""
    return None if kind in ("string", "bytes") else int(VALUE_KINDS[kind].sizeof())


def _attributes(*rows: tuple[int, str, str, int]) -> dict[int, AttributeSpec]:
    return {n: AttributeSpec(n, name, kind, v, value_size(kind)) for n, name, kind, v in rows}


ATTRIBUTES: dict[int, AttributeSpec] = _attributes(
    (1, "uuid", "uuid", 1),
    (2, "ctransid", "u64", 1),
    (3, "ino", "u64", 1),
    (4, "size", "u64", 1),
    (5, "mode", "u64", 1),
    (6, "uid", "u64", 1),
    (7, "gid", "u64", 1),
    (8, "rdev", "u64", 1),
    (9, "ctime", "timespec", 1),
    (10, "mtime", "timespec", 1),
    (11, "atime", "timespec", 1),
    (12, "otime", "timespec", 1),
    (13, "xattr_name", "string", 1),
    (14, "xattr_data", "bytes", 1),
    (15, "path", "string", 1),
    (16, "path_to", "string", 1),
    (17, "path_link", "string", 1),
    (18, "file_offset", "u64", 1),
    (19, "data", "bytes", 1),
    (20, "clone_uuid", "uuid", 1),
    (21, "clone_ctransid", "u64", 1),
    (22, "clone_path", "string", 1),
    (23, "clone_offset", "u64", 1),
    (24, "clone_len", "u64", 1),
    (25, "fallocate_mode", "u32", 2),
    (26, "fileattr", "u64", 2),
    (27, "unencoded_file_len", "u64", 2),
    (28, "unencoded_len", "u64", 2),
    (29, "unencoded_offset", "u64", 2),
    (30, "compression", "u32", 2),
    (31, "encryption", "u32", 2),
    (32, "verity_algorithm", "u8", 3),
    (33, "verity_block_size", "u32", 3),
    (34, "verity_salt_data", "bytes", 3),
    (35, "verity_sig_data", "bytes", 3),
)
ATTRIBUTE_NUMBERS: dict[str, int] = {a.name: n for n, a in ATTRIBUTES.items()}
A = ATTRIBUTE_NUMBERS
A_DATA = A["data"]
# Highest attribute number valid in each stream version (send.h A_MAX_V*).
MAX_ATTRIBUTE = {1: 24, 2: 31, 3: 35}


def _cmd(n: int, name: str, v: int, req: str = "", opt: str = "") -> CommandSpec:
    return CommandSpec(n, name, v, tuple(A[x] for x in req.split()), tuple(A[x] for x in opt.split()))


# Names as send.h spells them (lower case, without BTRFS_SEND_C_), which is how
# `btrfs receive --dump` titles each line; required attributes as btrfs-progs'
# common/send-stream.c reads them.
COMMANDS: dict[int, CommandSpec] = {
    s.number: s
    for s in (
        _cmd(1, "subvol", 1, "path uuid ctransid"),
        _cmd(2, "snapshot", 1, "path uuid ctransid clone_uuid clone_ctransid"),
        _cmd(3, "mkfile", 1, "path ino"),
        _cmd(4, "mkdir", 1, "path ino"),
        _cmd(5, "mknod", 1, "path ino mode rdev"),
        _cmd(6, "mkfifo", 1, "path ino"),
        _cmd(7, "mksock", 1, "path ino"),
        _cmd(8, "symlink", 1, "path ino path_link"),
        _cmd(9, "rename", 1, "path path_to"),
        _cmd(10, "link", 1, "path path_link"),
        _cmd(11, "unlink", 1, "path"),
        _cmd(12, "rmdir", 1, "path"),
        _cmd(13, "set_xattr", 1, "path xattr_name xattr_data"),
        _cmd(14, "remove_xattr", 1, "path xattr_name"),
        _cmd(15, "write", 1, "path file_offset data"),
        _cmd(16, "clone", 1, "path file_offset clone_len clone_uuid clone_ctransid clone_path clone_offset"),
        _cmd(17, "truncate", 1, "path size"),
        _cmd(18, "chmod", 1, "path mode"),
        _cmd(19, "chown", 1, "path uid gid"),
        _cmd(20, "utimes", 1, "path atime mtime ctime", "otime"),
        _cmd(21, "end", 1),
        _cmd(22, "update_extent", 1, "path file_offset size"),
        _cmd(23, "fallocate", 2, "path fallocate_mode file_offset size"),
        _cmd(24, "fileattr", 2, "path fileattr"),
        _cmd(
            25,
            "encoded_write",
            2,
            "path file_offset unencoded_file_len unencoded_len unencoded_offset data",
            "compression encryption",
        ),
        _cmd(26, "enable_verity", 3, "path verity_algorithm verity_block_size verity_salt_data verity_sig_data"),
    )
}
COMMAND_NUMBERS: dict[str, int] = {s.name: n for n, s in COMMANDS.items()}
C_END = COMMAND_NUMBERS["end"]
# Highest command number valid in each stream version (send.h C_MAX_V*).
MAX_COMMAND = {1: 22, 2: 25, 3: 26}

# The largest command payload each version's kernel can write: v1's send
# buffer is 64 KiB; v2+ is ALIGN(16 KiB + BTRFS_MAX_COMPRESSED (128 KiB), 4 KiB).
SEND_BUF_SIZE = {1: 64 * 1024, 2: 16 * 1024 + 128 * 1024, 3: 16 * 1024 + 128 * 1024}


def tlv(version: int) -> c.Construct:
    """One TLV; from v2 on, DATA has no length and runs to the command's end."""
    if version < 2:
        return c.Struct("type" / c.Int16ul, "len" / c.Int16ul, "value" / c.Bytes(c.this.len))
    return c.Struct(
        "type" / c.Int16ul,
        "len" / c.If(c.this.type != A_DATA, c.Int16ul),
        "value" / c.IfThenElse(c.this.type == A_DATA, c.GreedyBytes, c.Bytes(c.this.len)),
    )


def command(version: int) -> c.Construct:
    """A whole command: header, then ``len`` bytes of TLVs."""
    return c.Struct(
        *CommandHeader.subcons,
        "attributes" / c.FixedSized(c.this.len, c.GreedyRange(tlv(version))),
    )


def parse_with(con: c.Construct, data: bytes, *, offset: int, what: str, index: int | None = None) -> Any:
    """Parse with construct, turning construct's errors into ours."""
    try:
        return con.parse(data)
    except c.ConstructError as exc:
        raise FormatError(f"cannot parse {what}: {exc}", offset=offset, index=index, expected=what) from None
