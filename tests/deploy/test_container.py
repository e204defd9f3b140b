"""The image, built and run: what test_manifests.py can only read, proved by running it.

``make image``'s own code builds the image (Docker where a daemon answers, else Debian's podman
with runc, set up on first use; see devstack/image.py), and the container runs it on the host
network against the real reference origin, configured by EDGE_* variables only. Skipped, with
the reason, only when no engine can be used or installed; any other failure fails.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import shutil
import subprocess
import time
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path

import aiohttp
import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from devstack.container import Container, run_once, start
from devstack.engine import Engine, EngineUnavailable
from devstack.image import Built, build_arguments, build_image, describe
from devstack.processes import Origin
from edge.protocol.sse import SseDecoder
from tests.deploy.conftest import report
from tests.deploy.test_manifests import HAPROXY_CFG, MOUNTED_CERT
from tests.integration.live_support import append_all, view_sse

pytestmark = [pytest.mark.container, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
DRAIN_SECONDS = 3.0
# What the engine adds between its signal and our view of the exit (podman's wait polls).
EXIT_SLACK_SECONDS = 1.0
# edge and its runtime dependencies, over the base; dev tools would add far more than this.
MAX_OWN_LAYERS_BYTES = 100 * 1000 * 1000
TEXT = {"Content-Type": "text/plain"}
BINARY = {"Content-Type": "application/octet-stream"}


def dockerfile_user() -> int:
    users = [
        line.split()[1] for line in (ROOT / "Dockerfile").read_text().splitlines()
        if line.startswith("USER ")
    ]  # fmt: skip
    return int(users[-1].split(":")[0])


@pytest.fixture(scope="module")
def image(request: pytest.FixtureRequest) -> tuple[Engine, Built]:
    try:
        engine, built = build_image()
    except EngineUnavailable as error:
        pytest.skip(f"no container engine can be used or installed here: {error}")
    report(request.config, describe(built))
    return engine, built


def as_in_kubernetes() -> tuple[str, ...]:
    """Engine flags for what deploy/k8s/deployment.yaml asks of the container, so that the image
    is tested the way the cluster runs it (read-only root, no capabilities, no privilege gain)."""
    deployment = yaml.safe_load((ROOT / "deploy" / "k8s" / "deployment.yaml").read_text())
    (spec,) = deployment["spec"]["template"]["spec"]["containers"]
    context = spec["securityContext"]
    options: list[str] = []
    if context.get("readOnlyRootFilesystem"):
        mounts = [mount["mountPath"] for mount in spec.get("volumeMounts", [])]
        options += ["--read-only", *(arg for path in mounts for arg in ("--tmpfs", path))]
    for capability in context.get("capabilities", {}).get("drop", []):
        options += ["--cap-drop", capability]
    if context.get("allowPrivilegeEscalation") is False:
        options += ["--security-opt", "no-new-privileges"]
    return tuple(options)


@pytest.fixture(scope="module")
def container(image: tuple[Engine, Built], origin: Origin) -> Iterator[Container]:
    engine, built = image
    env = {"EDGE_ORIGIN": origin.url, "EDGE_DRAIN_SECONDS": str(DRAIN_SECONDS)}
    started = start(engine, built.tag, env, prefix="edge-test", options=as_in_kubernetes())
    yield started
    started.remove()


def stream(request: pytest.FixtureRequest, kind: str) -> str:
    name = request.node.name.replace("[", "-").replace("]", "")
    return f"/v1/stream/container-{name}-{kind}-{time.monotonic_ns()}"


async def put_and_append(
    http: aiohttp.ClientSession, url: str, headers: dict[str, str], parts: list[bytes]
) -> None:
    async with http.put(url, headers=headers) as response:
        assert response.status == 201, response.status
    for part in parts:
        async with http.post(url, data=part, headers=headers) as response:
            assert response.status in (200, 204), response.status


async def get(http: aiohttp.ClientSession, url: str) -> tuple[bytes, Mapping[str, str]]:
    async with http.get(url) as response:
        assert response.status == 200, response.status
        return await response.read(), response.headers.copy()


# --- the image ---------------------------------------------------------------------------------


def test_the_image_builds_and_its_size_is_reported(image: tuple[Engine, Built]) -> None:
    engine, built = image
    base = engine.size_bytes(built.base.image)
    own = built.size_bytes - base
    assert 0 < own < MAX_OWN_LAYERS_BYTES, (built.size_bytes, base)
    # The tag make image builds is the one compose and Kubernetes run (deploy/.env).
    assert engine.has(built.tag)


def test_the_image_holds_no_dev_dependencies_or_tests(image: tuple[Engine, Built]) -> None:
    engine, built = image
    # Everything installed and every file's digest, as root so that nothing is unreadable.
    script = r"""
