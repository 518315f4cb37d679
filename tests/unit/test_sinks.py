"""The sinks a receiver writes to: complete on success, nothing half done on an error."""

from __future__ import annotations

import os
import shlex
import stat
import sys
from pathlib import Path

import pytest
from support.clock import Clock
from support.streams import FIXTURES, partial_identity

from sendstream.errors import ChildFailed
from sendstream.transfer.identity import stream_identity
from sendstream.transfer.journal import CHECKPOINT_SECONDS, Journal, load_state
from sendstream.transfer.ledger import Checkpoint, Ledger
from sendstream.transfer.sinks import ChildSink, FileSink, JournalSink
from sendstream.transfer.tokens import make_token

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
    checkpoint = Checkpoint(partial_identity(uuid="u"), 4, 1, "0" * 64)
    said: list[str] = []
    with pytest.raises(RuntimeError), JournalSink(str(out), KEY, checkpoint, said.append) as sink:
        sink.write(b"gh")
        raise RuntimeError
    assert part.read_bytes() == b"abcdgh" and not out.exists()
    assert len(said) == 1 and f"send --resume {make_token(checkpoint, KEY)}" in said[0]
    assert f"receive --resume -o {out}" in said[0]


def test_a_journal_is_private_whatever_the_umask(tmp_path: Path) -> None:
    """The service's journal: its part and state 0600 under umask 022, a part kept from before made 0600;
    ``receive -o FILE`` journals FILE as any other output (0666 less the umask)."""
    path, umask = tmp_path / "s", os.umask(0o022)
    part, state = Path(str(path) + ".part"), Path(str(path) + ".part.resume")
    try:
        clock = Clock()
        journal = Journal(str(path), KEY, timer=clock)
        journal.write(b"abc")
        clock.now += CHECKPOINT_SECONDS  # a checkpoint at the first commit
        journal.commit(3, stream_identity((FIXTURES / "rich-full-v2.stream").read_bytes()), Ledger())
        journal.close()
        assert (mode(part), mode(state)) == (0o600, 0o600)
        part.chmod(0o644)  # as an earlier release made it
        Journal(str(path), KEY, load_state(str(path), KEY)).close()
        assert mode(part) == 0o600
        with JournalSink(str(tmp_path / "out"), KEY, None, print) as sink:
            sink.write(b"abc")
        assert mode(tmp_path / "out") == 0o644
    finally:
        os.umask(umask)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_journal_checkpoints_once_its_interval_has_passed(tmp_path: Path) -> None:
    """Commits of a few bytes: none is made durable until CHECKPOINT_SECONDS have passed since the last."""
    clock, path = Clock(), str(tmp_path / "s")
    identity, ledger = stream_identity((FIXTURES / "rich-full-v2.stream").read_bytes()), Ledger()
    journal = Journal(path, KEY, timer=clock)
    for offset in (3, 6, 9):
        journal.write(b"abc")
        clock.now += CHECKPOINT_SECONDS / 4
        journal.commit(offset, identity, ledger)
    journal.close()
    assert not Path(path + ".part").exists()  # no checkpoint yet: nothing to resume from
    journal = Journal(path, KEY, timer=clock)
    journal.write(b"abc")
    clock.now += CHECKPOINT_SECONDS
    journal.commit(3, identity, ledger)
    journal.write(b"def")
    journal.commit(6, identity, ledger)  # made durable only after another interval
    journal.close()
    assert load_state(path, KEY).offset == 3
