#!/usr/bin/env python3
"""Benchmark ``sendstream`` against ``dd``, ``cat`` and ``btrfs receive --dump`` on two real streams.

Usage: ``python3 tools/bench.py [--dir DIR] [--repeat N] [--quick] [--commands N] [--before CHECKOUT] [--tmpfs]
[--installed]``

The streams (``bigwrite.stream``, ~1.06 GiB, v2; ``metadata.stream``, ~36 MB,
724,005 commands, v1) are made and cached by ``tools/make_bench_streams.py``
(needs root and loop devices the first time).  Every file is read once to warm
the page cache; then each command is run ``--repeat`` times, interleaved, and
the best wall time and the highest peak RSS (``ru_maxrss`` from ``os.wait4``)
are reported as one markdown table per stream.  ``sendstream`` runs with this
checkout first on ``PYTHONPATH``, so the code measured is the code next to this
file.  With ``--before CHECKOUT`` (another checkout, its native module built)
every ``sendstream`` row is also run with that checkout's package, interleaved in
the same rounds, and a "vs before" column gives before / now.  Progress goes to
stderr, the report to stdout.  Exits 1 if any measured command fails.  Standard
library only.

The read floor is ``dd bs=1M`` of the same file (one copy into a reused buffer),
in the same rounds; start-up is ``sendstream verify`` of a tiny stream, so that
verify's own time (its wall time less start-up) can be set against the floor.
Where the native module has more than one CRC-32C kernel, ``verify`` also runs
with the SSE4.2 one (``SENDSTREAM_CRC``), to show what the widest kernel brings.
With ``--tmpfs`` every stream is also copied to a tmpfs (``/dev/shm``) and
measured there: the page cache of a disk file may be reclaimed between runs on
these VMs, a tmpfs file cannot be.  With ``--installed`` the ``sendstream`` rows
run the console script of a wheel of this checkout installed into a fresh venv
(as the README's first command installs it; ``tools/bench_startup.py`` builds
it), not the development install: a development environment's ``.pth`` hooks
(an editable install's finder, ~14 ms here) are start-up no user pays.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import os
import pathlib
import platform
import re
import resource
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import time

import bench_startup

TOOLS_DIR = pathlib.Path(__file__).resolve().parent
REPO = TOOLS_DIR.parent
DEFAULT_DIR = pathlib.Path("/var/tmp/sendstream-bench")
STREAMS = ("bigwrite", "metadata")
QUICK_STREAMS = ("metadata",)
SUMMARY_RE = re.compile(rb"^(?:OK|FAILED[^:]*): \d+ streams?, (\d+) commands, ", re.M)
INNER_RE = re.compile(rb" bytes in (\d+\.\d+) s ")
CRC_RE = re.compile(rb"^sendstream: verifier: .*$", re.M)
CAT_LABEL = "cat"
DD_LABEL = "dd bs=1M (the read floor)"
BTRFS_LABEL = "btrfs receive --dump"
VERIFY_LABEL = "sendstream verify"
STARTUP_LABEL = "sendstream verify (tiny stream: start-up)"
TINY = REPO / "fixtures" / "rich-incr-v2.stream"
TMPFS = pathlib.Path("/dev/shm/sendstream-bench")


class BenchError(Exception):
    """A measured command failed, or a tool is missing."""


@dataclasses.dataclass(frozen=True)
class Tool:
    """One benchmarked command line: ``argv`` with ``stdin`` from the stream when ``pipe_in``."""

    label: str
    argv: tuple[str, ...]
    pipe_in: bool = False
    capture: bool = False
    pythonpath: str | None = None  # another checkout's package instead of this one (``--before``)
    env: tuple[tuple[str, str], ...] = ()  # more of the environment (a CRC kernel)


@dataclasses.dataclass
class Result:
    """All times, peak RSS and the last output of one tool on one stream."""

    tool: Tool
    times: list[float] = dataclasses.field(default_factory=list)
    maxrss_kib: int = 0
    floor_kib: int = 0
    output: bytes = b""

    @property
    def best(self) -> float:
        """The fastest of the runs (seconds)."""
        return min(self.times)


def log(msg: str) -> None:
    """Progress message on stderr."""
    print(msg, file=sys.stderr, flush=True)


def find_exe(name: str) -> str:
    """Absolute path of *name*, preferring this interpreter's scripts dir (skips pyenv shims)."""
    search = os.pathsep.join([sysconfig.get_path("scripts"), os.environ.get("PATH", os.defpath)])
    path = shutil.which(name, path=search)
    if path is None:
        raise BenchError(f"{name} not found in PATH")
    return os.path.abspath(path)


