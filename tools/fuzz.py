#!/usr/bin/env python3
"""Coverage-guided fuzzing of every input surface of sendstream (atheris, libFuzzer).

Usage::

    python3 tools/fuzz.py TARGET [OPTIONS] [libFuzzer flags] [CORPUS_DIR ...]
    python3 tools/fuzz.py TARGET --replay FILE_OR_DIR ...   # each file once, one JSON line each
    python3 tools/fuzz.py TARGET --minimize CRASH OUT       # a smaller input with the same crash
    python3 tools/fuzz.py --list
    python3 tools/fuzz.py --write-issue-inputs DIR          # the hostile inputs of issue 11, in DIR/TARGET/

Targets (one per surface). Each input goes through the checks of its target;
those marked *deep* run on one fuzzed input in ``--deep-every`` (8), chosen by
the CRC-32 of its bytes, and on every input of ``--replay`` and ``--minimize``:

- ``decoder``: the lenient framer, native scanner against pure Python (the
  same events, problems and verdict: error type, offset and index), and
  ``verify_file`` (strict) against the pure framer; *deep*: the strict framer
  both ways, the sans-IO Decoder strict and lenient, whole and cut (a byte at
  a time, or in chunks of sizes that do not depend on the input), against the
  framer; ``verify_file`` on a file's mapped windows and with ``keep_going``;
  ``find_headers`` and the sender's ``stream_identity``;
- ``repair``: the Healer as ``sendstream repair`` drives it, native and pure
  alike; what it writes decodes cleanly; *deep*: the same with ``--keep-last``;
- ``changes``: ``ls``, ``diff``, ``paths`` and ``stats``, text and JSON, on the
  native framer's events (decoded once, replayed to each); *deep*: the same on
  the pure framer's, which must give the same outputs;
- ``dump``: the text (the native printer against the Python one) and JSON
  lines; *deep*: the text of ``--strict`` both ways;
- ``convert``: the writer (a valid input comes back byte for byte) and
  ``--to-version 1`` (a v1 stream comes out, of bounded size);
- ``extract``: the Extractor into a fresh scratch directory on tmpfs, next to
  a sentinel tree and clone sources that must not change;
- ``session``: the receiver's hello, the sender's parse of the answer and of
  status lines, and resume tokens (the text as given, and any payload with a
  valid MAC so that the JSON is reached), then used as ``send --resume`` does;
- ``config``: ``serve``'s configuration (:func:`sendstream.service.config.load`)
  in a scratch directory whose key files and places exist, the file system
  of a ``receive`` place given (not asked of ``stat -f``); what loads is held
  to what the service relies on (each client's own key, places apart, each
  trusted address one client's), and an error is a ``ConfigError`` of one
  line that names the file;
- ``manifest``: manifests apart by NUL (a ``NAME.stream.json`` line first,
  or named by the stream they say) through ``read_manifest``: an ``Entry``
  true to its name, written back as ``send --to s3://`` writes one and read
  equal, or a ``BadManifest`` that names it; then ``chains``, ``chain_to`` and
  ``plan_prune`` over all of them (every stream placed once, parents before
  children, what is kept keeps its parents), and the service's list of them;
  *deep*: the same through a listing (``entries``);
- ``upload-state``: a resumable upload's state (the input as the whole object,
  and as its ``state`` signed with the right key) through ``state.load``: saved
  again and read equal, its sealing held, taken up as ``Parts`` does; *deep*:
  every state a resumable upload saves (parts, objects and sealing picked by
  the input's first bytes) is read back;
- ``list-answer``: the service's answer to ``send --list`` through ``list_held``
  and as ``send --list`` prints it: flat snapshots that the service's writer
  writes back equal, one escaped line each, the same in JSON;
- ``store``: a fake S3 endpoint on loopback (:class:`FakeStore`) whose answers
  (status, headers, body) are the input's, driven through boto3 by the real
  code: ``verify``/``restore`` of a stream (``read_manifest``,
  ``RangedReader``, ``check``), ``archive ls`` (``entries``, ``listing``, the
  chains), a resumed upload's state and parts, a whole ``send --to s3://``.
  What is handed on is the manifest's stream, to the byte.

The rule: every input ends in success or in sendstream's own error
(:class:`sendstream.errors.SendStreamError`; of one line, and of the class
expected, for the targets of the service and the archive). Anything else is a crash: another
exception (RecursionError, MemoryError under the harness's RLIMIT_AS, struct.error, botocore's own,
OverflowError, KeyError, UnicodeDecodeError...), a native/pure disagreement, a
change outside the scratch directory, more than :data:`KEPT_MAX` problems kept
for one input (memory that grows with the input), or a conversion that writes
more than :data:`OUTPUT_MAX`. A crash is named by its signature:
``Type@module.function`` (the innermost frame in sendstream), or the harness's
check (``Mismatch@...``, ``Unbounded@...``, ``Escaped@extract``). libFuzzer
writes each crash to ``build/fuzz/TARGET-crashes/``; ``--minimize`` shrinks it
much faster than libFuzzer's ``-minimize_crash`` does through Python.

Options (the harness's; single-dash flags go to libFuzzer, e.g. ``-runs=N``,
``-max_total_time=S``, ``-jobs=N``; the defaults given are ``-max_len`` of
:data:`MAX_LEN`, ``-timeout=30`` and ``-print_final_stats=1``):

- ``--deep-every N``: the deep checks on one input in N (default 8; 1: all
  checks on every input);

- ``--memory-mb N``: RLIMIT_AS of the process (default 1024; never under ASan,
  which reserves terabytes of address space); the harness runs with
  ``MALLOC_ARENA_MAX=2`` (the archive's readers are threads, each with an
  arena of 64 MiB of address space otherwise), as the archive's memory bounds
  are measured;
- ``--fsize-mb N``: RLIMIT_FSIZE for ``extract`` (default 16), so that a
  stream cannot fill the tmpfs;
- ``--skip-known``: inputs whose crash has the signature of a finding in
  :data:`KNOWN` count as passing (each is reported once), so a run goes on
  to find new ones; ``--known SIGNATURE`` adds one (as printed for a crash);
- ``--no-seeds``: do not add the generated seeds (fixtures shrunk, crafted
  streams, session lines) to the corpus.

Without a corpus directory the run keeps its corpus in ``build/fuzz/TARGET/``
and also reads ``tests/corpus/TARGET/``. ``extract`` works in a directory
under /dev/shm that a parent process removes when libFuzzer exits. The stream targets use a
structure-aware mutator: it mutates whole commands and single attributes,
splices commands from the seeds, inserts restarts, and then fixes every
command's CRC, so mutations reach the command handlers instead of dying at
the CRC check.

The library imported is this checkout's, unless PYTHONPATH says otherwise
(``tools/sanitize.sh`` points it at its ASan build).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime
import errno
import functools
import hashlib
import io
import itertools
import json
import os
import random
import re
import resource
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import urllib.parse
import uuid
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, cast

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
if "PYTHONPATH" not in os.environ:
    sys.path.insert(0, str(REPO))

FUZZING = len(sys.argv) > 1 and not sys.argv[1].startswith("--") and not {"--replay", "--minimize"} & set(sys.argv)
if FUZZING:
    import atheris

    instrumented: Any = atheris.instrument_imports(include=["sendstream"])
else:
    instrumented = contextlib.nullcontext()

with instrumented:
    import sendstream
    from sendstream import errors as e
    from sendstream.analysis.changes import changes
    from sendstream.analysis.resolve import resolve
    from sendstream.analysis.statistics import Statistics
    from sendstream.archive.catalog import (
        MIN_PART,
        Entry,
        chain_to,
        chains,
        entries,
        identity_of,
        plan_prune,
        read_manifest,
        remove,
    )  # fmt: skip
    from sendstream.archive.reading import _ranges as reading_ranges
    from sendstream.archive.reading import check as check_stored
    from sendstream.archive.reading import restore as restore_chain
    from sendstream.archive.seal import CIPHER, SEGMENT, Sealer, opened_size
    from sendstream.archive.state import STATE_SUFFIX, UploadState
    from sendstream.archive.state import _mac as state_mac
    from sendstream.archive.state import load as load_state
    from sendstream.archive.state import save as save_state
    from sendstream.archive.store import POOL as STORE_POOL
    from sendstream.archive.store import Location
    from sendstream.archive.upload import Parts, upload
    from sendstream.cli.admin import list_held as print_held
    from sendstream.codec.backend import Backend, available, pure
    from sendstream.codec.crc import crc32c
    from sendstream.codec.decoder import Decoder
    from sendstream.codec.encoder import Encoder, encode_command, encode_stream_header
    from sendstream.codec.events import NEED_DATA, EndOfInput, Restart, StreamHeader
    from sendstream.codec.framer import Framer
    from sendstream.endpoints.sending import list_held
    from sendstream.errors import ConfigError
    from sendstream.extract.extractor import Extractor
    from sendstream.format.command import Command
    from sendstream.format.layout import ATTRIBUTES, COMMAND_NUMBERS, COMMANDS, MAX_VERSION, STREAM_MAGIC
    from sendstream.io.windows import file_events
    from sendstream.ops.downgrade import Downgrader
    from sendstream.ops.repair import Healer
    from sendstream.ops.verify import find_headers, verify_file
    from sendstream.render.changes import diff_json, diff_lines, json_line, ls_json, ls_lines
    from sendstream.render.dump import TextDumper
    from sendstream.render.jsonlines import json_line as dump_json_line
    from sendstream.render.paths import record_json_line, record_line, statistics_lines
    from sendstream.render.progs import PROGS_STYLES, ProgsStyle
    from sendstream.service.config import IDENTITY, Config
    from sendstream.service.config import Client as ServiceClient
    from sendstream.service.config import load as load_config
    from sendstream.session.messages import MAGIC, STATUS_PREFIX, parse_listed, parse_status
    from sendstream.session.protocol import (
        LIST_PREFIX,
        PREFIX_SIZE,
        Ack,
        Answer,
        Hello,
        SenderConnection,
        listed_line,
        status_line,
    )
    from sendstream.session.receiver import SessionReceiver, open_connection
    from sendstream.session.resume import Resumption
    from sendstream.session.sender import SessionSender
    from sendstream.stores.store import named as held_name
    from sendstream.transfer.identity import Identity, stream_identity
    from sendstream.transfer.ledger import Checkpoint, Ledger
    from sendstream.transfer.stored import Unnamed, manifest, stream_name
    from sendstream.transfer.tokens import TOKEN_PREFIX, _b64, _mac, make_token, read_token
    from sendstream.transport.tls import PlainChannel

sys.path.insert(0, str(REPO / "tests"))
from support.streams import EDGE_TIMES, canon  # noqa: E402  (the tests' canonical form of an event, edge times)

FIXTURES = REPO / "fixtures"
CORPUS = REPO / "tests" / "corpus"
WORK = REPO / "build" / "fuzz"
LIBRARY = Path(sendstream.__file__).resolve().parent

# More problems (or skipped commands) than this kept for one input is memory
# that grows with the input: the issue asks to count them and keep the first few.
KEPT_MAX = 1000
# What ``convert --to-version 1`` may write for one input before the harness calls it unbounded.
OUTPUT_MAX = 64 << 20
TOKEN_KEY = bytes(range(32))

# Crash signatures (exception@innermost sendstream function, or the harness
# check) of the findings of issue 11 known today; ``--skip-known`` lets a run
# go past them. Remove an entry when its fix lands.
KNOWN: dict[str, str] = {}


class Finding(AssertionError):
    """A crash the harness detects itself (not an exception of the library)."""

    def __init__(self, signature: str, message: str) -> None:
        super().__init__(f"{signature}: {message}")
        self.signature = signature


def signature(exc: BaseException) -> str:
    """``Type@module.function`` of the innermost frame in sendstream (else in the harness)."""
    if isinstance(exc, Finding):
        return exc.signature
    where = ""
    for frame, _ in traceback.walk_tb(exc.__traceback__):
        path = Path(frame.f_code.co_filename).resolve()
        if path.is_relative_to(LIBRARY):
            where = f"{path.stem}.{frame.f_code.co_qualname}"
        elif not where:
            where = f"fuzz.{frame.f_code.co_qualname}"
    return f"{type(exc).__name__}@{where}"


# --- shared helpers ---------------------------------------------------------------------------------------------------


def verdict(exc: BaseException | None) -> tuple[Any, ...] | None:
    """What must agree between two runs: the error's type, offset and index."""
    if exc is None:
        return None
    return (type(exc).__name__, getattr(exc, "offset", None), getattr(exc, "index", None))


def problems(framer: Framer) -> list[Any]:
    """The verdicts of the problems the framer kept (no more than :data:`KEPT_MAX`)."""
    if len(framer.problems) > KEPT_MAX:
        raise Finding("Unbounded@Framer.problems", f"{len(framer.problems)} problems kept for one input")
    return [verdict(p) for p in framer.problems]


@contextlib.contextmanager
def bounded(framer: Framer) -> Iterator[None]:
    """Check the problems the framer keeps, however the run ends."""
    try:
        yield
    finally:
        problems(framer)


def framer_events(
    data: bytes, *, strict: bool = False, backend: Backend, keep_going: bool = False
) -> tuple[list[tuple[Any, ...]], tuple[Any, ...] | None, list[tuple[Any, ...]]]:
    """Events, verdict and problems of the framer over buffered windows."""
    framer = Framer(strict=strict, keep_going=keep_going, backend=backend)
    out: list[tuple[Any, ...]] = []
    error = None
    try:
        for event in file_events(io.BytesIO(data), framer):
            out.append(canon(event))
    except e.SendStreamError as exc:
        error = verdict(exc)
    return out, error, problems(framer)


def chunkings(data: bytes, strict: bool) -> Iterator[list[int]]:
    """Ways to cut ``data`` that do not depend on its bytes (so that a crash survives
    minimisation): one byte at a time (every read boundary there is) for a small
    lenient input, else sizes drawn from a fixed sequence, small ones (a few
    bytes of a header at a time) when lenient."""
    if not strict and len(data) <= 2048:
        yield [1] * len(data)
        return
    rng = random.Random(strict)
    sizes: list[int] = []
    left = len(data)
    while left > 0:
        if strict:
            sizes.append(rng.choice((1, 2, 9, 10, 11, 17, 27, rng.randrange(1, 300), rng.randrange(1, 70000))))
        else:
            sizes.append(rng.randrange(1, 24))
        left -= sizes[-1]
    yield sizes


def decoder_events(
    data: bytes, sizes: list[int], *, strict: bool
) -> tuple[list[tuple[Any, ...]], tuple[Any, ...] | None, list[tuple[Any, ...]]]:
    """Events, verdict and problems of the sans-IO Decoder fed ``data`` in pieces of ``sizes``."""
    decoder = Decoder(strict=strict)
    out: list[tuple[Any, ...]] = []
    pieces = iter(sizes)
    pos = 0
    try:
        while True:
            event = decoder.next_event()
            if event is NEED_DATA:
                n = next(pieces, len(data))
                decoder.receive_data(data[pos : pos + n] if pos < len(data) else b"")
                pos += n
                continue
            out.append(canon(event))
            if isinstance(event, EndOfInput):
                break
    except e.SendStreamError as exc:
        return out, verdict(exc), problems(decoder.framer)
    return out, None, problems(decoder.framer)


def pure_verify(source: Any, keep_going: bool) -> tuple[Any, ...]:
    """``verify_file`` on the pure-Python path: the strict framer alone, no batch scanner."""
    framer = Framer(strict=True, keep_going=keep_going, backend=pure())
    try:
        for _ in file_events(source, framer):
            pass
    except e.FormatError as exc:
        framer.problems.append(exc)
    return framer.streams, framer.commands, framer.bytes, problems(framer)


