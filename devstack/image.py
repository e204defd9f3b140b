"""Build the edge image (``make image``; the container tests build it the same way).

The rules this module owns:

- One name: ``EDGE_IMAGE`` in deploy/.env (compose reads that file too; the Kubernetes Deployment
  names the same image, a test checks).
- The engine (devstack/engine.py) and the base (devstack/base_image.py) are set up first, each
  only when missing.
- The host's package index reaches the build as a build argument and the CA bundle the host's pip
  trusts as the build secret ``pip-ca``, so pip inside the build reaches the index the host does
  (through a TLS-intercepting proxy too), and neither lands in the image.
- The engine's layer cache decides what is rebuilt. Build time and size are reported, not judged.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from devstack.base_image import DOCKERFILE, REPO, Base, resolve_base
from devstack.engine import Engine, EngineUnavailable, ImageError, find_engine

# The one place the image's name is set: compose reads it from here too.
IMAGE_ENV = REPO / "deploy" / ".env"
SYSTEM_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_TIMEOUT_SECONDS = 900


@dataclass(frozen=True, kw_only=True)
class Built:
    tag: str
    engine: Engine
    base: Base
    seconds: float
    size_bytes: int
    base_size_bytes: int


def default_tag() -> str:
    """``EDGE_IMAGE`` from deploy/.env (compose reads the same file)."""
    for line in IMAGE_ENV.read_text().splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == "EDGE_IMAGE":
            return value.strip()
    raise ImageError(f"{IMAGE_ENV} sets no EDGE_IMAGE")


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
    previous = engine.image_id(tag)
    started = time.monotonic()
    done = subprocess.run(
        engine.argv(*argv), env=env, capture_output=True, timeout=BUILD_TIMEOUT_SECONDS, check=False
    )
    seconds = time.monotonic() - started
    if done.returncode != 0:
        output = (done.stdout + done.stderr).decode(errors="replace")[-6000:]
        raise ImageError(f"{' '.join(engine.argv(*argv))} failed ({done.returncode}):\n{output}")
    if previous is not None and previous != engine.image_id(tag):
        # The image this tag named before, now nameless: without this every changed build would
        # leave one behind. Refused (and kept) while a container still uses it.
        subprocess.run(engine.argv("rmi", previous), capture_output=True, timeout=60, check=False)
    return Built(
        tag=tag,
        engine=engine,
        base=base,
        seconds=seconds,
        size_bytes=engine.size_bytes(tag),
        base_size_bytes=engine.size_bytes(base.image),
    )


def build_image(tag: str | None = None) -> tuple[Engine, Built]:
    engine = find_engine()
    base = resolve_base(engine)
    return engine, build(engine, tag=tag or default_tag(), base=base)


def describe(built: Built) -> str:
    base = f"{built.base.image} ({'stand-in' if built.base.stand_in else 'real'}, "
    base += f"{built.base_size_bytes / 1e6:.1f} MB"
    if built.base.made_seconds is not None:
        base += f", made in {built.base.made_seconds:.1f} s"
    own = (built.size_bytes - built.base_size_bytes) / 1e6
    engine = built.engine.name
    if built.engine.installed_seconds is not None:
        engine += f" (installed in {built.engine.installed_seconds:.1f} s)"
    return (
        f"image {built.tag}: built by {engine} in {built.seconds:.1f} s, "
        f"{built.size_bytes / 1e6:.1f} MB ({own:.1f} MB over its base {base}))"
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
