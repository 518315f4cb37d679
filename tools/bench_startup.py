#!/usr/bin/env python3
"""Start-up of ``sendstream verify`` on a tiny stream against ``python -c pass``, as a user's install runs it.

Usage: ``python3 tools/bench_startup.py [--commit REV] [--before REV] [--rounds N] [--importtime [N]] [--keep DIR]``

Builds a wheel of this checkout (or of ``--commit REV``, exported with ``git archive``), installs
it with its dependencies into a fresh venv in a temporary directory (on /dev/shm when it has room),
compiles the venv's bytecode, then runs paired rounds, the order alternating, of the venv's own
interpreter (never a version manager's shim: it execs the interpreter and alone costs more than the
command):

- ``VENV/bin/python -c pass``, the reference;
- ``VENV/bin/python -c 'import click'``, the floor of any command line built on click;
- ``VENV/bin/sendstream verify TINY``, the console script, the target (what a user runs);
- ``VENV/bin/python -m sendstream verify TINY``.

With ``--before REV`` that commit gets a venv of its own and its two ``sendstream`` rows run in the
same rounds (a loaded machine moves every row; the ratios of one run compare).

It prints each command's median wall time and the median of each round's ratio to the reference
(the ratio pair by pair holds when the machine's speed drifts). With ``--importtime`` it also lists
the modules whose import costs the most (``-X importtime``, cumulative, a median over 5 runs).
Progress goes to stderr, the report to stdout. Standard library only (and pip, in the venv).
"""

from __future__ import annotations

import argparse
import pathlib
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parent.parent
TINY = "fixtures/two-e-v1.stream"  # 37 commands, 1,602 bytes
IMPORT_RE = re.compile(r"^import time:\s+(\d+) \|\s+(\d+) \| (\s*)(\S+)$")
SHM = pathlib.Path("/dev/shm")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def scratch() -> pathlib.Path:
    """A temporary directory, on tmpfs when it has room for a venv (~100 MB)."""
    if SHM.is_dir() and shutil.disk_usage(SHM).free > 512 * 2**20:
        return pathlib.Path(tempfile.mkdtemp(prefix="bench-startup-", dir=SHM))
    return pathlib.Path(tempfile.mkdtemp(prefix="bench-startup-"))


def source(commit: str | None, work: pathlib.Path) -> pathlib.Path:
    """This checkout, or ``commit`` of its repository exported into ``work``."""
    if commit is None:
        return REPO
    tree = work / "src"
    tree.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", commit], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    return tree


def quietly(argv: list[str]) -> None:
    """Run ``argv``; what it printed is shown only when it fails (pip warns of every index it skips)."""
    done = subprocess.run(argv, capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stdout + done.stderr)
        raise subprocess.CalledProcessError(done.returncode, argv)


def install(tree: pathlib.Path, work: pathlib.Path) -> pathlib.Path:
    """A fresh venv in ``work`` with a wheel of ``tree`` and its dependencies, bytecode compiled."""
    wheels = work / "wheels"
    venv = work / "venv"
    log(f"building a wheel of {tree}")
    pip_quiet = ["--quiet", "--disable-pip-version-check"]
    build = [sys.executable, "-m", "pip", "wheel", *pip_quiet, "--no-deps", "-w"]
    quietly([*build, str(wheels), str(tree)])
    wheel = next(wheels.glob("sendstream-*.whl"))
    log(f"installing {wheel.name} into {venv}")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    python = venv / "bin" / "python"
    quietly([str(python), "-m", "pip", "install", *pip_quiet, str(wheel)])
    subprocess.run([str(python), "-m", "compileall", "-q", "-j0", str(venv / "lib")], check=True)
    return venv


