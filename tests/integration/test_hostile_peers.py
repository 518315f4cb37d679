"""Hostile and broken peers against receive, relay and verify --from-socket, and against send (issue 11, findings 2-5).

Real processes on loopback. While a listener waits, attackers knock: no
key, a wrong key, an unknown identity, another TLS version (openssl
s_client and sendstream send), peers that connect and close, say nothing,
send garbage or malformed hellos, or trickle a hello a byte a second (also
after a good handshake). Every one is refused and named on stderr, no slot
is held past --timeout, and the real sender then succeeds byte-identical.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import threading
import time
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.net import CMD, free_port, key_file, tls_args, wait_listening
from support.proxy import Proxy
from support.streams import FIXTURES, SAMPLE

from sendstream.errors import SessionError, TlsError
from sendstream.transfer.identity import stream_identity
from sendstream.transport import listener, tls

DATA = SAMPLE.read_bytes()
TIMEOUT = 3.0  # --timeout of the listeners: handshake and hello of a new connection (a loaded CI machine: 1.5 cut
LISTEN = ["--timeout", str(TIMEOUT), "--idle-timeout", "10"]  # a good handshake of the tests' own)
MODES = ["none", "tls12-aes128-gcm", "tls13-aes128-gcm", "tls13-aes256-gcm"]
OTHER_VERSION = {
    "tls12-aes128-gcm": "tls13-aes128-gcm",
    "tls13-aes128-gcm": "tls12-aes128-gcm",
    "tls13-aes256-gcm": "tls12-aes256-gcm",
}
HELLO = b"sendstream-session 1 "
MALFORMED_HELLOS = [
    HELLO + b"{bad\n",
    HELLO + b"[1, 2]\n",
    HELLO + b'"x"\n',
    HELLO + b"[" * 50_000 + b"]" * 10 + b"\n",
    HELLO + b"\xff\xfe\n",
    HELLO + json.dumps({"stream": [1]}).encode() + b"\n",
    HELLO + b"x" * (70 << 10),  # no newline within the 64 KiB cap
]

pytestmark = pytest.mark.serial  # listeners with deadlines of 1.5-3 s, a dozen handshakes at once


def skip_unavailable(mode: str) -> None:
    if reason := tls.why_unavailable(mode):
        pytest.skip(reason)


class Peers:
    """Attacking connections: their local ports (for the listener's log), and those held open until :meth:`close`."""

    def __init__(self, port: int, mode: str, key: Path) -> None:
        self.port, self.mode, self.key = port, mode, tls.load_key(key) if mode != "none" else b""
        self.named: dict[int, str] = {}  # local port -> what the listener must say about it (a regex)
        self.held: list[socket.socket] = []
        self.threads: list[threading.Thread] = []
        self._stop = threading.Event()

    def tcp(self, why: str) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=10)
        self.named[sock.getsockname()[1]] = why
        return sock

    def keyed(self, why: str) -> tuple[socket.socket, tls.Channel]:
        """A connection through a good handshake (mode none: plain)."""
        sock = self.tcp(why)
        return sock, tls.connect_channel(sock, self.mode, self.key or None, "sendstream")

    def trickle(self, send: object, data: bytes) -> None:
        """``send(byte)`` a byte a second in a thread, until closed."""

        def run() -> None:
            with contextlib.suppress(Exception):
                for i in range(len(data)):
                    if self._stop.wait(1.0):
                        return
                    send(data[i : i + 1])  # type: ignore[operator]

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        self.threads.append(thread)

    def attack(self) -> None:
        """Every attack of the mode; slow ones stay open."""
        tls_mode = self.mode != "none"
        silent = "TLS handshake timed out" if tls_mode else f"no session hello or btrfs stream within {TIMEOUT:g} s"
        self.tcp("TLS handshake failed" if tls_mode else "the connection ended before").close()
        self.held.append(self.tcp(silent))
        self.tcp("TLS handshake failed" if tls_mode else "neither a session hello nor a btrfs stream").sendall(
            b"GET / HTTP/1.1\r\n\r\n"
        )
        slow = self.tcp("TLS handshake failed" if tls_mode else silent)  # TLS: not a ClientHello
        slow.sendall(b"sendstream-ses")
        self.trickle(slow.send, b"sion 1 {}")
        self.held.append(slow)
        for line in MALFORMED_HELLOS:
            sock, channel = self.keyed("refused: ")
            with contextlib.suppress(OSError, TlsError):
                channel.send_all(line)
            self.held.append(sock)
        if tls_mode:  # after a good handshake: nothing, then a hello a byte a second
            sock, _ = self.keyed(f"no session hello or btrfs stream within {TIMEOUT:g} s")
            self.held.append(sock)
            sock, channel = self.keyed(f"no session hello or btrfs stream within {TIMEOUT:g} s")
            channel.send_all(b"sendstream-ses")
            self.trickle(channel.send_all, b"sion 1 {}")
            self.held.append(sock)

    def tls_failures(self, tmp_path: Path) -> int:
        """Clients without the key, with a wrong one, an unknown identity, another TLS version: how many."""
        if self.mode == "none":
            return 0
        address = f"127.0.0.1:{self.port}"
        wrong = key_file(tmp_path / "wrong.key")
        right = tmp_path / "right.key"
        right.write_bytes(self.key)
        right.chmod(0o600)
        clients = [["openssl", "s_client", "-connect", address]]  # no key at all
        if self.mode != "tls13-aes256-gcm":  # openssl's -psk binds to SHA-256, as these modes do
            version = ["-tls1_3" if self.mode.startswith("tls13") else "-tls1_2"]
            clients += [
                ["openssl", "s_client", "-connect", address, "-psk", wrong.read_bytes().hex(), *version],
                ["openssl", "s_client", "-connect", address, "-psk", self.key.hex(), "-psk_identity", "x", *version],
            ]
        for client in clients:
            result = subprocess.run(client, stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
            assert result.returncode != 0, result.stdout
        attempts = [
            ["--key", str(wrong)],
            ["--key", str(right), "--identity", "nobody"],
            ["--key", str(right), "--tls", OTHER_VERSION[self.mode]],
        ]
        for extra in attempts:
            args = [*CMD, "send", "--to", address, str(SAMPLE), "--tls", self.mode, "--retries", "0", *extra]
            result = subprocess.run(args, capture_output=True, timeout=30)
            assert result.returncode == 6, result.stderr
        return len(clients) + len(attempts)

    def close(self) -> None:
        self._stop.set()
        for thread in self.threads:
            thread.join()
        for sock in self.held:
            sock.close()


@contextlib.contextmanager
def listening(command: list[str], port: int) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_listening(port)
        yield proc
    finally:
        proc.kill()
        proc.wait()


def besieged(command: list[str], port: int, mode: str, key: Path, tmp_path: Path, send_to: int) -> tuple[bytes, bytes]:
    """Run ``command`` (listening on ``port``), attack it, then send the real stream to ``send_to``:
    the listener's stdout and stderr, once every refusal it must log is checked."""
    with listening(command, port) as proc:
        peers = Peers(port, mode, key)
        try:
            peers.attack()
            failures = peers.tls_failures(tmp_path)
            time.sleep(TIMEOUT + 1.0)  # every pending slot is past its deadline
            # pending when the real sender wins (unless the machine is so slow that its deadline passes first)
            late = peers.tcp("another connection opened first|no session hello|TLS handshake timed out")
            sent = subprocess.run(
                [*CMD, "send", "--to", f"127.0.0.1:{send_to}", str(SAMPLE), *tls_args(mode, key)],
                capture_output=True,
                timeout=60,
            )
            out, err = proc.communicate(timeout=60)
            late.close()
        finally:
            peers.close()
    assert sent.returncode == 0 and proc.returncode == 0, (sent.stderr, err)
    text = err.decode()
    assert "Traceback" not in text and "Aborted" not in text, text
    for local, why in peers.named.items():
        line = next((li for li in text.splitlines() if f"connection from 127.0.0.1:{local} refused: " in li), None)
        assert line is not None and re.search(why, line), (local, why, text)
    assert text.count("refused: TLS handshake failed") >= failures + 2 * (mode != "none"), text
    return out, err


@pytest.mark.parametrize("mode", MODES)
def test_receive_outlasts_every_attack(mode: str, key: Path, tmp_path: Path) -> None:
    skip_unavailable(mode)
    port, out = free_port(), tmp_path / "out.stream"
    command = [*CMD, "receive", "--listen", f"127.0.0.1:{port}", "-o", str(out), *tls_args(mode, key), *LISTEN]
    besieged(command, port, mode, key, tmp_path, port)
    assert out.read_bytes() == DATA


@pytest.mark.parametrize("mode", MODES)
def test_verify_from_socket_outlasts_every_attack(mode: str, key: Path, tmp_path: Path) -> None:
    skip_unavailable(mode)
    port = free_port()
    command = [*CMD, "verify", "--from-socket", f"127.0.0.1:{port}", *tls_args(mode, key), *LISTEN]
    out, _ = besieged(command, port, mode, key, tmp_path, port)
    assert out.splitlines()[-1].startswith(b"OK: 1 stream, 505 commands, 280747 bytes"), out


@pytest.mark.parametrize("mode", ["none", "tls13-aes128-gcm", "tls13-aes256-gcm"])
def test_relay_outlasts_every_attack(mode: str, key: Path, tmp_path: Path) -> None:
    skip_unavailable(mode)
    port, relay_port, out = free_port(), free_port(), tmp_path / "out.stream"
    receiver = [*CMD, "receive", "--listen", f"127.0.0.1:{port}", "-o", str(out), "--tls", "none"]
    with listening(receiver, port) as recv:
        leg = [f"--listen-{a[2:]}" if a.startswith("--") else a for a in tls_args(mode, key)]
        relay = [*CMD, "relay", "--listen", f"127.0.0.1:{relay_port}", "--to", f"127.0.0.1:{port}", *leg]
        besieged([*relay, "--to-tls", "none", *LISTEN], relay_port, mode, key, tmp_path, relay_port)
        recv.communicate(timeout=60)
    assert recv.returncode == 0 and out.read_bytes() == DATA


def test_a_peer_that_connects_and_closes_does_not_end_verify() -> None:
    """It used to end `verify --from-socket` with `Aborted!` and exit 130."""
    port = free_port()
    command = [*CMD, "verify", "--from-socket", f"127.0.0.1:{port}", "--tls", "none"]
    with listening(command, port) as proc:
        socket.create_connection(("127.0.0.1", port)).close()
        time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()
        sent = subprocess.run([*CMD, "send", "--to", f"127.0.0.1:{port}", str(SAMPLE), "--tls", "none"])
        out, err = proc.communicate(timeout=60)
    assert sent.returncode == 0 and proc.returncode == 0, err
    assert out.splitlines()[-1].startswith(b"OK") and b"refused: the connection ended before a session hello" in err


@pytest.mark.parametrize("mode", ["none", "tls13-aes128-gcm"])
def test_knocks_during_a_session_neither_stall_nor_supersede_it(mode: str, key: Path, tmp_path: Path) -> None:
    """While a resumable transfer runs (slowed by a proxy), the receiver's reconnect listener refuses every
    attack, a sender of another stream and a plain stream; the transfer goes on without a reconnect."""
    skip_unavailable(mode)
    port, out = free_port(), tmp_path / "out.stream"
    command = [*CMD, "receive", "--listen", f"127.0.0.1:{port}", "-o", str(out), *tls_args(mode, key), *LISTEN]
    proxy = Proxy(port, [], rate=40_000)  # the sample takes about 7 s: the knocks end long before
    with listening(command, port) as proc:
        sender = subprocess.Popen(
            [*CMD, "send", "--resumable", "--to", f"127.0.0.1:{proxy.port}", str(SAMPLE), *tls_args(mode, key)],
            stderr=subprocess.PIPE,
        )
        peers = Peers(port, mode, key)
        try:
            time.sleep(1.0)  # the session runs
            assert sender.poll() is None, "the transfer ended before the attack: slow it down"
            peers.attack()
            other = stream_identity((FIXTURES / "rich-incr-v2.stream").read_bytes()[:65536])
            sock, channel = peers.keyed("refused: a sender of another stream connected")
            channel.send_all(HELLO + json.dumps({"stream": other}).encode() + b"\n")
            peers.held.append(sock)
            sock, channel = peers.keyed("refused: a plain stream cannot join")
            channel.send_all(DATA[:100])
            peers.held.append(sock)
            _, sent_err = sender.communicate(timeout=60)
            _, err = proc.communicate(timeout=60)
        finally:
            peers.close()
            proxy.close()
            sender.kill()
    assert sender.returncode == 0 and proc.returncode == 0, (sent_err, err)
    assert out.read_bytes() == DATA
    assert b"resumed after" not in sent_err, sent_err  # nobody superseded the sender's connection
    text = err.decode()
    assert "Traceback" not in text, text
    for local, why in peers.named.items():
        line = next((li for li in text.splitlines() if f"connection from 127.0.0.1:{local} refused: " in li), None)
        assert line is not None and re.search(why, line), (local, why, text)


# --- the listener's own bounds and log ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "source"),
    [
        (("10.1.2.3", 5000), "10.1.2.3"),
        (("::ffff:10.1.2.3", 5000, 0, 0), "10.1.2.3"),  # IPv4-mapped: the IPv4 host
        (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:db8:1:2::/64"),  # one host commonly holds its /64 whole
        (("2001:db8:1:2:ffff::9", 6000, 0, 0), "2001:db8:1:2::/64"),
        (("fe80::1%lo", 5000, 0, 1), "fe80::/64"),
    ],
)
def test_a_connections_source_is_its_address_or_its_ipv6_64(address: tuple[object, ...], source: str) -> None:
    assert listener.source(address) == source


def test_refusals_not_shown_are_counted_when_their_window_ends(monkeypatch: pytest.MonkeyPatch) -> None:
    """The count of the refusals beyond the burst is logged once its window ends (the clock the test's),
    not at the next refusal, which may come hours later: here all fail at once after the last was accepted."""
    now = [1000.0]
    monkeypatch.setattr(listener, "time", types.SimpleNamespace(monotonic=lambda: now[0], sleep=time.sleep))
    monkeypatch.setattr(listener, "LOG_WINDOW", 1.0)
    knocks = listener.LOG_BURST + 5
    lines: list[str] = []
    counted, opening, fail = threading.Event(), threading.Semaphore(0), threading.Event()

    def log(text: str) -> None:
        lines.append(text)
        if "more connections refused" in text:
            counted.set()

    def refuse(sock: socket.socket, deadline: float) -> None:
        opening.release()
        fail.wait(30)
        raise SessionError("refused by the test")

    with socket.create_server(("127.0.0.1", 0)) as server:
        taker = listener.Listener(server, refuse, lambda item: None, timeout=5.0, log=log)
        taker.serve()
        peers = []
        try:
            for _ in range(knocks):
                peers.append(socket.create_connection(server.getsockname(), timeout=10))
            for _ in range(knocks):
                assert opening.acquire(timeout=30)  # every one accepted: the accept loop has nothing to do
            fail.set()
            for peer in peers:
                assert peer.recv(1) == b""  # closed: its refusal is logged or counted
            assert len(lines) == listener.LOG_BURST, lines
            now[0] += 2.0  # the window ends; nobody knocks again
            assert counted.wait(30), lines
        finally:
            fail.set()
            taker.close()
            for peer in peers:
                peer.close()
    assert lines[-1] == "5 more connections refused within 1 s (not shown)", lines


# --- after the hello: the idle timeout ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["none", "tls13-aes128-gcm"])
@pytest.mark.parametrize("session", [False, True], ids=["raw", "session"])
def test_a_sender_that_stalls_after_its_hello_is_dropped(mode: str, session: bool, key: Path, tmp_path: Path) -> None:
    """The winner stalls mid-stream: the receiver gives up after --idle-timeout (and, in a session, after
    --reconnect-timeout for its return) instead of waiting for ever."""
    skip_unavailable(mode)
    port, out = free_port(), tmp_path / "out"
    command = [*CMD, "receive", "--listen", f"127.0.0.1:{port}", "-o", str(out), *tls_args(mode, key)]
    command += ["--timeout", "5", "--idle-timeout", "1", "--reconnect-timeout", "1"]
    with listening(command, port) as proc:
        sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        channel = tls.connect_channel(sock, mode, tls.load_key(key) if mode != "none" else None, "sendstream")
        if session:
            hello = HELLO + json.dumps({"stream": stream_identity(DATA[:65536])}).encode() + b"\n"
            channel.send_all(hello + b"D" + (1000).to_bytes(4, "big") + DATA[:1000])
        else:
            channel.send_all(DATA[:1000])
        started = time.monotonic()
        _, err = proc.communicate(timeout=30)
        elapsed = time.monotonic() - started
        channel.close()
    assert proc.returncode == 3 and elapsed < 10, (elapsed, err)
    assert b"truncated stream" in err and b"Traceback" not in err, err


# --- the sender against a broken receiver -------------------------------------------------------------------------


@contextlib.contextmanager
def fake_receiver(reply: bytes, *, session: bool) -> Iterator[int]:
    """A receiver on loopback (mode none) that answers ``reply``: to a session's hello, or once the stream ended."""
    server = socket.create_server(("127.0.0.1", 0))
    done = threading.Event()

    def serve() -> None:
        with contextlib.suppress(OSError):
            sock, _ = server.accept()
            with sock:
                if session:
                    sock.makefile("rb").readline()
                else:
                    while sock.recv(65536):
                        pass
                sock.sendall(reply)
                done.wait(10)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1]
    finally:
        done.set()
        server.close()
        thread.join()


