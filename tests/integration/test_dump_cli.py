"""`sendstream dump` as a subprocess: the default style, every stream of a concatenated file, and
JSON lines (typed, lossless, non-UTF-8 names, a restart into another version)."""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
from pathlib import Path

from support.dumping import our_dump
from support.streams import STREAMS, backend_env, command_bytes, crafted, u64

from sendstream import Command, encode_stream_header
from sendstream.codec.backend import Backend
from sendstream.io.windows import iter_events
from sendstream.render.progs import DEFAULT_STYLE


def test_the_default_is_current_progs(backend: Backend) -> None:
    path = next(p for p in STREAMS if p.stem == "compressed-v2")
    default = our_dump(path, "UTC", backend=backend)
    assert default == our_dump(path, "UTC", "--progs-style", DEFAULT_STYLE, backend=backend)
    assert DEFAULT_STYLE == "6.14" and default != our_dump(path, "UTC", "--progs-style", "6.2", backend=backend)


def test_every_stream_of_a_concatenated_file_is_dumped(backend: Backend) -> None:
    path = next(p for p in STREAMS if p.stem.startswith("two-concat"))
    lines = our_dump(path, "UTC", backend=backend).splitlines()
    subvols = [line for line in lines if line.startswith((b"subvol ", b"snapshot "))]
    assert len(subvols) == 2
    assert len(path.with_suffix(".dump").read_bytes().splitlines()) < len(lines)


def test_json_lines_are_typed_and_lossless(stream_path: Path, backend: Backend) -> None:
    out = our_dump(stream_path, "UTC", "--json", backend=backend)
    with stream_path.open("rb") as f:
        commands = [ev for ev in iter_events(f) if isinstance(ev, Command)]
    objects = [json.loads(line) for line in out.splitlines()]
    assert len(objects) == len(commands)
    for obj, cmd in zip(objects, commands, strict=True):
        assert (obj["offset"], obj["index"], obj["command"]) == (cmd.offset, cmd.index, cmd.name)
        for name, value in cmd.values().items():
            shown = obj["attributes"][name]
            if name == "data":
                raw = bytes(value)
                assert shown == {"len": len(raw), "sha256": hashlib.sha256(raw).hexdigest()}
            elif isinstance(value, bytes | memoryview):
                raw = bytes(value)
                back = base64.b64decode(shown["base64"]) if isinstance(shown, dict) else shown.encode()
                assert back == raw
            elif name.endswith("time"):
                assert shown == {"sec": value.sec, "nsec": value.nsec}
            elif name.endswith("uuid"):
                assert shown == str(value)
            else:
                assert shown == value


def test_json_keeps_non_utf8_names(tmp_path: Path, backend: Backend) -> None:
    path = tmp_path / "latin1.stream"
    path.write_bytes(crafted(1, command_bytes(11, [(15, b"caf\xe9")], 1)))
    first = json.loads(our_dump(path, "UTC", "--json", backend=backend).splitlines()[0])
    assert first["attributes"]["path"] == {"base64": base64.b64encode(b"caf\xe9").decode()}


def test_json_after_a_restart_reads_attributes_as_the_restarted_version(tmp_path: Path, backend: Backend) -> None:
    """A v2 header, then a restart into a v1 stream: attribute 26 (FILEATTR, a u64 from v2
    on) is unknown to v1 and shown raw. It was decoded with the first header's version (a
    struct.error traceback); fuzz corpus dump/crash-json-restart-into-v1-stale-version."""
    path = tmp_path / "restarted.stream"
    mkfile = command_bytes(3, [(15, b"f"), (3, u64(257)), (26, b"\1\0")], 1)
    path.write_bytes(encode_stream_header(2) + crafted(1, mkfile))
    command = [sys.executable, "-m", "sendstream", "dump", "--json", str(path)]
    run = subprocess.run(command, capture_output=True, env=backend_env(backend))
    assert b"Traceback" not in run.stderr
    assert b"restarted send" in run.stderr
    first = json.loads(run.stdout.splitlines()[0])
    assert (first["version"], first["command"]) == (1, "mkfile")
    assert first["attributes"] == {"path": "f", "ino": 257, "unknown(26)": {"base64": "AQA="}}
