"""Build the edge image (``make image``): Docker where a daemon answers, else Debian's podman.

The rules this module owns:

- Setting up does only what is missing, so running it again is free: ``apt-get install podman
  runc debootstrap`` when one of them is absent (root and apt only; otherwise the engine is
  *unavailable* and says why). ``/etc/containers/containers.conf`` is written only when there is
  none: ``runtime = "runc"`` (crun refuses this machine's hybrid cgroups) and ``default_ulimits``
  no higher than the machine's hard limits (podman's defaults fail with ``setrlimit``). A file
  that exists is never edited; when it does not name runc, our own podman commands pass
  ``--runtime runc`` and the ulimits themselves, and say so once.
- The base is the real ``python:3.11-slim`` when the engine has it or can pull it. Otherwise a
  stand-in is made once, by ``debootstrap --variant=minbase`` of Debian bookworm (its Python is
  3.11) from the mirror apt is configured with, and imported as ``STAND_IN`` under a name of its
  own, never as ``python:3.11-slim``: no other build on the machine can mistake it for the real
  image (whose python lives elsewhere). Its label names the recipe, so a changed recipe remakes it.
- The host's package index reaches the build as a build argument and the CA bundle the host's pip
  trusts as the build secret ``pip-ca``, so pip inside the build reaches the index the host does
  (through a TLS-intercepting proxy too) and neither lands in the image.
- The engine's layer cache decides what is rebuilt. Build time and size are reported, not judged.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"
# The one place the image's name is set: compose reads it from here too (deploy/.env).
IMAGE_ENV = REPO / "deploy" / ".env"
CONTAINERS_CONF = Path("/etc/containers/containers.conf")
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")

STAND_IN = "localhost/edge-base:bookworm-python3.11"
STAND_IN_SUITE = "bookworm"
STAND_IN_PACKAGES = ("python3", "python3-venv", "ca-certificates")
STAND_IN_ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
)
STAND_IN_LABEL = "io.edge.stand-in"
NPROC_CAP = 32768
PULL_TIMEOUT_SECONDS = 60
BUILD_TIMEOUT_SECONDS = 900


class EngineUnavailable(RuntimeError):
    """No container engine can be used or installed on this machine (the reason is the text)."""


class ImageError(RuntimeError):
    """An engine command failed; the text carries its output."""


@dataclass(frozen=True, kw_only=True)
class Engine:
    name: str  # "docker" or "podman"
    # podman only, when containers.conf does not already say these
    runtime_args: tuple[str, ...] = ()
    ulimit_args: tuple[str, ...] = ()

    def argv(self, *args: str) -> list[str]:
        return [self.name, *self.runtime_args, *args]

    def run(self, *args: str, timeout: float = 120, stdin: bytes | None = None) -> str:
        result = subprocess.run(
            self.argv(*args), input=stdin, capture_output=True, timeout=timeout, check=False
        )
        if result.returncode != 0:
            output = (result.stdout + result.stderr).decode(errors="replace")[-4000:]
            raise ImageError(
                f"{' '.join(self.argv(*args))} failed ({result.returncode}):\n{output}"
            )
        return result.stdout.decode(errors="replace")

    def has(self, image: str) -> bool:
        found = subprocess.run(
            self.argv("image", "inspect", image), capture_output=True, timeout=60, check=False
        )
        return found.returncode == 0

    def labels(self, image: str) -> dict[str, str]:
        raw = self.run("image", "inspect", "--format", "{{json .Config.Labels}}", image)
        labels = json.loads(raw or "null")
        return dict(labels or {})

    def size_bytes(self, image: str) -> int:
        return int(self.run("image", "inspect", "--format", "{{.Size}}", image).strip())


@dataclass(frozen=True, kw_only=True)
class Base:
    image: str
    stand_in: bool
    made_seconds: float | None  # set when this call made the stand-in


@dataclass(frozen=True, kw_only=True)
class Built:
    tag: str
    engine: str
    base: Base
    seconds: float
    size_bytes: int


def default_tag() -> str:
    """``EDGE_IMAGE`` from deploy/.env (compose reads the same file)."""
    for line in IMAGE_ENV.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == "EDGE_IMAGE":
            return value.strip()
    raise ImageError(f"{IMAGE_ENV} sets no EDGE_IMAGE")


def real_base() -> str:
    """The Dockerfile's own default base (``ARG BASE_IMAGE=...``), fully qualified."""
    found = re.search(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    if found is None:
        raise ImageError("the Dockerfile declares no ARG BASE_IMAGE default")
    name = found.group(1)
    return name if "/" in name else f"docker.io/library/{name}"


# --- the engine --------------------------------------------------------------------------------


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=15, check=False)
    except subprocess.TimeoutExpired:
        return False
    return info.returncode == 0


