"""Locust load test of an edge deployment (``make loadtest`` runs it against ``make cluster``).

User classes, weighted like a shared agent run:

* ``SseViewer``: watches the live stream by SSE; reports each batch's delivery latency (agent's
  append stamp → decoded here) as request type ``SSE``/``delivery``; when its connection ends it
  reconnects from the last ``streamNextOffset``, as the official clients do.
* ``ArchiveReader``: catch-up reads of a closed stream (from the start and from offsets it has
  seen), checking every answer byte for byte.
* ``LongPoller``: follows the live stream with long-polls and cursors.
* ``Agent``: appends JSON events to the live stream at a steady rate (one agent per run).

The streams are created when the test starts: ``--stream-prefix`` names them. Then
``loadtest.progress`` takes its first sample (the live progress line, and the timeline that
``make loadtest``'s summary and chart are made from).
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

import requests
from locust import HttpUser, between, constant, events, task
from locust.env import Environment

from edge.protocol.sse import SseDecoder
from loadtest import progress

ARCHIVE_ITEMS = 200
STREAMS: dict[str, str] = {}


@events.init_command_line_parser.add_listener
def _add_arguments(parser: Any) -> None:
    parser.add_argument("--stream-prefix", default="", help="stream path prefix (default: random)")
    parser.add_argument("--agent-rate", type=float, default=10.0, help="agent events per second")


@events.test_start.add_listener
def _create_streams(environment: Environment, **_: Any) -> None:
    prefix = environment.parsed_options.stream_prefix or f"/v1/stream/locust-{uuid.uuid4().hex[:8]}"
    host = environment.host
    live, archive = f"{prefix}-live", f"{prefix}-archive"
    json_type = {"Content-Type": "application/json"}
    requests.put(host + live, headers=json_type, timeout=10).raise_for_status()
    requests.put(host + archive, headers=json_type, timeout=10).raise_for_status()
    items = [{"i": i, "text": f" archived token {i}"} for i in range(ARCHIVE_ITEMS)]
    for start in range(0, ARCHIVE_ITEMS, 20):
        requests.post(
            host + archive,
            data=json.dumps(items[start : start + 20]),
            headers=json_type,
            timeout=10,
        ).raise_for_status()
    requests.post(host + archive, headers={"Stream-Closed": "true"}, timeout=10).raise_for_status()
    STREAMS.update(live=live, archive=archive, archive_json=json.dumps(items))


progress.install()  # after _create_streams: setup is not part of the load


class SseViewer(HttpUser):
    weight = 10
    wait_time = constant(0)

    def on_start(self) -> None:
        self.offset = "now"

    @task
    def watch(self) -> None:
        """One SSE connection, held until the server ends it (rotation) or the run stops."""
        url = f"{self.host}{STREAMS['live']}?offset={self.offset}&live=sse"
        started = time.perf_counter()
        decoder = SseDecoder()
        try:
            with requests.get(url, stream=True, timeout=(5, 120)) as response:
                if response.status_code != 200:
                    self._report("connect", started, f"HTTP {response.status_code}")
                    time.sleep(1)
                    return
                self._report("connect", started, None)
                pending: list[str] = []
                for chunk in response.iter_content(chunk_size=None):
                    for event in decoder.feed(chunk):
                        if event.event == "data":
                            pending.append(event.data)
                        elif event.event == "control":
                            control = json.loads(event.data)
                            self.offset = control["streamNextOffset"]
                            now = time.time()
                            for data in pending:
                                for item in json.loads(data):
                                    latency_ms = (now - item["t"]) * 1000
                                    self.environment.events.request.fire(
                                        request_type="SSE", name="delivery",
                                        response_time=latency_ms, response_length=len(data),
                                        exception=None, context={},
                                    )  # fmt: skip
                            pending.clear()
        except requests.RequestException as error:
            self._report("stream", started, str(error))
            time.sleep(0.5)  # then reconnect from self.offset, like a real client

    def _report(self, name: str, started: float, error: str | None) -> None:
        self.environment.events.request.fire(
            request_type="SSE", name=name,
            response_time=(time.perf_counter() - started) * 1000, response_length=0,
            exception=RuntimeError(error) if error else None, context={},
        )  # fmt: skip


class ArchiveReader(HttpUser):
    weight = 3
    wait_time = between(0.05, 0.2)

    @task(3)
    def from_the_start(self) -> None:
        with self.client.get(
            f"{STREAMS['archive']}?offset=-1", name="catch-up -1", catch_response=True
        ) as response:
            if response.status_code != 200:
                response.failure(f"HTTP {response.status_code}")
            elif json.loads(response.content) != json.loads(STREAMS["archive_json"]):
                response.failure("archive bytes differ")
            elif response.headers.get("Stream-Closed") != "true":
                response.failure("closed stream not marked closed")

    @task(1)
    def revalidate(self) -> None:
        first = self.client.get(f"{STREAMS['archive']}?offset=-1", name="catch-up -1")
        with self.client.get(
            f"{STREAMS['archive']}?offset=-1",
            headers={"If-None-Match": first.headers.get("ETag", "")},
            name="catch-up 304",
            catch_response=True,
        ) as response:
            if response.status_code != 304:
                response.failure(f"expected 304, got {response.status_code}")


class LongPoller(HttpUser):
    weight = 2
    wait_time = constant(0)

    def on_start(self) -> None:
        response = self.client.get(f"{STREAMS['live']}?offset=now", name="offset=now")
        self.offset = response.headers.get("Stream-Next-Offset", "-1")
        self.cursor = ""

    @task
    def poll(self) -> None:
        cursor = f"&cursor={self.cursor}" if self.cursor else ""
        with self.client.get(
            f"{STREAMS['live']}?offset={self.offset}&live=long-poll{cursor}",
            name="long-poll",
            catch_response=True,
            timeout=60,
        ) as response:
            if response.status_code not in (200, 204):
                response.failure(f"HTTP {response.status_code}")
                return
            self.offset = response.headers.get("Stream-Next-Offset", self.offset)
            self.cursor = response.headers.get("Stream-Cursor", self.cursor)


class Agent(HttpUser):
    fixed_count = 1
    wait_time = constant(0)

    def on_start(self) -> None:
        self.seq = 0
        self.producer = f"locust-agent-{uuid.uuid4().hex[:6]}"

    @task
    def append(self) -> None:
        interval = 1.0 / self.environment.parsed_options.agent_rate
        started = time.monotonic()
        body = json.dumps([{"seq": self.seq, "t": time.time(), "text": f" token {self.seq}"}])
        with self.client.post(
            STREAMS["live"],
            data=body,
            headers={
                "Content-Type": "application/json",
                "Producer-Id": self.producer,
                "Producer-Epoch": "0",
                "Producer-Seq": str(self.seq),
            },
            name="append",
            catch_response=True,
        ) as response:
            if response.status_code in (200, 204):
                self.seq += 1
            else:
                response.failure(f"HTTP {response.status_code}")
        time.sleep(max(0.0, interval - (time.monotonic() - started)))
