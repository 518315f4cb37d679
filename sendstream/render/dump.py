"""Presentation: ``btrfs receive --dump`` text and JSON lines.

Both are pure functions of a command (plus, for the text, the subvolume
path that earlier subvol/snapshot commands set); :func:`dump` writes those
of a whole input.
The text follows btrfs-progs' ``cmds/receive-dump.c`` byte for byte in one of
two styles: "6.14" (btrfs-progs 6.9.1 and later: clone sources, xattr names
and data escaped, ``encoded_write`` without commas), the default, or "6.2"
(up to 6.9). Every stream of a concatenated input is dumped where btrfs-progs
stops after the first, and the 6.2 style escapes xattr data where 6.2 prints
it raw (``raw_xattr_data`` gives 6.2's form).
"""

from __future__ import annotations

import ctypes
import re
import uuid
from typing import Any, BinaryIO

from .. import errors as e
from ..codec.backend import Backend
from ..codec.scan import Batch
from ..format.command import Command
from ..format.layout import A as _A
from ..io.framed import FramedInput, StreamSource, Warn
from .progs import DEFAULT_STYLE, PROGS_STYLES, ProgsStyle

_TEXT_BATCH = 1 << 20

_SPECIAL = {
    7: b"\\a",
    8: b"\\b",
    27: b"\\e",
    12: b"\\f",
    10: b"\\n",
    13: b"\\r",
    9: b"\\t",
    11: b"\\v",
    32: b"\\ ",
    92: b"\\\\",
}
# What string_print_escape_special() prints for each byte in the C locale.
_ESCAPE = [_SPECIAL.get(b) or (bytes([b]) if 0x20 < b < 0x7F else b"\\%03o" % b) for b in range(256)]
_NEEDS_ESCAPE = re.compile(rb"[^\x21-\x5b\x5d-\x7e]")


def escape(raw: bytes) -> bytes:
    """Escape a name as btrfs-progs prints it: C escapes, space, octal."""
    if _NEEDS_ESCAPE.search(raw) is None:
        return raw
    return _NEEDS_ESCAPE.sub(lambda m: _ESCAPE[m.group()[0]], raw)


def _cstr(raw: Any) -> bytes:
    # btrfs-progs copies strings into NUL-terminated C strings: a NUL ends them.
    b = bytes(raw)
    return b.split(b"\0", 1)[0] if b"\0" in b else b


def path_cat(p1: bytes, p2: bytes) -> bytes:
    """btrfs-progs' path_cat_out(): join with '/', one trailing '/' dropped each."""
    if p1.endswith(b"/"):
        p1 = p1[:-1]
    if p2.endswith(b"/"):
        p2 = p2[:-1]
    return p1 + b"/" + p2


# The C library's localtime_r and strftime, which the native printer and btrfs-progs call: glibc prints
# the years past 2^31 - 1 that localtime_r reaches in its own way (wrapped to negative ones in 2.36),
# which time.strftime refuses, so no Python formatting can be relied on to print the same text.
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.localtime_r.restype = ctypes.c_void_p
_LIBC.localtime_r.argtypes = (ctypes.POINTER(ctypes.c_long), ctypes.c_void_p)
_LIBC.strftime.restype = ctypes.c_size_t
_LIBC.strftime.argtypes = (ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_void_p)
_TIME_T = 8 * ctypes.sizeof(ctypes.c_long)  # time_t is a long on Linux
_TM_SIZE = 128  # more than any C library's struct tm
_TIME_TEXT = 64  # the native printer's and btrfs-progs' buffer


def format_time(sec: int) -> bytes:
    """``%Y-%m-%dT%H:%M:%S%z`` in the local zone (TZ is honoured, after ``time.tzset()``), as
    the C library formats it; ValueError for a time it cannot represent (btrfs-progs stops there
    too: "failed to convert time ... to local time")."""
    tm = ctypes.create_string_buffer(_TM_SIZE)
    text = ctypes.create_string_buffer(_TIME_TEXT)
    if (
        not -(1 << (_TIME_T - 1)) <= sec < 1 << (_TIME_T - 1)
        or not _LIBC.localtime_r(ctypes.byref(ctypes.c_long(sec)), tm)
        or not _LIBC.strftime(text, _TIME_TEXT, b"%Y-%m-%dT%H:%M:%S%z", tm)
    ):
        raise ValueError(f"the time {sec} is beyond what the local time can represent")
    return text.value


def _signed(value: int, bits: int) -> int:
    value &= (1 << bits) - 1
    return value - (1 << bits) if value >> (bits - 1) else value


def _uuid(raw: Any) -> bytes:
    return str(uuid.UUID(bytes=bytes(raw))).encode()


def _u(cmd: Command, name: str) -> int:
    return int(cmd.get(name))


