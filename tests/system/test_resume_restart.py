"""Resuming across restarts: receivers and senders killed, resume tokens, the receiver's journal.

A slow proxy (80 KB/s) stretches the transfer of a real fixture over a few
seconds, so that processes can be killed while it runs, after the
receiver made a checkpoint durable (at least every second).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import re
import signal
import struct
import subprocess
import time
import uuid
from array import array
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.btrfs import need_root_btrfs
from support.loopfs import btrfs_loop
from support.net import CMD, free_port
from support.proxy import Proxy
from support.streams import FIXTURES, SAMPLE, boundaries, decode, partial_identity
from support.trees import differences

from sendstream import Command, Decoder, Encoder, EndOfInput, StreamHeader, encode_command, encode_stream_header
from sendstream.errors import PrefixDiffers, ResumeError, TruncatedStream
from sendstream.io.windows import file_events
from sendstream.ops.repair import Healer
from sendstream.session.protocol import PREFIX_SIZE
from sendstream.transfer.identity import stream_identity
from sendstream.transfer.ledger import Checkpoint, Ledger
from sendstream.transfer.tokens import make_token, read_token

DATA = SAMPLE.read_bytes()
SHA = hashlib.sha256(DATA).hexdigest()
RATE = 80_000
RETRY = ["-v", "--retries", "12", "--retry-delay", "0.1", "--timeout", "3"]


class Link:
    """A receiver port behind a slow (or faulty) proxy, and every process started on it (killed at the end)."""

    def __init__(self, key: Path, rate: float | None = RATE, faults: list[tuple[Any, ...]] | None = None) -> None:
        self.key = key
        self.port = free_port()
        self.proxy = Proxy(self.port, faults or [], rate=rate)
        self.procs: list[subprocess.Popen[bytes]] = []

    def _start(self, argv: list[str]) -> subprocess.Popen[bytes]:
        self.procs.append(subprocess.Popen([*CMD, *argv, "--key", str(self.key)], stderr=subprocess.PIPE))
        return self.procs[-1]

    def receiver(self, out: Path | None, *extra: str) -> subprocess.Popen[bytes]:
        output = ["-o", str(out)] if out else []
        return self._start(["receive", "--listen", f"127.0.0.1:{self.port}", *output, "-v", *extra])

    def sender(self, *extra: str, direct: bool = False, source: Path = SAMPLE) -> subprocess.Popen[bytes]:
        port = self.port if direct else self.proxy.port
        return self._start(["send", "--resumable", "--to", f"127.0.0.1:{port}", str(source), *RETRY, *extra])

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait()
        self.proxy.close()


@pytest.fixture
def link(key: Path) -> Iterator[Link]:
    link = Link(key)
    yield link
    link.close()


def state_of(out: Path) -> Path:
    return out.with_name(out.name + ".part.resume")


def checkpoint_after(out: Path, key: Path, offset: int = 1, timeout: float = 20) -> Checkpoint:
    """The receiver's durable checkpoint once it is at least at ``offset``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            checkpoint = read_token(state_of(out).read_text(), key.read_bytes())
            if checkpoint.offset >= offset:
                return checkpoint
        except (FileNotFoundError, ResumeError):
            pass
        time.sleep(0.05)
    raise AssertionError(f"no checkpoint at offset >= {offset} in {timeout} s")


def kill(*procs: subprocess.Popen[bytes]) -> None:
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def finish(*procs: subprocess.Popen[bytes]) -> list[tuple[int, bytes]]:
    results = []
    for proc in procs:
        _, err = proc.communicate(timeout=90)
        results.append((proc.returncode, err))
    return results


def assert_complete(out: Path) -> None:
    assert hashlib.sha256(out.read_bytes()).hexdigest() == SHA
    assert not out.with_name(out.name + ".part").exists() and not state_of(out).exists()


def test_a_killed_receiver_restarted_with_resume_takes_the_same_sender_back(link: Link, tmp_path: Path) -> None:
    out = tmp_path / "out.stream"
    first, send = link.receiver(out), link.sender()
    checkpoint = checkpoint_after(out, link.key, 64 << 10)
    kill(first)
    assert 0 < checkpoint.offset < len(DATA)
    (sent, send_err), (code, err) = finish(send, link.receiver(out, "--resume"))
    assert sent == 0 and code == 0, (send_err, err)
    assert f"resuming {out} at offset".encode() in err
    assert b"resumed after" in send_err
    assert_complete(out)