def report_of(source: Any, keep_going: bool) -> tuple[Any, ...]:
    report = verify_file(source, keep_going=keep_going)
    if len(report.problems) > KEPT_MAX:
        raise Finding("Unbounded@verify_file", f"{len(report.problems)} problems kept for one input")
    return report.streams, report.commands, report.bytes, [verdict(p) for p in report.problems]


def memfd(data: bytes) -> Any:
    """A regular file holding ``data`` (in memory): the mapped-window path."""
    fd = os.memfd_create("fuzz-input")
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    return os.fdopen(fd, "rb")


# The native backend when it is built, then the pure-Python one.
RUNS = available()


def agree(what: str, results: list[Any]) -> None:
    """Every run's result (the native one first, then the pure one, then any other) equals the first's."""
    for other in results[1:]:
        if other != results[0]:
            raise Finding(f"Mismatch@{what}", f"{results[0]!r:.600} != {other!r:.600}")


def first_difference(a: tuple[Any, ...], b: tuple[Any, ...]) -> str:
    """Where two (events, verdict, problems) runs part: ``restart/CommandTooLarge`` and the like."""
    for x, y in zip(a[0], b[0], strict=False):
        if x != y:
            return f"{x[0]}/{y[0]}"
    if len(a[0]) != len(b[0]):
        k = min(len(a[0]), len(b[0]))
        return "/".join(run[0][k][0] if len(run[0]) > k else str((run[1] or ("end",))[0]) for run in (a, b))
    if a[1] != b[1]:
        return f"{(a[1] or ('ok',))[0]}/{(b[1] or ('ok',))[0]}"
    return "problems"


def same_run(what: str, a: tuple[Any, ...], b: tuple[Any, ...]) -> None:
    """Two runs over the same input give the same events, verdict and problems."""
    if a != b:
        raise Finding(f"Mismatch@{what}({first_difference(a, b)})", f"{a!r:.600} != {b!r:.600}")


SKIP_KNOWN = False
SKIPPED: dict[str, int] = {}

# The costly passes that check again what another pass already covers (the sans-IO
# Decoder fed whole and cut, the mapped file, keep_going, the pure framer where the
# native one gives the verdict, ...) run on one fuzzed input in DEEP_EVERY, chosen by
# the CRC-32 of its bytes: the same input always gets the same passes. --replay and
# --minimize run every pass on every input (DEEP_EVERY 1), so a crash a run finds
# reproduces there.
DEEP_EVERY = 1


def deep(data: bytes) -> bool:
    """Whether ``data`` gets the costly passes (see :data:`DEEP_EVERY`)."""
    return DEEP_EVERY == 1 or zlib.crc32(data) % DEEP_EVERY == 0


def part(run: Callable[[], object]) -> None:
    """Run an independent part of a target: our own error passes, and with
    ``--skip-known`` so does a known finding, so that the other parts still run."""
    try:
        run()
    except e.SendStreamError:
        pass
    except Exception as exc:
        finding = known(signature(exc))
        if not SKIP_KNOWN or finding is None:
            raise
        if finding not in SKIPPED:
            print(f"fuzz: known finding {signature(exc)} ({finding}): going on", file=sys.stderr)
        SKIPPED[finding] = SKIPPED.get(finding, 0) + 1


def known(sig: str) -> str | None:
    """The finding of :data:`KNOWN` a crash signature belongs to (``*@where`` matches any exception there)."""
    return KNOWN.get(sig) or KNOWN.get("*@" + sig.partition("@")[2])


def guarded(run: Callable[[], Any]) -> Any:
    """The result of ``run()``, or the verdict of our own error."""
    try:
        return run()
    except e.SendStreamError as exc:
        return ("error", verdict(exc))


def expect(ok: bool, what: str, detail: object) -> None:
    """A rule of a target: what the library gave must hold."""
    if not ok:
        raise Finding(f"Broken@{what}", f"{detail!r:.600}")


def one_of(exc: e.SendStreamError, *allowed: type[e.SendStreamError], where: str) -> None:
    """Our error ``exc`` must be of the classes the caller expects, and one printable line (house rule:
    what a peer, a file or a store says must not drive the terminal)."""
    if not isinstance(exc, allowed):
        raise Finding(f"Unexpected@{where}({type(exc).__name__})", f"{exc!s:.600}")
    if not str(exc).isprintable():
        raise Finding(f"Unprintable@{where}({type(exc).__name__})", f"{exc!s:.600}")


# --- targets ----------------------------------------------------------------------------------------------------------


def target_decoder(data: bytes) -> None:
    thorough = deep(data)
    for strict in (False, True) if thorough else (False,):
        runs = [framer_events(data, strict=strict, backend=backend) for backend in RUNS]
        same_run("Framer.native-vs-pure", runs[0], runs[-1])
        if thorough:
            whole = decoder_events(data, [len(data)], strict=strict)
            for sizes in chunkings(data, strict):
                same_run("Decoder.chunking", whole, decoder_events(data, sizes, strict=strict))
            same_run("Decoder-vs-file_events", whole, runs[-1])
    # strict, every input: the verdict of verify_file, native and pure
    for keep_going in (False, True) if thorough else (False,):
        results = [report_of(io.BytesIO(data), keep_going), pure_verify(io.BytesIO(data), keep_going)]
        if thorough:
            with memfd(data) as mapped:
                results.append(report_of(mapped, keep_going))
        agree(f"verify_file(keep_going={keep_going})", results)
    if thorough:
        part(lambda: list(find_headers(io.BytesIO(data))))
        part(lambda: stream_identity(data[:PREFIX_SIZE]))


class HealedOutput:
    """A BytesIO that ``repair --keep-last`` can truncate."""

    def __init__(self) -> None:
        self.out = io.BytesIO()

    def truncate(self, offset: int) -> None:
        self.out.seek(offset)
        self.out.truncate(offset)


def repaired(data: bytes, keep_last: bool, backend: Backend) -> bytes:
    """What ``sendstream repair`` writes for ``data``."""
    sink = HealedOutput()
    truncate = sink.truncate if keep_last else None
    healer = Healer(sink.out.write, keep_last=keep_last, truncate=truncate, backend=backend)
    framer = Framer(backend=backend)
    with bounded(framer):
        for event in file_events(io.BytesIO(data), framer, healer.batch):
            healer.event(event)
    return sink.out.getvalue()


def target_repair(data: bytes) -> None:
    for keep_last in (False, True) if deep(data) else (False,):
        results = [guarded(functools.partial(repaired, data, keep_last, backend)) for backend in RUNS]
        agree(f"repair(keep_last={keep_last})", results)
        out = results[0]
        if isinstance(out, bytes):
            events, error, _ = framer_events(out, backend=pure())
            if error is not None or any(ev[0] == "restart" for ev in events):
                raise Finding("Unclean@repair", f"keep_last={keep_last}: the output does not decode cleanly: {error}")


def kept(event: Any) -> Any:
    """A copy of an event that stays valid after the next one (values in buffers of their own)."""
    if not isinstance(event, Command):
        return event
    return Command(
        event.cmd,
        None if event.attributes is None else [(t, memoryview(bytes(v))) for t, v in event.attributes],
        payload=None if event.payload is None else memoryview(bytes(event.payload)),
        offset=event.offset, index=event.index, crc=event.crc, version=event.version,
    )  # fmt: skip


class Recorded:
    """The events of ``data`` as ``file_events`` hands them out, decoded once and then
    replayed (the same events, then the same error) to each consumer of the input."""

    def __init__(self, data: bytes, backend: Backend) -> None:
        framer = Framer(backend=backend)
        self.events: list[Any] = []
        self.error: e.SendStreamError | None = None
        with bounded(framer):
            try:
                self.events.extend(kept(event) for event in file_events(io.BytesIO(data), framer))
            except e.SendStreamError as exc:
                self.error = exc.with_traceback(None)

    def __iter__(self) -> Iterator[Any]:
        yield from self.events
        if self.error is not None:
            raise self.error


def changes_text(data: bytes, backend: Backend) -> list[Any]:
    """Every output of ls, diff, paths and stats for ``data``, or our error's verdict."""
    events = Recorded(data, backend)

    def ls_and_diff() -> list[bytes]:
        out: list[bytes] = []
        for result in changes(events):
            out.extend(ls_lines(result))
            out.extend(diff_lines(result.diff()))
            out.append(json_line(ls_json(result)))
            out.append(json_line(diff_json(result)))
        return out

    def paths() -> list[bytes]:
        return [record_line(r) + record_json_line(r) for r in resolve(events)]

    def stats() -> list[str]:
        statistics = Statistics()
        for event in events:
            statistics.feed(event)
        return statistics_lines(statistics)

    return [guarded(ls_and_diff), guarded(paths), guarded(stats)]


def target_changes(data: bytes) -> None:
    """ls, diff, paths and stats on the native framer's events; on the deep inputs also on
    the pure framer's, which must give the same (the framers' own agreement is the
    decoder target's, on every input)."""
    agree("ls/diff/paths/stats", [changes_text(data, backend) for backend in (RUNS if deep(data) else RUNS[:1])])


def dumped(data: bytes, backend: Backend, strict: bool, style: ProgsStyle) -> tuple[bytes, Any]:
    """``dump`` text of ``style`` (through the native printer on the native ``backend``) and our error's verdict."""
    out = io.BytesIO()
    framer = Framer(strict=strict, backend=backend)
    text = TextDumper(style=style)
    error = None
    with bounded(framer):
        try:
            for event in file_events(io.BytesIO(data), framer, text.native_batch(out, backend)):
                if isinstance(event, Command):
                    out.write(text.line(event))
        except e.SendStreamError as exc:
            error = verdict(exc)
    return out.getvalue(), error


def dumped_json(data: bytes) -> None:
    """``dump --json``."""
    framer = Framer()
    with bounded(framer):
        for event in file_events(io.BytesIO(data), framer):
            if isinstance(event, Command):
                dump_json_line(event, framer.streams)


def dump_text(data: bytes, strict: bool) -> None:
    """``dump`` (``--strict``) in each style: the native printer writes what the Python one does."""
    for style in PROGS_STYLES:
        agree(f"dump(strict={strict}, style={style})", [dumped(data, backend, strict, style) for backend in RUNS])


def target_dump(data: bytes) -> None:
    for strict in (False, True) if deep(data) else (False,):
        part(functools.partial(dump_text, data, strict))
    part(lambda: dumped_json(data))