class TextDumper:
    """Formats commands as ``btrfs receive --dump`` lines of the btrfs-progs ``style``.

    ``raw_xattr_data`` (6.2 style only) prints xattr data as 6.2 does: raw, up
    to its first NUL, so a value can break the line; by default it is escaped.
    """

    def __init__(self, *, style: ProgsStyle = DEFAULT_STYLE, raw_xattr_data: bool = False) -> None:
        if style not in PROGS_STYLES:
            raise e.UsageError(f"unknown dump style {style!r}; expected one of {', '.join(PROGS_STYLES)}")
        if raw_xattr_data and style != "6.2":
            raise e.UsageError("raw xattr data is only for the 6.2 style: btrfs-progs 6.9.1 and later escape it")
        # receive.c starts both at "."; subvol and snapshot set the second.
        self.root_path = b"."
        self.subvol_path = b"."
        self.style = style
        self.raw_xattr_data = raw_xattr_data
        # what btrfs-progs 6.9.1 changed (commits 31286d3b and d88acfba)
        self._escaped = style != "6.2"
        self._times: dict[int, bytes] = {}

    def native_batch(self, out: BinaryIO, backend: Backend) -> Batch | None:
        """A batch function that prints runs of clean commands natively into
        ``out`` (None on the pure ``backend``)."""
        module = backend.module
        if module is None:
            return None

        def batch(
            mv: Any, pos: int, version: int, limit: int, origin: int, unknown: Any
        ) -> tuple[int, int, int, int, int]:
            pos, status, need, count, nbytes, text, self.subvol_path = module.dump_text(
                mv, pos, version, limit, self.subvol_path, self.raw_xattr_data, self._escaped, _TEXT_BATCH, unknown
            )
            out.write(text)
            return pos, status, need, count, nbytes

        return batch

    def _line(self, title: bytes, path: bytes, fields: bytes | None) -> bytes:
        shown = escape(path)
        head = title.ljust(16) + shown
        if fields is None:
            return head + b"\n"
        return head + b" " * max(1, 32 - len(shown)) + fields + b"\n"

    def line(self, cmd: Command) -> bytes:
        """The text of one command ('' for END and unknown commands)."""
        try:
            return self._format(cmd)
        except (KeyError, ValueError, OverflowError, OSError) as exc:
            raise e.FormatError(
                f"cannot print the command: {exc!r}", offset=cmd.offset, index=cmd.index, command=cmd.name
            ) from None

    def _format(self, cmd: Command) -> bytes:
        name = cmd.name
        if cmd.attributes is None or name == "end":
            return b""
        get = cmd.raw
        title = name.encode()
        if name in ("subvol", "snapshot"):
            self.subvol_path = path_cat(self.root_path, _cstr(get(_A["path"])))
            fields = b"uuid=%s transid=%d" % (_uuid(get(_A["uuid"])), _u(cmd, "ctransid"))
            if name == "snapshot":
                fields += b" parent_uuid=%s parent_transid=%d" % (
                    _uuid(get(_A["clone_uuid"])),
                    _u(cmd, "clone_ctransid"),
                )
            return self._line(title, self.subvol_path, fields)
        path = path_cat(self.subvol_path, _cstr(get(_A["path"])))
        formatter = _FIELDS.get(name)
        return self._line(title, path, formatter(self, cmd) if formatter else None)

    def _rename(self, cmd: Command) -> bytes:
        return b"dest=" + escape(path_cat(self.subvol_path, _cstr(cmd.raw(_A["path_to"]))))

    def _clone(self, cmd: Command) -> bytes:
        # btrfs-progs reads CLONE_LEN into an int and prints it as u64 (sign-extended);
        # 6.2 prints the source path raw.
        length = _signed(_u(cmd, "clone_len"), 32) & 0xFFFFFFFFFFFFFFFF
        source = path_cat(self.subvol_path, _cstr(cmd.raw(_A["clone_path"])))
        if self._escaped:
            source = escape(source)
        return b"offset=%d len=%d from=%s clone_offset=%d" % (
            _u(cmd, "file_offset"),
            length,
            source,
            _u(cmd, "clone_offset"),
        )

    def _set_xattr(self, cmd: Command) -> bytes:
        # 6.2 prints the value raw with %.*s; by default we escape it so a
        # value cannot break the line. 6.9.1 escapes it too but drops "data="
        # (an empty value leaves two spaces, as btrfs-progs prints).
        data = bytes(cmd.raw(_A["xattr_data"]) or b"")
        if self._escaped:
            return b"name=%s %s len=%d" % (self._xattr_name(cmd), escape(data), len(data))
        shown = _cstr(data) if self.raw_xattr_data else escape(data)
        return b"name=%s data=%s len=%d" % (self._xattr_name(cmd), shown, len(data))

    def _xattr_name(self, cmd: Command) -> bytes:
        name = _cstr(cmd.raw(_A["xattr_name"]))
        return escape(name) if self._escaped else name

    def _encoded_write(self, cmd: Command) -> bytes:
        sep = b" " if self._escaped else b", "
        return b"offset=%d len=%d" % (_u(cmd, "file_offset"), _data_len(cmd)) + b"".join(
            sep + b"%s=%d" % (name.encode(), value)
            for name, value in (
                ("unencoded_file_len", _u(cmd, "unencoded_file_len")),
                ("unencoded_len", _u(cmd, "unencoded_len")),
                ("unencoded_offset", _u(cmd, "unencoded_offset")),
                ("compression", cmd.get("compression", 0)),
                ("encryption", cmd.get("encryption", 0)),
            )
        )

    def _time(self, sec: int) -> bytes:
        text = self._times.get(sec)
        if text is None:
            if len(self._times) > 4096:
                self._times.clear()
            text = self._times[sec] = format_time(sec)
        return text

    def _utimes(self, cmd: Command) -> bytes:
        return b"atime=%s mtime=%s ctime=%s" % tuple(self._time(cmd.get(k).sec) for k in ("atime", "mtime", "ctime"))


