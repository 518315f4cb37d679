"""The dump's text in process: xattr data escaped or raw by style, btrfs-progs' escaping, the column
and the zone of times; btrfs-progs' own text is the oracle of tests/system/test_dump.py."""

from __future__ import annotations

import pytest

from sendstream import Command
from sendstream.errors import UsageError
from sendstream.render.dump import TextDumper, escape, format_time


def test_xattr_data_is_escaped_not_raw() -> None:
    cmd = Command.build("set_xattr", [("path", b"f"), ("xattr_name", b"user.x y"), ("xattr_data", b"\0A\nB \\")])
    assert TextDumper(style="6.2").line(cmd) == (
        b"set_xattr       ./f                             name=user.x y data=\\000A\\nB\\ \\\\ len=6\n"
    )
    assert TextDumper(style="6.2", raw_xattr_data=True).line(cmd) == (
        b"set_xattr       ./f                             name=user.x y data= len=6\n"
    )
    assert TextDumper().line(cmd) == (
        b"set_xattr       ./f                             name=user.x\\ y \\000A\\nB\\ \\\\ len=6\n"
    )
    empty = Command.build("set_xattr", [("path", b"f"), ("xattr_name", b"user.e"), ("xattr_data", b"")])
    assert TextDumper().line(empty).endswith(b" name=user.e  len=0\n")  # two spaces, as btrfs-progs prints
    with pytest.raises(UsageError, match=r"only for the 6\.2 style"):
        TextDumper(style="6.14", raw_xattr_data=True)


def test_escape_follows_btrfs_progs() -> None:
    assert escape(b"plain-name.txt") == b"plain-name.txt"
    assert escape(b"a b\\c\n\t\x07\x08\x1b\x0c\r\x0b") == b"a\\ b\\\\c\\n\\t\\a\\b\\e\\f\\r\\v"
    assert escape(b"caf\xe9\x7f\x01") == b"caf\\351\\177\\001"


def test_long_paths_get_one_space_and_times_honour_tz() -> None:
    cmd = Command.build("truncate", [("path", b"x" * 40), ("size", 5)])
    assert TextDumper().line(cmd) == b"truncate        ./" + b"x" * 40 + b" size=5\n"
    assert format_time(0).endswith((b"+0000", b"-0500", b"+0530", b"+1030", b"-0400", b"+1100"))
