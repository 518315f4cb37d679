"""A TOML settings file (``serve.toml``, ``backup.toml``) read with where each setting is written, so that
every message about a setting names its file and line (TOML parsers give values, not places)."""

from __future__ import annotations

import re
import tomllib
from typing import Any

from ..errors import BadPolicy, ConfigError
from ..retention import Policy, policy

MAX_SIZE = 1 << 20  # of a settings file
RETENTION = ("preserve", "preserve_min", "preserve_day_of_week", "preserve_hour_of_day")

_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4, "p": 5}


def parse_size(text: str) -> int:
    """A size in bytes: ``123456``, ``300M``, ``1.5G``, ``2TiB`` (K, M, G, T are powers of 1024); ValueError
    for anything else (a negative, NaN or infinite number among them)."""
    text = text.strip().lower().removesuffix("b").removesuffix("i")
    unit = text[-1:] if text[-1:].isalpha() else ""
    number = float(text[: len(text) - len(unit)])
    if unit not in _POWERS or not 0 <= number < 1e18:
        raise ValueError(f"not a size: {text!r}")
    return int(number * 1024 ** _POWERS[unit])


class Lines:
    """Where a key is written in the file, for messages."""

    def __init__(self, path: str, text: str) -> None:
        self.path = path
        self.lines = text.splitlines()

    def at(self, table: tuple[str, ...] | None, key: str | None = None) -> str:
        """``FILE:LINE`` of ``key`` in table ``table`` (its parts; top level: None), or of its header."""
        start, end = 0, len(self.lines)
        if table is not None:
            parts = (rf"""(?:{re.escape(p)}|"{re.escape(p)}"|'{re.escape(p)}')""" for p in table)
            head = re.compile(r"\s*\[\s*" + r"\s*\.\s*".join(parts) + r"\s*\]")
            found = next((i for i, line in enumerate(self.lines) if head.match(line)), None)
            if found is None:
                return self.path
            if key is None:
                return f"{self.path}:{found + 1}"
            start = found + 1
        end = next((i for i in range(start, end) if self.lines[i].lstrip().startswith("[")), end)
        pattern = re.compile(rf"\s*{re.escape(key or '')}\s*=")
        for i in range(start, end):
            if key is not None and pattern.match(self.lines[i]):
                return f"{self.path}:{i + 1}"
        return f"{self.path}:{start}" if table is not None else self.path


def read(path: str) -> tuple[dict[str, Any], Lines]:
    """The settings in the TOML file at ``path`` and where each is written; a :class:`ConfigError` naming
    the file (and line) for one that cannot be read, is too large, or is not UTF-8 TOML."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_SIZE + 1)
    except OSError as exc:
        raise ConfigError(path, f"cannot read the configuration: {exc.strerror}") from exc
    if len(raw) > MAX_SIZE:
        raise ConfigError(path, f"larger than {MAX_SIZE} bytes: not a configuration")
    try:
        text = raw.decode("utf-8")
        data = tomllib.loads(text)
    except UnicodeDecodeError as exc:
        raise ConfigError(path, f"not UTF-8 at byte {exc.start}") from None
    except tomllib.TOMLDecodeError as exc:
        line = re.search(r"line (\d+)", str(exc))
        raise ConfigError(f"{path}:{line.group(1)}" if line else path, f"not TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(path, "not TOML: arrays or tables nested too deeply to read") from None
    except ValueError:  # the only one tomllib lets through: int() of a decimal past Python's 4300 digits
        digits = re.search(r"\d[\d_]{4300,}", text)
        where = f"{path}:{text.count(chr(10), 0, digits.start()) + 1}" if digits else path
        raise ConfigError(where, "not TOML: an integer of more than 4300 digits") from None
    return data, Lines(path, text)


def shown(value: Any) -> str:
    """``value`` for a message: its repr, cut short (an integer too long for one, by its size)."""
    if isinstance(value, int) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def retention(table: dict[str, Any], lines: Lines, where: tuple[str, ...] | None) -> Policy | None:
    """The policy of ``table`` (at ``where``): ``preserve`` and the settings that go with it (btrbk's;
    docs/reference/retention.md), or None when it has none."""
    what = ".".join(where) + "." if where else ""
    if "preserve" not in table:
        if given := [key for key in RETENTION if key in table]:
            raise ConfigError(lines.at(where, given[0]), f"{what}{given[0]}: goes with preserve")
        return None
    try:
        return policy(
            table["preserve"],
            table.get("preserve_min"),
            day_of_week=table.get("preserve_day_of_week", "sunday"),
            hour_of_day=table.get("preserve_hour_of_day", 0),
        )
    except BadPolicy as exc:
        raise ConfigError(lines.at(where, exc.setting), f"{what}{exc}") from None


def size(table: dict[str, Any], key: str, lines: Lines, where: tuple[str, ...] | None, example: str) -> int | None:
    """A size setting of ``table``: bytes, or a size with K, M, G, T (powers of 1024); None when not set."""
    value = table.get(key)
    if value is None:
        return None
    try:
        if isinstance(value, bool) or not isinstance(value, int | str):
            raise ValueError(value)
        found = value if isinstance(value, int) else parse_size(value)
        if found <= 0:
            raise ValueError(value)
    except ValueError:
        what = ".".join((*(where or ()), key))
        raise ConfigError(
            lines.at(where, key), f"{what}: expected a size in bytes above 0 ({example}), got {shown(value)}"
        ) from None
    return found
