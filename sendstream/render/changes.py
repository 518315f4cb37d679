"""Presentation of ``ls`` and ``diff``: text lines and JSON, pure functions of a subvolume's changes;
:func:`write_changes` writes those of a whole input."""

from __future__ import annotations

import heapq
import json
from collections.abc import Callable, Iterable, Iterator
from typing import Any, BinaryIO

from ..analysis.changes import Change, Diff, SubvolumeChanges, read_changes
from ..analysis.paths import MAX_HELD, MAX_NAMES
from ..io.framed import StreamSource, Warn
from .dump import escape
from .jsonlines import json_bytes


def _show(raw: bytes | None) -> bytes:
    return b"-" if raw is None else escape(raw) or b"."


def _flags(change: Change) -> bytes:
    parts = []
    if change.data:
        parts.append(b"data")
    if change.metadata:
        parts.append(b",".join(m.encode() for m in change.metadata))
    return b" [" + b" ".join(parts) + b"]" if parts else b""


def ls_lines(result: SubvolumeChanges) -> Iterator[bytes]:
    """One line per name: action, kind, path, then ``from OLD`` / ``to TARGET`` and ``[data mode,...]``."""
    for c in result.changes:
        line = b"%-9s %-8s " % (c.action.encode(), (c.kind or "-").encode())
        if c.action in ("deleted", "transient"):
            line += _show(c.old_path)
        else:
            line += _show(c.path)
        if c.action == "renamed":
            line += b" from " + _show(c.old_path)
        if c.link_to is not None:
            line += b" to " + _show(c.link_to)
        yield line + _flags(c) + b"\n"


def _hard_link(change: Change) -> bytes:
    return b"" if change.link_to is None else b" (hard link to " + _show(change.link_to) + b")"


def diff_lines(diff: Diff) -> Iterator[bytes]:
    """Text in the manner of ``git diff --name-status``: A, D, R (old -> new), M (data), m (metadata only).

    Rows come sorted by path (then by text), merged from the lists of ``diff``,
    which are sorted already: nothing is copied."""
    added = ((c.sort_key, b"A " + _show(c.path) + _hard_link(c)) for c in diff.added)
    removed = ((c.sort_key, b"D " + _show(c.old_path)) for c in diff.removed)
    renamed = ((c.sort_key, b"R " + _show(c.old_path) + b" -> " + _show(c.path) + _flags(c)) for c in diff.renamed)
    modified = ((c.sort_key, b"M " + _show(c.path) + _flags(c)) for c in diff.modified if c.action != "renamed")
    metadata = ((c.sort_key, b"m " + _show(c.path) + _flags(c)) for c in diff.metadata)
    for _, row in heapq.merge(added, removed, renamed, modified, metadata):
        yield row + b"\n"


def _change_json(c: Change) -> dict[str, Any]:
    out: dict[str, Any] = {"action": c.action}
    if c.path is not None:
        out["path"] = json_bytes(c.path)
    if c.old_path is not None and c.old_path != c.path:
        out["old_path"] = json_bytes(c.old_path)
    out["kind"] = c.kind
    if c.link_to is not None:
        out["link_to"] = json_bytes(c.link_to)
    out["data"] = c.data
    out["metadata"] = list(c.metadata)
    return out


def _head(result: SubvolumeChanges) -> dict[str, Any]:
    return {
        "subvolume": None if result.subvolume is None else json_bytes(result.subvolume),
        "incremental": result.incremental,
    }


_Lists = list[tuple[str, Iterable[dict[str, Any]]]]


def _ls_lists(result: SubvolumeChanges) -> _Lists:
    return [("changes", map(_change_json, result.changes))]