def test_a_killed_sender_started_again_with_the_token_sends_only_the_rest(link: Link, tmp_path: Path) -> None:
    out = tmp_path / "out.stream"
    recv, first = link.receiver(out, "--reconnect-timeout", "60"), link.sender()
    checkpoint = checkpoint_after(out, link.key, 100 << 10)
    kill(first)
    token = state_of(out).read_text().strip()
    (sent, send_err), (code, err) = finish(link.sender("--resume", token), recv)
    assert sent == 0 and code == 0, (send_err, err)
    # the receiver was still running and had more than the token: the new sender caught up to it
    resumed_at = int(send_err.split(b"resumed at offset ")[1].split(b";")[0].split()[0])
    assert resumed_at >= checkpoint.offset
    assert_complete(out)


def test_both_killed_then_both_resume_from_the_receivers_token(link: Link, tmp_path: Path) -> None:
    """The receiver, terminated while bytes flow, makes all it wrote durable and prints that token; the
    sender is killed."""
    out = tmp_path / "out.stream"
    recv, send = link.receiver(out), link.sender()
    checkpoint_after(out, link.key, 64 << 10)
    recv.terminate()
    _, said = recv.communicate(timeout=30)
    kill(send)
    assert recv.returncode == 143, said
    assert f"sendstream send --resume {state_of(out).read_text().strip()}".encode() in said
    part_size = out.with_name(out.name + ".part").stat().st_size
    recv = link.receiver(out, "--resume")
    assert recv.stderr is not None
    said = recv.stderr.readline() + recv.stderr.readline()
    token = said.split(b"--resume ")[1].split()[0].decode()
    checkpoint = read_token(token, link.key.read_bytes())
    assert checkpoint.offset == part_size  # everything the terminated receiver wrote
    (sent, send_err), (code, err) = finish(link.sender("--resume", token, direct=True), recv)
    assert sent == 0 and code == 0, (send_err, err)
    assert f"resumed at offset {checkpoint.offset}".encode() in send_err
    assert_complete(out)


def test_a_terminated_receiver_keeps_every_command_it_wrote(link: Link, tmp_path: Path) -> None:
    """Commands of 1 KiB at 80 KB/s: the receiver, terminated between its checkpoints (every second),
    makes the end of the last command it wrote durable, and its token says so."""
    head = Command.build("subvol", [("path", b"s"), ("uuid", uuid.UUID(int=7)), ("ctransid", 1)])
    writes = [
        Command.build("write", [("path", b"f"), ("file_offset", i << 10), ("data", bytes(1024))]) for i in range(400)
    ]
    source = tmp_path / "small-commands.stream"
    source.write_bytes(
        encode_stream_header(2) + b"".join(encode_command(c, 2) for c in (head, *writes, Command.build("end")))
    )
    out = tmp_path / "out.stream"
    recv, send = link.receiver(out), link.sender(source=source)
    first = checkpoint_after(out, link.key, 64 << 10)
    time.sleep(0.5)  # commands written past that checkpoint, before the next one
    recv.terminate()
    _, said = recv.communicate(timeout=30)
    kill(send)
    token = said.split(b"send --resume ")[1].split()[0].decode()
    checkpoint = read_token(token, link.key.read_bytes())
    assert checkpoint.offset == out.with_name(out.name + ".part").stat().st_size > first.offset, said
    assert checkpoint.offset in boundaries(source.read_bytes())


def full_checkpoint(data: bytes, upto: int | None = None) -> Checkpoint:
    """The checkpoint a receiver makes after ``upto`` bytes (a command boundary) of ``data``."""
    upto = len(data) if upto is None else upto
    ledger = Ledger()
    healer = Healer(lambda chunk: None, ledger=ledger)
    with contextlib.suppress(TruncatedStream):  # a prefix ends before END
        for event in file_events(io.BytesIO(data[:upto])):
            healer.event(event)
    assert ledger.offset == upto
    return Checkpoint(stream_identity(data[:PREFIX_SIZE]), upto, ledger.commands, ledger.digest())


