"""sendstream send / receive / verify --from-socket over loopback, real processes."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest
from support.net import announced, listening, raw_sender, receiver, sender, transfer
from support.streams import SAMPLE, boundaries

from sendstream.transport.tls import why_unavailable

MODES = ["none", "tls12-aes128-gcm", "tls12-aes256-gcm", "tls13-aes128-gcm", "tls13-aes256-gcm"]


@pytest.mark.parametrize("mode", MODES)
def test_send_receive_every_mode(mode: str, key: Path, tmp_path: Path) -> None:
    if reason := why_unavailable(mode):
        pytest.skip(reason)
    out = tmp_path / "out.stream"
    sender, (code, err) = transfer(mode, key, out, SAMPLE.read_bytes())
    assert sender.returncode == 0, sender.stderr
    assert code == 0, err
    assert out.read_bytes() == SAMPLE.read_bytes()
    assert b"sendstream: sent 274 KiB (280,747 bytes) in " in sender.stderr
    if mode == "none":
        assert b"unencrypted" in sender.stderr


@pytest.mark.parametrize(("host", "to"), [("127.0.0.1", "127.0.0.1"), ("[::1]", "[::1]"), ("*", "127.0.0.1")])
def test_a_listener_on_port_0_says_the_port_the_system_gave(host: str, to: str, key: Path) -> None:
    """Port 0: the receiver listens on a free port and says which before it waits; a sender reaches it there."""
    recv = receiver("receive", "--listen", f"{host}:0", "-o", "-", "--key", str(key))
    try:
        port, said = announced(recv)
        assert said == f"sendstream: listening on {host}:{port}\n".encode() and listening(port)
        sent = sender("--to", f"{to}:{port}", str(SAMPLE), "--key", str(key))
        out, _ = recv.communicate(timeout=60)
    finally:
        recv.kill()
    assert sent.returncode == recv.returncode == 0 and out == SAMPLE.read_bytes(), sent.stderr


def test_the_sender_heals_a_restarted_stream(key: Path, tmp_path: Path) -> None:
    data = SAMPLE.read_bytes()
    out = tmp_path / "out.stream"
    sender, (code, _) = transfer("tls13-aes128-gcm", key, out, data[: boundaries(data)[100] + 33] + data)
    assert sender.returncode == 0 and code == 0
    assert out.read_bytes() == data
    assert b"1 restart healed" in sender.stderr


@pytest.mark.parametrize("resumable", [[], ["--resumable"]])
def test_a_damaged_stream_never_leaves_the_sender(key: Path, tmp_path: Path, resumable: list[str]) -> None:
    """Damaged within the first 64 KiB: a resumable sender has not connected yet, and still tells the receiver."""
    data = bytearray(SAMPLE.read_bytes())
    damaged = max(b for b in boundaries(bytes(data)) if b < 60_000)
    data[damaged + 12] ^= 1
    out = tmp_path / "out.stream"
    sender, (code, err) = transfer("tls13-aes128-gcm", key, out, bytes(data), *resumable)
    assert sender.returncode == 1 and b"crc32c mismatch" in sender.stderr
    assert code != 0 and not out.exists() and not list(tmp_path.glob("out.stream.part*"))
    if resumable:
        assert code == 1 and f"the sender gave up: offset {damaged}".encode() in err, err


def test_a_wrong_key_fails_the_sender_and_the_receiver_waits_on(key: Path, tmp_path: Path) -> None:
    """The sender with a wrong key fails (exit 6); the receiver names it and takes the right sender next."""
    other = tmp_path / "other.key"
    other.write_bytes(os.urandom(32))
    other.chmod(0o600)
    out = tmp_path / "o"
    recv = receiver("receive", "--listen", "127.0.0.1:0", "-o", str(out), "--key", str(key))
    port, _ = announced(recv)
    try:
        wrong = sender("--to", f"127.0.0.1:{port}", str(SAMPLE), "--key", str(other))
        assert wrong.returncode == 6 and b"wrong key or identity" in wrong.stderr, wrong.stderr
        assert recv.poll() is None and not out.exists()
        right = sender("--to", f"127.0.0.1:{port}", str(SAMPLE), "--key", str(key))
        _, err = recv.communicate(timeout=60)
    finally:
        recv.kill()
    assert right.returncode == 0 and recv.returncode == 0, (right.stderr, err)
    assert out.read_bytes() == SAMPLE.read_bytes()
    assert (
        b"warning: connection from 127.0.0.1:" in err and b"wrong key or identity (local fingerprint sha256:" in err
    ), err


def test_receiver_writes_only_checked_commands(tmp_path: Path) -> None:
    data = bytearray(SAMPLE.read_bytes())
    marks = boundaries(bytes(data))
    data[marks[60] + 12] ^= 1
    recv = receiver("receive", "--listen", "127.0.0.1:0", "--tls", "none", "-o", "-")
    port, _ = announced(recv)
    raw_sender(port, bytes(data))
    out, err = recv.communicate(timeout=60)
    assert recv.returncode == 1 and b"crc32c mismatch" in err
    assert out == bytes(data[: marks[60]])  # every command before the damaged one, nothing of it


@pytest.mark.parametrize("reset", [False, True])
def test_a_cut_connection_is_truncation(tmp_path: Path, reset: bool) -> None:
    data = SAMPLE.read_bytes()
    out = tmp_path / "out.stream"
    recv = receiver("receive", "--listen", "127.0.0.1:0", "--tls", "none", "-o", str(out))
    port, _ = announced(recv)
    raw_sender(port, data[:100000], reset=reset)
    _, err = recv.communicate(timeout=60)
    assert recv.returncode in (3, 4) and not out.exists(), err


def test_verify_from_socket(key: Path) -> None:
    data = SAMPLE.read_bytes()
    verifier = receiver("verify", "--from-socket", "127.0.0.1:0", "--tls", "none")
    port, _ = announced(verifier)
    raw_sender(port, data)
    out, _ = verifier.communicate(timeout=60)
    assert verifier.returncode == 0 and out.startswith(b"subvol rich_base uuid=")
    assert out.splitlines()[1].startswith(b"OK: 1 stream, 505 commands, 280747 bytes")
    bad = bytearray(data)
    bad[boundaries(data)[7] + 15] ^= 4
    verifier = receiver("verify", "--from-socket", "127.0.0.1:0", "--tls", "none")
    port, _ = announced(verifier)
    raw_sender(port, bytes(bad))
    out, err = verifier.communicate(timeout=60)
    assert verifier.returncode == 1 and b"crc32c mismatch" in err and out.splitlines()[-1].startswith(b"FAILED")


def test_ipv6_and_exec(key: Path, tmp_path: Path) -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    target = tmp_path / "via-child.stream"
    recv = receiver("receive", "--listen", "[::1]:0", "--key", str(key), "--exec", f"sh -c 'cat > {target}'")
    port, _ = announced(recv)
    sent = sender("--to", f"[::1]:{port}", str(SAMPLE), "--key", str(key))
    recv.communicate(timeout=60)
    assert sent.returncode == 0 and recv.returncode == 0
    assert target.read_bytes() == SAMPLE.read_bytes()


def test_a_failing_child_fails_both_sides(key: Path) -> None:
    recv = receiver("receive", "--listen", "127.0.0.1:0", "--key", str(key), "--exec", "sh -c 'cat >/dev/null; exit 3'")
    port, _ = announced(recv)
    sent = sender("--to", f"127.0.0.1:{port}", str(SAMPLE), "--key", str(key))
    _, err = recv.communicate(timeout=60)
    assert recv.returncode == 7 and b"exited with status 3" in err
    assert sent.returncode == 7 and b"the receiver failed" in sent.stderr


@pytest.mark.parametrize("resumable", [False, True])
def test_a_child_that_stops_reading_fails_both_sides(key: Path, resumable: bool) -> None:
    child = "head -c 100"  # reads 100 bytes, exits 0
    recv = receiver("receive", "--listen", "127.0.0.1:0", "--key", str(key), "--exec", child)
    port, _ = announced(recv)
    extra = ["--resumable"] if resumable else []
    sent = sender("--to", f"127.0.0.1:{port}", str(SAMPLE), "--key", str(key), *extra)
    _, err = recv.communicate(timeout=60)
    assert recv.returncode == 7 and b"exited (status 0) before it read the whole stream" in err, err
    assert sent.returncode == 7 and b"before it read the whole stream" in sent.stderr, sent.stderr


def test_addresses_are_checked() -> None:
    for bad in ("nohost", "host:", ":123", "host:99999"):
        assert sender("--to", bad, str(SAMPLE), "--tls", "none").returncode == 2, bad


def test_the_cli_offers_exactly_the_tls_modes() -> None:
    import click

    from sendstream import cli
    from sendstream.transport import tls

    commands = [cli.cli.commands[name] for name in ("send", "receive", "relay")]
    options = [
        p for c in commands for p in c.params if p.name and p.name.endswith("mode") and "--progress" not in p.opts
    ]
    assert len(options) == 4  # send, receive, and each leg of relay
    for option in options:
        assert isinstance(option.type, click.Choice)
        assert tuple(option.type.choices) == tls.MODES and option.default == tls.DEFAULT_MODE
