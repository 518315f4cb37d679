"""Memory bounded by the limits, never by the input: every command fed hostile input under RLIMIT_AS.

Each command runs in a child process whose address space is capped at
300 MB (the interpreter, the native module and the input windows included)
on inputs of 100 MB (10 MB on the pure-Python backend, which is slower),
built with the project's encoder to make memory grow with the input:
millions of CRC-valid unknown commands (what a header followed by zeros
is), unknown attributes, paths of 32,767 components, millions of names,
renames, as many names as the default limit allows, restarted streams.
The rule: success or one of our errors with its documented exit code (8
names the option that raises the limit), never a MemoryError, a traceback
or a signal.

Each command meets the inputs that stress what it holds (the problem log,
the healer's ledger, the trackers of ls, diff, paths and convert, the
extractor's report); a command and input that only repeat a case at the
cost of minutes of CI (the event path handles 10 M unknown commands at
about 3 us each) are left out, as the table says. Each runs on both
backends, but for the inputs that load the path tables (the same code on
both): those on the native one only.
"""

from __future__ import annotations

import fcntl
import os
import resource
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.streams import END, backend_env

from sendstream import Command, encode_command, encode_stream_header
from sendstream.analysis.paths import MAX_NAMES, NAME_UNIT
from sendstream.codec.backend import Backend, default

MB = 1_000_000
ADDRESS_SPACE = 300 * MB
CMD = [sys.executable, "-m", "sendstream"]


def command(name: str, *attrs: tuple[str, object]) -> bytes:
    return encode_command(Command.build(name, list(attrs)), 2)


SUBVOL = command("subvol", ("path", b"s"), ("uuid", uuid.UUID(int=1)), ("ctransid", 1))


def write_stream(path: Path, body: Iterator[bytes], size: int) -> None:
    """A header, SUBVOL, commands from ``body`` until ``size`` bytes, END."""
    with path.open("wb") as f:
        f.write(encode_stream_header(2) + SUBVOL)
        written = 17 + len(SUBVOL)
        for chunk in body:
            if written + len(chunk) > size - len(END):
                break
            f.write(chunk)
            written += len(chunk)
        f.write(END)


def repeat(chunk: bytes) -> Iterator[bytes]:
    while True:
        yield chunk


