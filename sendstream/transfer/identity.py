"""A stream's identity, and checking one that a peer or a token claims.

The identity of a stream is what its first command says (the subvolume's
UUID and ctransid, a snapshot's parent) and a digest of its first bytes: a
sender announces it in its session hello, a resume token names it. What a
peer or a token claims is parsed with limits (UTF-8, JSON nested at most
:data:`MAX_DEPTH` deep, checked before it is decoded) and every field's type
and range checked: it returns typed values or raises
:class:`~sendstream.errors.SessionError`, never anything else.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from typing import Any, TypedDict, cast

from .. import errors as e
from ..codec.decoder import Decoder
from ..codec.events import NEED_DATA, StreamHeader
from ..errors import SessionError
from ..format.command import Command

MAX_DEPTH = 4  # the hello and the token are 2 deep
MAX_OFFSET = (1 << 63) - 1
MAX_U64 = (1 << 64) - 1

# The stream identity (:func:`sendstream.session.stream_identity`): field -> type; None is allowed
# where the first command does not say (a damaged or short stream), except for the digest of the prefix.
IDENTITY_FIELDS: dict[str, type] = {
    "version": int,
    "command": str,
    "uuid": str,
    "ctransid": int,
    "parent_uuid": str,
    "parent_ctransid": int,
    "prefix": int,
    "sha256": str,
}
_REQUIRED = ("prefix", "sha256")


class Made(TypedDict):
    """What a stream's first command says it makes (None where it does not say): :func:`made_by`."""

    command: str | None
    uuid: str | None
    ctransid: int | None
    parent_uuid: str | None
    parent_ctransid: int | None


class Identity(Made):
    """A stream's identity (:func:`stream_identity`; the fields of :data:`IDENTITY_FIELDS`): its version,
    what its first command makes, and the length and SHA-256 of the prefix that says it."""

    version: int | None
    prefix: int
    sha256: str


_STRUCTURE = re.compile(rb'[\[\]{}"]')
_STRING_REST = re.compile(rb'(?:[^"\\]|\\.)*"', re.DOTALL)


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped: a peer's words must not drive our terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def shown_bytes(data: bytes, limit: int = 60) -> str:
    return repr(data[:limit]) + ("..." if len(data) > limit else "")


def json_depth(data: bytes) -> int:
    """How deeply arrays and objects nest in ``data`` (strings skipped); linear in its length."""
    depth = deepest = 0
    pos = 0
    while match := _STRUCTURE.search(data, pos):
        c = match.group()
        pos = match.end()
        if c == b'"':
            rest = _STRING_REST.match(data, pos)
            if rest is None:
                break  # an unterminated string: json.loads refuses it
            pos = rest.end()
        elif c in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def load_json(data: bytes, what: str, max_depth: int = MAX_DEPTH) -> Any:
    """``data`` as JSON: UTF-8, nested at most ``max_depth`` deep; :class:`SessionError` otherwise."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = shown_bytes(data[exc.start : exc.start + 8])
        raise SessionError(f"{what} is not UTF-8 (at byte {exc.start}: {bad})") from None
    if (depth := json_depth(data)) > max_depth:
        raise SessionError(f"{what} nests JSON {depth} deep, more than {max_depth}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, and integers of more than 4300 digits
        raise SessionError(f"{what} is not valid JSON ({exc})") from None


def checked_integer(value: Any, what: str, maximum: int = MAX_OFFSET) -> int:
    if type(value) is not int or not 0 <= value <= maximum:
        raise SessionError(f"{what} must be an integer from 0 to {maximum}, not {short_json(value)}")
    return value


def short_json(value: Any) -> str:
    """``value`` for a message, short; what JSON cannot say (an XML element botocore made) by its type."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        text = repr(value)
    else:
        text = json.dumps(value, default=lambda v: f"<{type(v).__name__}>")
    return printable(text if len(text) <= 60 else text[:60] + "...")


def check_identity(value: Any, what: str = "the stream identity") -> Identity:
    """A stream identity: an object of exactly :data:`IDENTITY_FIELDS`, each of its type or null."""
    if not isinstance(value, dict):
        raise SessionError(f"{what} must be a JSON object, not {short_json(value)}")
    if set(value) != set(IDENTITY_FIELDS):
        missing = ", ".join(sorted(set(IDENTITY_FIELDS) - set(value))) or "none"
        extra = short_json(sorted(set(value) - set(IDENTITY_FIELDS)))
        raise SessionError(f"{what} has the wrong fields (missing: {missing}; unknown: {extra})")
    for field, kind in IDENTITY_FIELDS.items():
        item = value[field]
        if item is None and field not in _REQUIRED:
            continue
        if kind is int:
            checked_integer(item, f"{what}: {field}", MAX_U64)
        elif not isinstance(item, str):
            raise SessionError(f"{what}: {field} must be a string, not {short_json(item)}")
    return cast(Identity, value)  # its fields and their types, checked


def first_command(prefix: bytes) -> tuple[int | None, Command | None]:
    """The version and the first command of the stream that starts with ``prefix`` (None where it has none)."""
    version = None
    decoder = Decoder()
    decoder.receive_data(prefix)
    try:
        while (event := decoder.next_event()) is not NEED_DATA:
            if isinstance(event, StreamHeader):
                version = event.version
            elif isinstance(event, Command):
                return version, event
            else:
                break
    except e.SendStreamError:
        pass
    return version, None


def snapshot_name(prefix: bytes) -> str:
    """The name of the subvolume the stream that starts with ``prefix`` makes ("" when it does not say)."""
    command = first_command(prefix)[1]
    return os.fsdecode(command.get("path", b"")) if command is not None else ""


def made_by(command: Command | None) -> Made:
    """What a stream's first ``command`` says it makes: ``command``, ``uuid``, ``ctransid``, ``parent_uuid``,
    ``parent_ctransid`` (None where it does not say)."""
    ident = Made(command=None, uuid=None, ctransid=None, parent_uuid=None, parent_ctransid=None)
    if command is not None:
        ident["command"] = command.name
        values = command.values()
        if "uuid" in values:
            ident["uuid"] = str(values["uuid"])
        if "ctransid" in values:
            ident["ctransid"] = values["ctransid"]
        if command.name == "snapshot":
            ident["parent_uuid"] = str(values.get("clone_uuid"))
            ident["parent_ctransid"] = values.get("clone_ctransid")
    return ident


def stream_identity(prefix: bytes) -> Identity:
    """The identity of the stream that starts with ``prefix`` (its first command, and a digest)."""
    version, command = first_command(prefix)
    return {"version": version, **made_by(command), "prefix": len(prefix), "sha256": hashlib.sha256(prefix).hexdigest()}


def describe(identity: Made) -> str:
    """``snapshot of UUID at ctransid N (parent UUID)``: an identity for a person."""
    text = f"{identity.get('command')} of {identity.get('uuid')} at ctransid {identity.get('ctransid')}"
    if identity.get("parent_uuid"):
        text += f" (parent {identity['parent_uuid']})"
    return text
