"""Debian's nginx in front of the origin: a caching reverse proxy for ``loadtest.hits``, a plain
proxy for ``loadtest.audience``.

Rules this module owns:
* Caching is forced whatever the origin says (the reference origin sends no Cache-Control on
  catch-up reads): 200s are kept an hour; Cache-Control, Expires, Set-Cookie and Vary are
  ignored. The key is the whole request URI (path and query) plus ``Accept-Encoding``,
  ``Authorization`` and ``Cookie``, so a gzip request and an identity request are separate
  entries, and so are two readers' credentialed reads (the edge's default scopes).
* ``micro=True`` is the micro-cache for open streams, whose answers change: 200s are kept one
  second (``proxy_cache_valid 200 1s``, the edge's default ``--tail-freshness``), the expired
  entry is served while one request refreshes it (``proxy_cache_use_stale updating``) and
  refreshes are collapsed (``proxy_cache_lock on``): the micro-caching set-up nginx's own
  guide recommends. ``HEAD`` is cached as nginx does by default (``proxy_cache_convert_head``:
  asked upstream as a ``GET``, answered from that entry).
* nginx does not compress once by itself: with ``gzip on`` it would compress on every hit, as
  the origin does. Here it caches the origin's own gzip answer (the origin compresses once, on
  the miss) and serves those stored bytes: the strongest nginx for a compress-once comparison.
* Tuned to be fair to nginx, not to lose: one worker, ``access_log off``, ``sendfile on``,
  keep-alive connections never closed by a request count (nginx's default closes every 1,000).
  ``tcp_nopush`` stays off: with it (Debian's stock nginx.conf has it on) each 64 KB hit stalled
  ~45 ms on loopback (1,600 req/s at 64 connections, 21 at one), against ~8,000 without it.
* ``cache=False`` (``loadtest.audience``'s long-polls) is a plain proxy: no cache,
  ``proxy_buffering off`` (each answer relayed as it comes), a read timeout past the origin's
  30 s long-poll, and as many idle upstream keep-alive connections as there are parked
  long-polls, so a release does not turn into thousands of new connections to the origin.
* Everything lives in its own temporary prefix (config, pid file, cache, temp dirs, error log):
  started as ``nginx -p PREFIX -c CONF -e LOG -g 'daemon off;'`` and stopped by its own pid.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from devstack.processes import free_port, port_listening

NGINX_CANDIDATES = ("nginx", "/usr/sbin/nginx")

CONF = """\
worker_processes 1;
{user}
pid {prefix}/nginx.pid;
lock_file {prefix}/nginx.lock;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush off;
    keepalive_requests 1000000000;
    keepalive_timeout 120s;
    client_body_temp_path {prefix}/body;
    proxy_temp_path {prefix}/proxy;
    fastcgi_temp_path {prefix}/fastcgi;
    uwsgi_temp_path {prefix}/uwsgi;
    scgi_temp_path {prefix}/scgi;
    proxy_cache_path {prefix}/cache levels=1:2 keys_zone=hits:16m max_size=1g inactive=1h
                     use_temp_path=off;
    upstream origin {{ server {upstream}; keepalive {keepalive}; }}
    server {{
        listen 127.0.0.1:{port};
        location / {{
            proxy_pass http://origin;
            proxy_http_version 1.1;
            proxy_set_header Connection "";
            {location}
        }}
    }}
}}
"""


class NginxFailed(RuntimeError):
    pass


def nginx_binary() -> str | None:
    for candidate in NGINX_CANDIDATES:
        found = shutil.which(candidate)
        if found:
            return found
    return None


@dataclass
class Nginx:
    proc: subprocess.Popen[bytes]
    prefix: Path
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        """The master's pid, as nginx wrote it to its own pid file."""
        return int((self.prefix / "nginx.pid").read_text().split()[0])

    def worker_pids(self) -> list[int]:
        children = Path(f"/proc/{self.pid}/task/{self.pid}/children")
        return [int(p) for p in children.read_text().split()] if children.exists() else []

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.kill(self.pid, signal.SIGQUIT)  # graceful: workers finish, then exit
            except (OSError, ValueError):
                self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.prefix, ignore_errors=True)


CACHED = """proxy_cache hits;
            proxy_cache_key "$request_uri|$http_accept_encoding|$http_authorization|$http_cookie";
            {validity}
            proxy_ignore_headers Cache-Control Expires Set-Cookie Vary X-Accel-Expires;
            proxy_cache_lock on;
            add_header X-Cache-Status $upstream_cache_status;"""
FORCED = "proxy_cache_valid 200 304 1h;"
MICRO = "proxy_cache_valid 200 1s;\n            proxy_cache_use_stale updating;"
# Long-polls pass through: each answer goes out as it arrives, nothing is stored, and a wait may
# last the origin's whole long-poll timeout (30 s) and more.
PASS = """proxy_buffering off;
            proxy_cache off;
            proxy_read_timeout 120s;"""
# The ceiling: nginx answering from its config, nothing proxied (``loadtest.ceiling``).
FIXED = """default_type text/plain;
            return 200 "{body}";"""
CACHE_KEEPALIVE = 16
# Every parked long-poll holds an upstream connection: keep them all for the re-polls, or each
# release would close thousands and the next re-polls open them again.
PASS_KEEPALIVE = 8192


def start_nginx(
    origin_url: str, *, micro: bool = False, cache: bool = True, fixed: bytes | None = None
) -> Nginx:
    """nginx in front of ``origin_url``: a forced cache (``micro``: the 1 s micro-cache), or,
    ``cache=False``, a plain unbuffered proxy (``PASS``) for live reads; ``fixed``: no proxy at
    all, every request answered ``return 200`` with these bytes (the per-core HTTP ceiling)."""
    binary = nginx_binary()
    if binary is None:
        raise NginxFailed("nginx not found (make bootstrap installs Debian's nginx)")
    parts = urlsplit(origin_url)
    upstream = f"{parts.hostname}:{parts.port}"
    # Root's workers would run as `nobody` and could not write a root-owned cache.
    user = "user root root;" if os.geteuid() == 0 else ""
    for _ in range(5):
        prefix = Path(tempfile.mkdtemp(prefix="edge-bench-nginx-"))
        port = free_port()
        conf = prefix / "nginx.conf"
        location = CACHED.format(validity=MICRO if micro else FORCED) if cache else PASS
        if fixed is not None:
            location = FIXED.format(body=fixed.decode("ascii"))
        keepalive = CACHE_KEEPALIVE if cache else PASS_KEEPALIVE
        conf.write_text(
            CONF.format(
                user=user,
                prefix=prefix,
                upstream=upstream,
                port=port,
                location=location,
                keepalive=keepalive,
            )
        )
        log = prefix / "error.log"
        argv = [binary, "-p", str(prefix), "-c", str(conf), "-e", str(log), "-g", "daemon off;"]
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and proc.poll() is None:
            if (prefix / "nginx.pid").exists() and port_listening(port):
                return Nginx(proc=proc, prefix=prefix, port=port)
            time.sleep(0.05)
        failure = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        shutil.rmtree(prefix, ignore_errors=True)
        if "Address already in use" not in failure:
            raise NginxFailed(f"nginx did not start: {failure}")
    raise NginxFailed("nginx did not start: no free port after 5 tries")
