# The one entry point for people and CI. `make demo` and `make test` bootstrap what they need.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
ORIGIN_DIR := deploy/origin
STAMPS := .stamps

.PHONY: debian-tools help bootstrap cluster loadtest demo origin serve test test-fast test-workers2 check fmt conformance clean image

help:
	@echo "make demo       run the origin, the edge, an agent and 200 SSE viewers; print a summary"
	@echo "make demo ARGS=--keep-running   ... and keep serving for your own clients"
	@echo "make demo ARGS=--resume   an MCP tool call through HAProxy and two edges survives a replica kill"
	@echo "make origin     the reference origin alone on 127.0.0.1:4437 (for a session by hand)"
	@echo "make serve      the edge alone on 127.0.0.1:8080 in front of it (ARGS= more flags)"
	@echo "make test       format/lint/type checks, then every test (unit, integration, conformance)"
	@echo "make test-workers2  every test, each edge with --workers 2"
	@echo "make check      ruff format --check, ruff check, mypy --strict edge/"
	@echo "make fmt        apply ruff formatting and safe fixes"
	@echo "make conformance  the public conformance suite through the edge (part of make test)"
	@echo "make cluster    origin + redis + 2 edges + HAProxy on loopback; prints the URLs (ARGS=--tls: HTTPS + HTTP/2 too)"
	@echo "make loadtest   a loopback cluster of its own + locust headless (USERS=, SPAWN_RATE=, DURATION=)"
	@echo "make image      the container image (EDGE_IMAGE in deploy/.env, edge:dev), Docker or podman"

# --- bootstrap: virtualenv + pinned Python deps, pinned Node origin -----------------------------

$(STAMPS)/venv: pyproject.toml constraints.txt
	@mkdir -p $(STAMPS)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[dev]'
	@touch $@

$(STAMPS)/origin: $(ORIGIN_DIR)/package.json $(ORIGIN_DIR)/package-lock.json
	@mkdir -p $(STAMPS)
	@command -v node >/dev/null || { echo "Node.js 20+ is required (node not found)"; exit 1; }
	cd $(ORIGIN_DIR) && npm ci --no-audit --no-fund --loglevel=error
	@touch $@

# Debian's redis-server (with redis-cli, which makes the tests' Redis Cluster), redis-sentinel,
# haproxy, prometheus (promtool), nginx and wrk (benchmarks) for the tests and `make cluster`,
# chromium for the browser tests (Playwright drives it; it downloads no browser of its own), and
# varnish with varnish-modules for the CDN tests (the shipped VCL needs vmod xkey, a library with
# no command: looked for as its .so); installed only when missing.
DEBIAN_TOOLS := redis-server:redis-server redis-cli:redis-tools redis-sentinel:redis-sentinel
DEBIAN_TOOLS += haproxy:haproxy promtool:prometheus nginx:nginx wrk:wrk
DEBIAN_TOOLS += chromium:chromium varnishd:varnish
XKEY_VMOD := libvmod_xkey.so
debian-tools:
	@missing=""; for pair in $(DEBIAN_TOOLS); do \
		command -v $${pair%%:*} >/dev/null || [ -x /usr/sbin/$${pair%%:*} ] || missing="$$missing $${pair#*:}"; \
	done; \
	ls /usr/lib/*/varnish/vmods/$(XKEY_VMOD) >/dev/null 2>&1 \
		|| ls /usr/lib/varnish/vmods/$(XKEY_VMOD) >/dev/null 2>&1 \
		|| missing="$$missing varnish-modules"; \
	if [ -n "$$missing" ]; then \
		echo "installing$$missing (apt-get)"; \
		apt-get -o DPkg::Lock::Timeout=600 update -qq && DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq $$missing; \
	fi

bootstrap: $(STAMPS)/venv $(STAMPS)/origin debian-tools

# --- the main job ------------------------------------------------------------------------------

demo: bootstrap
	$(PY) -m devstack.demo $(ARGS)

# A session by hand (README): `make origin` in one terminal, `make serve` in another. One worker,
# so that reading a stream twice shows the second read as a hit (each worker has its own cache).
ORIGIN_PORT ?= 4437
origin: bootstrap
	node $(ORIGIN_DIR)/origin.mjs --port $(ORIGIN_PORT)

serve: bootstrap
	$(VENV)/bin/edge serve --origin http://127.0.0.1:$(ORIGIN_PORT) --workers 1 $(ARGS)

cluster: bootstrap
	$(PY) -m devstack.cluster $(ARGS)

USERS ?= 200
SPAWN_RATE ?= 50
DURATION ?= 60s
loadtest: bootstrap
	$(PY) -m loadtest.run --users $(USERS) --spawn-rate $(SPAWN_RATE) --duration $(DURATION) $(ARGS)

# --- the container image: Docker if its daemon answers, else Debian's podman + runc, installed
# and set up on first use, on a locally made base when python:3.11-slim cannot be pulled
# (devstack/image.py says how). The container tests (part of `make test`) build it the same way.

image: $(STAMPS)/venv
	$(PY) -m devstack.image $(ARGS)

# --- quality -----------------------------------------------------------------------------------

check: $(STAMPS)/venv
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --strict edge/

fmt: $(STAMPS)/venv
	$(VENV)/bin/ruff format .
	$(VENV)/bin/ruff check --fix .

# The suite's files run on TEST_PROCESSES pytest-xdist workers (a file stays on one worker, so
# its processes and fixtures are its own): most tests wait on real processes, so two workers on
# 2 cores take half the time of one (7 min 46 s against 13 min 48 s, measured).
TEST_PROCESSES ?= 2
PARALLEL := -n $(TEST_PROCESSES) --dist loadfile
# The slowest tests, named at the end of every run: where the suite's time goes, in CI's log too.
PYTEST_ARGS ?= --durations=25

test: bootstrap check
	$(PY) -m pytest $(PARALLEL) $(PYTEST_ARGS)

# The whole suite with every launched edge running two worker processes (edge serve --workers 2).
test-workers2: bootstrap
	EDGE_TEST_WORKERS=2 $(PY) -m pytest $(PARALLEL) $(PYTEST_ARGS)

test-fast: bootstrap
	$(PY) -m pytest $(PARALLEL) -m "not conformance" $(PYTEST_ARGS)

conformance: bootstrap
	$(PY) -m pytest -m conformance $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(STAMPS) $(ORIGIN_DIR)/node_modules .pytest_cache .mypy_cache .ruff_cache
