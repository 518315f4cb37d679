"""ls, diff, paths and stats through the command: the limits, commands before the subvolume, u64 modes,
headers of several subvolumes, the defaults in --help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.commands import encoded, snapshot, subvol
from support.streams import FIXTURES, backend_env, crafted

from sendstream import encode_command
from sendstream.codec.backend import Backend, available, default


def run(*args: str, backend: Backend | None = None) -> subprocess.CompletedProcess[bytes]:
    """The command on ``backend`` (the default one without it)."""
    env = backend_env(backend or default())
    return subprocess.run([sys.executable, "-m", "sendstream", *args], capture_output=True, env=env)


@pytest.mark.parametrize("name", ["ls", "diff", "paths"])
def test_cli_limits_exit_8_and_name_the_option(name: str, backend: Backend) -> None:
    stream = str(FIXTURES / "rich-incr-v2.stream")
    assert run(name, stream, backend=backend).returncode == 0
    for option, value in (("--max-names", "20"), ("--max-held", "300")):
        result = run(name, option, value, stream, backend=backend)
        assert result.returncode == 8, result.stderr
        message = result.stderr.decode()
        assert message.startswith("sendstream: error: offset ") and f"{option} raises it" in message, message
        assert "Traceback" not in message
    assert run(name, "--max-names", "0", stream, backend=backend).returncode == 2


def test_mknod_mode_wider_than_a_c_int(tmp_path: Path, backend: Backend) -> None:
    stream = tmp_path / "mknod.stream"
    nodes = [(b"chr", (1 << 63) | 0o020644), (b"blk", (1 << 40) | 0o060600), (b"odd", 1 << 33)]
    stream.write_bytes(
        crafted(
            2,
            encode_command(subvol(), 2),
            *(encoded("mknod", ("path", p), ("ino", 257), ("mode", m), ("rdev", 0)) for p, m in nodes),
        )
    )
    result = run("ls", str(stream), backend=backend)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"created   blockdev blk\ncreated   chardev  chr\ncreated   device   odd\n"


def test_several_subvolumes_have_headers_one_has_none(backend: Backend) -> None:
    for name in ("two-e-v1", "two-concat-v2"):
        for command in ("ls", "diff"):
            out = run(command, str(FIXTURES / f"{name}.stream"), backend=backend).stdout
            assert out.startswith(b"== two_a_snap ==\n") and b"\n== two_b_snap ==\n" in out
    assert not run("ls", str(FIXTURES / "rich-incr-v2.stream"), backend=backend).stdout.startswith(b"==")


def test_help_states_the_defaults() -> None:
    from sendstream.analysis.paths import MAX_HELD, MAX_NAMES
    from sendstream.ops.downgrade import MAX_ZERO_FILL

    for name in ("ls", "diff", "paths"):
        said = " ".join(run(name, "--help").stdout.decode().split())
        assert f"(default: {MAX_NAMES:,})" in said and f"(default: {MAX_HELD >> 20} MiB)" in said
    said = " ".join(run("convert", "--help").stdout.decode().split())
    assert f"(default: {MAX_NAMES:,})" in said and f"(default: {MAX_ZERO_FILL >> 30} GiB)" in said


def test_commands_before_subvol_leave_nothing_behind(tmp_path: Path) -> None:
    """ls and diff kept per-inode flags by id() of tracker objects: the table filled by commands
    before SUBVOL outlived them, and new objects reusing those ids (once the collector freed the
    old ones) took their flags, differently on the native and the pure path."""
    before = b"".join(
        encoded("mkfile", ("path", b"p%05d" % i), ("ino", 300 + i))
        + encoded("write", ("path", b"p%05d" % i), ("file_offset", 0), ("data", b"x"))
        for i in range(3000)
    )
    after = b"".join(encoded("chmod", ("path", b"f%06d" % i), ("mode", 0o600)) for i in range(30000))
    stream = tmp_path / "before-subvol.stream"
    stream.write_bytes(crafted(2, before, encode_command(snapshot(), 2), after))
    expected_ls = b"".join(b"metadata  -        f%06d [mode]\n" % i for i in range(30000))
    expected_diff = b"".join(b"m f%06d [mode]\n" % i for i in range(30000))
    for backend in available():
        ls = run("ls", str(stream), backend=backend)
        assert ls.returncode == 0 and ls.stdout == expected_ls, [x for x in ls.stdout.splitlines() if b"data" in x][:3]
        diff = run("diff", str(stream), backend=backend)
        assert diff.returncode == 0 and diff.stdout == expected_diff
