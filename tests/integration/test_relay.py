"""sendstream relay between a sender and a receiver, real processes over loopback.

Each leg has its own TLS mode and key; the relay checks and heals every
command, reports the receiver's result back to the sender, and resumes on
both legs through the fault-injecting proxy of ``support.proxy``.
"""

from __future__ import annotations

import hashlib
import os
import random
import select
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest
from support.net import CMD, announced, free_port, key_file, listening, raw_sender, sender, tls_args
from support.proxy import RECEIVER, SEED, SENDER, Proxy, plan
from support.streams import SAMPLE, boundaries

from sendstream.transport.tls import why_unavailable

DATA = SAMPLE.read_bytes()
# A sender that got the status and lost the connection before confirming it never comes back:
# do not wait the default minute for it (as support.proxy's RECEIVER).
LINGER = ["--reconnect-timeout", "4"]


@pytest.fixture
def other_key(tmp_path: Path) -> Path:
    """A second key: the legs do not share one."""
    return key_file(tmp_path / "other.key")


def leg(name: str, mode: str, key: Path) -> list[str]:
    """--NAME-tls MODE [--NAME-key KEY]."""
    return [f"--{name}-{arg[2:]}" if arg.startswith("--") else arg for arg in tls_args(mode, key)]


def wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 10
    while not listening(port):
        assert proc.poll() is None and time.monotonic() < deadline, f"nothing listens on port {port}"
        time.sleep(0.02)


class Relay:
    """A receiver (``receive ARGS``) and ``relay ARGS`` into it, as processes; with ``faults``
    through a :class:`~support.proxy.Proxy` that suffers them."""

    def __init__(
        self,
        receive: list[str],
        relay: list[str],
        faults: list[tuple[Any, ...]] | None = None,
        *,
        terminal: int | None = None,
    ) -> None:
        self.received = tempfile.TemporaryFile()  # noqa: SIM115 (a pipe would fill and block the receiver)
        self.receiver = subprocess.Popen(
            [*CMD, "receive", "--listen", "127.0.0.1:0", *receive], stdout=self.received, stderr=subprocess.PIPE
        )
        self.receiver_port, self._receiver_said = announced(self.receiver)
        self.proxy = Proxy(self.receiver_port, faults) if faults is not None else None
        to = self.proxy.port if self.proxy else self.receiver_port
        # on a terminal, its stderr, it listens once given its passwords, on a port chosen here
        self.port = free_port() if terminal else 0
        self.relay = subprocess.Popen(
            [*CMD, "relay", "--listen", f"127.0.0.1:{self.port}", "--to", f"127.0.0.1:{to}", *relay],
            stdin=terminal,
            stderr=terminal or subprocess.PIPE,
            start_new_session=terminal is not None,  # getpass then asks on stdin, the terminal
        )
        self._relay_said = b""
        if terminal is None:
            self.port, self._relay_said = announced(self.relay)

    def finish(self) -> tuple[int, bytes, int, bytes, bytes]:
        """Relay exit code and stderr; receiver exit code, stdout and stderr."""
        try:
            _, relay_err = self.relay.communicate(timeout=60)
            _, err = self.receiver.communicate(timeout=60)
            self.received.seek(0)
            out = self.received.read()
        finally:
            self.relay.kill()
            self.receiver.kill()
            if self.proxy:
                self.proxy.close()
            self.received.close()
        relay_err = self._relay_said + (relay_err or b"")
        return self.relay.returncode, relay_err, self.receiver.returncode, out, self._receiver_said + err


@pytest.mark.parametrize(
    ("upstream", "downstream"),
    [
        ("tls13-aes128-gcm", "tls12-aes256-gcm"),
        ("none", "tls13-aes128-gcm"),
        ("tls12-aes128-gcm", "none"),
        ("tls13-aes256-gcm", "tls13-aes128-gcm"),
    ],
)
def test_each_leg_its_own_mode_and_key(upstream: str, downstream: str, key: Path, other_key: Path) -> None:
    """Re-encrypt, change mode, rotate keys: the stream arrives byte-identical."""
    if reason := why_unavailable(upstream):
        pytest.skip(reason)
    relay = Relay(
        ["-o", "-", *tls_args(downstream, other_key)],
        [*leg("listen", upstream, key), *leg("to", downstream, other_key), "-v"],
    )
    sent = sender("--to", f"127.0.0.1:{relay.port}", str(SAMPLE), *tls_args(upstream, key))
    code, relay_err, recv_code, out, recv_err = relay.finish()
    assert sent.returncode == 0 and code == 0 and recv_code == 0, (sent.stderr, relay_err, recv_err)
    assert out == DATA
    assert f"upstream: {upstream}".encode() in relay_err and f"downstream: {downstream}".encode() in relay_err
    assert b"relayed 274 KiB (280,747 bytes) in " in relay_err


