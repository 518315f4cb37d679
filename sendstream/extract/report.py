"""What an extraction did: the subvolumes, the skips (kept bounded), the counts."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from uuid import UUID

from ..analysis.statistics import Statistics
from ..format.command import Command
from ..render.dump import escape

__all__ = ["SKIPS_KEPT", "SKIP_GROUPS_MAX", "ExtractReport", "Skip", "SkipGroup", "Skipped", "Subvolume", "show"]

# Skips kept per group, groups kept, and the length of a group's kind (ExtractReport).
SKIPS_KEPT = 3
SKIP_GROUPS_MAX = 64
_SKIP_KIND_MAX = 200


def show(raw: bytes) -> str:
    """A name of the stream as messages show it (escaped as the dump does)."""
    return escape(raw).decode("ascii", "backslashreplace")


@dataclasses.dataclass(frozen=True, slots=True)
class Skipped:
    """A command (or part of one) not applied, and why; extraction went on."""

    offset: int
    index: int
    command: str
    path: bytes
    reason: str

    def __str__(self) -> str:
        return f"offset {self.offset}, command #{self.index} ({self.command}), path '{show(self.path)}': {self.reason}"


# How a command's handler reports a skip: the command, the path it names, the reason.
Skip = Callable[[Command, bytes, str], None]


@dataclasses.dataclass(slots=True)
class Subvolume:
    """A subvolume the input held, and where it went."""

    kind: str  # "subvol" (full) or "snapshot" (incremental)
    path: bytes
    uuid: UUID
    parent_uuid: UUID | None
    directory: str
    onto_empty: bool = False  # an incremental onto an empty DIR: taken as the extraction of an empty parent


@dataclasses.dataclass(slots=True)
class SkipGroup:
    """The skips of one command and kind of reason: how many, and the first few."""

    kept: list[Skipped] = dataclasses.field(default_factory=list)
    count: int = 0
    other: bool = False  # every kind past the first SKIP_GROUPS_MAX, together


@dataclasses.dataclass(slots=True)
class ExtractReport:
    """What an extraction did: subvolumes, statistics per stream, skips.

    Skips are counted (``skip_count``) and grouped by command and kind of
    reason (the reason up to its first ':'); ``skipped`` keeps the first
    ``SKIPS_KEPT`` of each group, in order, and past ``SKIP_GROUPS_MAX``
    groups every other kind goes into one more group. So what is kept is
    bounded whatever the input (20 MB of unknown commands are 2 million
    skips); :class:`Extractor`'s ``on_skip`` sees every one.
    """

    subvolumes: list[Subvolume] = dataclasses.field(default_factory=list)
    statistics: Statistics = dataclasses.field(default_factory=Statistics)
    skipped: list[Skipped] = dataclasses.field(default_factory=list)
    skip_count: int = 0
    applied: int = 0
    data_bytes: int = 0  # file bytes written (WRITE, ENCODED_WRITE unencoded) and cloned
    copied_bytes: int = 0  # data bytes copied (clones, copies of parents) where no reflink was possible
    _groups: dict[tuple[str, str], SkipGroup] = dataclasses.field(default_factory=dict, init=False, repr=False)
    _other: SkipGroup = dataclasses.field(default_factory=lambda: SkipGroup(other=True), init=False, repr=False)

    def add_skip(self, skipped: Skipped) -> None:
        """Count one skip, and keep it if it is among the first of its group."""
        self.skip_count += 1
        # The kind can hold stream text (an xattr name, a path): cut, it stays a short key.
        key = (skipped.command, skipped.reason.split(":", 1)[0][:_SKIP_KIND_MAX])
        group = self._groups.get(key)
        if group is None:
            if len(self._groups) < SKIP_GROUPS_MAX:
                group = self._groups[key] = SkipGroup()
            else:
                group = self._other
        group.count += 1
        if len(group.kept) < SKIPS_KEPT:
            group.kept.append(skipped)
            self.skipped.append(skipped)

    def skip_groups(self) -> list[SkipGroup]:
        """The groups of skips in the order of their first skip, the other kinds last."""
        return [*self._groups.values(), *((self._other,) if self._other.count else ())]

    def summary(self) -> str:
        """One line: the subvolumes, commands applied, file bytes, skips."""
        subvolumes = ", ".join(
            f"'{show(s.path)}' ({'full' if s.kind == 'subvol' else f'incremental on {s.parent_uuid}'}) "
            f"into {s.directory}{' (empty: its parent was empty)' if s.onto_empty else ''}"
            for s in self.subvolumes
        )
        return (
            f"extracted {subvolumes or 'nothing'}: {self.applied} commands applied, "
            f"{self.data_bytes} bytes of file data written or cloned, "
            f"{self.skip_count} skipped"
        )
