"""The tables ``loadtest.cdn`` prints and writes to ``docs/benchmarks.md``: offload, long-poll
herds, correctness and SSE, one row per tier (the edge alone, Varnish, nginx)."""

from __future__ import annotations

from typing import Any

GIVE_UP_SECONDS = 5.0  # how long a correctness probe waits for the new instance (loadtest.cdn)
RESUMERS = 20


def quantile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f}"


def seconds_or_never(value: float | None) -> str:
    return f"{ms(value)} ms" if value is not None else f"not within {GIVE_UP_SECONDS:.0f} s"


def render(
    figures: dict[str, Any], *, readers: int, herd: int, viewers: int, long_poll_timeout: float
) -> str:
    """The section's tables, from ``loadtest.cdn``'s figures."""
    out = [
        f"Offload: {readers} concurrent readers of one closed 16.8 KB stream, cold then warm "
        "(requests that reached the edge and the origin; exact answers; wait p50/p99 in ms).",
        "",
        "| through | cold exact | cold edge reqs | cold origin reqs | cold p50/p99 "
        "| warm exact | warm edge reqs | warm origin reqs | warm p50/p99 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in figures["offload"]:
        c, w = r["cold"], r["warm"]
        out.append(
            f"| {r['tier']} | {c['exact']}/{readers} | {c['edge']} | {c['origin']} "
            f"| {ms(c['p50'])}/{ms(c['p99'])} | {w['exact']}/{readers} | {w['edge']} "
            f"| {w['origin']} | {ms(w['p50'])}/{ms(w['p99'])} |"
        )
    out += [
        "",
        f"A herd of {herd} long-polls parked at one tail, released by one append (exact "
        "answers, distinct cursors given, requests at the edge and the origin, spread of the "
        "answers' arrival and p99 from the append in ms):",
        "",
        "| through | exact | cursors | edge reqs | origin reqs | spread ms | p99 ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in figures["released"]:
        out.append(
            f"| {r['tier']} | {r['exact']}/{herd} | {r['cursors']} | {r['edge']} "
            f"| {r['origin']} | {ms(r['spread'])} | {ms(r['p99'])} |"
        )
    out += [
        "",
        f"A herd of {herd} long-polls that times out (edge `--long-poll-timeout "
        f"{long_poll_timeout:g}`), two rounds, the second at the cursor the first was given "
        "(204s received, distinct cursors, requests at the edge and the origin, first and last "
        "answer in s after the herd started):",
        "",
        "| through | round | 204s | cursors | edge reqs | origin reqs | first s | last s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in figures["timed_out"]:
        for number, x in enumerate(r["rounds"], 1):
            out.append(
                f"| {r['tier']} | {number} | {x['answered']}/{herd} | {x['cursors']} "
                f"| {x['edge']} | {x['origin']} | {x['first']:.2f} | {x['last']:.2f} |"
            )
    out += [
        "",
        "Correctness: time until every read gets the new instance, and 2 s after the change, old "
        "bytes among 10 reads and what the old ETag gets (If-None-Match); a 404 then a create at "
        "the origin; a HEAD after a capped GET; an anonymous read after a credentialed one "
        "(Authorization and Cookie, plain and with an unknown parameter):",
        "",
        "| through | DELETE + recreate | operator purge | 404 then create | HEAD | credentialed |",
        "|---|---|---|---|---|---|",
    ]
    for r in figures["correct"]:
        cells = [
            f"{seconds_or_never(r[k]['took'])}; {r[k]['later']}" for k in ("recreate", "purge")
        ]
        out.append(
            f"| {r['tier']} | {cells[0]} | {cells[1]} | {seconds_or_never(r['created'])} "
            f"| {r['head']} | {r['credentialed']} |"
        )
    out += [
        "",
        f"SSE: {viewers} viewers per tier of one writer (60 appends at 20/s; latency from "
        f"each append's send to each viewer having it, ms) and {RESUMERS} per tier resuming by "
        "Last-Event-ID:",
        "",
        "| through | exact viewers | p50 ms | p99 ms | Last-Event-ID resume exact |",
        "|---|---:|---:|---:|---:|",
    ]
    for tier, r in figures["sse"].items():
        out.append(
            f"| {tier} | {r['exact']}/{viewers} | {r['p50'] * 1000:.1f} "
            f"| {r['p99'] * 1000:.1f} | {r['resumed']}/{RESUMERS} |"
        )
    return "\n".join(out)
