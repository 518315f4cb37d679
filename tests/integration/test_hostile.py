"""What a hostile stream or a hostile neighbour did (issue 11): each finding, reproduced as an attacker would."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from support.clock import Clock
from support.streams import FIXTURES, backend_env, command_bytes, crafted, partial_identity, u64

from sendstream import Decoder
from sendstream import errors as e
from sendstream.codec.backend import Backend, native, pure
from sendstream.format.command import Command
from sendstream.format.layout import ATTRIBUTE_NUMBERS as A
from sendstream.format.layout import COMMAND_NUMBERS as C
from sendstream.io.outputs import atomic_output
from sendstream.io.windows import file_events
from sendstream.ops.verify import verify_file
from sendstream.transfer.identity import stream_identity
from sendstream.transfer.journal import Journal
from sendstream.transfer.ledger import Checkpoint, Ledger
from sendstream.transfer.tokens import make_token

CMD = [sys.executable, "-m", "sendstream"]
SAMPLE = FIXTURES / "rich-full-v2.stream"


def run(*args: str, stdin: bytes | None = None, **kwargs: object) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*CMD, *args], input=stdin, capture_output=True, **kwargs)  # type: ignore[call-overload,no-any-return]


def subvol(version: int = 2) -> bytes:
    return command_bytes(
        C["subvol"], [(A["path"], b"s"), (A["uuid"], uuid.uuid4().bytes), (A["ctransid"], u64(5))], version
    )


def unknown_commands(n: int) -> bytes:
    """A header and ``n`` CRC-valid 10-byte "command 0" records: what a header followed by zeros is."""
    return crafted(2, *[command_bytes(0, [])] * n)


# --- problems are counted, the first ones kept ---------------------------------------------------------------------


def test_the_problem_log_counts_every_problem_and_keeps_the_first() -> None:
    decoder = Decoder()
    decoder.receive_data(unknown_commands(5000))
    decoder.receive_data(b"")
    decoder.events()
    problems = decoder.framer.problems
    assert problems.total == 5000
    assert len(problems) == e.ProblemLog.KEEP == len(list(problems))
    assert problems.dropped == 5000 - e.ProblemLog.KEEP
    assert [p.index for p in problems] == list(range(e.ProblemLog.KEEP))
    assert set(problems.first_of) == {e.UnknownCommand}


def test_dump_and_verify_of_many_unknown_commands_report_them_bounded(tmp_path: Path) -> None:
    stream = tmp_path / "zeros.stream"
    stream.write_bytes(unknown_commands(20_000))
    dumped = run("dump", str(stream))
    assert dumped.returncode == 0, dumped.stderr
    lines = dumped.stderr.decode().splitlines()
    assert len(lines) == e.ProblemLog.KEEP + 1
    assert lines[-1] == f"sendstream: warning: {20_000 - e.ProblemLog.KEEP} more problems not shown"
    verified = run("verify", "--keep-going", str(stream))
    assert verified.returncode == 1
    assert verified.stdout.splitlines()[-1].startswith(b"FAILED (20000 problems): 1 stream, 20001 commands")
    assert len(verified.stderr.splitlines()) == e.ProblemLog.KEEP + 1


# --- an attribute the stream's version does not define ------------------------------------------------------------


def v1_chmod_with_attribute_30() -> bytes:
    """A v1 CHMOD carrying attribute 30 (v2's COMPRESSION, a u32) with 2 bytes."""
    chmod = command_bytes(C["chmod"], [(A["path"], b"f"), (A["mode"], u64(0o644)), (30, b"\x01\x02")], 1)
    return crafted(1, chmod)


def test_an_attribute_undefined_in_the_version_stays_raw(tmp_path: Path) -> None:
    data = v1_chmod_with_attribute_30()
    stream = tmp_path / "attr30.stream"
    stream.write_bytes(data)
    dumped = run("dump", "--json", str(stream))
    assert dumped.returncode == 0, dumped.stderr
    assert b'"unknown(30)":{"base64":"AQI="}' in dumped.stdout
    assert b"[attribute unknown(30)]" in dumped.stderr
    command = next(ev for ev in file_events(io.BytesIO(data)) if isinstance(ev, Command))
    assert command.version == 1
    assert bytes(command.get(30)) == b"\x01\x02"
    assert command.get("compression", None) is None
    assert command.values()["unknown(30)"] == b"\x01\x02"
    # what send --resumable computes from the first command before it connects
    assert stream_identity(data)["command"] == "chmod"


# --- names and paths with a NUL byte ----------------------------------------------------------------------------


def test_verify_says_a_path_with_a_nul_cannot_be_applied_safely(tmp_path: Path, backend: Backend) -> None:
    mkdir = command_bytes(C["mkdir"], [(A["path"], b"a\0/../../etc"), (A["ino"], u64(257))], 2)
    stream = tmp_path / "nul.stream"
    stream.write_bytes(crafted(2, subvol(), mkdir))
    env = backend_env(backend)
    verified = run("verify", str(stream), env=env)
    assert verified.returncode == 0  # well-formed: a warning, not a format error
    assert verified.stdout.splitlines()[-1].startswith(b"OK (1 warning): 1 stream, 3 commands")
    assert b"sendstream: warning: offset 74, command #1 (mkdir): cannot be applied safely" in verified.stderr
    assert b"[attribute path]; expected no NUL byte, got a NUL at byte 1" in verified.stderr
    assert run("dump", str(stream), env=env).returncode == 0  # what btrfs receive --dump prints: the cut path


# --- an input file that shrinks while it is read -----------------------------------------------------------------


@pytest.mark.skipif(native() is None, reason="regular files are read, not mapped, on the pure-Python path")
def test_an_input_truncated_while_mapped_is_an_io_error_not_sigbus(tmp_path: Path) -> None:
    code = """
import os, sys
from sendstream import errors as e
from sendstream.io.windows import file_events
path = sys.argv[1]
with open(path, "rb") as f:
    try:
        for n, _ in enumerate(file_events(f)):
            if n == 2:
                os.truncate(path, 1 << 20)
    except e.InputChanged as exc:
        print(exc)
        sys.exit(4)
"""
    writes = [
        command_bytes(
            C["write"], [(A["path"], b"f"), (A["file_offset"], u64(i << 16)), (A["data"], os.urandom(1 << 16))]
        )
        for i in range(400)
    ]
    mkfile = command_bytes(C["mkfile"], [(A["path"], b"f"), (A["ino"], u64(257))])
    stream = tmp_path / "big.stream"
    stream.write_bytes(crafted(2, subvol(), mkfile, *writes))
    done = subprocess.run([sys.executable, "-c", code, str(stream)], capture_output=True)
    assert done.returncode == 4, done  # not -7 (SIGBUS)
    assert b"the input file has no data here any more (it has 1048576 bytes now)" in done.stdout


# --- outputs ---------------------------------------------------------------------------------------------------


def test_convert_refuses_an_out_that_is_a_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    out = tmp_path / "out.stream"
    out.symlink_to(victim)
    for command in ("convert", "repair"):
        done = run(command, str(SAMPLE), str(out))
        assert done.returncode == 2, done.stderr
        assert b"is a symlink: refusing to follow or replace it" in done.stderr
        assert victim.read_bytes() == b"precious" and out.is_symlink()


def test_outputs_get_the_umask_mode_or_keep_the_mode_they_had(tmp_path: Path) -> None:
    new, old = tmp_path / "new.stream", tmp_path / "old.stream"
    old.write_bytes(b"x")
    old.chmod(0o640)
    done = subprocess.run(
        ["sh", "-c", f"umask 022 && {' '.join(CMD)} convert {SAMPLE} {new} && {' '.join(CMD)} convert {SAMPLE} {old}"]
    )
    assert done.returncode == 0
    assert new.stat().st_mode & 0o7777 == 0o644
    assert old.stat().st_mode & 0o7777 == 0o640
    assert new.read_bytes() == old.read_bytes() == SAMPLE.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["new.stream", "old.stream"]


def test_a_full_device_is_named_in_the_error(tmp_path: Path) -> None:
    done = run("convert", str(SAMPLE), "/dev/full")
    assert done.returncode == 4
    assert done.stderr.startswith(b"sendstream: error: cannot write '/dev/full': No space left on device")


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a read-only tmpfs: needs root")
def test_a_read_only_directory_names_out_not_a_temporary_file(tmp_path: Path) -> None:
    ro = tmp_path / "ro"
    ro.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(ro)], check=True)
    try:
        done = run("convert", str(SAMPLE), str(ro / "out.stream"))
    finally:
        subprocess.run(["umount", str(ro)], check=True)
    assert done.returncode == 4
    assert done.stderr.decode().startswith(
        f"sendstream: error: cannot write '{ro / 'out.stream'}': Read-only file system"
    )


