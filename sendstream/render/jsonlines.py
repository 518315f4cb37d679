"""Commands as JSON lines (``dump --json``, and the byte strings of ``ls`` and ``diff``).

A module of its own: the text dump never pays for loading ``json`` and ``hashlib``.
"""

from __future__ import annotations

import base64
import hashlib
import json
from typing import Any

from ..format.command import Command
from ..format.layout import MAX_VERSION, attribute_name, attribute_spec, decode_value
from ..format.layout import A as _A


def json_bytes(raw: Any) -> Any:
    """A byte string as JSON: a string if it is UTF-8, else ``{"base64": ...}``."""
    b = bytes(raw)
    try:
        return b.decode("utf-8")
    except UnicodeDecodeError:
        return {"base64": base64.b64encode(b).decode("ascii")}


def _digest(raw: Any) -> dict[str, Any]:
    return {"len": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}


def json_value(number: int, raw: Any, version: int = MAX_VERSION) -> Any:
    """An attribute value as JSON: typed, file data as length and sha256; raw when ``version`` does not define it."""
    spec = attribute_spec(number, version)
    if spec is None:
        return {"base64": base64.b64encode(bytes(raw)).decode("ascii")}
    if number == _A["data"]:
        return _digest(raw)
    value = decode_value(spec.kind, memoryview(raw))
    if spec.kind == "uuid":
        return str(value)
    if spec.kind == "timespec":
        return {"sec": value.sec, "nsec": value.nsec}
    if spec.kind in ("string", "bytes"):
        return json_bytes(value)
    return value


def json_object(cmd: Command, stream: int) -> dict[str, Any]:
    """One command as a JSON-ready dict: offset, index, name, typed attributes (as the
    version of the stream it is in defines them: a restart may change it)."""
    version = cmd.version
    obj: dict[str, Any] = {
        "offset": cmd.offset,
        "index": cmd.index,
        "stream": stream,
        "version": version,
        "command": cmd.name,
    }
    if cmd.attributes is None:
        obj["payload"] = _digest(cmd.payload or b"")
    else:
        obj["attributes"] = {attribute_name(t, version): json_value(t, v, version) for t, v in cmd.attributes}
    return obj


def json_line(cmd: Command, stream: int) -> bytes:
    return json.dumps(json_object(cmd, stream), separators=(",", ":")).encode() + b"\n"
