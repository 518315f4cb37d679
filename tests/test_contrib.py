"""contrib/: the systemd unit of the service is one systemd takes."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from support.streams import ROOT

UNIT = ROOT / "contrib" / "sendstream-serve.service"


def test_the_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze, command = shutil.which("systemd-analyze"), shutil.which("sendstream")
    if analyze is None or command is None:
        pytest.skip("needs systemd-analyze and an installed sendstream command (CI has both)")
    text = UNIT.read_text()
    assert "/usr/local/bin/sendstream serve --config" in text and "ProtectSystem=strict" in text
    unit = tmp_path / "sendstream-serve.service"
    unit.write_text(text.replace("/usr/local/bin/sendstream", command))  # where pip put it here
    result = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True)
    assert result.returncode == 0 and "sendstream-serve" not in result.stderr, result.stderr
