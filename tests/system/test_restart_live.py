"""A real restarted `btrfs send`, found and repaired by our tools.

When `btrfs send` is stopped and continued while the kernel is blocked
writing into a pipe, the send ioctl restarts and a second stream header and
the whole stream again follow what was written (FORMAT.md, "The restarted
ioctl"). These tests make that happen on a loop-mounted btrfs: they read the
output of `btrfs send` slowly, SIGSTOP and SIGCONT the process while its
ioctl is blocked on the pipe, and check `sendstream verify`, `verify --scan`
and `repair` on what came out, then a live `send | repair | receive`.

Needs root, loop devices and btrfs-progs; skips elsewhere, and skips when
the kernel does not restart the ioctl within a few attempts.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import platform
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from support.btrfs import need_root_btrfs
from support.loopfs import btrfs_loop

pytestmark = pytest.mark.btrfs

MAGIC = b"btrfs-stream\0"
STREAM_HEADER_SIZE = 17  # magic and a u32 version
COMMAND_HEADER_SIZE = 10  # u32 length, u16 command, u32 crc
SENDSTREAM = [sys.executable, "-m", "sendstream"]
CHUNK = 64 * 1024
# The send ioctl's syscall number, to check where the signal lands (other
# architectures only check the wait channel).
IOCTL = {"x86_64": 16, "aarch64": 29}.get(platform.machine())


@dataclass(frozen=True)
class Attempt:
    """When to stop `btrfs send`: after ``after`` bytes were read, stop
    reading for ``pause`` s so the pipe fills, then keep it stopped ``stopped`` s."""

    after: int
    pause: float
    stopped: float
    delay: float = 0.003  # sleep after each 64 KiB read until the signal

    def __str__(self) -> str:
        return f"stop after {self.after} B read, pause {self.pause * 1e3:.0f} ms, stopped {self.stopped * 1e3:.0f} ms"


ATTEMPTS = [
    Attempt(512 * 1024, 0.05, 0.05),
    Attempt(256 * 1024, 0.10, 0.02),
    Attempt(1536 * 1024, 0.03, 0.10),
    Attempt(768 * 1024, 0.20, 0.20, delay=0.01),
    Attempt(3 * 1024 * 1024, 0.05, 0.05, delay=0.001),
]
ATTEMPT_DEADLINE = 20.0  # seconds before the processes of one attempt are killed


@dataclass
class Outcome:
    """What one attempt saw."""

    attempt: Attempt
    data: bytearray = field(default_factory=bytearray)
    signalled_at: int | None = None  # bytes read when SIGSTOP was sent
    where: str = ""  # wait channel and syscall of the ioctl thread then
    stopped_state: str = ""
    seconds: float = 0.0

    @property
    def headers(self) -> list[int]:
        return find_all(bytes(self.data), MAGIC)

    @property
    def restarted(self) -> bool:
        return len(self.headers) > 1

    def describe(self) -> str:
        if self.signalled_at is None:
            what = f"never signalled ({self.where or 'send finished first'})"
        else:
            what = f"signalled at {self.signalled_at} B read [{self.where}, then state {self.stopped_state}]"
        return f"{self.attempt}: {what}; {len(self.data)} B out, headers at {self.headers}, {self.seconds:.2f} s"


@dataclass(frozen=True)
class Source:
    mnt: Path
    snap: Path
    reference: bytes  # `btrfs send -f` of snap, undisturbed
    digest: dict[str, str]  # what the received tree must hold


def find_all(data: bytes, needle: bytes) -> list[int]:
    out, at = [], data.find(needle)
    while at >= 0:
        out.append(at)
        at = data.find(needle, at + 1)
    return out


def sh(*args: str | Path, **kw: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(a) for a in args], check=True, capture_output=True, timeout=60, **kw)  # type: ignore[call-overload, no-any-return]


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file, target of every link, and every directory."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            out[rel] = "-> " + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = oct(path.lstat().st_mode)
    return out


def make_tree(root: Path) -> dict[str, str]:
    """About 12 MB in three large files, plus small ones; returns their digest."""
    rng = random.Random(0x5E4D)
    expected = {}
    for name, size in (("big-a", 4 << 20), ("big-b", 3 << 20), ("big-c", (5 << 20) + 12345)):
        data = rng.randbytes(size)  # incompressible, so the stream is as large as the data
        (root / name).write_bytes(data)
        expected[name] = hashlib.sha256(data).hexdigest()
    (root / "small").mkdir()
    expected["small"] = "dir"
    for i in range(40):
        data = rng.randbytes(rng.choice((0, 1, 100, 4095, 4096, 4097, rng.randrange(1, 20000))))
        (root / "small" / f"f{i:02}").write_bytes(data)
        expected[f"small/f{i:02}"] = hashlib.sha256(data).hexdigest()
    os.symlink("big-a", root / "link")
    expected["link"] = "-> big-a"
    return expected


@pytest.fixture(scope="module")
def source() -> Iterator[Source]:
    need_root_btrfs()
    with btrfs_loop("512M") as mnt:
        sh("btrfs", "subvolume", "create", mnt / "src")
        expected = make_tree(mnt / "src")
        snap = mnt / "snap"
        sh("btrfs", "subvolume", "snapshot", "-r", mnt / "src", snap)
        sh("sync")
        assert tree_digest(snap) == expected
        ref = mnt / "reference.stream"
        sh("btrfs", "send", "-q", "-f", ref, snap)
        reference = ref.read_bytes()
        assert find_all(reference, MAGIC) == [0]
        assert 8 << 20 < len(reference) < 16 << 20
        yield Source(mnt, snap, reference, expected)


def command_ends(stream: bytes) -> list[int]:
    """Where every command of a clean single stream ends."""
    ends, pos = [], STREAM_HEADER_SIZE
    while pos < len(stream):
        pos += COMMAND_HEADER_SIZE + int.from_bytes(stream[pos : pos + 4], "little")
        ends.append(pos)
    assert pos == len(stream)
    return ends


def ioctl_state(pid: int) -> tuple[bool, str]:
    """Whether the main thread of ``pid`` (the one in the send ioctl; a
    second thread copies the ioctl's pipe to stdout) waits on a full pipe."""
    try:
        wchan = Path(f"/proc/{pid}/wchan").read_text().strip()
        syscall = Path(f"/proc/{pid}/syscall").read_text().split()
    except OSError as exc:
        return False, f"cannot read /proc/{pid}: {exc}"
    nr = int(syscall[0]) if syscall and syscall[0].lstrip("-").isdigit() else None
    blocked = "pipe" in wchan and (IOCTL is None or nr == IOCTL)
    return blocked, f"wchan {wchan}, syscall {nr}"


def process_state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def stop_and_continue(pid: int, attempt: Attempt, outcome: Outcome) -> None:
    """SIGSTOP then SIGCONT ``pid`` once its ioctl is blocked on the pipe."""
    time.sleep(attempt.pause)  # stop reading: the pipes fill and the ioctl blocks
    deadline = time.monotonic() + 2.0
    blocked, outcome.where = ioctl_state(pid)
    while not blocked and time.monotonic() < deadline:
        time.sleep(0.01)
        blocked, outcome.where = ioctl_state(pid)
    if not blocked:
        return
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(attempt.stopped)
        outcome.stopped_state = process_state(pid)
    finally:
        os.kill(pid, signal.SIGCONT)
    outcome.signalled_at = len(outcome.data)


def relay(send: subprocess.Popen[bytes], attempt: Attempt, sink: Callable[[bytes], object] | None) -> Outcome:
    """Read all of ``send``'s stdout, slowly until it was stopped and continued
    once, and hand every piece to ``sink``."""
    assert send.stdout is not None
    fd = send.stdout.fileno()
    outcome = Outcome(attempt)
    started = time.monotonic()
    tried = False
    while True:
        if not tried and len(outcome.data) >= attempt.after:
            tried = True
            stop_and_continue(send.pid, attempt, outcome)
        chunk = os.read(fd, CHUNK)
        if not chunk:
            break
        outcome.data += chunk
        if sink is not None:
            sink(chunk)
        if not tried:
            time.sleep(attempt.delay)
    outcome.seconds = time.monotonic() - started
    return outcome


class Watchdog:
    """Kills the processes of an attempt that takes too long (they are ours:
    SIGCONT first, in case one is stopped)."""

    def __init__(self, *procs: subprocess.Popen[bytes]) -> None:
        self.procs = list(procs)
        self.fired = False
        self._timer = threading.Timer(ATTEMPT_DEADLINE, self._fire)
        self._timer.daemon = True

    def _fire(self) -> None:
        self.fired = True
        self.reap()

    def reap(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    p.kill()
                except ProcessLookupError:
                    pass

    def __enter__(self) -> Watchdog:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        self.reap()
        for p in self.procs:
            for f in (p.stdin, p.stdout, p.stderr):
                if f is not None:
                    f.close()
            p.wait(timeout=10)


def skip_without_restart(outcomes: list[Outcome]) -> None:
    tried = "\n  ".join(o.describe() for o in outcomes)
    pytest.skip(
        f"the kernel ({platform.release()}) never restarted the send ioctl in {len(outcomes)} attempts "
        f"of SIGSTOP/SIGCONT on `btrfs send` blocked writing into a slowly read pipe:\n  {tried}"
    )


def restarted_send(source: Source) -> tuple[Outcome, list[Outcome]]:
    """`btrfs send` into a slowly read pipe, stopped and continued, until
    its output holds a second stream header."""
    outcomes = []
    for attempt in ATTEMPTS:
        send = subprocess.Popen(
            ["btrfs", "send", "-q", str(source.snap)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        with Watchdog(send) as dog:
            assert Path(f"/proc/{send.pid}/comm").read_text().strip() == "btrfs"
            outcome = relay(send, attempt, None)
            assert send.stderr is not None
            err = send.stderr.read()
            rc = send.wait(timeout=10)
        outcomes.append(outcome)
        assert not dog.fired, f"`btrfs send` took over {ATTEMPT_DEADLINE} s: {outcome.describe()}"
        assert rc == 0, f"`btrfs send` exit {rc}: {err.decode(errors='replace')}; {outcome.describe()}"
        if outcome.restarted:
            return outcome, outcomes
    skip_without_restart(outcomes)
    raise AssertionError("unreachable")


def test_restarted_send_is_found_and_repaired(source: Source, tmp_path: Path) -> None:
    outcome, outcomes = restarted_send(source)
    data = bytes(outcome.data)
    headers = outcome.headers
    at = headers[1]
    print(f"restart after {len(outcomes)} attempt(s): {outcome.describe()}")
    assert outcome.signalled_at is not None and outcome.signalled_at <= at
    # What the kernel did (FORMAT.md): the start of the stream, cut, then the whole stream again.
    assert len(headers) == 2, outcome.describe()
    assert data[:at] == source.reference[:at]
    assert data[at:] == source.reference, "the replay after the restart differs from a clean send"
    ends = command_ends(source.reference)
    complete = sum(1 for end in ends if end <= at)
    partial = at - (ends[complete - 1] if complete else STREAM_HEADER_SIZE)

    damaged = tmp_path / "damaged.stream"
    damaged.write_bytes(data)

    checked = subprocess.run([*SENDSTREAM, "verify", damaged], capture_output=True, timeout=60)
    assert checked.returncode == 5, checked
    err = checked.stderr.decode()
    assert f"stream restarted at offset {at} after {complete} complete commands" in err, err
    assert f"{partial} bytes of a partial command" in err, err

    scan = subprocess.run([*SENDSTREAM, "verify", "--scan", damaged], capture_output=True, timeout=60)
    assert scan.returncode == 0, scan
    listed = re.findall(rb"^offset (\d+): stream header, version (\d+)", scan.stdout, re.M)
    version = int.from_bytes(data[13:17], "little")
    assert [(int(o), int(v)) for o, v in listed] == [(0, version), (at, version)], scan.stdout

    repaired = tmp_path / "repaired.stream"
    rep = subprocess.run([*SENDSTREAM, "repair", damaged, repaired], capture_output=True, timeout=60)
    assert rep.returncode == 0, rep
    assert b"1 restart repaired" in rep.stderr, rep.stderr
    assert f"restart at offset {at} after {complete} complete commands".encode() in rep.stderr, rep.stderr
    assert repaired.read_bytes() == source.reference

    piped = subprocess.run([*SENDSTREAM, "repair", "-", "-"], input=data, capture_output=True, timeout=60)
    assert piped.returncode == 0, piped.stderr
    assert b"1 restart repaired" in piped.stderr, piped.stderr
    assert piped.stdout == source.reference

    again = subprocess.run([*SENDSTREAM, "verify", repaired], capture_output=True, timeout=60)
    assert again.returncode == 0, again

    dest = source.mnt / "received-from-file"
    dest.mkdir()
    sh("btrfs", "receive", "-f", repaired, dest)
    assert tree_digest(dest / source.snap.name) == source.digest


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def pipeline(source: Source, attempt: Attempt, dest: Path) -> tuple[Outcome, dict[str, tuple[int, bytes]]]:
    """`btrfs send | (slow relay here) | sendstream repair - - | btrfs receive`,
    with `btrfs send` stopped and continued while blocked."""
    dest.mkdir()
    send = subprocess.Popen(["btrfs", "send", "-q", str(source.snap)], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    repair = subprocess.Popen(
        [*SENDSTREAM, "repair", "-", "-"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert repair.stdout is not None and repair.stdin is not None
    receive = subprocess.Popen(
        ["btrfs", "receive", str(dest)], stdin=repair.stdout, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    repair.stdout.close()  # receive holds it now; repair sees EPIPE if receive goes away
    results: dict[str, tuple[int, bytes]] = {}
    with Watchdog(send, repair, receive) as dog:
        stdin = repair.stdin
        try:
            outcome = relay(send, attempt, lambda chunk: write_all(stdin.fileno(), chunk))
        except BrokenPipeError:  # repair gave up; its exit code and stderr say why
            outcome = Outcome(attempt)
            send.kill()
        finally:
            with contextlib.suppress(BrokenPipeError):
                stdin.close()
        for name, p in (("send", send), ("repair", repair), ("receive", receive)):
            assert p.stderr is not None
            err = p.stderr.read()
            results[name] = (p.wait(timeout=ATTEMPT_DEADLINE), err)
    assert not dog.fired, f"the pipeline took over {ATTEMPT_DEADLINE} s: {outcome.describe()}; {results}"
    return outcome, results


def test_pipeline_heals_a_live_restart(source: Source) -> None:
    outcomes = []
    for n, attempt in enumerate(ATTEMPTS):
        dest = source.mnt / f"received-live-{n}"
        outcome, results = pipeline(source, attempt, dest)
        outcomes.append(outcome)
        for name, (rc, err) in results.items():
            assert rc == 0, f"{name} exit {rc}: {err.decode(errors='replace')}; {outcome.describe()}"
        assert tree_digest(dest / source.snap.name) == source.digest, outcome.describe()
        if outcome.restarted:
            break
    else:
        skip_without_restart(outcomes)
    print(f"restart after {len(outcomes)} attempt(s): {outcome.describe()}")
    restarts = len(outcome.headers) - 1
    repair_err = results["repair"][1].decode()
    assert f"{restarts} restart{'s' * (restarts != 1)} repaired" in repair_err, repair_err
    for at in outcome.headers[1:]:
        assert f"restart at offset {at} " in repair_err, repair_err
