"""Hostile inputs under a 300 MB address-space limit: ls, diff, paths and stats
end with success or a clean error naming the limit, never a MemoryError.

Each input is made with the project's encoder: 100 MB of it on the native
path, 10 MB when SENDSTREAM_PURE=1 (the pure-Python pass of CI).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import END

from sendstream import Command, encode_command, encode_stream_header
from sendstream.native import NATIVE
from sendstream.paths import MAX_HELD, MAX_NAMES, NAME_UNIT

MB = 1_000_000
SIZE = 100 * MB if NATIVE else 10 * MB
ADDRESS_SPACE = 300 * MB
COMMANDS = ["ls", "diff", "paths", "stats"]


def command(name: str, *attrs: tuple[str, object]) -> bytes:
    return encode_command(Command.build(name, list(attrs)), 2)


SUBVOL = command("subvol", ("path", b"s"), ("uuid", uuid.UUID(int=1)), ("ctransid", 1))


@dataclass
class Hostile:
    """An input on disk and what each command must end with: exit 0, or exit 8 naming an option."""

    path: Path
    expect: dict[str, str | None]  # command -> None (success) or the option named


def write_stream(path: Path, body: Iterator[bytes], size: int, head: bytes = SUBVOL) -> int:
    """Header, ``head``, commands from ``body`` until ``size`` bytes, END; how many commands."""
    count = 0
    with path.open("wb") as f:
        f.write(encode_stream_header(2) + head)
        written = 17 + len(head)
        for chunk in body:
            if written + len(chunk) > size - len(END):
                break
            f.write(chunk)
            written += len(chunk)
            count += 1
        f.write(END)
    return count


def repeat(chunk: bytes) -> Iterator[bytes]:
    while True:
        yield chunk


def zeros(path: Path, size: int) -> Hostile:
    # CRC-valid 10-byte "command 0" records, no path: unknown commands.
    with path.open("wb") as f:
        f.write(encode_stream_header(2))
        f.write(bytes((size - 27) // 10 * 10))
        f.write(END)
    return Hostile(path, dict.fromkeys(COMMANDS))


def unknown_attributes(path: Path, size: int) -> Hostile:
    chmod = encode_command(Command(18, [(15, b"f"), (5, (0o644).to_bytes(8, "little")), (40, b"")]), 2)
    count = write_stream(path, repeat(chmod), size)
    return Hostile(path, {"ls": None, "diff": None, "paths": _held(count * 46), "stats": None})


def deep_paths(path: Path, size: int) -> Hostile:
    # One legal CHMOD: 32,767 components, 65,533 bytes, again and again.
    write_stream(path, repeat(command("chmod", ("path", b"/".join([b"a"] * 32767)), ("mode", 0o644))), size)
    return Hostile(path, dict.fromkeys(COMMANDS))


def distinct_names(path: Path, size: int) -> Hostile:
    over = 2 * MAX_NAMES  # past the limit, the rest is never read: it repeats one command
    names = (command("chmod", ("path", b"%06x" % i), ("mode", 0o644)) for i in range(over))
    count = write_stream(path, _then(names, repeat(command("chmod", ("path", b"x"), ("mode", 0)))), size)
    names_used = 1 + min(count, over)
    limited = "--max-names" if names_used > MAX_NAMES else None
    return Hostile(path, {"ls": limited, "diff": limited, "paths": limited, "stats": None})


def renames(path: Path, size: int) -> Hostile:
    pair = command("rename", ("path", b"a"), ("path_to", b"b")) + command("rename", ("path", b"b"), ("path_to", b"a"))
    count = 2 * write_stream(path, repeat(pair), size)
    # each name differs from the one before: 46 bytes and 2 of names a command
    return Hostile(path, {"ls": None, "diff": None, "paths": _held(count * (46 + 2)), "stats": None})


def names_at_the_limit(path: Path, size: int) -> Hostile:
    """As many names as the default allows, each as long as one name may be: the most memory ls may use."""
    dirs = 100
    files = min(MAX_NAMES - 1 - dirs, size // 100)
    stem = b"f" * (NAME_UNIT - 8)
    made = (command("mkfile", ("path", b"d%02d/%s%08x" % (i % dirs, stem, i)), ("ino", 1000 + i)) for i in range(files))
    write_stream(path, made, size)
    return Hostile(path, dict.fromkeys(COMMANDS))


def _held(nbytes: int) -> str | None:
    """What `paths` ends with when it must hold ``nbytes`` until END."""
    return "--max-held" if nbytes > MAX_HELD else None


def _then(first: Iterator[bytes], then: Iterator[bytes]) -> Iterator[bytes]:
    yield from first
    yield from then


INPUTS = [zeros, unknown_attributes, deep_paths, distinct_names, renames, names_at_the_limit]


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Callable[[Path, int], Hostile]], Hostile]:
    """Each input made once for the module."""
    cache: dict[str, Hostile] = {}
    where = tmp_path_factory.mktemp("hostile")

    def get(make: Callable[[Path, int], Hostile]) -> Hostile:
        if make.__name__ not in cache:
            cache[make.__name__] = make(where / f"{make.__name__}.stream", SIZE)
        return cache[make.__name__]

    return get


def limited(*args: str) -> tuple[int, str]:
    """Run sendstream under the address-space limit (and 10 minutes): exit code, stderr."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))

    proc = subprocess.run(
        [sys.executable, "-m", "sendstream", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        preexec_fn=cap,
        timeout=600,
        env=dict(os.environ),
    )
    return proc.returncode, proc.stderr.decode(errors="replace")


@pytest.mark.parametrize("make", INPUTS, ids=lambda make: make.__name__.replace("_", "-"))
@pytest.mark.parametrize("name", COMMANDS)
def test_hostile_input_in_bounded_memory(
    made: Callable[[Callable[[Path, int], Hostile]], Hostile], make: Callable[[Path, int], Hostile], name: str
) -> None:
    hostile = made(make)
    code, err = limited(name, str(hostile.path))
    assert "Traceback" not in err and "MemoryError" not in err, err[-2000:]
    option = hostile.expect[name]
    if option is None:
        assert code == 0, err[-2000:]
    else:
        assert code == 8, err[-2000:]
        assert f"{option} raises it" in err and "limit reached" in err, err
