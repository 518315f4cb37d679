"""The command line: exact output and exit codes, run as a user runs it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.streams import FIXTURES, boundaries

SAMPLE = FIXTURES / "rich-incr-v2.stream"


def run(*args: str, stdin: bytes = b"", tz: str = "UTC") -> subprocess.CompletedProcess[bytes]:
    env = dict(os.environ, TZ=tz)
    return subprocess.run([sys.executable, "-m", "sendstream", *args], input=stdin, capture_output=True, env=env)


SUMMARY = re.compile(
    rb"^snapshot rich_incr uuid=[^\n]*\nOK: 1 stream, 104 commands, 18154 bytes in \d+\.\d{3} s \(\d+\.\d MB/s\)\n$"
)


def test_verify_clean_file_and_stdin() -> None:
    for result in (run("verify", str(SAMPLE)), run("verify", "-", stdin=SAMPLE.read_bytes())):
        assert result.returncode == 0
        assert SUMMARY.match(result.stdout), result.stdout
        assert result.stderr == b""
    assert run("verify", "-q", str(SAMPLE)).stdout == b""
    said = run("verify", "-v", str(SAMPLE)).stderr.decode()
    assert re.fullmatch(r"sendstream: verifier: (native \(.+\)|python); crc32c: .+\n", said), said


def test_verify_names_offset_index_command_and_expectation(tmp_path: Path) -> None:
    data = bytearray(SAMPLE.read_bytes())
    marks = boundaries(bytes(data))
    data[marks[4] + 12] ^= 0x40
    bad = tmp_path / "bad.stream"
    bad.write_bytes(bytes(data))
    result = run("verify", str(bad))
    assert result.returncode == 1
    first = result.stderr.decode().splitlines()[0]
    assert first.startswith(f"sendstream: error: offset {marks[4]}, command #3 (")
    assert "crc32c mismatch" in first and "expected crc 0x" in first
    assert result.stdout.splitlines()[-1].startswith(b"FAILED (1 problem): 1 stream, 3 commands")


def test_keep_going_reports_every_problem(tmp_path: Path) -> None:
    data = bytearray(SAMPLE.read_bytes())
    marks = boundaries(bytes(data))
    for start in marks[4:7]:
        data[start + 12] ^= 1
    bad = tmp_path / "bad.stream"
    bad.write_bytes(bytes(data))
    result = run("verify", "--keep-going", str(bad))
    assert result.returncode == 1
    errors = result.stderr.decode().splitlines()
    assert [line.split(",")[0] for line in errors] == [f"sendstream: error: offset {m}" for m in marks[4:7]]
    assert result.stdout.splitlines()[-1].startswith(b"FAILED (3 problems): 1 stream, 104 commands")


def test_truncated_input_has_its_own_exit_code() -> None:
    result = run("verify", "-", stdin=SAMPLE.read_bytes()[:5000])
    assert result.returncode == 3
    assert result.stderr == (
        b"sendstream: error: offset 705, command #12 (write): truncated stream: the input ends inside a command;"
        b" expected 8230 bytes, got 4295 bytes\n"
    )


def test_io_and_usage_errors() -> None:
    missing = run("verify", "/nonexistent/stream")
    assert missing.returncode == 4
    assert missing.stderr == b"sendstream: error: '/nonexistent/stream': No such file or directory\n"
    usage = run("verify", "--no-such-option")
    assert usage.returncode == 2 and b"No such option" in usage.stderr


def test_dump_prints_what_it_read_then_the_error() -> None:
    result = run("dump", "-", stdin=SAMPLE.read_bytes()[:5000])
    assert result.returncode == 3
    assert len(result.stdout.splitlines()) == 12  # commands #0 to #11, complete before the cut
    assert result.stderr.startswith(b"sendstream: error: offset 705, command #12 (write): truncated stream")


def test_dump_into_a_closed_pipe_is_quiet() -> None:
    big = FIXTURES / "rich-full-v1.stream"
    proc = subprocess.Popen(
        f"{sys.executable} -m sendstream dump {big} | head -1",
        shell=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = proc.communicate()
    assert proc.returncode == 0 and len(out.splitlines()) == 1 and err == b""


def test_convert_is_byte_identical_file_and_pipe(tmp_path: Path) -> None:
    out = tmp_path / "out.stream"
    assert run("convert", str(SAMPLE), str(out)).returncode == 0
    assert out.read_bytes() == SAMPLE.read_bytes()
    piped = run("convert", "-", "-", stdin=SAMPLE.read_bytes())
    assert piped.returncode == 0 and piped.stdout == SAMPLE.read_bytes()


@pytest.mark.parametrize("existing", [False, True])
def test_convert_leaves_nothing_half_written(tmp_path: Path, existing: bool) -> None:
    out = tmp_path / "out.stream"
    if existing:
        out.write_bytes(b"keep me")
    result = run("convert", "-", str(out), stdin=SAMPLE.read_bytes()[:5000])
    assert result.returncode == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == (["out.stream"] if existing else [])
    if existing:
        assert out.read_bytes() == b"keep me"


def test_traceback_flag_and_version() -> None:
    result = run("--traceback", "verify", "/nonexistent")
    assert result.returncode == 4 and b"Traceback" in result.stderr
    assert run("--version").stdout.startswith(b"sendstream, version ")
    assert subprocess.run(["sendstream", "--help"], capture_output=True).returncode == 0


def test_convert_into_a_fifo_writes_through_it(tmp_path: Path) -> None:
    """A path that is not a regular file (a fifo, /dev/null) is written, never replaced."""
    import threading

    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_bytes()))
    reader.start()
    result = run("convert", str(SAMPLE), str(fifo))
    reader.join(timeout=30)
    assert result.returncode == 0 and received == [SAMPLE.read_bytes()]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"] and fifo.is_fifo()


def test_standard_output_is_gone_once_its_reader_closed() -> None:
    read, write = os.pipe()
    code = "from sendstream.cli.terminal import standard_output_gone as g; import sys; sys.stderr.write(str(g()))"
    try:
        os.close(read)
        done = subprocess.run([sys.executable, "-c", code], stdout=write, stderr=subprocess.PIPE, check=True)
    finally:
        os.close(write)
    assert done.stderr == b"True"