def test_a_key_of_the_other_leg_is_refused(key: Path, other_key: Path) -> None:
    """The sender's key is the upstream one only: with the downstream key it fails its handshake, and the
    relay names it and waits on for the right sender."""
    relay = Relay(["-o", "-", "--key", str(other_key)], ["--listen-key", str(key), "--to-key", str(other_key)])
    wrong = sender("--to", f"127.0.0.1:{relay.port}", str(SAMPLE), "--key", str(other_key))
    assert wrong.returncode == 6, wrong.stderr
    assert relay.relay.poll() is None
    right = sender("--to", f"127.0.0.1:{relay.port}", str(SAMPLE), "--key", str(key))
    code, relay_err, recv_code, out, _ = relay.finish()
    assert right.returncode == 0 and code == 0 and recv_code == 0, (right.stderr, relay_err)
    assert b"warning: upstream: connection from 127.0.0.1:" in relay_err and b"wrong key or identity" in relay_err
    assert out == DATA


def test_a_password_is_asked_per_leg(tmp_path: Path) -> None:
    """Without key files the relay asks on its terminal for the sender's leg's password, then the receiver's."""
    from sendstream.transport.tls import derive_key

    up, down = tmp_path / "up.key", tmp_path / "down.key"
    for path, password in ((up, "in secret"), (down, "out secret")):
        path.write_bytes(derive_key(password, "sendstream"))
        path.chmod(0o600)
    master, terminal = os.openpty()
    relay = Relay(["-o", "-", "--key", str(down)], [], terminal=terminal)
    try:
        os.close(terminal)
        for prompt, answer in (
            (b"password for 'sendstream' (--listen): ", b"in secret\n"),
            (b"(--to): ", b"out secret\n"),
        ):
            shown = b""
            while prompt not in shown:
                assert select.select([master], [], [], 10)[0], f"no {prompt!r} on the terminal, only {shown!r}"
                shown += os.read(master, 1024)
            os.write(master, answer)
        wait_listening(relay.port, relay.relay)
        sent = sender("--to", f"127.0.0.1:{relay.port}", str(SAMPLE), "--key", str(up))
        code, _, recv_code, out, recv_err = relay.finish()
    finally:
        os.close(master)
        relay.relay.kill()
        relay.receiver.kill()
    assert sent.returncode == 0 and code == 0 and recv_code == 0, (sent.stderr, recv_err)
    assert out == DATA


def test_addresses_are_checked_before_anything_else() -> None:
    """As send and receive: HOST:PORT, and every address ('*') only where the relay listens."""
    for addresses, why in (
        (["--listen", "nohost", "--to", "127.0.0.1:1"], b"expected HOST:PORT, got 'nohost'"),
        (["--listen", "127.0.0.1:\u00b2", "--to", "127.0.0.1:1"], "got '127.0.0.1:\u00b2'".encode()),
        (["--listen", "127.0.0.1:1", "--to", "*:7000"], b"'*' only makes sense with --listen"),
    ):
        result = subprocess.run(
            [*CMD, "relay", *addresses, "--listen-tls", "none", "--to-tls", "none"], capture_output=True
        )
        assert result.returncode == 2 and why in result.stderr, result.stderr


def test_the_relay_heals_a_restarted_stream(key: Path) -> None:
    """A restarted `btrfs send` straight into the relay (no sendstream sender): the receiver gets the clean stream."""
    relay = Relay(["-o", "-", "--key", str(key)], ["--listen-tls", "none", "--to-key", str(key)])
    raw_sender(relay.port, DATA[: boundaries(DATA)[100] + 33] + DATA)
    code, relay_err, recv_code, out, recv_err = relay.finish()
    assert code == 0 and recv_code == 0, (relay_err, recv_err)
    assert out == DATA
    assert b"1 restart healed" in relay_err


