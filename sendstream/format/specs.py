"""The value types of the layout tables, shared by :mod:`.format` and :mod:`.layout`."""

from __future__ import annotations

from typing import NamedTuple


class Timespec(NamedTuple):
    """A btrfs timespec: seconds since the epoch and nanoseconds."""

    sec: int
    nsec: int


class AttributeSpec(NamedTuple):
    """One TLV attribute type of send.h; ``size`` is None for variable-length values."""

    number: int
    name: str
    kind: str
    version: int
    size: int | None


class CommandSpec(NamedTuple):
    """One command of send.h with the attributes btrfs-progs requires."""

    number: int
    name: str
    version: int
    required: tuple[int, ...]
    optional: tuple[int, ...] = ()
