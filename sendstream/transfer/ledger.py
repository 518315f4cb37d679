"""Ledgers: where a stream stands at a command boundary, as two runs of it agree.

A :class:`Ledger` digests the length and CRC of every command written (and
the version of every stream header), in order, so two runs of the same
stream agree on it up to any command boundary, and a different stream does
not; a :class:`Checkpoint` is a stream's identity, an offset, the number of
commands before it and the ledger there. Resume tokens
(:mod:`sendstream.transfer.tokens`) carry checkpoints; with one, a Ledger checks a
stream read again against it.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..errors import PrefixDiffers
from ..format.layout import COMMAND_HEADER_SIZE, STREAM_HEADER_SIZE

if TYPE_CHECKING:
    from .identity import Identity

_HEADER_MARK = 0xFFFFFFFF  # in the lengths digest: a stream header (no command is that long)


@dataclass(frozen=True)
class Checkpoint:
    """Where a receiver stands: a command boundary of one stream."""

    stream: Identity
    offset: int
    commands: int
    ledger: str


class Ledger:
    """The digest of every command written so far (length and CRC, in order).

    With ``expect``, the digest is compared when the written offset reaches
    ``expect.offset``, which must be a command boundary.
    """

    def __init__(self, expect: Checkpoint | None = None) -> None:
        self.offset = 0
        self.commands = 0
        self._lens = hashlib.sha256()
        self._crcs = hashlib.sha256()
        self._expect = expect
        self._whose = "the token's"  # whose checkpoint it is, for errors
        # where the last addition began, to check a checkpoint inside it: offset, commands, both
        # digests' states, and its command lengths (None for a stream header) and CRCs
        self._mark: tuple[int, int, Any, Any, array[int] | None, array[int]] | None = None
        if expect is not None and expect.offset == 0:
            self._check()

    def digest(self) -> str:
        return _digest(self._lens, self._crcs)

    def expect(self, checkpoint: Checkpoint, whose: str) -> None:
        """Check the stream against ``checkpoint`` (``whose`` it is, for errors) where the stream reaches its
        offset, or now, when the last addition already went past it."""
        self._whose = whose
        if checkpoint.offset >= self.offset:
            self._expect = checkpoint
            if checkpoint.offset == self.offset:
                self._check()
            return
        mark = self._mark
        if mark is None or checkpoint.offset < mark[0]:
            raise PrefixDiffers(
                f"the stream went on past offset {checkpoint.offset} before {whose} checkpoint there came",
                offset=checkpoint.offset,
                index=self.commands,
                expected=f"offset {checkpoint.offset} within the last {self.offset - (mark[0] if mark else 0)} bytes",
                actual=f"offset {self.offset}",
            )
        reached, commands, digest = self._back(checkpoint.offset)
        if reached != checkpoint.offset:
            self._expect = checkpoint
            self._differs(f"a stream header or command boundary at offset {checkpoint.offset}", reached)
        self._compare(checkpoint, commands, digest)

    def at(self, offset: int) -> tuple[int, str]:
        """The command count and digest where the stream stood at ``offset``: where it is now, or a
        command boundary within the last addition."""
        if offset == self.offset:
            return self.commands, self.digest()
        reached, commands, digest = self._back(offset) if self._mark and self._mark[0] <= offset else (-1, 0, "")
        if reached != offset:
            raise ValueError(f"offset {offset} is no command boundary of the last {self.offset - offset} bytes")
        return commands, digest

    def _back(self, offset: int) -> tuple[int, int, str]:
        """From the start of the last addition, the first boundary at or past ``offset``: it, the
        commands before it and the digest there."""
        assert self._mark is not None
        reached, commands, lens_state, crcs_state, lens, crcs = self._mark
        k = 0
        while reached < offset and lens is not None:
            reached += lens[k] + COMMAND_HEADER_SIZE
            k += 1
        lens_state, crcs_state = lens_state.copy(), crcs_state.copy()
        if k:
            assert lens is not None
            lens_state.update(_little_endian(lens[:k]))
            crcs_state.update(_little_endian(crcs[:k]))
        return reached, commands + k, _digest(lens_state, crcs_state)

    def header(self, version: int) -> None:
        self._add(array("I", [_HEADER_MARK]), array("I", [version]), STREAM_HEADER_SIZE, 0)

    def run(self, lens: array[int], crcs: array[int]) -> None:
        """Commands about to be written: their payload lengths and CRCs."""
        size = sum(lens) + COMMAND_HEADER_SIZE * len(lens)
        target = self._expect.offset if self._expect is not None else -1
        if self.offset < target < self.offset + size:
            k, acc = 0, self.offset
            while acc < target:
                acc += lens[k] + COMMAND_HEADER_SIZE
                k += 1
            if acc != target:
                start = acc - lens[k - 1] - COMMAND_HEADER_SIZE
                self._differs(f"a command boundary at offset {target}", f"a command from offset {start}")
            first = acc - self.offset
            self._add(lens[:k], crcs[:k], first, k)
            lens, crcs, size = lens[k:], crcs[k:], size - first
        self._add(lens, crcs, size, len(lens))

    def finish(self) -> None:
        """The stream ended: fail if it never reached the expected offset."""
        if self._expect is not None:
            self._differs(f"at least {self._expect.offset} bytes", f"the stream ends at {self.offset}")

    def _add(self, lens: array[int], crcs: array[int], size: int, commands: int) -> None:
        self._mark = (
            self.offset,
            self.commands,
            self._lens.copy(),
            self._crcs.copy(),
            lens if commands else None,
            crcs,
        )
        if lens:
            self._lens.update(_little_endian(lens))
            self._crcs.update(_little_endian(crcs))
        self.offset += size
        self.commands += commands
        if self._expect is not None and self.offset >= self._expect.offset:
            if self.offset > self._expect.offset:
                self._differs(f"a stream header or command boundary at offset {self._expect.offset}", self.offset)
            self._check()

    def _check(self) -> None:
        assert self._expect is not None
        expect, self._expect = self._expect, None
        self._compare(expect, self.commands, self.digest())

    def _compare(self, expect: Checkpoint, commands: int, digest: str) -> None:
        if (commands, digest) != (expect.commands, expect.ledger):
            raise PrefixDiffers(
                f"the stream differs from {self._whose} before offset {expect.offset}: "
                "other command lengths or CRCs (not the same snapshot, or a changed file)",
                offset=expect.offset,
                index=commands,
                expected=f"{expect.commands} commands with ledger {expect.ledger[:16]}",
                actual=f"{commands} commands with ledger {digest[:16]}",
            )

    def _differs(self, expected: str, actual: object) -> None:
        assert self._expect is not None
        offset = self._expect.offset
        self._expect = None
        raise PrefixDiffers(
            f"the stream differs from {self._whose}: offset {offset} is not where it was",
            offset=offset,
            index=self.commands,
            expected=expected,
            actual=actual,
        )


def _digest(lens: Any, crcs: Any) -> str:
    return hashlib.sha256(b"sendstream-ledger-1" + lens.digest() + crcs.digest()).hexdigest()


def _little_endian(values: array[int]) -> bytes:
    """The 32-bit values as little-endian bytes: tokens travel between machines."""
    if sys.byteorder == "big":
        values = array(values.typecode, values)
        values.byteswap()
    return values.tobytes()