BAD_REPLIES = {
    "bad JSON": (True, HELLO + b"{bad\n", b"the receiver's answer is not valid JSON"),
    "a non-integer verified": (True, HELLO + b'{"verified": "x", "resume": 0}\n', b"verified must be an integer"),
    "deep nesting": (True, HELLO + b"[" * 50_000 + b"\n", b"nests JSON 50000 deep"),
    "a superscript status": (True, "sendstream-status ² failed\n".encode(), b"malformed status line"),
    "a superscript status, plain": (False, "sendstream-status ² failed\n".encode(), b"malformed status line"),
    "an unparsable status, plain": (False, b"sendstream-status ok\n", b"malformed status line"),
    "a list for the hello": (
        True,
        b'sendstream-list {"name":"x"}\n',
        b"a snapshot of a list, which a sender of a stream does not ask for",
    ),
}


@pytest.mark.parametrize(("session", "reply", "says"), BAD_REPLIES.values(), ids=BAD_REPLIES.keys())
def test_a_malformed_answer_or_status_fails_the_sender_cleanly(session: bool, reply: bytes, says: bytes) -> None:
    with fake_receiver(reply, session=session) as port:
        extra = ["--resumable", "--retries", "0"] if session else []
        sent = subprocess.run(
            [*CMD, "send", "--to", f"127.0.0.1:{port}", str(SAMPLE), "--tls", "none", *extra],
            capture_output=True,
            timeout=60,
        )
    assert sent.returncode == 4 and says in sent.stderr, sent.stderr
    assert b"Traceback" not in sent.stderr


