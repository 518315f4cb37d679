"""What an archive holds: its manifests, and the chains they make (a full stream, then its incrementals).

An incremental stream names its parent by the parent's UUID and ctransid
(the ``snapshot`` command's clone UUID and ctransid); the stream that
archived that parent has the same UUID and ctransid. Only manifests
directly under the prefix count. What the store lists and holds is input
like any other: the listing is read to at most :data:`MAX_LISTED` keys,
each manifest to :data:`MAX_MANIFEST` bytes and all of them to
:data:`MAX_CATALOG`. A manifest must say the stream its name says (UUID,
ctransid, parent), name only that stream's own objects (``NAME``,
``NAME.1``, ...), and add up; one that does not, and streams whose parents
go round in a circle, are problems (:class:`~sendstream.errors.BadManifest`)
named beside the rest of the archive, which is read all the same.
"""

from __future__ import annotations

import datetime
import re
import threading
from array import array
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from .. import errors as e
from ..retention import Policy, kept_by_name
from ..transfer.identity import Made, check_identity, checked_integer, load_json, printable, short_json
from ..transfer.stored import MANIFEST_FORMAT, stream_name
from .seal import CIPHER, SEGMENT, opened_size
from .store import BucketClient, Location, calling, missing

MANIFEST_SUFFIX = ".stream.json"
MAX_MANIFEST = 1 << 20
MAX_LISTED = 100_000  # keys of a listing (some 50,000 streams); past it the store is not ending its listing
MAX_CATALOG = 64 << 20  # bytes of all the manifests read
MIN_PART = 5 << 20  # S3's least size of a part, but for the last one of an object
_READERS = 8
_LONG_AGO = datetime.datetime.min.replace(tzinfo=datetime.UTC)  # when a listing does not say
_NAME = re.compile(r"([0-9a-f-]{36})\.([0-9]{1,20})(?:\.from\.([0-9a-f-]{36})\.([0-9]{1,20}))?\.stream")

Ident = tuple[str, int]  # a snapshot: its subvolume's UUID, and ctransid


@dataclass(frozen=True, eq=False)
class Entry:
    """One archived stream, as its manifest says."""

    name: str  # UUID.CTRANSID[.from.PARENT.CTRANSID].stream
    uuid: str
    ctransid: int
    parent: Ident | None
    snapshot: str
    size: int
    stored: str
    sha256: str
    commands: int
    ledger: str
    objects: tuple[tuple[str, int], ...]  # NAME, NAME.1, ... under the prefix, and their sizes, in order
    sealed: str = ""  # the fingerprint of the key its parts are sealed with (:mod:`.seal`)
    parts: tuple[array[int], ...] = ()  # sealed: the size of each part, object by object

    @property
    def ident(self) -> Ident:
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


def identity_of(name: str) -> tuple[Ident, Ident | None] | None:
    """The snapshot that the stream named ``name`` makes, and its parent's (None: a name not of ours)."""
    match = _NAME.fullmatch(name)
    if match is None:
        return None
    uuid, ctransid, parent_uuid, parent_ctransid = match.groups()
    parent = (parent_uuid, int(parent_ctransid)) if parent_uuid else None
    made = Made(
        command=None,
        uuid=uuid,
        ctransid=int(ctransid),
        parent_uuid=parent_uuid,
        parent_ctransid=parent[1] if parent else None,
    )
    if stream_name(made) != name:  # spelt as no stream of ours is (upper case, leading zeros)
        return None
    return (uuid, int(ctransid)), parent


def listing(s3: BucketClient, location: Location) -> Iterator[tuple[str, datetime.datetime]]:
    """The objects directly under ``location`` (names after the prefix), with when each was last written;
    :class:`~sendstream.errors.StoreError` past :data:`MAX_LISTED` keys."""
    count = 0
    with calling(location.url()):
        pages = s3.get_paginator("list_objects_v2").paginate(
            Bucket=location.bucket, Prefix=location.prefix, Delimiter="/"
        )
        for page in pages:
            count += len(page.get("Contents", [])) + len(page.get("CommonPrefixes", []))
            if count > MAX_LISTED:
                raise e.StoreError(
                    location.url(),
                    f"the listing goes on past {MAX_LISTED:,} keys, more than an archive here holds "
                    "(a store that does not end its listing?)",
                )
            for item in page.get("Contents", []):
                key, when = item.get("Key"), item.get("LastModified")
                if not isinstance(key, str) or not key.startswith(location.prefix):
                    raise e.StoreError(location.url(), f"its listing names {short_json(key)}, not a key here")
                yield key[len(location.prefix) :], _when(when)


