"""The fuzzing regression corpus: every file of tests/corpus/TARGET/ through the fuzz target TARGET.

The targets live in tools/fuzz.py, which is run (not imported) with
``--replay``: each file once, without atheris, under the harness's RLIMIT_AS,
one JSON line per file. A file passes when it ends in success or in
sendstream's own error; a crash names its signature and last frames.

Entries that crash today, for findings of issue 11 being fixed elsewhere,
are expected failures (not strict) as long as they crash the way :data:`XFAIL`
says: each flags an XPASS once its fix lands, and then leaves the list.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import sendstream

ROOT = Path(__file__).resolve().parent.parent.parent
CORPUS = ROOT / "tests" / "corpus"
HARNESS = ROOT / "tools" / "fuzz.py"
FILES = sorted(p for p in CORPUS.glob("*/*") if p.is_file())

# "TARGET/FILE" -> (the crash signatures expected, as a regular expression; the finding) for
# the entries that crash today; another crash of such an entry fails the test
XFAIL: dict[str, tuple[str, str]] = {}


class KnownFinding(AssertionError):
    """An entry crashes as :data:`XFAIL` says it does today."""


@functools.cache
def replay(target: str) -> dict[str, dict[str, Any]]:
    """The harness's verdict on every file of the target's corpus, by file name."""
    # the sendstream this test imported (this checkout, or sanitize.sh's ASan build) is the one replayed
    env = {**os.environ, "PYTHONPATH": str(Path(sendstream.__file__).resolve().parent.parent)}
    run = subprocess.run(
        [sys.executable, str(HARNESS), target, "--replay", str(CORPUS / target)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    results = {r["file"]: r for r in map(json.loads, run.stdout.splitlines())}
    assert results, f"the harness reported nothing (exit {run.returncode}): {run.stderr[-3000:]}"
    return results


def entry_id(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def test_every_corpus_directory_is_a_target() -> None:
    targets = subprocess.run(
        [sys.executable, str(HARNESS), "--list"], capture_output=True, text=True, check=True
    ).stdout.split()
    assert {p.name for p in CORPUS.iterdir()} <= set(targets)
    assert set(XFAIL) <= {entry_id(p) for p in FILES}, "an XFAIL entry names no corpus file"


@pytest.mark.parametrize("path", FILES, ids=entry_id)
def test_corpus_entry(path: Path, request: pytest.FixtureRequest) -> None:
    """Our own error or success: no other exception, no native/pure disagreement,
    no change outside extract's directory, no memory kept per input unit."""
    expected = XFAIL.get(entry_id(path))
    if expected is not None:
        request.applymarker(pytest.mark.xfail(reason=expected[1], raises=KnownFinding, strict=False))
    result = replay(path.parent.name).get(path.name)
    assert result is not None, f"{entry_id(path)}: the harness stopped before this file"
    if result["ok"]:
        return
    crash = f"{result['signature']}: {result['error']} (at {' <- '.join(reversed(result['frames']))})"
    if expected is not None and re.search(expected[0], result["signature"]):
        raise KnownFinding(crash)
    raise AssertionError(crash)