def bench_env(repo: pathlib.Path | str = REPO) -> dict[str, str]:
    """Children's environment: ``repo``'s package first on the path; UTC, C locale."""
    path = os.pathsep.join(p for p in (str(repo), os.environ.get("PYTHONPATH", "")) if p)
    # TZ/LC_ALL: the same time formatting work for `btrfs receive --dump` and `sendstream dump`.
    return dict(os.environ, PYTHONPATH=path, TZ="UTC", LC_ALL="C")


def package_path(script: str, env: dict[str, str]) -> str:
    """Where the console script's interpreter imports ``sendstream`` from, with *env*."""
    with open(script, "rb") as f:
        first = f.readline()
    interp = first[2:].decode(errors="replace").split() if first.startswith(b"#!") else []
    argv = [*(interp or [sys.executable]), "-c", "import sendstream; print(sendstream.__file__)"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd="/")  # not this checkout's directory
    if proc.returncode != 0:
        raise BenchError(f"cannot import sendstream with {argv[0]}:\n{proc.stderr}")
    return os.path.dirname(proc.stdout.strip())


def checkout() -> str:
    """This checkout's commit, noting uncommitted changes to the package."""
    head = version_of(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"])
    dirty = version_of(["git", "-C", str(REPO), "status", "--porcelain", "--", "sendstream"])
    return head + (" + uncommitted changes in sendstream/" if dirty not in ("", "?") else "")


def ensure_streams(directory: pathlib.Path) -> None:
    """Make (or reuse the cached) benchmark streams in *directory*."""
    cmd = [sys.executable, str(TOOLS_DIR / "make_bench_streams.py"), str(directory)]
    log("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, stdout=sys.stderr, stderr=sys.stderr, env=bench_env())
    if proc.returncode != 0:
        raise BenchError(f"make_bench_streams.py failed (exit {proc.returncode})")


def warm(path: pathlib.Path) -> None:
    """Read *path* once so every measured run starts from the page cache."""
    buf = bytearray(1 << 20)
    with open(path, "rb", buffering=0) as f:
        while f.readinto(buf):
            pass


@dataclasses.dataclass(frozen=True)
class Run:
    """One finished run: wall seconds, peak RSS (KiB), the parent's RSS floor (KiB) and output."""

    seconds: float
    maxrss_kib: int
    floor_kib: int
    output: bytes


def run_once(argv: tuple[str, ...], stdin_path: pathlib.Path | None, env: dict[str, str], capture: bool = False) -> Run:
    """Run *argv* once, stdout to /dev/null (or captured if *capture*); raise BenchError on failure.

    ``ru_maxrss`` of a child counts the memory of this process at fork time (the
    kernel keeps the pre-exec high-water mark), so it is never below ``floor_kib``.
    """
    with (
        open(stdin_path or os.devnull, "rb") as stdin,
        tempfile.TemporaryFile() if capture else open(os.devnull, "wb") as stdout,
        tempfile.TemporaryFile() as stderr,
    ):
        floor = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        t0 = time.perf_counter()
        try:
            proc = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr, env=env)
        except OSError as exc:
            raise BenchError(f"cannot run {argv[0]}: {exc}") from exc
        _, status, usage = os.wait4(proc.pid, 0)
        elapsed = time.perf_counter() - t0
        proc.returncode = code = os.waitstatus_to_exitcode(status)
        output = b""
        for f in (stdout, stderr) if capture else (stderr,):
            f.seek(0)
            output += f.read()
    if code != 0:
        shown = " ".join(argv) + (f" < {stdin_path}" if stdin_path else "") + " > /dev/null"
        raise BenchError(f"command failed (exit {code}): {shown}\n{output.decode(errors='replace')}")
    return Run(elapsed, usage.ru_maxrss, floor, output)


BEFORE = " (before)"


def crc_kernels() -> tuple[str, ...]:
    """The CRC-32C kernels of this checkout's native module (fastest last), none when it is not built."""
    sys.path.insert(0, str(REPO))
    try:
        from sendstream.codec.backend import native
    finally:
        sys.path.pop(0)
    built = native()
    return tuple(built.module.KERNELS) if built is not None else ()


def make_tools(
    sendstream: str,
    btrfs: str,
    cat: str,
    dd: str,
    stream: pathlib.Path,
    kernels: tuple[str, ...],
    before: str | None = None,
) -> list[Tool]:
    """The command lines measured on *stream*; references first (``kernels``: the native module's CRC
    kernels). With ``before`` (a checkout), each ``sendstream`` row is followed by its twin run on that
    checkout."""
    s = str(stream)
    tools = [
        Tool(DD_LABEL, (dd, f"if={s}", "of=/dev/null", "bs=1M", "status=none")),
        Tool(CAT_LABEL, (cat, s)),
        Tool(BTRFS_LABEL, (btrfs, "receive", "--dump"), pipe_in=True),
        Tool(STARTUP_LABEL, (sendstream, "verify", str(TINY))),
        Tool(VERIFY_LABEL, (sendstream, "verify", s), capture=True),
        *(
            [Tool(f"{VERIFY_LABEL}, SSE4.2 CRC", (sendstream, "verify", s), env=(("SENDSTREAM_CRC", "sse4.2"),))]
            if len(kernels) > 2 and "sse4.2" in kernels
            else []
        ),
        Tool("sendstream dump", (sendstream, "dump", s)),
        Tool("sendstream repair FILE -", (sendstream, "repair", "-q", s, "-")),
        Tool("sendstream convert FILE -", (sendstream, "convert", s, "-")),
    ]
    if before is None:
        return tools
    twins = (
        dataclasses.replace(t, label=t.label + BEFORE, pythonpath=before, capture=False)
        for t in tools
        if t.label.startswith("sendstream") and t.label != STARTUP_LABEL
    )
    return tools + list(twins)


def measure(tools: list[Tool], stream: pathlib.Path, repeat: int, env: dict[str, str]) -> list[Result]:
    """Run every tool *repeat* times (rounds interleaved to spread drift); keep min time, max RSS."""
    results = [Result(t) for t in tools]
    for rnd in range(1, repeat + 1):
        for res in results:
            run_env = env if res.tool.pythonpath is None else bench_env(res.tool.pythonpath)
            run_env = dict(run_env, **dict(res.tool.env))
            run = run_once(res.tool.argv, stream if res.tool.pipe_in else None, run_env, res.tool.capture)
            res.times.append(run.seconds)
            res.maxrss_kib = max(res.maxrss_kib, run.maxrss_kib)
            res.floor_kib = max(res.floor_kib, run.floor_kib)
            res.output = run.output
            log(f"  [{rnd}/{repeat}] {res.tool.label:<26} {run.seconds:8.3f} s  {run.maxrss_kib / 1024:7.1f} MiB")
    return results


def parse_commands(output: bytes) -> int | None:
    """The command count in ``sendstream verify``'s summary line (stdout or stderr), if any."""
    m = SUMMARY_RE.search(output)
    return int(m.group(1)) if m else None


def cpu_model() -> str:
    """The CPU model name from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() in ("model name", "Model", "cpu model"):
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def version_of(argv: list[str]) -> str:
    """First line of a command's output (``--version``), ``""`` if none, ``?`` if it failed."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    if proc.returncode != 0:
        return "?"
    lines = (proc.stdout or proc.stderr).strip().splitlines()
    return lines[0] if lines else ""


def fmt_ratio(num: float, den: float) -> str:
    """``num / den``: two decimals, or two significant digits when small."""
    if den <= 0:
        return "-"
    x = num / den
    return f"{x:.2f}" if x >= 0.095 else f"{x:.2g}"


def fmt_rss(r: Result) -> str:
    """Peak RSS in MB; ``≤ floor`` when it is not above what the child inherited from us."""
    mb = r.maxrss_kib * 1024 / 1e6
    return f"≤ {mb:.1f}" if r.maxrss_kib <= r.floor_kib else f"{mb:.1f}"


def table(name: str, stream: pathlib.Path, results: list[Result], commands: int | None, repeat: int) -> str:
    """A markdown table for one stream."""
    size = stream.stat().st_size
    by_label = {r.tool.label: r for r in results}
    t_btrfs, t_cat, t_dd = by_label[BTRFS_LABEL].best, by_label[CAT_LABEL].best, by_label[DD_LABEL].best
    cmd_text = f"{commands:,} commands" if commands is not None else "commands unknown"
    lines = [
        f"### {name}: {size:,} bytes ({size / 2**30:.2f} GiB), {cmd_text}, best of {repeat}",
        "",
        "| tool | seconds | MB/s | M commands/s | vs btrfs --dump | vs cat | x dd | peak RSS MB |"
        + (" vs before |" if any(r.tool.pythonpath for r in results) else ""),
        "|---|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if any(r.tool.pythonpath for r in results) else ""),
    ]
    for r in results:
        t = r.best
        mcps = f"{commands / t / 1e6:.3f}" if commands is not None and t > 0 and r.tool.label != STARTUP_LABEL else "-"
        row = (
            f"| `{r.tool.label}` | {t:.3f} | {size / t / 1e6:,.1f} | {mcps} "
            f"| {fmt_ratio(t_btrfs, t)} | {fmt_ratio(t_cat, t)} | {fmt_ratio(t, t_dd)} | {fmt_rss(r)} |"
        )
        if (old := by_label.get(r.tool.label + BEFORE)) is not None:
            row += f" {fmt_ratio(old.best, t)} |"
        elif lines[2].endswith("vs before |"):
            row += " |"
        lines.append(row)
    own = by_label[VERIFY_LABEL].best - by_label[STARTUP_LABEL].best
    vs_progs, dump_vs_progs = (fmt_ratio(t_btrfs, by_label[k].best) for k in (VERIFY_LABEL, "sendstream dump"))
    lines += [
        "",
        f"`sendstream verify`'s own time (its wall time less start-up, {by_label[STARTUP_LABEL].best:.3f} s): "
        f"{own:.3f} s, {fmt_ratio(own, t_dd)} x the `dd` floor; the whole command {vs_progs} x as fast as "
        f"`btrfs receive --dump`, `dump` {dump_vs_progs} x.",
    ]
    inner = INNER_RE.search(by_label[VERIFY_LABEL].output)
    if inner and commands is not None and (t := float(inner.group(1))) > 0:
        lines += [
            "",
            f"`sendstream verify`'s time in process (without the interpreter's start): {t:.3f} s, "
            f"{size / t / 1e9:.2f} GB/s, {commands / t / 1e6:.1f} M commands/s.",
        ]
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    """Command-line options."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--dir", type=pathlib.Path, default=DEFAULT_DIR, help=f"stream cache (default {DEFAULT_DIR})")
    p.add_argument("--repeat", type=int, default=None, metavar="N", help="runs per command, best kept (default 3)")
    p.add_argument("--quick", action="store_true", help="metadata stream only, 1 run (smoke test)")
    p.add_argument(
        "--before", metavar="CHECKOUT", help="also run every sendstream row with this checkout's package (a ratio)"
    )
    p.add_argument("--commands", type=int, default=None, metavar="N", help="metadata stream's command count")
    p.add_argument("--tmpfs", action="store_true", help=f"also measure every stream copied to {TMPFS}")
    p.add_argument("--installed", action="store_true", help="run a wheel of the checkout installed in a fresh venv")
    args = p.parse_args(argv)
    if args.repeat is None:
        args.repeat = 1 if args.quick else 3
    if args.repeat < 1:
        p.error("--repeat must be >= 1")
    return args


def main(argv: list[str]) -> int:
    """Run the benchmark; 0 on success, 1 if a command failed."""
    args = parse_args(argv)
    directory: pathlib.Path = args.dir.resolve()
    names = QUICK_STREAMS if args.quick else STREAMS
    now = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
    work = bench_startup.scratch() if args.installed else None
    try:
        ensure_streams(directory)
        # pip compiles an installed package's bytecode; do the same for the checkout, or every
        # run would compile it again (PYTHONDONTWRITEBYTECODE is set on some machines).
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(REPO / "sendstream")], check=True)
        sendstream, btrfs, cat, dd = (find_exe(n) for n in ("sendstream", "btrfs", "cat", "dd"))
        env = bench_env()
        if work is not None:
            sendstream = str(bench_startup.install(REPO, work) / "bin" / "sendstream")
            env = dict(env, PYTHONPATH=os.environ.get("PYTHONPATH", ""))
        kernels = crc_kernels()
        pkg = package_path(sendstream, env)
        streams = {f"{n}.stream": directory / f"{n}.stream" for n in names}
        if args.tmpfs:
            TMPFS.mkdir(parents=True, exist_ok=True)
            for n in names:
                copy = TMPFS / f"{n}.stream"
                if not copy.exists() or copy.stat().st_size != (directory / f"{n}.stream").stat().st_size:
                    log(f"copying {n}.stream to {copy}")
                    shutil.copyfile(directory / f"{n}.stream", copy)
                streams[f"{n}.stream on tmpfs"] = copy
        for path in streams.values():
            log(f"warming page cache: {path}")
            warm(path)
        # One unmeasured run: reports the CRC implementation and warms Python's caches.
        first = run_once((sendstream, "verify", "-v", str(TINY)), None, env, capture=True)
        crc = CRC_RE.search(first.output)
        crc_line = crc.group(0).decode(errors="replace") if crc else "(no crc line)"
        tables = []
        for name, path in streams.items():
            log(f"{name}: {path}")
            tools = make_tools(sendstream, btrfs, cat, dd, path, kernels, args.before)
            results = measure(tools, path, args.repeat, env)
            verify = next(r for r in results if r.tool.label == VERIFY_LABEL)
            commands = parse_commands(verify.output)
            if name.startswith("metadata") and args.commands is not None:
                commands = args.commands
            tables.append(table(name, path, results, commands, args.repeat))
    except BenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 1
    finally:
        if work is not None:
            shutil.rmtree(work, ignore_errors=True)

    print(f"## sendstream benchmark, {now}")
    print()
    print(f"- machine: {len(os.sched_getaffinity(0))} CPUs (nproc), {cpu_model()}")
    print(f"- kernel: {platform.system()} {platform.release()}; Python {platform.python_version()}")
    print(f"- {version_of([btrfs, '--version'])} ({btrfs}); sendstream: {sendstream} (package: {pkg})")
    print(f"- checkout: {checkout()}; {crc_line}; the module's CRC-32C kernels: {', '.join(kernels) or 'none'}")
    if args.before:
        before = version_of(["git", "-C", args.before, "rev-parse", "--short", "HEAD"])
        print(f"- before: {args.before} at {before}; 'vs before' is its time / this checkout's (> 1: faster now)")
    print("- wall time best of N runs, page cache warm, stdout to /dev/null; `btrfs receive --dump` reads stdin")
    print("- MB = 1e6 bytes; ratios are other_time / our_time (> 1: this row is faster)")
    print(
        "- peak RSS is `ru_maxrss` from `os.wait4`; a child's value includes this script's own peak at fork"
        " time, so `≤ X` means the real peak is somewhere below X"
    )
    for t in tables:
        print()
        print(t)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