class BoundedOutput:
    """Collects what a conversion writes; more than :data:`OUTPUT_MAX` is a crash."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.out = io.BytesIO()

    def write(self, data: bytes) -> None:
        self.out.write(data)
        if self.out.tell() > OUTPUT_MAX:
            raise Finding(f"Unbounded@{self.what}", f"more than {OUTPUT_MAX} bytes written")


def converted(data: bytes, downgrade: bool) -> bytes:
    """What ``sendstream convert`` (``--to-version 1`` with ``downgrade``) writes."""
    sink = BoundedOutput("downgrade" if downgrade else "convert")
    # zeros for holes are bounded by --max-zero-fill (default 1 GiB): below this harness's cap here;
    # every file of the parent is 1 MiB, so holes in them are converted rather than refused
    downgrader = Downgrader(max_zero_fill=OUTPUT_MAX // 2, parent=lambda path: 1 << 20) if downgrade else None
    encoder = Encoder()
    framer = Framer()
    with bounded(framer):
        for event in file_events(io.BytesIO(data), framer):
            if isinstance(event, Restart):
                raise framer.problems[-1]
            if downgrader is None:
                sink.write(encoder.send(event))
            else:
                for out in downgrader.events(event):
                    sink.write(encoder.send(out))
    return sink.out.getvalue()


def convert_check(data: bytes) -> None:
    """``convert``: a valid input comes back byte for byte."""
    if converted(data, False) != data and verify_file(io.BytesIO(data)).ok:
        raise Finding("Mismatch@convert", "a valid input is not written back byte for byte")


def downgrade_check(data: bytes) -> None:
    """``convert --to-version 1``: a clean v1 stream (a v1 input passes through)."""
    events, error, _ = framer_events(converted(data, True), backend=pure())
    versions = {ev[2] for ev in events if ev[0] == "hdr"}
    if error is not None or versions - {1}:
        raise Finding("Unclean@downgrade", f"the output is not a clean v1 stream: {error}, versions {versions}")


def target_convert(data: bytes) -> None:
    part(lambda: convert_check(data))
    part(lambda: downgrade_check(data))


class Scratch:
    """A tmpfs directory for ``extract``: ``scratch`` (fresh for each input) next to
    ``sentinel`` and ``sources`` (clone sources, named by subvolume UUID), which
    must never change."""

    SOURCE = "rich-full-v2.stream"  # the parent of the rich-incr fixtures

    def __init__(self, base: Path) -> None:
        self.base = base
        self.scratch = self.base / "scratch"
        self.sources = self.base / "sources"
        self.populate()

    def populate(self) -> None:
        """Make the sentinel tree and the clone sources, and take their snapshot."""
        sentinel = self.base / "sentinel"
        (sentinel / "dir").mkdir(parents=True)
        (sentinel / "secret").write_bytes(b"must not change\n")
        (sentinel / "dir" / "file").write_bytes(b"x" * 100)
        (sentinel / "link").symlink_to("secret")
        self.sources.mkdir()
        data = seed_stream(FIXTURES / self.SOURCE)
        first = next(ev for ev in file_events(io.BytesIO(data)) if isinstance(ev, Command))
        template = self.sources / str(first.get("uuid"))
        template.mkdir()
        with Extractor(template) as extractor:
            for event in file_events(io.BytesIO(data)):
                extractor.event(event)
        self.templates: dict[Path, list[TreeEntry]] = {}  # what copy_tree reads, read once
        self.before = self.snapshot()

    def snapshot(self) -> dict[str, tuple[int, ...]]:
        """Every name under the base except the scratch directory, with what an lstat says."""
        st = os.lstat(self.base)
        out: dict[str, tuple[int, ...]] = {".": (st.st_mode, st.st_uid, st.st_gid)}  # the scratch dir changes the rest
        pending = [("", str(self.base))]
        while pending:
            rel, path = pending.pop()
            with os.scandir(path) as entries:
                for entry in entries:
                    if not rel and entry.name == "scratch":
                        continue
                    key = f"{rel}/{entry.name}" if rel else entry.name
                    st = entry.stat(follow_symlinks=False)
                    out[key] = (
                        st.st_mode, st.st_uid, st.st_gid, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_nlink
                    )  # fmt: skip
                    if stat.S_ISDIR(st.st_mode):
                        pending.append((key, entry.path))
        return out

    def copy_tree(self, source: Path, dest: Path) -> None:
        """Copy an extraction of the clone sources into the existing ``dest`` as :func:`copy_tree`
        does; the sources never change (:meth:`check`), so each is read once."""
        entries = self.templates.get(source)
        if entries is None:
            entries = self.templates[source] = list(tree_entries(source))
        for entry in entries:
            make_entry(dest / entry.path, entry)

    def check(self) -> None:
        after = self.snapshot()
        if after != self.before:
            changed = sorted(k for k in after.keys() | self.before.keys() if after.get(k) != self.before.get(k))
            raise Finding("Escaped@extract", f"changed outside the scratch directory: {changed[:10]}")

    def clean(self) -> None:
        if self.scratch.exists() or self.scratch.is_symlink():
            _remove(self.scratch)

    def remove(self) -> None:
        for entry in self.base.iterdir():
            _remove(entry)

    def reset(self) -> None:
        """Start again from a clean base (after a crash, which may have left anything)."""
        self.remove()
        self.populate()


def scratch_base() -> Path:
    """A new directory for :class:`Scratch`, on tmpfs when there is one."""
    shm = Path("/dev/shm")
    parent = shm if shm.is_dir() and os.access(shm, os.W_OK) else Path(tempfile.gettempdir())
    _remove_stale(parent)
    return Path(tempfile.mkdtemp(prefix=f"sendstream-fuzz-{os.getpid()}-", dir=parent))


class TreeEntry(NamedTuple):
    """An entry of an extraction, as :func:`make_entry` makes it again."""

    path: str
    st: os.stat_result
    content: bytes | None  # a file's data, a link's target
    xattrs: list[tuple[str, bytes]]


def tree_entries(source: Path) -> Iterator[TreeEntry]:
    """Every entry below ``source``, a directory before what it holds."""
    for root, dirs, files in os.walk(source):
        for name in [*dirs, *files]:
            path = os.path.join(root, name)
            st = os.lstat(path)
            content, xattrs = None, []
            if stat.S_ISREG(st.st_mode):
                content = Path(path).read_bytes()
                xattrs = [(n, os.getxattr(path, n)) for n in os.listxattr(path)]
            elif stat.S_ISLNK(st.st_mode):
                content = os.fsencode(os.readlink(path))
            yield TreeEntry(os.path.relpath(path, source), st, content, xattrs)


def make_entry(dst: Path, entry: TreeEntry) -> None:
    """Make ``entry`` at ``dst`` as ``cp -a`` (``shutil.copy2`` for a file) would: directories
    with their mode (times are not kept), files with data, times, xattrs and mode, links
    with their target, fifos and device nodes as they are."""
    st = entry.st
    if stat.S_ISDIR(st.st_mode):
        dst.mkdir(st.st_mode & 0o7777)
    elif stat.S_ISREG(st.st_mode):
        assert entry.content is not None
        dst.write_bytes(entry.content)
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
        for name, value in entry.xattrs:
            try:
                os.setxattr(dst, name, value)
            except OSError as exc:  # as shutil.copystat, what the file system refuses is left out
                if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.ENODATA, errno.EINVAL):
                    raise
        os.chmod(dst, stat.S_IMODE(st.st_mode))
    elif stat.S_ISLNK(st.st_mode):
        assert entry.content is not None
        dst.symlink_to(os.fsdecode(entry.content))
    else:
        with contextlib.suppress(PermissionError):  # devices need root
            os.mknod(dst, st.st_mode, st.st_rdev)


def _remove(path: Path) -> None:
    """Remove a tree whatever the stream left in it: modes without access, a
    thousand levels of directories (too deep for shutil's recursion)."""
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    try:
        shutil.rmtree(path)
    except (OSError, RecursionError):
        # chmod -R and rm -r go through trees of any depth and never follow symlinks
        subprocess.run(["chmod", "-R", "u+rwx", str(path)], check=False, stderr=subprocess.DEVNULL)
        subprocess.run(["rm", "-rf", "--one-file-system", str(path)], check=True)


def _remove_stale(parent: Path) -> None:
    """Scratch bases of harness runs that died without cleaning up (a crash exits at once)."""
    for old in parent.glob("sendstream-fuzz-*-*"):
        pid = old.name.split("-")[2]
        if pid.isdigit() and not Path(f"/proc/{pid}").exists():
            with contextlib.suppress(OSError):
                _remove(old)


SCRATCH: Scratch | None = None
# Set by the process that runs libFuzzer in a child (which exits without cleaning up) and removes it after.
SCRATCH_ENV = "SENDSTREAM_FUZZ_SCRATCH"


def subvolume_commands(data: bytes) -> list[Command]:
    """The SUBVOL and SNAPSHOT commands of ``data`` (as far as it decodes)."""
    found = []
    with contextlib.suppress(e.SendStreamError):
        for event in file_events(io.BytesIO(data)):
            if isinstance(event, Command) and event.name in ("subvol", "snapshot"):
                found.append(Command(event.cmd, [(t, bytes(v)) for t, v in event.attributes or ()]))
    return found


def target_extract(data: bytes) -> None:
    global SCRATCH
    if SCRATCH is None:
        SCRATCH = Scratch(Path(os.environ.get(SCRATCH_ENV) or scratch_base()))
    scratch = SCRATCH
    subvolumes = subvolume_commands(data)
    per_subvolume = len(subvolumes) > 1
    scratch.scratch.mkdir()
    try:
        if subvolumes and subvolumes[0].name == "snapshot" and not per_subvolume:
            # an incremental applies onto its parent's extraction
            with contextlib.suppress(KeyError, ValueError):
                parent = scratch.sources / str(subvolumes[0].get("clone_uuid"))
                if parent.is_dir():
                    scratch.copy_tree(parent, scratch.scratch)
        with contextlib.suppress(e.SendStreamError):
            extractor = Extractor(scratch.scratch, clone_dirs=[scratch.sources], per_subvolume=per_subvolume)
            framer = Framer()
            with extractor, bounded(framer):
                for event in file_events(io.BytesIO(data), framer):
                    extractor.event(event)
                    if len(extractor.report.skipped) > KEPT_MAX:
                        raise Finding("Unbounded@ExtractReport.skipped", f"more than {KEPT_MAX} skips kept")
    finally:
        scratch.clean()
        scratch.check()


def _lines(data: bytes) -> bytes:
    """``data`` as the bytes a peer sends: at least one line, and at least as long as a raw stream's magic."""
    if b"\n" not in data:
        data += b"\n"
    return data.ljust(len(STREAM_MAGIC), b"\n")


class _Connect(Exception):
    """The sender would connect now (the harness has no receiver): as far as parsing goes."""


def _no_connect() -> Any:
    raise _Connect()


def receiver_hello(data: bytes) -> None:
    """The receiver's side: the first words of a new connection (within a deadline)."""
    ours, theirs = socket.socketpair()
    with ours, theirs:
        ours.sendall(_lines(data))
        ours.shutdown(socket.SHUT_WR)
        opening = open_connection(
            theirs, lambda sock, seconds: PlainChannel(sock), time.monotonic() + 5, timeout=5, idle_timeout=5
        )
        SessionReceiver(opening).close()


def sender_answer(data: bytes) -> None:
    """The sender's side: the receiver's answer (or status), then its ack and status lines, as the sender's
    machine reads them and its resumption follows them."""
    machine, plan = SenderConnection(), Resumption()
    machine.send(Hello(cast(Identity, {})))  # (the sender's identity is not what this target reads)
    for event in machine.receive_data(_lines(data)):
        if isinstance(event, Answer):
            plan.answered(event)
        elif isinstance(event, Ack):
            plan.acked_to(event.verified)


def status_lines(data: bytes) -> None:
    for line in data.splitlines(keepends=True):
        if line.startswith(STATUS_PREFIX):
            parse_status(line)


SMALL_STREAM = b""  # a stream shorter than the session prefix, for tokens to be checked against


def resumed(checkpoint: Checkpoint) -> None:
    """What ``send --resume TOKEN`` does with a token before it connects."""
    ledger = Ledger(checkpoint)
    sender = SessionSender(_no_connect, retries=0, skip_to=checkpoint.offset, stream=checkpoint.stream)
    healer = Healer(sender.write, ledger=ledger)
    for event in file_events(io.BytesIO(SMALL_STREAM), Framer(), healer.batch):
        healer.event(event)
    sender.identify()
    ledger.finish()


def token(text: str) -> None:
    """``send --resume TOKEN`` up to where it would connect."""
    with contextlib.suppress(_Connect):
        resumed(read_token(text, TOKEN_KEY))


def target_session(data: bytes) -> None:
    part(lambda: receiver_hello(data))
    part(lambda: sender_answer(data))
    part(lambda: status_lines(data))
    part(lambda: token(data.decode("utf-8", "surrogateescape")))
    part(lambda: token(f"{TOKEN_PREFIX}{_b64(data)}.{_b64(_mac(TOKEN_KEY, data))}"))


# --- the service's configuration --------------------------------------------------------------------------------------

CONFIG_KEY = bytes(range(100, 132))


class Places:
    """A scratch directory for ``config``: key files and places that exist, so that fuzzed tables reach
    the client checks, and the configuration file, written for each input. The places under ``mnt/``
    are on btrfs as far as ``load`` is told (its seam for ``stat -f``), the others on ext2/3/4."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.path = str(base / "serve.toml")
        self.keys: dict[str, bytes] = {}  # file under keys/ -> the key it holds
        (base / "keys").mkdir()
        pem = CONFIG_KEY[::-1]
        armour = b"-----BEGIN SENDSTREAM PSK-----\n%s\n-----END SENDSTREAM PSK-----\n"
        for name, data, key, mode in (
            ("web1.key", CONFIG_KEY, CONFIG_KEY, 0o600),
            ("db1.key", CONFIG_KEY[:16], CONFIG_KEY[:16], 0o600),
            ("app.key", armour % base64.b64encode(pem), pem, 0o600),
            ("text.key", CONFIG_KEY.hex().encode() + b"\n", CONFIG_KEY.hex().encode() + b"\n", 0o400),
            ("copy.key", CONFIG_KEY, CONFIG_KEY, 0o600),  # the same bytes as web1.key
            ("open.key", b"k" * 32, None, 0o644),  # refused: others may read it
            ("empty.key", b"", None, 0o600),
            ("bad.key", armour % b"!!", None, 0o600),
        ):
            (base / "keys" / name).write_bytes(data)
            os.chmod(base / "keys" / name, mode)
            if key is not None:
                self.keys[name] = key
        for place in ("srv/streams/web1", "srv/streams/web2", "srv/other", "mnt/backup/db1", "mnt/backup/db2"):
            (base / place).mkdir(parents=True)
        (base / "srv" / "file").write_bytes(b"not a directory")
        (base / "srv" / "link").symlink_to("streams/web1")

    def file_system(self, place: str) -> str:
        """What ``stat -f`` would say of ``place``, without asking it."""
        return "btrfs" if place.startswith(str(self.base / "mnt")) else "ext2/3/4"


PLACES: Places | None = None


def config_error(exc: e.SendStreamError, path: str) -> None:
    """The configuration's error: a :class:`ConfigError` of one line that names the file (and a line in it)."""
    if not isinstance(exc, ConfigError):
        raise Finding(f"NotConfigError@config.{type(exc).__name__}", str(exc)[:300])
    file, _, line = exc.where.partition(":") if exc.where.startswith(path + ":") else (exc.where, "", "")
    if file != path or (line and not line.isdigit()) or not str(exc).isprintable():
        raise Finding("Unplaced@config.ConfigError", f"{exc!s:.300}")


def config_checks(config: Config, places: Places) -> None:
    """What ``load`` passed is what the service relies on: each client's key is its file's (none shared),
    its place exists as given (a bucket's address as it parses), no place holds another's, and each
    trusted address is its client's alone."""
    owners = list(config.clients.values())
    for name, client in config.clients.items():
        expect(name == client.identity and bool(IDENTITY.fullmatch(name)), "config.identity", name)
        expect(client.key in places.keys.values() and config.key_of(name) == client.key, "config.key", name)
        if client.archive:
            expect(not client.receive and client.quota is None, "config.archive", client)
            expect(Location.parse(client.place).url() == client.place, "config.archive", client.place)
        else:
            place = client.place
            expect(os.path.isdir(place) and os.path.realpath(place) == place, "config.place", place)
            expect(not client.receive or places.file_system(place) == "btrfs", "config.receive", place)
            expect(client.quota is None or client.quota > 0, "config.quota", client.quota)
        for net in client.trusted:  # (a peer's IPv4-mapped address is taken as IPv4: another network's)
            for address in {net.network_address, net.broadcast_address}:
                if address.version == 4 or address.ipv4_mapped is None:
                    shown = [str(address)] + (["::ffff:" + str(address)] if address.version == 4 else [])
                    for text in shown:
                        expect(config.trusting(text) is client, "config.trusting", f"{text} of {name}")
    expect(len({c.key for c in owners}) == len(owners), "config.shared-key", sorted(config.clients))
    for a, b in itertools.permutations(owners, 2):
        expect(not inside(a, b), "config.nested", (a.place, b.place))
    # port 0 is allowed: serve then listens on a free port and says which
    expect(config.key_of("") is None and 0 <= config.listen.port < 65536, "config.listen", config.listen)
    expect(1 <= config.max_per_client <= 4096 and 1 <= config.max_transfers <= 4096, "config.limits", config)
    expect(config.idle_timeout is None or config.idle_timeout > 0, "config.idle_timeout", config.idle_timeout)


def inside(a: ServiceClient, b: ServiceClient) -> bool:
    """Whether ``b``'s place is ``a``'s or in it."""
    if a.archive != b.archive:
        return False
    if a.archive:
        x, y = Location.parse(a.place), Location.parse(b.place)
        return x.bucket == y.bucket and y.prefix.startswith(x.prefix)
    return os.path.commonpath([a.place, b.place]) == a.place


def target_config(data: bytes) -> None:
    global PLACES
    if PLACES is None:
        PLACES = Places(Path(os.environ.get(SCRATCH_ENV) or scratch_base()))
    places = PLACES
    with open(places.path, "wb") as f:
        f.write(data)
    warnings: list[str] = []
    try:
        config = load_config(places.path, warnings.append, file_system=places.file_system)
    except e.SendStreamError as exc:
        config_error(exc, places.path)
        raise
    config_checks(config, places)


# --- the archive: manifests and upload states -------------------------------------------------------------------------

ARCHIVE = Location("fuzz", "archive/")
ARCHIVE_KEY = bytes(range(64, 96))  # --key of resumable uploads
SEALER = Sealer(bytes(range(32, 64)))  # --encrypt-key


def _etag(data: bytes) -> str:
    return f'"{hashlib.md5(data).hexdigest()}"'


class MemoryStore:
    """An S3 client of the harness's own that holds objects in memory: what the parsers' targets read
    from, and what ``upload`` writes the seeds to. (The ``store`` target drives boto3 against a fake
    endpoint instead.)"""

    def __init__(self, objects: dict[str, bytes] | None = None) -> None:
        self.objects = dict(objects or {})
        self.uploads: dict[str, dict[int, tuple[str, bytes]]] = {}  # upload ID -> part number -> ETag, data
        self.listed_parts: dict[int, int] | None = None  # what list_parts says, when not the uploads'
        self.written: list[tuple[str, bytes]] = []  # every object put, in order
        self._lock = threading.Lock()

    @staticmethod
    def _missing(code: str, operation: str, status: int = 404) -> Exception:
        from botocore.exceptions import ClientError

        missing: Exception = ClientError(
            {"Error": {"Code": code}, "ResponseMetadata": {"HTTPStatusCode": status}}, operation
        )
        return missing

    def _holds(self, Key: str, IfNoneMatch: str | None, IfMatch: str | None, operation: str) -> None:
        """S3's conditions of a write: none there (``*``), or this ETag there; else 412 (under the lock)."""
        there = self.objects.get(Key)
        if (IfNoneMatch == "*" and there is not None) or (
            IfMatch is not None and (there is None or _etag(there) != IfMatch)
        ):
            raise self._missing("PreconditionFailed", operation, 412)

    def get_object(self, Bucket: str, Key: str, Range: str | None = None) -> dict[str, Any]:
        with self._lock:
            if Key not in self.objects:
                raise self._missing("NoSuchKey", "GetObject")
            data = self.objects[Key]
        if Range is not None:
            start, _, end = Range.removeprefix("bytes=").partition("-")
            data = data[int(start) : int(end) + 1]
        return {"Body": io.BytesIO(data), "ContentLength": len(data), "ETag": _etag(self.objects[Key])}

    def head_object(self, Bucket: str, Key: str) -> dict[str, Any]:
        with self._lock:
            if Key not in self.objects:
                raise self._missing("404", "HeadObject")
            return {"ContentLength": len(self.objects[Key])}

    def put_object(
        self, Bucket: str, Key: str, Body: bytes, IfNoneMatch: str | None = None, IfMatch: str | None = None
    ) -> dict[str, Any]:
        with self._lock:
            self._holds(Key, IfNoneMatch, IfMatch, "PutObject")
            self.objects[Key] = bytes(Body)
            self.written.append((Key, bytes(Body)))
        return {"ETag": _etag(bytes(Body))}

    def delete_object(self, Bucket: str, Key: str, IfMatch: str | None = None) -> dict[str, Any]:
        with self._lock:
            self._holds(Key, None, IfMatch, "DeleteObject")
            self.objects.pop(Key, None)
        return {}

    def delete_objects(self, Bucket: str, Delete: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            for listed in Delete["Objects"]:
                self.objects.pop(listed["Key"], None)
        return {}

    def create_multipart_upload(self, Bucket: str, Key: str) -> dict[str, Any]:
        with self._lock:
            upload_id = f"upload-{len(self.uploads)}"
            self.uploads[upload_id] = {}
        return {"UploadId": upload_id}

    def upload_part(self, Bucket: str, Key: str, UploadId: str, PartNumber: int, Body: Any, **_: Any) -> dict[str, Any]:
        etag = f'"{hashlib.md5(Body).hexdigest()}"'
        with self._lock:
            self.uploads[UploadId][PartNumber] = (etag, bytes(Body))
        return {"ETag": etag}

    def complete_multipart_upload(self, Bucket: str, Key: str, UploadId: str, MultipartUpload: Any) -> dict[str, Any]:
        with self._lock:
            parts = self.uploads.pop(UploadId)
            self.objects[Key] = b"".join(parts[p["PartNumber"]][1] for p in MultipartUpload["Parts"])
        return {}

    def abort_multipart_upload(self, Bucket: str, Key: str, UploadId: str) -> dict[str, Any]:
        with self._lock:
            self.uploads.pop(UploadId, None)
        return {}

    def get_paginator(self, operation: str) -> Any:
        store = self

        class Pages:
            def paginate(self, **arguments: Any) -> Iterator[dict[str, Any]]:
                yield store._page(operation, arguments)

        return Pages()

    def _page(self, operation: str, arguments: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            if operation == "list_parts":
                if self.listed_parts is not None:
                    return {"Parts": [{"PartNumber": n, "Size": size} for n, size in self.listed_parts.items()]}
                if arguments["UploadId"] not in self.uploads:
                    raise self._missing("NoSuchUpload", "ListParts")
                parts = self.uploads[arguments["UploadId"]]
                return {"Parts": [{"PartNumber": n, "Size": len(data)} for n, (_, data) in sorted(parts.items())]}
            prefix = arguments["Prefix"]
            keys = sorted(k for k in self.objects if k.startswith(prefix) and "/" not in k[len(prefix) :])
            when = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC)
            return {"Contents": [{"Key": k, "LastModified": when} for k in keys]}


def manifests_of(data: bytes) -> dict[str, bytes]:
    """The manifests of an input (apart by NUL), by name: the first line when it names one
    (``NAME.stream.json``, directly under the prefix), else the name its stream makes (so that a fuzzed
    stream is taken as named)."""
    found: dict[str, bytes] = {}
    for i, part in enumerate(data.split(b"\0")):
        first, newline, rest = part.partition(b"\n")
        if newline and first.endswith(b".stream.json") and b"/" not in first:
            found[first.decode("utf-8", "replace")] = rest
            continue
        name = f"{uuid.UUID(int=i)}.{i}.stream.json"
        with contextlib.suppress(
            ValueError, RecursionError, TypeError, KeyError, AttributeError, OverflowError, Unnamed
        ):
            name = stream_name(json.loads(part)["stream"]) + ".json"
        found.setdefault(name, part)
    return found


def written_back(entry: Entry, stream: Identity) -> bytes:
    """``entry``'s manifest as ``send --to s3://`` writes one (:func:`sendstream.transfer.stored.manifest`)."""
    objects = [{"key": key, "size": size} for key, size in entry.objects]
    more: dict[str, Any] = {"stored": entry.stored, "objects": objects}
    if entry.sealed:
        more["encryption"] = {"cipher": CIPHER, "key": entry.sealed, "segment": SEGMENT}
        for done, sizes in zip(objects, entry.parts, strict=True):
            done["parts"] = list(sizes)
    if entry.snapshot:
        more["snapshot"] = entry.snapshot
    return manifest(stream, size=entry.size, sha256=entry.sha256, commands=entry.commands, ledger=entry.ledger, **more)


def entry_fields(entry: Entry) -> tuple[Any, ...]:
    return tuple(getattr(entry, f.name) for f in dataclasses.fields(entry))


def manifest_read(store: MemoryStore, name: str) -> Entry:
    """``read_manifest``: an :class:`Entry` true to its name, or :class:`BadManifest` naming it."""
    try:
        entry = read_manifest(store, ARCHIVE, name)
    except e.SendStreamError as exc:
        one_of(exc, e.BadManifest, where="read_manifest")
        assert isinstance(exc, e.BadManifest)  # one_of let nothing else through
        expect(exc.streams == (name.removesuffix(".json"),), "manifest.BadManifest", exc.streams)
        raise
    expect(
        identity_of(entry.name) == (entry.ident, entry.parent) and entry.name + ".json" == name, "manifest.name", name
    )
    expect(
        [k for k, _ in entry.objects] == [entry.name] + [f"{entry.name}.{k}" for k in range(1, len(entry.objects))],
        "manifest.objects",
        entry.objects,
    )
    if entry.sealed:
        held = sum(opened_size(part) for sizes in entry.parts for part in sizes)
        expect([sum(p) for p in entry.parts] == [size for _, size in entry.objects], "manifest.parts", entry.parts)
    else:
        held = sum(size for _, size in entry.objects)
    expect(held == entry.size, "manifest.size", (held, entry.size))
    stream: Identity = json.loads(store.objects[ARCHIVE.key(name)])["stream"]  # (read_manifest checked it)
    again = read_manifest(MemoryStore({ARCHIVE.key(name): written_back(entry, stream)}), ARCHIVE, name)
    if entry_fields(again) != entry_fields(entry):
        raise Finding("Mismatch@manifest.written-back", f"{entry_fields(entry)!r:.300} != {entry_fields(again)!r:.300}")
    return entry


def chain_checks(found: list[Entry], bad: list[e.BadManifest]) -> None:
    """The archive's chains as ``archive ls``, ``restore`` and ``archive prune`` take them."""
    expect(len({x.name for x in found}) == len(found), "entries.once", sorted(x.name for x in found))
    by_ident = {x.ident: x for x in found}
    circles: list[e.BadManifest] = []
    trees = chains(found, circles)
    placed = [x for tree in trees for _, x in tree]
    stranded = {name for problem in circles for name in problem.streams}
    expect(
        len(placed) == len({x.name for x in placed})
        and {x.name for x in placed} | stranded == {x.name for x in found}
        and not stranded & {x.name for x in placed},
        "chains.partition",
        [x.name for x in found],
    )
    for tree in trees:
        (depth, root), path = tree[0], list[Entry]()
        expect(depth == 0 and (root.parent is None or root.parent not in by_ident), "chains.root", root.name)
        for depth, entry in tree:
            del path[depth:]
            expect(depth == len(path) and (not path or entry.parent == path[-1].ident), "chains.tree", entry.name)
            path.append(entry)
            summary = json.dumps(dict(entry.summary(), depth=depth), sort_keys=True)  # archive ls --json
            listed = {
                "name": entry.name,
                "uuid": entry.uuid,
                "ctransid": entry.ctransid,
                "parent_uuid": entry.parent[0] if entry.parent else None,
                "parent_ctransid": entry.parent[1] if entry.parent else None,
                "size": entry.size,
                "stored": entry.stored,
            }  # what the service lists of an archive
            expect(
                parse_listed(listed_line(listed)[len(LIST_PREFIX) :]) == listed
                and json.loads(summary)["depth"] == depth,
                "chains.listed",
                listed,
            )
    for entry in found:
        try:
            chain = chain_to(found, f"{entry.uuid}.{entry.ctransid}", ARCHIVE)
        except e.SendStreamError as exc:
            one_of(exc, e.UsageError, where="chain_to")
            full = entry.name in {x.name for tree in trees if tree[0][1].parent is None for _, x in tree}
            expect(not full, "chain_to.refused", f"{entry.name}: {exc}")
            continue
        expect(chain[-1].ident == entry.ident and chain[0].parent is None, "chain_to.ends", entry.name)
        expect(all(b.parent == a.ident for a, b in itertools.pairwise(chain)), "chain_to.links", entry.name)
    for keep_last in (1, 2):
        problems = list(bad)
        kept, dropped = plan_prune(found, keep_last, found[0].stored if found else None, problems)
        names = {x.name for x in kept}
        expect(
            names.isdisjoint(x.name for x in dropped) and len(kept) + len(dropped) == len(found), "prune.split", names
        )
        newest = sorted(found, key=lambda x: (x.stored, x.ctransid, x.name))[-keep_last:]
        expect(all(x.name in names for x in newest), "prune.newest", names)
        expect(all(x.parent not in by_ident or by_ident[x.parent].name in names for x in kept), "prune.parents", names)
        expect(stranded <= names, "prune.circles", stranded)


def target_manifest(data: bytes) -> None:
    manifests = manifests_of(data)
    store = MemoryStore({ARCHIVE.key(name): body for name, body in manifests.items()})
    found: list[Entry] = []
    bad: list[e.BadManifest] = []
    for name in sorted(manifests):
        try:
            found.append(manifest_read(store, name))
        except e.BadManifest as exc:
            bad.append(exc)
    chain_checks(found, bad)
    if deep(data):  # the same through a listing, as the archive's readers take it, and as the service lists it
        problems: list[e.BadManifest] = []
        listed = entries(store, ARCHIVE, problems)
        expect([x.name for x in listed] == [x.name for x in found] and len(problems) == len(bad), "entries", problems)


UPLOADING = "5751d173-386b-2e48-a1ec-5e5bd918dd22.7.stream"  # the stream of tour(2), whose upload is resumed


def signed(fields: Any) -> bytes:
    """An upload state holding ``fields``, signed with the right key (as ``save`` signs one)."""
    payload = json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()
    return json.dumps({"state": fields, "mac": state_mac(ARCHIVE_KEY, payload)}).encode()


def state_read(store: MemoryStore) -> UploadState | None:
    """``state.load``: a state, or a :class:`ResumeError` (of one line) that names it."""
    try:
        return load_state(store, ARCHIVE, UPLOADING, ARCHIVE_KEY)
    except e.SendStreamError as exc:
        one_of(exc, e.ResumeError, where="state.load")
        raise


def taken_up(earlier: UploadState) -> None:
    """What ``send --to s3:// --resumable`` does with the state: the same state saved and read again is
    equal; its sealing is held to the run's; the upload is taken up where the store has the parts it
    names (the ledger expecting its checkpoint), and started over where the store lacks one."""
    store = MemoryStore()
    save_state(store, ARCHIVE, UPLOADING, earlier, ARCHIVE_KEY)
    again = state_read(store)
    if again != earlier:
        raise Finding("Mismatch@state.saved-again", f"{earlier!r:.300} != {again!r:.300}")
    for sealing in (None, SEALER.description):
        try:
            earlier.refuse_other_sealing(sealing, ARCHIVE, UPLOADING)
            expect(sealing == earlier.sealing, "state.sealing", (sealing, earlier.sealing))
        except e.SendStreamError as exc:
            one_of(exc, e.ResumeError, where="refuse_other_sealing")
    for lacking in (False, True):
        listed = store.listed_parts = {number: size for number, _, size in earlier.parts[lacking:]}
        whole = all(listed.get(number) == size for number, _, size in earlier.parts)
        parts = Parts(store, ARCHIVE, key=ARCHIVE_KEY)
        try:
            parts._take_up(earlier)  # (the ledger checks the stream against the checkpoint as it comes)
            expect(parts.resumed == (earlier.offset if whole else 0), "state.taken-up", (parts.resumed, earlier))
        except e.SendStreamError:
            pass
        finally:
            parts.stop()


def states_written(data: bytes) -> None:
    """Every state a resumable upload of tour(2) saves is read back as it was saved: in parts of 64, 256
    or 1024 bytes (the input's first byte says which), objects of 1 to 4 parts (its second), sealed or
    not (its third)."""
    head = data[:3].ljust(3, b"\0")
    part_size = (64, 256, 1024)[head[0] % 3]
    store = MemoryStore()
    sealer = SEALER if head[2] % 2 else None
    uploaded(store, SMALL_STREAM, part_size=part_size, max_object=part_size * (1 + head[1] % 4), key=ARCHIVE_KEY,
             sealer=sealer)  # fmt: skip
    for key, body in store.written:
        if key.endswith(STATE_SUFFIX):
            saved = json.loads(body)["state"]
            try:
                loaded = state_read(MemoryStore({key: body}))
            except e.SendStreamError as exc:
                raise Finding("Refused@state.written", f"{exc}") from None
            expect(loaded is not None and saved["parts"] == [list(p) for p in loaded.parts], "state.written", saved)


def target_upload_state(data: bytes) -> None:
    part(lambda: state_read(MemoryStore({ARCHIVE.key(UPLOADING + STATE_SUFFIX): data})))
    if deep(data):
        states_written(data)
    try:
        fields = json.loads(data)
    except (ValueError, RecursionError):
        return
    earlier = state_read(MemoryStore({ARCHIVE.key(UPLOADING + STATE_SUFFIX): signed(fields)}))
    if earlier is not None:
        taken_up(earlier)


# --- send --list: what the service answers ----------------------------------------------------------------------------


@contextlib.contextmanager
def answering(data: bytes) -> Iterator[Callable[[], PlainChannel]]:
    """A ``connect`` for ``send --list`` whose every connection is answered with ``data``."""
    ends: list[socket.socket] = []

    def connect() -> PlainChannel:
        ours, theirs = socket.socketpair()
        ends.append(ours)
        ours.sendall(data)
        ours.shutdown(socket.SHUT_WR)
        return PlainChannel(theirs)

    try:
        yield connect
    finally:
        for end in ends:
            end.close()


def listed_snapshots(data: bytes) -> list[dict[str, Any]]:
    try:
        with answering(data) as connect:
            return list_held(connect)
    except e.SendStreamError as exc:
        one_of(exc, e.RemoteError, e.SessionError, where="list_held")
        raise


PRINTED = io.StringIO()  # one for the process: click keeps what it wraps each standard output in, for ever


def printed(data: bytes, as_json: bool) -> list[str]:
    """What ``send --list`` prints."""
    PRINTED.seek(0)
    PRINTED.truncate()
    with contextlib.redirect_stdout(PRINTED), answering(data) as connect:
        print_held(connect, as_json)
    return PRINTED.getvalue().splitlines()


def target_list_answer(data: bytes) -> None:
    """The snapshots listed are flat JSON objects that the service's own writer writes back equal;
    ``send --list`` prints one line each, escaped, and as JSON the same values."""
    snapshots = listed_snapshots(data)
    for snapshot in snapshots:
        again = parse_listed(listed_line(snapshot)[len(LIST_PREFIX) :])
        if again != snapshot:
            raise Finding("Mismatch@list.written-back", f"{snapshot!r:.300} != {again!r:.300}")
    text, lines = printed(data, False), printed(data, True)
    expect(len(text) == len(lines) == len(snapshots), "list.lines", (len(text), len(lines), len(snapshots)))
    expect(all(line.isprintable() for line in text), "list.printable", text)
    expect([json.loads(line) for line in lines] == snapshots, "list.json", lines)


# --- the store: a fake S3 endpoint that answers with the fuzzed input -------------------------------------------------

ANSWER_APART = b"\n@@ "
STORED = UPLOADING  # the stream the scenarios read and upload


def _xml(body: str) -> bytes:
    return b'<?xml version="1.0" encoding="UTF-8"?>\n' + body.encode()


def _error(status: int, code: str) -> bytes:
    return b"%d\nContent-Type: application/xml\n\n" % status + _xml(f"<Error><Code>{code}</Code></Error>")


# What a request no answer of the input is for gets: an honest store's answer to it.
DEFAULT_ANSWERS = {
    "LIST": b"200\nContent-Type: application/xml\n\n"
    + _xml(
        '<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>fuzz</Name>'
        "<Prefix>archive/</Prefix><KeyCount>0</KeyCount><MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter>"
        "<IsTruncated>false</IsTruncated></ListBucketResult>"
    ),
    "PARTS": _error(404, "NoSuchUpload"),
    "GET": _error(404, "NoSuchKey"),
    "HEAD": b"404\n\n",
    "CREATE": b"200\n\n"
    + _xml(
        '<InitiateMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>fuzz</Bucket>'
        "<Key>archive/x</Key><UploadId>fuzz-upload</UploadId></InitiateMultipartUploadResult>"
    ),
    "PART": b'200\nETag: "0f343b0931126a20f133d67c2b018a3b"\n\n',
    "COMPLETE": b"200\n\n"
    + _xml(
        '<CompleteMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>fuzz</Bucket>'
        '<Key>archive/x</Key><ETag>"3858f62230ac3c915f300c664312c11f-2"</ETag></CompleteMultipartUploadResult>'
    ),
    "PUT": b'200\nETag: "0f343b0931126a20f133d67c2b018a3b"\n\n',
    "DELETE": b"204\n\n",
    "ABORT": b"204\n\n",
    "DELETES": b"200\n\n" + _xml('<DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"></DeleteResult>'),
}


def answers_of(data: bytes) -> tuple[set[str], dict[str, bytes]]:
    """The scenario of an input (the words of its first line) and its answers, by the request each is
    for (the label on the line after ``@@``; see :meth:`FakeStore.labels`). An upload state's ``state``
    is signed with the right key, so that the JSON is reached."""
    first, *rest = data.split(ANSWER_APART)
    answers: dict[str, bytes] = {}
    for part in rest:
        label, _, answer = part.partition(b"\n")
        text = label.decode("utf-8", "replace").strip()
        if text.startswith("GET ") and text.endswith(STATE_SUFFIX):
            head, apart, body = answer.partition(b"\n\n")
            with contextlib.suppress(ValueError, RecursionError, TypeError):
                held = json.loads(body)
                if apart and isinstance(held, dict) and "state" in held:
                    answer = head + apart + signed(held["state"])
        answers.setdefault(text, answer)
    return set(first.decode("utf-8", "replace").split()), answers


_FRAMED_STATUS = re.compile(rb"[2-5][0-9][0-9](?: [ -~]*)?")
_PLAIN_HEADER = re.compile(rb"[!#$%&'*+.^_`|~0-9A-Za-z-]+:[ -~]*")


def response(answer: bytes, head_only: bool) -> tuple[bytes, bool]:
    """The HTTP response an answer makes (``STATUS`` or a whole status line, header lines, an empty line,
    the body; the body's Content-Length unless the answer says one, or its Transfer-Encoding), and whether
    the connection may go on: only after a response framed as the server frames it, so that no lie about
    a length, no chunk, no header a client reads otherwise than the server leaves bytes for the next one."""
    head, _, body = answer.partition(b"\n\n")
    status, *headers = head.split(b"\n")
    status = status.strip() or b"200"
    named = {h.partition(b":")[0].strip().lower() for h in headers}
    keep = (
        not named & {b"content-length", b"transfer-encoding", b"connection"}
        and bool(_FRAMED_STATUS.fullmatch(status))
        and (not body or status[:3] not in (b"204", b"304"))
        and all(_PLAIN_HEADER.fullmatch(h) for h in headers)
    )
    if not named & {b"content-length", b"transfer-encoding"}:
        headers.append(b"Content-Length: %d" % len(body))
    if not keep:
        headers.append(b"Connection: close")
    line = status if status.startswith(b"HTTP/") else b"HTTP/1.1 " + status
    return line + b"\r\n" + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + (b"" if head_only else body), keep


class FakeStore:
    """An S3 endpoint on loopback in this process whose answers are an input's: each request is answered
    by the answer labelled for it, or else as an honest store would (:data:`DEFAULT_ANSWERS`). Requests
    are labelled by what they ask, not by when they come, so that readers in threads get the same answers
    whatever their order: ``LIST N`` (the N-th page of a listing), ``PARTS N`` (of a list of parts),
    ``GET NAME bytes=A-B`` (or ``GET NAME`` for any range), ``HEAD NAME``, ``CREATE NAME``,
    ``PART NAME N``, ``COMPLETE NAME``, ``PUT NAME``, ``DELETE NAME``, ``ABORT NAME``, ``DELETES N``;
    NAME is the key under the archive's prefix."""

    def __init__(self) -> None:
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        store = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def answer(self) -> None:
                if "chunked" in self.headers.get("Transfer-Encoding", ""):
                    while size := int(self.rfile.readline().split(b";")[0], 16):
                        self.rfile.read(size + 2)
                    self.rfile.readline()
                else:
                    self.rfile.read(int(self.headers.get("Content-Length") or 0))
                labels = store.labels(self.command, self.path, self.headers.get("Range"))
                found = next((store.answers[x] for x in labels if x in store.answers), None)
                answer = DEFAULT_ANSWERS[labels[-1].split()[0]] if found is None else found
                raw, keep = response(answer, self.command == "HEAD")
                self.close_connection = not keep
                with contextlib.suppress(OSError):  # a reader may stop before the end
                    self.wfile.write(raw)

            do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = answer

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # (a client that went away)

        self.answers: dict[str, bytes] = {}
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()
        self._server = Server(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, name="fake-store", daemon=True).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    def serve(self, answers: dict[str, bytes]) -> None:
        with self._lock:
            self.answers, self._counts = answers, {}

    def _next(self, kind: str) -> str:
        with self._lock:
            n = self._counts[kind] = self._counts.get(kind, -1) + 1
        return f"{kind} {n}"

    def labels(self, method: str, target: str, wanted: str | None) -> list[str]:
        """What a request may be answered by, the most precise first."""
        url = urllib.parse.urlsplit(target)
        query = dict(urllib.parse.parse_qsl(url.query, keep_blank_values=True))
        name = urllib.parse.unquote(url.path).lstrip("/").partition("/")[2].removeprefix(ARCHIVE.prefix)
        if method == "GET" and "list-type" in query:
            return [self._next("LIST")]
        if method == "GET" and "uploadId" in query:
            return [self._next("PARTS")]
        if method == "POST":
            kind = "CREATE" if "uploads" in query else "DELETES" if "delete" in query else "COMPLETE"
            return [f"{kind} {name}" if kind != "DELETES" else self._next(kind)]
        if method == "PUT":
            return [f"PART {name} {query['partNumber']}" if "partNumber" in query else f"PUT {name}"]
        if method == "DELETE":
            return [f"{'ABORT' if 'uploadId' in query else 'DELETE'} {name}"]
        return ([f"{method} {name} {wanted}"] if wanted else []) + [f"{method} {name}"]


FAKE_STORE: FakeStore | None = None
_S3: Any = None


def fake_s3() -> tuple[FakeStore, Any]:
    """The fake endpoint, and a boto3 client of it: as ``connect`` makes one, but without retries (they
    would ask again what was answered, after a wait) and with short timeouts."""
    global FAKE_STORE, _S3
    if FAKE_STORE is None:
        import boto3
        from botocore.config import Config as BotoConfig

        FAKE_STORE = FakeStore()
        config = BotoConfig(
            max_pool_connections=STORE_POOL,
            retries={"total_max_attempts": 1, "mode": "standard"},
            connect_timeout=5,
            read_timeout=5,
        )
        session = boto3.session.Session(aws_access_key_id="fuzz", aws_secret_access_key="fuzz", region_name="us-east-1")
        _S3 = session.client("s3", endpoint_url=FAKE_STORE.url, config=config)
    return FAKE_STORE, _S3


class Handed:
    """What a reader hands on: its size and SHA-256, with one stream header before a command."""

    def __init__(self) -> None:
        self.size, self.digest = 0, hashlib.sha256()

    def __call__(self, data: Any) -> None:
        self.size += len(data)
        self.digest.update(data)


def store_read(s3: Any, words: set[str]) -> None:
    """``verify`` (or with ``restore``: ``restore``) of the stream the fuzzed manifest names: what goes
    on is the manifest's stream to the byte (its size and SHA-256)."""
    entry = read_manifest(s3, ARCHIVE, STORED + ".json")
    handed = Handed()
    key = SEALER if entry.sealed else None
    if "restore" in words:
        restore_chain(s3, ARCHIVE, [entry], handed, key, consumer="btrfs receive")
    else:
        check_stored(s3, ARCHIVE, entry, handed, key)
    expect(handed.size == entry.size, "store.read-size", (handed.size, entry.size))
    expect("restore" in words or handed.digest.hexdigest() == entry.sha256, "store.read-sha256", entry.sha256)


def store_ls(s3: Any, words: set[str]) -> None:
    """``archive ls`` (with ``prune``: then ``archive prune --keep-last 1``, the store's word on each deletion
    taken)."""
    problems: list[e.BadManifest] = []
    found = entries(s3, ARCHIVE, problems)
    chain_checks(found, problems)
    if "prune" in words:
        for entry in plan_prune(found, 1, None, problems)[1]:
            remove(s3, ARCHIVE, entry)


def store_resume(s3: Any) -> None:
    """A resumable upload's state and the parts the store lists, as ``send --to s3:// --resumable`` takes them up."""
    earlier = load_state(s3, ARCHIVE, STORED, ARCHIVE_KEY)
    if earlier is not None:
        parts = Parts(s3, ARCHIVE, key=ARCHIVE_KEY)
        try:
            parts._take_up(earlier)
        finally:
            parts.stop()


def store_upload(s3: Any, words: set[str]) -> None:
    """``send --to s3://`` of a clean stream (``resumable``, ``sealed``, ``change``: --change-sealing)."""
    done = upload(
        io.BytesIO(SMALL_STREAM),
        ARCHIVE,
        s3,
        part_size=STORE_PART,
        key=ARCHIVE_KEY if "resumable" in words else None,
        sealer=SEALER if "sealed" in words else None,
        change_sealing="change" in words,
    )
    expect(done.size == len(SMALL_STREAM) and done.url == ARCHIVE.url(STORED), "store.uploaded", done)


def target_store(data: bytes) -> None:
    store, s3 = fake_s3()
    words, answers = answers_of(data)
    store.serve(answers)
    try:
        if "ls" in words:
            store_ls(s3, words)
        elif "resume" in words:
            store_resume(s3)
        elif "upload" in words:
            store_upload(s3, words)
        else:
            store_read(s3, words)
    except e.SendStreamError as exc:
        one_of(exc, e.SendStreamError, where="store")
        raise


TARGETS: dict[str, Callable[[bytes], None]] = {
    "decoder": target_decoder,
    "repair": target_repair,
    "changes": target_changes,
    "dump": target_dump,
    "convert": target_convert,
    "extract": target_extract,
    "session": target_session,
    "config": target_config,
    "manifest": target_manifest,
    "upload-state": target_upload_state,
    "list-answer": target_list_answer,
    "store": target_store,
}
STREAM_TARGETS = {"decoder", "repair", "changes", "dump", "convert", "extract"}
# -max_len unless given. Time grows with the commands of an input, and the corpus drifts to
# the longest; 2 KiB still holds more than ProblemLog.KEEP (100) problems of 10-byte commands,
# where problems are counted instead of kept. repair: more than the Healer's 100 restarts kept
# (27 bytes each at least); session: a line past the 64 KiB limit.
MAX_LEN = {
    "decoder": 2048,
    "repair": 3072,
    "changes": 2048,
    "dump": 2048,
    "convert": 2048,
    "extract": 2048,
    "session": 70000,
    "config": 8192,
    "manifest": 16384,
    "upload-state": 8192,
    "list-answer": 70000,
    "store": 20000,
}
STORE_PART = 256  # the part size of the store target's uploads (of tour(2), 1027 bytes)
DEEP_EVERY_FUZZING = 8
SEED_SIZE = 1 << 10  # seeds of the fixtures: about 2 KiB, the -max_len of most targets


# --- seeds ------------------------------------------------------------------------------------------------------------


def seed_stream(path: Path, keep_data: int = 32, size: int = 1 << 30) -> bytes:
    """A fixture with its WRITE data cut to ``keep_data`` bytes and its commands
    after about ``size`` bytes left out (small seeds fuzz faster)."""
    out = bytearray()
    encoder = Encoder()
    for event in file_events(io.BytesIO(path.read_bytes())):
        if isinstance(event, Command) and event.name == "write":
            attrs = [
                (t, v[:keep_data] if t == ATTRIBUTES_BY_NAME["data"] else bytes(v)) for t, v in event.attributes or ()
            ]
            event = Command(event.cmd, attrs)
        if isinstance(event, Command) and len(out) > size and event.name != "end":
            continue
        out += encoder.send(event)
    return bytes(out)


ATTRIBUTES_BY_NAME = {a.name: n for n, a in ATTRIBUTES.items()}


def stream(version: int, *commands: tuple[str, list[tuple[str, Any]]]) -> bytes:
    """A stream of ``version`` made of ``(name, typed attributes)``, then END."""
    body = b"".join(encode_command(Command.build(name, attrs), version) for name, attrs in commands)
    return encode_stream_header(version) + body + encode_command(Command.build("end"), version)


def tour(version: int) -> bytes:
    """One of every command the version defines, on a small tree."""
    import uuid as uuidlib

    from sendstream.format.specs import Timespec

    me = uuidlib.UUID("5751d173-386b-2e48-a1ec-5e5bd918dd22")
    t = Timespec(1700000000, 5)
    cmds: list[tuple[str, list[tuple[str, Any]]]] = [
        ("subvol", [("path", b"snap"), ("uuid", me), ("ctransid", 7)]),
        ("mkdir", [("path", b"o257-7-0"), ("ino", 257)]),
        ("rename", [("path", b"o257-7-0"), ("path_to", b"d")]),
        ("mkfile", [("path", b"d/f"), ("ino", 258)]),
        ("write", [("path", b"d/f"), ("file_offset", 0), ("data", b"hello world\n" * 4)]),
        (
            "clone",
            [
                ("path", b"d/f"),
                ("file_offset", 4096),
                ("clone_len", 48),
                ("clone_uuid", me),
                ("clone_ctransid", 7),
                ("clone_path", b"d/f"),
                ("clone_offset", 0),
            ],
        ),
        ("truncate", [("path", b"d/f"), ("size", 8192)]),
        ("set_xattr", [("path", b"d/f"), ("xattr_name", b"user.k"), ("xattr_data", b"v")]),
        ("remove_xattr", [("path", b"d/f"), ("xattr_name", b"user.k")]),
        ("symlink", [("path", b"s"), ("ino", 259), ("path_link", b"d/f")]),
        ("link", [("path", b"h"), ("path_link", b"d/f")]),
        ("mknod", [("path", b"n"), ("ino", 260), ("mode", 0o20644), ("rdev", 0x103)]),
        ("mkfifo", [("path", b"p"), ("ino", 261)]),
        ("mksock", [("path", b"k"), ("ino", 262)]),
        ("update_extent", [("path", b"d/f"), ("file_offset", 0), ("size", 4096)]),
        ("unlink", [("path", b"h")]),
        ("mkdir", [("path", b"e"), ("ino", 263)]),
        ("rmdir", [("path", b"e")]),
        ("chmod", [("path", b"d/f"), ("mode", 0o644)]),
        ("chown", [("path", b"d/f"), ("uid", 1000), ("gid", 1000)]),
        ("utimes", [("path", b"d/f"), ("atime", t), ("mtime", t), ("ctime", t)]),
    ]
    if version >= 2:
        plain = b"compressible " * 300
        cmds += [
            ("fallocate", [("path", b"d/f"), ("fallocate_mode", 3), ("file_offset", 0), ("size", 4096)]),
            ("fileattr", [("path", b"d/f"), ("fileattr", 0x10)]),
            (
                "encoded_write",
                [
                    ("path", b"d/f"),
                    ("file_offset", 0),
                    ("unencoded_file_len", len(plain)),
                    ("unencoded_len", len(plain)),
                    ("unencoded_offset", 0),
                    ("compression", 1),
                    ("encryption", 0),
                    ("data", zlib.compress(plain)),
                ],
            ),
        ]
    if version >= 3:
        cmds.append(("enable_verity", [("path", b"d/f"), ("verity_algorithm", 1), ("verity_block_size", 4096),
                                       ("verity_salt_data", b""), ("verity_sig_data", b"")]))  # fmt: skip
    return stream(version, *cmds)


def stream_seeds() -> dict[str, bytes]:
    """Each fixture (WRITE data cut short) in pieces of about :data:`SEED_SIZE`: its
    first commands, then each later run of commands after its subvolume's; each
    ENCODED_WRITE alone; a tour of every command of each version; restarts."""
    seeds: dict[str, bytes] = {}
    end = encode_command(Command.build("end"), 1)
    for path in sorted(FIXTURES.glob("*.stream")):
        data = seed_stream(path, size=SEED_SIZE)
        if len(data) <= SEED_SIZE + 1024:
            seeds[path.stem] = data
        events = [kept(ev) for ev in file_events(io.BytesIO(seed_stream(path)))]
        version = next(ev.version for ev in events if isinstance(ev, StreamHeader))
        first = next(ev for ev in events if isinstance(ev, Command))
        start = encode_stream_header(version) + encode_command(first, version)
        run, at = b"", 0
        for ev in events:
            if not isinstance(ev, Command) or ev.name in ("subvol", "snapshot", "end"):
                continue
            one = encode_command(ev, version)
            if ev.name == "encoded_write" and len(one) <= SEED_SIZE:  # alone, with its subvolume
                seeds[f"{path.stem}-encoded-{ev.index}"] = start + one + end
            if ev.offset < len(data) - len(end) or len(one) > SEED_SIZE:
                continue  # in the first piece, or too big for a piece
            run, at = run + one, at or ev.index
            if len(run) > SEED_SIZE:
                seeds[f"{path.stem}-at-{at}"] = start + run + end
                run, at = b"", 0
        if run:
            seeds[f"{path.stem}-at-{at}"] = start + run + end
    for version in range(1, MAX_VERSION + 1):
        seeds[f"tour-v{version}"] = tour(version)
    small = seeds["rich-incr-nodata-v2"]
    for cut in (40, 300, 1000):
        seeds[f"restart-{cut}"] = small[:cut] + small
    return seeds


def session_seeds() -> dict[str, bytes]:
    ident = stream_identity(tour(2))
    checkpoint = Checkpoint(ident, 17, 0, Ledger().digest())
    return {
        "hello": MAGIC + b" 1 " + json.dumps({"stream": ident}).encode() + b"\n",
        "answer": MAGIC + b' 1 {"resume":0,"verified":0}\nack 0\nsendstream-status 0 ok\n',
        "status": STATUS_PREFIX + b"3 the input ends inside a command\n",
        "token": make_token(checkpoint, TOKEN_KEY).encode(),
        "payload": json.dumps({"stream": ident, "offset": 17, "commands": 0, "ledger": "0" * 64}).encode(),
    }


def config_seeds() -> dict[str, bytes]:
    """serve.toml as the service's guide has it, and with every kind of client (places relative to the file)."""
    readme = (REPO / "docs" / "guides" / "service.md").read_text()
    example = readme[readme.index('listen = "*:7000"') :]
    example = example[: example.index("```")]
    example = example.replace("/srv/streams/web1", "srv/streams/web1").replace("/mnt/backup/db1", "mnt/backup/db1")
    several = """listen = "[::1]:7000"
tls = "tls12-aes256-gcm"
max_transfers = 64
max_per_client = 4
handshake_timeout = 2.5
idle_timeout = 0
journal_days = 0.5

[clients.web1]
key = "keys/web1.key"
store = "srv/streams/web1"
quota = 500000000000
trusted = ["10.1.2.3", "10.1.0.0/16", "fd00::/8"]

[clients."db1"]
key = "keys/db1.key"
receive = "mnt/backup/db1"
trusted = ["::ffff:10.2.0.0/112"]

[clients."app-2.x"]
key = "keys/app.key"
store = "s3://backups/hosts/app/"

[clients.Arch_1]
key = "keys/text.key"
store = "srv/link/../../other"
quota = "1.5T"
"""
    return {
        "readme": example.encode(),
        "several": several.encode(),
        "minimal": b'listen = "127.0.0.1:7000"\n[clients.alpha]\nkey = "keys/web1.key"\nstore = "srv/other"\n',
        "inline": b'listen = "*:7000"\nclients = { a = { key = "keys/db1.key", receive = "mnt/backup/db2" },'
        b' b = { key = "keys/web1.key", store = "srv/link" } }\n',
        "shared-place": several.replace("srv/link/../../other", "srv/streams").encode(),
        "shared-key": several.replace("keys/text.key", "keys/copy.key").encode(),
        "overlapping": several.replace('"::ffff:10.2.0.0/112"', '"10.1.2.0/24"').encode(),
    }


def stream_of(uuid_: str, ctransid: int, parent: tuple[str, int] | None = None, data: int = 64) -> bytes:
    """A small stream that makes snapshot ``uuid_`` at ``ctransid`` (from ``parent``), with ``data`` bytes
    written (in writes of 48 KiB)."""
    first = (
        ("snapshot", [("path", b"snap"), ("uuid", uuid.UUID(uuid_)), ("ctransid", ctransid),
                      ("clone_uuid", uuid.UUID(parent[0])), ("clone_ctransid", parent[1])])
        if parent else ("subvol", [("path", b"snap"), ("uuid", uuid.UUID(uuid_)), ("ctransid", ctransid)])
    )  # fmt: skip
    chunk = 48 << 10
    writes = [
        ("write", [("path", b"f"), ("file_offset", at), ("data", bytes([at % 251]) * min(chunk, data - at))])
        for at in range(0, data, chunk)
    ]
    return stream(2, first, ("mkfile", [("path", b"f"), ("ino", 257)]), *writes)


def uploaded(store: MemoryStore, data: bytes, **options: Any) -> str:
    """``send --to s3://`` of ``data`` into ``store``: the stream's name."""
    done = upload(io.BytesIO(data), ARCHIVE, store, change_sealing=True, host="web1.example", **options)
    return done.url.rpartition("/")[2]


A, B, C = (
    "7f6b4a1e-9c3d-4e2f-8a1b-2c3d4e5f6a7b",
    "0d1e2f3a-4b5c-4d6e-9f8a-7b6c5d4e3f2a",
    "a0b1c2d3-e4f5-4a6b-8c7d-e8f9a0b1c2d3",
)


def archive_seeds() -> tuple[MemoryStore, dict[str, str]]:
    """A store that ``send --to s3://`` wrote: a chain (a full stream in three objects, two incrementals
    from it), a stream sealed in three parts and two objects, two streams built on each other, the
    resumable upload of tour(2) (its every state kept); and the names of each."""
    store = MemoryStore()
    names = {
        "full": uploaded(store, stream_of(A, 10, data=3000), part_size=1024, max_object=2048),
        "incr": uploaded(store, stream_of(B, 20, (A, 10)), part_size=1024),
        "incr2": uploaded(store, stream_of(C, 30, (B, 20))),
        "sealed": uploaded(
            store, stream_of(C, 40, (B, 20), data=11 << 20), part_size=MIN_PART, max_object=11 << 20, sealer=SEALER
        ),
    }
    circle = MemoryStore()
    names["circle-a"] = uploaded(circle, stream_of(A, 50, (B, 60)))
    names["circle-b"] = uploaded(circle, stream_of(B, 60, (A, 50)))
    store.objects.update((k, v) for k, v in circle.objects.items() if k.endswith(".json"))
    names["tour"] = uploaded(store, SMALL_STREAM, part_size=256, key=ARCHIVE_KEY)
    return store, names


def manifest_of(store: MemoryStore, name: str) -> bytes:
    return store.objects[ARCHIVE.key(name + ".json")]


def manifest_seeds() -> dict[str, bytes]:
    store, names = archive_seeds()
    chain = [manifest_of(store, names[n]) for n in ("full", "incr", "incr2")]
    return {
        "chain": b"\0".join(chain),
        "chain-named": b"\0".join(
            f"{names[n]}.json\n".encode() + m for n, m in zip(("full", "incr", "incr2"), chain, strict=True)
        ),
        "sealed": manifest_of(store, names["sealed"]),
        "sealed-chain": b"\0".join([*chain, manifest_of(store, names["sealed"])]),
        "circle": b"\0".join(manifest_of(store, names[n]) for n in ("full", "circle-a", "circle-b")),
        "orphan": manifest_of(store, names["incr2"]),
    }


def state_seeds() -> dict[str, bytes]:
    """The states of resumable uploads as ``send --to s3:// --resumable`` saves them, part by part: their
    ``state`` (the harness signs it), and one whole as saved."""
    seeds: dict[str, bytes] = {}
    for sealed in (False, True):
        store = MemoryStore()
        uploaded(store, SMALL_STREAM, part_size=256, max_object=600, key=ARCHIVE_KEY, sealer=SEALER if sealed else None)
        saved = [body for key, body in store.written if key.endswith(STATE_SUFFIX)]
        for n in (0, len(saved) // 2, len(saved) - 1):
            seeds[f"{'sealed' if sealed else 'plain'}-{n}"] = json.dumps(json.loads(saved[n])["state"]).encode()
        seeds[f"{'sealed' if sealed else 'plain'}-whole"] = saved[-1]
    return seeds


def list_seeds() -> dict[str, bytes]:
    """The service's answers to ``send --list``: of an archive, of received subvolumes (a name that is
    not UTF-8 among them), none, and a refusal."""
    store, _ = archive_seeds()
    archived = ServiceClient("web1", b"k", ARCHIVE.url()).store(lambda: store).held()
    received: list[dict[str, Any]] = [
        {**held_name(b"snap\xe9-1"), "uuid": A, "ctransid": 10, "parent_uuid": None, "parent_ctransid": None},
        {**held_name(b"snap-2"), "uuid": B, "ctransid": 20, "parent_uuid": A, "parent_ctransid": 10},
    ]
    return {
        "archive": b"".join(map(listed_line, archived)) + status_line(0, f"{len(archived)} snapshots"),
        "received": b"".join(map(listed_line, received)) + status_line(0, "2 snapshots"),
        "empty": status_line(0, "0 snapshots"),
        "refused": status_line(e.EXIT_USAGE, "refused: the key of web1 is not a client's"),
    }


def store_answer(status: int, body: bytes, *headers: str) -> bytes:
    return f"{status}\n".encode() + b"".join(h.encode() + b"\n" for h in headers) + b"\n" + body


def listing_answer(keys: list[str], token: str | None = None, next_token: str | None = None) -> bytes:
    contents = "".join(
        f"<Contents><Key>{ARCHIVE.key(k)}</Key><LastModified>2026-12-01T06:00:{n:02d}.000Z</LastModified>"
        f'<ETag>"d41d8cd98f00b204e9800998ecf8427e"</ETag><Size>{100 + n}</Size><StorageClass>STANDARD</StorageClass>'
        "</Contents>"
        for n, k in enumerate(keys)
    )
    more = (
        f"<IsTruncated>true</IsTruncated><NextContinuationToken>{next_token}</NextContinuationToken>"
        if next_token
        else "<IsTruncated>false</IsTruncated>"
    )
    return store_answer(
        200,
        _xml(
            f'<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Name>fuzz</Name><Prefix>{ARCHIVE.prefix}</Prefix>'
            + (f"<ContinuationToken>{token}</ContinuationToken>" if token else "")
            + f"<KeyCount>{len(keys)}</KeyCount><MaxKeys>1000</MaxKeys><Delimiter>/</Delimiter>{more}{contents}"
            "<CommonPrefixes><Prefix>archive/old/</Prefix></CommonPrefixes></ListBucketResult>"
        ),
        "Content-Type: application/xml",
        "x-amz-request-id: 1800A2B3C4D5E6F7",
    )


def object_answers(store: MemoryStore, name: str) -> list[tuple[str, bytes]]:
    """The ranged GETs of stream ``name`` as ``verify`` asks them, answered with what the store holds."""
    entry = read_manifest(store, ARCHIVE, name + ".json")
    found = []
    for obj, start, end, *_ in reading_ranges(entry):
        data = store.objects[ARCHIVE.key(obj)]
        found.append(
            (
                f"GET {obj} bytes={start}-{end - 1}",
                store_answer(
                    206,
                    data[start:end],
                    "Content-Type: binary/octet-stream",
                    f"Content-Range: bytes {start}-{end - 1}/{len(data)}",
                    'ETag: "5d41402abc4b2a76b9719d911017c592"',
                ),
            )
        )
    return found


def store_seeds() -> dict[str, bytes]:
    """Inputs of the fake store: answers as S3 gives them, to what ``verify``, ``restore``, ``archive ls``
    and ``send --to s3://`` (resumed) ask, and its errors."""
    store, names = archive_seeds()
    tour_store = MemoryStore()
    uploaded(tour_store, SMALL_STREAM, part_size=256, max_object=600)
    sealed_store = MemoryStore()
    uploaded(sealed_store, SMALL_STREAM, sealer=SEALER)
    manifest_answer = functools.partial(store_answer, 200)

    def scenario(words: str, *answers: tuple[str, bytes]) -> bytes:
        return words.encode() + b"".join(ANSWER_APART + label.encode() + b"\n" + answer for label, answer in answers)

    def got(s: MemoryStore, name: str) -> tuple[str, bytes]:
        return f"GET {name}.json", manifest_answer(manifest_of(s, name), "Content-Type: application/json")

    chain = [names[n] for n in ("full", "incr", "incr2", "circle-a", "circle-b")]
    kept = [names[n] for n in ("full", "incr", "incr2", "sealed")]
    saved = [body for key, body in store.written if key.endswith(STATE_SUFFIX)]
    state = json.loads(saved[len(saved) // 2])
    parts = "".join(
        f"<Part><PartNumber>{n}</PartNumber><LastModified>2026-12-01T06:00:00.000Z</LastModified>"
        f"<ETag>{etag}</ETag><Size>{size}</Size></Part>"
        for n, etag, size in state["state"]["parts"]
    )
    listed_parts = store_answer(
        200,
        _xml(
            f'<ListPartsResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>fuzz</Bucket><Key>archive/{STORED}</Key>'
            f"<UploadId>{state['state']['upload_id']}</UploadId><PartNumberMarker>0</PartNumberMarker>"
            f"<MaxParts>1000</MaxParts><IsTruncated>false</IsTruncated>{parts}</ListPartsResult>"
        ),
    )
    state_answer = (f"GET {STORED}{STATE_SUFFIX}", store_answer(200, json.dumps(state).encode()))
    return {
        "verify": scenario("verify", got(tour_store, STORED), *object_answers(tour_store, STORED)),
        "verify-sealed": scenario("verify", got(sealed_store, STORED), *object_answers(sealed_store, STORED)),
        "restore": scenario("restore", got(tour_store, STORED), *object_answers(tour_store, STORED)),
        "verify-busy": scenario("verify", (f"GET {STORED}.json", _error(503, "SlowDown"))),
        "ls": scenario(
            "ls", ("LIST 0", listing_answer([f"{n}.json" for n in chain] + chain)), *(got(store, n) for n in chain)
        ),
        "ls-pages": scenario(
            "ls",
            ("LIST 0", listing_answer([f"{chain[0]}.json"], None, "page-2")),
            ("LIST 1", listing_answer([f"{chain[1]}.json"], "page-2")),
            got(store, chain[0]),
            got(store, chain[1]),
        ),
        "prune": scenario(  # the newest builds on full and incr: incr2 goes
            "ls prune",
            ("LIST 0", listing_answer([f"{n}.json" for n in kept])),
            *(got(store, n) for n in kept),
            (
                "DELETES 0",
                store_answer(200, _xml(deleted([f"{names['incr2']}.json"])), "Content-Type: application/xml"),
            ),
            ("DELETES 1", store_answer(200, _xml(deleted([], names["incr2"])), "Content-Type: application/xml")),
        ),
        "resume": scenario("resume", state_answer, ("PARTS 0", listed_parts)),
        "upload": scenario(
            "upload resumable",
            ("LIST 0", listing_answer([f"{names['incr2']}.json"])),
            got(store, names["incr2"]),
            state_answer,
            ("PARTS 0", listed_parts),
        ),
        "upload-sealed": scenario("upload sealed", ("HEAD " + STORED + ".json", b"404\n\n")),
        "upload-answered": scenario("upload resumable sealed", *upload_answers()),
    }


def deleted(names: list[str], refused: str | None = None) -> str:
    """S3's answer to DeleteObjects: ``names`` deleted, ``refused`` not."""
    done = "".join(f"<Deleted><Key>{ARCHIVE.key(n)}</Key></Deleted>" for n in names)
    if refused is not None:
        done += (
            f"<Error><Key>{ARCHIVE.key(refused)}</Key><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"
        )
    return f'<DeleteResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">{done}</DeleteResult>'


def upload_answers() -> list[tuple[str, bytes]]:
    """Every request of a resumable upload of tour(2) in four parts, answered as S3 answers it."""
    etag = 'ETag: "9b2cf535f27731c974343645a3985328"'
    created = _xml(
        '<InitiateMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Bucket>fuzz</Bucket>'
        f"<Key>{ARCHIVE.key(STORED)}</Key><UploadId>VXBsb2FkIElEIGZvciA2aWWpbmcncyBteS1tb3ZpZS5tMnRzIHVwbG9hZA"
        "</UploadId></InitiateMultipartUploadResult>"
    )
    completed = _xml(
        '<CompleteMultipartUploadResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/"><Location>'
        f"http://fuzz.s3.amazonaws.com/{ARCHIVE.key(STORED)}</Location><Bucket>fuzz</Bucket><Key>"
        f'{ARCHIVE.key(STORED)}</Key><ETag>"3858f62230ac3c915f300c664312c11f-4"</ETag></CompleteMultipartUploadResult>'
    )
    return [
        ("LIST 0", listing_answer([])),
        (f"HEAD {STORED}.json", b"404\nx-amz-request-id: 4442587FB7D0A2F9\n\n"),
        (f"GET {STORED}{STATE_SUFFIX}", _error(404, "NoSuchKey")),
        (f"CREATE {STORED}", store_answer(200, created, "Content-Type: application/xml")),
        *((f"PART {STORED} {n}", store_answer(200, b"", etag, "x-amz-checksum-crc32c: sOO8/Q==")) for n in range(1, 5)),
        (f"PUT {STORED}{STATE_SUFFIX}", store_answer(200, b"", etag)),
        (f"COMPLETE {STORED}", store_answer(200, completed, "Content-Type: application/xml")),
        (f"PUT {STORED}.json", store_answer(200, b"", etag)),
        (f"DELETE {STORED}{STATE_SUFFIX}", b"204\n\n"),
    ]


def seeds(target: str) -> dict[str, bytes]:
    made = {
        "session": session_seeds,
        "config": config_seeds,
        "manifest": manifest_seeds,
        "upload-state": state_seeds,
        "list-answer": list_seeds,
        "store": store_seeds,
    }
    return made.get(target, stream_seeds)()


SESSION_DICT = [
    MAGIC + b" 1 ", b"sendstream-status ", b"ack ", b'"verified"', b'"resume"', b'"stream"', b'"offset"',
    b'"commands"', b'"ledger"', b'"uuid"', b'"prefix"', b'"sha256"', b"null", b"true", b"[", b"{", b"}", b"]",
    b"\\u0000", b"1e999", b"-1", b"\xb2", TOKEN_PREFIX.encode(),
]  # fmt: skip
_JSON_DICT = [b"null", b"true", b"false", b"[", b"{", b"}", b"]", b"\\u0000", b"1e999", b"-1", b"18446744073709551616",
              b"9223372036854775808", b"\\ud800", b'""']  # fmt: skip
# Times at and around the limits of time_t, struct tm and Python's datetime, as a timespec's seconds:
# the dump printed some natively and failed on the pure path (issue 27).
_TIME_DICT = [struct.pack("<q", t) for t in EDGE_TIMES]
# Tokens of each target's format (libFuzzer's -dict), beside what it learns from the seeds.
DICTS = {
    "decoder": _TIME_DICT,
    "dump": _TIME_DICT,
    "session": SESSION_DICT,
    "config": [b"[clients.", b"[[clients]]", b'key = "keys/', b'store = "', b'receive = "mnt/backup/', b"trusted = [",
               b'quota = "', b'listen = "', b'tls = "', b"max_transfers = ", b"max_per_client = ",
               b"handshake_timeout = ", b"idle_timeout = ", b"journal_days = ", b"s3://", b"srv/link", b"srv/file",
               b"keys/copy.key", b"keys/open.key", b"keys/empty.key", b"keys/bad.key", b"keys/text.key", b"::ffff:",
               b"/104", b"/0", b"fd00::/8", b"%eth0", b"inf", b"nan", b"1e308", b"0x7fffffffffffffff", b"\\u0000",
               b"'''", b'"""', b"\n", "\u00b2".encode(), "\u0661".encode()],
    "manifest": [*_JSON_DICT, b'"format"', b'"sendstream-manifest-1"', b'"stream"', b'"objects"', b'"key"', b'"size"',
                 b'"parts"', b'"encryption"', b'"cipher"', b'"AES-256-GCM"', b'"segment"', b"8388608", b"5242880",
                 b"8388636", b'"parent_uuid"', b'"parent_ctransid"', b'"ctransid"', b'"uuid"', b'"stored"',
                 b'"snapshot"', b".stream.json\n", b".from.", b"\0"],
    "upload-state": [*_JSON_DICT, b'"state"', b'"mac"', b'"format"', b'"sendstream-upload-2"', b'"upload_id"',
                     b'"objects"', b'"parts"', b'"offset"', b'"commands"', b'"ledger"', b'"sealing"', b'"segment"',
                     b'"key"', b'"size"', b'"stream"'],
    "list-answer": [*_JSON_DICT, LIST_PREFIX, STATUS_PREFIX, b"ack ", MAGIC + b" 1 ", b'"name"', b'"name_base64"',
                    b'"uuid"', b'"ctransid"', b'"parent_uuid"', b'"parent_ctransid"', b'"size"', b'"stored"',
                    b"\x1b[2J", b"\xe9"],
    "store": [ANSWER_APART + b"GET ", ANSWER_APART + b"LIST 1\n", ANSWER_APART + b"PARTS 0\n", ANSWER_APART + b"HEAD ",
              ANSWER_APART + b"PUT ", ANSWER_APART + b"PART ", ANSWER_APART + b"CREATE ", ANSWER_APART + b"COMPLETE ",
              b"HTTP/1.0 ", b"Content-Length: ", b"Content-Range: bytes ", b"Transfer-Encoding: chunked",
              b"Content-Encoding: gzip", b"Content-Type: application/xml", b"x-amz-checksum-crc32c: ", b"ETag: ",
              b"Last-Modified: ", b"<Contents>", b"</Contents>", b"<Key>", b"</Key>", b"<LastModified>",
              b"<IsTruncated>true</IsTruncated>", b"<NextContinuationToken>", b"<CommonPrefixes>", b"<Part>",
              b"<PartNumber>", b"<Size>", b"<ETag>", b"<UploadId>", b"<Error><Code>", b"NoSuchKey", b"SlowDown",
              b"InternalError", b"AccessDenied", b"NoSuchUpload", b"\n\n", b"200", b"206", b"204", b"301", b"304",
              b"307", b"400", b"403", b"404", b"416", b"500", b"503", b"&amp;", b"&#0;", b"<![CDATA[", b"<!DOCTYPE",
              b"ls\n", b"resume\n", b"restore\n", b"upload resumable sealed change\n", b".upload", b".json"],
}  # fmt: skip


# --- the structure-aware mutator --------------------------------------------------------------------------------------

POOL: list[bytes] = []  # encoded commands of the seeds, spliced into inputs
_HEADER = struct.Struct("<LHL")
_TLV = struct.Struct("<HH")
_INTERESTING_INTS = (0, 1, 2, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF, 1 << 32, 1 << 40,
                     (1 << 62), (1 << 63) - 1, 1 << 63, (1 << 64) - 1)  # fmt: skip
_INTERESTING_PATHS = (b"", b".", b"..", b"../x", b"/abs", b"a/../b", b"a//b", b"a/", b"a\0b", b"o257-7-0",
                      b"o258-7-0/x", b"d", b"d/f", b"sentinel/secret", b"../sentinel/secret", b"x" * 255, b"x" * 256,
                      b"a/" * 60 + b"a", b"\xff\xfe", b"s/x", b"sources")  # fmt: skip


def fix_crcs(data: bytearray) -> None:
    """Give every command that can be framed its right CRC (across streams and restarts)."""
    pos, n = 0, len(data)
    while True:
        at = data.find(STREAM_MAGIC, pos)
        if at < 0 or at + 17 > n:
            return
        pos = at + 17
        while pos + 10 <= n:
            if data[pos : pos + len(STREAM_MAGIC)] == STREAM_MAGIC:
                break
            length, cmd, _ = _HEADER.unpack_from(data, pos)
            end = pos + 10 + length
            if end > n:
                return
            _HEADER.pack_into(data, pos, length, cmd, 0)
            _HEADER.pack_into(data, pos, length, cmd, crc32c(memoryview(data)[pos:end]))
            pos = end
            if cmd == COMMAND_NUMBERS["end"]:
                break
        else:
            return


def split_stream(data: bytes) -> tuple[bytes, int, list[bytearray], bytes]:
    """(header, version, commands, the rest) of the first stream of ``data``, as far as it frames."""
    if not data.startswith(STREAM_MAGIC) or len(data) < 17:
        return b"", 0, [], data
    version = int.from_bytes(data[13:17], "little")
    pos, out = 17, []
    while pos + 10 <= len(data):
        length = int.from_bytes(data[pos : pos + 4], "little")
        if pos + 10 + length > len(data):
            break
        out.append(bytearray(data[pos : pos + 10 + length]))
        pos += 10 + length
    return data[:17], version, out, data[pos:]


def split_tlvs(payload: bytes, version: int) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos + 4 <= len(payload):
        t, n = _TLV.unpack_from(payload, pos)
        if t == 19 and version >= 2:
            out.append((t, payload[pos + 2 :]))
            break
        out.append((t, payload[pos + 4 : pos + 4 + n]))
        pos += 4 + n
    return out


def join_tlvs(tlvs: list[tuple[int, bytes]], version: int) -> bytes:
    out = bytearray()
    for t, v in tlvs:
        out += struct.pack("<H", t) if t == 19 and version >= 2 else _TLV.pack(t, len(v) & 0xFFFF)
        out += v
    return bytes(out)


def interesting_value(rng: random.Random, t: int) -> bytes:
    spec = ATTRIBUTES.get(t)
    kind = spec.kind if spec else rng.choice(("u64", "u32", "string", "bytes"))
    if kind in ("string", "bytes"):
        return rng.choice(_INTERESTING_PATHS) if rng.random() < 0.8 else rng.randbytes(rng.randrange(0, 40))
    if kind == "uuid":
        return rng.choice((bytes(16), b"\xff" * 16, bytes.fromhex("5751d173386b2e48a1ec5e5bd918dd22")))
    size = {"u8": 1, "u32": 4, "u64": 8, "timespec": 12}.get(kind, 8)
    if rng.random() < 0.1:
        size = rng.choice((0, 1, 2, 3, 7, 9, 16))  # the wrong size
    elif kind == "timespec" and rng.random() < 0.5:
        return struct.pack("<qL", rng.choice(EDGE_TIMES), rng.choice((0, 999_999_999, 1_000_000_000, 0xFFFFFFFF)))
    value = rng.choice(_INTERESTING_INTS) if rng.random() < 0.8 else rng.getrandbits(64)
    return (value & ((1 << 64) - 1)).to_bytes(8, "little")[: min(size, 8)].ljust(size, b"\0")


def mutate_command(rng: random.Random, cmd: bytearray, version: int) -> bytearray:
    payload = bytes(cmd[10:])
    tlvs = split_tlvs(payload, version)
    choice = rng.random()
    if choice < 0.15 or not tlvs:
        payload = atheris.Mutate(payload, max(2 * len(payload), 64))
    elif choice < 0.25:
        number = rng.choice((0, 22, 23, 24, 25, 26, 27, 40, 0xFFFF, *COMMANDS))
        _HEADER.pack_into(cmd, 0, 0, number, 0)
    else:
        i = rng.randrange(len(tlvs))
        t, v = tlvs[i]
        op = rng.randrange(7)
        if op == 0:
            tlvs[i] = (t, interesting_value(rng, t))
        elif op == 1:
            tlvs[i] = (t, atheris.Mutate(v, max(2 * len(v), 16)))
        elif op == 2:
            tlvs[i] = (rng.choice((0, 19, 36, 40, 0xFFFF, *ATTRIBUTES)), v)
        elif op == 3:
            del tlvs[i]
        elif op == 4:
            tlvs.insert(rng.randrange(len(tlvs) + 1), tlvs[i])
        elif op == 5:
            new = rng.choice((*ATTRIBUTES, 36))
            tlvs.insert(rng.randrange(len(tlvs) + 1), (new, interesting_value(rng, new)))
        else:
            rng.shuffle(tlvs)
        payload = join_tlvs(tlvs, version)
    _, number, _ = _HEADER.unpack_from(cmd, 0)
    return bytearray(_HEADER.pack(len(payload), number, 0) + payload)


def mutate_stream(data: bytes, max_size: int, seed: int) -> bytes:
    """libFuzzer's custom mutator for the stream targets."""
    rng = random.Random(seed)
    header, version, cmds, rest = split_stream(data)
    if not header or rng.random() < 0.15:
        out = bytearray(atheris.Mutate(data, max_size))
    else:
        op = rng.random()
        if op < 0.45 and cmds:
            i = rng.randrange(len(cmds))
            cmds[i] = mutate_command(rng, cmds[i], version)
        elif op < 0.6 and POOL:
            cmds.insert(rng.randrange(len(cmds) + 1), bytearray(rng.choice(POOL)))
        elif op < 0.7 and cmds:
            del cmds[rng.randrange(len(cmds))]
        elif op < 0.78 and cmds:
            i, j = rng.randrange(len(cmds)), rng.randrange(len(cmds))
            cmds[i], cmds[j] = cmds[j], cmds[i]
        elif op < 0.85 and cmds:
            cmds.insert(rng.randrange(len(cmds) + 1), bytearray(rng.choice(cmds)))
        elif op < 0.9:
            header = header[:13] + struct.pack("<L", rng.choice((0, 1, 2, 3, 4, 0xFFFFFFFF)))
        elif op < 0.95 and cmds:
            # a restart: a new header and the stream's first commands again, maybe after part of a command
            k = rng.randrange(len(cmds) + 1)
            cut = rng.randrange(len(cmds[k - 1])) if k and rng.random() < 0.5 else 0
            replay = header + b"".join(cmds[: rng.randrange(len(cmds) + 1)])
            cmds.insert(k, bytearray((bytes(cmds[k - 1][:cut]) if cut else b"") + replay))
        else:
            rest = (
                atheris.Mutate(rest, max(64, len(rest) * 2))
                if rest
                else header + b"".join(rng.sample(cmds, min(3, len(cmds))))
            )
        out = bytearray(header + b"".join(cmds) + rest)
    if rng.random() < 0.95:
        fix_crcs(out)
    return bytes(out[:max_size])


# --- running ----------------------------------------------------------------------------------------------------------


def under_asan() -> bool:
    with open("/proc/self/maps") as maps:
        return "libasan" in maps.read()


def limit_memory(megabytes: int) -> None:
    if megabytes and not under_asan():
        size = megabytes << 20
        resource.setrlimit(resource.RLIMIT_AS, (size, size))


def limit_files(megabytes: int) -> None:
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
    size = megabytes << 20
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))


class Runner:
    """Runs one target on an input with the crash rule."""

    def __init__(self, target: str) -> None:
        self.target = TARGETS[target]

    def __call__(self, data: bytes) -> None:
        try:
            part(lambda: self.target(data))
        except BaseException:
            if SCRATCH is not None:
                SCRATCH.remove()  # libFuzzer exits right after a crash
            raise


def remove_scratch() -> None:
    """The scratch directory of ``extract`` or ``config``, when the run made one."""
    if SCRATCH is not None:
        SCRATCH.remove()
        SCRATCH.base.rmdir()
    if PLACES is not None:
        _remove(PLACES.base)


def replay(runner: Runner, paths: list[str]) -> int:
    """Each file once, with a JSON line of its outcome; the number of crashes."""
    files = []
    for p in map(Path, paths):
        files.extend(sorted(f for f in p.iterdir() if f.is_file()) if p.is_dir() else [p])
    crashes = 0
    for path in files:
        result: dict[str, Any] = {"file": path.name, "ok": True}
        try:
            runner.target(path.read_bytes())
        except e.SendStreamError:
            pass
        except Exception as exc:
            crashes += 1
            frames = traceback.extract_tb(exc.__traceback__)[-4:]
            result = {
                "file": path.name,
                "ok": False,
                "signature": signature(exc),
                "error": f"{type(exc).__name__}: {exc!s:.500}",
                "frames": [f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in frames],
            }
            if SCRATCH is not None:
                SCRATCH.reset()
        print(json.dumps(result), flush=True)
    remove_scratch()
    return crashes


def outcome(target: Callable[[bytes], None], data: bytes) -> str | None:
    """The crash signature of ``data``, None when it passes."""
    try:
        target(data)
    except e.SendStreamError:
        return None
    except Exception as exc:
        if SCRATCH is not None:
            SCRATCH.reset()  # the next candidate starts from a clean base
        return signature(exc)
    return None


def minimize(target: Callable[[bytes], None], data: bytes, seconds: float = 120.0) -> bytes:
    """A smaller input with the same crash signature: whole commands left out, then
    byte ranges (each candidate also with its CRCs fixed)."""
    import time

    wanted = outcome(target, data)
    if wanted is None:
        raise SystemExit("fuzz: the input does not crash")
    deadline = time.monotonic() + seconds

    def same(candidate: bytes) -> bool:
        return time.monotonic() < deadline and outcome(target, candidate) == wanted

    progress = True
    while progress:
        progress = False
        header, _, cmds, rest = split_stream(data)
        for i in reversed(range(len(cmds))):
            candidate = header + b"".join(cmds[:i] + cmds[i + 1 :]) + rest
            if same(candidate):
                data, cmds, progress = candidate, cmds[:i] + cmds[i + 1 :], True
        size = len(data) // 2
        while size:
            i = 0
            while i < len(data):
                cut = data[:i] + data[i + size :]
                fixed = bytearray(cut)
                fix_crcs(fixed)
                found = next((c for c in (cut, bytes(fixed)) if len(c) < len(data) and same(c)), None)
                if found is not None:
                    data, progress = found, True
                else:
                    i += size
            size //= 2
    return data


def write_seeds(target: str, directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    for old in directory.iterdir():
        old.unlink()
    for name, data in seeds(target).items():
        (directory / name).write_bytes(data)


def fuzz(target: str, options: dict[str, Any], args: list[str]) -> None:
    global SMALL_STREAM
    runner = Runner(target)
    flags = [a for a in args if a.startswith("-")]
    dirs = [a for a in args if not a.startswith("-")]
    if not dirs:
        dirs = [str(WORK / target)]
        if (CORPUS / target).is_dir():
            dirs.append(str(CORPUS / target))
    files_only = all(Path(d).is_file() for d in dirs)  # libFuzzer runs (or minimises) given files
    if not files_only:
        Path(dirs[0]).mkdir(parents=True, exist_ok=True)
    if not options["no_seeds"] and not files_only:
        write_seeds(target, WORK / f"{target}-seeds")
        dirs.append(str(WORK / f"{target}-seeds"))
    crashes = WORK / f"{target}-crashes"
    crashes.mkdir(parents=True, exist_ok=True)
    defaults = {
        "-artifact_prefix": f"{crashes}/",
        "-max_len": str(MAX_LEN[target]),
        "-timeout": "30",
        "-print_final_stats": "1",
    }
    if target == "extract":
        defaults["-handle_xfsz"] = "0"  # a write past RLIMIT_FSIZE fails with EFBIG (SIGXFSZ ignored)
    if target in DICTS:
        dict_path = WORK / f"{target}.dict"
        dict_path.write_text("".join(f'"{_dict_escape(t)}"\n' for t in DICTS[target]))
        defaults["-dict"] = str(dict_path)
    given = {f.split("=", 1)[0] for f in flags}
    flags += [f"{k}={v}" for k, v in defaults.items() if k not in given]
    mutator = None
    if target in STREAM_TARGETS:
        for data in seeds(target).values():
            POOL.extend(bytes(c) for c in split_stream(data)[2] if len(c) <= 4096)
        mutator = mutate_stream
    argv = [sys.argv[0], *flags, *dirs]
    print(f"fuzz: {target}: {' '.join(argv[1:])}", file=sys.stderr)
    atheris.Setup(argv, runner, custom_mutator=mutator)
    atheris.Fuzz()


def _dict_escape(token: bytes) -> str:
    return "".join(chr(b) if 0x20 <= b < 0x7F and b not in b'"\\' else f"\\x{b:02x}" for b in token)


def main(argv: list[str]) -> int:
    global SMALL_STREAM
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if argv[0] == "--list":
        print("\n".join(TARGETS))
        return 0
    if argv[0] == "--write-issue-inputs":
        for target, inputs in issue_inputs().items():
            (Path(argv[1]) / target).mkdir(parents=True, exist_ok=True)
            for name, data in inputs.items():
                (Path(argv[1]) / target / name).write_bytes(data)
        return 0
    target, rest = argv[0], argv[1:]
    if target not in TARGETS:
        print(f"fuzz: unknown target {target!r}; one of {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    options = {"memory_mb": 1024, "fsize_mb": 16, "skip_known": False, "no_seeds": False,
               "deep_every": DEEP_EVERY_FUZZING}  # fmt: skip
    args, replaying, minimizing = [], False, False
    it = iter(rest)
    for arg in it:
        if arg in ("--memory-mb", "--fsize-mb", "--deep-every"):
            options[arg[2:].replace("-", "_")] = int(next(it))
        elif arg in ("--skip-known", "--no-seeds"):
            options[arg[2:].replace("-", "_")] = True
        elif arg == "--known":
            KNOWN[next(it)] = "given with --known"
        elif arg == "--replay":
            replaying = True
        elif arg == "--minimize":
            minimizing = True
        elif arg.startswith("--"):
            print(f"fuzz: unknown option {arg}", file=sys.stderr)
            return 2
        else:
            args.append(arg)
    global SKIP_KNOWN, DEEP_EVERY
    SKIP_KNOWN = bool(options["skip_known"])
    DEEP_EVERY = 1 if replaying or minimizing else max(1, int(options["deep_every"]))
    if "MALLOC_ARENA_MAX" not in os.environ:
        # the archive's readers and writers are threads, each with a malloc arena of 64 MiB of address space
        # that RLIMIT_AS counts: 2 arenas, as the memory bounds of the archive are measured
        os.execve(sys.executable, [sys.executable, __file__, *argv], {**os.environ, "MALLOC_ARENA_MAX": "2"})
    SMALL_STREAM = tour(2)
    limit_memory(options["memory_mb"])
    if target in ("extract", "config") and not replaying and not minimizing and SCRATCH_ENV not in os.environ:
        # libFuzzer ends the process without Python's clean-up: a parent removes the scratch directory
        base = scratch_base()
        try:
            return subprocess.call([sys.executable, __file__, *argv], env={**os.environ, SCRATCH_ENV: str(base)})
        finally:
            _remove(base)
    if target == "extract":
        limit_files(options["fsize_mb"])
    if replaying:
        return 1 if replay(Runner(target), args) else 0
    if minimizing:
        source, dest = map(Path, args)
        small = minimize(TARGETS[target], source.read_bytes())
        dest.write_bytes(small)
        print(f"fuzz: {len(small)} bytes, {outcome(TARGETS[target], small)}", file=sys.stderr)
        remove_scratch()
        return 0
    fuzz(target, options, args)
    return 0


# --- the hostile inputs of issue 11 -----------------------------------------------------------------------------------


def raw_command(cmd: int, tlvs: list[tuple[int, bytes]]) -> bytes:
    """A command with a right CRC made of raw TLVs (any type, any size)."""
    out = bytearray(_HEADER.pack(0, cmd, 0) + b"".join(_TLV.pack(t, len(v)) + v for t, v in tlvs))
    fix_length = len(out) - 10
    _HEADER.pack_into(out, 0, fix_length, cmd, 0)
    _HEADER.pack_into(out, 0, fix_length, cmd, crc32c(out))
    return bytes(out)


def issue_inputs() -> dict[str, dict[str, bytes]]:
    """Small versions of the inputs issue 11 names, by target (``--write-issue-inputs``)."""
    import uuid as uuidlib

    u64 = struct.Struct("<Q").pack
    me = uuidlib.UUID("5751d173-386b-2e48-a1ec-5e5bd918dd22")
    subvol = ("subvol", [("path", b"snap"), ("uuid", me), ("ctransid", 7)])
    v1_subvol = encode_stream_header(1) + encode_command(Command.build(*subvol), 1)
    end = encode_command(Command.build("end"), 1)
    # 6a: CRC-valid 10-byte "command 0" records, and one command of unknown attributes
    zeros = encode_stream_header(2) + bytes(10 * (KEPT_MAX + 1))
    unknown = (
        stream(2, subvol)[:-10]
        + raw_command(3, [(15, b"f"), (3, u64(257))] + [(100 + i, b"") for i in range(KEPT_MAX + 1)])
        + end
    )
    # 7a: a directory 1,000 deep, built with short commands (mkdir b, rename a -> b/a, rename b -> a)
    chain: list[tuple[str, list[tuple[str, Any]]]] = [subvol, ("mkdir", [("path", b"a"), ("ino", 257)])]
    for ino in range(258, 1257):
        chain += [
            ("mkdir", [("path", b"b"), ("ino", ino)]),
            ("rename", [("path", b"a"), ("path_to", b"b/a")]),
            ("rename", [("path", b"b"), ("path_to", b"a")]),
        ]
    chain.append(("mkfile", [("path", b"/".join([b"a"] * 1000) + b"/f"), ("ino", 2000)]))
    deep = stream(2, *chain)
    # 7b: attribute 30 (COMPRESSION, u32 from v2 on) with 2 bytes in v1
    chmod_30 = v1_subvol + raw_command(18, [(15, b""), (5, u64(0o755)), (30, b"\1\0")]) + end
    subvol_30 = (
        encode_stream_header(1) + raw_command(1, [(15, b"snap"), (1, me.bytes), (2, u64(7)), (30, b"\1\0")]) + end
    )
    # 7c: a MKNOD whose mode does not fit a C int
    mknod = stream(2, subvol, ("mknod", [("path", b"n"), ("ino", 257), ("mode", 1 << 63), ("rdev", 0)]))
    # 6c: a punched hole of 2^62 after a TRUNCATE to 2^62
    hole = stream(
        2,
        subvol,
        ("mkfile", [("path", b"f"), ("ino", 257)]),
        ("truncate", [("path", b"f"), ("size", 1 << 62)]),
        ("fallocate", [("path", b"f"), ("fallocate_mode", 3), ("file_offset", 0), ("size", 1 << 62)]),
    )
    memory = {"issue-header-and-zeros": zeros, "issue-unknown-attributes": unknown}
    hello = MAGIC + b" 1 "
    ledger = Ledger()
    ledger.header(2)  # a token at the end of the header of SMALL_STREAM
    return {
        "decoder": {**memory, "issue-v1-subvol-attribute-30-of-2-bytes": subvol_30},
        "repair": memory,
        "changes": {**memory, "issue-mknod-mode-2-63": mknod},
        "dump": {**memory, "issue-v1-chmod-attribute-30-of-2-bytes": chmod_30},
        "convert": {**memory, "issue-punched-hole-of-2-62": hole},
        "extract": {**memory, "issue-directory-chain-1000-deep": deep, "issue-punched-hole-of-2-62": hole},
        "session": {
            "issue-hello-bad-json": hello + b"{not json\n",
            "issue-hello-list": hello + b"[1, 2]\n",
            "issue-hello-string": hello + b'"stream"\n',
            "issue-hello-deep-nesting": hello + b"[" * 30000 + b"\n",
            "issue-hello-not-utf8": hello + b'{"stream": "\xff\xfe"}\n',
            "issue-answer-bad-json": hello + b'{"verified": 0, "resume": \n',
            "issue-answer-verified-not-integer": hello + b'{"verified": "zero", "resume": 0}\n',
            "issue-status-superscript-two": STATUS_PREFIX + "\u00b2 failed\n".encode(),
            "issue-token-stream-list": json.dumps(
                {"stream": [], "offset": 17, "commands": 0, "ledger": ledger.digest()}
            ).encode(),
        },
    }


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
