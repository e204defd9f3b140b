"""``loadtest.cdn``'s SSE figures: viewers through each tier of one writer, and resumes by
``Last-Event-ID``; every viewer's bytes checked against what was written."""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from typing import Any

import aiohttp

from devstack.cdn_stack import Stack, append, create, tier_url
from devstack.sse_viewer import arrival_lags, view_sse
from loadtest.cdn_report import RESUMERS, quantile


async def sse_figures(
    stack: Stack, session: aiohttp.ClientSession, *, viewers: int, tiers: tuple[str, ...]
) -> dict[str, dict[str, Any]]:
    """``viewers`` SSE viewers per tier of one writer (60 appends at 20/s): exact viewers,
    latency p50/p99 from each append's send; then RESUMERS per tier resuming by Last-Event-ID."""
    path = f"/v1/stream/cdn-sse-{os.getpid()}"
    writer = stack.edge.url + path
    parts = [f"event {i:04d};".encode() for i in range(60)]
    await create(session, writer, [])
    tasks = {
        tier: [
            asyncio.create_task(view_sse(session, tier_url(stack, tier) + path))
            for _ in range(viewers)
        ]
        for tier in tiers
    }
    await asyncio.sleep(1.0)  # every viewer connected and at the tail
    sent_at = []
    for part in parts:
        sent_at.append(time.monotonic())
        await append(session, writer, part)
        await asyncio.sleep(0.05)
    async with session.post(writer, headers={"Stream-Closed": "true"}):
        pass
    expected = b"".join(parts)
    out = {}
    for tier, watching in tasks.items():
        views = await asyncio.gather(*watching)
        lags = [lag for v in views for lag in arrival_lags(v, sent_at, len(parts[0]))]
        out[tier] = {
            "exact": sum(bytes(v.body) == expected for v in views),
            "p50": statistics.median(lags),
            "p99": quantile(lags, 0.99),
            "resumed": await resumes(stack, session, tier),
        }
    return out


async def resumes(stack: Stack, session: aiohttp.ClientSession, tier: str) -> int:
    """How many of RESUMERS viewers, reconnecting with ``Last-Event-ID`` (and their first URL,
    ``offset=-1``) after the writer went on, got exactly what they had not had."""
    path = f"/v1/stream/cdn-resume-{tier}-{os.getpid()}"
    writer = stack.edge.url + path
    first = [f"first {i};".encode() for i in range(10)]
    second = [f"second {i};".encode() for i in range(10)]
    await create(session, writer, first)
    through = tier_url(stack, tier) + path
    befores = await asyncio.gather(
        *(view_sse(session, through, stop_after_events=1, resume=False) for _ in range(RESUMERS))
    )
    for part in second:
        await append(session, writer, part)
    async with session.post(writer, headers={"Stream-Closed": "true"}):
        pass
    afters = await asyncio.gather(
        *(
            view_sse(session, through, headers={"Last-Event-ID": b.last_event_id or ""})
            for b in befores
        )
    )
    whole = b"".join(first + second)
    return sum(bytes(b.body) + bytes(a.body) == whole for b, a in zip(befores, afters, strict=True))
