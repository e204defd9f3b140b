"""Debian's Varnish and nginx in front of an edge, each running its shipped configuration.

Rules this module owns:
* The configuration is the shipped file (``deploy/varnish/edge.vcl``, ``deploy/nginx/edge.conf``),
  changed only where an operator changes it: the backend's port (and nginx's listen port, which
  for Varnish is ``-a``). Each line is replaced by its exact shipped text, so a shipped file that
  loses that line fails here, loudly, instead of silently running something else.
* Each process lives in its own temporary directory (Varnish's ``-n`` working directory; nginx's
  ``-p`` prefix with its cache, temp dirs, pid file and error log), runs in the foreground, and
  is stopped by its own pid; the directory goes with it. The directory is world-traversable
  because both drop their workers' privileges (varnish/vcache, nobody).
* Ports: Varnish's may be chosen before it starts (the edge needs ``--cdn-purge
  varnish=http://127.0.0.1:PORT/`` before Varnish knows the edge's port), so a start that loses
  the port to another process raises ``PortTaken`` and the caller picks again.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from devstack.processes import free_port, port_listening

REPO = Path(__file__).resolve().parent.parent
VCL = REPO / "deploy" / "varnish" / "edge.vcl"
NGINX_CONF = REPO / "deploy" / "nginx" / "edge.conf"

VARNISH_BACKEND_LINE = '.host = "127.0.0.1"; .port = "8080";'
NGINX_BACKEND_LINE = "server 127.0.0.1:8080;"
NGINX_LISTEN_LINE = "listen 127.0.0.1:8081;"
XKEY_VMOD = "libvmod_xkey.so"
START_TIMEOUT_SECONDS = 20.0


class CdnFailed(RuntimeError):
    pass


class PortTaken(CdnFailed):
    pass


def _port_of(url: str) -> int:
    port = urlsplit(url).port
    if port is None:
        raise CdnFailed(f"{url!r} names no port")
    return port


def _rewrite(text: str, shipped: str, wanted: str, source: Path) -> str:
    if text.count(shipped) != 1:
        raise CdnFailed(f"{source} must contain {shipped!r} exactly once (the line operators edit)")
    return text.replace(shipped, wanted)


def varnish_vcl(edge_port: int) -> str:
    """The shipped VCL with its backend at ``edge_port``."""
    return _rewrite(
        VCL.read_text(), VARNISH_BACKEND_LINE, f'.host = "127.0.0.1"; .port = "{edge_port}";', VCL
    )


def nginx_conf(edge_port: int, listen_port: int) -> str:
    """The shipped nginx configuration with its backend at ``edge_port``, listening on
    ``listen_port``."""
    text = _rewrite(
        NGINX_CONF.read_text(), NGINX_BACKEND_LINE, f"server 127.0.0.1:{edge_port};", NGINX_CONF
    )
    return _rewrite(text, NGINX_LISTEN_LINE, f"listen 127.0.0.1:{listen_port};", NGINX_CONF)


def _binary(name: str) -> str:
    found = shutil.which(name) or (
        f"/usr/sbin/{name}" if Path(f"/usr/sbin/{name}").exists() else None
    )
    if found is None:
        raise CdnFailed(f"{name} not found (make bootstrap installs Debian's package)")
    return found


def xkey_available() -> bool:
    """Whether vmod xkey (Debian's varnish-modules) is installed where varnishd looks."""
    return any(Path("/usr/lib").glob(f"*/varnish/vmods/{XKEY_VMOD}")) or any(
        Path("/usr/lib/varnish/vmods").glob(XKEY_VMOD)
    )


@dataclass
class Cdn:
    """A running Varnish or nginx: ``url`` is where clients (and purges) go."""

    name: str
    proc: subprocess.Popen[bytes]
    port: int
    workdir: Path
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            # Varnish's manager stops its child on SIGTERM; nginx's master finishes its workers'
            # requests on SIGQUIT. Both are the foreground process we started.
            self.proc.send_signal(signal.SIGQUIT if self.name == "nginx" else signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def _await_listening(cdn: Cdn, ready_file: Path | None = None) -> Cdn:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline and cdn.proc.poll() is None:
        if (ready_file is None or ready_file.exists()) and port_listening(cdn.port):
            return cdn
        time.sleep(0.05)
    failure = cdn.log_tail()
    cdn.stop()
    if "Address already in use" in failure or "Could not get socket" in failure:
        raise PortTaken(f"{cdn.name} lost port {cdn.port}: {failure}")
    raise CdnFailed(f"{cdn.name} did not start: {failure}")


def _private_dir(prefix: str) -> Path:
    workdir = Path(tempfile.mkdtemp(prefix=prefix))
    workdir.chmod(0o755)
    return workdir


def start_varnish(edge_url: str, *, port: int | None = None, params: tuple[str, ...] = ()) -> Cdn:
    """``varnishd -F`` with the shipped VCL in front of ``edge_url``, on ``port`` (a free one if
    None). ``params`` are extra ``-p name=value`` settings."""
    binary = _binary("varnishd")
    if not xkey_available():
        raise CdnFailed("vmod xkey not found (apt-get install varnish-modules)")
    workdir = _private_dir("edge-varnish-")
    vcl = workdir / "edge.vcl"
    vcl.write_text(varnish_vcl(_port_of(edge_url)))
    chosen = port or free_port()
    argv = [binary, "-F", "-n", str(workdir / "n"), "-a", f"127.0.0.1:{chosen}", "-f", str(vcl)]
    argv += ["-T", "none", "-s", "malloc,64m"]
    for param in params:
        argv += ["-p", param]
    log = workdir / "varnishd.log"
    with log.open("ab") as out:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    return _await_listening(Cdn(name="varnish", proc=proc, port=chosen, workdir=workdir, log=log))


def start_nginx(edge_url: str) -> Cdn:
    """nginx in the foreground with the shipped configuration in front of ``edge_url``."""
    binary = _binary("nginx")
    for _ in range(5):
        prefix = _private_dir("edge-nginx-")
        port = free_port()
        conf = prefix / "edge.conf"
        conf.write_text(nginx_conf(_port_of(edge_url), port))
        log = prefix / "error.log"
        argv = [binary, "-p", str(prefix), "-c", str(conf), "-e", str(log), "-g", "daemon off;"]
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT
        )
        cdn = Cdn(name="nginx", proc=proc, port=port, workdir=prefix, log=log)
        try:
            return _await_listening(cdn, ready_file=prefix / "nginx.pid")
        except PortTaken:
            continue
    raise CdnFailed("nginx did not start: no free port after 5 tries")
