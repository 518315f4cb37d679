"""A short run of the service's soak (tools/soak_serve.py): transfers from several clients while hostile
connections knock, a sender killed mid-stream, the service killed and started again. The long run (200
transfers from 8 clients, two kills of the service) is run before a release; its figures are in the README."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SOAK = Path(__file__).resolve().parent.parent / "tools" / "soak_serve.py"


def test_a_short_soak_of_the_service_stores_every_stream_and_reports_every_failure() -> None:
    argv = [sys.executable, str(SOAK), "--transfers", "24", "--clients", "4", "--service-kills", "1"]
    done = subprocess.run([*argv, "--rss-from", "12", "--seed", "3", "--json"], capture_output=True, timeout=900)
    result = json.loads(done.stdout)
    assert done.returncode == 0 and result["failures"] == [], (result, done.stderr[-2000:])
    assert result["stored"] == 24 and result["service_kills"] == 1 and result["senders_killed"] >= 1, result
    assert all(result["knocks"][kind] for kind in ("silent", "garbage", "slow-loris")), result