def test_a_session_answer_to_a_list_request_fails_the_lister_cleanly() -> None:
    with fake_receiver(HELLO + b'{"resume": 0, "verified": 0}\n', session=True) as port:
        listed = subprocess.run(
            [*CMD, "send", "--to", f"127.0.0.1:{port}", "--tls", "none", "--list"], capture_output=True, timeout=60
        )
    assert listed.returncode == 4 and b"Traceback" not in listed.stderr, listed.stderr
    assert b"expected a snapshot of the list or a status: is it sendstream serve?" in listed.stderr, listed.stderr


def test_a_sender_out_of_retries_says_what_continues_the_transfer() -> None:
    """Against serve, sending again with --resumable continues (serve prints no token); against receive, the token."""
    argv = [*CMD, "send", "--to", f"127.0.0.1:{free_port()}", str(SAMPLE), "--tls", "none", "--resumable"]
    sent = subprocess.run([*argv, "--retries", "1", "--retry-delay", "0.01"], capture_output=True, timeout=60)
    text = sent.stderr.decode()
    assert sent.returncode == 4 and "no connection, and 1 more attempt failed" in text, text
    assert "to a sendstream serve, send the stream again with --resumable (the service keeps what it got)" in text
    assert "to a sendstream receive, with `send --resume TOKEN`, the token it prints when it stops" in text


