"""What the service holds for a client: its stored streams, or the subvolumes received into its place.

Each snapshot is one dict: ``name`` (in the place), ``uuid`` and
``ctransid`` (of the sender's subvolume), ``parent_uuid`` and
``parent_ctransid`` (None for a full stream, or where the parent is gone),
and for a stored stream its ``size`` and when it was ``stored``. A backup
script picks the parent of its next incremental from them (``send --list``).
"""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from ..archive.catalog import entries
from ..archive.store import Location, connect
from .config import Client

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
    shown: dict[str, dict[str, str]] = {}
    with os.scandir(place) as entries:
        for entry in entries:
            if len(shown) >= MAX_HELD:
                break
            if entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_ino == 256:
                fields = _show(entry.path)
                if fields.get("Received UUID", "-") != "-":
                    shown[entry.name] = fields
    by_uuid = {f.get("UUID"): f for f in shown.values()}
    out = []
    for name, fields in shown.items():
        parent = by_uuid.get(fields.get("Parent UUID"))
        out.append(
            {
                "name": name,
                "uuid": fields["Received UUID"],
                "ctransid": _number(fields.get("Send transid")),
                "parent_uuid": parent.get("Received UUID") if parent else None,
                "parent_ctransid": _number(parent.get("Send transid")) if parent else None,
            }
        )
    return out


def _show(path: str) -> dict[str, str]:
    result = subprocess.run(["btrfs", "subvolume", "show", path], capture_output=True, text=True, check=False)
    fields = {}
    for line in result.stdout.splitlines()[1:]:
        key, sep, value = line.strip().partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def _number(text: str | None) -> int | None:
    return int(text) if text and text.isdigit() else None
