"""Where the demo's servers can be reached from: this machine, or other devices on its network.

Rules this module owns:

* A server bound to every interface (``0.0.0.0``, ``::``) is reached by this machine's own
  clients on loopback (``local_url``) and by other devices at one of this machine's addresses
  (``machine_addresses``): the IPv4 addresses of its interfaces that are up, loopback and
  link-local left out, in the order the system lists them; the host name when it has none.
* Nothing here sends a packet: addresses come from the interfaces' configuration.
"""

from __future__ import annotations

import ipaddress
import socket

import psutil
from yarl import URL

WILDCARDS = frozenset({"0.0.0.0", "::"})


def machine_addresses() -> list[str]:
    up = {name for name, stats in psutil.net_if_stats().items() if stats.isup}
    found: list[str] = []
    for name, addresses in psutil.net_if_addrs().items():
        if name not in up:
            continue
        for address in addresses:
            if address.family != socket.AF_INET:
                continue
            ip = ipaddress.ip_address(address.address)
            if not (ip.is_loopback or ip.is_link_local) and address.address not in found:
                found.append(address.address)
    return found or [socket.gethostname()]


def url_at(url: str, host: str) -> str:
    """``url`` with its host replaced (its port kept)."""
    return str(URL(url).with_host(host))


def local_url(url: str) -> str:
    """How this machine reaches a server: a wildcard bind becomes loopback."""
    host = URL(url).host or ""
    if host in WILDCARDS:
        return url_at(url, "127.0.0.1" if host == "0.0.0.0" else "::1")
    return url


def shown_host(bound: str) -> str:
    """The host to print for a server bound to ``bound``: this machine's first address for a
    wildcard, else the address itself."""
    return machine_addresses()[0] if bound in WILDCARDS else bound
