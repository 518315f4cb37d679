"""The command model: a command number and its attributes, in stream order."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, TypeVar, overload

from ..errors import AttributeNotFound, shown
from .layout import (
    ATTRIBUTE_NUMBERS,
    ATTRIBUTES,
    COMMAND_NUMBERS,
    COMMANDS,
    MAX_VERSION,
    attribute_name,
    attribute_spec,
    command_name,
    decode_value,
    encode_value,
)
from .specs import CommandSpec, Timespec

if TYPE_CHECKING:
    import uuid

    from ._layout import BytesAttribute, DataAttribute, IntAttribute, TimespecAttribute, UuidAttribute

T = TypeVar("T")

_MISSING: Any = object()


class Command:
    """One command of a send stream.

    ``attributes`` keeps every TLV as ``(type, raw value)`` in stream order so
    that writing the command again gives the same bytes. Values are raw
    memoryviews into the decoded buffer; :meth:`get` and :meth:`values` give
    them typed. ``attributes`` is None for a command number this library does
    not know: its ``payload`` is then kept raw.

    ``offset`` (of the command header in the input), ``index`` (0-based
    among the commands of the input), ``crc`` and ``version`` (of the stream
    it is in) are set by the decoder. An attribute that ``version`` does not
    define is unknown there, whatever later versions make of its number: it
    stays raw (``unknown(N)``), never decoded with another version's size.
    """

    __slots__ = ("attributes", "cmd", "crc", "index", "offset", "payload", "version")

    def __init__(
        self,
        cmd: int,
        attributes: list[tuple[int, memoryview | bytes]] | None,
        *,
        payload: memoryview | bytes | None = None,
        offset: int = -1,
        index: int = -1,
        crc: int | None = None,
        version: int = MAX_VERSION,
    ) -> None:
        self.cmd = cmd
        self.attributes = attributes
        self.payload = payload
        self.offset = offset
        self.index = index
        self.crc = crc
        self.version = version

    @classmethod
    def build(cls, name: str, attributes: Iterable[tuple[str, Any]] | Mapping[str, Any] = ()) -> Command:
        """Make a command from its name and typed values, in the order given."""
        items = attributes.items() if isinstance(attributes, Mapping) else attributes
        raw: list[tuple[int, memoryview | bytes]] = []
        for key, value in items:
            number = ATTRIBUTE_NUMBERS[key]
            raw.append((number, encode_value(ATTRIBUTES[number].kind, value)))
        return cls(COMMAND_NUMBERS[name], raw)

    @property
    def name(self) -> str:
        return command_name(self.cmd)

    @property
    def spec(self) -> CommandSpec | None:
        return COMMANDS.get(self.cmd)

    def raw(self, number: int) -> memoryview | bytes | None:
        """The raw value of attribute ``number`` (the last one if repeated)."""
        found = None
        for t, v in self.attributes or ():
            if t == number:
                found = v
        return found

    @overload
    def get(self, key: IntAttribute) -> int: ...
    @overload
    def get(self, key: IntAttribute, default: T) -> int | T: ...
    @overload
    def get(self, key: BytesAttribute) -> bytes: ...
    @overload
    def get(self, key: BytesAttribute, default: T) -> bytes | T: ...
    @overload
    def get(self, key: DataAttribute) -> memoryview: ...
    @overload
    def get(self, key: DataAttribute, default: T) -> memoryview | T: ...
    @overload
    def get(self, key: UuidAttribute) -> uuid.UUID: ...
    @overload
    def get(self, key: UuidAttribute, default: T) -> uuid.UUID | T: ...
    @overload
    def get(self, key: TimespecAttribute) -> Timespec: ...
    @overload
    def get(self, key: TimespecAttribute, default: T) -> Timespec | T: ...
    @overload
    def get(self, key: str | int, default: Any = ...) -> Any: ...  # a number: raw when the version lacks it

    def get(self, key: str | int, default: Any = _MISSING) -> Any:
        """The typed value of an attribute, by name or number (raw when unknown to the stream's version).

        Without ``default``, a missing attribute raises
        :class:`~sendstream.errors.AttributeNotFound` (a ``KeyError``) that lists those the command has.
        """
        if isinstance(key, str):
            number = ATTRIBUTE_NUMBERS.get(key, -1)
            value = self.raw(number) if number >= 0 and attribute_spec(number, self.version) else None
        else:
            number = key
            value = self.raw(number)
        if value is None:
            if default is _MISSING:
                has = [attribute_name(t, self.version) for t, _ in self.attributes or ()]
                raise AttributeNotFound(key, self.name, has, known=number >= 0)
            return default
        spec = attribute_spec(number, self.version)
        if spec is None:
            return value
        return decode_value(spec.kind, memoryview(value))

    def values(self) -> dict[str, Any]:
        """Every attribute typed, keyed by name (unknown ones as ``unknown(N)``)."""
        out: dict[str, Any] = {}
        for t, v in self.attributes or ():
            spec = attribute_spec(t, self.version)
            out[attribute_name(t, self.version)] = decode_value(spec.kind, memoryview(v)) if spec else v
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Command):
            return NotImplemented
        return (
            self.cmd == other.cmd
            and _freeze(self.attributes) == _freeze(other.attributes)
            and _bytes(self.payload) == _bytes(other.payload)
        )

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        where = f" @{self.offset}" if self.offset >= 0 else ""
        if self.attributes is None:
            return f"<Command {self.name}{where} raw {len(self.payload or b'')} bytes>"
        return f"<Command {self.name}{where} {self.values()!r}>"


def _bytes(v: memoryview | bytes | None) -> bytes | None:
    return None if v is None else bytes(v)


def _freeze(attrs: list[tuple[int, memoryview | bytes]] | None) -> list[tuple[int, bytes]] | None:
    return None if attrs is None else [(t, bytes(v)) for t, v in attrs]


def subvolume_of(command: Command) -> str | None:
    """What the first command of a stream says of it, as one line: ``snapshot NAME uuid=U ctransid=N
    parent_uuid=P parent_ctransid=M`` (a full stream's ``subvol`` has no parent); None for another command."""
    if command.name not in ("subvol", "snapshot") or command.attributes is None:
        return None
    values = command.values()
    text = f"{command.name} {shown(bytes(values.get('path', b''))) or '.'}"
    text += f" uuid={values.get('uuid')} ctransid={values.get('ctransid')}"
    if command.name == "snapshot":
        text += f" parent_uuid={values.get('clone_uuid')} parent_ctransid={values.get('clone_ctransid')}"
    return text
