"""Stream lifetimes as the origin states them (PROTOCOL.md §5.1, §5.5)."""

from __future__ import annotations

from datetime import datetime


def parse_ttl_seconds(value: str | None) -> float | None:
    """``Stream-TTL``: a non-negative whole number of seconds, else None."""
    if value is None or not value.strip().isdigit():
        return None
    return float(int(value.strip()))


def parse_expires_at(value: str | None) -> float | None:
    """``Stream-Expires-At`` (RFC 3339) as a POSIX timestamp, else None."""
    if not value:
        return None
    try:
        moment = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    if moment.tzinfo is None:
        return None
    return moment.timestamp()
