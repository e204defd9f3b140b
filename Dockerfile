# edge: the Durable Streams caching edge proxy.
#
#   make image                       # edge:dev, with Docker or (here) podman; see devstack/image.py
#   docker build -t edge:dev .       # the same by hand
#   docker run --rm -p 8080:8080 -p 9090:9090 -e EDGE_ORIGIN=http://origin:4437 edge:dev
#
# Configuration is by EDGE_* environment variables (every `edge serve` flag has one; see
# `edge serve --help`). Stream traffic listens on 8080, /healthz /readyz /metrics on 9090.
#
# The admin listener binds every interface here, so its POST /purge answers 403 until a token is
# set: pass EDGE_ADMIN_TOKEN at run time (from a secret, never baked into the image) and send
# `Authorization: Bearer <token>`. Publish 9090 only to your monitoring network.
#
# BASE_IMAGE is python:3.11-slim. Any Debian-like image with python3 (and its venv module) at
# either /usr/local/bin or /usr/bin works, which is why nothing below names a python path
# outside the image's own virtualenv.
ARG BASE_IMAGE=python:3.11-slim

# --- build: a virtualenv holding edge and its runtime dependencies, nothing else -----------------
FROM ${BASE_IMAGE} AS build

# Where the build reaches its package index. Build arguments of this stage only: they never
# reach the final image's layers, history or environment.
ARG PIP_INDEX_URL=https://pypi.org/simple
ENV PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /build
COPY pyproject.toml constraints.txt README.md ./
COPY edge ./edge
# Runtime dependencies only, pinned by the same constraints file CI tests against (it also pins
# dev tools; a constraint only pins what is installed, it installs nothing by itself). A CA bundle
# passed as the build secret `pip-ca` (a TLS-intercepting proxy's) is used for this step only.
# The installer itself is removed afterwards: the image runs edge, it installs nothing.
RUN --mount=type=secret,id=pip-ca \
    if [ -s /run/secrets/pip-ca ]; then export PIP_CERT=/run/secrets/pip-ca; fi \
    && python3 -m venv /opt/edge \
    && /opt/edge/bin/pip install --no-cache-dir -c constraints.txt . \
    && /opt/edge/bin/python -m pip uninstall --yes --quiet pip setuptools

# --- runtime -------------------------------------------------------------------------------------
FROM ${BASE_IMAGE}

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/opt/edge/bin:$PATH

# A fixed numeric UID/GID, so Kubernetes' runAsNonRoot can verify it without a name lookup.
RUN groupadd --system --gid 10001 edge \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin edge

COPY --from=build /opt/edge /opt/edge

WORKDIR /
ENV EDGE_LISTEN=0.0.0.0:8080 \
    EDGE_ADMIN_LISTEN=0.0.0.0:9090

USER 10001:10001
EXPOSE 8080 9090

# Liveness of the process via the admin listener (slim has no curl; use the stdlib).
HEALTHCHECK --interval=10s --timeout=3s --start-period=10s --retries=3 \
    CMD ["/opt/edge/bin/python", "-c", "import os, urllib.request; port = os.environ.get('EDGE_ADMIN_LISTEN', '0.0.0.0:9090').rsplit(':', 1)[1]; urllib.request.urlopen(f'http://127.0.0.1:{port}/healthz', timeout=2)"]

# SIGTERM starts the drain: stop accepting, let in-flight requests finish for EDGE_DRAIN_SECONDS.
STOPSIGNAL SIGTERM
ENTRYPOINT ["edge", "serve"]
