"""The command line's own parameter types: sizes (``300M``) and ``zstd[:LEVEL]``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from ..transport.compression import Tally


class ByteSize(click.ParamType):  # type: ignore[type-arg]
    """A size in bytes: ``123456``, ``300M``, ``1.5G``, ``2TiB`` (K, M, G, T are powers of 1024)."""

    name = "size"

    def __init__(self, minimum: int = 0) -> None:
        self.minimum = minimum

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int:
        from ..io.settings import parse_size

        if isinstance(value, int):
            return value
        try:
            size = parse_size(str(value))
        except ValueError:
            self.fail(f"expected a size such as 123456, 300M or 1.5G, got {value!r}", param, ctx)
        if size < self.minimum:
            self.fail(f"expected a size of at least {self.minimum}, got {value!r}", param, ctx)
        return size


class Compression(click.ParamType):  # type: ignore[type-arg]
    """``zstd`` or ``zstd:LEVEL``: a new :class:`~sendstream.transport.compression.Tally` of that level."""

    name = "compression"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Tally:
        from ..transport.compression import Tally, parse_choice

        if isinstance(value, Tally):
            return value
        try:
            return Tally(parse_choice(str(value)))
        except ValueError as exc:
            self.fail(str(exc), param, ctx)
