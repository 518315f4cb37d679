#!/usr/bin/env python3
"""Benchmark ``sendstream serve``: one sender against four at once, with and without hostile clients, and
the service's memory over many sequential transfers.

Usage: ``python3 tools/bench_serve.py [--repeat N] [--sequential N]`` (as root for the cached streams).

The stream is ``bigwrite.stream`` of ``tools/bench.py`` (a real ``btrfs send`` of 1.06 GiB, cached in
``/var/tmp/sendstream-bench``). Each client stores into its own place on a tmpfs (``/dev/shm``), so
the disk is not what is measured; TLS is ``tls13-aes128-gcm``. Rounds:

- (1) one ``sendstream send`` of the stream;
- (4) four at once, each a client of its own;
- (4+h) the same while hostile clients knock: one with a wrong key, one sending garbage, one silent,
  over and over;
- (4p) four at once, each to a service of its own: the same work in four processes instead of four
  threads of one, to tell what two cores shared by everything cost from what the threads cost.

Per round: wall time from the first start to the last end, aggregate throughput, CPU seconds of the
service (``/proc/PID/stat``, its threads included) and of the senders (``os.wait4``), all per GiB of
stream received, and the service's peak RSS (``VmHWM``). Then ``--sequential`` small transfers one
after another (the library's sender, in this process) and the service's RSS after the first tenth and
at the end. The target: (4) >= 0.9x the throughput of (1), and the service's CPU per GiB with four
<= 1.1x its CPU per GiB with one. Report (markdown) on stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import pathlib
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator

TOOLS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parent))
sys.path.insert(0, str(TOOLS))
sys.path.insert(0, str(TOOLS.parent / "tests"))
from bench import DEFAULT_DIR, ensure_streams  # noqa: E402
from bench_transport import (  # noqa: E402
    BenchError,
    bench_env,
    checkout,
    cpu_model,
    free_port,
    log,
    proc_times,
    reap,
    wait_listening,
)

from sendstream.endpoints.sending import connector, send  # noqa: E402
from sendstream.transfer.progress import NONE, Progress  # noqa: E402
from sendstream.transport.address import Address, Dialing, TlsSettings  # noqa: E402

GIB = 1 << 30
MODE = "tls13-aes128-gcm"
CLIENTS = [f"host{i}" for i in range(4)]
SMALL = TOOLS.parent / "fixtures" / "rich-incr-v2.stream"


class Service:
    def __init__(self, tmp: pathlib.Path, places: pathlib.Path) -> None:
        self.tmp, self.places = tmp, places
        self.port = free_port()
        self.sendstream = shutil.which("sendstream") or sys.exit("bench_serve: no sendstream command")
        text = f'listen = "127.0.0.1:{self.port}"\nmax_transfers = 16\nmax_per_client = 4\nhandshake_timeout = 5\n'
        for name in [*CLIENTS, "small"]:
            key = tmp / f"{name}.key"
            key.write_bytes(os.urandom(32))
            key.chmod(0o600)
            (places / name).mkdir()
            text += f'[clients.{name}]\nkey = "{key}"\nstore = "{places / name}"\n'
        self.config = tmp / "serve.toml"
        self.config.write_text(text)
        self.proc: subprocess.Popen[bytes] | None = None
        self.env = bench_env()  # this checkout's package, whatever sendstream is installed

    @contextlib.contextmanager
    def running(self) -> Iterator[subprocess.Popen[bytes]]:
        with open(self.tmp / "serve.log", "wb") as out:
            argv = [self.sendstream, "serve", "--config", str(self.config)]
            self.proc = subprocess.Popen(argv, stderr=out, env=self.env)
        try:
            try:
                wait_listening(self.port, [self.proc], "sendstream serve")
            except BenchError as exc:
                raise BenchError(f"{exc}: {(self.tmp / 'serve.log').read_text()[-2000:]}") from None
            yield self.proc
        finally:
            if self.proc.returncode is None:
                self.proc.terminate()
                reap(self.proc, 60)

    def status(self, field: str) -> int:
        assert self.proc is not None
        for line in pathlib.Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        return 0

    def sender(self, client: str, stream: pathlib.Path) -> subprocess.Popen[bytes]:
        argv = [self.sendstream, "send", "--to", f"127.0.0.1:{self.port}", str(stream), "--tls", MODE]
        argv += ["--key", str(self.tmp / f"{client}.key"), "--identity", client, "--progress", "none", "-q"]
        return subprocess.Popen(argv, stdin=subprocess.DEVNULL, env=self.env)

    def clear(self) -> None:
        for place in self.places.iterdir():
            for f in place.iterdir():
                f.unlink()


def knock(port: int, key: pathlib.Path, stop: threading.Event) -> None:
    """Hostile clients, over and over, until ``stop``: a wrong key, garbage, silence."""
    wrong = ["send", "--to", f"127.0.0.1:{port}", str(SMALL), "--tls", MODE, "--key", str(key), "--identity", "host0"]
    while not stop.is_set():
        subprocess.run([shutil.which("sendstream") or "sendstream", *wrong, "-q"], capture_output=True, env=bench_env())
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(os.urandom(1 << 16))
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port)):
            stop.wait(0.5)


def round_(services: list[Service], stream: pathlib.Path, senders: int, hostile: bool) -> dict[str, float]:
    """One round: sender i (client i) to ``services[i % len(services)]``, hostile clients knocking on the
    first when ``hostile``; the CPU of every service added up."""
    for service in services:
        service.clear()

    def services_cpu() -> float:
        return sum(sum(proc_times(s.proc.pid)) for s in services if s.proc is not None)

    own0 = services_cpu()
    stop = threading.Event()
    knocker = None
    if hostile:
        bad_key = services[0].tmp / "wrong.key"
        bad_key.write_bytes(os.urandom(32))
        bad_key.chmod(0o600)
        knocker = threading.Thread(target=knock, args=(services[0].port, bad_key, stop))
        knocker.start()
        time.sleep(1.0)
    t0 = time.perf_counter()
    procs = [services[i % len(services)].sender(client, stream) for i, client in enumerate(CLIENTS[:senders])]
    results = [reap(p, 900) for p in procs]
    wall = time.perf_counter() - t0
    stop.set()
    if knocker is not None:
        knocker.join(30)
    if any(code for code, _ in results):
        logs = ", ".join(str(s.tmp / "serve.log") for s in services)
        raise BenchError(f"a sender failed: {[code for code, _ in results]}; see {logs}")
    gib = senders * stream.stat().st_size / GIB
    return {
        "wall": wall,
        "mib_s": gib * 1024 / wall,
        "service_cpu_gib": (services_cpu() - own0) / gib,
        "senders_cpu_gib": sum(cpu for _, cpu in results) / gib,
        "hwm_mb": max(s.status("VmHWM") for s in services) / 1e6,
    }


def sequential(service: Service, n: int) -> tuple[float, float]:
    """The service's RSS (MB) after the first tenth of ``n`` small transfers, and after all."""
    settings = TlsSettings(MODE, (service.tmp / "small.key").read_bytes(), "small")
    connect = connector(Dialing(Address("127.0.0.1", service.port), settings))
    early = 0.0
    for i in range(n):
        with open(SMALL, "rb") as source:
            send(source, connect, Progress("sent", mode=NONE))
        if i + 1 == max(n // 10, 1):
            early = service.status("VmRSS") / 1e6
    return early, service.status("VmRSS") / 1e6


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=2, help="rounds of each kind (best of), at least 1")
    parser.add_argument("--sequential", type=int, default=1000, help="small transfers one after another")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.sequential < 10:
        parser.error("--repeat is at least 1 and --sequential at least 10")
    started = time.monotonic()
    try:
        ensure_streams(DEFAULT_DIR)
        stream = DEFAULT_DIR / "bigwrite.stream"
        with (
            tempfile.TemporaryDirectory(prefix="bench-serve-") as d,
            tempfile.TemporaryDirectory(prefix="bench-serve-", dir="/dev/shm") as shm,
        ):
            homes = [(pathlib.Path(d) / f"s{i}", pathlib.Path(shm) / f"s{i}") for i in range(len(CLIENTS) + 1)]
            for tmp, places in homes:
                tmp.mkdir()
                places.mkdir()
            service, *split = (Service(tmp, places) for tmp, places in homes)
            with contextlib.ExitStack() as running:
                for s in (service, *split):
                    running.enter_context(s.running())
                rows: dict[str, list[dict[str, float]]] = {"1": [], "4": [], "4+h": [], "4p": []}
                for r in range(args.repeat):
                    for label, senders, hostile in (("1", 1, False), ("4", 4, False), ("4+h", 4, True)):
                        rows[label].append(round_([service], stream, senders, hostile))
                        log(f"round {r + 1} ({label}): {rows[label][-1]['mib_s']:.0f} MiB/s")
                    rows["4p"].append(round_(split, stream, len(split), False))
                    log(f"round {r + 1} (4p): {rows['4p'][-1]['mib_s']:.0f} MiB/s")
                service.clear()
                early, late = sequential(service, args.sequential)
    except (BenchError, OSError, subprocess.CalledProcessError) as exc:
        print(f"bench_serve: {exc}", file=sys.stderr)
        return 1
    best = {k: max(v, key=lambda row: row["mib_s"]) for k, v in rows.items()}
    size = stream.stat().st_size
    lines = [
        f"`tools/bench_serve.py --repeat {args.repeat} --sequential {args.sequential}`, {datetime.date.today()}, "
        f"{checkout()}, {cpu_model()}, {os.cpu_count()} cores; bigwrite.stream ({size:,} bytes) per sender, "
        f"{MODE} (user space: no kTLS here), stored on tmpfs; best of {args.repeat} "
        f"({time.monotonic() - started:.0f} s in all)",
        "",
        "| senders | wall s | MiB/s, all | / one sender | service CPU s/GiB | / one sender | senders' CPU s/GiB "
        "| service peak RSS MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    one = best["1"]
    for label, row in best.items():
        name = {
            "1": "1",
            "4": "4 at once",
            "4+h": "4 at once, hostile clients knocking",
            "4p": "4 at once, each to a service of its own (4 processes)",
        }[label]
        lines.append(
            f"| {name} | {row['wall']:.2f} | {row['mib_s']:.0f} | {row['mib_s'] / one['mib_s']:.2f} | "
            f"{row['service_cpu_gib']:.2f} | {row['service_cpu_gib'] / one['service_cpu_gib']:.2f} | "
            f"{row['senders_cpu_gib']:.2f} | {row['hwm_mb']:.0f} |"
        )
    four = best["4"]
    speed, cpu = four["mib_s"] / one["mib_s"], four["service_cpu_gib"] / one["service_cpu_gib"]
    apart = best["4p"]["service_cpu_gib"] / one["service_cpu_gib"]
    lines += [
        "",
        f"Targets: 4 at once {speed:.2f}x the throughput of one (>= 0.9: {speed >= 0.9}); the service's CPU "
        f"per GiB {cpu:.2f}x (<= 1.1: {cpu <= 1.1}); four services' CPU per GiB, one transfer each, "
        f"{apart:.2f}x. "
        f"{args.sequential} sequential transfers: service RSS {early:.1f} MB after {max(args.sequential // 10, 1)}, "
        f"{late:.1f} MB after all ({late - early:+.1f} MB).",
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
