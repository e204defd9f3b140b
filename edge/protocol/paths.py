"""Request targets (RFC 9112 §3.2) and the stream each one names.

Rules this module owns:

* A stream is named by the pathname the origin computes for the target. The reference origin
  routes on ``new URL(req.url, base).pathname`` (the WHATWG URL parser), so ``/s/./x``,
  ``/s/a/../x``, ``/s/%2e/x`` and ``/s\\x`` are all the stream ``/s/x``. ``normalise_path`` is
  that parser, cut down to what a pathname depends on; the cache keys on its result.
* The targets the edge accepts: origin-form; absolute-form with an ``http``/``https`` scheme, of
  which only the path and query are used (never the authority: RFC 9112 §3.2.2 lets a server
  accept it, and it must not steer the edge); ``*`` for ``OPTIONS``. Everything else, a fragment,
  or a path whose stream cannot be named exactly, is a ``BadTarget``: a 400 that never reaches
  the origin.
* What goes upstream is the client's own path and query (``Target.upstream``), untouched: the
  origin normalises it as it always does.
* Where matching the origin exactly would need more of the URL standard than a pathname does
  (IPv6 or internationalised hosts in a ``//host/...`` target), the target is refused rather
  than guessed.
* A stream path with a ``__ds`` segment (``names_control``) may name the origin's control API,
  not a stream (PROTOCOL.md 6: subscriptions under ``{stream-url}/__ds/…``, routed before stream
  operations). Which segment is reserved depends on the origin's stream root, which the edge
  does not know (the reference origin reserves ``/v1/stream/__ds``; the Caddy plugin answers
  ``…/__ds/jwks.json`` under any path, on its decoded path), so any segment that is ``__ds``,
  percent-decoded, counts: such a request is only ever relayed, which is exact whatever the
  origin routes it to.

The percent-encode set is the one of the pinned origin's Node.js (20): ``^`` is left as is there
(newer URL standard revisions encode it). ``tests/unit/test_paths.py`` compares with Node.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

# The base URL's scheme: ``http:x`` is then relative, ``https:x`` names an authority.
BASE_SCHEME = "http"
SPECIAL_SCHEMES = frozenset({"http", "https", "ws", "wss", "ftp"})
ABSOLUTE_SCHEMES = frozenset({"http", "https"})

_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.\-]*:")
_ABSOLUTE_FORM = re.compile(r"([A-Za-z][A-Za-z0-9+.\-]*)://([^/?#]*)(.*)\Z", re.DOTALL)
_C0_OR_SPACE = "".join(chr(code) for code in range(0x21))
_SEPARATORS = "/\\"
_AUTHORITY_END = re.compile(r"[/\\?#]")
_PATH_END = re.compile(r"[?#]")
# Path percent-encode set beyond C0 controls and non-ASCII (WHATWG URL, as in Node 20).
_PATH_ENCODED = frozenset(' "#<>?`{}')
_SINGLE_DOT = frozenset({".", "%2e"})
_DOUBLE_DOT = frozenset({"..", ".%2e", "%2e.", "%2e%2e"})
# Forbidden domain code points that are ASCII and printable (controls are checked apart).
_FORBIDDEN_IN_DOMAIN = frozenset(" #%/:<>?@[\\]^|")
_MAX_PORT = 65535
# The reserved segment of the control API (PROTOCOL.md 6).
CONTROL_SEGMENT = "__ds"


class BadTarget(ValueError):
    """A request target the edge will not relay; the message is fixed text for the client."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """A request target, split once where the request enters."""

    # Origin-form path and query exactly as the client sent them: what goes upstream.
    upstream: str
    query: str
    # The stream the origin will route the target to (``normalise_path``).
    stream: str
    # ``OPTIONS *``: about the server, not any stream; answered by the edge.
    asterisk: bool = False


def parse_target(raw: str, method: str) -> Target:
    """Split a request target; ``BadTarget`` for any the edge must refuse."""
    if raw == "*":
        if method.upper() != "OPTIONS":
            raise BadTarget("the * request target is only for OPTIONS")
        return Target(upstream="*", query="", stream="*", asterisk=True)
    if raw.startswith("/"):
        path_qs = raw
    else:
        absolute = _ABSOLUTE_FORM.match(raw)
        if absolute is None:
            raise BadTarget("the request target must be a path or an http(s) URL")
        scheme, authority, rest = absolute.groups()
        if scheme.lower() not in ABSOLUTE_SCHEMES or not authority:
            raise BadTarget("an absolute request target must be an http(s) URL with a host")
        # RFC 9112 §3.2.1: an empty path is sent as "/".
        path_qs = rest if rest.startswith("/") else "/" + rest
    if "#" in path_qs:
        raise BadTarget("a request target cannot carry a fragment")
    path, _, query = path_qs.partition("?")
    return Target(upstream=path_qs, query=query, stream=normalise_path(path))


# How many entries each memo of a pure function keeps (this module's, ``answer_key``,
# ``stream_id``, ``keys_of``). Memos live outside the cache budget and fill with values each seen
# once (a stream's path, a request target, a stream instance's generation), so they grow with
# what was ever seen until full: 1024 entries of each are about 1.6 MiB together; the 4096 to
# 8192 they had were 6.4 MiB, filled over hours of churn (a soak saw it as growth).
MEMO_ENTRIES = 1024


@functools.lru_cache(maxsize=MEMO_ENTRIES)  # a pure function of the path, asked on every request
def normalise_path(raw_path: str) -> str:
    """The pathname of ``new URL(raw_path, "http://host")``: the stream the origin routes to.

    Raises ``BadTarget`` where the origin's parser fails (a malformed ``//host`` prefix), where
    exactness would need a fuller URL parser (IPv6, internationalised hosts, schemes other than
    http(s)), and for a pathname starting ``//``: sent upstream as a path it would read as a host,
    so no edge request could name that stream, and refusing keeps this function idempotent.
    """
    text = raw_path.strip(_C0_OR_SPACE).replace("\t", "").replace("\n", "").replace("\r", "")
    scheme = _SCHEME.match(text)
    if scheme is None:
        pathname = _relative(text)
    else:
        name, rest = scheme.group()[:-1].lower(), text[scheme.end() :]
        if name == BASE_SCHEME:
            pathname = _relative(rest)
        elif name in SPECIAL_SCHEMES:
            pathname = _authority(rest)
        else:
            raise BadTarget("the request target has a scheme the edge does not route")
    if pathname.startswith("//"):
        raise BadTarget("the request target's path starts with an empty segment")
    return pathname


def names_control(stream: str) -> bool:
    """Whether the normalised path ``stream`` may name the origin's control API (a segment that
    is ``__ds``, percent-decoded): never a stream the edge reads or keeps."""
    if CONTROL_SEGMENT not in stream and "%" not in stream:
        return False  # the common case, at the cost of one scan
    return any(
        _percent_decode(segment) == CONTROL_SEGMENT for segment in stream.split("/") if segment
    )


def _relative(text: str) -> str:
    """The WHATWG "relative" and "relative slash" states against an ``http`` base."""
    if not text or text[0] in "?#":
        return "/"  # the base's path
    if text[0] in _SEPARATORS:
        if text[1:2] and text[1] in _SEPARATORS:
            return _authority(text)
        return _path(text[1:])
    return _path(text)  # the base's path, shortened (to nothing), then this path


def _authority(text: str) -> str:
    """Skip the slashes, check the authority as the origin would, return the path after it."""
    text = text.lstrip(_SEPARATORS)
    end = _AUTHORITY_END.search(text)
    cut = end.start() if end else len(text)
    authority, rest = text[:cut], text[cut:]
    at_sign, _, host_port = authority.rpartition("@")
    if (at_sign or "@" in authority) and not host_port:
        raise BadTarget("the request target names an empty host")
    _check_host_port(host_port)
    return _path(rest[1:] if rest[:1] and rest[0] in _SEPARATORS else rest)


def _check_host_port(host_port: str) -> None:
    if host_port.startswith("["):
        raise BadTarget("the request target names an IPv6 host")
    host, _, port = host_port.partition(":")
    if not host:
        raise BadTarget("the request target names an empty host")
    if port and not (port.isascii() and port.isdigit()):
        raise BadTarget("the request target names a malformed port")
    if port and int(port) > _MAX_PORT:
        raise BadTarget("the request target names a malformed port")
    _check_domain(host)


def _check_domain(host: str) -> None:
    """Fail where the origin's host parser fails, for ASCII domains and IPv4 addresses."""
    domain = _percent_decode(host).lower()
    if not domain.isascii() or any(label.startswith("xn--") for label in domain.split(".")):
        # UTS #46 mapping and Punycode checks would be needed to agree with the origin.
        raise BadTarget("the request target names an internationalised host")
    if any(c < " " or c == "\x7f" or c in _FORBIDDEN_IN_DOMAIN for c in domain):
        raise BadTarget("the request target names a malformed host")
    if _ends_in_number(domain) and not _is_ipv4(domain):
        raise BadTarget("the request target names a malformed IPv4 host")


