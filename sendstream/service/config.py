"""The service's configuration: a TOML file that names every client, its key and its place.

::

    listen = "*:7000"
    tls = "tls13-aes128-gcm"        # every client's mode
    max_transfers = 16              # at once, all clients together
    max_per_client = 2
    handshake_timeout = 30          # seconds for the handshake and the first words
    idle_timeout = 600              # seconds without a byte from a sender
    journal_days = 7                # an abandoned transfer's journal goes after this many days (0: never)
    proxy_from = ["10.0.0.5"]       # TCP balancers: a connection from these begins with a PROXY v2 header

    [clients.web1]                  # the name is the client's PSK identity
    key = "keys/web1.key"           # relative to this file's directory
    store = "/srv/streams/web1"     # stream files, each with a JSON manifest (or s3://BUCKET/PREFIX)
    quota = "500G"                  # the most its place may hold: streams, manifests, journals

    [clients.db1]
    key = "keys/db1.key"
    receive = "/mnt/backup/db1"     # btrfs receive into this directory (on btrfs)
    trusted = ["10.1.2.3"]          # may also send unencrypted (--tls none), from these addresses only
    preserve = "14d 10w *m"         # after each transfer keep only this of its place (btrbk's syntax;
    preserve_min = "2d"             # docs/reference/retention.md), by the time in each snapshot's name

Where a client's streams land is decided here, from the identity the TLS
handshake proved (or, unencrypted, from the trusted address the connection
came from), never from anything the client sends. Names are checked
(letters, digits, ``.``, ``_``, ``-``; no leading dot), and no client's
place may hold another's. :func:`load` raises :class:`ConfigError` naming
the file, the line and what was expected.

A trusted IPv4-mapped network (``::ffff:10.0.0.0/104``) is taken as the IPv4
network it maps (``10.0.0.0/8``): a peer's mapped address is taken as IPv4.

``proxy_from`` (addresses or networks, as ``trusted``) names the TCP
balancers (HAProxy's ``send-proxy-v2``) in front of the service: a
connection from one must begin with a PROXY protocol v2 header, and the
client's address it gives is the connection's (its ``trusted`` check, the
log's peer); from any other address no header is read, so no client can
name an address of its choosing.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import itertools
import os
import re
import subprocess
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..archive.store import BucketClient, Location, connect
from ..errors import ConfigError, KeyFileError, UsageError
from ..io.settings import RETENTION, Lines, read, retention, shown, size
from ..retention import Policy
from ..transport.address import Address
from ..transport.tls import MODES
from ..transport.tls.keys import load_key

if TYPE_CHECKING:
    from ..stores.store import Store

IDENTITY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_INTEGERS = {"max_transfers": (1, 4096, 16), "max_per_client": (1, 4096, 2)}
_SECONDS = {"handshake_timeout": (0.1, 3600.0, 30.0), "idle_timeout": (0.0, 86400.0, 600.0)}
_DAYS = {"journal_days": (0.0, 3650.0, 7.0)}
_TOP = {"listen", "tls", "clients", "proxy_from", *_INTEGERS, *_SECONDS, *_DAYS}
_CLIENT = {"key", "store", "receive", "trusted", "quota", *RETENTION}
# (lowest, highest, default) of each number; the manual page of this file shows them
BOUNDS = {**_INTEGERS, **_SECONDS, **_DAYS}
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_BTRFS = "btrfs"
_MAPPED = ipaddress.IPv6Network("::ffff:0:0/96")


@dataclasses.dataclass(frozen=True)
class Client:
    """A client: its identity, its key, and its place: the directory its streams are stored in
    (``receive`` False) or received into by ``btrfs receive`` (``receive`` True), or the bucket
    (``s3://...``) its streams are archived in."""

    identity: str
    key: bytes = dataclasses.field(repr=False)
    place: str
    receive: bool = False
    trusted: tuple[Network, ...] = ()  # where it may connect from without TLS
    quota: int | None = None  # bytes its place may hold (None: no bound)
    preserve: Policy | None = None  # what of its place is kept after each transfer (None: everything)

    @property
    def archive(self) -> bool:
        """Whether its place is a bucket."""
        return self.place.startswith("s3://")

    def store(self, bucket: Callable[[], BucketClient] = connect) -> Store:
        """The store of its place: a bucket (reached through ``bucket()``), a ``btrfs receive`` place or a
        file place."""
        from ..stores.bucket import Bucket
        from ..stores.files import FilePlace
        from ..stores.received import ReceivePlace

        if self.archive:
            return Bucket(self.place, bucket)
        return ReceivePlace(self.place) if self.receive else FilePlace(self.place)


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole service."""

    path: str
    listen: Address
    tls: str
    clients: dict[str, Client]
    max_transfers: int
    max_per_client: int
    handshake_timeout: float
    idle_timeout: float | None  # None: for ever (0 in the file)
    journal_max_age: float | None = None  # seconds an abandoned journal is kept; None: for ever (0 in the file)
    proxy_from: tuple[Network, ...] = ()  # the balancers whose connections begin with a PROXY v2 header

    def key_of(self, identity: str) -> bytes | None:
        """The key of a configured client (None for anyone else): the TLS server's lookup."""
        client = self.clients.get(identity)
        return client.key if client else None

    def trusting(self, address: str) -> Client | None:
        """The client that may send unencrypted from ``address`` (IPv4-mapped IPv6 taken as IPv4), if any."""
        ip = _ip(address)
        if ip is None:
            return None
        return next((c for c in self.clients.values() if any(ip in net for net in c.trusted)), None)

    def balancer(self, address: str) -> bool:
        """Whether ``address`` (IPv4-mapped IPv6 taken as IPv4) is in ``proxy_from``: its connections begin
        with a PROXY protocol v2 header."""
        ip = _ip(address)
        return ip is not None and any(ip in net for net in self.proxy_from)


def _ip(address: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """A peer's address (its IPv6 zone dropped, an IPv4-mapped one as IPv4); None if it is none."""
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    return ip


def load(
    path: str, warn: Callable[[str], object] | None = None, *, file_system: Callable[[str], str] | None = None
) -> Config:
    """Read and check the configuration at ``path``: every key file is read, every place must exist.
    ``file_system`` names the type of the file system a ``receive`` place is on (default: ``stat -f``'s)."""
    data, lines = read(path)
    base = os.path.dirname(os.path.abspath(path))
    for key in data:
        if key not in _TOP:
            known = ", ".join(sorted(_TOP))
            raise ConfigError(lines.at(None, key), f"unknown setting {shown(key)}; expected one of {known}")
    listen = _text(data, "listen", lines, None)
    try:
        address = Address.parse(listen, listen=True, any_port=True)  # the log's "listening" says which port
    except UsageError as exc:
        raise ConfigError(lines.at(None, "listen"), f"listen: {exc}") from None
    tls = data.get("tls", "tls13-aes128-gcm")
    if tls not in MODES or tls == "none":
        modes = ", ".join(m for m in MODES if m != "none")
        raise ConfigError(
            lines.at(None, "tls"),
            f"tls: expected one of {modes}, got {shown(tls)} "
            "(a client may send unencrypted from its trusted addresses)",
        )
    numbers: dict[str, Any] = {}
    for key, (low, high, default) in {**_INTEGERS, **_SECONDS, **_DAYS}.items():
        value = data.get(key, default)
        integer = key in _INTEGERS
        kinds = int if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
            kind = "a whole number" if integer else "days" if key in _DAYS else "seconds"
            raise ConfigError(lines.at(None, key), f"{key}: expected {kind} from {low} to {high}, got {shown(value)}")
        numbers[key] = value
    proxy_from = _networks(data.get("proxy_from", []), lines, None, "proxy_from")
    clients = _clients(data.get("clients"), lines, base, warn, file_system or _file_system)
    return Config(
        path=path,
        listen=address,
        tls=tls,
        clients=clients,
        max_transfers=numbers["max_transfers"],
        max_per_client=numbers["max_per_client"],
        handshake_timeout=float(numbers["handshake_timeout"]),
        idle_timeout=float(numbers["idle_timeout"]) or None,
        journal_max_age=numbers["journal_days"] * 86400.0 or None,
        proxy_from=proxy_from,
    )


def _text(table: dict[str, Any], key: str, lines: Lines, name: str | None) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value or "\0" in value:
        what = f"clients.{name}.{key}" if name else key
        where = lines.at(("clients", name) if name else None, key if key in table else None)
        raise ConfigError(where, f"{what}: expected a non-empty string without NUL, got {shown(value)}")
    return value


def _clients(
    table: Any, lines: Lines, base: str, warn: Callable[[str], object] | None, file_system: Callable[[str], str]
) -> dict[str, Client]:
    if not isinstance(table, dict) or not table:
        raise ConfigError(lines.path, "no clients: add a [clients.NAME] table for each (NAME is its PSK identity)")
    clients: dict[str, Client] = {}
    keys: dict[bytes, tuple[str, str]] = {}  # each key, and the client and file it came from
    for name, settings in table.items():
        where = lines.at(("clients", name))
        if not IDENTITY.fullmatch(name):
            raise ConfigError(
                where,
                f"client name {shown(name)}: expected 1 to 64 letters, digits, '.', '_' or '-', "
                "not starting with '.' or '-' (it names the client's PSK identity and its place)",
            )
        if not isinstance(settings, dict):
            raise ConfigError(where, f"clients.{name}: expected a table with key, and store or receive")
        for key in settings:
            if key not in _CLIENT:
                raise ConfigError(
                    lines.at(("clients", name), key),
                    f"clients.{name}: unknown setting {shown(key)}; expected {', '.join(sorted(_CLIENT))}",
                )
        key_path = os.path.join(base, _text(settings, "key", lines, name))
        try:
            key = load_key(key_path, warn)
        except KeyFileError as exc:
            raise ConfigError(lines.at(("clients", name), "key"), f"clients.{name}.key: {exc}") from None
        if key in keys:
            other, other_path = keys[key]
            same = (
                f"is also clients.{other}'s key file"
                if os.path.realpath(other_path) == os.path.realpath(key_path)
                else f"holds the same key as clients.{other}'s {other_path!r}"
            )
            raise ConfigError(
                lines.at(("clients", name), "key"),
                f"clients.{name}.key: {key_path!r} {same}: each client needs a key of its own "
                "(who holds it could send as either, into either's place)",
            )
        keys[key] = name, key_path
        if ("store" in settings) == ("receive" in settings):
            raise ConfigError(
                lines.at(("clients", name)),
                f"clients.{name}: expected one of store (stream files) or receive "
                "(btrfs receive), not both nor neither",
            )
        kind = "receive" if "receive" in settings else "store"
        place = _text(settings, kind, lines, name)
        trusted = _networks(settings.get("trusted", []), lines, name, "trusted")
        quota = size(settings, "quota", lines, ("clients", name), "500000000000, 500G")
        preserve = retention(settings, lines, ("clients", name))
        if kind == "store" and place.startswith("s3://"):
            try:
                place = Location.parse(place).url()  # the archive (the S3 endpoint and credentials: AWS_*)
            except UsageError as exc:
                raise ConfigError(lines.at(("clients", name), kind), f"clients.{name}.store: {exc}") from None
            if quota is not None:
                raise ConfigError(
                    lines.at(("clients", name), "quota"),
                    f"clients.{name}.quota: only for a directory, not a bucket (the store's own quotas bound those)",
                )
            clients[name] = Client(name, key, place, trusted=trusted, preserve=preserve)
            continue
        place = os.path.realpath(os.path.join(base, place))
        if not os.path.isdir(place):
            raise ConfigError(lines.at(("clients", name), kind), f"clients.{name}.{kind}: {place!r} is not a directory")
        if kind == "receive" and (fs := file_system(place)) != _BTRFS:
            raise ConfigError(
                lines.at(("clients", name), kind), f"clients.{name}.receive: {place!r} is on {fs}, not on btrfs"
            )
        clients[name] = Client(name, key, place, kind == "receive", trusted, quota, preserve)
    _no_overlap(clients, lines)
    _one_client_per_address(clients, lines)
    return clients


def _networks(value: Any, lines: Lines, name: str | None, key: str) -> tuple[Network, ...]:
    """``key`` of client ``name`` (top level: None), ``trusted`` or ``proxy_from``: addresses or networks
    (``10.1.2.3``, ``10.1.0.0/16``, ``fd00::/8``)."""
    where = lines.at(("clients", name) if name else None, key)
    what = f"clients.{name}.{key}" if name else key
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(where, f"{what}: expected a list of addresses or networks, got {shown(value)}")
    networks: list[Network] = []
    for text in value:
        try:
            network = ipaddress.ip_network(text, strict=False)
        except ValueError:
            raise ConfigError(
                where, f"{what}: {shown(text)} is not an address or a network (10.1.2.3, 10.1.0.0/16)"
            ) from None
        if isinstance(network, ipaddress.IPv6Network) and network.subnet_of(_MAPPED):
            mapped = network.network_address.ipv4_mapped
            network = ipaddress.IPv4Network((mapped, network.prefixlen - 96))  # a peer's address is taken so too
        networks.append(network)
    return tuple(networks)


def _one_client_per_address(clients: dict[str, Client], lines: Lines) -> None:
    """An unencrypted connection is its client by its address alone: no address may name two."""
    for a, b in itertools.combinations(clients.values(), 2):
        for x, y in itertools.product(a.trusted, b.trusted):
            if x.version == y.version and x.overlaps(y):
                raise ConfigError(
                    lines.at(("clients", b.identity), "trusted"),
                    f"clients.{b.identity}.trusted {str(y)!r} overlaps clients.{a.identity}.trusted {str(x)!r}: "
                    "an unencrypted connection is told from its address alone",
                )


def _file_system(path: str) -> str:
    """The type of the file system ``path`` is on, as ``stat -f`` names it (``btrfs``), but ext2, ext3 and
    ext4, which share one magic number, as ``ext2/3/4`` (``stat -f`` says ``ext2/ext3`` of all three)."""
    found = subprocess.run(["stat", "-f", "-c", "%T", path], capture_output=True, check=False)
    name = found.stdout.strip().decode("utf-8", "backslashreplace")
    return "ext2/3/4" if name == "ext2/ext3" else name or "an unknown file system"


def _no_overlap(clients: dict[str, Client], lines: Lines) -> None:
    """No client's place is another's, or inside it: one could read or overwrite the other's streams."""
    for a, b in itertools.permutations(clients.values(), 2):
        if b.place == a.place or b.place.startswith(a.place.rstrip("/") + "/"):
            kind_a, kind_b = ("receive" if c.receive else "store" for c in (a, b))
            raise ConfigError(
                lines.at(("clients", b.identity), kind_b),
                f"clients.{b.identity}.{kind_b} {b.place!r} is inside clients.{a.identity}.{kind_a} {a.place!r}: "
                "each client needs a place of its own",
            )
