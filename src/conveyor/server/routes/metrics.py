"""``GET /metrics``: the cluster as Prometheus sees it (``prometheus-client``, never
a hand-written exposition).

Gauges, read at each scrape from the database's cheap sources (the count rollup,
an index per queue, the open-batch index): jobs by queue, task and state; age of
the oldest job waiting per queue; workers alive; batches open. Histograms, fed
from the change stream since the server started (each finished job and closed
batch observed once, whatever the scrape interval): queue wait and run time per
task, batch first-result and completion latency. Each server counts every job,
so scrape one server per cluster (or take the max across them).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime

from fastapi import APIRouter
from fastapi.responses import Response
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from ...records import BatchState, ChangeCursor, JobState
from ..auth import READ, requires
from ..context import ServerContext
from ..dependencies import Ctx

WAIT_BUCKETS = (0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600, 4 * 3600, 86400)
RUN_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 900, 3600)
#: most changes one scrape reads (the rest are read by the next scrapes)
SCRAPE_CHANGES = 50_000


class ClusterMetrics:
    """The registry of one server: gauges collected at scrape, histograms fed from
    the change stream."""

    def __init__(self, ctx: ServerContext) -> None:
        self.app = ctx.conveyor
        self.ttl_s = ctx.worker_ttl_s
        self.registry = CollectorRegistry()
        self.registry.register(_Gauges(self))
        r = self.registry
        self.queue_wait = Histogram(
            "conveyor_job_queue_wait_seconds",
            "From a job being due (created, or its delay or backoff over) to its last start, "
            "per task; observed when it finishes.",
            ["queue", "task"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.run_time = Histogram(
            "conveyor_job_run_seconds",
            "Run time of a job's last attempt, per task and final state.",
            ["queue", "task", "state"],
            buckets=RUN_BUCKETS,
            registry=r,
        )
        self.first_result = Histogram(
            "conveyor_batch_first_result_seconds",
            "From a batch's creation to its first finished job; observed when it closes.",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.completion = Histogram(
            "conveyor_batch_completion_seconds",
            "From a batch's creation to its closing.",
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self._cursor: ChangeCursor | None = None
        self._lock = threading.Lock()

    def scrape(self) -> bytes:
        with self._lock:  # one reader of the change stream at a time
            self._observe()
            return generate_latest(self.registry)

    def _observe(self) -> None:
        if self._cursor is None:
            self._cursor = self.app.changes()[1]  # histograms count from now
            return
        seen = 0
        while seen < SCRAPE_CHANGES:
            changes, self._cursor = self.app.changes(self._cursor, limit=5000)
            seen += len(changes)
            for c in changes:
                job, batch = c.job, c.batch
                if job is not None and job.state.finished and job.started_at and job.finished_at:
                    wait = (job.started_at - job.scheduled_at).total_seconds()
                    run = (job.finished_at - job.started_at).total_seconds()
                    self.queue_wait.labels(job.queue, job.task).observe(max(0.0, wait))
                    self.run_time.labels(job.queue, job.task, str(job.state)).observe(run)
                if batch is not None and batch.state != BatchState.RUNNING and batch.finished_at:
                    first = self.app.serving.batch_first_finished(batch.id)
                    if first is not None:
                        lag = (first - batch.created_at).total_seconds()
                        self.first_result.observe(max(0.0, lag))
                    done = (batch.finished_at - batch.created_at).total_seconds()
                    self.completion.observe(max(0.0, done))
            if len(changes) < 5000:
                return


class _Gauges:
    """Read at each scrape; every query is indexed or a rollup (no full scan)."""

    def __init__(self, metrics: ClusterMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        app = self.metrics.app
        jobs = GaugeMetricFamily(
            "conveyor_jobs", "Jobs by queue, task and state.", labels=["queue", "task", "state"]
        )
        for c in app.counts():
            jobs.add_metric([c.queue, c.task or "", str(c.state)], c.count)
        yield jobs
        oldest = GaugeMetricFamily(
            "conveyor_queue_oldest_waiting_seconds",
            "Age of the oldest job that is due and waiting to be claimed, per queue.",
            labels=["queue"],
        )
        now = datetime.now(UTC)
        for queue, since in app.serving.oldest_waiting().items():
            oldest.add_metric([queue], max(0.0, (now - since).total_seconds()))
        yield oldest
        workers = app.workers()
        alive = sum(
            1
            for w in workers
            if w.last_seen_at is not None
            and (now - w.last_seen_at).total_seconds() <= self.metrics.ttl_s
        )
        yield GaugeMetricFamily("conveyor_workers_alive", "Workers heartbeating.", value=alive)
        yield GaugeMetricFamily(
            "conveyor_workers_silent",
            "Registered workers that stopped heartbeating (their jobs are rescued).",
            value=len(workers) - alive,
        )
        yield GaugeMetricFamily(
            "conveyor_batches_open", "Batches not closed yet.", value=app.serving.open_batches()
        )
        running = sum(c.count for c in app.counts() if c.state == JobState.RUNNING)
        yield GaugeMetricFamily("conveyor_jobs_running", "Jobs running now.", value=running)
        lag = app.replica_lag()
        if lag is not None:  # the gauges above were read from a replica (read_url)
            yield GaugeMetricFamily(
                "conveyor_replica_lag_seconds",
                "How far the replica these metrics are read from trails the primary.",
                value=lag,
            )


router = APIRouter(tags=["metrics"])


@router.get(
    "/metrics",
    summary="Prometheus metrics",
    response_class=Response,
    dependencies=[requires(READ)],
)
def scrape(ctx: Ctx) -> Response:
    return Response(ctx.part(ClusterMetrics).scrape(), media_type=CONTENT_TYPE_LATEST)
