"""Every command's exit code, standard output and standard error are byte for byte the recorded ones.

The cases and what is normalised are in ``tests/support/baseline.py``; the records in
``tests/baseline/`` are re-recorded only deliberately (``python3 tools/record_baseline.py``), each
change written in CHANGELOG.md.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from support.baseline import CASES, RECORDED, Case, difference, outcome, recorded_path, run_by_subprocess

# In-process cases run again as a person runs them, to show the in-process runner gives their bytes:
# help (the width of a pipe), the manual (click's help options), a verifier's -v, an error's exit.
BY_BOTH = ["help", "help-dump", "man", "verify-verbose-two-e-v1", "dump-truncated", "error-bad-option"]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("baseline")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_a_command_does_what_was_recorded(case: Case, base: Path) -> None:
    if case.as_root and os.geteuid() != 0:
        pytest.skip("recorded as root: owners and devices extract only as root")
    diff = difference(case, outcome(case, base))
    if diff is not None:
        pytest.fail(f"{case.command_line()}: not what tests/baseline/{case.name}.txt holds\n{diff}", pytrace=False)


@pytest.mark.parametrize("name", BY_BOTH)
def test_in_process_is_as_by_subprocess(name: str, base: Path) -> None:
    (case,) = [c for c in CASES if c.name == name]
    assert not case.by_subprocess
    assert difference(case, outcome(case, base, run_by_subprocess)) is None


def test_every_record_has_its_case_and_every_case_one_name() -> None:
    names = [c.name for c in CASES]
    assert len(names) == len(set(names))
    assert sorted(p.name for p in RECORDED.glob("*.txt")) == sorted(recorded_path(c).name for c in CASES)
