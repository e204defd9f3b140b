"""A stream is the pathname the origin's URL parser gives; targets the edge refuses are refused."""

from __future__ import annotations

import json
import random
import shutil
import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st

from edge.protocol.paths import BadTarget, Target, normalise_path, parse_target

# The reference origin routes on this (deploy/origin: `handleRequest`).
NODE_PATHNAMES = """
const out = [];
for (const target of JSON.parse(require("fs").readFileSync(0, "utf8"))) {
  try { out.push(new URL(target, "http://origin").pathname); } catch { out.push(null); }
}
console.log(JSON.stringify(out));
"""

# (target, pathname); None where the origin's parser fails.
TABLE: list[tuple[str, str | None]] = [
    ("/v1/stream/x", "/v1/stream/x"),
    ("/v1/stream/./x", "/v1/stream/x"),
    ("/v1/stream/a/../x", "/v1/stream/x"),
    ("/a/./b/%2e%2E/c", "/a/c"),
    ("/v1/stream/%2e/x", "/v1/stream/x"),
    ("/v1/stream/x/.%2E/y", "/v1/stream/y"),
    ("/v1/stream/x/%2e./y", "/v1/stream/y"),
    ("/v1/stream/x/.", "/v1/stream/x/"),
    ("/v1/stream/x/..", "/v1/stream/"),
    ("/v1/stream/x/...", "/v1/stream/x/..."),
    ("/v1\\stream\\x", "/v1/stream/x"),
    ("/a\\..\\b", "/b"),
    ("/v1/stream/%2f/x", "/v1/stream/%2f/x"),
    ("/v1/stream/%7e/%7E", "/v1/stream/%7e/%7E"),
    ("/v1/stream/%zz", "/v1/stream/%zz"),
    ("/v1/stream/a b", "/v1/stream/a%20b"),
    ('/a^b`c{d}|e"f<g>h', "/a^b%60c%7Bd%7D|e%22f%3Cg%3Eh"),
    ("/~!$&'()*+,;=:@-._/", "/~!$&'()*+,;=:@-._/"),
    ("/caf\u00e9", "/caf%C3%A9"),
    ("/a\tb", "/ab"),
    (" /a ", "/a"),
    ("/a?b#c", "/a"),
    ("/a#b?c", "/a"),
    ("/", "/"),
    ("/..", "/"),
    ("/../..", "/"),
    ("/./", "/"),
    ("?x", "/"),
    ("x/y", "/x/y"),
    # A target starting with two slashes names a host first; the path follows it.
    ("//v1/stream/x", "/stream/x"),
    ("/\\v1/x", "/x"),
    ("\\\\a\\b", "/b"),
    ("//h/./..", "/"),
    ("//h:/x", "/x"),
    ("//@h/x", "/x"),
    ("//u:p@h:8080/x", "/x"),
    ("//A.B./x", "/x"),
    ("//a_b*c/x", "/x"),
    ("//0x/x", "/x"),
    ("//0x1g/x", "/x"),
    ("//1.0x10.3/x", "/x"),
    ("//4294967295/x", "/x"),
    ("//%31.2.3.4/x", "/x"),
    ("//h?x", "/"),
    ("//u@/x", None),
    ("//h@/x", None),
    ("//:80/x", None),
    ("//h:99999/x", None),
    ("//h:8a/x", None),
    ("//1.2.3.999/x", None),
    ("//1.2.3.4.5/x", None),
    ("//4294967296/x", None),
    ("//09/x", None),
    ("//1..2/x", None),
    ("//xn--a/x", None),
    ("//a%2fb/x", None),
    ("//%/x", None),
    ("//a b/x", None),
    ("//?x", None),
    # Schemes: http is the base's, so "http:x" is relative; any other names a host.
    ("http:x", "/x"),
    ("http:/\\x/y", "/y"),
    ("HtTp://h/x", "/x"),
    ("https:x", "/"),
    ("ftp://h/x", "/x"),
]

# Where the origin has an answer but the edge refuses rather than risk naming another stream.
REFUSED_THOUGH_THE_ORIGIN_PARSES = [
    "/a/..//x",  # pathname //x: sent as a path, the origin would read a host
    "//[::1]/x",  # IPv6 host
    "//caf\u00e9/x",  # internationalised host
    "mailto:x",  # not an http(s) URL
    "file:///x",
]


