"""A service loop must stop when cancelled, even if its wake-up event is set in
the same loop iteration (asyncio.wait_for on Python 3.11 lost that cancellation,
and a worker hung at shutdown)."""

from __future__ import annotations

import asyncio

from conveyor.runtime.worker import wait_event


async def _cancel_while_waking() -> bool:
    event = asyncio.Event()

    async def service_loop() -> None:
        while True:
            await wait_event(event, 10)
            event.clear()

    task = asyncio.create_task(service_loop())
    await asyncio.sleep(0)  # the loop is now waiting on the event
    event.set()
    task.cancel()  # same iteration as the wake-up
    await asyncio.wait([task], timeout=2)
    return task.cancelled()


def test_cancellation_wins_over_a_simultaneous_wake_up():
    assert all(asyncio.run(_cancel_while_waking()) for _ in range(20))


def test_wait_event_returns_on_event_or_timeout():
    async def scenario() -> tuple[float, float]:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        t0 = loop.time()
        await wait_event(event, 0.05)
        timed_out = loop.time() - t0
        loop.call_later(0.01, event.set)
        t1 = loop.time()
        await wait_event(event, 10)
        return timed_out, loop.time() - t1

    timed_out, woken = asyncio.run(scenario())
    assert timed_out >= 0.05 and woken < 1