@pytest.mark.parametrize("no_status", [False, True], ids=["sendstream", "no-status"])
@pytest.mark.parametrize("mode", ["none", "tls13-aes128-gcm"])
def test_no_status_is_no_success(mode: str, no_status: bool, key: Path) -> None:
    """A receiver that takes the whole stream and closes without a status: the sender fails (exit 4),
    unless told the receiver is not sendstream (--no-status)."""
    skip_unavailable(mode)
    server = socket.create_server(("127.0.0.1", 0))
    got = bytearray()

    def serve() -> None:
        sock, _ = server.accept()
        sock.settimeout(20)
        channel = tls.accept_channel(sock, mode, tls.load_key(key) if mode != "none" else None)
        buf = bytearray(65536)
        while n := channel.recv_into(buf):
            got.extend(buf[:n])
        channel.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    extra = ["--no-status"] if no_status else []
    with server:
        sent = subprocess.run(
            [*CMD, "send", "--to", f"127.0.0.1:{server.getsockname()[1]}", str(SAMPLE), *tls_args(mode, key), *extra],
            capture_output=True,
            timeout=60,
        )
        thread.join(30)
    assert bytes(got) == DATA
    if no_status:
        assert sent.returncode == 0, sent.stderr
    else:
        assert sent.returncode == 4, sent.stderr
        assert b"the receiver sent no status: the stream may not have been stored" in sent.stderr


