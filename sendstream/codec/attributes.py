"""A command's attributes: the walk over its TLVs and every rule of the stream's version.

The framer calls :func:`check_attributes` for a command it checks itself,
and :func:`split_attributes` for one the native scanner already found clean.
"""

from __future__ import annotations

from dataclasses import dataclass

from .. import errors as e
from ..format.layout import (
    A_DATA,
    ATTRIBUTES,
    COMMANDS,
    MAX_ATTRIBUTE,
    MAX_COMMAND,
    MAX_VERSION,
    TLV_HEADER,
    TLV_HEADER_SIZE,
    TLV_TYPE,
    attribute_name,
    command_name,
)

Attributes = list[tuple[int, memoryview | bytes]]

# Per version: known attribute number -> fixed value size (None: variable).
ATTRIBUTE_SIZES: dict[int, dict[int, int | None]] = {
    v: {n: a.size for n, a in ATTRIBUTES.items() if n <= MAX_ATTRIBUTE[v]} for v in range(1, MAX_VERSION + 1)
}
# Per version: known command number -> required attribute numbers.
REQUIRED_ATTRIBUTES: dict[int, dict[int, frozenset[int]]] = {
    v: {n: frozenset(s.required) for n, s in COMMANDS.items() if n <= MAX_COMMAND[v]} for v in range(1, MAX_VERSION + 1)
}
# Names and paths: the kernel never writes a NUL in them.
_STRINGS = frozenset(n for n, a in ATTRIBUTES.items() if a.kind == "string")
_unpack_tlv = TLV_HEADER.unpack_from
_unpack_type = TLV_TYPE.unpack_from


@dataclass(frozen=True, slots=True)
class Where:
    """Where a command sits, for its errors: window origin and position, index, number, stream version."""

    origin: int
    pos: int
    index: int
    cmd: int
    version: int = MAX_VERSION

    def error(
        self,
        cls: type[e.FormatError],
        message: str,
        at: int,
        attr: int | None,
        expected: object,
        actual: object = None,
    ) -> e.FormatError:
        return cls(
            message,
            offset=self.origin + at,
            index=self.index,
            command=command_name(self.cmd),
            attribute=None if attr is None else attribute_name(attr, self.version),
            expected=expected,
            actual=actual,
        )


def split_attributes(
    mv: memoryview, p: int, end: int, version: int, index: int, where: Where | None, offsets: list[int] | None = None
) -> Attributes:
    """The TLVs of the payload ``mv[p:end]`` of command ``index``, in order; ``offsets`` gets where each starts.

    ``where`` is None for commands the native scanner found clean, which
    cannot fail here."""
    data_rest = version >= 2
    attrs: Attributes = []
    while p < end:
        if offsets is not None:
            offsets.append(p)
        if data_rest and end - p >= 2 and _unpack_type(mv, p)[0] == A_DATA:
            attrs.append((A_DATA, mv[p + 2 : end]))
            break
        if end - p < TLV_HEADER_SIZE:
            raise (where or Where(0, p, index, 0)).error(
                e.BadAttribute,
                "the command ends inside an attribute header",
                p,
                None,
                f"{TLV_HEADER_SIZE} bytes",
                end - p,
            )
        t, n = _unpack_tlv(mv, p)
        if p + TLV_HEADER_SIZE + n > end:
            raise (where or Where(0, p, index, 0)).error(
                e.BadAttribute, "the attribute runs past the end of its command", p, t,
                f"at most {end - p - TLV_HEADER_SIZE} bytes", n,
            )  # fmt: skip
        p += TLV_HEADER_SIZE
        attrs.append((t, mv[p : p + n]))
        p += n
    return attrs


def check_attributes(
    mv: memoryview,
    p: int,
    end: int,
    where: Where,
    required: frozenset[int],
    *,
    strict: bool,
    check_names: bool,
    problems: e.ProblemLog,
    warnings: e.ProblemLog,
) -> Attributes:
    """The TLVs of the payload ``mv[p:end]``, with every rule of ``where.version`` checked.

    Unknown attributes are errors when ``strict``, else ``problems``; with
    ``check_names``, a NUL in a name or path is one of the ``warnings``.
    Problems and warnings are recorded only once the whole command passed:
    a command that fails may be checked again when more input comes (a
    restart may begin in it), and must not be counted twice.
    """
    version = where.version
    offsets: list[int] = []
    attrs = split_attributes(mv, p, end, version, where.index, where, offsets)
    sizes = ATTRIBUTE_SIZES[version]
    seen: set[int] = set()
    found: list[e.FormatError] = []
    counted = 0
    unsafe: list[e.FormatError] = []
    for (t, value), at in zip(attrs, offsets, strict=True):
        if t in seen:
            raise where.error(e.DuplicateAttribute, "the attribute appears twice", at, t, "each attribute once")
        seen.add(t)
        if t not in sizes:
            if not strict and problems.counts_only(e.UnknownAttribute):
                counted += 1
                continue
            problem = where.error(
                e.UnknownAttribute, f"attribute type {t} is not defined in stream version {version}", at, t,
                f"1 to {MAX_ATTRIBUTE[version]}", t,
            )  # fmt: skip
            if strict:
                raise problem
            found.append(problem)
        elif (size := sizes[t]) is not None and len(value) != size:
            raise where.error(e.AttributeSize, "the value has the wrong size", at, t, f"{size} bytes", len(value))
        elif check_names and t in _STRINGS and b"\0" in bytes(value):
            unsafe.append(
                where.error(
                    e.UnsafeValue, "it holds a NUL byte, where btrfs receive would cut it and use another path",
                    at, t, "no NUL byte", f"a NUL at byte {bytes(value).index(0)}",
                )
            )  # fmt: skip
    if not required <= seen:
        raise where.error(
            e.MissingAttribute, "a required attribute is absent", where.pos, min(required - seen), "present"
        )
    for problem in found:
        problems.append(problem)
    problems.tally(counted)
    for warning in unsafe:
        warnings.append(warning)
    return attrs
