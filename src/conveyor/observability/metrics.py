"""A worker's own Prometheus metrics, as a middleware: jobs run, succeeded,
failed and retried per task, run time, jobs running now, claim and outcome-write
latency. ``conveyor worker --metrics-port 9100`` serves them; the names follow
Prometheus conventions (``_total`` counters, ``_seconds`` histograms)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from ..hooks import CallNext, Middleware
from ..records import Finalize, JobRecord

#: run times from 1 ms to 10 min
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 600)
#: database round trips, 0.5 ms to 5 s
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5)


class WorkerMetrics(Middleware):
    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.outcomes = Counter(
            "conveyor_worker_jobs_total",
            "Attempts this worker ended, by task and outcome "
            "(succeeded, retry, failed, cancelled, stage, snoozed).",
            ["task", "outcome"],
            registry=r,
        )
        self.duration = Histogram(
            "conveyor_worker_job_duration_seconds",
            "Run time of handlers, by task.",
            ["task"],
            buckets=DURATION_BUCKETS,
            registry=r,
        )
        self.running = Gauge(
            "conveyor_worker_jobs_running", "Handlers running now.", ["task"], registry=r
        )
        self.claim = Histogram(
            "conveyor_worker_claim_seconds",
            "Time of one claim statement (however many jobs it took).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.claimed = Counter(
            "conveyor_worker_claimed_jobs_total", "Jobs claimed by this worker.", registry=r
        )
        self.write = Histogram(
            "conveyor_worker_outcome_write_seconds",
            "Time of one outcome write (a batch of outcomes).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.refused = Counter(
            "conveyor_worker_outcomes_refused_total",
            "Outcomes refused because this worker no longer held the job.",
            registry=r,
        )

    async def execute(self, job: JobRecord, call_next: CallNext) -> Any:
        gauge = self.running.labels(job.task)
        gauge.inc()
        try:
            return await call_next()
        finally:
            gauge.dec()

    def on_outcome(self, job: JobRecord, outcome: Finalize, duration_s: float | None) -> None:
        self.outcomes.labels(job.task, str(outcome.outcome)).inc()
        if duration_s is not None:
            self.duration.labels(job.task).observe(duration_s)

    def on_written(self, outcome: Finalize, accepted: bool) -> None:
        if not accepted:
            self.refused.inc()

    def on_claimed(self, jobs: Sequence[JobRecord], duration_s: float) -> None:
        self.claim.observe(duration_s)
        self.claimed.inc(len(jobs))

    def on_flushed(self, outcomes: Sequence[Finalize], duration_s: float) -> None:
        self.write.observe(duration_s)

    def serve(self, port: int, host: str = "127.0.0.1") -> None:
        """Serve ``/metrics`` on ``host:port`` from a daemon thread."""
        start_http_server(port, addr=host, registry=self.registry)
