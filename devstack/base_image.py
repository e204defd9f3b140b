"""The image's base: the real python:3.11-slim, or a stand-in made here once.

The rules this module owns:

- The base is the real ``python:3.11-slim`` (the Dockerfile's ``ARG BASE_IMAGE`` default) when
  the engine has it or can pull it. Otherwise a stand-in is made once, by ``debootstrap
  --variant=minbase`` of Debian bookworm (its Python is 3.11, at /usr/bin/python3) from the
  mirror apt is configured with, and imported as ``STAND_IN``: a name of its own, never
  ``python:3.11-slim``, so no other build on the machine mistakes it for the real image (whose
  python lives in /usr/local). Its label names its recipe, so a changed recipe remakes it.
- The stand-in holds only what the Dockerfile needs of a base (python3 and its venv module, CA
  certificates); the machine's own CA certificates are not in it: a build gets them as a secret.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from devstack.engine import Engine, EngineUnavailable, ImageError, which

REPO = Path(__file__).resolve().parent.parent
DOCKERFILE = REPO / "Dockerfile"
STAND_IN = "localhost/edge-base:bookworm-python3.11"
STAND_IN_SUITE = "bookworm"
STAND_IN_PACKAGES = ("python3", "python3-venv", "ca-certificates")
STAND_IN_ENV = (
    "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
    "LANG=C.UTF-8",
)
STAND_IN_LABEL = "io.edge.stand-in"
PULL_TIMEOUT_SECONDS = 60


@dataclass(frozen=True, kw_only=True)
class Base:
    image: str
    stand_in: bool
    made_seconds: float | None  # set when this call made the stand-in


def real_base() -> str:
    """The Dockerfile's own default base (``ARG BASE_IMAGE=...``), fully qualified."""
    found = re.search(r"^ARG BASE_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.MULTILINE)
    if found is None:
        raise ImageError("the Dockerfile declares no ARG BASE_IMAGE default")
    name = found.group(1)
    return name if "/" in name else f"docker.io/library/{name}"


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
    if not which("debootstrap"):
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
