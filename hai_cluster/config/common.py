"""What every config file shares: the error, the typed reader of a TOML table, paths resolved
against the file's directory."""
from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any


class ConfigError(Exception):
    pass


_TYPES: dict[type, str] = {str: "a string", int: "an integer", float: "a number", bool: "true or false",
                           list: "a list"}


class Section:
    """Reads one TOML table, checking types and refusing keys it does not know."""

    def __init__(self, path: str, where: str, data: Any) -> None:
        if not isinstance(data, dict):
            raise ConfigError(f"{path}: [{where}] must be a table")
        self.path, self.where, self.data = path, where, dict(data)

    def get(self, key: str, typ: type, default: Any) -> Any:
        if key not in self.data:
            return default
        value = self.data.pop(key)
        ok = isinstance(value, typ) and not (typ in (int, float) and isinstance(value, bool))
        if typ is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise ConfigError(f"{self.path}: {self.where}.{key} must be {_TYPES[typ]}, got {value!r}")
        return value

    def strings(self, key: str, default: tuple[str, ...]) -> tuple[str, ...]:
        value = self.get(key, list, None)
        if value is None:
            return default
        if not all(isinstance(v, str) for v in value):
            raise ConfigError(f"{self.path}: {self.where}.{key} must be a list of strings")
        return tuple(value)

    def time_limit(self, key: str) -> int | None:
        """A time limit in sbatch's -t forms ("1-00:00:00", "30:00"; "UNLIMITED": None); absent: None."""
        from ..core.timefmt import parse_time_limit
        text = self.get(key, str, None)
        try:
            return parse_time_limit(text) if text is not None else None
        except ValueError as exc:
            raise ConfigError(f"{self.path}: {self.where}.{key}: {exc}") from None

    def done(self) -> None:
        if self.data:
            raise ConfigError(f"{self.path}: unknown key(s) in [{self.where}]: {', '.join(sorted(self.data))}")


def read_toml(path: str | os.PathLike) -> dict:
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such config file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None


def positive(path: str, key: str, value: float) -> None:
    if value <= 0:
        raise ConfigError(f"{path}: {key} must be positive, got {value}")


def resolve(base: str | os.PathLike, value: str) -> str:
    """Relative paths in a config file are relative to the file's directory."""
    return str((Path(base).parent / value).resolve()) if not os.path.isabs(value) else value
