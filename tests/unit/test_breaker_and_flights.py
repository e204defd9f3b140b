import asyncio

import pytest

from edge.coalesce import SingleFlight
from edge.store.breaker import BreakerState, CircuitBreaker


def test_breaker_opens_after_failures_and_probes_after_cooldown() -> None:
    breaker = CircuitBreaker(failure_threshold=2, cooldown_seconds=5)
    assert breaker.allow(0)
    breaker.failure(0)
    assert breaker.state is BreakerState.CLOSED
    breaker.failure(1)
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allow(3)
    assert breaker.allow(6)  # the one probe
    assert not breaker.allow(6)
    breaker.failure(6)
    assert breaker.state is BreakerState.OPEN
    assert not breaker.allow(10)
    assert breaker.allow(11.5)
    breaker.success()
    assert breaker.state is BreakerState.CLOSED
    assert breaker.allow(11.5)


async def test_single_flight_runs_identical_work_once() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    calls = 0
    release = asyncio.Event()

    async def work() -> int:
        nonlocal calls
        calls += 1
        await release.wait()
        return 42

    waiters = [asyncio.create_task(flights.run("k", work)) for _ in range(50)]
    await asyncio.sleep(0)
    release.set()
    results = await asyncio.gather(*waiters)
    assert calls == 1
    assert [value for value, _ in results] == [42] * 50
    assert sum(collapsed for _, collapsed in results) == 49
    assert not flights.in_flight("k")


async def test_a_cancelled_waiter_does_not_cancel_the_shared_work() -> None:
    flights: SingleFlight[str, int] = SingleFlight()
    release = asyncio.Event()

    async def work() -> int:
        await release.wait()
        return 7

    first = asyncio.create_task(flights.run("k", work))
    second = asyncio.create_task(flights.run("k", work))
    await asyncio.sleep(0)
    first.cancel()
    release.set()
    assert await second == (7, True)
    with pytest.raises(asyncio.CancelledError):
        await first


async def test_errors_reach_every_waiter() -> None:
    flights: SingleFlight[str, int] = SingleFlight()

    async def work() -> int:
        await asyncio.sleep(0)
        raise RuntimeError("origin down")

    results = await asyncio.gather(
        *(flights.run("k", work) for _ in range(3)), return_exceptions=True
    )
    assert all(isinstance(r, RuntimeError) for r in results)