def _which(binary: str) -> bool:
    return shutil.which(binary) is not None or Path("/usr/sbin", binary).exists()


def _install_podman() -> None:
    missing = [name for name in ("podman", "runc", "debootstrap") if not _which(name)]
    if not missing:
        return
    if shutil.which("apt-get") is None:
        raise EngineUnavailable(
            f"no Docker daemon, and {' '.join(missing)} missing without apt-get"
        )
    if os.geteuid() != 0:
        raise EngineUnavailable(f"no Docker daemon, and installing {' '.join(missing)} needs root")
    print(f"image: installing {' '.join(missing)} (apt-get)", file=sys.stderr)
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    # Another apt may be running (a parallel bootstrap): wait for its lock instead of failing.
    lock = ("-o", "DPkg::Lock::Timeout=600")
    for argv in (
        ["apt-get", *lock, "update", "-qq"],
        ["apt-get", *lock, "install", "-y", "-qq", *missing],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, timeout=1200, check=False)
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode(errors="replace")[-2000:]
            raise EngineUnavailable(f"{' '.join(argv)} failed:\n{output}")


def _ulimits() -> list[str]:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1_048_576 if nofile == resource.RLIM_INFINITY else nofile
    nproc = NPROC_CAP if nproc == resource.RLIM_INFINITY else min(nproc, NPROC_CAP)
    return [f"nofile={nofile}:{nofile}", f"nproc={nproc}:{nproc}"]


def _containers_conf_text() -> str:
    ulimits = ", ".join(f'"{limit}"' for limit in _ulimits())
    return (
        "# Written by edge's devstack/image.py (make image, make test) because none existed.\n"
        "# runc: crun refuses this machine's hybrid cgroups. The ulimits are the machine's hard\n"
        "# limits: podman's defaults are higher and fail with `setrlimit: Operation not "
        "permitted`.\n"
        "[containers]\n"
        f"default_ulimits = [{ulimits}]\n"
        "\n"
        "[engine]\n"
        'runtime = "runc"\n'
    )


def _names_runc(conf: Path) -> bool:
    try:
        parsed = tomllib.loads(conf.read_text())
    except (OSError, tomllib.TOMLDecodeError):
        return False
    engine = parsed.get("engine")
    return isinstance(engine, dict) and engine.get("runtime") == "runc"


def _podman() -> Engine:
    _install_podman()
    if not CONTAINERS_CONF.exists():
        CONTAINERS_CONF.parent.mkdir(parents=True, exist_ok=True)
        CONTAINERS_CONF.write_text(_containers_conf_text())
        print(f"image: wrote {CONTAINERS_CONF} (runc, ulimits {_ulimits()})", file=sys.stderr)
    if _names_runc(CONTAINERS_CONF):
        return Engine(name="podman")
    print(
        f"image: {CONTAINERS_CONF} exists and does not name runc; left as it is, and passing "
        "--runtime runc and --ulimit on this build's own commands",
        file=sys.stderr,
    )
    ulimits = tuple(arg for limit in _ulimits() for arg in ("--ulimit", limit))
    return Engine(name="podman", runtime_args=("--runtime", "runc"), ulimit_args=ulimits)


