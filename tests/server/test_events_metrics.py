"""Live events (SSE) and ``/metrics`` on the real server, both backends: a client
follows a 1,000-job batch from 0 to 100 % and its closing; a client that drops
mid-batch and reconnects with ``Last-Event-ID`` ends with every event exactly
once; a scrape after a known workload has the right counts and histograms."""

from __future__ import annotations

import threading
import time

from prometheus_client.parser import text_string_to_metric_families

from conveyor.outcomes import OutcomeKind, RemoteOutcome
from conveyor.records import WorkerInfo

from .sse import events


def finish_all(producer, *, worker="w", chunk=100, pause=0.02, stop=None):
    """A remote worker (through the façade) that completes every job of the
    default queue, ``chunk`` at a time, with a result each."""
    producer.serving.heartbeat_worker(WorkerInfo(worker, "h", 1, ["default"], chunk))
    idle = 0
    while idle < 50 and not (stop and stop.is_set()):
        jobs = producer.serving.claim(worker, ["default"], limit=chunk)
        if not jobs:
            idle += 1
            time.sleep(0.05)
            continue
        idle = 0
        done = [
            RemoteOutcome(j.id, j.lease_token, OutcomeKind.COMPLETE, result=j.args) for j in jobs
        ]
        producer.serving.report(worker, done)
        time.sleep(pause)


def background(target, *args, **kw) -> threading.Thread:
    t = threading.Thread(target=target, args=args, kwargs=kw, daemon=True)
    t.start()
    return t


def new_batch(api, n: int) -> int:
    r = api.post("/v1/batches", json={"task": "item", "items": [[i] for i in range(n)]})
    assert r.status_code == 201, r.text
    return int(r.json()["id"])


def test_a_client_follows_a_1000_job_batch_to_100_percent_and_closed(api, producer):
    bid = new_batch(api, 1000)
    stream = events(api, f"/v1/batches/{bid}/events")
    first = next(stream)  # the stream is open (and the batch's progress so far) ...
    assert first["event"] == "batch.progress" and first["data"]["percent"] == 0
    # ... before any job finishes; 100 jobs per 0.2 s, so that the stream shows
    # progress between 0 and 100 % even when a loaded machine reads it late
    worker = background(finish_all, producer, pause=0.2)
    seen = [first, *stream]  # the server ends the stream when the batch closes
    worker.join(60)
    kinds = [e["event"] for e in seen]
    assert kinds[-1] == "batch.closed" and seen[-1]["data"]["state"] == "succeeded"
    finished = [e["data"] for e in seen if e["event"] == "job.succeeded"]
    assert len(finished) == 1000 and len({d["id"] for d in finished}) == 1000
    assert sorted(d["result"][0] for d in finished) == list(range(1000))  # first results, streamed
    percents = [e["data"]["percent"] for e in seen if e["event"] == "batch.progress"]
    assert percents == sorted(percents) and percents[-1] == 100 and len(set(percents)) > 2
    assert all(e["id"] for e in seen)  # every event has an id


def test_a_client_that_reconnects_with_last_event_id_sees_everything_once(api, producer, db_url):
    bid = new_batch(api, 600)
    stream = events(api, f"/v1/batches/{bid}/events")
    received: list[dict] = [next(stream)]  # following from 0 % ...
    stop = threading.Event()
    worker = background(finish_all, producer, chunk=20, pause=0.01, stop=stop)  # ... then work
    for event in stream:
        received.append(event)
        if sum(e["event"] == "job.succeeded" for e in received) >= 200:
            break
    stream.close()  # the connection drops mid-batch; work goes on meanwhile
    time.sleep(0.5)
    last = received[-1]["id"]
    resumed = list(events(api, f"/v1/batches/{bid}/events", last_event_id=last))
    stop.set()
    worker.join(30)
    assert resumed[-1]["event"] == "batch.closed"
    job_events = [
        (e["data"]["id"], e["event"])
        for e in [*received, *resumed]
        if e["event"].startswith("job.")
    ]
    assert len(job_events) == len(set(job_events))  # nothing twice
    done = [j for j, kind in job_events if kind == "job.succeeded"]
    assert len(done) == 600 and len(set(done)) == 600  # nothing missed
    ids = [e["id"] for e in resumed if e["event"] != "batch.progress"]
    assert all(_after(i, last) for i in ids)  # in order after the resume point
    # ?after= works as Last-Event-ID does; a made-up id is a 422 naming what to send
    assert api.get(f"/v1/batches/{bid}/events", params={"after": "nope"}).status_code == 422
    assert api.get("/v1/batches/99999999/events").status_code == 404


