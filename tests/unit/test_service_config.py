"""serve.toml's ``proxy_from`` (the TCP balancers whose connections begin with a PROXY v2 header), read as a
client's ``trusted`` is, with the file and line of a wrong one; and the balancer's client's address taken by
the unencrypted check and the opening in its place. The rest of the file's checks run through the command
line in tests/system/test_serve.py."""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.net import key_file
from support.streams import SAMPLE

from sendstream.errors import ConfigError, SessionError
from sendstream.service.config import load
from sendstream.service.openings import unencrypted
from sendstream.session.receiver import open_connection
from sendstream.transport.tls import PlainChannel

CLIENT = '[clients.alpha]\nkey = "alpha.key"\nstore = "places/alpha"\ntrusted = ["192.0.2.7"]\n'


def serve_toml(tmp_path: Path, top: str) -> Path:
    key_file(tmp_path / "alpha.key")
    (tmp_path / "places" / "alpha").mkdir(parents=True, exist_ok=True)
    config = tmp_path / "serve.toml"
    config.write_text(f'listen = "127.0.0.1:7000"\n{top}\n{CLIENT}')
    return config


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    with ours, theirs:
        yield ours, theirs


def test_proxy_from_takes_addresses_and_networks(tmp_path: Path) -> None:
    config = load(
        str(serve_toml(tmp_path, 'proxy_from = ["10.0.0.5", "10.0.1.0/24", "::ffff:10.2.0.0/112", "fd00::/8"]'))
    )
    assert config.proxy_from == tuple(
        map(ipaddress.ip_network, ["10.0.0.5/32", "10.0.1.0/24", "10.2.0.0/16", "fd00::/8"])
    )  # an IPv4-mapped network as the IPv4 network it maps, as trusted takes it
    for address in ("10.0.0.5", "10.0.1.200", "::ffff:10.0.1.7", "10.2.3.4", "fd00::1", "fd00::1%eth0"):
        assert config.balancer(address), address
    for address in ("10.0.0.6", "10.0.2.1", "192.0.2.7", "fe80::1", "", "a local peer"):
        assert not config.balancer(address), address
    assert config.trusting("192.0.2.7") is config.clients["alpha"]  # trusted reads as it did


def test_without_proxy_from_no_address_is_a_balancer(tmp_path: Path) -> None:
    config = load(str(serve_toml(tmp_path, "")))
    assert config.proxy_from == () and not config.balancer("127.0.0.1") and not config.balancer("10.0.0.5")
    assert load(str(serve_toml(tmp_path, "proxy_from = []"))).proxy_from == ()


@pytest.mark.parametrize(
    ("top", "message"),
    [
        (
            'proxy_from = ["10.0.0.5", "lan"]',
            "proxy_from: 'lan' is not an address or a network (10.1.2.3, 10.1.0.0/16)",
        ),
        ('proxy_from = ["10.0.0.0/33"]', "proxy_from: '10.0.0.0/33' is not an address or a network (10.1.2.3, "),
        ('proxy_from = "10.0.0.5"', "proxy_from: expected a list of addresses or networks, got '10.0.0.5'"),
        ("proxy_from = [5]", "proxy_from: expected a list of addresses or networks, got [5]"),
    ],
    ids=["not-an-address", "prefix-too-long", "not-a-list", "not-strings"],
)
def test_a_wrong_proxy_from_names_its_file_and_line(tmp_path: Path, top: str, message: str) -> None:
    config = serve_toml(tmp_path, f"# the balancers\n{top}")
    with pytest.raises(ConfigError) as raised:
        load(str(config))
    assert str(raised.value).startswith(f"{config}:3: {message}")
    assert raised.value.where == f"{config}:3"


def test_unencrypted_trusts_the_address_it_is_given(tmp_path: Path, pair: tuple[socket.socket, socket.socket]) -> None:
    """The balancer's client's address, not the socket's (a socketpair's: none), says who sends unencrypted."""
    config = load(str(serve_toml(tmp_path, 'proxy_from = ["127.0.0.1"]')))
    ours, _ = pair
    channel = unencrypted(ours, config, 1.0, ("192.0.2.7", 40000))
    assert isinstance(channel, PlainChannel) and channel.identity == "alpha"


def test_unencrypted_refuses_an_untrusted_given_address_by_its_name(
    tmp_path: Path, pair: tuple[socket.socket, socket.socket]
) -> None:
    config = load(str(serve_toml(tmp_path, "")))
    ours, theirs = pair
    theirs.shutdown(socket.SHUT_WR)  # nothing to drain
    with pytest.raises(SessionError, match=r"^unencrypted from 192\.0\.2\.8:40000, which no client's trusted"):
        unencrypted(ours, config, 1.0, ("192.0.2.8", 40000))
    assert theirs.recv(4096).startswith(b"sendstream-status 6 refused: unencrypted from 192.0.2.8:40000")


@pytest.mark.parametrize(
    ("peer", "described"), [(("192.0.2.7", 5000), "192.0.2.7:5000"), (("2001:db8::7", 5000), "[2001:db8::7]:5000")]
)
def test_the_opening_names_the_peer_it_is_given(
    tmp_path: Path, pair: tuple[socket.socket, socket.socket], peer: tuple[str, int], described: str
) -> None:
    """The opening's peer (the log's, the manifest's, what a reload checks) is the balancer's client."""
    config = load(str(serve_toml(tmp_path, "")))
    ours, theirs = pair
    theirs.sendall(SAMPLE.read_bytes()[:4096])  # a raw stream's start
    trusted = ("192.0.2.7", 5000)
    opening = open_connection(
        ours,
        lambda sock, seconds: unencrypted(sock, config, seconds, trusted),
        time.monotonic() + 5,
        timeout=5.0,
        idle_timeout=5.0,
        peer=peer,
    )
    assert opening.peer == described and opening.channel.identity == "alpha" and opening.identity is None


def test_without_a_given_peer_the_opening_names_the_sockets(
    tmp_path: Path, pair: tuple[socket.socket, socket.socket]
) -> None:
    config = load(str(serve_toml(tmp_path, "")))
    ours, theirs = pair
    theirs.sendall(SAMPLE.read_bytes()[:4096])
    trusted = ("192.0.2.7", 5000)
    opening = open_connection(
        ours, lambda sock, seconds: unencrypted(sock, config, seconds, trusted), time.monotonic() + 5,
        timeout=5.0, idle_timeout=5.0,
    )  # fmt: skip
    assert opening.peer == "a local peer"  # a socketpair's (AF_UNIX) has no address