def zeros(path: Path, size: int) -> None:
    """CRC-valid 10-byte "command 0" records: unknown commands without a path."""
    with path.open("wb") as f:
        f.write(encode_stream_header(2))
        f.write(bytes((size - 27) // 10 * 10))
        f.write(END)


def unknown_attributes(path: Path, size: int) -> None:
    """CHMODs each carrying an unknown attribute."""
    write_stream(path, repeat(encode_command(Command(18, [(15, b"f"), (5, bytes(8)), (40, b"")]), 2)), size)


def many_unknown_attributes(path: Path, size: int) -> None:
    """CHMODs each carrying 16,000 unknown attributes (every number from 100 up)."""
    extra = [(t, b"") for t in range(100, 16_100)]
    write_stream(path, repeat(encode_command(Command(18, [(15, b"f"), (5, bytes(8)), *extra]), 2)), size)


def deep_paths(path: Path, size: int) -> None:
    """One legal CHMOD again and again: 32,767 components, 65,533 bytes."""
    write_stream(path, repeat(command("chmod", ("path", b"/".join([b"a"] * 32767)), ("mode", 0o644))), size)


def distinct_names(path: Path, size: int) -> None:
    """Twice as many names as the default limit allows; then one command repeated."""
    names = (command("chmod", ("path", b"%06x" % i), ("mode", 0o644)) for i in range(2 * MAX_NAMES))
    write_stream(path, _then(names, repeat(command("chmod", ("path", b"x"), ("mode", 0)))), size)


def renames(path: Path, size: int) -> None:
    pair = command("rename", ("path", b"a"), ("path_to", b"b")) + command("rename", ("path", b"b"), ("path_to", b"a"))
    write_stream(path, repeat(pair), size)


def names_at_the_limit(path: Path, size: int) -> None:
    """As many names as the default allows, each as long as one name may be: the most memory ls may use."""
    dirs = 100
    files = min(MAX_NAMES - 1 - dirs, size // 100)
    stem = b"f" * (NAME_UNIT - 8)
    made = (command("mkfile", ("path", b"d%02d/%s%08x" % (i % dirs, stem, i)), ("ino", 1000 + i)) for i in range(files))
    write_stream(path, made, size)


def restarts(path: Path, size: int) -> None:
    """A restart after every command: a new header and the stream so far (the SUBVOL) again."""
    with path.open("wb") as f:
        restart = encode_stream_header(2) + SUBVOL
        f.write(restart * (size // len(restart)))
        f.write(END)


def _then(first: Iterator[bytes], then: Iterator[bytes]) -> Iterator[bytes]:
    yield from first
    yield from then


INPUTS: dict[str, Callable[[Path, int], None]] = {
    f.__name__: f
    for f in (
        zeros,
        unknown_attributes,
        many_unknown_attributes,
        deep_paths,
        distinct_names,
        renames,
        names_at_the_limit,
        restarts,
    )
}
# command -> (its arguments, the inputs it meets); IN, OUT and DIR are put in place
COMMANDS: dict[str, tuple[list[str], list[str]]] = {
    "verify": (["verify", "IN"], ["zeros", "many_unknown_attributes", "restarts", "deep_paths", "distinct_names"]),
    "verify-keep-going": (["verify", "--keep-going", "IN"], ["zeros", "many_unknown_attributes"]),
    "dump": (["dump", "IN"], ["zeros", "many_unknown_attributes", "deep_paths"]),
    "dump-json": (["dump", "--json", "IN"], ["deep_paths"]),
    "repair": (["repair", "IN", "OUT"], ["zeros", "many_unknown_attributes", "restarts"]),
    "convert": (["convert", "IN", "-"], ["deep_paths", "distinct_names"]),
    "convert-v1": (["convert", "--to-version", "1", "IN", "-"], ["deep_paths", "distinct_names"]),
    "ls": (["ls", "IN"], ["zeros", "deep_paths", "distinct_names", "names_at_the_limit"]),
    "diff": (["diff", "IN"], ["deep_paths", "distinct_names", "names_at_the_limit"]),
    "paths": (["paths", "IN"], ["unknown_attributes", "deep_paths", "renames", "names_at_the_limit"]),
    "stats": (["stats", "IN"], ["restarts"]),
    "extract": (["extract", "IN", "DIR"], ["many_unknown_attributes", "deep_paths"]),
}
# what each may end with: our exit codes (README), 8 only with the option that raises the limit
ALLOWED = {0, 1, 3, 4, 5, 8}


@pytest.fixture(scope="session")
def made(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str, Backend], Path]:
    """Each input, of the size for a backend, written once for the run, whatever the number of workers
    (pytest-xdist): the first worker to ask writes it, under a lock, in the run's shared base directory."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base

    def get(name: str, backend: Backend) -> Path:
        size = 100 * MB if backend.is_native else 10 * MB
        where = shared / f"hostile-{size}"
        where.mkdir(exist_ok=True)
        path = where / f"{name}.stream"
        with open(where / f"{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not path.exists():
                partial = where / f"{name}.partial"
                INPUTS[name](partial, size)
                partial.rename(path)
        return path

    return get


def _cap() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))


def check(code: int, err: str) -> None:
    assert "Traceback" not in err and "MemoryError" not in err, err[-2000:]
    assert code in ALLOWED, (code, err[-2000:])
    if code == 8:
        assert "limit reached" in err and " raises it" in err, err[-2000:]


# what loads the path tables, the same code on both backends: on the native one only
PATH_TABLES = {"deep_paths", "names_at_the_limit", "distinct_names", "renames"}
CASES = [
    (c, i, b)
    for c, (_, inputs) in COMMANDS.items()
    for i in inputs
    for b in ("native", "pure")
    if b == "native" or i not in PATH_TABLES
]


@pytest.mark.parametrize(
    ("name", "hostile", "backend"), CASES, ids=[f"{c}-{i}-{b}" for c, i, b in CASES], indirect=["backend"]
)
def test_memory_stays_bounded(
    made: Callable[[str, Backend], Path], tmp_path: Path, name: str, hostile: str, backend: Backend
) -> None:
    args, _ = COMMANDS[name]
    (tmp_path / "dir").mkdir()
    places = {"IN": str(made(hostile, backend)), "OUT": str(tmp_path / "out"), "DIR": str(tmp_path / "dir")}
    done = subprocess.run(
        [*CMD, *(places.get(a, a) for a in args)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=_cap,
        timeout=600,
        env=backend_env(backend),
    )
    check(done.returncode, done.stderr.decode(errors="replace"))


@pytest.mark.parametrize("hostile", ["zeros", "many_unknown_attributes"])
def test_memory_stays_bounded_over_the_network(made: Callable[[str, Backend], Path], hostile: str) -> None:
    """send and receive, --tls none, both under the limit: the sender heals, the receiver checks again."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    address = f"127.0.0.1:{port}"
    receiver = subprocess.Popen(
        [*CMD, "receive", "--listen", address, "--tls", "none", "-o", os.devnull, "-q"],
        stderr=subprocess.PIPE,
        preexec_fn=_cap,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as knock:
                if knock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.05)
        sent = subprocess.run(
            [*CMD, "send", "--to", address, "--tls", "none", "-q", str(made(hostile, default()))],
            stderr=subprocess.PIPE,
            preexec_fn=_cap,
            timeout=600,
        )
        _, err = receiver.communicate(timeout=600)
    finally:
        receiver.kill()
    check(sent.returncode, sent.stderr.decode(errors="replace"))
    check(receiver.returncode, err.decode(errors="replace"))
