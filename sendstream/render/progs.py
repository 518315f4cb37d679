"""Whose ``btrfs receive --dump`` text ``dump`` prints: the btrfs-progs styles.

Light on purpose: the command line declares its option from these before
anything is read.
"""

from __future__ import annotations

from typing import Literal, get_args

ProgsStyle = Literal["6.2", "6.14"]
PROGS_STYLES: tuple[ProgsStyle, ...] = get_args(ProgsStyle)
DEFAULT_STYLE: ProgsStyle = "6.14"
# The btrfs-progs releases (first, last) whose text each style is, from their source history:
# 6.0.2 reads FILEATTR as 64 bits; 6.9.1 escapes clone sources, xattr names and data (31286d3b)
# and drops the commas of encoded_write (d88acfba); nothing else changed the text up to 6.19.
RELEASES: dict[ProgsStyle, tuple[str, str]] = {"6.2": ("6.0.2", "6.9.0"), "6.14": ("6.9.1", "6.19")}


def matches(style: ProgsStyle) -> str:
    """The releases whose text ``style`` is, in words."""
    first, last = RELEASES[style]
    return f"btrfs-progs {first} to {last}"
