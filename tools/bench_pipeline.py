#!/usr/bin/env python3
"""Benchmark real ``btrfs send | ... | btrfs receive`` pipelines on loop-device btrfs, and the first output
of every streaming path after its writer paused.

Usage: ``python3 tools/bench_pipeline.py [--repeat N] [--trees bigwrite,metadata] [--skip-latency]``
(as root; needs btrfs, loop devices, ssh/sshd, socat; missing Debian packages are installed).

Throughput. Two trees are made on a source btrfs: ``bigwrite`` (4 x 272 MiB of random data) and
``metadata`` (~100k tiny files, links, symlinks, directories), each snapshotted read-only. Each is
sent with ``btrfs send`` into ``btrfs receive`` on a second btrfs, through:

- (a) ``direct``: one pipe;
- (b) ``cat``;
- (c) ``sendstream repair - -``;
- (d) ``sendstream send --tls none`` -> ``sendstream receive --exec 'btrfs receive DIR'`` over loopback;
- (e) the same in ``tls13-aes128-gcm``;
- (f) ``socat -u - TCP:...`` -> ``socat -u TCP-LISTEN:... - | btrfs receive DIR``;
- (g) ``ssh -c aes128-gcm@openssh.com root@127.0.0.1 'btrfs receive DIR'`` (a private sshd).

and the same seven into ``btrfs receive --dump > /dev/null`` (which costs little), to show where the
machine or ``btrfs receive`` is the ceiling. Rounds are interleaved; best wall time of ``--repeat``;
CPU seconds per GiB of stream of each process (``os.wait4``; ``btrfs receive`` runs under
``/usr/bin/time`` so that its share is told apart from a parent's; sshd's is the growth of its
reaped children's times). Between runs the received subvolume is deleted and the cleaner waited for.

Latency. A writer sends part of a stream, waits for its output, pauses, sends the next commands and
times how long they take to come out, on every path of ``sendstream`` that reads a pipe or socket.

Progress goes to stderr, the report (markdown) to stdout. Exits 1 on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial

TOOLS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parent))  # this checkout, before an installed sendstream
sys.path.insert(0, str(TOOLS))
sys.path.insert(0, str(TOOLS.parent / "tests"))
from bench_transport import (  # noqa: E402
    GIB,
    PACKAGES,
    Bench,
    BenchError,
    check,
    checkout,
    cpu_model,
    cpu_of,
    ensure_tools,
    find_exe,
    free_port,
    has_children,
    log,
    proc_times,
    reap,
    reap_usage,
    wait_listening,
)
from make_bench_streams import populate_bigwrite, populate_metadata  # noqa: E402
from support.loopfs import btrfs_loop, require_btrfs  # noqa: E402
from support.net import key_file, tls_args  # noqa: E402
from support.pipeline import Pipeline, truncated  # noqa: E402
from support.streams import SAMPLE, boundaries  # noqa: E402

TREES: dict[str, Callable[[pathlib.Path], None]] = {"bigwrite": populate_bigwrite, "metadata": populate_metadata}
PATHS = ["direct", "cat", "repair", "tls none", "tls13-aes128-gcm", "socat", "ssh"]
LETTERS = dict(zip(PATHS, "abcdefg", strict=True))
TLS13 = "tls13-aes128-gcm"
TIME = "/usr/bin/time"
PACKAGES_HERE = {**PACKAGES, "time": "time"}
LATENCY_TARGET = 0.100


@dataclasses.dataclass
class Run:
    seconds: float
    cpu: dict[str, float]  # process -> CPU seconds
    rss: dict[str, float]  # sendstream process -> peak RSS, MB


@dataclasses.dataclass
class Row:
    tree: str
    sink: str
    path: str
    runs: list[Run] = dataclasses.field(default_factory=list)

    @property
    def best(self) -> Run:
        return min(self.runs, key=lambda r: r.seconds)


class Pipelines:
    """The two filesystems, the snapshots and every pipeline to measure."""

    def __init__(self, tmp: pathlib.Path, source: pathlib.Path, dest: pathlib.Path) -> None:
        self.tmp = tmp
        self.source = source
        self.dest = dest
        self.ref = Bench(tmp, tmp / "unused")  # sshd, ssh's command line, the key file
        self.btrfs = find_exe("btrfs")
        self.sendstream = find_exe("sendstream")
        self.cat = find_exe("cat")
        self.socat = find_exe("socat")
        self.size: dict[str, int] = {}

    def make_trees(self, trees: list[str]) -> None:
        for tree in trees:
            work = self.source / f"{tree}-work"
            subprocess.run([self.btrfs, "-q", "subvolume", "create", str(work)], check=True)
            log(f"populating {tree} ...")
            TREES[tree](work)
            subprocess.run(
                [self.btrfs, "-q", "subvolume", "snapshot", "-r", str(work), str(self.snap(tree))], check=True
            )
            subprocess.run(["sync"], check=True)
            with subprocess.Popen([self.btrfs, "send", "-q", str(self.snap(tree))], stdout=subprocess.PIPE) as send:
                assert send.stdout is not None
                self.size[tree] = sum(len(chunk) for chunk in iter(partial(send.stdout.read, 1 << 20), b""))
            log(f"{tree}: a stream of {self.size[tree]:,} bytes")

    def snap(self, tree: str) -> pathlib.Path:
        return self.source / tree

    def sink(self, sink: str, times: pathlib.Path) -> list[str]:
        """``btrfs receive`` into the destination (or ``--dump``), its CPU time written to ``times``."""
        target = ["--dump"] if sink == "dump" else [str(self.dest)]
        return [TIME, "-f", "%U %S", "-o", str(times), self.btrfs, "receive", "-q", *target]

    def run(self, tree: str, sink: str, path: str) -> Run:
        times = self.tmp / "receive.times"
        times.unlink(missing_ok=True)
        receive = self.sink(sink, times)
        out = subprocess.DEVNULL
        logs = self.tmp / "stages.log"
        started: list[tuple[str, subprocess.Popen[bytes]]] = []
        sshd0 = (0.0, 0.0)

        def start(
            name: str, argv: list[str], stdin: object = subprocess.DEVNULL, stdout: int = out
        ) -> subprocess.Popen[bytes]:
            proc: subprocess.Popen[bytes] = subprocess.Popen(
                argv, stdin=stdin, stdout=stdout, stderr=err, env=self.ref.env
            )  # type: ignore[call-overload]
            started.append((name, proc))
            return proc

        def piped(stages: list[tuple[str, list[str]]]) -> None:
            """Start ``stages`` as one pipe line, the last one's output to ``out``."""
            upstream: subprocess.Popen[bytes] | None = None
            for i, (name, argv) in enumerate(stages):
                stdin = upstream.stdout if upstream is not None else subprocess.DEVNULL
                proc = start(name, argv, stdin, out if i == len(stages) - 1 else subprocess.PIPE)
                if upstream is not None and upstream.stdout is not None:
                    upstream.stdout.close()  # only the next stage holds the pipe's read end
                upstream = proc

        send = ("btrfs send", [self.btrfs, "send", "-q", str(self.snap(tree))])
        port = free_port()
        with open(logs, "wb") as err:
            try:
                if path in ("tls none", TLS13):
                    mode = path.split()[-1]
                    tls = tls_args(mode, self.ref.key)
                    exec_cmd = shlex.join(receive)
                    listen = [self.sendstream, "receive", "--listen", f"127.0.0.1:{port}", "-q", *tls]
                    wait_listening(
                        port, [start("sendstream receive", [*listen, "--exec", exec_cmd])], "sendstream receive"
                    )
                elif path == "socat":
                    piped(
                        [
                            (
                                "socat (receiving)",
                                [self.socat, "-u", f"TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr", "-"],
                            ),
                            ("btrfs receive", receive),
                        ]
                    )
                    wait_listening(port, [started[-2][1]], "socat")
                elif path == "ssh":
                    assert self.ref.sshd_proc is not None
                    sshd0 = proc_times(self.ref.sshd_proc.pid)
                t0 = time.perf_counter()
                if path == "direct":
                    piped([send, ("btrfs receive", receive)])
                elif path == "cat":
                    piped([send, ("cat", [self.cat]), ("btrfs receive", receive)])
                elif path == "repair":
                    piped(
                        [
                            send,
                            ("sendstream repair", [self.sendstream, "repair", "-q", "-", "-"]),
                            ("btrfs receive", receive),
                        ]
                    )
                elif path in ("tls none", TLS13):
                    tls = tls_args(path.split()[-1], self.ref.key)
                    piped(
                        [
                            send,
                            (
                                "sendstream send",
                                [self.sendstream, "send", "--to", f"127.0.0.1:{port}", "-q", *tls, "-"],
                            ),
                        ]
                    )
                elif path == "socat":
                    piped([send, ("socat (sending)", [self.socat, "-u", "-", f"TCP:127.0.0.1:{port}"])])
                else:
                    remote = shlex.join(receive) + (" > /dev/null" if sink == "dump" else "")
                    piped([send, ("ssh", self.ref.ssh_argv(remote))])
                usages = {name: reap_usage(proc) for name, proc in started}
                elapsed = time.perf_counter() - t0
            finally:
                for _, proc in started:
                    if proc.returncode is None:
                        proc.kill()
                        reap(proc, 5)
        check([(name, code) for name, (code, _) in usages.items()], [logs])
        cpu = {name: cpu_of(usage) for name, (_, usage) in usages.items()}
        rss = {name: usage.ru_maxrss / 1024 for name, (_, usage) in usages.items() if name.startswith("sendstream")}
        user, system = times.read_text().split()[-2:]
        received = float(user) + float(system)
        if path in ("tls none", TLS13):
            cpu["sendstream receive"] -= received  # its child's time is in its own
        if path == "ssh":
            assert self.ref.sshd_proc is not None
            pid = self.ref.sshd_proc.pid
            deadline = time.monotonic() + 10
            while has_children(pid) and time.monotonic() < deadline:
                time.sleep(0.005)
            own, children = proc_times(pid)
            cpu["sshd"] = (own - sshd0[0]) + (children - sshd0[1]) - received
        cpu["btrfs receive"] = received
        if sink == "receive":
            self.clear(tree)
        return Run(elapsed, cpu, rss)

    def clear(self, tree: str) -> None:
        """Check the received snapshot is complete (read-only), then delete it and wait for the cleaner."""
        got = self.dest / tree
        ro = subprocess.run([self.btrfs, "property", "get", "-ts", str(got), "ro"], capture_output=True, text=True)
        if ro.stdout.strip() != "ro=true":
            raise BenchError(f"{got}: not a complete received snapshot ({ro.stdout.strip()} {ro.stderr.strip()})")
        subprocess.run([self.btrfs, "-q", "subvolume", "delete", str(got)], check=True)
        subprocess.run([self.btrfs, "-q", "subvolume", "sync", str(self.dest)], check=True)
        subprocess.run(["sync"], check=True)


