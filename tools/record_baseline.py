#!/usr/bin/env python3
"""Record what every command prints, and its exit code, into tests/baseline/ (one file per case).

Usage: ``python3 tools/record_baseline.py [--check] [--case NAME ...]``

The cases, the way each runs and what is normalised are those of ``tests/support/baseline.py``,
which ``tests/integration/test_baseline.py`` checks against these files. A re-record is a deliberate change
of what a user sees: write it in CHANGELOG.md. ``--check`` compares instead of writing, prints a
diff for each case that differs, and exits 1 if any does; a recorded file that no case makes is
removed on a record and reported by ``--check``.
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import tempfile

REPO = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # this checkout, before an installed sendstream
sys.path.insert(0, str(REPO / "tests"))
from support.baseline import CASES, RECORDED, difference, outcome, recorded_path  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare with the recorded files instead of writing")
    parser.add_argument("--case", action="append", metavar="NAME", help="only this case (repeatable)")
    args = parser.parse_args()
    cases = [c for c in CASES if not args.case or c.name in args.case]
    if args.case and len(cases) != len(set(args.case)):
        parser.error(f"no such case: {', '.join(sorted(set(args.case) - {c.name for c in cases}))}")
    stale = sorted({p.name for p in RECORDED.glob("*.txt")} - {recorded_path(c).name for c in CASES})
    failed = 0
    with tempfile.TemporaryDirectory(prefix="baseline.") as base:
        for case in cases:
            now = outcome(case, pathlib.Path(base))
            if args.check:
                diff = difference(case, now)
                if diff:
                    failed += 1
                    print(diff)
            else:
                RECORDED.mkdir(exist_ok=True)
                recorded_path(case).write_bytes(now.encode())
    for name in stale if not args.case else []:
        if args.check:
            failed += 1
            print(f"{name}: recorded, but no case makes it")
        else:
            (RECORDED / name).unlink()
    print(f"{len(cases)} cases, {failed} differ" if args.check else f"{len(cases)} cases recorded in {RECORDED}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