def find_engine() -> Engine:
    """Docker when its daemon answers (or EDGE_IMAGE_ENGINE says so), else podman, installed."""
    wanted = os.environ.get("EDGE_IMAGE_ENGINE", "")
    if wanted not in ("", "docker", "podman"):
        raise EngineUnavailable(f"EDGE_IMAGE_ENGINE={wanted!r}: use docker or podman")
    if wanted == "docker" or (not wanted and _docker_answers()):
        return Engine(name="docker")
    return _podman()


# --- the base ----------------------------------------------------------------------------------


def debian_mirror() -> str:
    """The Debian mirror apt is configured with (deb822 .sources first, then sources.list)."""
    sources = sorted(Path("/etc/apt/sources.list.d").glob("*.sources"))
    for path in sources:
        for stanza in path.read_text().split("\n\n"):
            fields = {
                key.strip().lower(): value.strip()
                for key, sep, value in (line.partition(":") for line in stanza.splitlines())
                if sep and not key.startswith("#")
            }
            suites = fields.get("suites", "").split()
            if "deb" in fields.get("types", "").split() and STAND_IN_SUITE in suites:
                return fields["uris"].split()[0]
    for path in [Path("/etc/apt/sources.list"), *Path("/etc/apt/sources.list.d").glob("*.list")]:
        if not path.exists():
            continue
        for line in path.read_text().splitlines():
            words = [w for w in line.split() if not w.startswith("[")]
            if len(words) >= 3 and words[0] == "deb" and words[2] == STAND_IN_SUITE:
                return words[1]
    return "http://deb.debian.org/debian"


def _recipe() -> str:
    text = " ".join((STAND_IN_SUITE, "minbase", *STAND_IN_PACKAGES, *STAND_IN_ENV))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def make_stand_in(engine: Engine) -> float:
    """debootstrap a bookworm root with Python 3.11 and import it as STAND_IN; seconds taken."""
    if not _which("debootstrap"):
        raise EngineUnavailable("the stand-in base needs debootstrap (apt-get install debootstrap)")
    mirror = debian_mirror()
    print(f"image: making the stand-in base {STAND_IN} from {mirror}", file=sys.stderr)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="edge-base-", dir="/var/tmp") as scratch:
        root = Path(scratch, "root")
        argv = [
            "debootstrap",
            "--variant=minbase",
            f"--include={','.join(STAND_IN_PACKAGES)}",
            STAND_IN_SUITE,
            str(root),
            mirror,
        ]
        done = subprocess.run(argv, capture_output=True, timeout=1200, check=False)
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode(errors="replace")[-3000:]
            raise ImageError(f"{' '.join(argv)} failed:\n{output}")
        # What python:3.11-slim leaves out too: the package cache and the index.
        for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
            for entry in (root / leftover).glob("*"):
                if entry.is_file():
                    entry.unlink()
        tar = subprocess.run(
            ["tar", "-C", str(root), "--numeric-owner", "-c", "."],
            capture_output=True,
            timeout=300,
            check=True,
        )
        changes = [f"ENV {env}" for env in STAND_IN_ENV]
        changes += [f"LABEL {STAND_IN_LABEL}={_recipe()}", 'CMD ["python3"]']
        engine.run(
            "import",
            *(arg for change in changes for arg in ("--change", change)),
            "-",
            STAND_IN,
            stdin=tar.stdout,
            timeout=300,
        )
    return time.monotonic() - started


def resolve_base(engine: Engine) -> Base:
    """The real base if present or pullable, else the stand-in (made when missing or stale)."""
    forced = os.environ.get("EDGE_IMAGE_BASE")
    if forced:
        return Base(image=forced, stand_in=False, made_seconds=None)
    real = real_base()
    if engine.has(real):
        return Base(image=real, stand_in=False, made_seconds=None)
    if engine.has(STAND_IN) and engine.labels(STAND_IN).get(STAND_IN_LABEL) == _recipe():
        return Base(image=STAND_IN, stand_in=True, made_seconds=None)
    try:
        engine.run("pull", real, timeout=PULL_TIMEOUT_SECONDS)
        return Base(image=real, stand_in=False, made_seconds=None)
    except (ImageError, subprocess.TimeoutExpired) as error:
        first = str(error).splitlines()[-1] if str(error) else "timed out"
        print(f"image: cannot pull {real} ({first}); using a stand-in", file=sys.stderr)
    seconds = make_stand_in(engine)
    return Base(image=STAND_IN, stand_in=True, made_seconds=seconds)