def measure(p: Pipelines, trees: list[str], paths: list[str], repeat: int) -> list[Row]:
    rows = [Row(tree, sink, path) for tree in trees for sink in ("receive", "dump") for path in paths]
    for tree in trees:  # not timed: the first receive into a fresh filesystem allocates its chunks
        p.run(tree, "receive", "direct")
    for round_ in range(repeat):
        for row in rows:
            run = p.run(row.tree, row.sink, row.path)
            row.runs.append(run)
            log(f"round {round_ + 1}: {row.tree} -> {row.sink} via {row.path}: {run.seconds:.2f} s")
    return rows


# --- latency -------------------------------------------------------------------


@contextlib.contextmanager
def running(*pipes: Pipeline) -> Iterator[None]:
    try:
        yield
    finally:
        for pipe in pipes:
            if pipe.proc.poll() is None:
                pipe.proc.kill()
            pipe.proc.wait(10)


def _written(outdir: pathlib.Path) -> int:
    """Bytes in the receiver's output file (the temporary file, or FILE.part) so far."""
    return sum(f.stat().st_size for f in outdir.iterdir() if not f.name.endswith(".resume"))


def _arrived(pipe: Pipeline) -> int:
    return len(pipe.out)


def latency_of(
    writer: Pipeline,
    output: Callable[[], int],
    first: int,
    cut: int,
    want: tuple[int, int],
) -> float:
    """Seconds from the write of ``[first, cut)`` after a pause to ``want[1]`` bytes of output."""
    data = SAMPLE.read_bytes()

    def wait(n: int) -> None:
        deadline = time.monotonic() + 10
        while output() < n:
            if time.monotonic() > deadline:
                raise BenchError(f"{output()} of {n} bytes came out in 10 s")
            time.sleep(0.0005)

    writer.write(data[:first])
    wait(want[0])
    time.sleep(0.3)  # the pause
    t0 = time.perf_counter()
    writer.write(data[first:cut])
    wait(want[1])
    return time.perf_counter() - t0