@pytest.mark.parametrize("resumable", [False, True], ids=["plain", "resumable"])
def test_a_corrupt_stream_stops_at_the_relay(key: Path, resumable: bool) -> None:
    """Only commands before the damaged one go downstream; the error names its offset; both ends fail."""
    damaged = bytearray(DATA)
    bad = boundaries(DATA)[60]
    damaged[bad + 12] ^= 1
    relay = Relay(
        ["-o", "-", "--key", str(key)],
        ["--listen-tls", "none", "--to-key", str(key), *(["--resumable"] if resumable else [])],
    )
    raw_sender(relay.port, bytes(damaged))
    code, relay_err, recv_code, out, recv_err = relay.finish()
    assert code == 1 and f"offset {bad}, command #59 (chown)".encode() in relay_err and b"crc32c mismatch" in relay_err
    assert recv_code != 0, recv_err
    assert out == DATA[:bad]  # every command before the damaged one, nothing of it


@pytest.mark.parametrize("resumable", [False, True], ids=["plain", "resumable"])
def test_a_failing_receiver_fails_the_relay_and_the_sender(key: Path, other_key: Path, resumable: bool) -> None:
    """The receiver's failure, with its message and exit code, goes back through the relay to the sender."""
    session = ["--resumable"] if resumable else []
    relay = Relay(
        ["--key", str(other_key), "--exec", "sh -c 'cat >/dev/null; exit 3'"],
        ["--listen-key", str(key), "--to-key", str(other_key), *session],
    )
    sent = sender("--to", f"127.0.0.1:{relay.port}", str(SAMPLE), "--key", str(key), *session)
    code, relay_err, recv_code, _, recv_err = relay.finish()
    assert recv_code == 7 and b"exited with status 3" in recv_err
    assert code == 7 and b'downstream: the receiver failed: "sh -c' in relay_err
    assert sent.returncode == 7 and b"exited with status 3" in sent.stderr, sent.stderr


def test_an_unreachable_receiver_is_reported_to_the_sender(key: Path) -> None:
    """The relay fails before it reads the stream; the sender still hears why."""
    port, nobody = free_port(), free_port()
    keys = ["--listen-key", str(key), "--to-key", str(key)]
    relay = subprocess.Popen(
        [*CMD, "relay", "--listen", f"127.0.0.1:{port}", "--to", f"127.0.0.1:{nobody}", *keys, "--retries", "0"],
        stderr=subprocess.PIPE,
    )
    try:
        wait_listening(port, relay)
        sent = subprocess.run(
            [*CMD, "send", "--to", f"127.0.0.1:{port}", str(SAMPLE), "--key", str(key)], capture_output=True
        )
        _, err = relay.communicate(timeout=60)
    finally:
        relay.kill()
    assert (
        relay.returncode == 4
        and b"error: downstream: connecting to 127.0.0.1:" in err
        and b": connection refused" in err
    ), err
    assert sent.returncode == 4, sent.stderr
    assert b"the receiver failed: downstream: connecting to 127.0.0.1:" in sent.stderr


def test_resumable_on_both_legs_through_cuts(key: Path, other_key: Path, tmp_path: Path) -> None:
    """Seeded cuts and stalls on each leg; every transfer ends sha256-identical."""
    rng = random.Random(SEED)
    sha = hashlib.sha256(DATA).hexdigest()
    cuts = {"upstream": 0, "downstream": 0}
    legs = [("tls13-aes128-gcm", "tls12-aes128-gcm"), ("none", "tls13-aes128-gcm"), ("tls12-aes256-gcm", "none")]
    for i, (upstream, downstream) in enumerate(legs * 2):
        out = tmp_path / f"out-{i}.stream"
        relay = Relay(
            ["-o", str(out), "-v", *tls_args(downstream, other_key), *RECEIVER],
            [*leg("listen", upstream, key), *leg("to", downstream, other_key), "--resumable", "-v", *SENDER, *LINGER],
            plan(rng, 6, downstream),
        )
        into_relay = Proxy(relay.port, plan(rng, 6, upstream))
        send_args = ["-v", *SENDER, *tls_args(upstream, key)]
        try:
            sent = subprocess.run(
                [*CMD, "send", "--resumable", "--to", f"127.0.0.1:{into_relay.port}", str(SAMPLE), *send_args],
                capture_output=True,
                timeout=90,
            )
        finally:
            into_relay.close()
        code, relay_err, recv_code, _, recv_err = relay.finish()
        context = f"transfer {i} ({upstream} -> {downstream}, seed {SEED}): {sent.stderr!r} {relay_err!r} {recv_err!r}"
        assert sent.returncode == 0 and code == 0 and recv_code == 0, context
        assert hashlib.sha256(out.read_bytes()).hexdigest() == sha, context
        assert relay.proxy is not None
        cuts["upstream"] += into_relay.cuts
        cuts["downstream"] += relay.proxy.cuts
    print(f"cuts per leg: {cuts}, all resumed")
    assert min(cuts.values()) >= 10, cuts
