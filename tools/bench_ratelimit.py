#!/usr/bin/env python3
"""Benchmark ``sendstream send --rate-limit``: how evenly the bytes arrive, over every 2 s window.

Usage: ``python3 tools/bench_ratelimit.py [--stream FILE] [--rate RATE ...] [--seconds S]``

For each rate, ``sendstream send --tls none --no-status --rate-limit RATE`` sends
the stream (or its first ``rate x seconds`` bytes, so every run lasts about
``--seconds``) to a TCP receiver in this script, which notes when each
``recv`` returned and how much. Every window of 2 s from the first byte to the
last, at 10 ms steps, is then compared with the rate asked: the report gives
the largest deviation in either direction (the target is within 5%), and the
average rate over the whole transfer. The reference is the rate asked, in the
same run. Standard library only; needs no root.
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_STREAM = pathlib.Path("/var/tmp/sendstream-bench/bigwrite.stream")
WINDOW = 2.0
STEP = 0.01
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def parse_rate(text: str) -> int:
    unit = text[-1:].lower() if text[-1:].isalpha() else ""
    return int(float(text[: len(text) - len(unit)]) * UNITS[unit])


def receive_all(server: socket.socket, marks: list[tuple[float, int]]) -> None:
    """Accept one connection and note (time, bytes so far) after every recv, until it ends."""
    conn, _ = server.accept()
    total = 0
    buf = bytearray(1 << 20)
    with conn:
        while n := conn.recv_into(buf):
            total += n
            marks.append((time.monotonic(), total))


def windows(marks: list[tuple[float, int]], rate: float) -> tuple[float, float, int]:
    """The lowest and highest rate over any window of WINDOW seconds, as fractions of ``rate``, and
    how many windows."""
    times = [t for t, _ in marks]
    sizes = [n for _, n in marks]

    def at(t: float) -> int:  # bytes received by time t
        i = bisect.bisect_right(times, t) - 1
        return sizes[i] if i >= 0 else 0

    low, high, count = float("inf"), 0.0, 0
    start = times[0]
    while start + WINDOW <= times[-1]:
        got = (at(start + WINDOW) - at(start)) / WINDOW / rate
        low, high, count = min(low, got), max(high, got), count + 1
        start += STEP
    return low, high, count


def run(stream: pathlib.Path, rate: int, seconds: float) -> tuple[float, float, int, float, int]:
    size = min(stream.stat().st_size, int(rate * seconds))
    with tempfile.TemporaryDirectory() as tmp:
        part = pathlib.Path(tmp) / "part.stream"
        with stream.open("rb") as src, part.open("wb") as dst:
            dst.write(src.read(size))  # a prefix: send checks commands, so it ends with a truncation error
        server = socket.create_server(("127.0.0.1", 0))
        port = server.getsockname()[1]
        marks: list[tuple[float, int]] = []
        receiver = threading.Thread(target=receive_all, args=(server, marks))
        receiver.start()
        cmd = [sys.executable, "-m", "sendstream", "send", "--to", f"127.0.0.1:{port}", "--tls", "none"]
        cmd += ["--no-status", "-q", "--rate-limit", str(rate), str(part)]
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        subprocess.run(cmd, env=env, stderr=subprocess.DEVNULL, check=False)
        receiver.join()
        server.close()
    low, high, count = windows(marks, rate)
    elapsed = marks[-1][0] - marks[0][0]
    return low, high, count, marks[-1][1] / elapsed / rate, marks[-1][1]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--stream", type=pathlib.Path, default=DEFAULT_STREAM, help=f"default {DEFAULT_STREAM}")
    p.add_argument("--rate", nargs="+", default=["2M", "20M", "200M"], help="rates, bytes/s (K, M, G: 1024s)")
    p.add_argument("--seconds", type=float, default=10.0, help="about how long each run lasts")
    args = p.parse_args(argv)
    if not args.stream.exists():
        print(f"bench_ratelimit: no stream {args.stream}: make it with tools/make_bench_streams.py", file=sys.stderr)
        return 1
    print(f"Rate-limit benchmark, {datetime.date.today()}, {os.cpu_count()} cores; windows of {WINDOW:g} s")
    print(f"every {STEP * 1000:g} ms; stream {args.stream.name}.\n")
    print("| --rate-limit | bytes | windows | lowest / rate | highest / rate | average / rate | within 5% |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    ok = True
    for text in args.rate:
        rate = parse_rate(text)
        low, high, count, average, total = run(args.stream, rate, args.seconds)
        within = low >= 0.95 and high <= 1.05
        ok &= within
        print(
            f"| {text} | {total:,} | {count} | {low:.3f} | {high:.3f} | {average:.3f} | {'yes' if within else 'no'} |"
        )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