def _dest(attr: str) -> Any:
    number = _A[attr]
    return lambda d, cmd: b"dest=" + escape(_cstr(cmd.raw(number)))


def _data_len(cmd: Command) -> int:
    return len(cmd.raw(_A["data"]) or b"")


_FIELDS: dict[str, Any] = {
    "mknod": lambda d, c: b"mode=%o dev=0x%x" % (_u(c, "mode"), _u(c, "rdev")),
    "symlink": _dest("path_link"),
    "link": _dest("path_link"),
    "rename": TextDumper._rename,
    "write": lambda d, c: b"offset=%d len=%d" % (_u(c, "file_offset"), _data_len(c)),
    "clone": TextDumper._clone,
    "set_xattr": TextDumper._set_xattr,
    "remove_xattr": lambda d, c: b"name=" + d._xattr_name(c),
    "truncate": lambda d, c: b"size=%d" % _u(c, "size"),
    "chmod": lambda d, c: b"mode=%o" % _u(c, "mode"),
    "chown": lambda d, c: b"gid=%d uid=%d" % (_u(c, "gid"), _u(c, "uid")),
    "utimes": TextDumper._utimes,
    "update_extent": lambda d, c: b"offset=%d len=%d" % (_u(c, "file_offset"), _u(c, "size")),
    "encoded_write": TextDumper._encoded_write,
    "fallocate": lambda d, c: (
        b"mode=%d offset=%d len=%d" % (_signed(_u(c, "fallocate_mode"), 32), _u(c, "file_offset"), _u(c, "size"))
    ),
    "fileattr": lambda d, c: b"fileattr=0x%d" % _u(c, "fileattr"),
    "enable_verity": lambda d, c: (
        b"algorithm=%d block_size=%d salt_len=%d sig_len=%d"
        % (
            _u(c, "verity_algorithm"),
            _u(c, "verity_block_size"),
            len(c.raw(_A["verity_salt_data"]) or b""),
            len(c.raw(_A["verity_sig_data"]) or b""),
        )
    ),
}


def dump(
    source: StreamSource,
    out: BinaryIO,
    *,
    as_json: bool = False,
    strict: bool = False,
    max_command_size: int | None = None,
    warn: Warn | None = None,
    backend: Backend | None = None,
    style: ProgsStyle = DEFAULT_STYLE,
    raw_xattr_data: bool = False,
) -> None:
    """Write every command of the stream at ``source`` to ``out``: ``btrfs receive --dump``
    text of the btrfs-progs ``style`` (see :class:`TextDumper` for ``raw_xattr_data``), or with
    ``as_json`` a JSON line each. ``strict`` rejects commands and attributes unknown to the
    stream's version; problems go to ``warn`` as they are found. ``backend`` reads, checks and
    prints (the default one without it)."""
    text = TextDumper(style=style, raw_xattr_data=raw_xattr_data)
    if as_json:
        from .jsonlines import json_line  # loaded only for JSON: text costs no json/hashlib start-up
    with FramedInput(source, strict=strict, max_command_size=max_command_size, warn=warn, backend=backend) as stream:
        batch = None if as_json else text.native_batch(out, stream.framer.backend)
        try:
            for event in stream.events(batch, flush_before_read=out):
                if isinstance(event, Command):
                    out.write(json_line(event, stream.framer.streams) if as_json else text.line(event))
                    stream.tell()
        finally:
            out.flush()