def node_pathnames(targets: list[str]) -> list[str | None]:
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is not installed")
    done = subprocess.run(
        [node, "-e", NODE_PATHNAMES],
        input=json.dumps(targets),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    pathnames: list[str | None] = json.loads(done.stdout)
    return pathnames


def ours(target: str) -> str | None:
    try:
        return normalise_path(target)
    except BadTarget:
        return None


@pytest.mark.parametrize(("target", "pathname"), TABLE)
def test_pathname(target: str, pathname: str | None) -> None:
    assert ours(target) == pathname


def test_the_table_is_what_node_says() -> None:
    targets = [target for target, _ in TABLE] + REFUSED_THOUGH_THE_ORIGIN_PARSES
    expected = [pathname for _, pathname in TABLE]
    node = node_pathnames(targets)
    assert node[: len(TABLE)] == expected
    assert all(pathname is not None for pathname in node[len(TABLE) :])
    assert [ours(target) for target in REFUSED_THOUGH_THE_ORIGIN_PARSES] == [None] * len(
        REFUSED_THOUGH_THE_ORIGIN_PARSES
    )


def test_random_tricky_targets_agree_with_node_or_are_refused() -> None:
    """Thousands of targets built from the pieces parsers disagree on; wherever the edge names a
    stream, it is the origin's."""
    rng = random.Random(20240601)
    pieces = [
        *("/", "\\", ".", "..", "%2e", "%2E", "%2f", "%41", "%", "?", "#", "@", ":", "[", "]"),
        *("a", "B", "0x", "1", "9", "255", "65536", "xn--", "-", "_", "~", " ", "\t", "^", "`"),
        *("{", "|", '"', "\u00e9", "\x00", "\x7f", "http:", "https:", "//"),
    ]
    targets = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 12))) for _ in range(5000)]
    disagreements = [
        (target, mine, theirs)
        for target, theirs in zip(targets, node_pathnames(targets), strict=True)
        if (mine := ours(target)) is not None and mine != theirs
    ]
    assert disagreements == []


path_pieces = st.lists(
    st.sampled_from(["/", "\\", ".", "%2e", "%2E", "a", "b", "%", "?", "#", " ", "\u00e9"]),
    max_size=30,
)


@given(st.one_of(path_pieces.map(lambda pieces: "/" + "".join(pieces)), st.text()))
def test_normalising_is_idempotent_and_leaves_no_dot_segments(target: str) -> None:
    try:
        once = normalise_path(target)
    except BadTarget:
        return
    assert normalise_path(once) == once
    assert once.startswith("/")
    assert not once.startswith("//")
    segments = once.split("/")[1:]
    assert not {".", ".."} & {segment.lower().replace("%2e", ".") for segment in segments}
    assert "/./" not in once + "/"
    assert "/../" not in once + "/"


def test_origin_form_keeps_the_path_and_query_as_sent() -> None:
    assert parse_target("/v1/stream/./x?offset=-1&live=sse", "GET") == Target(
        upstream="/v1/stream/./x?offset=-1&live=sse",
        query="offset=-1&live=sse",
        stream="/v1/stream/x",
    )


@pytest.mark.parametrize(
    ("raw", "upstream", "query", "stream"),
    [
        ("http://evil.example/v1/s/x?offset=-1", "/v1/s/x?offset=-1", "offset=-1", "/v1/s/x"),
        ("HTTPS://h:8443/a/../b", "/a/../b", "", "/b"),
        ("http://h", "/", "", "/"),
        ("http://h?offset=1", "/?offset=1", "offset=1", "/"),
        ("http://u@h//v1/x", "//v1/x", "", "/x"),
    ],
)
def test_absolute_form_uses_only_path_and_query(
    raw: str, upstream: str, query: str, stream: str
) -> None:
    assert parse_target(raw, "GET") == Target(upstream=upstream, query=query, stream=stream)


def test_asterisk_is_only_for_options() -> None:
    assert parse_target("*", "OPTIONS").asterisk
    assert parse_target("*", "options").asterisk
    with pytest.raises(BadTarget):
        parse_target("*", "GET")


@pytest.mark.parametrize(
    "raw",
    [
        "ftp://h/x",  # not http(s)
        "http:///x",  # no host
        "localhost:8080",  # authority-form is for CONNECT
        "v1/stream/x",  # not a path
        "",
        "/a#fragment",
        "http://h/a#fragment",
        "/a/..//x",
        "//[::1]/x",
    ],
)
def test_targets_the_edge_refuses(raw: str) -> None:
    with pytest.raises(BadTarget) as refused:
        parse_target(raw, "GET")
    # The client is told a fixed text, never its own input back.
    assert raw not in str(refused.value) or not raw