def test_atomic_output_leaves_nothing_behind_on_an_error(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), atomic_output(str(out)) as f:
        f.write(b"half")
        raise RuntimeError("the input broke")
    assert list(tmp_path.iterdir()) == []


# --- the receiver's journal -------------------------------------------------------------------------------------


def test_the_journal_never_writes_through_a_planted_part_symlink(tmp_path: Path) -> None:
    victim = tmp_path / "shadow"
    victim.write_bytes(b"root:secret\n")
    out = tmp_path / "backup"
    Path(f"{out}.part").symlink_to(victim)
    with pytest.raises(e.OutputError, match="not a regular file of ours"):
        Journal(str(out), b"k" * 32)
    assert victim.read_bytes() == b"root:secret\n"
    assert Path(f"{out}.part").is_symlink() and not out.exists()


def test_the_journal_refuses_a_planted_part_when_resuming(tmp_path: Path) -> None:
    victim = tmp_path / "shadow"
    victim.write_bytes(b"root:secret\n" * 10)
    out = tmp_path / "backup"
    Path(f"{out}.part").symlink_to(victim)
    checkpoint = Checkpoint(partial_identity(uuid=None), 5, 0, Ledger().digest())
    with pytest.raises(e.OutputError, match="refusing to use it"):
        Journal(str(out), b"k" * 32, checkpoint)
    assert victim.read_bytes() == b"root:secret\n" * 10