def send_with_token(token: str, key: Path, source: Path) -> subprocess.CompletedProcess[bytes]:
    port = free_port()  # nothing listens: every refusal comes before the sender connects
    return subprocess.run(
        [*CMD, "send", "--to", f"127.0.0.1:{port}", str(source), "--key", str(key), "--resume", token],
        capture_output=True,
        timeout=60,
    )


def test_forged_and_foreign_tokens_are_refused(key: Path, tmp_path: Path) -> None:
    checkpoint = full_checkpoint(DATA)
    token = make_token(checkpoint, key.read_bytes())
    assert read_token(token, key.read_bytes()) == checkpoint
    body, tag = token[len("ssr1.") :].split(".")
    forged = "ssr1." + body[:-3] + ("A" if body[-3] != "A" else "B") + body[-2:] + "." + tag
    other_key = make_token(checkpoint, os.urandom(32))
    for bad in (forged, other_key):
        done = send_with_token(bad, key, SAMPLE)
        assert done.returncode == 2 and b"not made with this key" in done.stderr, done.stderr
    done = send_with_token("hello", key, SAMPLE)
    assert done.returncode == 2 and b"not a sendstream resume token" in done.stderr
    other = FIXTURES / "rich-incr-v2.stream"
    done = send_with_token(token, key, other)
    assert done.returncode == 2 and b"not the stream the resume token is for" in done.stderr, done.stderr
    assert b"snapshot of " in done.stderr and b"subvol of " in done.stderr


def altered(data: bytes, after: int) -> bytes:
    """``data`` with the first WRITE after offset ``after`` carrying other bytes (CRCs made anew)."""
    decoder, encoder, out = Decoder(), Encoder(), bytearray()
    decoder.receive_data(data)
    decoder.receive_data(b"")
    done = False
    while not isinstance(event := decoder.next_event(), EndOfInput):
        if isinstance(event, Command) and not done and event.offset > after and event.name == "write":
            assert event.attributes is not None  # None only for a command number this library does not know
            attrs: list[tuple[int, memoryview | bytes]] = [
                (t, bytes(v) if t != 19 else bytes(len(v))) for t, v in event.attributes
            ]
            event, done = Command(event.cmd, attrs), True
        if isinstance(event, StreamHeader | Command):
            out += encoder.send(event)
    assert done
    return bytes(out)


def test_a_stream_that_differs_before_the_tokens_offset_is_refused(key: Path, tmp_path: Path) -> None:
    token = make_token(full_checkpoint(DATA), key.read_bytes())
    changed = tmp_path / "changed.stream"
    changed.write_bytes(altered(DATA, PREFIX_SIZE))
    assert stream_identity(changed.read_bytes()[:PREFIX_SIZE]) == stream_identity(DATA[:PREFIX_SIZE])
    done = send_with_token(token, key, changed)
    assert done.returncode == 2, done.stderr
    assert b"differs from the token's before offset" in done.stderr and b"ledger" in done.stderr


def test_the_ledger_needs_a_command_boundary_and_enough_stream() -> None:
    checkpoint = full_checkpoint(DATA)
    ledger = Ledger(Checkpoint(checkpoint.stream, 20, 0, "x"))  # inside the first command
    ledger.header(1)
    with pytest.raises(PrefixDiffers, match="not where it was") as info:
        ledger.run(array("I", [100]), array("I", [7]))
    assert info.value.offset == 20
    short = Ledger(Checkpoint(checkpoint.stream, 10**9, 0, "x"))
    short.header(1)
    with pytest.raises(PrefixDiffers, match="not where it was"):
        short.finish()


def test_a_checkpoint_inside_a_run_leaves_the_ledger_where_the_stream_is() -> None:
    """A run of commands that a checkpoint falls inside is checked there, then counted once, and every
    boundary of it is known afterwards (the archive asks where each part ends)."""
    lens, crcs = array("I", [100, 200, 300, 400]), array("I", [1, 2, 3, 4])
    whole = Ledger()
    whole.header(2)
    whole.run(lens[:2], crcs[:2])
    at_two = Checkpoint(partial_identity(uuid=None), whole.offset, whole.commands, whole.digest())
    whole.run(lens[2:], crcs[2:])
    ledger = Ledger(at_two)
    ledger.header(2)
    ledger.run(lens, crcs)
    assert (ledger.offset, ledger.commands, ledger.digest()) == (whole.offset, 4, whole.digest())
    assert ledger.offset == 17 + sum(lens) + 10 * len(lens)
    assert ledger.at(at_two.offset + 310) == (3, ledger.at(at_two.offset + 310)[1])
    with pytest.raises(ValueError, match="no command boundary"):
        ledger.at(at_two.offset + 1)


