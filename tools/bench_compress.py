#!/usr/bin/env python3
"""Benchmark ``send --compress zstd`` against ``ssh -C`` and ``zstd | socat | zstd -d`` on a compressible real stream.

Usage: ``python3 tools/bench_compress.py [--repeat N] [--level L]`` (as root; needs btrfs, loop devices,
ssh/sshd, socat, zstd; missing Debian packages are installed).

The stream: ``btrfs send`` of a read-only snapshot holding copies of ``/usr/include``,
``/usr/share/doc`` and ``/usr/lib/python3*`` (real headers, documents, sources and byte code) on a
loop-device btrfs. It is sent over loopback into ``/dev/null`` on the other side, through:

- (a) ``sendstream send --compress zstd:L`` (tls13-aes128-gcm) -> ``sendstream receive -o /dev/null``;
- (b) the same without ``--compress`` (what compression costs and saves);
- (c) ``ssh -C -c aes128-gcm@openssh.com ... 'cat > /dev/null'`` (zlib, a private sshd);
- (d) ``zstd -L -c | socat -u - TCP:...`` -> ``socat -u TCP-LISTEN:... - | zstd -d > /dev/null`` (no encryption).

Rounds are interleaved; best wall time of ``--repeat``; CPU seconds of every process of a path
(``os.wait4``; sshd's share is the growth of its reaped children's times). Bytes on the wire are what
each compressor put out: sendstream's summary, ssh's own count (``-v``: ``compress outgoing``), and
``zstd -c | wc -c``; none counts the encryption's overhead. Progress goes to stderr, the report
(markdown) to stdout. Exits 1 on failure.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial
from typing import Any

TOOLS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parent))  # this checkout, before an installed sendstream
sys.path.insert(0, str(TOOLS))
sys.path.insert(0, str(TOOLS.parent / "tests"))
from bench_transport import (  # noqa: E402
    PACKAGES,
    Bench,
    BenchError,
    check,
    checkout,
    cpu_model,
    find_exe,
    free_port,
    has_children,
    log,
    proc_times,
    reap,
    wait_listening,
)
from support.loopfs import btrfs_loop, require_btrfs  # noqa: E402

SOURCES = ["/usr/include", "/usr/share/doc", *sorted(glob.glob("/usr/lib/python3*"))]
PATHS = {"a": "sendstream --compress", "b": "sendstream", "c": "ssh -C", "d": "zstd | socat | zstd -d"}
MODE = "tls13-aes128-gcm"
_WIRE = re.compile(r"zstd:\d+ \S+ \([^,]+, ([0-9,]+) bytes on the wire\)")
_SSH = re.compile(r"compress outgoing: raw data (\d+), compressed (\d+)")


def make_stream(tmp: pathlib.Path) -> pathlib.Path:
    """A real ``btrfs send`` of the copied trees, as a file."""
    stream = tmp / "compressible.stream"
    btrfs = find_exe("btrfs")
    with btrfs_loop("4G") as mnt:
        work = mnt / "work"
        subprocess.run([btrfs, "-q", "subvolume", "create", str(work)], check=True)
        for source in SOURCES:
            if os.path.isdir(source):
                log(f"copying {source} ...")
                subprocess.run(["cp", "-a", source, str(work / source.strip("/").replace("/", "_"))], check=True)
        subprocess.run([btrfs, "-q", "subvolume", "snapshot", "-r", str(work), str(mnt / "snap")], check=True)
        subprocess.run(["sync"], check=True)
        subprocess.run([btrfs, "send", "-q", "-f", str(stream), str(mnt / "snap")], check=True)
    log(f"a stream of {stream.stat().st_size:,} bytes")
    return stream


def timed_pair(
    start: Callable[[], subprocess.Popen[Any]], receiver: subprocess.Popen[bytes]
) -> tuple[float, tuple[int, float], tuple[int, float]]:
    """Start the sender, wait for it and for ``receiver``: the wall seconds, and each one's exit code and CPU."""
    t0 = time.perf_counter()
    sent = reap(start())
    received = reap(receiver)
    return time.perf_counter() - t0, sent, received


