"""contrib/: the systemd unit of the service is one systemd takes, after the install it documents."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest
from support.net import key_file
from support.streams import ROOT

UNIT = ROOT / "contrib" / "sendstream-serve.service"
SOURCE = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md")  # with sendstream/, what a build reads


def test_the_systemd_unit_verifies_after_the_install_it_documents(tmp_path: Path) -> None:
    """The install lines in the unit's header, run as written in a copy of this tree, in a mount namespace
    whose /opt and /usr/local/bin are overlays (the machine's stay as they are): then the unit as shipped
    verifies, and the command it runs checks a configuration."""
    if os.geteuid() != 0 or not all(shutil.which(t) for t in ("systemd-analyze", "unshare", "mount")):
        pytest.skip("needs root, systemd-analyze and unshare (CI has them)")
    text = UNIT.read_text()
    install = [line.removeprefix("#   ") for line in text.splitlines() if line.startswith("#   ")]
    assert install, "the unit's header says how to install the command it runs"
    assert "ExecStart=/usr/local/bin/sendstream serve --config" in text and "ProtectSystem=strict" in text
    source = tmp_path / "source"
    shutil.copytree(ROOT / "sendstream", source / "sendstream", ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    for name in SOURCE:
        shutil.copy2(ROOT / name, source / name)
    key_file(tmp_path / "k")
    (tmp_path / "place").mkdir()
    config = tmp_path / "serve.toml"
    config.write_text('listen = "*:7000"\n[clients.web1]\nkey = "k"\nstore = "place"\n')
    overlays = [
        f"mkdir -p {tmp_path}/upper{d} {tmp_path}/work{d} && mount -t overlay overlay "
        f"-o lowerdir={d},upperdir={tmp_path}/upper{d},workdir={tmp_path}/work{d} {d}"
        for d in ("/opt", "/usr/local/bin")
    ]
    script = [
        "set -e",
        *overlays,
        f"cd {shlex.quote(str(source))}",
        *install,
        f"systemd-analyze verify {shlex.quote(str(UNIT))}",
        f"/usr/local/bin/sendstream serve --config {shlex.quote(str(config))} --check-config",
    ]
    result = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(script)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "sendstream-serve" not in result.stderr, result.stderr  # systemd-analyze names the unit it objects to
    assert f"{config}: ok: 1 client (web1)" in result.stdout, result.stdout