def latencies(tmp: pathlib.Path, repeat: int) -> dict[str, list[float]]:
    data = SAMPLE.read_bytes()
    cuts = [c for c in boundaries(data) if c > 16384]
    first, cut = cuts[0], cuts[len(cuts) // 2]
    key = key_file(tmp / "latency.key")
    found: dict[str, list[float]] = {}
    local = {
        "repair - -": ["repair", "-q", "-", "-"],
        "convert - -": ["convert", "-", "-"],
        "convert --to-version 1 - -": ["convert", "--to-version", "1", "-", "-"],
        "dump -": ["dump", "-"],
    }
    for label, args in local.items():
        want = (len(truncated(args, data[:first])), len(truncated(args, data[:cut])))
        for _ in range(repeat):
            pipe = Pipeline(args)
            with running(pipe):
                try:
                    found.setdefault(label, []).append(latency_of(pipe, partial(_arrived, pipe), first, cut, want))
                except BenchError as exc:
                    raise BenchError(f"{label}: {exc}") from None
    remote = {
        "send - -> receive -o - (tls none)": ("none", [], ["-o", "-"], False),
        "send - -> receive -o - (tls13)": (TLS13, [], ["-o", "-"], False),
        "send --resumable - -> receive -o - (tls13)": (TLS13, ["--resumable"], ["-o", "-"], False),
        "send - -> receive --exec cat (tls13)": (TLS13, [], ["--exec", "cat"], False),
        "send - -> relay -> receive -o - (tls13, both legs)": (TLS13, [], ["-o", "-"], True),
        "send - -> receive -o FILE (tls13)": (TLS13, [], ["-o", "FILE"], False),
        "send --resumable - -> receive -o FILE: FILE.part (tls13)": (TLS13, ["--resumable"], ["-o", "FILE"], False),
    }
    for label, (mode, send_extra, output, relay) in remote.items():
        for i in range(repeat):
            outdir = tmp / f"latency-{len(found)}-{i}"
            outdir.mkdir()
            out_args = [str(outdir / "snap.stream") if a == "FILE" else a for a in output]
            port = free_port()
            receiving = Pipeline(["receive", "--listen", f"127.0.0.1:{port}", "-q", *tls_args(mode, key), *out_args])
            pipes = [receiving]
            with running(*pipes):
                wait_listening(port, [receiving.proc], "sendstream receive")
                if relay:
                    relay_port = free_port()
                    legs = ["--listen-tls", mode, "--listen-key", str(key), "--to-tls", mode, "--to-key", str(key)]
                    pipes.append(
                        Pipeline(
                            ["relay", "--listen", f"127.0.0.1:{relay_port}", "--to", f"127.0.0.1:{port}", "-q", *legs]
                        )
                    )
                    wait_listening(relay_port, [pipes[-1].proc], "sendstream relay")
                    port = relay_port
                sending = Pipeline(["send", "--to", f"127.0.0.1:{port}", "-", "-q", *tls_args(mode, key), *send_extra])
                pipes.append(sending)
                with running(*pipes):
                    size = partial(_written, outdir) if "FILE" in output else partial(_arrived, receiving)
                    try:
                        found.setdefault(label, []).append(latency_of(sending, size, first, cut, (first, cut)))
                    except BenchError as exc:
                        raise BenchError(f"{label}: {exc}") from None
    return found


# --- report --------------------------------------------------------------------


def in_order(cpu: dict[str, float]) -> list[tuple[str, float]]:
    """The processes from the sender's end to the receiver's."""
    ends = {"btrfs send": 0, "btrfs receive": 2}
    return sorted(cpu.items(), key=lambda item: (ends.get(item[0], 1), "receiv" in item[0]))


def per_gib(seconds: float, size: int) -> float:
    return seconds / (size / GIB)


def report(rows: list[Row], sizes: dict[str, int], lat: dict[str, list[float]], repeat: int, took: float) -> str:
    out = [
        f"Pipeline benchmark, {datetime.date.today().isoformat()}, checkout {checkout()}, {cpu_model()}, "
        f"{os.cpu_count()} cores, kernel {os.uname().release}; best of {repeat}; run took {took / 60:.1f} min.",
        "",
    ]
    verdicts = []
    for tree in sorted({r.tree for r in rows}, key=list(TREES).index):
        size = sizes[tree]
        out += [f"**{tree}** (a stream of {size / 1e6:,.0f} MB)", ""]
        out += [
            "| path | into `btrfs receive` s | into `--dump` s | CPU s/GiB of each process (into `btrfs receive`) "
            "| sendstream's peak RSS, MB |"
        ]
        out += ["| --- | ---: | ---: | --- | ---: |"]
        best = {}
        for path in [p for p in PATHS if any(r.path == p for r in rows)]:
            recv = next(r for r in rows if (r.tree, r.sink, r.path) == (tree, "receive", path)).best
            dump = next(r for r in rows if (r.tree, r.sink, r.path) == (tree, "dump", path)).best
            best[path] = (recv, dump)
            cpu = ", ".join(f"{name} {per_gib(s, size):.2f}" for name, s in in_order(recv.cpu))
            runs = [run for r in rows if (r.tree, r.path) == (tree, path) for run in r.runs]
            peak = max((mb for run in runs for mb in run.rss.values()), default=None)  # of every run
            shown = "" if peak is None else f"{peak:.0f}"
            out.append(f"| ({LETTERS[path]}) {path} | {recv.seconds:.2f} | {dump.seconds:.2f} | {cpu} | {shown} |")
        out.append("")
        for sink, i in (("receive", 0), ("dump", 1)):
            if set(best) != set(PATHS):
                break  # a run of some paths only: no verdicts
            b, c, d, e, f, g = (best[p][i] for p in ("cat", "repair", "tls none", TLS13, "socat", "ssh"))
            ours = sum(s for n, s in e.cpu.items() if n.startswith("sendstream"))
            theirs = sum(s for n, s in g.cpu.items() if n in ("ssh", "sshd"))
            verdicts += [
                f"- {tree}, into {sink}: (c)/(b) = {c.seconds / b.seconds:.3f} (target <= 1.10); "
                f"(d)/(f) = {d.seconds / f.seconds:.3f} (target <= 1.10); (e)/(g) = {e.seconds / g.seconds:.3f} "
                f"(target < 1); CPU s/GiB sendstream (e) {per_gib(ours, size):.2f} against ssh+sshd (g) "
                f"{per_gib(theirs, size):.2f}",
            ]
    if rows:
        out += ["Against the targets:", "", *verdicts, ""]
    if lat:
        out += ["First output after the writer's pause (ms):", "", "| path | median | max |", "| --- | ---: | ---: |"]
        for label, values in lat.items():
            mark = "" if max(values) < LATENCY_TARGET else " (over 100 ms)"
            out.append(f"| {label} | {statistics.median(values) * 1000:.1f} | {max(values) * 1000:.1f}{mark} |")
        out.append("")
    return "\n".join(out)


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=3, help="runs of each pipeline (the best counts)")
    ap.add_argument("--trees", default=",".join(TREES), help="which trees to send (comma-separated)")
    ap.add_argument("--paths", default=",".join(PATHS), help="which paths to measure (comma-separated)")
    ap.add_argument("--latency-repeat", type=int, default=5, help="runs of each latency path")
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--skip-latency", action="store_true", help="only the btrfs pipelines")
    only.add_argument("--latency-only", action="store_true", help="only the latencies (no root needed)")
    return ap.parse_args(argv)