import hashlib, importlib.metadata as md, importlib.util, json, os, platform, sys
dists = {d.metadata["Name"]: list(d.requires or []) for d in md.distributions()}
digests = set()
for root, dirs, files in os.walk("/"):
    dirs[:] = [d for d in dirs if os.path.join(root, d) not in ("/proc", "/sys", "/dev")]
    for name in files:
        path = os.path.join(root, name)
        if os.path.isfile(path) and not os.path.islink(path) and os.path.getsize(path) < 4 << 20:
            with open(path, "rb") as f:
                digests.add(hashlib.sha256(f.read()).hexdigest())
env = {
    "python_version": ".".join(platform.python_version_tuple()[:2]),
    "python_full_version": platform.python_version(),
    "implementation_name": sys.implementation.name,
    "platform_python_implementation": platform.python_implementation(),
    "platform_machine": platform.machine(), "platform_system": platform.system(),
    "platform_release": platform.release(), "platform_version": platform.version(),
    "sys_platform": sys.platform, "os_name": os.name,
    "implementation_version": platform.python_version(),
}
ours = ("tests", "devstack", "loadtest")
found = {name: importlib.util.find_spec(name) is not None for name in ours}
print(json.dumps({"dists": dists, "digests": sorted(digests), "env": env, "importable": found}))
"""
    seen = json.loads(run_once(engine, built.tag, "/opt/edge/bin/python", "-c", script, user="0"))
    installed = {canonicalize_name(name): requires for name, requires in seen["dists"].items()}

    # Exactly edge and what its runtime dependencies need, evaluated for the image's Python.
    needed: set[str] = set()
    todo = [Requirement(spec) for spec in PYPROJECT["project"]["dependencies"]]
    while todo:
        requirement = todo.pop()
        extras = requirement.extras or {""}
        marker = requirement.marker
        if marker and not any(marker.evaluate({**seen["env"], "extra": e}) for e in extras):
            continue
        name = canonicalize_name(requirement.name)
        assert name in installed, f"runtime dependency {name} is missing from the image"
        if name not in needed:
            needed.add(name)
            todo += [Requirement(spec) for spec in installed[name]]
    optional = PYPROJECT["project"]["optional-dependencies"]
    dev = {canonicalize_name(Requirement(spec).name) for spec in optional["dev"]}
    assert not dev & set(installed), dev & set(installed)
    itself = canonicalize_name(PYPROJECT["project"]["name"])
    assert set(installed) == needed | {itself}, set(installed) ^ (needed | {itself})

    # Every file of edge/ is in the image; none of the tests, tools or deployment files is.
    def digests(*parts: str) -> set[str]:
        tracked = subprocess.run(
            ["git", "ls-files", "-z", "--", *parts], cwd=ROOT, capture_output=True, check=True
        ).stdout.split(b"\0")
        files = [ROOT / name.decode() for name in tracked if name]
        return {hashlib.sha256(f.read_bytes()).hexdigest() for f in files if f.stat().st_size}

    in_image = set(seen["digests"])
    shipped = digests("edge/*.py")
    assert shipped, "no edge/ files found: the check below would prove nothing"
    assert shipped <= in_image, "some of edge/ is missing from the image"
    kept_out = digests("tests", "devstack", "loadtest", "deploy", "docs") - shipped
    assert not kept_out & in_image, f"{len(kept_out & in_image)} repository files in the image"
    assert not any(seen["importable"].values()), seen["importable"]

    # Nor is the CA bundle the build's pip was handed as a secret.
    _, secrets = build_arguments()
    for secret in secrets:
        source = Path(secret.split("src=", 1)[1])
        assert hashlib.sha256(source.read_bytes()).hexdigest() not in in_image, source


def test_compose_makes_haproxys_certificate_with_the_image(
    image: tuple[Engine, Built], tmp_path: Path
) -> None:
    """What compose's ``tls-cert`` service runs before HAProxy when no certificate is given:
    the shipped devstack/tls.py, in this image, writes one HAProxy's HTTPS frontend accepts."""
    engine, built = image
    compose = yaml.safe_load((ROOT / "deploy" / "docker-compose.yml").read_text())
    command = compose["services"]["tls-cert"]["entrypoint"][-1]
    # Compose mounts tls.py at /tls.py and the certificate directory at /certs; here the file
    # is written from its text and the certificate printed, the service's command in between.
    script = f'mkdir /certs && printf %s "$0" > /tls.py && {{ {command}; }} >/dev/null'
    script += " && cat /certs/edge.pem"
    source = (ROOT / "devstack" / "tls.py").read_text()
    pem = run_once(engine, built.tag, "sh", "-c", script, source, user="0")
    made = tmp_path / "edge.pem"
    made.write_text(pem)
    assert "BEGIN CERTIFICATE" in pem
    assert "BEGIN PRIVATE KEY" in pem
    config = tmp_path / "haproxy.cfg"
    config.write_text(HAPROXY_CFG.read_text().replace(MOUNTED_CERT, str(made)))
    checked = subprocess.run(
        [shutil.which("haproxy") or "/usr/sbin/haproxy", "-c", "-f", str(config)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


# --- the running container ---------------------------------------------------------------------


async def test_healthz_and_the_healthcheck_report_healthy(
    container: Container, image: tuple[Engine, Built], http: aiohttp.ClientSession
) -> None:
    async with http.get(container.admin_url + "/healthz") as response:
        assert response.status == 200
    assert container.healthcheck()
    if container.engine.name == "podman":
        assert container.health_status() == "healthy"
    # The same HEALTHCHECK fails when nothing answers: it checks the admin listener, not itself.
    engine, built = image
    idle = f"{container.name}-idle"
    try:
        engine.run("run", "--detach", "--name", idle, "--network", "host", *engine.ulimit_args,
                   "--env", "EDGE_ADMIN_LISTEN=127.0.0.1:1", "--entrypoint", "sleep",
                   built.tag, "60")  # fmt: skip
        silent = Container(engine=engine, name=idle, ready={})
        assert not silent.healthcheck()
    finally:
        Container(engine=engine, name=idle, ready={}).remove()


def test_the_process_runs_as_a_non_root_user_as_the_deployment_asks(container: Container) -> None:
    expected = dockerfile_user()
    assert expected != 0
    status = container.exec("cat", "/proc/1/status")
    uids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Uid:"))
    gids = next(line.split()[1:] for line in status.splitlines() if line.startswith("Gid:"))
    assert uids == [str(expected)] * 4, uids  # real, effective, saved, filesystem
    assert gids == [str(expected)] * 4, gids
    assert "edge\0serve" in container.exec("cat", "/proc/1/cmdline")
    # As the Deployment runs it: a read-only root filesystem, every capability dropped (from the
    # bounding set too, so nothing can regain one).
    mounts = container.exec("cat", "/proc/1/mounts").splitlines()
    root = next(line.split() for line in mounts if line.split()[1] == "/")
    assert "ro" in root[3].split(","), root
    for field in ("CapEff:", "CapBnd:"):
        value = next(line.split()[1] for line in status.splitlines() if line.startswith(field))
        assert int(value, 16) == 0, (field, value)
    # And as the host sees it: the same process, not root here either.
    host = Path(f"/proc/{container.host_pid()}/status").read_text()
    host_uids = next(line.split()[1:] for line in host.splitlines() if line.startswith("Uid:"))
    assert "0" not in host_uids, host_uids


async def test_a_catch_up_read_through_the_container_is_byte_exact(
    container: Container,
    origin: Origin,
    http: aiohttp.ClientSession,
    request: pytest.FixtureRequest,
) -> None:
    cases = [
        (TEXT, [f" tok{i} é\n".encode() for i in range(50)]),
        (BINARY, [bytes(range(256)) * 8, b"\0\r\n" * 100, bytes(range(255, -1, -1))]),
    ]
    for headers, parts in cases:
        path = stream(request, headers["Content-Type"].split("/")[1])
        await put_and_append(http, origin.url + path, headers, parts)
        direct, direct_headers = await get(http, f"{origin.url}{path}?offset=-1")
        assert direct == b"".join(parts)
        for expected_status in ("fwd=", "hit"):
            body, through = await get(http, f"{container.url}{path}?offset=-1")
            assert body == direct
            assert through["Stream-Next-Offset"] == direct_headers["Stream-Next-Offset"]
            assert expected_status in through["Cache-Status"], through["Cache-Status"]


@pytest.mark.parametrize("headers", [TEXT, BINARY], ids=["text", "binary"])
async def test_an_sse_read_through_the_container_is_byte_exact(
    container: Container,
    origin: Origin,
    crowd: aiohttp.ClientSession,
    request: pytest.FixtureRequest,
    headers: dict[str, str],
) -> None:
    path = stream(request, "sse")
    parts = [f" tok{i}\n".encode() for i in range(40)]
    if headers is BINARY:
        parts = [bytes([i, 0, 13, 10, 255 - i]) for i in range(40)]
    async with crowd.put(origin.url + path, headers=headers) as response:
        assert response.status == 201
    viewer = asyncio.create_task(view_sse(crowd, container.url + path, resume=False))
    await append_all(crowd, origin.url + path, parts, content_type=headers["Content-Type"])
    view = await asyncio.wait_for(viewer, 30)
    assert view.closed
    assert bytes(view.body) == b"".join(parts)


async def test_sigterm_during_a_live_sse_read_ends_it_cleanly_and_exits_0(
    image: tuple[Engine, Built],
    origin: Origin,
    crowd: aiohttp.ClientSession,
    request: pytest.FixtureRequest,
) -> None:
    engine, built = image
    env = {"EDGE_ORIGIN": origin.url, "EDGE_DRAIN_SECONDS": str(DRAIN_SECONDS)}
    doomed = start(engine, built.tag, env, prefix="edge-doomed")
    try:
        path = stream(request, "drain")
        parts = [bytes([i % 256]) * 7 + b"\n" for i in range(200)]
        async with crowd.put(origin.url + path, headers=BINARY) as response:
            assert response.status == 201
        writer = asyncio.create_task(
            append_all(crowd, origin.url + path, parts, content_type="application/octet-stream",
                       rate_per_second=40)
        )  # fmt: skip
        received = bytearray()
        next_offset: str | None = None
        controls = 0
        signalled: float | None = None
        decoder = SseDecoder()
        pending: list[str] = []
        async with crowd.get(f"{doomed.url}{path}?offset=-1&live=sse") as response:
            assert response.status == 200
            # Ends only at the end of the body: a connection cut without the last chunk raises.
            async for chunk in response.content.iter_any():
                for event in decoder.feed(chunk):
                    if event.event == "data":
                        pending.append(event.data)
                    elif event.event == "control":
                        received += b"".join(base64.b64decode(data) for data in pending)
                        pending.clear()
                        next_offset = json.loads(event.data)["streamNextOffset"]
                        controls += 1
                if controls >= 5 and signalled is None:
                    signalled = time.monotonic()
                    doomed.signal("TERM")
        assert signalled is not None, "the stream ended before SIGTERM was sent"
        code = await asyncio.get_running_loop().run_in_executor(None, doomed.wait, 30)
        elapsed = time.monotonic() - signalled
        assert code == 0, doomed.logs()[-3000:]
        assert elapsed < DRAIN_SECONDS + EXIT_SLACK_SECONDS, elapsed
        assert not pending, "the connection ended inside a batch"
        report(request.config, f"SIGTERM during a live SSE read: exit 0 after {elapsed:.2f} s")
        await writer
        # What the viewer got is exact up to the offset it was told, and resumes from there.
        assert next_offset is not None
        rest, _ = await get(crowd, f"{origin.url}{path}?offset={next_offset}")
        assert bytes(received) + rest == b"".join(parts)
        assert 0 < len(received) < len(b"".join(parts))
    finally:
        doomed.remove()