def wall(argv: list[str], cwd: pathlib.Path) -> float:
    """Seconds from start to exit of ``argv``, its output thrown away; fails when it fails."""
    start = time.perf_counter()
    subprocess.run(argv, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    return time.perf_counter() - start


def paired(commands: dict[str, list[str]], rounds: int, cwd: pathlib.Path) -> dict[str, list[float]]:
    """Every command once a round (after one warm-up round), the order reversed every other round."""
    names = list(commands)
    times: dict[str, list[float]] = {name: [] for name in names}
    for index in range(rounds + 1):
        order = names if index % 2 else names[::-1]
        for name in order:
            seconds = wall(commands[name], cwd)
            if index:
                times[name].append(seconds)
    return times


def import_costs(python: pathlib.Path, args: list[str], cwd: pathlib.Path, runs: int = 5) -> dict[str, int]:
    """Each top-level import's cumulative microseconds (``-X importtime``), the median of ``runs``."""
    costs: dict[str, list[int]] = {}
    for _ in range(runs):
        stderr = subprocess.run(
            [str(python), "-X", "importtime", *args], cwd=cwd, capture_output=True, text=True, check=True
        ).stderr
        for line in stderr.splitlines():
            match = IMPORT_RE.match(line)
            if match:
                depth = len(match.group(3)) // 2
                costs.setdefault(f"{'  ' * depth}{match.group(4)}", []).append(int(match.group(2)))
    return {name: int(statistics.median(values)) for name, values in costs.items()}


def verify_commands(venv: pathlib.Path, tiny: str, label: str) -> dict[str, list[str]]:
    """``verify TINY`` by the console script of ``venv`` and by ``python -m``, each named with ``label``."""
    return {
        f"sendstream verify TINY{label}": [str(venv / "bin" / "sendstream"), "verify", tiny],
        f"python -m sendstream verify TINY{label}": [str(venv / "bin" / "python"), "-m", "sendstream", "verify", tiny],
    }


def processor() -> str:
    """The processor's model name from /proc/cpuinfo, and how many there are."""
    try:
        models = re.findall(r"^model name\s*:\s*(.*)$", pathlib.Path("/proc/cpuinfo").read_text(), re.M)
    except OSError:
        return platform.machine()
    return f"{models[0] if models else platform.machine()} x{len(models)}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--commit", help="measure this commit of the repository instead of the checkout")
    parser.add_argument("--before", help="also measure this commit, in the same rounds")
    parser.add_argument("--rounds", type=int, default=25, help="paired rounds counted (at least 20; default 25)")
    parser.add_argument(
        "--importtime", type=int, nargs="?", const=25, default=0, metavar="N", help="list the N costliest imports"
    )
    parser.add_argument("--keep", type=pathlib.Path, help="build the venv here and keep it (default: a temporary one)")
    args = parser.parse_args()
    if args.rounds < 20:
        parser.error("--rounds: at least 20")
    work = args.keep or scratch()
    work.mkdir(parents=True, exist_ok=True)
    try:
        venv = install(source(args.commit, work / "now"), work / "now")
        python = venv / "bin" / "python"
        tiny = str(REPO / TINY)
        commands = {
            "python -c pass": [str(python), "-c", "pass"],
            "python -c 'import click'": [str(python), "-c", "import click"],
            **verify_commands(venv, tiny, ""),
        }
        if args.before:
            earlier = install(source(args.before, work / "before"), work / "before")
            commands |= verify_commands(earlier, tiny, " (before)")
        log(f"{args.rounds} paired rounds (and one warm-up)")
        times = paired(commands, args.rounds, work)
        reference = times["python -c pass"]
        label = args.commit or "the checkout"
        before = f", before: {args.before}" if args.before else ""
        print(f"start-up of {label}{before}: {processor()}, Python {platform.python_version()}, {args.rounds} rounds")
        print("| command | median ms | median ratio to `python -c pass` (pair by pair) |")
        print("|---|---:|---:|")
        for name, values in times.items():
            ratio = statistics.median(value / ref for value, ref in zip(values, reference, strict=True))
            print(f"| `{name}` | {statistics.median(values) * 1000:.1f} | {ratio:.2f} |")
        print("target: `sendstream verify TINY` (the console script) within 2.5x `python -c pass`")
        if args.importtime:
            costs = import_costs(python, ["-m", "sendstream", "verify", tiny], work)
            print("\ncostliest imports of `python -m sendstream verify TINY` (cumulative us, median of 5):")
            for name, micros in sorted(costs.items(), key=lambda item: -item[1])[: args.importtime]:
                print(f"{micros:>8}  {name}")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
