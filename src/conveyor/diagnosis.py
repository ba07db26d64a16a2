"""The façade's diagnosis: why a job waits, and which waiting jobs no live
worker can run, read from the engine's own state (queues, workers, counts)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol

from .job import Job
from .records import JobState, QueueCount, QueueInfo, WorkerInfo


class DiagnosisHost(Protocol):
    """What the diagnosis reads of the app (``Conveyor`` is one)."""

    def get_job(self, job_id: int) -> Job: ...

    def queues(self) -> list[QueueInfo]: ...

    def counts(self) -> list[QueueCount]: ...

    def workers(self) -> list[WorkerInfo]: ...


class Diagnosis:
    """Answers to "why does this not run?" for one app."""

    def __init__(self, host: DiagnosisHost) -> None:
        self._host = host

    def unserved(self, *, worker_ttl_s: float = 7.0) -> list[QueueCount]:
        live = self.live_workers(worker_ttl_s)
        out = []
        for c in self._host.counts():
            if c.state not in (JobState.AVAILABLE, JobState.SCHEDULED) or not c.count:
                continue
            if not any(_serves(w, c.queue, c.task) for w in live):
                out.append(c)
        return out

    def live_workers(self, worker_ttl_s: float) -> list[WorkerInfo]:
        """Workers whose heartbeat is at most ``worker_ttl_s`` old."""
        now = datetime.now(UTC)
        return [
            w
            for w in self._host.workers()
            if w.last_seen_at is not None and (now - w.last_seen_at).total_seconds() <= worker_ttl_s
        ]

    def why_waiting(self, job_id: int, *, worker_ttl_s: float = 7.0) -> list[str]:
        job = self._host.get_job(job_id)
        if job.state not in (JobState.SCHEDULED, JobState.AVAILABLE):
            return []
        now = datetime.now(UTC)
        reasons = []
        if job.scheduled_at > now:
            when = job.scheduled_at.isoformat(timespec="seconds")
            why = "a retry waits out its backoff" if job.attempts else "it was sent to run later"
            reasons.append(f"scheduled for {when}: {why}")
        queue = next((q for q in self._host.queues() if q.name == job.queue), None)
        if queue is not None and queue.paused:
            reasons.append(f"queue {job.queue!r} is paused")
        if queue is not None and queue.max_running is not None:
            running = queue.counts.get(JobState.RUNNING, 0)
            if running >= queue.max_running:
                reasons.append(
                    f"queue {job.queue!r} is at its limit: {running} running of {queue.max_running}"
                )
        serving = [w for w in self.live_workers(worker_ttl_s) if _serves(w, job.queue, job.task)]
        if job.pinned_to:
            pins = set(job.pinned_to)
            if not [w for w in serving if w.id in pins or pins & set(w.tags)]:
                reasons.append(
                    f"pinned to {', '.join(sorted(pins))}: no live worker with that id or tag "
                    "serves its queue"
                )
        if job.chain_root is not None and job.chain_root != job.id and job.attempts == 0:
            reasons.append(f"a step of chain {job.chain_root}: it runs after the step before it")
        if not serving:
            reasons.append(
                f"no live worker takes queue {job.queue!r} and task {job.task!r} "
                "(start one with `conveyor worker`)"
            )
        return reasons


def _serves(worker: WorkerInfo, queue: str, task: str | None) -> bool:
    """Whether ``worker`` takes jobs of this queue and task."""
    return queue in worker.queues and (worker.tasks is None or task in worker.tasks)
