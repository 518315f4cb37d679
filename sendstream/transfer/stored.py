"""Stored streams: named by what they are, with a JSON manifest beside each.

A full stream of subvolume U at ctransid N is ``U.N.stream``; an
incremental one from parent P at M is ``U.N.from.P.M.stream``. Its manifest,
``NAME.json``, holds the stream's identity, size, SHA-256, command count,
version and ledger (:mod:`sendstream.transfer.ledger`), when it was stored and
from whom. The service stores streams this way, and the archive in object
storage (:mod:`sendstream.archive`).
"""

from __future__ import annotations

import datetime
import json
import uuid
from typing import TYPE_CHECKING, Any

from ..errors import SendStreamError

if TYPE_CHECKING:
    from .identity import Identity, Made

MANIFEST_FORMAT = "sendstream-manifest-1"


class Unnamed(SendStreamError):
    """The stream does not say what it is: its first command is no ``subvol`` or ``snapshot``."""


def stream_name(identity: Made) -> str:
    """The file name of the stream of ``identity`` (:func:`~sendstream.transfer.identity.stream_identity`)."""
    try:
        name = f"{uuid.UUID(str(identity['uuid']))}.{_number(identity['ctransid'])}"
        if identity.get("parent_uuid") is not None:
            name += f".from.{uuid.UUID(str(identity['parent_uuid']))}.{_number(identity['parent_ctransid'])}"
    except (KeyError, TypeError, ValueError):
        raise Unnamed(
            f"the stream cannot be named: it starts with {identity.get('command') or 'no command'}, "
            "not a subvol or snapshot with a UUID and a ctransid"
        ) from None
    return name + ".stream"


def _number(value: int | None) -> int:
    if value is None:
        raise TypeError("no number")
    return int(value)


def manifest(identity: Identity, *, size: int, sha256: str, commands: int, ledger: str, **more: Any) -> bytes:
    """The manifest of a stored stream, as JSON (one object, keys sorted, a newline at the end); ``more``
    says where it came from (the service: ``client``, ``peer``; an archive: ``host``, ``objects``)."""
    body = {
        "format": MANIFEST_FORMAT,
        "stream": identity,
        "size": size,
        "sha256": sha256,
        "commands": commands,
        "version": identity.get("version"),
        "ledger": ledger,
        "stored": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        **more,
    }
    return json.dumps(body, sort_keys=True, indent=1).encode() + b"\n"
