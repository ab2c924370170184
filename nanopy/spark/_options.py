"""Parsing of the ``.option(...)`` values of the nanopy data source (all strings)."""

from __future__ import annotations

from collections.abc import Mapping


class SourceOptionError(ValueError):
    """A nanopy data source option is missing or invalid."""


def lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in dict(options).items()}


def urls(opts: dict[str, str]) -> list[str]:
    raw = opts.get("urls") or opts.get("url") or ""
    found = [u.strip() for u in raw.split(",") if u.strip()]
    if not found:
        raise SourceOptionError(
            'the nanopy data source needs .option("url", "tcp://host:port") '
            '(or "urls" with a comma-separated list)'
        )
    return found


def choice(opts: dict[str, str], key: str, allowed: tuple[str, ...], default: str) -> str:
    value = opts.get(key.lower(), default).strip().lower()
    if value not in allowed:
        raise SourceOptionError(f"option {key}={value!r}: expected one of {', '.join(allowed)}")
    return value


def integer(opts: dict[str, str], key: str, default: int, minimum: int = 0) -> int:
    raw = opts.get(key.lower())
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SourceOptionError(f"option {key}={raw!r} must be an integer") from None
    if value < minimum:
        raise SourceOptionError(f"option {key}={value} must be >= {minimum}")
    return value


def number(opts: dict[str, str], key: str, default: float, minimum: float = 0.0) -> float:
    raw = opts.get(key.lower())
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SourceOptionError(f"option {key}={raw!r} must be a number") from None
    if value < minimum:
        raise SourceOptionError(f"option {key}={value} must be >= {minimum}")
    return value


def boolean(opts: dict[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key.lower())
    if raw is None or raw == "":
        return default
    value = raw.strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise SourceOptionError(f"option {key}={raw!r} must be true or false")


def topics(opts: dict[str, str]) -> list[bytes]:
    raw = opts.get("subscriptions", opts.get("subscribe", ""))
    return [t.encode() for t in raw.split(",")] if raw != "" else [b""]