# --- the build ---------------------------------------------------------------------------------


def _pip_setting(env_name: str, key: str) -> str | None:
    if os.environ.get(env_name):
        return os.environ[env_name]
    pip = [sys.executable, "-m", "pip", "config", "get", key]
    try:
        found = subprocess.run(pip, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    value = found.stdout.strip()
    return value if found.returncode == 0 and value else None


def build_arguments() -> tuple[list[str], list[str]]:
    """(build args, secrets): the host's package index (http(s) only: the host's file:// indexes
    are not in the build) and proxies; the CA bundle the host's pip trusts."""
    args: list[str] = []
    index = _pip_setting("PIP_INDEX_URL", "global.index-url")
    if index and index.startswith(("http://", "https://")):
        args.append(f"PIP_INDEX_URL={index}")
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "http_proxy", "https_proxy", "no_proxy"):
        if os.environ.get(name):
            args.append(f"{name}={os.environ[name]}")
    cert = _pip_setting("PIP_CERT", "global.cert")
    bundle = Path(cert) if cert else SYSTEM_CA_BUNDLE
    secrets = [f"id=pip-ca,src={bundle}"] if bundle.is_file() else []
    return args, secrets


def build(engine: Engine, *, tag: str, base: Base) -> Built:
    args, secrets = build_arguments()
    argv = ["build", "--network", "host", "--tag", tag, "--file", str(DOCKERFILE)]
    argv += ["--build-arg", f"BASE_IMAGE={base.image}"]
    for arg in args:
        argv += ["--build-arg", arg]
    for secret in secrets:
        argv += ["--secret", secret]
    if engine.name == "podman":
        # HEALTHCHECK exists only in Docker's image format; OCI would drop it.
        argv += ["--pull=never", "--format", "docker", *engine.ulimit_args]
    argv.append(str(REPO))
    env = {**os.environ, "DOCKER_BUILDKIT": "1"}
    started = time.monotonic()
    done = subprocess.run(
        engine.argv(*argv), env=env, capture_output=True, timeout=BUILD_TIMEOUT_SECONDS, check=False
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        output = (done.stdout + done.stderr).decode(errors="replace")[-6000:]
        raise ImageError(f"{' '.join(engine.argv(*argv))} failed ({done.returncode}):\n{output}")
    return Built(
        tag=tag, engine=engine.name, base=base, seconds=seconds, size_bytes=engine.size_bytes(tag)
    )


def build_image(tag: str | None = None) -> tuple[Engine, Built]:
    engine = find_engine()
    base = resolve_base(engine)
    return engine, build(engine, tag=tag or default_tag(), base=base)


def describe(built: Built) -> str:
    base = f"{built.base.image} ({'stand-in' if built.base.stand_in else 'real'}"
    if built.base.made_seconds is not None:
        base += f", made in {built.base.made_seconds:.1f} s"
    return (
        f"image {built.tag}: built by {built.engine} in {built.seconds:.1f} s, "
        f"{built.size_bytes / 1e6:.1f} MB, base {base})"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devstack.image", description="Build the edge image (make image)."
    )
    parser.add_argument("--tag", help=f"image name (default: EDGE_IMAGE in {IMAGE_ENV})")
    options = parser.parse_args(argv)
    try:
        _, built = build_image(options.tag)
    except (EngineUnavailable, ImageError) as error:
        print(f"image: {error}", file=sys.stderr)
        return 1
    print(describe(built))
    return 0


if __name__ == "__main__":
    sys.exit(main())
