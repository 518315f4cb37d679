"""``verify s3://... --scheduler``: an archive checked on a real Dask cluster (a scheduler and worker
processes on loopback, each worker with its own environment), against a real S3 server (SeaweedFS); the
report and exit code are the local pool's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.dask_cluster import Cluster, dask_cluster, tls_files
from support.net import CMD, free_port, key_file
from support.s3 import Store, seaweedfs
from support.streams import STREAMS

from sendstream.transfer.identity import stream_identity
from sendstream.transfer.stored import stream_name

pytestmark = pytest.mark.system


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Store]:
    with seaweedfs(tmp_path_factory.mktemp("seaweedfs")) as running:
        yield running


def run(env: dict[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([*CMD, *args], capture_output=True, env=env, timeout=timeout)


def client_env(store: Store) -> dict[str, str]:
    """The checking machine's: credentials, and the endpoint given as --endpoint-url, not in its environment
    (a worker reaches the store by its own, so nothing of the client's can be what a worker used)."""
    env = dict(store.env)
    del env["AWS_ENDPOINT_URL"]
    return env


def archive(store: Store, tmp_path: Path, *sealed: str) -> tuple[str, str]:
    """Every fixture stream archived under a prefix, one of them damaged in the store behind our back:
    the prefix's URL and the damaged stream's name."""
    bucket = store.bucket()
    url = f"s3://{bucket}/h"
    for stream in STREAMS:
        sent = run(store.env, "send", "--to", url, *sealed, str(stream))
        assert sent.returncode == 0 or b"archived already" in sent.stderr, sent.stderr  # a v1 and v2 of one
    victim = next(p for p in STREAMS if p.name == "rich-full-v2.stream").read_bytes()
    name = stream_name(stream_identity(victim[: 64 << 10]))
    client = store.client()
    held = bytearray(client.get_object(Bucket=bucket, Key=f"h/{name}")["Body"].read())
    held[len(held) // 2] ^= 0x10
    client.put_object(Bucket=bucket, Key=f"h/{name}", Body=bytes(held))
    return url, name


def workers(cluster: Cluster, store: Store, tmp_path: Path, count: int, key: Path | None = None) -> None:
    """``count`` workers, each with the store's credentials and endpoint in an environment of its own (and
    its own copy of ``key``, named by SENDSTREAM_ENCRYPT_KEY)."""
    for n in range(count):
        env = dict(store.env, HOME=str(tmp_path / f"home{n}"))
        if key is not None:
            own = tmp_path / f"worker{n}.key"
            own.write_bytes(key.read_bytes())
            own.chmod(0o600)
            env["SENDSTREAM_ENCRYPT_KEY"] = str(own)
        cluster.add_worker(f"w{n}", env)
    cluster.wait_workers(count)


def same_report(local: subprocess.CompletedProcess[bytes], remote: subprocess.CompletedProcess[bytes]) -> None:
    assert remote.returncode == local.returncode, remote.stderr
    assert remote.stdout == local.stdout
    assert remote.stderr.splitlines()[-1:] == local.stderr.splitlines()[-1:]  # "N streams checked, M bad"


def test_the_cluster_s_report_is_the_local_pool_s_and_a_killed_worker_s_stream_is_checked_elsewhere(
    store: Store, tmp_path: Path
) -> None:
    url, damaged = archive(store, tmp_path)
    env = client_env(store)
    local = run(env, "verify", url, "--endpoint-url", store.endpoint)
    assert local.returncode == 1, local.stderr
    lines = local.stdout.decode().splitlines()
    assert len(lines) >= 5 and sum(not line.endswith(": ok") for line in lines) == 1, lines
    assert next(line for line in lines if line.startswith(damaged)).split(": ", 1)[1].startswith("offset ")
    with dask_cluster(tmp_path / "cluster") as cluster:
        workers(cluster, store, tmp_path, 3)
        same_report(local, run(env, "verify", url, "--endpoint-url", store.endpoint, "--scheduler", cluster.address))

        from support.dask_plugins import HoldFirstTask

        marker = tmp_path / "started.json"
        with cluster.client() as dask:
            dask.register_plugin(HoldFirstTask(str(marker)), name="hold-first-task")
        argv = [*CMD, "verify", url, "--endpoint-url", store.endpoint, "--scheduler", cluster.address]
        checking = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        deadline = time.monotonic() + 120
        while not marker.exists() or not marker.read_text():  # a worker started a task (and holds it)
            assert checking.poll() is None and time.monotonic() < deadline, checking.communicate()
            time.sleep(0.02)
        started = json.loads(marker.read_text())
        assert started["key"].startswith("sendstream-verify-"), started
        os.kill(started["pid"], signal.SIGKILL)
        out, err = checking.communicate(timeout=300)
        same_report(local, subprocess.CompletedProcess(argv, checking.returncode, out, err))
        killed = next(name for name, p in cluster.workers.items() if p.pid == started["pid"])
        assert cluster.workers[killed].wait(10) == -signal.SIGKILL
        assert "sendstream-verify-" not in cluster.log(killed).split("\n")[-1]  # it never said it finished


def test_a_sealed_archive_is_opened_with_each_worker_s_own_key_over_tls(store: Store, tmp_path: Path) -> None:
    key = key_file(tmp_path / "seal.key")
    url, _ = archive(store, tmp_path, "--encrypt-key", str(key))
    env = client_env(store)
    local = run(env, "verify", url, "--endpoint-url", store.endpoint, "--encrypt-key", str(key))
    assert local.returncode == 1 and local.stdout.count(b": ok\n") >= 4, local
    keyless = run(env, "verify", url, "--endpoint-url", store.endpoint)
    with dask_cluster(tmp_path / "cluster", tls=True) as cluster:
        assert cluster.address.startswith("tls://")
        workers(cluster, store, tmp_path, 2, key)
        env = cluster.client_env(env)
        same_report(local, run(env, "verify", url, "--endpoint-url", store.endpoint, "--scheduler", cluster.address))
        given = run(env, "verify", url, "--scheduler", cluster.address, "--encrypt-key", str(key))
        assert given.returncode == 2 and b"SENDSTREAM_ENCRYPT_KEY" in given.stderr, given.stderr
        plain = run(client_env(store), "verify", url, "--endpoint-url", store.endpoint, "--scheduler", cluster.address)
        assert plain.returncode == 2 and b"DASK_DISTRIBUTED__COMM__TLS__CA_FILE" in plain.stderr, plain.stderr
        stranger = Cluster(cluster.address, tmp_path, tls_files(tmp_path / "stranger")).client_env(client_env(store))
        refused = run(stranger, "verify", url, "--endpoint-url", store.endpoint, "--scheduler", cluster.address)
        assert refused.returncode == 4 and b"cannot reach the Dask scheduler" in refused.stderr, refused.stderr
        assert len(refused.stderr.splitlines()) == 1
        encrypted = run(env, "verify", url, "--endpoint-url", store.endpoint, "--scheduler", "tcp://127.0.0.1:1")
        assert encrypted.returncode == 2 and b"require encryption" in encrypted.stderr, encrypted.stderr
    env = client_env(store)
    with dask_cluster(tmp_path / "keyless") as cluster:
        workers(cluster, store, tmp_path / "k", 2)
        same_report(keyless, run(env, "verify", url, "--endpoint-url", store.endpoint, "--scheduler", cluster.address))


def test_a_scheduler_that_is_not_there_or_not_for_this_place_is_one_line(store: Store, tmp_path: Path) -> None:
    url, _ = archive(store, tmp_path)
    env = client_env(store)
    gone = run(env, "verify", url, "--endpoint-url", store.endpoint, "--scheduler", f"tcp://127.0.0.1:{free_port()}")
    assert gone.returncode == 4, gone.stderr
    assert gone.stderr.startswith(b"sendstream: error: cannot reach the Dask scheduler at tcp://"), gone.stderr
    assert len(gone.stderr.splitlines()) == 1 and gone.stdout == b""
    with dask_cluster(tmp_path / "empty") as cluster:  # a scheduler, and no worker
        lonely = run(env, "verify", url, "--endpoint-url", store.endpoint, "--scheduler", cluster.address)
    assert lonely.returncode == 4 and b"has no worker (none came in 10 s)" in lonely.stderr, lonely.stderr
    stream = run(env, "verify", str(STREAMS[0]), "--scheduler", "tcp://127.0.0.1:8786")
    assert stream.returncode == 2 and b"--scheduler: only for s3://" in stream.stderr, stream.stderr
    place = run(env, "verify", str(tmp_path), "--scheduler", "tcp://127.0.0.1:8786")
    assert place.returncode == 2 and b"--scheduler" in place.stderr, place.stderr
    for nonsense in ("nonsense://x:1", "127.0.0.1:8786", "inproc://x"):
        said = run(env, "verify", url, "--endpoint-url", store.endpoint, "--scheduler", nonsense)
        assert said.returncode == 2 and b"expected tcp://HOST:PORT or tls://HOST:PORT" in said.stderr, said.stderr
        assert len(said.stderr.splitlines()) == 1
