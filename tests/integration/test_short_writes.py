"""Every write of ours writes all or fails: a short write never stores a truncated stream as a success.

The service runs in this process (:func:`support.storing.serving`), with the raw
file under every :class:`~sendstream.io.outputs.OutputFile` replaced by one that
writes short, lies or fills (:mod:`support.storing`); the senders are real
``sendstream send`` processes. One case runs ``sendstream serve`` itself so.
"""

from __future__ import annotations

import hashlib
import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from support.clock import Clock
from support.net import free_port, key_file, wait_listening
from support.storing import FullFileIO, LyingFileIO, ShortFileIO, sending, serving, writing_through
from support.streams import FIXTURES

from sendstream.transfer.identity import stream_identity
from sendstream.transfer.journal import CHECKPOINT_SECONDS, Journal, load_state
from sendstream.transfer.ledger import Ledger
from sendstream.transfer.stored import stream_name
from sendstream.transport.tls.keys import load_key, new_key_file

FULL = FIXTURES / "rich-full-v2.stream"
NAME = stream_name(stream_identity(FULL.read_bytes()[: 64 << 10]))
SHA256 = hashlib.sha256(FULL.read_bytes()).hexdigest()
MODES = {"plain": (), "resumable": ("--resumable",)}


def held(tmp_path: Path) -> dict[str, bytes]:
    """The files in alpha's place, hidden ones too."""
    return {p.name: p.read_bytes() for p in (tmp_path / "places" / "alpha").iterdir()}


def whole(tmp_path: Path) -> None:
    """The place holds FULL, whole, and its manifest says so."""
    files = held(tmp_path)
    assert sorted(files) == [NAME, NAME + ".json"]
    assert files[NAME] == FULL.read_bytes(), f"{len(files[NAME])} bytes stored of {FULL.stat().st_size}"
    note = json.loads(files[NAME + ".json"])
    assert note["size"] == FULL.stat().st_size and note["sha256"] == SHA256


@pytest.mark.parametrize("mode", MODES)
def test_short_writes_store_the_whole_stream(tmp_path: Path, mode: str) -> None:
    with writing_through(ShortFileIO) as tally, serving(tmp_path) as (port, log):
        sent = subprocess.run(sending(port, tmp_path, FULL, *MODES[mode]), capture_output=True, timeout=120)
    assert tally.short > 0, "the injected writer never wrote short"
    assert sent.returncode == 0, sent.stderr
    whole(tmp_path)
    assert [e["event"] for e in log.events()].count("stored") == 1


@pytest.mark.parametrize("mode", MODES)
def test_a_lost_write_is_never_named(tmp_path: Path, mode: str) -> None:
    """A layer that says it wrote what it did not (a broken file system, or a bug of ours): the file's size
    is held to what was received before it is named."""
    with writing_through(LyingFileIO) as tally, serving(tmp_path) as (port, log):
        sent = subprocess.run(sending(port, tmp_path, FULL, *MODES[mode]), capture_output=True, timeout=120)
    assert tally.short == 1
    assert sent.returncode == 4, sent.stderr
    assert f"{NAME}': it holds " in sent.stderr.decode(), sent.stderr
    assert not [name for name in held(tmp_path) if not name.startswith(".")]  # a journal may stay, hidden
    assert [e["event"] for e in log.events()].count("stored") == 0


@pytest.mark.parametrize(
    ("mode", "room", "named"),
    [("plain", 100_000, NAME), ("resumable", 100_000, NAME), ("plain", FULL.stat().st_size + 100, NAME + ".json")],
    ids=["plain-stream", "resumable-stream", "plain-manifest"],
)
def test_a_full_disk_names_the_stream_and_leaves_nothing_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str, room: int, named: str
) -> None:
    monkeypatch.setattr(FullFileIO, "room", room)
    with writing_through(FullFileIO) as tally, serving(tmp_path) as (port, log):
        sent = subprocess.run(sending(port, tmp_path, FULL, *MODES[mode]), capture_output=True, timeout=120)
    said = sent.stderr.decode()
    assert tally.short >= 1 and sent.returncode == 4, said
    assert f"{named}': No space left on device" in said and ".tmp" not in said, said
    assert not [name for name in held(tmp_path) if not name.startswith(".")]
    assert [e["event"] for e in log.events()].count("failed") == 1


def test_a_short_write_of_the_resume_token_is_finished(tmp_path: Path) -> None:
    out, clock = str(tmp_path / "out"), Clock()
    with writing_through(ShortFileIO) as tally:
        journal = Journal(out, b"k" * 32, timer=clock)
        journal.write(b"abc")
        clock.now += CHECKPOINT_SECONDS  # a checkpoint at the first commit
        journal.commit(3, stream_identity(FULL.read_bytes()), Ledger())
        journal.close()
    assert tally.short == 1  # the token (the part's 3 bytes are too few)
    assert load_state(out, b"k" * 32).offset == 3


def test_a_short_write_of_a_new_key_is_finished(tmp_path: Path) -> None:
    with writing_through(ShortFileIO) as tally:
        key = new_key_file(str(tmp_path / "new.key"))
    assert tally.short == 1 and load_key(str(tmp_path / "new.key")) == key


def test_serve_and_send_store_the_whole_stream_through_short_writes(tmp_path: Path) -> None:
    """End to end: ``sendstream serve`` writing short now and then, a plain ``sendstream send``."""
    port = free_port()
    key_file(tmp_path / "alpha.key")
    (tmp_path / "places" / "alpha").mkdir(parents=True)
    config = tmp_path / "serve.toml"
    config.write_text(f'listen = "127.0.0.1:{port}"\n[clients.alpha]\nkey = "alpha.key"\nstore = "places/alpha"\n')
    launcher = Path(__file__).parent.parent / "support" / "short_serve.py"
    serve = [sys.executable, str(launcher), "serve", "--config", str(config), "--log-format", "json"]
    with subprocess.Popen(serve, stderr=subprocess.PIPE) as proc:
        try:
            wait_listening(port)
            sent = subprocess.run(sending(port, tmp_path, FULL), capture_output=True, timeout=120)
        finally:
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
    *lines, last = err.decode().splitlines()
    assert proc.returncode == 0 and sent.returncode == 0, (err, sent.stderr)
    assert int(last.removeprefix("short writes: ")) > 0, last
    whole(tmp_path)
    assert [json.loads(line)["event"] for line in lines].count("stored") == 1
