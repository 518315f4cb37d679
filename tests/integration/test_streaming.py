"""Pipelines that stream: what has arrived on a pipe goes on at once, while the writer pauses."""

from __future__ import annotations

import contextlib
import fcntl
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.net import announced, free_port, key_file, tls_args, wait_listening
from support.pipeline import PAUSE_WAIT, Pipeline, halfway, truncated, whole
from support.streams import ROOT, SAMPLE, boundaries

from sendstream.codec.framer import Framer
from sendstream.format.command import Command
from sendstream.io.pipes import PIPE_SIZE, widen
from sendstream.io.windows import file_events
from sendstream.transfer.progress import REDRAW


@pytest.mark.parametrize(
    "args",
    [
        ["repair", "-q", "-", "-"],
        ["convert", "-", "-"],
        ["convert", "--to-version", "1", "-", "-"],
        ["dump", "-"],
        ["dump", "--json", "-"],
    ],
    ids=["repair", "convert", "convert-v1", "dump", "dump-json"],
)
def test_what_has_arrived_comes_out_while_the_writer_pauses(args: list[str]) -> None:
    data = SAMPLE.read_bytes()
    cuts = boundaries(data)
    pauses = [cuts[k * len(cuts) // 6] for k in range(1, 6)]  # wherever a buffered output happens to stand
    pipe = Pipeline(args)
    done = 0
    for end in pauses:
        expected = truncated(args, data[:end])  # every command before the pause, nothing after it
        pipe.write(data[done:end])
        done = end
        during = pipe.wait_for(lambda out: len(out) >= len(expected))  # noqa: B023 (called within the iteration)
        assert during == expected, f"{len(during)} of {len(expected)} bytes came out while the writer paused at {end}"
    pipe.write(data[done:])
    code, out, err = pipe.finish()
    assert (code, out) == (0, whole(args, data)), err


def test_the_journal_holds_the_checked_prefix_while_the_sender_pauses(tmp_path: Path) -> None:
    data = SAMPLE.read_bytes()
    cut = halfway(data)
    key = key_file(tmp_path / "key")
    out = tmp_path / "snap.stream"
    tls = tls_args("tls13-aes128-gcm", key)
    receiving = Pipeline(["receive", "--listen", "127.0.0.1:0", "-o", str(out), "-q", *tls])
    port, _ = announced(receiving.proc)
    sending = Pipeline(["send", "--to", f"127.0.0.1:{port}", "-", "-q", "--resumable", *tls])
    sending.write(data[:cut])
    part = out.with_name(out.name + ".part")
    deadline = time.monotonic() + PAUSE_WAIT
    while not (part.exists() and part.stat().st_size >= cut) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert part.read_bytes() == data[:cut]
    sending.write(data[cut:])
    assert sending.finish()[0] == 0
    assert receiving.finish()[0] == 0
    assert out.read_bytes() == data


def _receiver(mode: str, key: Path, output: list[str]) -> tuple[Pipeline, int]:
    """A receiver on port 0, and the port it got."""
    receiving = Pipeline(["receive", "--listen", "127.0.0.1:0", *output, "-q", *tls_args(mode, key)])
    return receiving, announced(receiving.proc)[0]


@pytest.mark.parametrize(
    ("mode", "extra", "via"),
    [
        ("none", [], "stdout"),
        ("tls13-aes128-gcm", [], "stdout"),
        ("tls13-aes128-gcm", ["--resumable"], "stdout"),
        ("tls13-aes128-gcm", [], "exec"),
        ("tls13-aes128-gcm", [], "relay"),
    ],
    ids=["plain", "tls", "tls-resumable", "exec", "relay"],
)
def test_a_paused_sender_s_commands_come_out_at_the_receiver(
    mode: str, extra: list[str], via: str, tmp_path: Path
) -> None:
    data = SAMPLE.read_bytes()
    cut = halfway(data)
    key = key_file(tmp_path / "key")
    # `--exec cat`: the child inherits the receiver's stdout, so what it was handed is read there
    receiving, port = _receiver(mode, key, ["--exec", "cat"] if via == "exec" else ["-o", "-"])
    relaying = None
    if via == "relay":
        legs = ["--listen-tls", mode, "--listen-key", str(key), "--to-tls", mode, "--to-key", str(key)]
        relaying = Pipeline(["relay", "--listen", "127.0.0.1:0", "--to", f"127.0.0.1:{port}", "-q", *legs])
        port, _ = announced(relaying.proc)
    sending = Pipeline(["send", "--to", f"127.0.0.1:{port}", "-", "-q", *tls_args(mode, key), *extra])
    sending.write(data[:cut])
    during = receiving.wait_for(lambda out: len(out) >= cut)
    assert during == data[:cut], f"{len(during)} of the {cut} bytes sent came out during the pause"
    sending.write(data[cut:])
    assert sending.finish()[0] == 0
    if relaying is not None:
        assert relaying.finish()[0] == 0
    code, out, err = receiving.finish()
    assert (code, out) == (0, data), err


def test_a_plain_receiver_s_file_holds_the_checked_prefix_while_the_sender_pauses(tmp_path: Path) -> None:
    data = SAMPLE.read_bytes()
    cut = halfway(data)
    key = key_file(tmp_path / "key")
    outdir = tmp_path / "out"
    outdir.mkdir()
    out = outdir / "snap.stream"
    receiving, port = _receiver("none", key, ["-o", str(out)])
    sending = Pipeline(["send", "--to", f"127.0.0.1:{port}", "-", "-q", "--tls", "none"])
    sending.write(data[:cut])

    def written() -> bytes:
        files = list(outdir.iterdir())  # the temporary file that becomes FILE
        return files[0].read_bytes() if len(files) == 1 else b""

    deadline = time.monotonic() + PAUSE_WAIT
    while len(written()) < cut and time.monotonic() < deadline:
        time.sleep(0.05)
    assert written() == data[:cut]
    assert not out.exists()  # FILE appears only once the stream is complete
    sending.write(data[cut:])
    assert sending.finish()[0] == 0
    assert receiving.finish()[0] == 0
    assert out.read_bytes() == data


def test_verify_names_a_bad_command_while_the_writer_pauses() -> None:
    data = SAMPLE.read_bytes()
    cuts = boundaries(data)
    bad_at = halfway(data)
    nxt = cuts[cuts.index(bad_at) + 1]
    bad = bytearray(data[:nxt])
    bad[nxt - 1] ^= 0xFF  # the last byte of that command: its CRC no longer holds
    pipe = Pipeline(["verify", "-"])
    pipe.write(bytes(bad))
    started = time.monotonic()
    try:
        code = pipe.proc.wait(PAUSE_WAIT)  # the writer has not closed its end: verify must not wait for more
    except subprocess.TimeoutExpired:
        pytest.fail(f"verify still waited {PAUSE_WAIT} s after the bad command arrived")
    assert time.monotonic() - started < PAUSE_WAIT
    assert code != 0
    assert pipe.proc.stderr is not None
    err = pipe.proc.stderr.read().decode()
    assert f"offset {bad_at}" in err, err


def test_the_progress_line_moves_while_bytes_flow(tmp_path: Path) -> None:
    """On a terminal the receiver's progress line is redrawn as data arrives, not only at the end: the
    producer sends its next piece only once the line has moved for the last (four times before the end).
    A bar is redrawn at most every REDRAW seconds, by the bytes that come after: each piece waits that long."""
    import pty

    data = SAMPLE.read_bytes()
    cuts = boundaries(data)
    steps = [cuts[i * len(cuts) // 5] for i in range(1, 5)]
    port = free_port()
    master, slave = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    receiving = subprocess.Popen(
        [sys.executable, "-m", "sendstream", "receive", "--listen", f"127.0.0.1:{port}", "-o", "-", "--tls", "none"],
        stdout=subprocess.DEVNULL,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    shown: queue.Queue[bytes] = queue.Queue()

    def watch() -> None:
        with contextlib.suppress(OSError):  # EIO once the receiver has closed the terminal
            while chunk := os.read(master, 4096):
                shown.put(chunk)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    wait_listening(port)
    sending = Pipeline(["send", "--to", f"127.0.0.1:{port}", "-", "-q", "--tls", "none"])
    lines: list[bytes] = []
    done = 0
    for end in steps:
        time.sleep(2 * REDRAW)
        sending.write(data[done:end])
        done = end
        seen = len(lines)
        while len(lines) == seen:
            lines += [line for line in shown.get(timeout=30).split(b"\r") if line.startswith(b"received ")]
    sending.write(data[done:])
    assert sending.finish()[0] == 0
    assert receiving.wait(30) == 0
    watcher.join(5)
    os.close(master)
    assert len(set(lines)) >= 4, lines


def test_a_producer_that_writes_a_little_at_a_time_wakes_the_reader_less_often() -> None:
    # btrfs send of small files writes a few commands at a time: waking for each write costs a core
    data = SAMPLE.read_bytes()
    cuts = boundaries(data)
    pieces = [data[a:b] for a, b in zip([0, *cuts], [*cuts, len(data)], strict=True) if b > a]
    r, w = os.pipe()

    def produce() -> None:
        with open(w, "wb", buffering=0) as f:
            for piece in pieces:
                f.write(piece)
                time.sleep(0.0001)

    reads = 0

    def counted() -> None:
        nonlocal reads
        reads += 1

    writer = threading.Thread(target=produce)
    writer.start()
    with open(r, "rb") as f:
        got = [event for event in file_events(f, Framer(), before_read=counted) if isinstance(event, Command)]
    writer.join()
    with SAMPLE.open("rb") as f:
        expected = [event.offset for event in file_events(f) if isinstance(event, Command)]
    assert [event.offset for event in got] == expected  # every command, each checked
    # without coalescing the reader wakes once a write (507 reads for 506 writes); with it, a third of that
    # on a quiet machine, and a little more where the producer's 0.1 ms sleeps stretch (172: CI, 2026-12-04)
    assert reads <= len(pieces) / 2, f"{reads} reads for {len(pieces)} writes"


def test_a_pipe_is_widened() -> None:
    r, w = os.pipe()
    try:
        widen(w)
        assert fcntl.fcntl(r, fcntl.F_GETPIPE_SZ) == PIPE_SIZE
    finally:
        os.close(r)
        os.close(w)
    with open(sys.executable, "rb") as f:
        widen(f.fileno())  # not a pipe: left alone