def _when(value: object) -> datetime.datetime:
    """A listed object's LastModified, comparable with every other: one without a time zone (a store that
    says none) taken as UTC, anything not a time as long ago."""
    if not isinstance(value, datetime.datetime):
        return _LONG_AGO
    return value if value.tzinfo is not None else value.replace(tzinfo=datetime.UTC)


def entries(s3: BucketClient, location: Location, problems: list[e.BadManifest] | None = None) -> list[Entry]:
    """Every stream archived directly under ``location``, by name (once, though a store lists it twice). A
    manifest that cannot be taken is left out, and added to ``problems`` when given; one deleted since the
    listing is left out."""
    names = sorted({name for name, _ in listing(s3, location) if name.endswith(MANIFEST_SUFFIX)})
    spent, lock = 0, threading.Lock()

    def spend(size: int) -> None:
        nonlocal spent
        with lock:
            spent += size
            if spent > MAX_CATALOG:
                raise e.StoreError(location.url(), f"its manifests come to more than {MAX_CATALOG >> 20} MiB")

    def read(name: str) -> Entry | e.BadManifest | None:
        try:
            return read_manifest(s3, location, name, spend)
        except e.BadManifest as problem:
            return problem
        except e.StoreError as exc:
            if missing(exc):
                return None
            raise

    found = []
    with ThreadPoolExecutor(_READERS) as pool:
        try:
            for result in pool.map(read, names):
                if isinstance(result, Entry):
                    found.append(result)
                elif result is not None and problems is not None:
                    problems.append(result)
        except BaseException:
            pool.shutdown(cancel_futures=True)  # the rest are not read
            raise
    return found


def read_manifest(
    s3: BucketClient, location: Location, name: str, spend: Callable[[int], object] | None = None
) -> Entry:
    """The manifest ``name`` (``NAME.stream.json``) under ``location`` (``spend`` hears its size before it
    is read on); :class:`~sendstream.errors.BadManifest` when it cannot be taken."""
    url = printable(location.url(name))  # (a key in the listing may hold anything)
    with calling(url):
        body = s3.get_object(Bucket=location.bucket, Key=location.key(name), Range=f"bytes=0-{MAX_MANIFEST}")["Body"]
        try:
            raw = body.read(MAX_MANIFEST + 1)
        finally:
            body.close()
    stream = name[: -len(".json")]
    if len(raw) > MAX_MANIFEST:
        raise e.BadManifest(url, f"a manifest of more than {MAX_MANIFEST} bytes: not one of ours", (stream,))
    if spend is not None:
        spend(len(raw))
    try:
        return _entry(load_json(raw, "the manifest"), stream, location.one_file)
    except (e.SendStreamError, ValueError) as exc:
        raise e.BadManifest(url, f"not a sound manifest: {exc}", (stream,)) from None


def _fields(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ValueError(f"{what} is {short_json(value)}, not a JSON object")
    return value


def _list(value: Any, what: str) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"{what} is {short_json(value)}, not a list")
    return value


def _text(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what} is {short_json(value)}, not a string")
    return value


def _entry(value: Any, name: str, one_file: bool = False) -> Entry:
    """The manifest ``value`` of the stream ``name``, checked against its name; ValueError or our error."""
    body = _fields(value, "the manifest")
    if body.get("format") != MANIFEST_FORMAT:
        raise ValueError(f"format {short_json(body.get('format'))}, not {MANIFEST_FORMAT!r}")
    named = identity_of(name)
    if named is None:
        raise ValueError("its name is not UUID.CTRANSID[.from.UUID.CTRANSID].stream")
    stream = check_identity(body.get("stream"), "its stream")
    said = (
        (stream["uuid"], stream["ctransid"]),
        ((stream["parent_uuid"], stream["parent_ctransid"]) if stream["parent_uuid"] is not None else None),
    )
    if said != named:
        raise ValueError(f"its stream is {_shown(said)}, not {_shown(named)} as its name says")
    # a service's file place keeps the stream as one file of its name, and its manifest says no objects
    objects = body.get("objects", [{"key": name, "size": body.get("size")}] if one_file else None)
    listed = [_fields(o, "an object") for o in _list(objects, "its objects")]
    objects = tuple((_text(o.get("key"), "a key"), checked_integer(o.get("size"), "its size")) for o in listed)
    own = [name] + [f"{name}.{k}" for k in range(1, len(objects))]
    if [key for key, _ in objects] != own:
        raise ValueError(f"its objects are {short_json([key for key, _ in objects])}, not its own {short_json(own)}")
    size = checked_integer(body.get("size"), "size")
    sealed, parts = "", ()  # type: tuple[str, tuple[array[int], ...]]
    if "encryption" in body:
        sealed, parts = _sealing(_fields(body["encryption"], "its encryption"), listed, objects)
        held = sum(opened_size(part) for sizes in parts for part in sizes)
    else:
        held = sum(size for _, size in objects)
    if held != size:
        raise ValueError(f"its objects hold {held} bytes of stream, not its size {size}")
    return Entry(
        name=name,
        uuid=named[0][0],
        ctransid=named[0][1],
        parent=named[1],
        snapshot=_text(body.get("snapshot", ""), "snapshot"),
        size=size,
        stored=_text(body.get("stored"), "stored"),
        sha256=_text(body.get("sha256"), "sha256"),
        commands=checked_integer(body.get("commands"), "commands"),
        ledger=_text(body.get("ledger"), "ledger"),
        objects=objects,
        sealed=sealed,
        parts=parts,
    )


