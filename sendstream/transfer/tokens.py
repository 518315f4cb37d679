"""Resume tokens: a checkpoint of a receiver as text, authenticated with the pre-shared key.

A token is ``ssr1.`` + base64url(JSON) + ``.`` + base64url(HMAC-SHA-256): the
stream's identity, the offset of the last durable command boundary, the
number of commands before it and the ledger there. The HMAC key is derived
from the PSK, so only its holders can make one, and a token names one
stream at one boundary. A token is parsed with limits, every field checked.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from typing import Any

from ..errors import ResumeError, SessionError
from .identity import MAX_OFFSET, check_identity, load_json
from .ledger import Checkpoint

TOKEN_PREFIX = "ssr1."


_TOKEN_FIELDS = {"stream", "offset", "commands", "ledger"}


_LEDGER = re.compile("[0-9a-f]{64}")


MAX_TOKEN = 8192


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(key: bytes, payload: bytes) -> bytes:
    token_key = hmac.new(key, b"sendstream resume token 1", hashlib.sha256).digest()
    return hmac.new(token_key, payload, hashlib.sha256).digest()


def make_token(checkpoint: Checkpoint, key: bytes) -> str:
    """The checkpoint as text, authenticated with ``key`` (the pre-shared key)."""
    fields = {"stream": checkpoint.stream, "offset": checkpoint.offset, "commands": checkpoint.commands}
    payload = json.dumps({**fields, "ledger": checkpoint.ledger}, sort_keys=True, separators=(",", ":")).encode()
    return f"{TOKEN_PREFIX}{_b64(payload)}.{_b64(_mac(key, payload))}"


def read_token(token: str, key: bytes | None) -> Checkpoint:
    """The checkpoint of a token made with ``key``; :class:`ResumeError` for any other text."""
    if key is None:
        raise ResumeError("resume tokens are authenticated with the pre-shared key: give a TLS mode and --key")
    text = token.strip()
    if not text.startswith(TOKEN_PREFIX) or len(text) > MAX_TOKEN or text.count(".") != 2:
        raise ResumeError(f"not a sendstream resume token (they start with {TOKEN_PREFIX!r})")
    body, _, tag = text[len(TOKEN_PREFIX) :].partition(".")
    try:
        payload, mac = _unb64(body), _unb64(tag)
    except (binascii.Error, ValueError):
        raise ResumeError("the resume token is damaged (not base64)") from None
    if not hmac.compare_digest(mac, _mac(key, payload)):
        raise ResumeError("the resume token was not made with this key (forged, altered, or another key)")
    try:
        return _checkpoint(load_json(payload, "the resume token"))
    except SessionError as exc:  # made with the key, yet malformed: a key holder's forgery, or a bug
        raise ResumeError(f"the resume token is malformed: {exc}") from None


def _checkpoint(fields: Any) -> Checkpoint:
    """The fields of a token's payload, every one of its type."""
    if not isinstance(fields, dict) or set(fields) != _TOKEN_FIELDS:
        raise SessionError(f"it must be a JSON object of exactly {', '.join(sorted(_TOKEN_FIELDS))}")
    offset, commands, ledger = fields["offset"], fields["commands"], fields["ledger"]
    for name, value in (("offset", offset), ("commands", commands)):
        if type(value) is not int or not 0 <= value <= MAX_OFFSET:
            raise SessionError(f"{name} must be an integer from 0 to {MAX_OFFSET}")
    if not isinstance(ledger, str) or not _LEDGER.fullmatch(ledger):
        raise SessionError("ledger must be 64 lowercase hexadecimal digits (a SHA-256)")
    return Checkpoint(check_identity(fields["stream"], "stream"), offset, commands, ledger)
