"""The shipped Varnish and nginx configurations' rules, one header combination at a time.

Which headers an answer carries is the edge's policy (``edge.log.policy``, tested on its own and
through the real edge in ``test_cdn.py``); what the CDN does with each combination is the
configuration's. Here a scripted backend (a loopback HTTP server in this process that answers
each path with a fixed status and headers, and counts what reaches it) stands where the edge
would, so each rule of contract 3 is pinned whatever the edge sends today: a combination is
"stored" when two reads through the CDN reach the backend once.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.error import HTTPError

import pytest

from devstack.cdn import Cdn, start_nginx, start_varnish

# path -> (status, headers)
SCRIPT: dict[str, tuple[int, list[tuple[str, str]]]] = {
    "/cc-60": (200, [("Cache-Control", "public, max-age=60")]),
    "/no-lifetime": (200, []),
    "/private": (200, [("Cache-Control", "private, max-age=60")]),
    "/cc-no-store-sc-60": (
        204,
        [("Cache-Control", "no-store"), ("Surrogate-Control", "max-age=60")],
    ),
    "/cc-60-sc-no-store": (
        200,
        [("Cache-Control", "max-age=60"), ("Surrogate-Control", "no-store")],
    ),
    "/error-500": (500, [("Cache-Control", "max-age=60")]),
    "/missing-no-store": (404, [("Cache-Control", "no-store")]),
    "/missing-60": (404, [("Cache-Control", "max-age=60")]),
    "/vary-star": (200, [("Cache-Control", "max-age=60"), ("Vary", "*")]),
    "/set-cookie": (200, [("Cache-Control", "max-age=60"), ("Set-Cookie", "a=b")]),
    "/sc-5-age-4": (200, [("Surrogate-Control", "max-age=5"), ("Age", "4")]),
    "/cc-1": (200, [("Cache-Control", "public, max-age=1")]),
    "/cc-1-swr": (200, [("Cache-Control", "public, max-age=1, stale-while-revalidate=30")]),
    "/sc-without-max-age": (
        200,
        [("Cache-Control", "no-store"), ("Surrogate-Control", "stale-while-revalidate=10")],
    ),
    "/public-without-max-age": (200, [("Cache-Control", "public")]),
    "/expires-only": (200, [("Expires", "Thu, 01 Jan 2099 00:00:00 GMT")]),
    "/cdn-only": (
        200,
        [
            ("Cache-Control", "public, max-age=60"),
            ("Surrogate-Control", "max-age=60"),
            ("CDN-Cache-Control", "max-age=60"),
            ("Surrogate-Key", "ds-one ds-two"),
            ("Cache-Tag", "ds-one,ds-two"),
            ("Cache-Status", "edge; hit"),
        ],
    ),
}


class ScriptedBackend(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: Counter[tuple[str, str]]
    lock: threading.Lock

    def _answer(self) -> None:
        with self.lock:
            self.seen[(self.command, self.path)] += 1
        status, headers = SCRIPT.get(self.path.split("?")[0], (200, []))
        body = b"" if status == 204 or self.command == "HEAD" else b"scripted"
        self.send_response(status)
        self.send_header("X-Seen-Accept-Encoding", self.headers.get("Accept-Encoding", "-"))
        for name, value in headers:
            self.send_header(name, value)
        if status != 204:
            self.send_header("Content-Length", "8")
        self.end_headers()
        self.wfile.write(body)

    do_GET = _answer
    do_HEAD = _answer

    def log_message(self, format: str, *args: object) -> None:
        pass


@dataclass
class Rig:
    backend: ThreadingHTTPServer
    seen: Counter[tuple[str, str]]
    varnish: Cdn
    nginx: Cdn

    def cdn(self, name: str) -> Cdn:
        return {"varnish": self.varnish, "nginx": self.nginx}[name]


@pytest.fixture(scope="module")
def rig() -> Iterator[Rig]:
    seen: Counter[tuple[str, str]] = Counter()
    handler = type("Handler", (ScriptedBackend,), {"seen": seen, "lock": threading.Lock()})
    backend = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=backend.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{backend.server_address[1]}"
    varnish = start_varnish(url)
    try:
        nginx = start_nginx(url)
    except BaseException:
        varnish.stop()
        raise
    yield Rig(backend=backend, seen=seen, varnish=varnish, nginx=nginx)
    nginx.stop()
    varnish.stop()
    backend.shutdown()
    backend.server_close()
    thread.join(5)


@dataclass
class Got:
    status: int
    headers: dict[str, list[str]]

    def all(self, name: str) -> list[str]:
        return self.headers.get(name.lower(), [])


def get(url: str, method: str = "GET", headers: dict[str, str] | None = None) -> Got:
    request = urllib.request.Request(url, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            response.read()
            found: dict[str, list[str]] = {}
            for name, value in response.headers.items():
                found.setdefault(name.lower(), []).append(value)
            return Got(response.status, found)
    except HTTPError as refused:
        with refused:
            found = {}
            for name, value in refused.headers.items():
                found.setdefault(name.lower(), []).append(value)
            return Got(refused.code, found)


_serial = iter(range(1_000_000))


def reached_backend(
    rig: Rig,
    cdn: str,
    path: str,
    *,
    method: str = "GET",
    headers: dict[str, str] | None = None,
    long_poll: bool = False,
) -> int:
    """Read ``path`` twice through ``cdn`` (a fresh query each call, so no earlier test's copy
    counts; a long-poll's query when ``long_poll``); how many of the reads reached the backend."""
    query = f"n={next(_serial)}"
    target = f"{path}?offset=1&live=long-poll&{query}" if long_poll else f"{path}?{query}"
    for _ in range(2):
        get(rig.cdn(cdn).url + target, method=method, headers=headers)
    return rig.seen[(method, target)]


@pytest.mark.parametrize(
    ("path", "stored"),
    [
        ("/cc-60", True),
        ("/no-lifetime", False),
        ("/private", False),
        # The long-poll 204's shape: no browser keeps it, the CDN does (Surrogate-Control wins).
        ("/cc-no-store-sc-60", True),
        ("/cc-60-sc-no-store", False),
        ("/error-500", False),
        ("/missing-no-store", False),
        ("/missing-60", True),
        ("/vary-star", False),
        ("/set-cookie", False),
        # No explicit max-age anywhere: never Varnish's default_ttl.
        ("/sc-without-max-age", False),
        ("/public-without-max-age", False),
        ("/expires-only", False),
    ],
)
def test_varnish_stores_only_what_the_edge_allows_a_cdn(rig: Rig, path: str, stored: bool) -> None:
    assert reached_backend(rig, "varnish", path) == (1 if stored else 2)


@pytest.mark.parametrize(
    ("path", "stored"),
    [
        ("/cc-60", True),
        ("/no-lifetime", False),
        ("/private", False),
        # nginx reads no CDN lifetime: Cache-Control alone decides (browser-bounded).
        ("/cc-no-store-sc-60", False),
        ("/error-500", False),
        ("/missing-no-store", False),
        ("/vary-star", False),
        ("/set-cookie", False),
        ("/public-without-max-age", False),
    ],
)
def test_nginx_stores_only_what_cache_control_allows(rig: Rig, path: str, stored: bool) -> None:
    assert reached_backend(rig, "nginx", path) == (1 if stored else 2)


def test_nginx_keeps_long_poll_answers_a_second_but_never_private(rig: Rig) -> None:
    assert reached_backend(rig, "nginx", "/cc-no-store-sc-60", long_poll=True) == 1
    assert reached_backend(rig, "nginx", "/private", long_poll=True) == 2


@pytest.mark.parametrize("cdn", ["varnish", "nginx"])
@pytest.mark.parametrize(
    "headers",
    [{"Authorization": "Bearer a"}, {"Cookie": "s=1"}],
    ids=["authorization", "cookie"],
)
def test_credentialed_reads_are_never_stored(rig: Rig, cdn: str, headers: dict[str, str]) -> None:
    assert reached_backend(rig, cdn, "/cc-60", headers=headers) == 2


@pytest.mark.parametrize("cdn", ["varnish", "nginx"])
def test_head_reaches_the_backend_as_head_every_time(rig: Rig, cdn: str) -> None:
    assert reached_backend(rig, cdn, "/cc-60", method="HEAD") == 2


def test_varnish_counts_age_against_the_surrogate_lifetime(rig: Rig) -> None:
    """max-age 5 with Age 4: one second left, whichever header gave it."""
    url = rig.varnish.url + f"/sc-5-age-4?n={next(_serial)}"
    get(url)
    hit = get(url)
    member = hit.all("Cache-Status")[-1].split(",")[-1].strip()
    assert member.startswith("varnish; hit; ttl=")
    assert int(member.rsplit("=", 1)[1]) <= 1


def test_varnish_serves_stale_only_where_the_edge_allows_it(rig: Rig) -> None:
    """No default grace: once max-age=1 is over, a read goes to the backend; with
    stale-while-revalidate, the stale copy is served while it refreshes."""
    plain = f"/cc-1?n={next(_serial)}"
    revalidated = f"/cc-1-swr?n={next(_serial)}"
    for target in (plain, revalidated):
        get(rig.varnish.url + target)
    time.sleep(1.3)  # both copies expire: the rule under test is what happens after a lifetime
    late_plain = get(rig.varnish.url + plain)
    late_stale = get(rig.varnish.url + revalidated)
    assert "varnish; hit" not in late_plain.all("Cache-Status")[-1]
    assert rig.seen[("GET", plain)] == 2
    assert "varnish; hit; ttl=-" in late_stale.all("Cache-Status")[-1]


@pytest.mark.parametrize("cdn", ["varnish", "nginx"])
def test_cdn_only_headers_never_reach_clients_and_the_cdn_says_what_it_did(
    rig: Rig, cdn: str
) -> None:
    url = rig.cdn(cdn).url + f"/cdn-only?n={next(_serial)}"
    get(url)
    hit = get(url)
    for name in ("Surrogate-Control", "CDN-Cache-Control", "Surrogate-Key", "Cache-Tag", "xkey"):
        assert hit.all(name) == [], name
    members = [m.strip() for line in hit.all("Cache-Status") for m in line.split(",")]
    assert members[0] == "edge; hit"
    assert members[-1].startswith(f"{cdn}; hit")


@pytest.mark.parametrize(
    ("cdn", "sent", "asked"),
    [
        ("nginx", "gzip;q=0", "-"),
        ("nginx", "br, gzip; q=0.0", "-"),
        ("nginx", "identity", "-"),
        ("nginx", "gzip, deflate, br", "gzip"),
        ("nginx", "gzip;q=0.5", "gzip"),
        ("varnish", "gzip;q=0", "-"),
        ("varnish", "gzip, deflate, br", "gzip"),
    ],
)
def test_gzip_is_asked_for_only_for_clients_that_accept_it(
    rig: Rig, cdn: str, sent: str, asked: str
) -> None:
    """Found by an outside attack: nginx's map matched "gzip" in "gzip;q=0" and asked the edge
    for gzip, so a client that refused gzip got it."""
    got = get(rig.cdn(cdn).url + f"/cc-60?n={next(_serial)}", headers={"Accept-Encoding": sent})
    assert got.status == 200
    assert got.all("x-seen-accept-encoding") == [asked]
