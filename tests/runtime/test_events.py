"""The event stream through the façade: a batch from 0 to 100 % and closed, and a
stream that stops mid-batch and resumes from its last event id, with every
event exactly once."""

from __future__ import annotations

import asyncio

from conveyor import Conveyor

from .helpers import Running


def collect(app: Conveyor, after, *, until_batch_closed: int, stop_after: int | None = None):
    async def run() -> list[dict]:
        out: list[dict] = []
        async for event in app.stream_events(after, until_batch_closed=until_batch_closed):
            out.append(event)
            if stop_after is not None and len(out) >= stop_after:
                break
        return out

    return asyncio.run(asyncio.wait_for(run(), 120))


def test_a_stream_sees_a_batch_go_to_100_percent_and_close(app):
    @app.task
    async def item(i):
        return i * i

    start = str(app.changes()[1])
    batch = item.batch([(i,) for i in range(1000)])
    with Running(app, concurrency=50):
        events = collect(app, start, until_batch_closed=batch.id)
    kinds = [e["event"] for e in events]
    assert kinds.count("job.succeeded") == 1000  # (earlier states may have been passed)
    progress = [e["data"]["percent"] for e in events if e["event"] == "batch.progress"]
    assert progress and progress == sorted(progress) and progress[-1] == 100
    assert kinds[-1] == "batch.closed" and events[-1]["data"]["state"] == "succeeded"
    first = next(e for e in events if e["event"] == "job.succeeded")
    squares = {j.id: j.args[0] ** 2 for j in batch.jobs()}
    assert first["data"]["result"] == squares[first["data"]["id"]]  # first results, as they come
    assert "args" not in first["data"]


def test_a_client_that_reconnects_gets_every_event_once(app):
    @app.task
    async def item(i):
        await asyncio.sleep(0.002)
        return i

    start = str(app.changes()[1])
    batch = item.batch([(i,) for i in range(300)])
    with Running(app, concurrency=20):
        first = collect(app, start, until_batch_closed=batch.id, stop_after=250)
        last_id = first[-1]["id"]  # whatever the last event was, progress included
        rest = collect(app, last_id, until_batch_closed=batch.id)
    job_events = [
        (e["data"]["id"], e["event"]) for e in [*first, *rest] if e["event"] != "batch.progress"
    ]
    assert len(job_events) == len(set(job_events))  # nothing twice
    done = {j for j, kind in job_events if kind == "job.succeeded"}
    assert done == {j.id for j in batch.jobs()}  # nothing missed
