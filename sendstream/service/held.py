"""What the service holds for a client: its stored streams, or the subvolumes received into its place.

Each snapshot is one dict: ``name`` (in the place; see :func:`named` for
a name that is not UTF-8), ``uuid`` and
``ctransid`` (of the sender's subvolume), ``parent_uuid`` and
``parent_ctransid`` (None for a full stream, or where the parent is gone),
and for a stored stream its ``size`` and when it was ``stored``. A backup
script picks the parent of its next incremental from them (``send --list``).
"""

from __future__ import annotations

import base64
import json
import os
from typing import Any

from ..archive.catalog import entries
from ..archive.store import Location, connect
from ..errors import shown
from .config import Client
from .confine import placed

MAX_HELD = 100_000  # snapshots listed at most (the answer's lines are bounded too)
MAX_MANIFEST = 64 << 10
_FIELDS = ("uuid", "ctransid", "parent_uuid", "parent_ctransid")


def held(client: Client, s3: Any = None) -> list[dict[str, Any]]:
    """The snapshots in ``client``'s place (its bucket: through ``s3``, or a new client), by name."""
    if client.archive:
        found = _archived(client.place, s3)
    else:
        found = _received(client.place) if client.receive else _stored(client.place)
    return sorted(found, key=lambda s: str(s["name"]))[:MAX_HELD]


def _stored(place: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with os.scandir(place) as entries:
        for entry in entries:
            if not entry.name.endswith(".stream.json") or entry.name.startswith(".") or len(out) >= MAX_HELD:
                continue
            try:
                with open(entry.path, "rb") as f:
                    note = json.loads(f.read(MAX_MANIFEST))
                stream = note["stream"]
                out.append(
                    {"name": entry.name[: -len(".json")], **{k: stream.get(k) for k in _FIELDS},
                     "size": note.get("size"), "stored": note.get("stored")}
                )  # fmt: skip
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                continue  # not one of ours, or being written: not held
    return out


def _archived(place: str, s3: Any) -> list[dict[str, Any]]:
    location = Location.parse(place)
    return [
        {"name": x.name, "uuid": x.uuid, "ctransid": x.ctransid, "parent_uuid": x.parent[0] if x.parent else None,
         "parent_ctransid": x.parent[1] if x.parent else None, "size": x.size, "stored": x.stored}
        for x in entries(s3 or connect(), location)
    ]  # fmt: skip


def _received(place: str) -> list[dict[str, Any]]:
    mine, _ = placed(place)
    received = {name: s for name, s in mine.items() if s.received_uuid is not None}
    by_uuid = {s.uuid: s for s in received.values()}
    out = []
    for name, s in list(received.items())[:MAX_HELD]:
        parent = by_uuid.get(s.parent_uuid)
        out.append(
            {
                **named(os.fsencode(name)),
                "uuid": str(s.received_uuid),
                "ctransid": s.send_transid,
                "parent_uuid": str(parent.received_uuid) if parent else None,
                "parent_ctransid": parent.send_transid if parent else None,
            }
        )
    return out


def named(raw: bytes) -> dict[str, str]:
    """A snapshot's ``name``: the name when it is UTF-8, else escaped (``\\xe9``) with its bytes in
    ``name_base64`` beside (a flat field: the list's answers are flat JSON objects)."""
    try:
        return {"name": raw.decode("utf-8")}
    except UnicodeDecodeError:
        return {"name": shown(raw), "name_base64": base64.b64encode(raw).decode("ascii")}
