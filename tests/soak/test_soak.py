"""A short run of the service's soak (tools/soak_serve.py): transfers from several clients while hostile
connections knock, a sender killed mid-stream, the service killed and started again. The long run (200
transfers from 8 clients, two kills of the service) is run before a release; its figures are in
docs/contributing/benchmarks.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SOAK = Path(__file__).resolve().parent.parent.parent / "tools" / "soak_serve.py"


def test_a_short_soak_of_the_service_stores_every_stream_and_reports_every_failure() -> None:
    argv = [sys.executable, str(SOAK), "--transfers", "24", "--clients", "4", "--service-kills", "1"]
    done = subprocess.run([*argv, "--rss-from", "12", "--seed", "3", "--json"], capture_output=True, timeout=900)
    result = json.loads(done.stdout)
    if done.returncode != 0 or result["failures"]:
        failures = "\n".join(result["failures"])  # whole: a repr of the result would cut them short
        pytest.fail(f"exit {done.returncode}; the soak's failures:\n{failures}\n{done.stderr[-2000:]!r}", pytrace=False)
    assert result["stored"] == 24 and result["service_kills"] == 1 and result["senders_killed"] >= 1, result
    assert all(result["knocks"][kind] for kind in ("silent", "garbage", "slow-loris")), result
