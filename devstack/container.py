"""Run the edge image as a container on the host network (the container tests use this).

The rules this module owns:

- Host network, loopback addresses: the container listens on 127.0.0.1 and reaches the host's
  origin there, so nothing depends on the engine's bridge networking or publishes a port.
- Configuration is only ``EDGE_*`` environment variables: the image's own entrypoint runs.
- The stream listener binds port 0 and its ready line (``edge serve`` prints one JSON line once it
  listens) says which port it got. The admin port must be known beforehand, because the image's
  HEALTHCHECK reads it from ``EDGE_ADMIN_LISTEN``; it is a free port picked just before start.
- A container is removed by its own name (``rm -f``), never by a pattern.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import time
from dataclasses import dataclass
from typing import Any

from devstack.engine import Engine, ImageError
from devstack.processes import free_port

START_TIMEOUT_SECONDS = 30.0
_names = itertools.count()


@dataclass(frozen=True, kw_only=True)
class Container:
    engine: Engine
    name: str
    ready: dict[str, Any]

    @property
    def url(self) -> str:
        return str(self.ready["listen"])

    @property
    def admin_url(self) -> str:
        return str(self.ready["admin"])

    def inspect(self) -> dict[str, Any]:
        found: list[dict[str, Any]] = json.loads(self.engine.run("inspect", self.name))
        return found[0]

    def logs(self) -> str:
        done = subprocess.run(
            self.engine.argv("logs", self.name), capture_output=True, timeout=30, check=False
        )
        return (done.stdout + done.stderr).decode(errors="replace")

    def host_pid(self) -> int:
        return int(self.inspect()["State"]["Pid"])

    def exec(self, *argv: str) -> str:
        return self.engine.run("exec", self.name, *argv)

    def healthcheck(self) -> bool:
        """Run the image's HEALTHCHECK once, as the engine does on its schedule: podman's
        ``healthcheck run``; Docker has no such command, so its test command runs by exec."""
        if self.engine.name == "podman":
            done = subprocess.run(
                self.engine.argv("healthcheck", "run", self.name),
                capture_output=True,
                timeout=30,
                check=False,
            )
            return done.returncode == 0
        image = self.inspect()["Config"]["Image"]
        raw = self.engine.run("image", "inspect", "--format", "{{json .Config.Healthcheck}}", image)
        test = json.loads(raw)["Test"]
        argv = test[1:] if test[0] == "CMD" else ["/bin/sh", "-c", test[1]]
        done = subprocess.run(
            self.engine.argv("exec", self.name, *argv), capture_output=True, timeout=30, check=False
        )
        return done.returncode == 0

    def health_status(self) -> str | None:
        """What the engine recorded for the last health check ("healthy", "unhealthy", ...)."""
        state = self.inspect()["State"]
        health = state.get("Health") or state.get("Healthcheck") or {}
        status = health.get("Status")
        return str(status) if status else None

    def signal(self, name: str) -> None:
        self.engine.run("kill", "--signal", name, self.name)

    def wait(self, timeout: float) -> int:
        """The container's exit code once it has stopped."""
        return int(self.engine.run("wait", self.name, timeout=timeout).strip().splitlines()[-1])

    def remove(self) -> None:
        grace = ("-t", "0") if self.engine.name == "podman" else ()
        subprocess.run(
            self.engine.argv("rm", "-f", *grace, self.name),
            capture_output=True,
            timeout=60,
            check=False,
        )


def _ready_line(output: str) -> dict[str, Any] | None:
    for line in output.splitlines():
        if line.startswith("{"):
            try:
                ready: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            if "listen" in ready and "admin" in ready:
                return ready
    return None


def start(
    engine: Engine,
    image: str,
    env: dict[str, str],
    *,
    prefix: str = "edge",
    options: tuple[str, ...] = (),
) -> Container:
    """Run ``image`` detached with ``env`` (EDGE_* only) and ``options`` (engine flags such as
    ``--read-only``), and wait for its ready line."""
    assert all(key.startswith("EDGE_") for key in env), env
    name = f"{prefix}-{os.getpid()}-{next(_names)}"
    settings = {"EDGE_LISTEN": "127.0.0.1:0", "EDGE_ADMIN_LISTEN": f"127.0.0.1:{free_port()}"}
    settings.update(env)
    argv = ["run", "--detach", "--name", name, "--network", "host", *engine.ulimit_args, *options]
    for key, value in settings.items():
        argv += ["--env", f"{key}={value}"]
    engine.run(*argv, image)
    container = Container(engine=engine, name=name, ready={})
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        output = container.logs()
        ready = _ready_line(output)
        if ready is not None:
            return Container(engine=engine, name=name, ready=ready)
        if not container.inspect()["State"]["Running"]:
            break
        time.sleep(0.1)
    output = container.logs()
    container.remove()
    raise ImageError(f"container {name} did not start:\n{output[-3000:]}")


def run_once(engine: Engine, image: str, entrypoint: str, *args: str, user: str = "") -> str:
    """Run ``entrypoint args`` in a throwaway container of ``image``; its stdout."""
    argv = ["run", "--rm", "--network", "host", "--entrypoint", entrypoint, *engine.ulimit_args]
    if user:
        argv += ["--user", user]
    return engine.run(*argv, image, *args, timeout=120)
