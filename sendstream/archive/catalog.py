"""What an archive holds: its manifests, and the chains they make (a full stream, then its incrementals).

An incremental stream names its parent by the parent's UUID and ctransid
(the ``snapshot`` command's clone UUID and ctransid); the stream that
archived that parent has the same UUID and ctransid. Only manifests
directly under the prefix count, and each is read with a bounded size and
depth, as any input is.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .. import errors as e
from ..ops.identity import checked_integer, load_json
from ..ops.stored import MANIFEST_FORMAT
from .seal import CIPHER
from .store import Location, calling

MANIFEST_SUFFIX = ".stream.json"
MAX_MANIFEST = 1 << 20
_READERS = 8


@dataclass(frozen=True)
class Entry:
    """One archived stream, as its manifest says."""

    name: str  # UUID.CTRANSID[.from.PARENT.CTRANSID].stream
    uuid: str
    ctransid: int
    parent: tuple[str, int] | None
    snapshot: str
    size: int
    stored: str
    sha256: str
    commands: int
    ledger: str
    objects: tuple[tuple[str, int], ...]  # names under the prefix, and sizes, in order
    sealed: str = ""  # the fingerprint of the key its parts are sealed with (:mod:`.seal`)
    parts: tuple[tuple[int, ...], ...] = ()  # sealed: the size of each part, object by object

    @property
    def ident(self) -> tuple[str, int]:
        return self.uuid, self.ctransid

    def summary(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "uuid": self.uuid,
            "ctransid": self.ctransid,
            "parent": list(self.parent) if self.parent else None,
            "snapshot": self.snapshot,
            "size": self.size,
            "stored": self.stored,
        }


def entries(s3: Any, location: Location) -> list[Entry]:
    """Every stream archived directly under ``location``, by name."""
    names = []
    with calling(location.url()):
        pages = s3.get_paginator("list_objects_v2").paginate(Bucket=location.bucket, Prefix=location.prefix)
        for page in pages:
            for item in page.get("Contents", []):
                name = item["Key"][len(location.prefix) :]
                if "/" not in name and name.endswith(MANIFEST_SUFFIX):
                    names.append(name)
    with ThreadPoolExecutor(_READERS) as pool:
        found = list(pool.map(lambda name: read_manifest(s3, location, name), sorted(names)))
    return found


def read_manifest(s3: Any, location: Location, name: str) -> Entry:
    """The manifest ``name`` (``NAME.stream.json``) under ``location``."""
    url = location.url(name)
    with calling(url):
        body = s3.get_object(Bucket=location.bucket, Key=location.key(name), Range=f"bytes=0-{MAX_MANIFEST}")["Body"]
        raw = body.read(MAX_MANIFEST + 1)
    if len(raw) > MAX_MANIFEST:
        raise e.StoreError(url, f"a manifest of more than {MAX_MANIFEST} bytes: not one of ours")
    try:
        return _entry(load_json(raw, "the manifest"), name[: -len(".json")])
    except (e.SessionError, KeyError, TypeError, ValueError) as exc:
        raise e.StoreError(url, f"not a sendstream manifest ({exc})") from None


def _entry(body: Any, name: str) -> Entry:
    if body.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"format {body.get('format')!r}, not {MANIFEST_FORMAT!r}")
    stream = body["stream"]
    parent = None
    if stream.get("parent_uuid") is not None:
        parent = str(stream["parent_uuid"]), checked_integer(stream["parent_ctransid"], "parent_ctransid")
    objects = tuple((str(o["key"]), checked_integer(o["size"], "an object's size")) for o in body["objects"])
    if any("/" in key for key, _ in objects):
        raise ValueError("an object outside the prefix")
    sealed, parts = "", ()  # type: tuple[str, tuple[tuple[int, ...], ...]]
    if "encryption" in body:
        if body["encryption"].get("cipher") != CIPHER:
            raise ValueError(f"cipher {body['encryption'].get('cipher')!r}, not {CIPHER}")
        sealed = str(body["encryption"]["key"])
        parts = tuple(tuple(checked_integer(n, "a part's size") for n in o["parts"]) for o in body["objects"])
        if any(sum(sizes) != size for sizes, (_, size) in zip(parts, objects, strict=True)):
            raise ValueError("its parts do not make its objects")
    return Entry(
        name=name,
        uuid=str(stream["uuid"]),
        ctransid=checked_integer(stream["ctransid"], "ctransid"),
        parent=parent,
        snapshot=str(body.get("snapshot", "")),
        size=checked_integer(body["size"], "size"),
        stored=str(body["stored"]),
        sha256=str(body["sha256"]),
        commands=checked_integer(body["commands"], "commands"),
        ledger=str(body["ledger"]),
        objects=objects,
        sealed=sealed,
        parts=parts,
    )


def chains(found: list[Entry]) -> list[list[tuple[int, Entry]]]:
    """The archive as trees: each starts at a full stream (or at one whose parent is not archived) and
    holds ``(depth, entry)``, children after their parent, oldest first."""
    by_ident = {entry.ident: entry for entry in found}
    children: dict[tuple[str, int], list[Entry]] = {}
    roots = []
    for entry in sorted(found, key=lambda x: (x.ctransid, x.name)):
        if entry.parent is not None and entry.parent in by_ident:
            children.setdefault(entry.parent, []).append(entry)
        else:
            roots.append(entry)

    def walk(entry: Entry, depth: int) -> Iterator[tuple[int, Entry]]:
        yield depth, entry
        for child in children.get(entry.ident, []):
            yield from walk(child, depth + 1)

    return [list(walk(root, 0)) for root in roots]


def chain_to(found: list[Entry], subvolume: str, location: Location) -> list[Entry]:
    """The streams that make snapshot ``subvolume`` (a UUID, or ``UUID.CTRANSID``), full stream first."""
    uuid, _, ctransid = subvolume.partition(".")
    matches = [x for x in found if x.uuid == uuid and (not ctransid or str(x.ctransid) == ctransid)]
    if not matches:
        raise e.UsageError(f"{location.url()}: no archived stream makes snapshot {subvolume}")
    by_ident = {entry.ident: entry for entry in found}
    chain = [max(matches, key=lambda x: x.ctransid)]
    while chain[-1].parent is not None:
        parent = chain[-1].parent
        if parent not in by_ident:
            raise e.UsageError(
                f"{location.url()}: the chain of {subvolume} is broken: {chain[-1].name} needs its parent "
                f"{parent[0]} at ctransid {parent[1]}, which is not archived"
            )
        if len(chain) > len(found):
            raise e.UsageError(f"{location.url()}: the chain of {subvolume} goes round in a circle")
        chain.append(by_ident[parent])
    return chain[::-1]


def keeping(keep_last: int | None, since: str | None) -> None:
    """Refuse a prune that says nothing of what to keep, or a date that is none."""
    if keep_last is None and since is None:
        raise e.UsageError("say what to keep: --keep-last N or --keep-since DATE")
    if since is not None:
        try:
            datetime.datetime.fromisoformat(since)
        except ValueError:
            raise e.UsageError(f"--keep-since {since!r} is not an ISO date (2026-12-01, 2026-12-01T06:00)") from None


def plan_prune(
    found: list[Entry], keep_last: int | None = None, since: str | None = None
) -> tuple[list[Entry], list[Entry]]:
    """What to keep and what may go: the last ``keep_last`` streams stored (and those stored at or after
    ``since``, an ISO date), with every stream a kept one builds on, up to its full stream; both by age."""
    keeping(keep_last, since)
    ordered = sorted(found, key=lambda x: (x.stored, x.ctransid, x.name))
    wanted = set(ordered[len(ordered) - keep_last :] if keep_last else [])
    if since is not None:
        wanted.update(x for x in ordered if x.stored >= since)
    by_ident = {entry.ident: entry for entry in found}
    for entry in list(wanted):
        while entry.parent is not None and entry.parent in by_ident:
            entry = by_ident[entry.parent]
            wanted.add(entry)
    return [x for x in ordered if x in wanted], [x for x in ordered if x not in wanted]


def remove(s3: Any, location: Location, entry: Entry) -> None:
    """Delete an archived stream: its manifest first (then it is no longer archived), then its objects."""
    for keys in ([entry.name + ".json"], [name for name, _ in entry.objects]):
        with calling(location.url(keys[0])):
            answer = s3.delete_objects(
                Bucket=location.bucket, Delete={"Objects": [{"Key": location.key(k)} for k in keys], "Quiet": True}
            )
        if answer.get("Errors"):
            error = answer["Errors"][0]
            raise e.StoreError(location.url(error["Key"][len(location.prefix) :]), f"not deleted: {error.get('Code')}")
