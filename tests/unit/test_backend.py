"""The backend each entry point is given is the one that decodes; SENDSTREAM_PURE chooses the default."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.streams import FIXTURES

from sendstream import Decoder, verify
from sendstream.analysis.changes import read_changes
from sendstream.codec.backend import Backend, default, native, pure
from sendstream.ops.convert import convert
from sendstream.ops.repair import repair
from sendstream.render.dump import dump
from sendstream.render.paths import write_paths, write_stats

SAMPLE = FIXTURES / "rich-full-v2.stream"


class Counted:
    """A backend's module and CRC that count what they are asked."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        self.calls.append(name)
        return getattr(self.backend.module, name)

    def crc32c(self, data: Any, crc: int = 0) -> int:
        self.calls.append("crc32c")
        return self.backend.crc32c(data, crc)

    def spy(self) -> Backend:
        module = None if self.backend.module is None else self
        return Backend(module, self.crc32c, self.backend.crc_name)


def decode(source: Path, tmp_path: Path, backend: Backend) -> None:
    decoder = Decoder(backend=backend)
    decoder.receive_data(source.read_bytes())
    decoder.receive_data(b"")
    decoder.events()


ENTRY_POINTS: dict[str, Callable[[Path, Path, Backend], object]] = {
    "Decoder": decode,
    "verify": lambda source, tmp, backend: verify(source, backend=backend),
    "repair": lambda source, tmp, backend: repair(source, str(tmp / "out"), backend=backend),
    "dump": lambda source, tmp, backend: dump(source, io.BytesIO(), backend=backend),
    "convert": lambda source, tmp, backend: convert(source, str(tmp / "out"), backend=backend),
    "paths": lambda source, tmp, backend: write_paths(source, io.BytesIO(), backend=backend),
    "stats": lambda source, tmp, backend: write_stats(source, io.BytesIO(), backend=backend),
    "changes": lambda source, tmp, backend: list(read_changes(source, backend=backend)),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_the_backend_given_is_the_one_used(tmp_path: Path, backend: Backend, entry: str) -> None:
    """Whatever the default: the pure one's CRC checks every command; the native one's scanner
    checks runs of them (and its module guards the mapped windows of a file)."""
    counted = Counted(backend)
    ENTRY_POINTS[entry](SAMPLE, tmp_path, counted.spy())
    if backend.is_native:
        assert {"scan", "dump_text"} & set(counted.calls), counted.calls
    else:
        assert counted.calls.count("crc32c") > 1


@pytest.mark.parametrize(("pure_set", "expected"), [("1", pure), ("", native)], ids=["pure", "default"])
def test_sendstream_pure_chooses_the_default(
    monkeypatch: pytest.MonkeyPatch, pure_set: str, expected: Callable[[], Backend | None]
) -> None:
    monkeypatch.setenv("SENDSTREAM_PURE", pure_set)
    assert default() is (expected() or pure())
