"""The session protocol's lines (:mod:`sendstream.session`), parsed with limits.

Every parser here reads bytes a peer chose: it returns typed values or
raises :class:`SessionError`, never anything else. A line is at most
:data:`MAX_LINE` bytes (the reader enforces it), its JSON must be UTF-8 and
at most :data:`MAX_DEPTH` deep (checked before it is decoded), and every
field's type and range is checked. The stream identity is checked the same
way where a resume token carries it (:func:`sendstream.resume.read_token`).
"""

from __future__ import annotations

import json
import re
from typing import Any

from ...errors import SessionError

MAGIC = b"sendstream-session"
VERSION = 1
HEAD = MAGIC + b" %d " % VERSION
STATUS_PREFIX = b"sendstream-status "
MAX_LINE = 64 << 10
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

_STRUCTURE = re.compile(rb'[\[\]{}"]')
_STRING_REST = re.compile(rb'(?:[^"\\]|\\.)*"', re.DOTALL)
_DIGITS = re.compile(rb"[0-9]{1,20}")
_CODE = re.compile(rb"([0-9]{1,3})(?: |$)")


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped: a peer's words must not drive our terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _shown(data: bytes, limit: int = 60) -> str:
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
        bad = _shown(data[exc.start : exc.start + 8])
        raise SessionError(f"{what} is not UTF-8 (at byte {exc.start}: {bad})") from None
    if (depth := json_depth(data)) > max_depth:
        raise SessionError(f"{what} nests JSON {depth} deep, more than {max_depth}")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError, and integers of more than 4300 digits
        raise SessionError(f"{what} is not valid JSON ({exc})") from None


def _integer(value: Any, what: str, maximum: int = MAX_OFFSET) -> int:
    if type(value) is not int or not 0 <= value <= maximum:
        raise SessionError(f"{what} must be an integer from 0 to {maximum}, not {_short(value)}")
    return value


def _short(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, (int, float)) or isinstance(value, bool) else repr(value)
    return printable(text if len(text) <= 60 else text[:60] + "...")


def check_identity(value: Any, what: str = "the stream identity") -> dict[str, Any]:
    """A stream identity: an object of exactly :data:`IDENTITY_FIELDS`, each of its type or null."""
    if not isinstance(value, dict):
        raise SessionError(f"{what} must be a JSON object, not {_short(value)}")
    if set(value) != set(IDENTITY_FIELDS):
        missing = ", ".join(sorted(set(IDENTITY_FIELDS) - set(value))) or "none"
        extra = _short(sorted(set(value) - set(IDENTITY_FIELDS)))
        raise SessionError(f"{what} has the wrong fields (missing: {missing}; unknown: {extra})")
    for field, kind in IDENTITY_FIELDS.items():
        item = value[field]
        if item is None and field not in _REQUIRED:
            continue
        if kind is int:
            _integer(item, f"{what}: {field}", MAX_U64)
        elif not isinstance(item, str):
            raise SessionError(f"{what}: {field} must be a string, not {_short(item)}")
    return value


def _head(line: bytes, who: str) -> bytes:
    """The JSON after ``sendstream-session 1 ``."""
    if not line.startswith(MAGIC + b" "):
        raise SessionError(f"{who} does not speak the session protocol (it sent {_shown(line, 40)})")
    if not line.startswith(HEAD):
        version = line[len(MAGIC) + 1 :].split(b" ", 1)[0]
        raise SessionError(f"session protocol version {_shown(version, 20)} is not {VERSION}")
    return line[len(HEAD) :].rstrip(b"\n")


def parse_hello(line: bytes) -> dict[str, Any]:
    """The sender's hello: the identity of its stream."""
    hello = load_json(_head(line, "the sender"), "the session hello")
    if not isinstance(hello, dict):
        raise SessionError(f"the session hello must be a JSON object, not {_short(hello)}")
    if "stream" not in hello:
        raise SessionError("the session hello has no stream identity")
    return check_identity(hello["stream"], "the session hello's stream")


def parse_answer(line: bytes) -> tuple[int, int]:
    """The receiver's answer to the hello: ``(verified, resume)``."""
    answer = load_json(_head(line, "the receiver"), "the receiver's answer")
    if not isinstance(answer, dict):
        raise SessionError(f"the receiver's answer must be a JSON object, not {_short(answer)}")
    verified = _integer(answer.get("verified"), "the receiver's answer: verified")
    resume = _integer(answer.get("resume"), "the receiver's answer: resume")
    if resume < verified:
        raise SessionError(f"the receiver's answer resumes at {resume}, before its verified offset {verified}")
    return verified, resume


def parse_ack(line: bytes) -> int:
    """``ack V``: the receiver's verified offset."""
    digits = line[4:].rstrip(b"\n")
    if not line.startswith(b"ack ") or not _DIGITS.fullmatch(digits):
        raise SessionError(f"malformed acknowledgement from the receiver: {_shown(line)}")
    return _integer(int(digits), "the receiver's acknowledgement")


def parse_status(line: bytes) -> tuple[int, str]:
    """``sendstream-status CODE MESSAGE``: CODE is 0-255 in ASCII digits."""
    rest = line[len(STATUS_PREFIX) :].rstrip(b"\n") if line.startswith(STATUS_PREFIX) else b""
    match = _CODE.match(rest)
    if match is None or int(match.group(1)) > 255:
        raise SessionError(f"malformed status line from the receiver: {_shown(line)}")
    return int(match.group(1)), printable(rest[match.end() :].decode("utf-8", "replace"))
