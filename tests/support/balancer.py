"""HAProxy (Debian's) in TCP mode in front of services, for the tests of a service behind a balancer."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from .net import wait_listening

HAPROXY = shutil.which("haproxy") or shutil.which("haproxy", path="/usr/sbin:/usr/local/sbin")


@contextlib.contextmanager
def haproxy(directory: Path, front: int, servers: str, settings: str = "") -> Iterator[subprocess.Popen[bytes]]:
    """``haproxy -db`` in TCP mode on 127.0.0.1:``front``, before the backend ``servers`` (its ``server``
    lines), with ``settings`` in its ``global`` section; killed at the end."""
    if HAPROXY is None:
        pytest.skip("needs HAProxy (apt-get install haproxy; tools/setup-tests installs it)")
    config = directory / "haproxy.cfg"
    config.write_text(
        f"global\n    maxconn 100\n{settings}"
        "defaults\n    mode tcp\n    timeout connect 2s\n    timeout client 5m\n    timeout server 5m\n"
        "    retries 3\n    option redispatch\n"
        f"frontend front\n    bind 127.0.0.1:{front}\n    default_backend services\n"
        f"backend services\n    balance roundrobin\n{servers}"
    )
    process = subprocess.Popen([HAPROXY, "-f", str(config), "-db"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_listening(front)
        yield process
    finally:
        process.kill()
        process.wait()
        assert process.stdout is not None
        process.stdout.close()
