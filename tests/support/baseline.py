"""The behaviour baseline: what every command prints, and its exit code, on the bundled fixtures.

Each :class:`Case` is one command line. :func:`outcome` runs it in a fresh work directory made by
:func:`prepare` (the fixtures, and the damaged, truncated and restarted copies a user meets) and
renders its exit code, standard output, standard error and the files it writes as one text, which
``tests/baseline/NAME.txt`` holds as recorded; ``tools/record_baseline.py`` writes those files and
``tests/integration/test_baseline.py`` compares them.

A case runs in this process under click's ``CliRunner`` isolation, through ``sendstream.cli.main``
(the console script's own error mapping), with the help width a pipe gets (80 columns): its bytes
are those of ``python3 -m sendstream`` in a subprocess, which ``test_baseline.py`` proves on a set
of cases by running them both ways. A case that reads standard input or writes a stream to
standard output runs by subprocess: those paths work on the file descriptors themselves (pipe
sizes, ``fileno()``), which an in-memory stream does not have.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click
from click import formatting
from click.testing import CliRunner

from sendstream.cli import cli, main

from .streams import FIXTURES, ROOT, boundaries

RECORDED = ROOT / "tests" / "baseline"
OUT = "out.stream"  # where a case writes a stream
# Standard input and output are never a terminal here, so the help is as wide as in a pipe; dates
# in UTC as the fixtures' dumps (MANIFEST.md) and in the C locale's UTF-8.
ENV = {"COLUMNS": "80", "TZ": "UTC", "LC_ALL": "C.UTF-8"}


@dataclasses.dataclass(frozen=True)
class Case:
    """``sendstream ARGS`` run in the work directory, with ``stdin`` (a file there) as standard input."""

    name: str
    args: tuple[str, ...]
    stdin: str | None = None
    as_root: bool = False  # what it prints depends on being root (extract: owners, devices)

    @property
    def products(self) -> tuple[str, ...]:
        """The files the command writes (OUT), recorded by size and SHA-256, or as absent."""
        return tuple(a for a in self.args if a == OUT)

    @property
    def by_subprocess(self) -> bool:
        return self.stdin is not None or "-" in self.args[1:]

    def command_line(self) -> str:
        return " ".join(["$ sendstream", *self.args, *([f"< {self.stdin}"] if self.stdin else [])])


def _help_cases() -> Iterator[Case]:
    """``--help`` of the group and of every command and subcommand, walked from the group itself."""

    def walk(command: click.Command, path: tuple[str, ...]) -> Iterator[Case]:
        yield Case("-".join(("help", *path)), (*path, "--help"))
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                sub = command.get_command(ctx, name)
                assert sub is not None
                yield from walk(sub, (*path, name))

    yield from walk(cli, ())


def _per_fixture(command: str, *streams: str, options: tuple[str, ...] = ()) -> list[Case]:
    """``command`` on each of ``streams`` (fixtures by name), named COMMAND[-OPTIONS]-STREAM."""
    prefix = "-".join([command, *(o.lstrip("-") for o in options)])
    return [Case(f"{prefix}-{s}", (command, *options, f"fixtures/{s}.stream")) for s in streams]


# The inputs a user meets when things go wrong, by the name of their cases; :func:`prepare` makes them.
BAD_INPUTS = {
    "missing-file": "missing.stream",
    "not-a-stream": "not-a-stream.txt",
    "empty": "empty.stream",
    "truncated": "truncated.stream",
    "damaged": "damaged.stream",
    "restarted": "restarted.stream",
}


def _on_bad_input(command: str, *labels: str) -> list[Case]:
    """``command`` on each bad input of ``labels`` (keys of ``BAD_INPUTS``), named COMMAND-LABEL."""
    return [Case(f"{command}-{label}", (command, BAD_INPUTS[label])) for label in labels]


EVERY_FIXTURE = tuple(p.stem for p in sorted(FIXTURES.glob("*.stream")))

CASES: list[Case] = [
    *_help_cases(),
    Case("help-short", ("-h",)),
    Case("version", ("--version",)),
    Case("no-command", ()),
    Case("error-unknown-command", ("frobnicate",)),
    Case("error-bad-option", ("dump", "--bogus", "fixtures/two-e-v1.stream")),
    Case("error-missing-argument", ("dump",)),
    Case("error-bad-value", ("dump", "--max-command-size", "many", "fixtures/two-e-v1.stream")),
    # dump
    *_per_fixture("dump", "two-e-v1", "two-concat-v2", "rich-full-v1", "rich-incr-v2", "compressed-v2", "verity-v3"),
    *_per_fixture("dump", "two-e-v2", "rich-incr-v1", "verity-v3", options=("--json",)),
    *_per_fixture("dump", "verity-v3", options=("--strict",)),
    *_per_fixture("dump", "two-concat-v2", "rich-full-v1", "compressed-v2", options=("--progs-style", "6.2")),
    *_per_fixture("dump", "rich-full-v1", options=("--progs-style", "6.2", "--raw-xattr-data")),
    Case("error-raw-xattr-data-current-style", ("dump", "--raw-xattr-data", "fixtures/two-e-v1.stream")),
    Case("dump-stdin", ("dump", "-"), stdin="fixtures/two-e-v2.stream"),
    *_on_bad_input("dump", "missing-file", "not-a-stream", "empty", "truncated", "damaged"),
    Case("dump-a-directory", ("dump", "fixtures")),
    # verify
    *_per_fixture("verify", *EVERY_FIXTURE),
    *_per_fixture("verify", "two-e-v1", options=("--quiet",)),
    Case("verify-verbose-two-e-v1", ("verify", "-v", "fixtures/two-e-v1.stream")),
    Case("verify-stdin", ("verify", "-"), stdin="fixtures/rich-incr-v2.stream"),
    *_on_bad_input("verify", "missing-file", "not-a-stream", "empty", "truncated", "damaged", "restarted"),
    Case("verify-keep-going-damaged", ("verify", "--keep-going", "damaged.stream")),
    Case("verify-scan-restarted", ("verify", "--scan", "restarted.stream")),
    Case("verify-scan-two-concat-v1", ("verify", "--scan", "fixtures/two-concat-v1.stream")),
    Case("verify-scan-quiet-two-concat-v1", ("verify", "--scan", "-q", "fixtures/two-concat-v1.stream")),
    # what a stream changes
    *_per_fixture("ls", "two-concat-v1", "rich-full-v2", "rich-incr-v2", "clone-src-v2"),
    *_per_fixture("ls", "rich-incr-v1", options=("--json",)),
    *_on_bad_input("ls", "truncated"),
    *_per_fixture("diff", "two-e-v2", "rich-incr-v1", "rich-incr-v2", "rich-incr-nodata-v2", "clone-src-v1"),
    *_per_fixture("diff", "rich-incr-v2", options=("--json",)),
    *_on_bad_input("diff", "damaged"),
    *_per_fixture("paths", "two-e-v1", "rich-incr-v2", "clone-src-v2"),
    *_per_fixture("paths", "rich-incr-v1", options=("--json",)),
    *_per_fixture("stats", "two-concat-v2", "rich-full-v1", "rich-incr-v2", "compressed-v2", "verity-v3"),
    *_on_bad_input("stats", "truncated"),
    # rewriting a stream
    Case("convert-copy", ("convert", "fixtures/rich-incr-v2.stream", "out.stream")),
    Case("convert-to-v1", ("convert", "--to-version", "1", "fixtures/rich-full-v2.stream", "out.stream")),
    Case("convert-to-v1-compressed", ("convert", "--to-version", "1", "fixtures/compressed-v2.stream", "out.stream")),
    Case("convert-to-v1-verity", ("convert", "--to-version", "1", "fixtures/verity-v3.stream", "out.stream")),
    Case("convert-pipe", ("convert", "-", "-"), stdin="fixtures/two-e-v1.stream"),
    Case("convert-limits-without-version", ("convert", "--max-names", "9", "fixtures/two-e-v1.stream", "out.stream")),
    Case("convert-restarted", ("convert", "restarted.stream", "out.stream")),
    Case("convert-damaged", ("convert", "damaged.stream", "out.stream")),
    Case("repair-restarted", ("repair", "restarted.stream", "out.stream")),
    Case("repair-quiet-restarted", ("repair", "-q", "restarted.stream", "out.stream")),
    Case("repair-clean", ("repair", "fixtures/two-e-v1.stream", "out.stream")),
    Case("repair-diverged", ("repair", "diverged.stream", "out.stream")),
    Case("repair-keep-last-diverged", ("repair", "--keep-last", "diverged.stream", "out.stream")),
    Case("repair-pipe", ("repair", "-", "-"), stdin="restarted.stream"),
    Case("repair-truncated", ("repair", "truncated.stream", "out.stream")),
    # extract
    Case("extract-two-e-v1", ("extract", "fixtures/two-e-v1.stream", "into"), as_root=True),
    Case("extract-rich-full-v2", ("extract", "fixtures/rich-full-v2.stream", "into"), as_root=True),
    Case("extract-quiet-rich-full-v1", ("extract", "-q", "fixtures/rich-full-v1.stream", "into"), as_root=True),
    Case("extract-incremental-into-empty", ("extract", "fixtures/rich-incr-v2.stream", "into")),
    Case("extract-into-non-empty", ("extract", "fixtures/two-e-v1.stream", "fixtures")),
    Case("extract-into-missing", ("extract", "fixtures/two-e-v1.stream", "nowhere")),
    # keys, manual pages, the service's configuration
    Case("key-fingerprint", ("key", "fingerprint", "psk.key")),
    Case("key-fingerprint-missing", ("key", "fingerprint", "missing.key")),
    Case("key-fingerprint-open-mode", ("key", "fingerprint", "open.key")),
    Case("key-new-exists", ("key", "new", "psk.key")),
    Case("man", ("man",)),
    Case("man-serve-toml", ("man", "sendstream-serve.toml")),
    Case("man-unknown", ("man", "sendstream-nothing")),
    Case("serve-check-config", ("serve", "--config", "serve.toml", "--check-config")),
    Case("serve-journals", ("serve", "--config", "serve.toml", "--journals")),
    Case("serve-check-bad-config", ("serve", "--config", "bad.toml", "--check-config")),
    Case("serve-no-config", ("serve", "--check-config")),
    # the network and object-storage commands' usage errors (nothing is dialled)
    Case("send-no-to", ("send", "fixtures/two-e-v1.stream")),
    Case("receive-no-listen", ("receive",)),
    Case("relay-no-to", ("relay", "--listen", "127.0.0.1:0")),
    Case("restore-no-url", ("restore",)),
    Case("archive-ls-no-url", ("archive", "ls")),
]

# What changes from run to run, and only that: durations and rates (the machine's speed), a
# manual page's date (today), the work directory's path (a new temporary one per run), and which
# verifier ran, native or pure Python (the same test runs on both backends). No case listens or
# dials, so no port or pid is printed.
_NORMALISE: list[tuple[re.Pattern[bytes], bytes]] = [
    (re.compile(rb"\b\d+(?:\.\d+)? s \(\d+(?:\.\d+)? [kKMGT]?B/s\)"), b"<SECONDS> s (<RATE>)"),
    (re.compile(rb'^(\.TH \S+ \S+ )"\d{4}-\d{2}-\d{2}"', re.M), rb'\1"<TODAY>"'),
    (re.compile(rb"^(sendstream: verifier: ).*; crc32c: .*$", re.M), rb"\1<BACKEND>; crc32c: <BACKEND>"),
]


def normalise(data: bytes, work: Path) -> bytes:
    """``data`` with what varies between runs (see ``_NORMALISE``) replaced by a placeholder."""
    data = data.replace(os.fsencode(work), b"<WORK>")
    for pattern, placeholder in _NORMALISE:
        data = pattern.sub(placeholder, data)
    return data


def prepare(work: Path) -> None:
    """The work directory of a case: the fixtures, and the inputs a user meets when things go wrong."""
    (work / "fixtures").symlink_to(FIXTURES)
    data = (FIXTURES / "two-e-v2.stream").read_bytes()
    cuts = boundaries(data)
    flipped = bytearray(data)
    flipped[cuts[6] + 14] ^= 0x01  # inside the seventh command: its CRC no longer matches
    (work / "damaged.stream").write_bytes(bytes(flipped))
    (work / "truncated.stream").write_bytes(data[: cuts[10] + 7])
    (work / "restarted.stream").write_bytes(data[: cuts[8] + 11] + data)
    (work / "diverged.stream").write_bytes(data[: cuts[8]] + (FIXTURES / "two-e-v1.stream").read_bytes())
    (work / "not-a-stream.txt").write_bytes(b"hello, world\n")
    (work / "empty.stream").write_bytes(b"")
    (work / "into").mkdir()
    for name, mode in (("psk.key", 0o600), ("open.key", 0o644)):
        key = work / name
        key.write_bytes(bytes(range(32)))
        key.chmod(mode)
    (work / "place").mkdir()
    (work / "serve.toml").write_text(
        'listen = "127.0.0.1:7000"\ntls = "tls13-aes128-gcm"\n\n[clients.web1]\nkey = "psk.key"\nstore = "place"\n'
    )
    (work / "bad.toml").write_text('listen = "127.0.0.1:7000"\n\n[clients.web1]\nkey = "psk.key"\nstore = "nowhere"\n')


@dataclasses.dataclass(frozen=True)
class Ran:
    """What a case did: its exit code, and its outputs' bytes."""

    code: int
    stdout: bytes
    stderr: bytes


