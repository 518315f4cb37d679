"""The session protocol's lines (:mod:`sendstream.session`), parsed with limits.

Every parser here reads bytes a peer chose: it returns typed values or
raises :class:`SessionError`, never anything else. A line is at most
:data:`MAX_LINE` bytes (the reader enforces it), its JSON must be UTF-8 and
at most :data:`MAX_DEPTH` deep (checked before it is decoded), and every
field's type and range is checked. The stream identity is checked the same
way where a resume token carries it (:func:`sendstream.resume.read_token`).
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import SessionError
from ..transfer.identity import Identity, check_identity, checked_integer, load_json, printable, short_json, shown_bytes

MAGIC = b"sendstream-session"
VERSION = 1
HEAD = MAGIC + b" %d " % VERSION
STATUS_PREFIX = b"sendstream-status "
OFFER = b"sendstream-compress "
MAX_LINE = 64 << 10
_DIGITS = re.compile(rb"[0-9]{1,20}")
_HEX64 = re.compile(r"[0-9a-f]{64}")
_CODE = re.compile(rb"([0-9]{1,3})(?: |$)")
_OFFER = re.compile(rb"sendstream-compress ([a-z0-9]{1,16})\n")
MAX_SHOWN = 64  # of a malformed offer or answer, what its error shows


def _head(line: bytes, who: str) -> bytes:
    """The JSON after ``sendstream-session 1 ``."""
    if not line.startswith(MAGIC + b" "):
        raise SessionError(f"{who} does not speak the session protocol (it sent {shown_bytes(line, 40)})")
    if not line.startswith(HEAD):
        version = line[len(MAGIC) + 1 :].split(b" ", 1)[0]
        raise SessionError(
            f"{who} speaks session protocol version {shown_bytes(version, 20)}, this end version {VERSION} "
            "(a newer sendstream speaks every older version: upgrade the older end)"
        )
    return line[len(HEAD) :].rstrip(b"\n")


def parse_hello(line: bytes) -> Identity:
    """The sender's hello: the identity of its stream."""
    hello = load_json(_head(line, "the sender"), "the session hello")
    if not isinstance(hello, dict):
        raise SessionError(f"the session hello must be a JSON object, not {short_json(hello)}")
    if "stream" not in hello:
        raise SessionError("the session hello has no stream identity")
    return check_identity(hello["stream"], "the session hello's stream")


def parse_answer(line: bytes) -> tuple[int, int, tuple[int, str] | None]:
    """The receiver's answer to the hello: ``(verified, resume, ledger)``; ``ledger`` is the command count
    and ledger (:mod:`sendstream.transfer.ledger`) of the stream at ``resume``, when the receiver gives them
    (one that kept an earlier run of this transfer)."""
    answer = load_json(_head(line, "the receiver"), "the receiver's answer")
    if not isinstance(answer, dict):
        raise SessionError(f"the receiver's answer must be a JSON object, not {short_json(answer)}")
    verified = checked_integer(answer.get("verified"), "the receiver's answer: verified")
    resume = checked_integer(answer.get("resume"), "the receiver's answer: resume")
    if resume < verified:
        raise SessionError(f"the receiver's answer resumes at {resume}, before its verified offset {verified}")
    ledger = answer.get("ledger")
    if ledger is None:
        return verified, resume, None
    if (
        not isinstance(ledger, dict)
        or not isinstance(ledger.get("digest"), str)
        or not _HEX64.fullmatch(ledger["digest"])
    ):
        raise SessionError(f"the receiver's answer: ledger must be {{commands, digest}}, not {short_json(ledger)}")
    return (
        verified,
        resume,
        (checked_integer(ledger.get("commands"), "the receiver's ledger: commands"), ledger["digest"]),
    )


def parse_listed(data: bytes) -> dict[str, Any]:
    """One snapshot of the service's list: a JSON object of names, UUIDs, numbers and times."""
    snapshot = load_json(data.rstrip(b"\n"), "a snapshot of the list")
    if not isinstance(snapshot, dict) or not all(
        isinstance(v, (str, int, type(None))) and not isinstance(v, bool) for v in snapshot.values()
    ):
        raise SessionError(f"a snapshot of the list must be a flat JSON object, not {short_json(snapshot)}")
    return snapshot


def parse_ack(line: bytes) -> int:
    """``ack V``: the receiver's verified offset."""
    digits = line[4:].rstrip(b"\n")
    if not line.startswith(b"ack ") or not _DIGITS.fullmatch(digits):
        raise SessionError(f"malformed acknowledgement from the receiver: {shown_bytes(line)}")
    return checked_integer(int(digits), "the receiver's acknowledgement")


def parse_status(line: bytes) -> tuple[int, str]:
    """``sendstream-status CODE MESSAGE``: CODE is 0-255 in ASCII digits."""
    rest = line[len(STATUS_PREFIX) :].rstrip(b"\n") if line.startswith(STATUS_PREFIX) else b""
    match = _CODE.match(rest)
    if match is None or int(match.group(1)) > 255:
        raise SessionError(f"malformed status line from the receiver: {shown_bytes(line)}")
    return int(match.group(1)), printable(rest[match.end() :].decode("utf-8", "replace"))


def parse_offer(line: bytes, who: str) -> str:
    """``sendstream-compress METHOD``, an offer or its answer (``\\n`` included): the method."""
    match = _OFFER.fullmatch(line)
    if match is None:
        raise SessionError(f"malformed compression line from {who}: {line[:MAX_SHOWN]!r}")
    return match.group(1).decode()