def stop_receiver(receiver: subprocess.Popen[bytes]) -> None:
    if receiver.returncode is None:
        receiver.kill()
        reap(receiver, 5)


class Paths:
    def __init__(self, tmp: pathlib.Path, stream: pathlib.Path, level: int) -> None:
        self.tmp, self.stream, self.level = tmp, stream, level
        self.ref = Bench(tmp, stream)  # sshd, ssh's command line, the key file
        self.zstd = find_exe("zstd")

    def sendstream(self, compress: bool) -> tuple[float, float, int]:
        """Wall seconds, CPU seconds, bytes on the wire (the stream's size without compression)."""
        port = free_port()
        tls = ["--tls", MODE, "--key", str(self.ref.key)]
        logs = [self.tmp / "receive.log", self.tmp / "send.log"]
        recv_argv = [self.ref.sendstream, "receive", "--listen", f"127.0.0.1:{port}", "-o", "/dev/null", *tls]
        with open(logs[0], "wb") as rl:
            recv = subprocess.Popen(recv_argv, stdin=subprocess.DEVNULL, stderr=rl, env=self.ref.env)
        try:
            wait_listening(port, [recv], "sendstream receive")
            extra = ["--compress", f"zstd:{self.level}"] if compress else []
            argv = [self.ref.sendstream, "send", "--to", f"127.0.0.1:{port}", str(self.stream), *tls, *extra]
            with open(logs[1], "wb") as sl:
                send = partial(subprocess.Popen, argv, stdin=subprocess.DEVNULL, stderr=sl, env=self.ref.env)
                elapsed, (send_code, send_cpu), (recv_code, recv_cpu) = timed_pair(send, recv)
        finally:
            stop_receiver(recv)
        check([("sendstream send", send_code), ("sendstream receive", recv_code)], logs)
        wire = self.stream.stat().st_size
        if compress:
            match = _WIRE.search(logs[1].read_text(errors="replace"))
            if match is None:
                raise BenchError(f"no bytes on the wire in the summary:\n{logs[1].read_text()[-2000:]}")
            wire = int(match.group(1).replace(",", ""))
        return elapsed, send_cpu + recv_cpu, wire

    def ssh(self) -> tuple[float, float, int]:
        assert self.ref.sshd_proc is not None
        argv = self.ref.ssh_argv("cat > /dev/null")
        argv = [
            a.replace("Compression=no", "Compression=yes").replace("LogLevel=ERROR", "LogLevel=DEBUG1") for a in argv
        ]
        pid = self.ref.sshd_proc.pid
        own0, children0 = proc_times(pid)
        ssh_log = self.tmp / "ssh.log"
        with open(self.stream, "rb") as source, open(ssh_log, "wb") as sl:
            t0 = time.perf_counter()
            ssh = subprocess.Popen(argv, stdin=source, stdout=subprocess.DEVNULL, stderr=sl)
            code, cpu = reap(ssh)
            elapsed = time.perf_counter() - t0
        deadline = time.monotonic() + 10
        while has_children(pid) and time.monotonic() < deadline:
            time.sleep(0.005)
        own1, children1 = proc_times(pid)
        check([("ssh -C", code)], [ssh_log])
        match = _SSH.search(ssh_log.read_text(errors="replace"))
        if match is None or int(match.group(1)) < self.stream.stat().st_size:
            raise BenchError(f"ssh -C did not report compressing the stream:\n{ssh_log.read_text()[-2000:]}")
        return elapsed, cpu + (own1 - own0) + (children1 - children0), int(match.group(2))

    def zstd_socat(self) -> tuple[float, float, int]:
        port = free_port()
        socat = self.ref.socat
        receiver = f"{socat} -u TCP-LISTEN:{port},bind=127.0.0.1,reuseaddr - | {self.zstd} -q -d > /dev/null"
        recv = subprocess.Popen(["/bin/sh", "-c", receiver], stdin=subprocess.DEVNULL)
        try:
            wait_listening(port, [recv], "socat")
            sender = f"{self.zstd} -q -{self.level} -c < {self.stream} | {socat} -u - TCP:127.0.0.1:{port}"
            send = partial(subprocess.Popen, ["/bin/sh", "-c", sender], stdin=subprocess.DEVNULL)
            # a shell's usage includes its reaped children's
            elapsed, (send_code, send_cpu), (recv_code, recv_cpu) = timed_pair(send, recv)
        finally:
            stop_receiver(recv)
        check([("zstd | socat", send_code), ("socat | zstd -d", recv_code)])
        sized = subprocess.run(
            f"{self.zstd} -q -{self.level} -c < {self.stream} | wc -c",
            shell=True,
            check=True,
            capture_output=True,
            text=True,
        )
        return elapsed, send_cpu + recv_cpu, int(sized.stdout)