def _diff_lists(result: SubvolumeChanges) -> _Lists:
    d = result.diff()
    return [
        (
            "added",
            (
                {"path": json_bytes(c.path or b""), "kind": c.kind}
                | ({"link_to": json_bytes(c.link_to)} if c.link_to is not None else {})
                for c in d.added
            ),
        ),
        ("removed", ({"path": json_bytes(c.old_path or b""), "kind": c.kind} for c in d.removed)),
        (
            "renamed",
            (
                {
                    "from": json_bytes(c.old_path or b""),
                    "to": json_bytes(c.path or b""),
                    "kind": c.kind,
                    "data": c.data,
                    "metadata": list(c.metadata),
                }
                for c in d.renamed
            ),
        ),
        ("modified", ({"path": json_bytes(c.path or b""), "metadata": list(c.metadata)} for c in d.modified)),
        ("metadata", ({"path": json_bytes(c.path or b""), "metadata": list(c.metadata)} for c in d.metadata)),
    ]


def ls_json(result: SubvolumeChanges) -> dict[str, Any]:
    """A JSON-ready dict: subvolume, incremental, and every change."""
    return _head(result) | {name: list(items) for name, items in _ls_lists(result)}


def diff_json(result: SubvolumeChanges) -> dict[str, Any]:
    """A JSON-ready dict: added, removed, renamed (from, to), modified, metadata."""
    return _head(result) | {name: list(items) for name, items in _diff_lists(result)}


def ls_json_pieces(result: SubvolumeChanges) -> Iterator[bytes]:
    """``json_line(ls_json(result))`` in pieces, one change at a time."""
    return _json_pieces(_head(result), _ls_lists(result))


def diff_json_pieces(result: SubvolumeChanges) -> Iterator[bytes]:
    """``json_line(diff_json(result))`` in pieces, one entry at a time."""
    return _json_pieces(_head(result), _diff_lists(result))


def _dumps(obj: Any) -> str:
    return json.dumps(obj, separators=(",", ":"))


def _json_pieces(head: dict[str, Any], lists: _Lists) -> Iterator[bytes]:
    yield _dumps(head)[:-1].encode()  # without its closing brace
    for n, (name, items) in enumerate(lists):
        yield (("," if head or n else "") + _dumps(name) + ":[").encode()
        for i, item in enumerate(items):
            yield (("," if i else "") + _dumps(item)).encode()
        yield b"]"
    yield b"}\n"


def json_line(obj: dict[str, Any]) -> bytes:
    """One object as a line of JSON."""
    return _dumps(obj).encode() + b"\n"


_Subvolumes = Iterator[tuple[SubvolumeChanges, bool]]


def write_changes(
    source: StreamSource,
    out: BinaryIO,
    *,
    diff: bool = False,
    as_json: bool = False,
    max_names: int = MAX_NAMES,
    max_held: int = MAX_HELD,
    max_command_size: int | None = None,
    warn: Warn | None = None,
) -> None:
    """Write every path the stream at ``source`` touches to ``out`` (:func:`ls_lines`), or with
    ``diff`` what the incremental stream changes against its parent (:func:`diff_lines`; a full
    stream is told to ``warn``): under a ``== SUBVOLUME ==`` line when there are several, or a
    JSON line per subvolume. The limits are :class:`~sendstream.analysis.changes.ChangeTracker`'s;
    problems go to ``warn``."""
    subvolumes = read_changes(
        source, max_names=max_names, max_held=max_held, max_command_size=max_command_size, warn=warn
    )
    if diff:
        _write(_full_told(subvolumes, warn), out, diff_json_pieces if as_json else None, lambda r: diff_lines(r.diff()))
    else:
        _write(subvolumes, out, ls_json_pieces if as_json else None, ls_lines)


def _full_told(subvolumes: _Subvolumes, warn: Warn | None) -> _Subvolumes:
    for result, several in subvolumes:
        if not result.incremental and warn is not None:
            name = (result.subvolume or b"-").decode(errors="replace")
            warn(f"{name} is a full stream: everything is added")
        yield result, several


def _write(
    subvolumes: _Subvolumes,
    out: BinaryIO,
    json_pieces: Callable[[SubvolumeChanges], Iterator[bytes]] | None,
    lines: Callable[[SubvolumeChanges], Iterator[bytes]],
) -> None:
    try:
        for result, several in subvolumes:
            if json_pieces is not None:
                out.writelines(json_pieces(result))
                continue
            if several:
                out.write(b"== " + (result.subvolume or b"-") + b" ==\n")
            out.writelines(lines(result))
    finally:
        out.flush()