def run_in_process(case: Case, work: Path) -> Ran:
    """``case`` through ``sendstream.cli.main``, in ``work``, its outputs captured by ``CliRunner``."""
    runner = CliRunner()
    _forget_help_options(cli)
    with _inside(work), runner.isolation(env=ENV) as (out, err, _):
        formatting.FORCED_WIDTH = None  # CliRunner forces 80; a pipe gets COLUMNS, less click's margin of 2
        time.tzset()
        code = main(list(case.args))
        sys.stdout.flush()
        sys.stderr.flush()
    time.tzset()
    return Ran(code, out.getvalue(), err.getvalue())


def run_by_subprocess(case: Case, work: Path) -> Ran:
    """``case`` as ``python3 -m sendstream``, with this checkout first on the path."""
    env = {**os.environ, **ENV, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    with contextlib.ExitStack() as stack:
        stdin = stack.enter_context((work / case.stdin).open("rb")) if case.stdin else subprocess.DEVNULL
        done = subprocess.run(
            [sys.executable, "-m", "sendstream", *case.args], cwd=work, env=env, stdin=stdin, capture_output=True
        )
    return Ran(done.returncode, done.stdout, done.stderr)


def _forget_help_options(command: click.Command) -> None:
    """Undo what an earlier run in this process left in the commands, as a new process starts.

    click (8.1.8 on) keeps each command's help option as the first context that asked made it:
    after ``sendstream man`` (contexts without the group's ``-h``) a later ``dump -h`` would fail,
    and after a ``dump`` the manual would show ``-h, --help``, where each alone shows ``--help``.
    """
    command._help_option = None
    if isinstance(command, click.Group):
        for sub in command.commands.values():
            _forget_help_options(sub)


@contextlib.contextmanager
def _inside(work: Path) -> Iterator[None]:
    before = os.getcwd()
    os.chdir(work)
    try:
        yield
    finally:
        os.chdir(before)


def render(case: Case, ran: Ran, work: Path) -> str:
    """The recorded text of a case: its command line, exit code, outputs and written files."""
    lines = [case.command_line(), f"exit {ran.code}"]
    for label, data in (("stdout", ran.stdout), ("stderr", ran.stderr)):
        lines += _section(label, normalise(data, work))
    for product in case.products:
        path = work / product
        if path.exists():
            data = path.read_bytes()
            lines.append(f"--- file {product}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}")
        else:
            lines.append(f"--- file {product}: absent")
    return "\n".join(lines) + "\n"


def _section(label: str, data: bytes) -> list[str]:
    try:
        text = data.decode()
    except UnicodeDecodeError:
        return [f"--- {label}: {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()}"]
    if not text:
        return [f"--- {label}: empty"]
    body = text.removesuffix("\n").split("\n")
    return [f"--- {label}", *body, *([] if text.endswith("\n") else ["\\ no newline at end"])]


def outcome(case: Case, base: Path, runner: Callable[[Case, Path], Ran] | None = None) -> str:
    """Run ``case`` in a fresh work directory under ``base`` and render what it did."""
    work = Path(tempfile.mkdtemp(prefix=f"{case.name}.", dir=base))
    prepare(work)
    ran = (runner or (run_by_subprocess if case.by_subprocess else run_in_process))(case, work)
    return render(case, ran, work)


def recorded_path(case: Case) -> Path:
    return RECORDED / f"{case.name}.txt"


def difference(case: Case, now: str) -> str | None:
    """None when ``now`` is what ``case`` recorded, else a unified diff from the record to ``now``."""
    path = recorded_path(case)
    if not path.exists():
        return f"{case.name}: not recorded ({path.relative_to(ROOT)} is missing): run tools/record_baseline.py"
    then = path.read_bytes().decode()  # not read_text(): a "\r" would read as "\n"
    if then == now:
        return None
    diff = difflib.unified_diff(
        then.splitlines(keepends=True), now.splitlines(keepends=True), f"recorded {case.name}", f"now {case.name}"
    )
    return "".join(diff)
