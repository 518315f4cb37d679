"""``sendstream serve`` behind a real HAProxy (``send-proxy-v2``): the client's own address, from the PROXY v2
header, is the one its ``trusted`` check and the log see; the balancer's health checks (LOCAL headers, then a
reset) leave no line; a connection from the balancer's address without a header is refused with the parser's
reason; a header from anyone else, or with no ``proxy_from`` at all, is never honoured.

The clients are sockets of this process bound to 127.0.0.2 and 127.0.0.3 (the command line cannot choose its
source address), sending a raw stream unencrypted, as a trusted client may; HAProxy reaches the service from
127.0.0.1. A TLS sender through the balancer (the command line) shows the header leaves the handshake whole.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import socket
import struct
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support.balancer import haproxy
from support.net import CMD, free_port, key_file
from support.storing import service
from support.streams import FIXTURES

from sendstream.errors import QuietClose, SessionError
from sendstream.transfer.identity import stream_identity
from sendstream.transfer.stored import stream_name
from sendstream.transport.listener import Listener
from sendstream.transport.proxy import SIGNATURE

FULL = FIXTURES / "rich-full-v2.stream"
INCR = FIXTURES / "rich-incr-v2.stream"
CHECKS = 0.2  # seconds between HAProxy's health checks


def write_config(tmp_path: Path, port: int, top: str) -> Path:
    """serve.toml: ``alpha``, trusted to send unencrypted from 127.0.0.2 only, storing into places/alpha."""
    key_file(tmp_path / "alpha.key")
    (tmp_path / "places" / "alpha").mkdir(parents=True, exist_ok=True)
    config = tmp_path / "serve.toml"
    config.write_text(
        f'listen = "127.0.0.1:{port}"\n{top}\n'
        '[clients.alpha]\nkey = "alpha.key"\nstore = "places/alpha"\ntrusted = ["127.0.0.2"]\n'
    )
    return config


def events(proc: subprocess.Popen[bytes]) -> list[dict[str, Any]]:
    assert proc.stderr is not None and proc.returncode is not None
    return [json.loads(line) for line in proc.stderr.read().decode().splitlines()]


@contextlib.contextmanager
def in_front(tmp_path: Path, service: int) -> Iterator[int]:
    """HAProxy before the service on port ``service``, with the PROXY v2 header and health checks every
    :data:`CHECKS` s; its port, once it has checked the service up."""
    short = Path(tempfile.mkdtemp(prefix="haproxy.", dir="/tmp"))  # a socket's path: at most 107 bytes
    front, stats = free_port(), short / "stats.sock"
    server = f"    server s1 127.0.0.1:{service} send-proxy-v2 check inter {int(CHECKS * 1000)}ms\n"
    try:
        with haproxy(tmp_path, front, server, f"    stats socket {stats} level admin\n") as proc:
            deadline = time.monotonic() + 20
            while (checked := server_stat(stats)).get("check_status") != "L4OK":
                assert time.monotonic() < deadline and proc.poll() is None, (checked, proc.poll())
                time.sleep(0.05)
            yield front
            checked = server_stat(stats)
            assert (checked["status"], checked["chkfail"]) == ("UP", "0"), checked  # it answered every check
    finally:
        shutil.rmtree(short, ignore_errors=True)


def server_stat(stats: Path) -> dict[str, str]:
    """HAProxy's statistics of its server s1 (``show stat`` on its stats socket); {} before it answers."""
    try:
        with socket.socket(socket.AF_UNIX) as sock:
            sock.connect(str(stats))
            sock.sendall(b"show stat\n")
            text = b"".join(iter(lambda: sock.recv(65536), b"")).decode()
    except (FileNotFoundError, ConnectionRefusedError):
        return {}
    head, *rows = text.splitlines()
    names = head.lstrip("# ").split(",")
    return next((dict(zip(names, row.split(","), strict=False)) for row in rows if row.startswith("services,s1,")), {})


def raw_send(port: int, source: str, data: bytes) -> bytes:
    """``data`` as a raw stream, unencrypted, from ``source`` (an address of this host) to ``port``; all the
    service answered before it closed."""
    with socket.create_connection(("127.0.0.1", port), timeout=30, source_address=(source, 0)) as sock:
        with contextlib.suppress(OSError):  # a refused sender may be closed on before all is sent
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)
        answer = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(4096):
                answer += chunk
        return answer


def proxy_header(source: str, source_port: int, destination: str, destination_port: int) -> bytes:
    """A PROXY v2 header of TCP over IPv4, as a balancer sends it, naming ``source``."""
    addresses = (
        socket.inet_aton(source) + socket.inet_aton(destination) + struct.pack("!HH", source_port, destination_port)
    )
    return SIGNATURE + bytes((0x21, 0x11)) + struct.pack("!H", len(addresses)) + addresses


def name_of(stream: Path) -> str:
    return stream_name(stream_identity(stream.read_bytes()[: 64 << 10]))


def refusals(log: list[dict[str, Any]]) -> list[str]:
    return [str(e["reason"]) for e in log if e["event"] == "refused"]


