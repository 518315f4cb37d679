"""The sinks a receiver writes to: complete on success, nothing half done on an error."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from sendstream.errors import ChildFailed
from sendstream.net.sinks import ChildSink, FileSink, JournalSink
from sendstream.ops.ledger import Checkpoint
from sendstream.ops.tokens import make_token

KEY = b"k" * 32


def python(code: str) -> str:
    return shlex.join([sys.executable, "-c", code])


def test_a_file_appears_only_on_success(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with FileSink(str(out)) as sink:
        sink.write(b"abc")
        sink.flush()
        assert not out.exists()
    assert out.read_bytes() == b"abc"
    with pytest.raises(RuntimeError), FileSink(str(out)) as sink:
        sink.write(b"other")
        raise RuntimeError
    assert out.read_bytes() == b"abc"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_child_gets_the_stream_and_its_failure_is_ours(tmp_path: Path) -> None:
    out = tmp_path / "out"
    copy = f"import shutil, sys; shutil.copyfileobj(sys.stdin.buffer, open({str(out)!r}, 'wb'))"
    with ChildSink(python(copy)) as sink:
        sink.write(b"abc")
    assert out.read_bytes() == b"abc"
    with pytest.raises(ChildFailed, match="exited with status 3"), ChildSink(python("import sys; sys.exit(3)")):
        pass


def test_a_child_that_stops_reading_is_named() -> None:
    stopped = r"exited \(status 0\) before it read the whole stream"
    with pytest.raises(ChildFailed, match=stopped), ChildSink(python("pass")) as sink:
        for _ in range(1 << 12):
            sink.write(b"x" * (1 << 16))
            sink.flush()


def test_a_journal_becomes_the_file_on_success(tmp_path: Path) -> None:
    out = tmp_path / "out"
    said: list[str] = []
    with JournalSink(str(out), KEY, None, said.append) as sink:
        sink.write(b"abc")
        assert sink.journal is not None and Path(sink.journal.part).exists()
    assert out.read_bytes() == b"abc" and not said
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_stopped_journal_keeps_its_part_and_says_how_to_go_on(tmp_path: Path) -> None:
    out = tmp_path / "out"
    part = tmp_path / "out.part"
    part.write_bytes(b"abcdef")
    checkpoint = Checkpoint({"uuid": "u"}, 4, 1, "0" * 64)
    said: list[str] = []
    with pytest.raises(RuntimeError), JournalSink(str(out), KEY, checkpoint, said.append) as sink:
        sink.write(b"gh")
        raise RuntimeError
    assert part.read_bytes() == b"abcdgh" and not out.exists()
    assert len(said) == 1 and f"send --resume {make_token(checkpoint, KEY)}" in said[0]
    assert f"receive --resume -o {out}" in said[0]
