"""The container engine: Docker where its daemon answers, else Debian's podman with runc.

The rules this module owns:

- Setting up does only what is missing, so running it again is free: ``apt-get install podman
  runc debootstrap`` when one of them is absent (root and apt only; otherwise the engine is
  *unavailable* and says why). ``/etc/containers/containers.conf`` is written only when there is
  none and we are root: ``runtime = "runc"`` (crun refuses this machine's hybrid cgroups) and
  ``default_ulimits`` no higher than the machine's hard limits (podman's defaults fail with
  ``setrlimit``). A file that exists is never edited; when it does not name runc, our own podman
  commands pass ``--runtime runc`` and the ulimits themselves, and say so.
- Engine commands are argv lists, run with a timeout; a failure raises ``ImageError`` with the
  command's output.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

CONTAINERS_CONF = Path("/etc/containers/containers.conf")
NPROC_CAP = 32768


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
    installed_seconds: float | None = None  # set when this call installed it

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

    def image_id(self, image: str) -> str | None:
        if not self.has(image):
            return None
        return self.run("image", "inspect", "--format", "{{.Id}}", image).strip()

    def labels(self, image: str) -> dict[str, str]:
        raw = self.run("image", "inspect", "--format", "{{json .Config.Labels}}", image)
        labels = json.loads(raw or "null")
        return dict(labels or {})

    def size_bytes(self, image: str) -> int:
        return int(self.run("image", "inspect", "--format", "{{.Size}}", image).strip())


# --- finding (and setting up) one ----------------------------------------------------------------


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        info = subprocess.run(["docker", "info"], capture_output=True, timeout=15, check=False)
    except subprocess.TimeoutExpired:
        return False
    return info.returncode == 0


def which(binary: str) -> bool:
    return shutil.which(binary) is not None or Path("/usr/sbin", binary).exists()


def _install_podman() -> float | None:
    """Install what is missing; the seconds that took, or None when nothing was."""
    missing = [name for name in ("podman", "runc", "debootstrap") if not which(name)]
    if not missing:
        return None
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
    started = time.monotonic()
    for argv in (
        ["apt-get", *lock, "update", "-qq"],
        ["apt-get", *lock, "install", "-y", "-qq", *missing],
    ):
        done = subprocess.run(argv, env=env, capture_output=True, timeout=1200, check=False)
        if done.returncode != 0:
            output = (done.stdout + done.stderr).decode(errors="replace")[-2000:]
            raise EngineUnavailable(f"{' '.join(argv)} failed:\n{output}")
    return time.monotonic() - started


def _ulimits() -> list[str]:
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)[1]
    nofile = 1_048_576 if nofile == resource.RLIM_INFINITY else nofile
    nproc = NPROC_CAP if nproc == resource.RLIM_INFINITY else min(nproc, NPROC_CAP)
    return [f"nofile={nofile}:{nofile}", f"nproc={nproc}:{nproc}"]


def _containers_conf_text() -> str:
    ulimits = ", ".join(f'"{limit}"' for limit in _ulimits())
    return (
        "# Written by edge's devstack/engine.py (make image, make test) because none existed.\n"
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
    installed = _install_podman()
    if not CONTAINERS_CONF.exists() and os.geteuid() == 0:
        CONTAINERS_CONF.parent.mkdir(parents=True, exist_ok=True)
        CONTAINERS_CONF.write_text(_containers_conf_text())
        print(f"image: wrote {CONTAINERS_CONF} (runc, ulimits {_ulimits()})", file=sys.stderr)
    if _names_runc(CONTAINERS_CONF):
        return Engine(name="podman", installed_seconds=installed)
    print(
        f"image: {CONTAINERS_CONF} does not name runc (or is not ours to write); left as it "
        "is, and passing --runtime runc and --ulimit on these commands instead",
        file=sys.stderr,
    )
    ulimits = tuple(arg for limit in _ulimits() for arg in ("--ulimit", limit))
    return Engine(
        name="podman",
        runtime_args=("--runtime", "runc"),
        ulimit_args=ulimits,
        installed_seconds=installed,
    )


def find_engine() -> Engine:
    """Docker when its daemon answers (or EDGE_IMAGE_ENGINE says so), else podman, installed."""
    wanted = os.environ.get("EDGE_IMAGE_ENGINE", "")
    if wanted not in ("", "docker", "podman"):
        raise EngineUnavailable(f"EDGE_IMAGE_ENGINE={wanted!r}: use docker or podman")
    if wanted == "docker" or (not wanted and _docker_answers()):
        return Engine(name="docker")
    return _podman()