def _sealing(
    encryption: dict[str, Any], listed: list[dict[str, Any]], objects: tuple[tuple[str, int], ...]
) -> tuple[str, tuple[array[int], ...]]:
    """The key's fingerprint and the sizes of the sealed parts, object by object, checked."""
    if encryption.get("cipher") != CIPHER:
        raise ValueError(f"cipher {short_json(encryption.get('cipher'))}, not {CIPHER}")
    if encryption.get("segment") != SEGMENT:
        raise ValueError(
            f"sealed in segments of {short_json(encryption.get('segment'))} bytes, not {SEGMENT} "
            "(an earlier sendstream sealed whole parts)"
        )
    parts = []
    for o, (key, size) in zip(listed, objects, strict=True):
        sizes = array("Q", (checked_integer(n, "a part's size") for n in _list(o.get("parts"), f"{key}'s parts")))
        if sum(sizes) != size or not sizes or any(n < MIN_PART for n in sizes[:-1]):
            raise ValueError(f"the parts of {key} do not make it (each but the last at least {MIN_PART} bytes)")
        parts.append(sizes)
    return _text(encryption.get("key"), "its key"), tuple(parts)


def _shown(ident: tuple[tuple[str | None, int | None], tuple[str | None, int | None] | None]) -> str:
    (uuid, ctransid), parent = ident
    return printable(f"{uuid} at ctransid {ctransid}" + (f" from {parent[0]} at {parent[1]}" if parent else ""))


def chains(found: list[Entry], problems: list[e.BadManifest] | None = None) -> list[list[tuple[int, Entry]]]:
    """The archive as trees: each starts at a full stream (or at one whose parent is not archived) and
    holds ``(depth, entry)``, children after their parent, oldest first. Streams whose parents go round
    in a circle, and those that build on them, are in none: each circle is added to ``problems``."""
    by_ident = {entry.ident: entry for entry in found}
    children: dict[Ident, list[Entry]] = {}
    roots = []
    for entry in sorted(found, key=lambda x: (x.ctransid, x.name)):
        if entry.parent is not None and entry.parent in by_ident:
            children.setdefault(entry.parent, []).append(entry)
        else:
            roots.append(entry)
    placed: set[str] = set()
    trees = []
    for root in roots:
        tree, stack = [], [(0, root)]
        while stack:
            depth, entry = stack.pop()
            if entry.name in placed:
                continue
            placed.add(entry.name)
            tree.append((depth, entry))
            stack.extend((depth + 1, child) for child in reversed(children.get(entry.ident, [])))
        trees.append(tree)
    if problems is not None:
        problems.extend(_circles([x for x in found if x.name not in placed], by_ident))
    return trees


def _circles(stranded: list[Entry], by_ident: dict[Ident, Entry]) -> list[e.BadManifest]:
    """The circles of parents that the ``stranded`` streams (those no full stream leads to) are in or
    build on: each one a problem, and one more for the streams that build on them."""
    on_path, done = 1, 2
    state: dict[str, int] = {}
    found = []
    for start in stranded:
        path, entry = [], start
        while entry.name not in state:
            state[entry.name] = on_path
            path.append(entry)
            assert entry.parent is not None  # else it is the root of a tree
            entry = by_ident[entry.parent]
        if state[entry.name] == on_path:
            circle = path[path.index(entry) :]
            names = tuple(x.name for x in circle)
            found.append(
                e.BadManifest(
                    ", ".join(names),
                    "each of these streams builds on the next, and the last on the first: "
                    "a circle of parents that no full stream starts (manifests forged or damaged)",
                    names,
                )
            )
        for x in path:
            state[x.name] = done
    above = tuple(x.name for x in stranded if not any(x.name in p.streams for p in found))
    if above:
        shown = ", ".join(above[:5]) + (f" and {len(above) - 5} more" if len(above) > 5 else "")
        found.append(e.BadManifest(shown, "builds on a circle of parents (above): not restorable", above))
    return found


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