@pytest.mark.parametrize("mode", ["none", "tls13-aes128-gcm"])
def test_a_receiver_that_goes_away_mid_stream_fails_the_sender_naming_it(mode: str, key: Path, tmp_path: Path) -> None:
    """A receiver killed mid-stream (the soak's service kill): the sender's next write breaks the pipe (EPIPE)
    or is reset, whichever its status reader did not take first. Either way the sender fails naming the
    receiver; a broken pipe once ended it quietly with exit 0, as if standard output's reader had left."""
    skip_unavailable(mode)
    stream = tmp_path / "long.stream"
    stream.write_bytes(DATA * 30)  # 8.4 MB: more than the sockets' buffers hold once the receiver is gone
    server = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        sock, _ = server.accept()
        sock.settimeout(20)
        channel = tls.accept_channel(sock, mode, tls.load_key(key) if mode != "none" else None)
        got, buf = 0, bytearray(65536)
        while got < 1 << 20:
            got += channel.recv_into(buf)
        sock.close()  # with bytes unread: a reset, and every later write of the sender's a broken pipe

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    port = server.getsockname()[1]
    with server:
        sent = subprocess.run(
            [*CMD, "send", "--to", f"127.0.0.1:{port}", str(stream), *tls_args(mode, key)],
            capture_output=True,
            timeout=60,
        )
        thread.join(30)
    assert sent.returncode == 4, sent.stderr
    said = f"sendstream: error: sending to 127.0.0.1:{port}: the receiver went away before the whole stream was sent ("
    assert said.encode() in sent.stderr, sent.stderr
    assert b"Traceback" not in sent.stderr


