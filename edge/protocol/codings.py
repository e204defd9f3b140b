"""Which content codings a request accepts (RFC 9110 §12.5.3).

Rules this module owns:

* gzip is acceptable when ``Accept-Encoding`` names it, or ``*`` when it does not, with a
  non-zero ``q``; an unreadable ``q`` is 0; no header accepts nothing but identity. The fast
  path and the full path ask here (``edge.protocol.answer_key``, the catch-up), so both choose
  the same representation for the same head.
"""

from __future__ import annotations


def accepts_gzip(accept_encoding: str | None) -> bool:
    """Does ``Accept-Encoding`` allow gzip (explicitly, or by ``*``) with a non-zero q?"""
    if not accept_encoding:
        return False
    allowed: dict[str, float] = {}
    for part in accept_encoding.split(","):
        name, _, params = part.strip().partition(";")
        q = 1.0
        params = params.strip()
        if params.startswith("q="):
            try:
                q = float(params[2:])
            except ValueError:
                q = 0.0
        allowed[name.strip().lower()] = q
    if "gzip" in allowed:
        return allowed["gzip"] > 0
    return allowed.get("*", 0.0) > 0
