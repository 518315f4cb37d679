"""--endpoint-url: every command that takes it checks it before anything else happens, and says what is
wrong in one line that names the option (or the environment variable), never a traceback."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from support.net import CMD
from support.streams import FIXTURES

ARCHIVE = "s3://bucket1/host1"
FULL = FIXTURES / "rich-full-v2.stream"
UUID = "0" * 8 + "-0000-0000-0000-" + "0" * 12
ENDPOINT_COMMANDS = {
    "send": ["send", "--to", ARCHIVE, str(FULL)],
    "restore": ["restore", f"{ARCHIVE}/{UUID}", "-o", "OUT"],
    "verify": ["verify", ARCHIVE],
    "archive-ls": ["archive", "ls", ARCHIVE],
    "archive-prune": ["archive", "prune", ARCHIVE, "--keep-last", "1"],
}


@pytest.mark.parametrize("endpoint", ["garbage", "http://[::1", "http://127.0.0.1:99999", "ftp://127.0.0.1"])
@pytest.mark.parametrize("command", ENDPOINT_COMMANDS.values(), ids=ENDPOINT_COMMANDS.keys())
def test_a_bad_endpoint_url_is_one_line_naming_the_option(tmp_path: Path, command: list[str], endpoint: str) -> None:
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in command]
    result = subprocess.run([*CMD, *argv, "--endpoint-url", endpoint], capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("\n") == 1 and f"--endpoint-url {endpoint!r}: expected http://" in result.stderr
    assert not (tmp_path / "out").exists()


def test_a_bad_endpoint_from_the_environment_is_one_line_naming_it() -> None:
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://[::1"}
    result = subprocess.run([*CMD, "archive", "ls", ARCHIVE], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "the S3 endpoint of AWS_ENDPOINT_URL or the AWS config: Invalid IPv6 URL" in result.stderr