def test_receive_keeps_an_unfinished_transfer_until_told_to_resume(key: Path, link: Link, tmp_path: Path) -> None:
    out = tmp_path / "out.stream"
    half = full_checkpoint(DATA, upto=next(o for o in boundaries(DATA) if o > len(DATA) // 2))
    part = out.with_name(out.name + ".part")
    part.write_bytes(DATA[: half.offset] + os.urandom(len(DATA)))  # an unverified tail, longer than the rest
    state_of(out).write_text(make_token(half, key.read_bytes()) + "\n")
    before = part.read_bytes()
    refused = subprocess.run(
        [*CMD, "receive", "--listen", f"127.0.0.1:{free_port()}", "-o", str(out), "--key", str(key)],
        capture_output=True,
    )
    assert refused.returncode == 2 and b"add --resume" in refused.stderr
    assert part.read_bytes() == before
    recv = link.receiver(out, "--resume")
    send = link.sender("--resume", make_token(half, key.read_bytes()), direct=True)
    (sent, send_err), (code, err) = finish(send, recv)
    assert sent == 0 and code == 0, (send_err, err)
    assert_complete(out)


@pytest.mark.btrfs
def test_a_btrfs_receive_child_across_cuts_ends_with_the_same_subvolume(key: Path) -> None:
    """`receive --exec 'btrfs receive DIR'` keeps one child across dropped connections."""
    need_root_btrfs()
    with btrfs_loop("512M") as mnt:
        direct, via = mnt / "direct", mnt / "via"
        direct.mkdir()
        via.mkdir()
        subprocess.run(["btrfs", "receive", "-f", str(SAMPLE), str(direct)], check=True, capture_output=True)
        cuts = [("c2s", 30_000, True), ("c2s", 150_000, False), ("s2c", 2, True), ("c2s", 90_000, True)]
        link = Link(key, rate=None, faults=cuts)
        try:
            recv = link.receiver(None, "--exec", f"btrfs receive {via}")
            (sent, send_err), (code, err) = finish(link.sender(), recv)
        finally:
            link.close()
        assert sent == 0 and code == 0, (send_err, err)
        assert link.proxy.cuts >= 2  # the last ones may come after the end
        (name,) = [p.name for p in direct.iterdir()]
        assert differences(direct / name, via / name) == []
        shown = [subprocess.run(["btrfs", "subvolume", "show", d / name], capture_output=True) for d in (direct, via)]
        received = [re.search(rb"Received UUID:\s*(\S+)", s.stdout) for s in shown]
        assert received[0] and received[1] and received[0].group(1) == received[1].group(1) != b"-"


def test_the_ledger_is_lengths_and_crcs_in_little_endian() -> None:
    """The definition a token carries between machines, on a file of two streams."""
    data = (FIXTURES / "two-concat-v1.stream").read_bytes()
    lens, crcs, commands = b"", b"", 0
    for event in decode(data):
        if event[0] == "hdr":
            lens, crcs = lens + struct.pack("<I", 0xFFFFFFFF), crcs + struct.pack("<I", event[2])
        elif event[0] == "cmd":
            length = struct.unpack_from("<I", data, event[1])[0]
            lens, crcs, commands = lens + struct.pack("<I", length), crcs + struct.pack("<I", event[4]), commands + 1
    assert lens.count(struct.pack("<I", 0xFFFFFFFF)) == 2
    digest = hashlib.sha256(b"sendstream-ledger-1" + hashlib.sha256(lens).digest() + hashlib.sha256(crcs).digest())
    checkpoint = full_checkpoint(data)
    assert (checkpoint.commands, checkpoint.ledger) == (commands, digest.hexdigest())