def throughput(tmp: pathlib.Path, trees: list[str], paths: list[str], repeat: int) -> tuple[list[Row], dict[str, int]]:
    PACKAGES.update(PACKAGES_HERE)
    ensure_tools()
    with btrfs_loop("6G", mount_opts="noatime") as source, btrfs_loop("4G", mount_opts="noatime") as dest:
        p = Pipelines(tmp, source, dest)
        p.ref.start_sshd()
        try:
            p.make_trees(trees)
            return measure(p, trees, paths, repeat), p.size
        finally:
            p.ref.stop_sshd()


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    trees = [t for t in args.trees.split(",") if t]
    paths = [p for p in PATHS if p in args.paths.split(",")]
    if unknown := (set(trees) - set(TREES)) | (set(args.paths.split(",")) - set(PATHS)):
        print(f"bench_pipeline: unknown tree or path {', '.join(sorted(unknown))}", file=sys.stderr)
        return 1
    if not args.latency_only and (why := require_btrfs()):
        print(f"bench_pipeline: needs a loop-device btrfs: {why}", file=sys.stderr)
        return 1
    began = time.monotonic()
    rows: list[Row] = []
    sizes: dict[str, int] = {}
    try:
        with tempfile.TemporaryDirectory(prefix="sendstream-pipeline-") as name:
            tmp = pathlib.Path(name)
            if not args.latency_only:
                rows, sizes = throughput(tmp, trees, paths, args.repeat)
            lat = {} if args.skip_latency else latencies(tmp, args.latency_repeat)
    except (BenchError, subprocess.CalledProcessError) as exc:
        print(f"bench_pipeline: {exc}", file=sys.stderr)
        return 1
    print(report(rows, sizes, lat, args.repeat, time.monotonic() - began))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