def test_the_journal_replaces_a_stale_part_of_its_own_and_ignores_a_planted_token_file(tmp_path: Path) -> None:
    out = tmp_path / "backup"
    Path(f"{out}.part").write_bytes(b"stale")
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    Path(f"{out}.part.resume.tmp").symlink_to(victim)
    key = b"k" * 32
    clock = Clock()
    journal = Journal(str(out), key, timer=clock)
    journal.write(b"data")
    clock.now += 1.1  # a checkpoint is due every second
    journal.commit(4, partial_identity(uuid="x"), Ledger())
    journal._settle()  # the checkpoint's thread has written its token, rather than a sleep that hopes so
    journal.write(b"more")
    clock.now += 1.1
    journal.commit(8, partial_identity(uuid="x"), Ledger())  # raises the first checkpoint's failure, if any
    journal._settle()
    assert journal.offset == 8  # both checkpoints written, neither through the planted token file
    journal.finish()
    assert out.read_bytes() == b"datamore"
    assert victim.read_bytes() == b"precious"
    assert not Path(f"{out}.part").exists() and not Path(f"{out}.part.resume").exists()


def test_a_resume_state_that_is_a_symlink_is_not_read(tmp_path: Path) -> None:
    from sendstream.errors import ResumeError
    from sendstream.transfer.journal import load_state

    key = b"k" * 32
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_text(make_token(Checkpoint(partial_identity(uuid="x"), 0, 0, Ledger().digest()), key))
    out = tmp_path / "backup"
    Path(f"{out}.part.resume").symlink_to(elsewhere)
    with pytest.raises(ResumeError, match="cannot read"):
        load_state(str(out), key)


# --- options and the terminal --------------------------------------------------------------------------------------


def test_no_key_and_no_terminal_is_a_usage_error_not_the_stream_read_as_a_password() -> None:
    done = subprocess.run(
        [*CMD, "send", "--to", "127.0.0.1:9", "-"],
        input=SAMPLE.read_bytes(),
        capture_output=True,
        start_new_session=True,  # no controlling terminal, as under cron
    )
    assert done.returncode == 2
    assert done.stderr == b"sendstream: error: no --key given, and no terminal to ask for a password: give --key FILE\n"


def test_max_command_size_zero_is_refused() -> None:
    done = run("verify", "--max-command-size", "0", str(SAMPLE))
    assert done.returncode == 2
    assert b"0 is not in the range 1<=x<=268435456" in done.stderr
    with pytest.raises(e.UsageError):
        verify_file(io.BytesIO(SAMPLE.read_bytes()), max_command_size=0)


# --- runs of unknown commands and attributes: counted in bulk, same verdicts ---------------------------------------


