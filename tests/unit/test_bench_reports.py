"""The benchmark scripts' readers: wrk's report, py-spy's folded stacks, docs/benchmarks.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from loadtest.benchkit import edge_workers, insert_section, write_section
from loadtest.pyspy import table, top_frames
from loadtest.wrk import WrkFailed, parse

WRK_REPORT = """\
Running 1s test @ http://127.0.0.1:41745/nonexistent
  1 threads and 4 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency     2.15ms    1.80ms  18.47ms   93.89%
    Req/Sec     2.04k   209.03     2.27k    45.45%
  Latency Distribution
     50%  812.00us
     75%    2.22ms
     90%    3.15ms
     99%    1.21s
  2231 requests in 1.10s, 1.11MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 7
Requests/sec:   2028.68
Transfer/sec:      1.01MB
"""


def test_wrk_figures_are_read_in_milliseconds_with_errors_counted() -> None:
    run = parse(WRK_REPORT)
    assert run.rps == 2028.68
    assert run.p50_ms == pytest.approx(0.812)
    assert run.p99_ms == pytest.approx(1210.0)
    assert run.requests == 2231
    assert run.errors == 10


def test_an_unreadable_wrk_report_is_an_error_not_a_zero() -> None:
    with pytest.raises(WrkFailed):
        parse(WRK_REPORT.replace("Requests/sec:", "Requests per second:"))
    with pytest.raises(WrkFailed):
        parse(WRK_REPORT.replace("     99%    1.21s\n", ""))


def test_py_spy_stacks_are_summed_by_function_self_and_total() -> None:
    raw = (
        'process 7:"python -m edge serve";main (edge/cli.py:3);run (asyncio/runners.py:118);'
        "handle (edge/web/app.py:10);write (aiohttp/http_writer.py:5) 6\n"
        'process 7:"python -m edge serve";main (edge/cli.py:3);run (asyncio/runners.py:118);'
        "handle (edge/web/app.py:12);labels (prometheus_client/metrics.py:9) 3\n"
        'process 7:"python -m edge serve";main (edge/cli.py:3);run (asyncio/runners.py:118) 1\n'
    )
    frames = top_frames(raw)
    assert frames.samples == 10
    assert frames.self_ == [
        ("write (aiohttp/http_writer.py)", 6),
        ("labels (prometheus_client/metrics.py)", 3),
        ("run (asyncio/runners.py)", 1),
    ]
    # the frames under every sample say nothing and are left out of "total"
    assert frames.total[0] == ("handle (edge/web/app.py)", 9)
    assert ("main (edge/cli.py)", 10) not in frames.total
    assert dict(frames.where) == {"aiohttp": 6, "prometheus_client": 3, "asyncio": 1}
    rendered = table(frames)
    assert "Self time by package: aiohttp 60%, prometheus_client 30%, asyncio 10%." in rendered
    assert "| 60.0 | `write (aiohttp/http_writer.py)` | | 90.0 | `handle (edge/web/app.py)` |" in (
        rendered
    )


def test_a_section_goes_first_and_a_rerun_replaces_its_own(tmp_path: Path) -> None:
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nintro\n\n## Fan-out (2026-11-29)\n\nold table\n")
    insert_section(doc, "## Hits (a)", "## Hits (a)\n\nfirst\n")
    insert_section(doc, "## Hits (b)", "## Hits (b)\n\nsecond\n")
    insert_section(doc, "## Hits (a)", "## Hits (a)\n\nrerun\n")
    assert doc.read_text() == (
        "# Benchmarks\n\nintro\n\n## Hits (b)\n\nsecond\n\n## Hits (a)\n\nrerun\n\n"
        "## Fan-out (2026-11-29)\n\nold table\n"
    )


def test_the_edge_worker_count_is_read_from_its_arguments() -> None:
    assert edge_workers([]) == 1
    assert edge_workers(["--tail-linger", "2", "--workers", "2"]) == 2
    assert edge_workers(["--workers=3"]) == 3


def test_the_join_viewers_decode_both_servers_sse_and_chunked_bodies() -> None:
    from loadtest.join_clients import sse_events
    from loadtest.rawhttp import dechunk, dechunk_partial

    origin = 'event: data\ndata:abc def\ndata:\n\nevent: control\ndata:{"streamNextOffset":"5"}\n\n'
    edge = "retry: 1000\n\n: keep-alive\n\nevent: data\ndata:abc def\ndata:\n\nevent: cont"
    assert sse_events(origin) == [("data", "abc def\n"), ("control", '{"streamNextOffset":"5"}')]
    assert sse_events(edge) == [("data", "abc def\n")]  # the cut-off frame is not an event
    assert sse_events("event: data\r\ndata: x\r\n\r\n") == [("data", "x")]
    body = b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\nnext"
    assert dechunk(body) == (b"abcde", len(body) - 4)
    assert dechunk(body[:9]) is None
    assert dechunk_partial(body[:12]) == b"abc"


def test_a_dated_section_goes_first_and_a_rerun_of_its_benchmark_replaces_it(
    tmp_path: Path,
) -> None:
    """fanout and fleet headings carry their time: a rerun replaces the section by its heading's
    fixed start, a first run goes first under the intro."""
    doc = tmp_path / "benchmarks.md"
    doc.write_text("# Benchmarks\n\nintro\n\n## Hits (a)\n\nold\n")
    write_section(doc, "## The scaled run (", "## The scaled run (10:00)\n\nfirst\n")
    write_section(doc, "## The scaled run (", "## The scaled run (11:00)\n\nrerun\n")
    assert doc.read_text() == (
        "# Benchmarks\n\nintro\n\n## The scaled run (11:00)\n\nrerun\n\n## Hits (a)\n\nold\n"
    )