def _percent_decode(text: str) -> str:
    out = bytearray()
    i = 0
    while i < len(text):
        hex_pair = text[i + 1 : i + 3]
        if (
            text[i] == "%"
            and len(hex_pair) == 2
            and all(c in "0123456789abcdefABCDEF" for c in hex_pair)
        ):
            out.append(int(hex_pair, 16))
            i += 3
        else:
            out.extend(text[i].encode("utf-8", "surrogatepass"))
            i += 1
    return out.decode("utf-8", "replace")


def _ipv4_parts(domain: str) -> list[str]:
    parts = domain.split(".")
    if parts[-1] == "" and len(parts) > 1:
        parts.pop()
    return parts


def _ends_in_number(domain: str) -> bool:
    last = _ipv4_parts(domain)[-1]
    if last and last.isascii() and last.isdigit():
        return True
    return _ipv4_number(last) is not None


def _is_ipv4(domain: str) -> bool:
    parts = _ipv4_parts(domain)
    if len(parts) > 4:
        return False
    numbers = [_ipv4_number(part) for part in parts]
    if any(number is None for number in numbers):
        return False
    values = [number for number in numbers if number is not None]
    if any(value > 255 for value in values[:-1]):
        return False
    return values[-1] < 1 << (8 * (5 - len(values)))


