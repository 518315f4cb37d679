#!/usr/bin/env python3
"""Make (and cache) two large real send streams for benchmarks, outside the repo.

Usage: ``python3 tools/make_bench_streams.py [DIR] [--force]``
(default DIR: /var/tmp/sendstream-bench).  Needs root, btrfs and loop devices.

- ``bigwrite.stream``: >= 1 GiB, ``btrfs send --proto 2`` (no compressed data)
  of a few large files of random data: mostly 128 KiB WRITE commands.
- ``metadata.stream``: >= 500,000 commands, ``btrfs send --proto 1`` of ~100k
  tiny files, empty files, symlinks, hard links and directories.

Each stream gets a ``NAME.json`` sidecar (size, command counts, command used).
A stream is reused when it and its sidecar exist, the sizes agree and the file
is framed as a complete stream (header first, END last); ``--force`` rebuilds.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent / "tests"))
from make_fixtures import summarize_path
from support.loopfs import btrfs_loop, require_btrfs

from sendstream import Command, Decoder, StreamHeader, encode_command
from sendstream.codec.backend import default as default_backend
from sendstream.errors import FormatError
from sendstream.format.layout import STREAM_HEADER_SIZE

GiB = 1024**3
MiB = 1024**2
DEFAULT_DIR = pathlib.Path("/var/tmp/sendstream-bench")

BIG_FILES = 4
BIG_FILE_SIZE = 272 * MiB  # 4 x 272 MiB = 1088 MiB of data > 1 GiB of stream
BIG_MIN_SIZE = GiB
META_MIN_COMMANDS = 500_000


def log(msg: str) -> None:
    print(msg, flush=True)


class Timer:
    """Context manager printing how long a phase took."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.elapsed = 0.0

    def __enter__(self) -> Timer:
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed = time.monotonic() - self.t0
        log(f"  {self.label}: {self.elapsed:.1f} s")


