"""The host's backup configuration: a TOML file (``/etc/sendstream/backup.toml`` by default) that names
the subvolumes to back up, where their snapshots go, and the targets each is sent to.

::

    preserve = "14d"                    # the host's snapshots (btrbk's syntax; docs/reference/retention.md)
    preserve_min = "latest"             # with preserve_day_of_week and preserve_hour_of_day

    [subvolumes.home]                   # snapshots are named home.YYYYMMDDTHHMM (local time, as btrbk's)
    path = "/home"
    snapshots = "/snapshots"            # where they go (default: the directory the subvolume is in)
    targets = ["nas", "offsite"]        # default: every target
    preserve = "7d 4w"                  # its own, instead of the file's

    [targets.nas]                       # a sendstream serve, which keeps by its own serve.toml
    service = "backup.example:7000"
    key = "/etc/sendstream/web1.key"    # relative paths are to this file's directory
    identity = "web1"
    warn_after = "2d"                   # backup status exits 11 when its newest is older

    [targets.offsite]                   # an archive in object storage (AWS_* credentials, as the archive's)
    bucket = "s3://backups/web1"
    key = "/etc/sendstream/web1.key"    # signs the resumable upload's state
    encrypt_key = "/etc/sendstream/archive.key"
    endpoint_url = "https://s3.example"
    full_every = "30d"                  # a full stream again after 30 days (or a chain length: 10)
    preserve = "30d 12m"

    [targets.usb]                       # btrfs receive into a directory on btrfs (an external disk)
    receive = "/mnt/usb/web1"
    preserve = "8w"

:func:`load` raises :class:`~sendstream.errors.ConfigError` naming the file, the line and what was expected.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
from collections.abc import Callable
from typing import Any

from ..errors import BadPolicy, ConfigError, KeyFileError, UsageError
from ..io.settings import RETENTION, Lines, read, retention, shown, size
from ..retention import KEEP_ALL, Policy
from ..transport.address import Address
from ..transport.tls import DEFAULT_MODE, MODES
from ..transport.tls.keys import load_key
from .plan import Rotation, age, rotation

DEFAULT_PATH = "/etc/sendstream/backup.toml"
DEFAULT_LOCK = "/run/sendstream-backup.lock"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")  # no dot: a snapshot's name is NAME.YYYYMMDDTHHMM
KINDS = ("service", "bucket", "receive")
_TOP = {"lock", "subvolumes", "targets", *RETENTION}
_SUBVOLUME = {"path", "snapshots", "targets", *RETENTION}
_TARGET = {
    "service": {"service", "key", "identity", "tls", "timeout", "retries", "rate_limit", "warn_after"},
    "bucket": {"bucket", "key", "encrypt_key", "endpoint_url", "retries", "full_every", "warn_after", *RETENTION},
    "receive": {"receive", "full_every", "warn_after", *RETENTION},
}


@dataclasses.dataclass(frozen=True)
class Target:
    """Where snapshots are sent: a service (``place`` HOST:PORT), a bucket (``s3://...``) or a directory that
    ``btrfs receive`` writes into; its keys are read when the file is."""

    name: str
    kind: str
    place: str
    key: bytes | None = dataclasses.field(default=None, repr=False)
    identity: str = ""
    tls: str = DEFAULT_MODE
    timeout: float = 30.0
    rate_limit: int | None = None  # bytes a second at most, to a service
    retries: int = 5
    encrypt_key: bytes | None = dataclasses.field(default=None, repr=False)
    endpoint_url: str | None = None
    full_every: Rotation | None = None
    preserve: Policy | None = None  # what of the target is kept after a run (None: everything)
    warn_after: datetime.timedelta | None = None


@dataclasses.dataclass(frozen=True)
class Subvolume:
    """A subvolume backed up: its snapshots are ``snapshots/NAME.YYYYMMDDTHHMM``, kept by ``preserve``."""

    name: str
    path: str
    snapshots: str
    preserve: Policy
    targets: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole backup of a host."""

    path: str
    lock: str
    subvolumes: dict[str, Subvolume]
    targets: dict[str, Target]


def load(path: str, warn: Callable[[str], object] | None = None) -> Config:
    """Read and check the configuration at ``path``; every key file is read."""
    data, lines = read(path)
    base = os.path.dirname(os.path.abspath(path))
    _known(data, _TOP, lines, None, "")
    top_policy = retention(data, lines, None) or KEEP_ALL
    targets = _targets(data.get("targets"), lines, base, warn)
    subvolumes = _subvolumes(data.get("subvolumes"), lines, base, top_policy, targets)
    lock = os.path.join(base, _text(data, "lock", lines, None, "")) if "lock" in data else DEFAULT_LOCK
    _apart(subvolumes, targets, lines)
    return Config(path, lock, subvolumes, targets)


def _apart(subvolumes: dict[str, Subvolume], targets: dict[str, Target], lines: Lines) -> None:
    """No ``btrfs receive`` target is a subvolume's directory or its snapshots': what it received, and what
    its policy deletes, would be among the host's own."""
    for t in targets.values():
        if t.kind != "receive":
            continue
        place = os.path.realpath(t.place)
        for s in subvolumes.values():
            for what, where in (("path", s.path), ("snapshots", s.snapshots)):
                mine = os.path.realpath(where)
                if place == mine:
                    raise ConfigError(
                        lines.at(("targets", t.name), "receive"),
                        f"targets.{t.name}.receive {t.place!r} is subvolumes.{s.name}.{what}: "
                        "a target needs a place of its own",
                    )


def _known(table: dict[str, Any], known: set[str], lines: Lines, where: tuple[str, ...] | None, what: str) -> None:
    for key in table:
        if key not in known:
            raise ConfigError(
                lines.at(where, key),
                f"{what[:-1] + ': ' if what else ''}unknown setting {shown(key)}; "
                f"expected one of {', '.join(sorted(known))}",
            )


def _text(table: dict[str, Any], key: str, lines: Lines, where: tuple[str, ...] | None, what: str) -> str:
    value = table.get(key)
    if not isinstance(value, str) or not value or "\0" in value:
        raise ConfigError(
            lines.at(where, key if key in table else None),
            f"{what}{key}: expected a non-empty string without NUL, got {shown(value)}",
        )
    return value


def _tables(value: Any, lines: Lines, kind: str, needs: str) -> dict[str, dict[str, Any]]:
    if not isinstance(value, dict) or not value:
        raise ConfigError(lines.path, f"no {kind}: add a [{kind}.NAME] table for each, with {needs}")
    for name, settings in value.items():
        where = lines.at((kind, name))
        if not NAME.fullmatch(name):
            raise ConfigError(
                where, f"{kind} name {shown(name)}: expected 1 to 64 letters, digits, '_' or '-', not starting with '-'"
            )
        if not isinstance(settings, dict):
            raise ConfigError(where, f"{kind}.{name}: expected a table with {needs}")
    return value


def _targets(value: Any, lines: Lines, base: str, warn: Callable[[str], object] | None) -> dict[str, Target]:
    out: dict[str, Target] = {}
    for name, settings in _tables(value, lines, "targets", "one of service, bucket or receive").items():
        where, what = ("targets", name), f"targets.{name}."
        kinds = [k for k in KINDS if k in settings]
        if len(kinds) != 1:
            raise ConfigError(lines.at(where), f"targets.{name}: expected one of service, bucket or receive")
        kind = kinds[0]
        _known(settings, _TARGET[kind], lines, where, what)
        place = _text(settings, kind, lines, where, what)
        fields: dict[str, Any] = {}
        try:
            if kind == "service":
                Address.parse(place)
                fields["identity"] = _text(settings, "identity", lines, where, what)
                fields["tls"] = settings.get("tls", DEFAULT_MODE)
                if fields["tls"] not in MODES or fields["tls"] == "none":
                    raise ConfigError(
                        lines.at(where, "tls"),
                        f"{what}tls: expected one of {', '.join(MODES[1:])}, got {shown(fields['tls'])}",
                    )
                fields["timeout"] = _number(settings, "timeout", lines, where, what, 0.1, 3600.0, 30.0)
                fields["rate_limit"] = size(settings, "rate_limit", lines, where, "30000000, 30M")
            elif kind == "bucket":
                from ..archive.store import Location

                place = Location.parse(place).url()
                if "endpoint_url" in settings:
                    fields["endpoint_url"] = _text(settings, "endpoint_url", lines, where, what)
            else:
                place = os.path.join(base, place)
                if not os.path.isdir(place):
                    raise ConfigError(lines.at(where, kind), f"{what}{kind}: {place!r} is not a directory")
        except UsageError as exc:
            if isinstance(exc, ConfigError):
                raise
            raise ConfigError(lines.at(where, kind), f"{what}{kind}: {exc}") from None
        if kind != "receive":
            fields["retries"] = int(_number(settings, "retries", lines, where, what, 0, 1000, 5, integer=True))
        for key in ("key", "encrypt_key"):
            if key in settings:
                fields[key] = _key(
                    os.path.join(base, _text(settings, key, lines, where, what)), lines, where, key, warn
                )
        if kind == "service" and "key" not in fields:
            raise ConfigError(lines.at(where), f"targets.{name}: a service needs key (and identity)")
        try:
            fields["full_every"] = rotation(settings.get("full_every"))
            if "warn_after" in settings:
                fields["warn_after"] = age(settings["warn_after"], "warn_after")
        except BadPolicy as exc:
            raise ConfigError(lines.at(where, exc.setting), f"{what}{exc}") from None
        fields["preserve"] = retention(settings, lines, where)
        if fields["preserve"] is not None and "encrypt_key" in fields:
            raise ConfigError(
                lines.at(where, "preserve"),
                f"targets.{name}.preserve: a bucket sealed with encrypt_key keeps its snapshots' names sealed, so no "
                "policy can place them by time; keep such a bucket with its store's own lifecycle rules",
            )
        out[name] = Target(name, kind, place, **fields)
    return out


def _number(
    table: dict[str, Any],
    key: str,
    lines: Lines,
    where: tuple[str, ...],
    what: str,
    low: float,
    high: float,
    default: float,
    *,
    integer: bool = False,
) -> float:
    value = table.get(key, default)
    kinds = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not low <= value <= high:
        kind = "a whole number" if integer else "seconds"
        raise ConfigError(
            lines.at(where, key), f"{what}{key}: expected {kind} from {low} to {high}, got {shown(value)}"
        )
    return float(value)


def _key(path: str, lines: Lines, where: tuple[str, ...], key: str, warn: Callable[[str], object] | None) -> bytes:
    try:
        return load_key(path, warn)
    except KeyFileError as exc:
        raise ConfigError(lines.at(where, key), f"{'.'.join(where)}.{key}: {exc}") from None


def _subvolumes(
    value: Any, lines: Lines, base: str, top_policy: Policy, targets: dict[str, Target]
) -> dict[str, Subvolume]:
    out: dict[str, Subvolume] = {}
    for name, settings in _tables(value, lines, "subvolumes", "its path").items():
        where, what = ("subvolumes", name), f"subvolumes.{name}."
        _known(settings, _SUBVOLUME, lines, where, what)
        path = os.path.abspath(os.path.join(base, _text(settings, "path", lines, where, what)))
        if not os.path.isdir(path):
            raise ConfigError(lines.at(where, "path"), f"{what}path: {path!r} is not a directory")
        snapshots = os.path.dirname(path)
        if "snapshots" in settings:
            snapshots = os.path.abspath(os.path.join(base, _text(settings, "snapshots", lines, where, what)))
            if not os.path.isdir(snapshots):
                raise ConfigError(lines.at(where, "snapshots"), f"{what}snapshots: {snapshots!r} is not a directory")
        chosen = settings.get("targets", list(targets))
        if not isinstance(chosen, list) or not all(isinstance(t, str) for t in chosen):
            raise ConfigError(lines.at(where, "targets"), f"{what}targets: expected a list of target names")
        if unknown := [t for t in chosen if t not in targets]:
            raise ConfigError(
                lines.at(where, "targets"),
                f"{what}targets: no target is called {shown(unknown[0])}; the targets are {', '.join(targets)}",
            )
        own = retention(settings, lines, where)
        out[name] = Subvolume(name, path, snapshots, own or top_policy, tuple(dict.fromkeys(chosen)))
    return out