def _ipv4_number(part: str) -> int | None:
    if not part:
        return None
    radix = 10
    if part[:2] in ("0x", "0X"):
        part, radix = part[2:], 16
    elif len(part) > 1 and part[0] == "0":
        part, radix = part[1:], 8
    if not part:
        return 0
    digits = "0123456789abcdef"[:radix]
    if not all(c in digits for c in part.lower()):
        return None
    return int(part, radix)


def _path(text: str) -> str:
    """The WHATWG "path" state: segments split on / and \\, dot segments resolved."""
    end = _PATH_END.search(text)
    if end is not None:
        text = text[: end.start()]
    segments: list[str] = []
    pieces = re.split(r"[/\\]", text)
    for index, piece in enumerate(pieces):
        buffer = "".join(_encode(c) for c in piece)
        last = index == len(pieces) - 1
        lowered = buffer.lower()
        if lowered in _DOUBLE_DOT:
            if segments:
                segments.pop()
            if last:
                segments.append("")
        elif lowered in _SINGLE_DOT:
            if last:
                segments.append("")
        else:
            segments.append(buffer)
    return "".join("/" + segment for segment in segments)


def _encode(c: str) -> str:
    if " " < c < "\x7f" and c not in _PATH_ENCODED:
        return c
    if "\ud800" <= c <= "\udfff":
        c = "\ufffd"  # a lone surrogate is not a scalar value; the URL parser replaces it
    return "".join(f"%{byte:02X}" for byte in c.encode("utf-8"))