def report(results: dict[str, list[tuple[float, float, int]]], size: int, level: int, repeat: int, took: float) -> str:
    best = {k: min(v) for k, v in results.items()}
    ssh = best["c"][0]
    lines = [
        f"`tools/bench_compress.py --repeat {repeat} --level {level}`, {datetime.date.today()}, {checkout()}, "
        f"{cpu_model()}, {os.cpu_count()} cores; a real `btrfs send` of copies of "
        f"{', '.join(s for s in SOURCES if os.path.isdir(s))}: {size:,} bytes; loopback; best of {repeat} "
        f"({took:.0f} s in all)",
        "",
        "| path | wall s | MiB/s of stream | / ssh -C wall | CPU s | bytes on the wire | ratio |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key, label in PATHS.items():
        wall, cpu, wire = best[key]
        shown = label.replace("|", "\\|")  # a pipe would end the table's cell
        lines.append(
            f"| ({key}) {shown} | {wall:.2f} | {size / wall / 2**20:.0f} | {wall / ssh:.2f} | {cpu:.2f} | "
            f"{wire:,} | {size / wire:.2f} |"
        )
    a, c = best["a"], best["c"]
    lines += [
        "",
        f"Targets: (a) at least as fast as (c): {a[0] / c[0]:.2f} of its wall time (< 1 met: {a[0] <= c[0]}); "
        f"smaller on the wire than (c): {a[2] / c[2]:.2f} of its bytes (< 1 met: {a[2] < c[2]}).",
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds (best of), at least 1")
    parser.add_argument("--level", type=int, default=3, help="the zstd level of (a) and (d), 1-19")
    args = parser.parse_args(argv)
    if args.repeat < 1 or not 1 <= args.level <= 19:
        parser.error("--repeat is at least 1 and --level 1 to 19")
    if os.geteuid() != 0 or (why := require_btrfs()) is not None:
        print(f"bench_compress: needs root and a btrfs ({'not root' if os.geteuid() else why})", file=sys.stderr)
        return 1
    started = time.monotonic()
    missing = [
        pkg
        for exe, pkg in {**PACKAGES, "zstd": "zstd"}.items()
        if shutil.which(exe) is None and not os.path.exists(f"/usr/sbin/{exe}")
    ]
    if missing:
        subprocess.run(["apt-get", "install", "-y", "-q", *missing], check=True, stdout=sys.stderr)
    try:
        with tempfile.TemporaryDirectory(prefix="bench-compress-", dir="/var/tmp") as d:
            tmp = pathlib.Path(d)
            stream = make_stream(tmp)
            paths = Paths(tmp, stream, args.level)
            paths.ref.start_sshd()
            try:
                results: dict[str, list[tuple[float, float, int]]] = {k: [] for k in PATHS}
                runs = {
                    "a": lambda: paths.sendstream(True),
                    "b": lambda: paths.sendstream(False),
                    "c": paths.ssh,
                    "d": paths.zstd_socat,
                }
                for round_ in range(args.repeat):
                    for key, run in runs.items():
                        results[key].append(run())
                        log(f"round {round_ + 1} ({key}) {PATHS[key]}: {results[key][-1][0]:.2f} s")
            finally:
                paths.ref.stop_sshd()
            print(report(results, stream.stat().st_size, args.level, args.repeat, time.monotonic() - started))
    except (BenchError, subprocess.CalledProcessError, OSError) as exc:
        print(f"bench_compress: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
