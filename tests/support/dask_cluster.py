"""A real Dask cluster on loopback for the tests: ``dask scheduler`` and ``dask worker`` processes (from
``pip install distributed``), each worker with an environment of its own, as separate machines have."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

SUPPORT = Path(__file__).resolve().parent
TLS_NAMES = ("ca.pem", "cert.pem", "key.pem")


@dataclass
class Cluster:
    address: str
    directory: Path
    tls: Path | None  # the directory of ca.pem, cert.pem, key.pem, for a tls:// cluster
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    workers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def client_env(self, env: dict[str, str]) -> dict[str, str]:
        """``env`` with what a client needs to reach a tls:// scheduler: Dask's own settings."""
        if self.tls is None:
            return env
        ca, cert, key = (str(self.tls / name) for name in TLS_NAMES)
        return dict(
            env,
            DASK_DISTRIBUTED__COMM__TLS__CA_FILE=ca,
            DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT=cert,
            DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY=key,
            DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION="True",
        )

    def _tls_args(self) -> list[str]:
        if self.tls is None:
            return []
        ca, cert, key = (str(self.tls / name) for name in TLS_NAMES)
        return ["--tls-ca-file", ca, "--tls-cert", cert, "--tls-key", key]

    def add_worker(self, name: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
        """A worker process (no nanny: killing it kills the worker) of one thread, with ``env`` only (and
        this tree's tests on its path, for :mod:`support.dask_plugins`)."""
        dask = shutil.which("dask")
        assert dask is not None
        log = open(self.directory / f"{name}.log", "ab")  # noqa: SIM115 (the worker writes it while it runs)
        path = os.pathsep.join(filter(None, [str(SUPPORT.parent), env.get("PYTHONPATH")]))
        env = dict(env, PYTHONPATH=path)  # support.dask_plugins, by name
        argv = [dask, "worker", self.address, "--name", name, "--nthreads", "1", "--no-nanny", "--no-dashboard"]
        process = subprocess.Popen(
            [*argv, "--local-directory", str(self.directory / name), *self._tls_args()],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        log.close()
        self.processes.append(process)
        self.workers[name] = process
        return process

    def wait_workers(self, count: int, seconds: float = 60) -> None:
        with self.client() as client:
            client.wait_for_workers(count, timeout=seconds)

    def client(self) -> Any:
        """A Dask client of this cluster, for the test itself (to register a plugin, to wait)."""
        import distributed

        security = None
        if self.tls is not None:
            ca, cert, key = (str(self.tls / name) for name in TLS_NAMES)
            security = distributed.Security(
                tls_ca_file=ca, tls_client_cert=cert, tls_client_key=key, require_encryption=True
            )
        return distributed.Client(self.address, security=security, timeout=30, set_as_default=False)

    def log(self, name: str) -> str:
        return (self.directory / f"{name}.log").read_text(errors="replace")


def tls_files(directory: Path) -> Path:
    """A CA and one certificate it signed for 127.0.0.1 (scheduler, workers and clients share it)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca, key, request, cert = (directory / n for n in ("ca.key", "ca.pem", "key.pem", "req.pem", "cert.pem"))

    def run(*argv: str) -> None:
        subprocess.run(["openssl", *argv], check=True, capture_output=True)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca), "-days", "2",
        "-subj", "/CN=sendstream test CA")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(request), "-subj", "/CN=127.0.0.1")
    extensions = directory / "san.cnf"
    extensions.write_text("subjectAltName=IP:127.0.0.1\n")
    run("x509", "-req", "-in", str(request), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-out", str(cert), "-days", "2", "-extfile", str(extensions))  # fmt: skip
    return directory


@contextlib.contextmanager
def dask_cluster(directory: Path, *, tls: bool = False) -> Iterator[Cluster]:
    """``dask scheduler`` on loopback (tls:// with certificates when ``tls``); workers are added with
    :meth:`Cluster.add_worker`. Every process is killed at the end."""
    pytest.importorskip("distributed", reason="needs Dask distributed (pip install 'sendstream[cluster]')")
    dask = shutil.which("dask")
    if dask is None:
        pytest.skip("needs the dask command (pip install 'sendstream[cluster]')")
    directory.mkdir(parents=True, exist_ok=True)
    certificates = tls_files(directory / "tls") if tls else None
    cluster = Cluster("", directory, certificates)
    file = directory / "scheduler.json"
    log = open(directory / "scheduler.log", "ab")  # noqa: SIM115
    argv = [dask, "scheduler", "--host", "127.0.0.1", "--port", "0", "--no-dashboard", "--scheduler-file", str(file)]
    if tls:
        argv += ["--protocol", "tls", *cluster._tls_args()]
    scheduler = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    log.close()
    cluster.processes.append(scheduler)
    try:
        deadline = time.monotonic() + 60
        while not file.exists() or not file.read_text().strip():
            if scheduler.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dask scheduler did not start:\n{cluster.log('scheduler')[-2000:]}")
            time.sleep(0.1)
        time.sleep(0.1)  # written whole: the file is small, but it is not written atomically
        cluster.address = json.loads(file.read_text())["address"]
        yield cluster
    finally:
        for process in cluster.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