def keeping(keep_last: int | None, since: str | None, policy: Policy | None = None) -> None:
    """Refuse a prune that says nothing of what to keep, or a date that is none."""
    if keep_last is None and since is None and policy is None:
        raise e.UsageError("say what to keep: --keep-last N, --keep-since DATE or --preserve POLICY")
    if since is not None:
        try:
            datetime.datetime.fromisoformat(since)
        except ValueError:
            raise e.UsageError(f"--keep-since {since!r} is not an ISO date (2026-12-01, 2026-12-01T06:00)") from None


def plan_prune(
    found: list[Entry],
    keep_last: int | None = None,
    since: str | None = None,
    problems: list[e.BadManifest] | None = None,
    policy: Policy | None = None,
    now: datetime.datetime | None = None,
    newest: bool = False,
) -> tuple[list[Entry], list[Entry]]:
    """What to keep and what may go: the last ``keep_last`` streams stored (and those stored at or after
    ``since``, an ISO date, and what ``policy`` keeps at ``now`` by the time each snapshot's name says:
    :func:`preserved`, with ``newest``: and the newest of each subvolume), with every stream a kept one
    builds on, up to its full stream; both by age.

    What cannot be placed is kept, and so is what it builds on: streams in or on a circle of parents
    (added to ``problems``), and the parents that the names of the bad manifests in ``problems`` say
    (such a manifest may be a kept stream's, damaged)."""
    keeping(keep_last, since, policy)
    ordered = sorted(found, key=lambda x: (x.stored, x.ctransid, x.name))
    wanted = set(ordered[max(0, len(ordered) - keep_last) :] if keep_last else [])
    if since is not None:
        wanted.update(x for x in ordered if x.stored >= since)
    if policy is not None:
        wanted.update(preserved(ordered, policy, now or datetime.datetime.now(datetime.UTC), newest))
    circles: list[e.BadManifest] = []
    placed = {x.name for tree in chains(found, circles) for _, x in tree}
    wanted.update(x for x in found if x.name not in placed)
    by_ident: dict[Ident, list[Entry]] = {}
    for entry in found:
        by_ident.setdefault(entry.ident, []).append(entry)
    named = (identity_of(name) for problem in problems or [] for name in problem.streams)
    parents = [x.parent for x in wanted if x.parent] + [ident[1] for ident in named if ident and ident[1]]
    while parents:
        for entry in by_ident.get(parents.pop(), []):
            if entry not in wanted:
                wanted.add(entry)
                parents += [entry.parent] if entry.parent else []
    if problems is not None:
        problems += circles
    return [x for x in ordered if x in wanted], [x for x in ordered if x not in wanted]


def preserved(found: list[Entry], policy: Policy, now: datetime.datetime, newest: bool = False) -> set[Entry]:
    """The streams ``policy`` keeps at ``now`` (with ``newest``: and the newest), subvolume by subvolume, by
    the time each snapshot's name says (btrbk's ``NAME.YYYYMMDDTHHMM``); a stream whose name says no time
    is kept: it cannot be placed. A snapshot kept keeps every stream that makes it (a full stream and an
    incremental of the same snapshot: either may be the one whose chain is whole)."""
    kept = kept_by_name(((x, x.snapshot.rpartition("/")[2]) for x in found), now, policy, newest=newest)
    idents = {entry.ident for entry in kept}
    return {entry for entry in found if entry.ident in idents}


def remove(s3: BucketClient, location: Location, entry: Entry) -> None:
    """Delete an archived stream: its manifest first (then it is no longer archived), then its own
    objects (``NAME``, ``NAME.1``, ...), never another's."""
    own = [entry.name] + [f"{entry.name}.{k}" for k in range(1, len(entry.objects))]
    for keys in ([entry.name + ".json"], own):
        with calling(location.url(keys[0])):
            answer = s3.delete_objects(
                Bucket=location.bucket, Delete={"Objects": [{"Key": location.key(k)} for k in keys], "Quiet": True}
            )
        if answer.get("Errors"):
            error = answer["Errors"][0]
            said = error.get("Key")  # (the store may leave it out, or name a key that is not ours)
            name = said[len(location.prefix) :] if isinstance(said, str) and said.startswith(location.prefix) else ""
            raise e.StoreError(location.url(name or keys[0]), f"not deleted: {short_json(error.get('Code'))}")