def unknown_mix(n: int, seed: int = 1) -> bytes:
    """Unknown commands (with and without a payload) and known commands carrying unknown attributes
    (numbers below and above 64, duplicated ones), among clean commands."""
    rng = __import__("random").Random(seed)
    chmod = [(A["path"], b"f"), (A["mode"], u64(0o644))]
    out = [subvol(), command_bytes(C["mkfile"], [(A["path"], b"f"), (A["ino"], u64(257))])]
    for _ in range(n):
        r = rng.random()
        if r < 0.4:
            out.append(command_bytes(0, []))
        elif r < 0.5:
            out.append(command_bytes(rng.choice([0, 30, 99, 1000]), [(15, b"x")]))
        elif r < 0.85:
            out.append(command_bytes(C["chmod"], [*chmod, (rng.choice([40, 50, 63, 64, 500, 65535]), b"zz")]))
        elif r < 0.9:
            out.append(command_bytes(C["chmod"], [*chmod, (700, b""), (800, b"a")]))
        else:
            data = b"abc" * rng.randrange(50)
            out.append(command_bytes(C["write"], [(A["path"], b"f"), (A["file_offset"], u64(0)), (A["data"], data)]))
    if seed % 2 == 0:
        out.append(command_bytes(C["chmod"], [*chmod, (700, b""), (700, b"a")]))  # a duplicate: an error at the end
    return crafted(2, *out)


@pytest.mark.skipif(native() is None, reason="compares the native path with the pure one")
@pytest.mark.parametrize("args", [["verify", "--keep-going"], ["dump"], ["dump", "--json"], ["stats"], ["ls"]])
@pytest.mark.parametrize("seed", [1, 2])
def test_bulk_counted_problems_give_the_same_output_on_both_paths(tmp_path: Path, args: list[str], seed: int) -> None:
    stream = tmp_path / "mix.stream"
    stream.write_bytes(unknown_mix(30_000, seed))
    built = native()
    assert built is not None
    native_run = run(*args, str(stream), env=backend_env(built))
    pure_run = run(*args, str(stream), env=backend_env(pure()))
    assert native_run.returncode == pure_run.returncode
    timing = b" bytes in "  # verify's summary ends with its time
    assert native_run.stdout.split(timing)[0] == pure_run.stdout.split(timing)[0]
    assert native_run.stderr == pure_run.stderr
    assert native_run.stderr.count(b"\n") <= e.ProblemLog.KEEP + 2


@pytest.mark.parametrize(
    "args", [["convert", "IN", "-"], ["repair", "IN", "-"], ["dump", "IN"], ["dump", "--json", "IN"]], ids=" ".join
)
def test_a_reader_that_goes_away_ends_every_command_quietly(args: list[str], tmp_path: Path) -> None:
    big = tmp_path / "eight.stream"  # eight streams one after the other: more than a pipe of 1 MiB holds
    big.write_bytes((FIXTURES / "rich-full-v1.stream").read_bytes() * 8)
    argv = [str(big) if a == "IN" else a for a in args]
    proc = subprocess.Popen([*CMD, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.read(10)
    proc.stdout.close()
    assert (proc.wait(), proc.stderr.read()) == (0, b"")


@pytest.mark.parametrize("args", [["convert", "IN", "OUT"], ["repair", "IN", "OUT"]], ids=" ".join)
def test_a_fifo_whose_reader_goes_away_is_an_error_named(args: list[str], tmp_path: Path) -> None:
    """Only standard output's reader may leave quietly (``| head``): a named output that stops being read
    fails, naming it, and so does any other broken pipe (a receiver's: tests/integration/test_hostile_peers.py)."""
    big = tmp_path / "eight.stream"
    big.write_bytes((FIXTURES / "rich-full-v1.stream").read_bytes() * 8)
    fifo = tmp_path / "out.fifo"
    os.mkfifo(fifo)
    argv = [str(big) if a == "IN" else str(fifo) if a == "OUT" else a for a in args]
    proc = subprocess.Popen([*CMD, *argv], stderr=subprocess.PIPE)
    assert proc.stderr is not None
    with open(fifo, "rb") as reader:
        reader.read(10)
    assert proc.wait(60) == 4
    assert (
        proc.stderr.read()
        == f"sendstream: error: cannot write {str(fifo)!r}: its reader went away (broken pipe)\n".encode()
    )


def test_a_full_standard_output_is_named() -> None:
    with open("/dev/full", "wb") as full:
        done = subprocess.run([*CMD, "convert", str(SAMPLE), "-"], stdout=full, stderr=subprocess.PIPE)
    assert done.returncode == 4
    assert done.stderr == b"sendstream: error: cannot write 'standard output': No space left on device\n"