def _after(event_id: str, last: str) -> bool:
    def key(i: str) -> tuple[int, str, int]:
        change, rest = i.split("-")
        return (int(change), rest[0], int(rest[1:]))

    a, b = key(event_id), key(last)
    return (a[0], a[2]) > (b[0], b[2]) or a[0] > b[0]


def test_the_global_stream_filters_by_queue(api, producer):
    now = str(producer.changes()[1])  # an event id to start from (what a page holds)
    stream = events(api, "/v1/events", queue="emails", after=now)
    producer.enqueue("send_email", ["a@x"], queue="emails")
    producer.enqueue("item", [1])  # another queue: not sent
    producer.enqueue("send_email", ["b@x"], queue="emails")
    got = [next(stream), next(stream)]
    stream.close()
    assert [e["event"] for e in got] == ["job.created", "job.created"]
    assert [e["data"]["queue"] for e in got] == ["emails", "emails"]


def scrape_until(api, key: tuple, value: float, timeout: float = 15) -> dict:
    """A scrape once the histogram sample ``key`` reached ``value``. Histograms are
    fed from the change stream, which shows a change only once no older transaction
    is still open anywhere on the server (another test's, under parallel load)."""
    deadline = time.monotonic() + timeout
    while True:
        m = scrape(api)
        if m.get(key, 0) >= value or time.monotonic() > deadline:
            return m
        time.sleep(0.1)


def scrape(api) -> dict:
    r = api.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    out: dict = {}
    for family in text_string_to_metric_families(r.text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_metrics_after_a_known_workload(api, producer):
    scrape(api)  # the histograms count from the server's start
    ok = producer.enqueue_many("item", [[i] for i in range(5)])
    failing = producer.enqueue("item", [99], max_attempts=1)
    producer.enqueue("send_email", ["a@x"], queue="emails")  # waiting
    producer.enqueue("item", [7], delay=3600)  # scheduled
    producer.serving.heartbeat_worker(WorkerInfo("w", "h", 1, ["default"], 10))
    jobs = producer.serving.claim("w", ["default"], limit=10)
    assert {j.id for j in jobs} == {j.id for j in ok} | {failing.id}
    producer.serving.report(
        "w",
        [
            RemoteOutcome(j.id, j.lease_token, OutcomeKind.COMPLETE)
            if j.id != failing.id
            else RemoteOutcome(j.id, j.lease_token, OutcomeKind.FAIL, error="boom")
            for j in jobs
        ],
    )
    run = "conveyor_job_run_seconds_count"
    failed = (run, (("queue", "default"), ("state", "failed"), ("task", "item")))
    m = scrape_until(api, failed, 1)

    def jobs_gauge(queue, task, state):
        return m.get(("conveyor_jobs", (("queue", queue), ("state", state), ("task", task))), 0)

    assert jobs_gauge("default", "item", "succeeded") == 5
    assert jobs_gauge("default", "item", "failed") == 1
    assert jobs_gauge("default", "item", "scheduled") == 1
    assert jobs_gauge("emails", "send_email", "available") == 1
    assert jobs_gauge("default", "item", "running") == 0
    assert m[("conveyor_workers_alive", ())] == 2  # "w", and the server's of the conveyor queue
    assert m[("conveyor_batches_open", ())] == 0
    assert m[("conveyor_queue_oldest_waiting_seconds", (("queue", "emails"),))] >= 0
    assert ("conveyor_queue_oldest_waiting_seconds", (("queue", "default"),)) not in m
    assert m[(run, (("queue", "default"), ("state", "succeeded"), ("task", "item")))] == 5
    assert m[(run, (("queue", "default"), ("state", "failed"), ("task", "item")))] == 1
    assert (
        m[("conveyor_job_queue_wait_seconds_count", (("queue", "default"), ("task", "item")))] == 6
    )
    # a batch: open, then closed with its latencies observed once
    bid = new_batch(api, 3)
    assert scrape(api)[("conveyor_batches_open", ())] == 1
    finish_all(producer, chunk=10)
    deadline = time.monotonic() + 30
    while api.get(f"/v1/batches/{bid}").json()["state"] == "running":
        assert time.monotonic() < deadline, "the batch did not close"
        time.sleep(0.1)
    m = scrape_until(api, ("conveyor_batch_completion_seconds_count", ()), 1)
    assert m[("conveyor_batches_open", ())] == 0
    assert m[("conveyor_batch_completion_seconds_count", ())] == 1
    assert m[("conveyor_batch_first_result_seconds_count", ())] == 1
    assert scrape(api)[("conveyor_batch_completion_seconds_count", ())] == 1  # once