# --- a receiver that fails answers, and the sender reports its reason ---------------------------------------------


@pytest.fixture
def full_fs(tmp_path: Path) -> Iterator[Path]:
    """A 64 KiB tmpfs: the 280 KB sample does not fit."""
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    mnt = tmp_path / "full"
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mnt)], check=True)
    try:
        yield mnt
    finally:
        for _ in range(20):  # a receiver that was killed may hold a file there a moment longer
            if subprocess.run(["umount", str(mnt)], capture_output=True).returncode == 0:
                break
            time.sleep(0.25)
        else:
            subprocess.run(["umount", "-l", str(mnt)], check=True)  # never left mounted


@pytest.mark.parametrize(
    ("mode", "session"), [("none", []), ("tls13-aes128-gcm", []), ("tls13-aes128-gcm", ["--resumable"])]
)
def test_a_receiver_on_a_full_file_system_fails_the_sender(
    mode: str, session: list[str], key: Path, full_fs: Path
) -> None:
    """ENOSPC: the receiver answers exit 4 naming the file; the sender exits 4 with that reason."""
    skip_unavailable(mode)
    port, out = free_port(), full_fs / "backup.stream"
    command = [*CMD, "receive", "--listen", f"127.0.0.1:{port}", "-o", str(out), *tls_args(mode, key)]
    with listening(command, port) as proc:
        sent = subprocess.run(
            [*CMD, "send", "--to", f"127.0.0.1:{port}", str(SAMPLE), *tls_args(mode, key), *session],
            capture_output=True,
            timeout=60,
        )
        _, err = proc.communicate(timeout=60)
    named = f"cannot write '{out}".encode()  # the output, or its .part
    assert proc.returncode == 4 and named in err and b"No space left on device" in err, err
    assert sent.returncode == 4, sent.stderr
    assert b"the receiver failed: " in sent.stderr and named in sent.stderr, sent.stderr
    assert not out.exists()