def test_behind_haproxy_the_client_is_its_own_address(tmp_path: Path) -> None:
    port = free_port()
    config = write_config(tmp_path, port, 'proxy_from = ["127.0.0.1"]')
    with service(config, port) as proc, in_front(tmp_path, port) as front:
        trusted = raw_send(front, "127.0.0.2", FULL.read_bytes())
        untrusted = raw_send(front, "127.0.0.3", FULL.read_bytes())
        garbage = raw_send(front, "127.0.0.2", b"GET / HTTP/1.0\r\n\r\n")
        direct = raw_send(port, "127.0.0.1", FULL.read_bytes())  # the balancer's address, without a header
        forged = raw_send(port, "127.0.0.3", proxy_header("127.0.0.2", 5000, "127.0.0.1", port) + FULL.read_bytes())
        argv = [*CMD, "send", "--to", f"127.0.0.1:{front}", str(INCR), "--key", str(tmp_path / "alpha.key")]
        tls = subprocess.run([*argv, "--identity", "alpha", "--progress", "none"], capture_output=True, timeout=120)
        time.sleep(10 * CHECKS)  # ten health checks more, each of them a connection to the service
    log = events(proc)

    assert trusted == b"sendstream-status 0 ok\n", trusted
    assert (tmp_path / "places" / "alpha" / name_of(FULL)).read_bytes() == FULL.read_bytes()
    (stored,) = [e for e in log if e["event"] == "stored" and e["stream"] == name_of(FULL)]
    assert str(stored["peer"]).startswith("127.0.0.2:"), stored
    manifest = json.loads((tmp_path / "places" / "alpha" / f"{name_of(FULL)}.json").read_text())
    assert str(manifest["peer"]).startswith("127.0.0.2:"), manifest

    assert untrusted.startswith(b"sendstream-status 6 refused: unencrypted from 127.0.0.3:"), untrusted
    assert garbage.startswith(b"sendstream-status 4 refused: neither a session hello nor a btrfs stream"), garbage
    assert direct == b"", direct  # closed: no status to a peer that does not speak the balancer's language
    assert forged.startswith(b"sendstream-status 6 refused: unencrypted from 127.0.0.3:"), forged  # not parsed
    assert tls.returncode == 0, tls.stderr
    (sent,) = [e for e in log if e["event"] == "stored" and e["stream"] == name_of(INCR)]
    assert str(sent["peer"]).startswith("127.0.0.1:"), sent  # the command line's own address, through HAProxy

    # exactly four refusals, each logged as its opening ended (in any order): no health check is among them
    lines = refusals(log)
    assert len(lines) == 4, lines

    def one(pattern: str) -> str:
        (line,) = [x for x in lines if re.search(pattern, x)]
        return line

    untrusted_line = one(r"^connection from 127\.0\.0\.1:\d+ refused: unencrypted from 127\.0\.0\.3:")
    garbage_line = one(r"refused: neither a session hello")
    direct_line = one(r"expected a PROXY protocol v2 header")
    forged_line = one(r"^connection from 127\.0\.0\.3:")
    assert "refused: unencrypted from 127.0.0.3:" in untrusted_line, untrusted_line
    assert garbage_line.startswith("connection from 127.0.0.1:"), garbage_line  # the balancer, naming its client
    assert re.search(
        r"refused: neither a session hello .*\(from 127\.0\.0\.2:\d+, through the balancer\)$", garbage_line
    )
    assert direct_line.startswith("connection from 127.0.0.1:"), direct_line
    assert "refused: at byte 0: expected a PROXY protocol v2 header, got bytes 62 74 72 66 73" in direct_line
    assert forged_line.startswith("connection from 127.0.0.3:"), forged_line
    assert "unencrypted from 127.0.0.3:" in forged_line, forged_line


def test_without_proxy_from_a_header_is_not_honoured(tmp_path: Path) -> None:
    """A PROXY header from a client the service was not told is a balancer is bytes of the client's own:
    garbage where a hello or a stream belongs, whatever address it names."""
    port = free_port()
    config = write_config(tmp_path, port, "")
    header = proxy_header("127.0.0.2", 5000, "127.0.0.1", port)
    with service(config, port) as proc:
        garbage = raw_send(port, "127.0.0.2", header + FULL.read_bytes())  # trusted: the header is its stream
        named = raw_send(port, "127.0.0.3", header + FULL.read_bytes())  # names a trusted address: not taken
        plain = raw_send(port, "127.0.0.2", FULL.read_bytes())  # and the service goes on
    log = events(proc)
    assert garbage.startswith(b"sendstream-status 4 refused: neither a session hello nor a btrfs stream"), garbage
    assert b"QUIT" in garbage  # the header's own bytes, shown as what came
    assert named.startswith(b"sendstream-status 6 refused: unencrypted from 127.0.0.3:"), named
    assert plain == b"sendstream-status 0 ok\n", plain
    assert [e["peer"].split(":")[0] for e in log if e["event"] == "stored"] == ["127.0.0.2"]
    failed = [str(e) for e in log if e["event"] in ("failed", "refused")]
    assert len(failed) == 2 and any("127.0.0.3" in line for line in failed), failed


def test_the_listener_closes_a_quiet_opening_unlogged() -> None:
    """An opener's :class:`QuietClose` ends its connection without a "refused" line; any other error logs one."""
    lines: list[str] = []
    opened = threading.Event()

    def open(sock: socket.socket, deadline: float) -> None:
        kind = sock.recv(1)
        opened.set()
        raise QuietClose("a health check") if kind == b"q" else SessionError("garbage")

    with socket.create_server(("127.0.0.1", 0)) as server:
        listener: Listener[None] = Listener(server, open, lambda _: None, timeout=5.0, log=lines.append)
        listener.serve()
        try:
            for kind in (b"q", b"x", b"q"):
                opened.clear()
                with socket.create_connection(server.getsockname()) as sock:
                    sock.sendall(kind)
                    assert sock.recv(1) == b""  # closed by the listener, after its log line if any
                assert opened.is_set()
        finally:
            listener.close()
    assert len(lines) == 1 and lines[0].endswith("refused: garbage"), lines
