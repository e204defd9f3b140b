"""Static checks of the deployment files: Dockerfile, compose, HAProxy and Kubernetes manifests.

No Docker engine or cluster is needed: hadolint, yamllint, kubernetes-validate (offline, bundled
schemas) and ``haproxy -c`` check what can be checked without building or running anything.
``make bootstrap`` installs every one of them, so a missing tool fails the test, never skips it.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.cluster import TLS_FRONTEND, deployed_routing
from devstack.image import default_tag
from devstack.tls import make_certificate

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = DEPLOY / "docker-compose.yml"
HAPROXY_CFG = DEPLOY / "haproxy" / "haproxy.cfg"
# Where compose mounts deploy/haproxy/certs/edge.pem for the HTTPS frontend.
MOUNTED_CERT = "/usr/local/etc/haproxy/certs/edge.pem"
K8S = DEPLOY / "k8s"
# The manifests `kubectl apply -f deploy/k8s/` applies, then the optional ingress (applied alone).
K8S_FILES = sorted(K8S.glob("*.yaml")) + sorted((K8S / "ingress").glob("*.yaml"))
YAMLLINT_CONFIG = ROOT / ".yamllint.yml"

# The exact install command: the image gets the same pinned versions CI tests against.
PIP_INSTALL = "pip install --no-cache-dir -c constraints.txt ."
# The Kubernetes versions the manifests must validate against (oldest supported here, newest).
K8S_VERSIONS = ["1.30.0", "1.37.0"]
COMPOSE_SERVICES = {"origin", "redis", "edge-1", "edge-2", "haproxy", "prometheus", "grafana"}


def tool(name: str) -> str:
    """A CLI from the virtualenv running the tests (or PATH)."""
    beside = Path(sys.executable).parent / name
    if beside.exists():
        return str(beside)
    found = shutil.which(name)
    assert found is not None, f"{name} is not installed (make bootstrap installs it)"
    return found


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60, check=False)


def load_all(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]


def k8s_object(kind: str) -> dict[str, Any]:
    found = [doc for path in K8S_FILES for doc in load_all(path) if doc.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind} in deploy/k8s, found {len(found)}"
    return found[0]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    pairs = []
    for line in logical:
        instruction, _, arguments = line.partition(" ")
        pairs.append((instruction.upper(), " ".join(arguments.split())))
    return pairs


# --- Dockerfile ------------------------------------------------------------------------------


def test_hadolint_passes() -> None:
    result = run(tool("hadolint"), str(DOCKERFILE))
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_installs_with_the_ci_constraints() -> None:
    runs = [args for instruction, args in dockerfile_instructions() if instruction == "RUN"]
    installs = [args for args in runs if "pip install" in args]
    assert len(installs) == 1, installs
    assert PIP_INSTALL in installs[0]
    assert "-c constraints.txt" in installs[0]
    copied = " ".join(
        args for instruction, args in dockerfile_instructions() if instruction == "COPY"
    )
    assert "constraints.txt" in copied
    assert "pyproject.toml" in copied


def test_dockerfile_runs_edge_as_non_root_with_a_healthcheck() -> None:
    instructions = dockerfile_instructions()
    # python:3.11-slim unless the build names another (make image's stand-in; devstack/image.py).
    assert instructions[0] == ("ARG", "BASE_IMAGE=python:3.11-slim")
    stages = [args for instruction, args in instructions if instruction == "FROM"]
    assert stages == ["${BASE_IMAGE} AS build", "${BASE_IMAGE}"]
    users = [args for instruction, args in instructions if instruction == "USER"]
    assert users, "no USER instruction"
    user = users[-1].split(":")[0]
    assert user not in {"root", "0"}
    # Numeric, so Kubernetes' runAsNonRoot can verify it; the Deployment uses the same UID.
    assert user.isdigit()
    pod = k8s_object("Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(user)

    healthchecks = [args for instruction, args in instructions if instruction == "HEALTHCHECK"]
    assert len(healthchecks) == 1
    assert "/healthz" in healthchecks[0]
    assert "EDGE_ADMIN_LISTEN" in healthchecks[0]

    env = " ".join(args for instruction, args in instructions if instruction == "ENV")
    assert "EDGE_LISTEN=0.0.0.0:8080" in env
    assert "EDGE_ADMIN_LISTEN=0.0.0.0:9090" in env
    exposed = {
        port
        for instruction, args in instructions
        if instruction == "EXPOSE"
        for port in args.split()
    }
    assert exposed == {"8080", "9090"}
    assert ("STOPSIGNAL", "SIGTERM") in instructions
    assert instructions[-1] == ("ENTRYPOINT", '["edge", "serve"]')


def test_dockerignore_keeps_what_the_image_copies() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".venv", ".git", "**/node_modules", "results"} <= ignored
    for instruction, args in dockerfile_instructions():
        # COPY --from copies from an earlier stage, not from the build context.
        if instruction == "COPY" and not args.startswith("--from="):
            for source in args.split()[:-1]:
                assert source not in ignored, f"{source} is copied but excluded by .dockerignore"
                assert (ROOT / source).exists(), source


# --- YAML ------------------------------------------------------------------------------------


def test_yamllint_passes() -> None:
    files = [str(COMPOSE), *map(str, K8S_FILES)]
    result = run(tool("yamllint"), "--strict", "-c", str(YAMLLINT_CONFIG), *files)
    assert result.returncode == 0, result.stdout + result.stderr


# --- docker compose --------------------------------------------------------------------------


def test_compose_has_the_stack() -> None:
    compose = yaml.safe_load(COMPOSE.read_text())
    services = compose["services"]
    assert set(services) >= COMPOSE_SERVICES

    for name in ("edge-1", "edge-2"):
        edge = services[name]
        assert edge["build"]["context"] == ".."
        assert (COMPOSE.parent / edge["build"]["context"] / edge["build"]["dockerfile"]).exists()
        env = edge["environment"]
        assert env["EDGE_ORIGIN"] == "http://origin:4437"
        assert env["EDGE_REDIS_URL"] == "redis://redis:6379/0"
        assert all(key.startswith("EDGE_") for key in env)
        assert set(edge["depends_on"]) == {"origin", "redis"}
        grace = int(edge["stop_grace_period"].removesuffix("s"))
        assert grace > float(env["EDGE_DRAIN_SECONDS"])

    origin = services["origin"]
    assert "origin.mjs --host 0.0.0.0 --port 4437" in " ".join(origin["command"])
    assert "healthcheck" in origin
    assert services["redis"]["image"].startswith("redis:7")
    assert "healthcheck" in services["redis"]
    assert services["haproxy"]["image"] == "haproxy:2.6"
    assert "8080:8080" in services["haproxy"]["ports"]

    # Every file the stack mounts from deploy/ is one the project ships.
    mounts = {
        volume.split(":")[0]
        for service in services.values()
        for volume in service.get("volumes", [])
        if volume.startswith("./")
    }
    assert {
        "./haproxy/haproxy.cfg",
        "./prometheus/prometheus.yml",
        "./prometheus/alerts.yml",
        "./grafana/provisioning",
        "./grafana/dashboards",
    } <= mounts
    for mount in mounts:
        assert (COMPOSE.parent / mount).exists(), mount


def test_compose_and_kubernetes_run_the_image_make_image_builds() -> None:
    tag = default_tag()
    assert tag == "edge:dev"
    compose = yaml.safe_load(COMPOSE.read_text())
    for name in ("edge-1", "edge-2"):
        # compose fills ${EDGE_IMAGE} from deploy/.env, the file make image reads its tag from.
        assert compose["services"][name]["image"].startswith("${EDGE_IMAGE")
    (container,) = k8s_object("Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == tag


# --- HAProxy ---------------------------------------------------------------------------------


def test_haproxy_config_is_valid(tmp_path: Path) -> None:
    haproxy = shutil.which("haproxy") or (
        "/usr/sbin/haproxy" if Path("/usr/sbin/haproxy").exists() else None
    )
    assert haproxy is not None, "haproxy is not installed (make bootstrap installs it)"
    # The certificate is the operator's (mounted in compose): checked with a throwaway one in
    # its place, every other line as shipped.
    cfg = HAPROXY_CFG.read_text()
    assert cfg.count(MOUNTED_CERT) == 1
    checked = tmp_path / "haproxy.cfg"
    checked.write_text(cfg.replace(MOUNTED_CERT, str(make_certificate(tmp_path / "edge.pem"))))
    result = run(haproxy, "-c", "-f", str(checked))
    output = result.stdout + result.stderr
    assert result.returncode == 0, output
    # Only what comes from running outside compose is allowed: its host names do not resolve
    # here, and (in a sandbox without a network) Docker's DNS address may not be reachable.
    allowed = ("could not resolve address", "can't connect socket for nameserver")
    warnings = [line for line in output.splitlines() if "[WARNING]" in line]
    assert all(any(reason in line for reason in allowed) for line in warnings), warnings


def test_haproxy_places_resume_routes_anywhere_and_sessions_on_one_upstream() -> None:
    cfg = HAPROXY_CFG.read_text()
    # Any replica resumes any answer: resume routes are round-robin, on both frontends.
    assert cfg.count("use_backend edges_any if resume_route") == 2
    any_backend = cfg.split("\nbackend edges_any", 1)[1].split("\nbackend ", 1)[0]
    assert re.search(r"^\s*balance roundrobin$", any_backend, re.MULTILINE)
    # A stateful MCP upstream's session sticks to the process that minted its id
    # (tests/integration/test_resume_placement.py runs these lines).
    sessions = cfg.split("backend mcp_servers", 1)[1]
    assert "stick store-response res.hdr(Mcp-Session-Id)" in sessions
    assert "stick on req.hdr(Mcp-Session-Id)" in sessions


def test_haproxy_checks_readiness_and_allows_long_streams() -> None:
    cfg = HAPROXY_CFG.read_text()
    assert "option httpchk GET /readyz" in cfg
    assert "http-check expect status 200" in cfg
    # One replica per stream (docs/scaling.md): the path picks it, bounded-load consistent hash.
    assert re.search(r"^\s*balance uri path-only$", cfg, re.MULTILINE)
    assert re.search(r"^\s*hash-type consistent$", cfg, re.MULTILINE)
    assert re.search(r"^\s*hash-balance-factor 150$", cfg, re.MULTILINE)
    # SSE events leave at once (without it HAProxy's MSG_MORE held each for ~200 ms, measured),
    # and the loopback cluster the tests and benchmarks run forwards the same way.
    assert re.search(r"^\s*option http-no-delay$", cfg, re.MULTILINE)
    assert "option http-no-delay" in deployed_routing()
    assert re.search(r"check port 9090 inter 2s fall 2 rise 2", cfg)
    assert re.search(r"^\s*server edge-1 edge-1:8080", cfg, re.MULTILINE)
    assert re.search(r"^\s*server edge-2 edge-2:8080", cfg, re.MULTILINE)
    timeouts = dict(re.findall(r"^\s*timeout (server|client|tunnel) (\d+)s$", cfg, re.MULTILINE))
    for name in ("server", "client", "tunnel"):
        assert int(timeouts[name]) >= 120, name
    # Nothing holds a request (a read has no body to wait for) or buffers an answer.
    assert not re.search(r"^\s*option http-buffer-request", cfg, re.MULTILINE)


def test_haproxy_serves_https_with_http2_to_browsers() -> None:
    cfg = HAPROXY_CFG.read_text()
    assert re.search(
        rf"^\s*bind :8443 ssl crt {re.escape(MOUNTED_CERT)} alpn h2,http/1\.1$", cfg, re.MULTILINE
    )
    # The same replicas behind, spoken to in HTTP/1.1 (no `proto h2` on the servers).
    frontend = cfg.split("frontend streams_tls", 1)[1].split("\n\n", 1)[0]
    assert "default_backend edges" in frontend
    assert " proto h2" not in cfg
    services = load_all(COMPOSE)[0]["services"]
    assert "8443:8443" in services["haproxy"]["ports"]
    assert f"./haproxy/certs:{Path(MOUNTED_CERT).parent}:ro" in services["haproxy"]["volumes"]
    # `docker compose up` works with no certificate given: one is made there first (yours is
    # kept), by the shipped devstack/tls.py run in the edge image.
    maker = services["tls-cert"]
    assert maker["image"] == services["edge-1"]["image"]
    assert services["haproxy"]["depends_on"]["tls-cert"] == {
        "condition": "service_completed_successfully"
    }
    assert "./haproxy/certs:/certs" in maker["volumes"]
    assert "../devstack/tls.py:/tls.py:ro" in maker["volumes"]
    assert (COMPOSE.parent / "../devstack/tls.py").exists()
    assert maker["entrypoint"][-1] == (
        "test -s /certs/edge.pem || /opt/edge/bin/python /tls.py /certs/edge.pem"
    )
    # `make cluster --tls` binds its HTTPS frontend the same way (its certificate aside).
    deployed = re.search(r"^\s*bind :8443 (.*)$", cfg, re.MULTILINE)
    twin = re.search(r"^\s*bind \S+ (.*)$", TLS_FRONTEND, re.MULTILINE)
    assert deployed is not None
    assert twin is not None
    assert re.sub(r"crt \S+", "crt", twin[1]) == re.sub(r"crt \S+", "crt", deployed[1])
    # The certificate's directory ships with its instructions, and no key ever goes into git.
    certs = DEPLOY / "haproxy" / "certs"
    assert (certs / "README.md").exists()
    assert "*.pem" in (certs / ".gitignore").read_text().splitlines()


# --- Kubernetes ------------------------------------------------------------------------------


def test_the_ingress_serves_https_with_http2_and_routes_by_stream() -> None:
    ingress = k8s_object("Ingress")
    annotations = ingress["metadata"]["annotations"]
    assert annotations["nginx.ingress.kubernetes.io/upstream-hash-by"] == "$uri"
    assert annotations["nginx.ingress.kubernetes.io/proxy-buffering"] == "off"
    assert int(annotations["nginx.ingress.kubernetes.io/proxy-read-timeout"]) >= 120
    assert "use-http2" not in str(annotations)  # ingress-nginx's default (on) is kept
    (tls,) = ingress["spec"]["tls"]
    (rule,) = ingress["spec"]["rules"]
    assert tls["hosts"] == [rule["host"]]
    (path,) = rule["http"]["paths"]
    service = k8s_object("Service")
    assert path["backend"]["service"]["name"] == service["metadata"]["name"]
    assert path["backend"]["service"]["port"]["name"] in {
        p["name"] for p in service["spec"]["ports"]
    }


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_kubernetes_manifests_validate(version: str) -> None:
    assert {path.name for path in K8S_FILES} >= {
        "configmap.yaml",
        "deployment.yaml",
        "service.yaml",
        "hpa.yaml",
        "pdb.yaml",
    }
    command = (tool("kubernetes-validate"), "--strict", "--kubernetes-version", version)
    result = run(*command, *map(str, K8S_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_grace_period_covers_prestop_and_drain() -> None:
    config = k8s_object("ConfigMap")["data"]
    pod = k8s_object("Deployment")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    pre_stop = container["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = float(config["EDGE_DRAIN_SECONDS"])
    assert pod["terminationGracePeriodSeconds"] > drain + float(pre_stop[1])


def test_deployment_probes_security_and_config() -> None:
    deployment = k8s_object("Deployment")
    assert deployment["spec"]["replicas"] == 2
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"http": 8080, "admin": 9090}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])
    assert container["envFrom"] == [
        {"configMapRef": {"name": k8s_object("ConfigMap")["metadata"]["name"]}}
    ]

    config = k8s_object("ConfigMap")["data"]
    assert all(key.startswith("EDGE_") for key in config)
    assert {"EDGE_ORIGIN", "EDGE_REDIS_URL", "EDGE_DRAIN_SECONDS"} <= set(config)
    assert config["EDGE_LISTEN"].endswith(":8080")
    assert config["EDGE_ADMIN_LISTEN"].endswith(":9090")


def test_service_hpa_and_pdb_target_the_deployment() -> None:
    deployment = k8s_object("Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()

    service = k8s_object("Service")
    assert service["spec"]["selector"] == selector
    ports = {port["name"]: (port["port"], port["targetPort"]) for port in service["spec"]["ports"]}
    assert ports == {"http": (80, "http"), "admin": (9090, "admin")}
    annotations = service["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "9090"

    hpa = k8s_object("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 10)
    (metric,) = hpa["spec"]["metrics"]
    assert metric["resource"]["name"] == "cpu"
    assert metric["resource"]["target"]["type"] == "Utilization"

    pdb = k8s_object("PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1"
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == selector
