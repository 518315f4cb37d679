"""Start-up: a command imports only what it runs, an install holds only what runs, the version is written once.

(How long a start takes is measured by ``tools/bench_startup.py``, not asserted here.)
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support.streams import FIXTURES, ROOT

import sendstream

SAMPLE = FIXTURES / "rich-incr-v2.stream"
IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", re.M)
# What only the network, the service, object storage, the tests or the generator use.
NOT_FOR_A_STREAM_FILE = (
    "zstandard",
    "cffi",
    "_cffi_backend",
    "crcmod",
    "boto3",
    "botocore",
    "cryptography",
    "prometheus_client",
    "construct",
    "ssl",
    "sendstream.transport.tls.binding",
    "sendstream.transport.tls.gnutls",
    "sendstream.transport.tls.openssl",
    "sendstream.session",
    "sendstream.endpoints.sending",
    "sendstream.endpoints.receiving",
    "sendstream.archive",
    "sendstream.service",
    "sendstream.cli.remote",
    "sendstream.cli.admin",
    "sendstream.cli.archive",
)
GENERATOR = {"sendstream/format/declarations.py", "sendstream/format/generate.py", "sendstream/format/__main__.py"}


@pytest.mark.parametrize("command", ["verify", "dump", "ls", "diff", "paths", "stats"])
def test_a_stream_command_imports_only_what_it_uses(command: str) -> None:
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "sendstream", command, str(SAMPLE)],
        capture_output=True,
        text=True,
        check=True,
    )
    imported = set(IMPORTED.findall(done.stderr))
    assert f"sendstream.{'render' if command != 'verify' else 'ops'}" in imported  # the parse reads what it should
    unwanted = {m for m in imported if any(m == n or m.startswith(f"{n}.") for n in NOT_FOR_A_STREAM_FILE)}
    assert not unwanted


def test_an_install_holds_the_runtime_without_the_generator(tmp_path: Path) -> None:
    """The generator needs construct, which an install does not have: it stays in the checkout."""
    subprocess.run(
        [sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        check=True,
    )
    built = {str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.py")}
    source = {str(p.relative_to(ROOT)) for p in (ROOT / "sendstream").rglob("*.py") if "__pycache__" not in p.parts}
    assert built == source - GENERATOR
    # every module it holds imports where construct cannot be found
    code = (
        "import importlib, pathlib, sys\n"
        "sys.modules['construct'] = None\n"
        "root = pathlib.Path(sys.argv[1])\n"
        "for path in sorted(root.rglob('*.py')):\n"
        "    name = '.'.join(path.relative_to(root).with_suffix('').parts).removesuffix('.__init__')\n"
        "    importlib.import_module(name)\n"
        "print(sys.modules['sendstream'].__file__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)],
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(tmp_path / "sendstream" / "__init__.py")


def test_the_version_is_written_once() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" not in project["project"] and "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "sendstream.__version__"}
    assert importlib.metadata.version("sendstream") == sendstream.__version__
    done = subprocess.run([sys.executable, "-m", "sendstream", "-V"], capture_output=True, text=True, check=True)
    assert done.stdout == f"sendstream, version {sendstream.__version__}\n"


def test_the_command_line_does_not_import_construct() -> None:
    """construct is a quarter of the start-up time: the runtime reads ``_layout.py`` instead."""
    code = (
        "import sys; from sendstream import cli; sys.argv = ['sendstream', 'verify', '-q', sys.argv[1]]\n"
        "try: cli.main()\nfinally: print(sorted(m for m in sys.modules if m.split('.')[0] == 'construct'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(FIXTURES / "rich-incr-v2.stream")], capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "[]"
