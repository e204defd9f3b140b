"""``--admin-token`` (alias ``--purge-token``) and ``--admin-protect``: what the admin listener
asks a token for."""

from __future__ import annotations

from pathlib import Path

import aiohttp

from devstack.processes import Origin, start_edge


async def test_admin_protect_all_guards_every_admin_path(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path
) -> None:
    edge = start_edge(
        origin.url, logs_dir, "--admin-token", "s3cret", "--admin-protect", "all",
        name="edge-admin-all",
    )  # fmt: skip
    try:
        for path in ("/metrics", "/healthz", "/readyz"):
            async with http.get(edge.admin_url + path) as r:
                assert r.status == 401
                assert r.headers["WWW-Authenticate"] == "Bearer"
            async with http.get(
                edge.admin_url + path, headers={"Authorization": "Bearer s3cret"}
            ) as r:
                assert r.status in (200, 503), path  # /readyz may be 503: not the token's doing
        async with http.post(edge.admin_url + "/purge?path=/x") as r:
            assert r.status == 401
        async with http.post(
            edge.admin_url + "/purge?path=/x", headers={"Authorization": "Bearer s3cret"}
        ) as r:
            assert r.status == 200
    finally:
        edge.stop()


async def test_by_default_only_purge_needs_the_token(
    http: aiohttp.ClientSession, origin: Origin, logs_dir: Path
) -> None:
    edge = start_edge(origin.url, logs_dir, "--admin-token", "s3cret", name="edge-admin-purge")
    try:
        async with http.get(edge.admin_url + "/metrics") as r:
            assert r.status == 200
        async with http.get(edge.admin_url + "/healthz") as r:
            assert r.status == 200
        async with http.post(edge.admin_url + "/purge?path=/x") as r:
            assert r.status == 401
    finally:
        edge.stop()