def run(cmd: list[str], cwd: pathlib.Path | None = None) -> None:
    proc = subprocess.run(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if proc.returncode != 0:
        raise SystemExit(
            f"command failed (exit {proc.returncode}): {' '.join(cmd)}\n{proc.stderr.decode(errors='replace')}"
        )


def populate_bigwrite(root: pathlib.Path) -> None:
    """A few large files of random data."""
    chunk = 16 * MiB
    for i in range(BIG_FILES):
        with open(root / f"random-{i}.bin", "wb") as f:
            left = BIG_FILE_SIZE
            while left:
                n = min(chunk, left)
                f.write(os.urandom(n))
                left -= n
    # A little tail so the stream is not only full-size writes.
    (root / "small.txt").write_bytes(b"tail file\n")
    with open(root / "sparse-tail.bin", "wb") as f:
        f.truncate(3 * MiB + 123)


def populate_metadata(root: pathlib.Path) -> None:
    """~100k tiny files, 5k empty files, 20k symlinks, 10k hard links, ~1.5k dirs."""
    r = os.fsencode(root)
    j = os.path.join
    ndirs, per_dir = 200, 500  # 100,000 files with a few bytes
    for d in range(ndirs):
        dp = j(r, b"d%03d" % d)
        os.mkdir(dp)
        for k in range(per_dir):
            fd = os.open(j(dp, b"f%04d.txt" % k), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            os.write(fd, b"%d/%d\n" % (d, k))
            os.close(fd)
        for k in range(25):  # 5,000 empty files
            os.close(os.open(j(dp, b"empty%02d" % k), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
        sl = j(dp, b"links")
        os.mkdir(sl)
        for k in range(100):  # 20,000 symlinks
            os.symlink(b"../f%04d.txt" % k, j(sl, b"s%03d" % k))
        for k in range(50):  # 10,000 hard links
            os.link(j(dp, b"f%04d.txt" % k), j(sl, b"h%03d" % k))
        sub = dp
        for k in range(6):  # 1,200 nested subdirectories
            sub = j(sub, b"sub%d" % k)
            os.mkdir(sub)
        os.close(os.open(j(sub, b"leaf"), os.O_WRONLY | os.O_CREAT, 0o644))


BENCHES: dict[str, dict[str, Any]] = {
    "bigwrite": {
        "fs_size": "3G",
        "send_args": ["--proto", "2"],
        "populate": populate_bigwrite,
        "check": lambda size, cmds: size >= BIG_MIN_SIZE,
        "want": f">= {BIG_MIN_SIZE} bytes",
    },
    "metadata": {
        "fs_size": "2G",
        "send_args": ["--proto", "1"],
        "populate": populate_metadata,
        "check": lambda size, cmds: cmds >= META_MIN_COMMANDS,
        "want": f">= {META_MIN_COMMANDS} commands",
    },
}


# END has no attributes, so its bytes are the same in every stream version.
END_COMMAND = encode_command(Command.build("end"), 1)


def framed_ok(path: pathlib.Path) -> bool:
    """Cheap validity check: a stream header the decoder accepts first, an END command last."""
    try:
        with open(path, "rb") as f:
            decoder = Decoder()
            decoder.receive_data(f.read(STREAM_HEADER_SIZE))
            if not isinstance(decoder.next_event(), StreamHeader):
                return False
            f.seek(-len(END_COMMAND), os.SEEK_END)
            return f.read() == END_COMMAND
    except (OSError, FormatError):
        return False


def cached(outdir: pathlib.Path, name: str) -> dict[str, Any] | None:
    """The sidecar of a valid cached stream, or None."""
    stream, meta = outdir / f"{name}.stream", outdir / f"{name}.json"
    try:
        info: dict[str, Any] = json.loads(meta.read_text())
        size = stream.stat().st_size
    except (OSError, ValueError):
        return None
    if info.get("size") != size or not framed_ok(stream):
        return None
    if not BENCHES[name]["check"](size, info.get("commands", 0)):
        return None
    return info


def count_dump_lines(stream: pathlib.Path) -> int:
    """Lines printed by ``btrfs receive --dump`` (one per command except END)."""
    with open(stream, "rb") as f:
        proc = subprocess.Popen(
            ["btrfs", "receive", "--dump"],
            stdin=f,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=dict(os.environ, TZ="UTC"),
        )
        assert proc.stdout is not None
        lines = 0
        while buf := proc.stdout.read(1 << 20):
            lines += buf.count(b"\n")
        err = proc.stderr.read() if proc.stderr else b""
        if proc.wait() != 0:
            raise SystemExit(f"btrfs receive --dump failed: {err.decode(errors='replace')}")
    return lines


def build(outdir: pathlib.Path, name: str) -> dict[str, Any]:
    """Make NAME.stream in *outdir* on a fresh loop btrfs; return its sidecar info."""
    spec = BENCHES[name]
    stream = outdir / f"{name}.stream"
    tmp = outdir / f"{name}.stream.tmp"
    timings: dict[str, float] = {}
    t_all = time.monotonic()
    with btrfs_loop(spec["fs_size"], mount_opts="noatime") as mnt:
        run(["btrfs", "subvolume", "create", "vol"], cwd=mnt)
        populate: Callable[[pathlib.Path], None] = spec["populate"]
        with Timer("populate") as t:
            populate(mnt / "vol")
        timings["populate"] = t.elapsed
        with Timer("sync + snapshot") as t:
            os.sync()
            run(["btrfs", "subvolume", "snapshot", "-r", "vol", name], cwd=mnt)
        timings["snapshot"] = t.elapsed
        with Timer("btrfs send") as t:
            run(["btrfs", "send", *spec["send_args"], "-f", str(tmp), name], cwd=mnt)
        timings["send"] = t.elapsed
    with Timer(f"scan (sendstream strict decoder, {default_backend().crc_name})") as t:
        res = summarize_path(tmp, attr_orders=False)
    timings["scan"] = t.elapsed
    with Timer("btrfs receive --dump | count lines") as t:
        dump_lines = count_dump_lines(tmp)
    timings["dump"] = t.elapsed
    size = tmp.stat().st_size
    if dump_lines + res.ends != res.commands:
        raise SystemExit(
            f"{name}: dump has {dump_lines} lines but the stream has {res.commands} commands ({res.ends} END)"
        )
    if not spec["check"](size, res.commands):
        raise SystemExit(f"{name}: {size} bytes / {res.commands} commands, wanted {spec['want']}")
    os.chmod(tmp, 0o644)  # btrfs send -f creates 0600; let benchmarks run unprivileged
    os.replace(tmp, stream)
    info = {
        "name": name,
        "size": size,
        "commands": res.commands,
        "dump_lines": dump_lines,
        "versions": res.versions,
        "counts": dict(sorted(res.counts.items())),
        "max_payload": res.max_payload,
        "send_command": "btrfs send " + " ".join(spec["send_args"]) + f" -f {name}.stream {name}",
        "kernel": platform.release(),
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "timings_s": {k: round(v, 2) for k, v in timings.items()},
        "total_s": round(time.monotonic() - t_all, 2),
    }
    (outdir / f"{name}.json").write_text(json.dumps(info, indent=2) + "\n")
    return info


def main(argv: list[str]) -> int:
    args = [a for a in argv[1:] if not a.startswith("--")]
    force = "--force" in argv[1:]
    outdir = pathlib.Path(args[0]) if args else DEFAULT_DIR
    outdir.mkdir(parents=True, exist_ok=True)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda s, _f: sys.exit(128 + s))
    for name in BENCHES:
        info = None if force else cached(outdir, name)
        if info is not None:
            log(f"{name}: cached ({info['size']} bytes, {info['commands']} commands)")
            continue
        reason = require_btrfs()
        if reason:
            print(f"cannot build {name} here: {reason}", file=sys.stderr)
            return 2
        log(f"{name}: building in {outdir}")
        try:
            info = build(outdir, name)
        except FormatError as exc:
            print(f"{name}: malformed stream: {exc}", file=sys.stderr)
            return 1
        finally:
            (outdir / f"{name}.stream.tmp").unlink(missing_ok=True)
        log(
            f"{name}: {info['size']} bytes ({info['size'] / GiB:.2f} GiB), "
            f"{info['commands']} commands ({info['dump_lines']} dump lines), "
            f"{info['total_s']} s total"
        )
        log("  counts: " + " ".join(f"{k}={v}" for k, v in info["counts"].items()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
