#!/usr/bin/env python3
"""The kernel differential campaign, long: seeded file-system histories on loop-device btrfs, each
sent by the kernel in v1 and v2 (full and incremental, ``--compressed-data`` on compressed mounts),
each stream checked by the oracles of tests/support/differential.py (verify, dump against
``btrfs receive --dump``, ``btrfs receive``, ``extract``, ``convert --to-version 1``).

Usage (as root, with btrfs-progs; the CI tier is tests/system/test_kernel_differential.py)::

    python3 tools/differential.py --histories 100 --seed 1000
    python3 tools/differential.py --minutes 30 --seed 1000 --keep build/differential
    python3 tools/differential.py --histories 1 --seed 1234 --keep DIR   # a finding again, its streams in DIR

Prints a line per history, then the figures: histories, streams, cases per oracle, the known defects
met and every finding with its seed. Exit 1 when there is a finding (a difference that no entry of
``KNOWN`` explains), 2 when btrfs cannot be used here.
"""

from __future__ import annotations

import argparse
import datetime
import signal
import subprocess
import sys
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
sys.path.insert(0, str(TOOLS.parent))  # this checkout, before an installed sendstream
sys.path.insert(0, str(TOOLS.parent / "tests"))

from support.differential import KNOWN, OPS, ORACLES, Figures, Switches, campaign  # noqa: E402
from support.loopfs import require_btrfs  # noqa: E402


def commit() -> str:
    """The checkout's commit, taken when the run starts (a commit during a long run is not its code)."""
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=TOOLS)
    return proc.stdout.strip() or "?"


def report(fig: Figures, seconds: float, first: int, at: str) -> str:
    kernel = subprocess.run(["uname", "-r"], capture_output=True, text=True).stdout.strip()
    lines = [
        f"date {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, commit {at}, kernel {kernel}, {seconds:.0f} s",
        f"histories {fig.histories} (seeds {first}..{first + fig.histories - 1}; "
        + ", ".join(f"{k} {v}" for k, v in sorted(fig.mounts.items()))
        + f", {fig.root_untouched} with the root untouched from A to B)",
        f"streams {fig.streams} ({fig.stream_bytes:,} bytes)",
        "cases " + ", ".join(f"{o} {fig.cases[o]}" for o in ORACLES) + f" (all {sum(fig.cases.values())})",
        "operations " + ", ".join(f"{k} {v}" for k, v in sorted(fig.ops.items())),
        "commands " + ", ".join(f"{k} {v}" for k, v in sorted(fig.commands.items())),
        "known " + (", ".join(f"{k} {v}" for k, v in sorted(fig.known.items())) or "none"),
    ]
    findings = [f for f in fig.failures if f.known is None]
    lines.append(f"findings {len(findings)}")
    lines += [f"  {f}" for f in findings]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=0, help="the first seed; history i has seed SEED+i")
    parser.add_argument("--histories", type=int, default=None, help="how many histories (default: 10)")
    parser.add_argument("--minutes", type=float, default=None, help="run histories until this much time is over")
    parser.add_argument("--ops", type=int, default=OPS, help="most operations before A and again before B")
    parser.add_argument("--keep", type=Path, default=None, help="copy the streams of a history with a finding here")
    parser.add_argument(
        "--inline-fallocate",
        action="store_true",
        help="fallocate small files on compressed mounts too (kernel defect (c) of issue 27; off: steered around)",
    )
    args = parser.parse_args()
    # Stopped by a signal, the run still unmounts and detaches in its finally blocks (a job started
    # in the background of a shell ignores SIGINT: take it back).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    signal.signal(signal.SIGINT, signal.default_int_handler)
    why = require_btrfs()
    if why:
        print(f"differential: cannot use a real btrfs here: {why}", file=sys.stderr)
        return 2
    histories = args.histories if args.histories is not None else (10**9 if args.minutes else 10)
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    total = Figures()
    start, at = time.monotonic(), commit()
    with campaign(args.ops, Switches(inline_fallocate=args.inline_fallocate), args.keep) as c:
        for seed in range(args.seed, args.seed + histories):
            if deadline is not None and time.monotonic() > deadline:
                break
            fig = c.history(seed)
            total.add(fig)
            mount = next(iter(fig.mounts))
            untouched = " (root untouched)" if fig.root_untouched else ""
            print(f"seed {seed} {mount}{untouched}: {fig.streams} streams, {sum(fig.cases.values())} cases", end="")
            print("".join(f"; {f}" for f in fig.failures), flush=True)
    print(report(total, time.monotonic() - start, args.seed, at))
    print("(known: " + "; ".join(f"{k}: {v}" for k, v in KNOWN.items()) + ")")
    return 1 if any(f.known is None for f in total.failures) else 0


if __name__ == "__main__":
    sys.exit(main())
