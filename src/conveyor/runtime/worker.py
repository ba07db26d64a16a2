"""The worker: claims jobs for its free slots, runs them, writes outcomes in batches.

One asyncio loop runs the handlers (sync handlers on a daemon thread pool). All
database calls go through the synchronous backend seam on dedicated threads, one
per concern, so a slow claim never delays a heartbeat.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from ..backends.base import Finalize, Lease, WorkerInfo
from ..errors import ConfigError
from ..job import Job
from ..task import Task
from .completer import Completer
from .cron_service import CronService
from .executor import Outcome, cancelled, classify, fail, run_handler
from .pool import DaemonPool
from .services import FlowService, Maintenance

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..app import Conveyor

log = logging.getLogger("conveyor.worker")
T = TypeVar("T")


async def wait_event(event: asyncio.Event, timeout: float | None) -> None:
    """Wait for ``event`` or ``timeout``, whichever comes first.

    Not ``asyncio.wait_for(event.wait(), ...)``: on Python 3.11 it can swallow a
    cancellation that arrives in the same loop iteration as the event, and a
    service loop built on it then never stops (a worker hung at shutdown).
    """
    try:
        async with asyncio.timeout(timeout):
            await event.wait()
    except TimeoutError:
        pass
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


@dataclass(frozen=True)
class WorkerConfig:
    """Validated at construction; every field has a safe default."""

    queues: tuple[str, ...] = ("default",)
    concurrency: int = 10
    #: a claimed job is the worker's for this long unless renewed by a heartbeat
    lease_s: float = 30.0
    #: renew leases this often (default: a third of the lease)
    heartbeat_s: float | None = None
    #: longest wait between polls when no notification arrives (the safety net)
    poll_s: float = 1.0
    #: most jobs claimed in one statement (default: concurrency)
    fetch_batch: int | None = None
    #: on SIGTERM/SIGINT, how long running jobs may take to finish before release
    grace_s: float = 30.0
    #: how often to look for expired leases and due scheduled jobs
    maintenance_s: float = 2.0
    #: exit once nothing is claimable and nothing is running
    burst: bool = False
    #: how often the flow service (batch aggregator, chains) looks for work when no
    #: notification arrives; its leader lease lasts flow_ttl_s unless renewed
    flow_poll_s: float = 1.0
    flow_ttl_s: float = 10.0
    #: labels jobs can be pinned to (besides the worker's id)
    tags: tuple[str, ...] = ()
    worker_id: str | None = None

    def __post_init__(self) -> None:
        if not self.queues or not all(isinstance(q, str) and q for q in self.queues):
            raise ConfigError(
                f"queues must be a non-empty list of queue names, got {self.queues!r}"
            )
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.lease_s <= 0 or self.poll_s <= 0 or self.grace_s < 0 or self.maintenance_s <= 0:
            raise ConfigError("lease_s, poll_s and maintenance_s must be > 0 and grace_s >= 0")
        if self.heartbeat_s is not None and not 0 < self.heartbeat_s < self.lease_s:
            raise ConfigError(
                f"heartbeat_s ({self.heartbeat_s}) must be > 0 and shorter than "
                f"lease_s ({self.lease_s})"
            )
        if self.fetch_batch is not None and self.fetch_batch < 1:
            raise ConfigError(f"fetch_batch must be >= 1, got {self.fetch_batch}")

    @property
    def heartbeat_every(self) -> float:
        return self.heartbeat_s or self.lease_s / 3

    @property
    def batch(self) -> int:
        return min(self.fetch_batch or self.concurrency, self.concurrency)


@dataclass
class Running:
    job: Job
    task: asyncio.Task[None]
    lost: bool = False
    released: bool = False
    #: set when an operator cancels the job; handlers read it via cancel_requested()
    cancel: threading.Event = field(default_factory=threading.Event)


@dataclass
class WorkerStats:
    counts: Counter[str] = field(default_factory=Counter)


class Worker:
    def __init__(self, app: Conveyor, config: WorkerConfig | None = None, **options: Any) -> None:
        if config is not None and options:
            raise ConfigError("pass either config= or keyword options, not both")
        if "queues" in options and isinstance(options["queues"], str):
            options["queues"] = tuple(q.strip() for q in options["queues"].split(",") if q.strip())
        elif "queues" in options:
            options["queues"] = tuple(options["queues"])
        if isinstance(options.get("tags"), str):
            options["tags"] = tuple(t.strip() for t in options["tags"].split(",") if t.strip())
        elif "tags" in options:
            options["tags"] = tuple(options["tags"])
        self.app = app
        self.config = config or WorkerConfig(**options)
        self.id = self.config.worker_id or (
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        )
        self.stats = WorkerStats()
        self.running: dict[int, Running] = {}
        self.leases: dict[int, str] = {}
        self._stop_requested = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping = False
        self._hard = False

    # -- public control -------------------------------------------------------------
    def run(self, *, install_signals: bool = True) -> WorkerStats:
        """Run until stopped (SIGTERM/SIGINT, ``stop()``, or burst mode running dry)."""
        return asyncio.run(self.run_async(install_signals=install_signals))

    def stop(self, *, graceful: bool = True) -> None:
        """Ask the worker to stop (thread-safe). A second, or non-graceful, call
        skips the grace period."""
        hard = not graceful or self._stop_requested.is_set()
        self._stop_requested.set()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._begin_stop, hard)

    # -- lifecycle --------------------------------------------------------------------
    async def run_async(self, *, install_signals: bool = False) -> WorkerStats:
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        backend = self.app.backend  # opens and migrates; errors surface before we start
        missing = set(self.app.tasks) and not any(
            t.defaults.queue in cfg.queues for t in self.app.tasks.values()
        )
        if missing:
            log.warning(
                "no registered task uses queues %s; tasks use %s",
                list(cfg.queues),
                sorted({t.defaults.queue for t in self.app.tasks.values()}),
            )
        self._threads = {
            name: ThreadPoolExecutor(1, thread_name_prefix=f"conveyor-{name}")
            for name in ("fetch", "complete", "heartbeat", "maintenance", "flow")
        }
        self._pool = DaemonPool(cfg.concurrency)
        self._wake = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._slot_need = 1
        self._flow_wake = asyncio.Event()
        self._hb_wake = asyncio.Event()
        self._hard_event = asyncio.Event()
        self.completer = Completer(self._write_outcomes, self._outcome_written)
        self.completer.start()
        self._info = WorkerInfo(
            id=self.id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            queues=list(cfg.queues),
            concurrency=cfg.concurrency,
            tags=list(cfg.tags),
        )
        await self._db(
            "heartbeat", backend.worker_heartbeat, worker=self._info, leases=[], lease_s=cfg.lease_s
        )
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self.stop)
        if self._stop_requested.is_set():
            self._begin_stop(False)
        notifier = backend.notifier()
        listener = threading.Thread(
            target=self._listen, args=(notifier,), name="conveyor-listen", daemon=True
        )
        listener.start()
        log.info(
            "worker %s started: queues=%s concurrency=%d database=%s (%s)",
            self.id,
            ",".join(cfg.queues),
            cfg.concurrency,
            backend.name,
            "LISTEN/NOTIFY + polling" if backend.pushes_notifications else "polling",
        )
        loops = [
            asyncio.create_task(coro, name=name)
            for name, coro in (
                ("heartbeat", self._heartbeat_loop()),
                ("maintenance", self._maintenance_loop()),
                ("flow", self._flow_loop()),
                ("cron", self._cron_loop()),
            )
        ]
        try:
            await self._fetch_loop()
            await self._drain()
        finally:
            for t in loops:
                t.cancel()
            await asyncio.gather(*loops, return_exceptions=True)
            flow = getattr(self, "_flow", None)
            if flow is not None:
                try:  # hand leadership over now rather than when the lease expires
                    await self._db("flow", flow.resign)
                except Exception as exc:
                    log.warning("could not resign flow leadership: %s", exc)
            self._stop_requested.set()
            notifier.close()  # waits for the listener's current wait() to return
            await asyncio.to_thread(listener.join, 5)
            try:
                await self._db("heartbeat", backend.worker_deregister, worker_id=self.id)
            except Exception as exc:
                log.warning("could not deregister worker %s: %s", self.id, exc)
            for ex in self._threads.values():  # each finishes at most its current call
                await asyncio.to_thread(ex.shutdown, True)
            self._pool.shutdown()
        c = self.stats.counts
        log.info(
            "worker %s stopped: %d succeeded, %d failed, %d retried, %d released, %d refused",
            self.id,
            c["succeeded"],
            c["failed"],
            c["retry"],
            c["released"],
            c["refused"],
        )
        return self.stats

    def _begin_stop(self, hard: bool) -> None:
        if hard:
            self._hard = True
            self._hard_event.set()
        if not self._stopping:
            log.info("worker %s stopping: no new jobs; %d running", self.id, len(self.running))
        elif hard:
            log.info("worker %s: second stop request, releasing running jobs now", self.id)
        self._stopping = True
        self._stop_requested.set()
        self._wake.set()
        self._slot_freed.set()

    async def _db(self, thread: str, fn: Callable[..., T], **kwargs: Any) -> T:
        assert self._loop is not None
        return await self._loop.run_in_executor(
            self._threads[thread], functools.partial(fn, **kwargs)
        )

    def _listen(self, notifier: Any) -> None:
        """Thread: turn database hints into wake-ups of the fetch loop."""
        wanted = set(self.config.queues)
        while not self._stop_requested.is_set():
            try:
                queues = notifier.wait(0.5)
            except Exception:
                time.sleep(0.5)
                continue
            if not queues or self._loop is None:
                continue
            wake = [self._wake.set] if "*" in queues or queues & wanted else []
            if "*" in queues or "@flow" in queues:
                wake.append(self._flow_wake.set)
            if "@cancel" in queues:
                wake.append(self._hb_wake.set)
            try:
                for fn in wake:
                    self._loop.call_soon_threadsafe(fn)
            except RuntimeError:
                return  # loop closed

    # -- claiming -----------------------------------------------------------------------
    def _free(self) -> int:
        """Slots to claim for. Finished jobs whose outcome is not written yet still
        hold leases: past one concurrency's worth of them, they take slots too, so
        a slow database slows claiming instead of piling up leases."""
        cfg = self.config
        unwritten = self.completer.backlog if hasattr(self, "completer") else 0
        return cfg.concurrency - len(self.running) - max(0, unwritten - cfg.concurrency)

    async def _wait_for_slots(self, need: int) -> int:
        free = self._free()
        if free >= need or self._stopping:
            return free
        self._slot_need = need
        self._slot_freed.clear()
        # with some slots free, claim for them soon rather than wait to fill up
        await wait_event(self._slot_freed, 0.01 if free > 0 else None)
        return self._free()

    async def _fetch_loop(self) -> None:
        cfg = self.config
        queues = list(cfg.queues)
        fetch_min = max(1, cfg.batch // 2)
        poll = 0.05
        more = True  # claim straight away at start
        while not self._stopping:
            free = await self._wait_for_slots(fetch_min if more else 1)
            if self._stopping:
                break
            if free <= 0:
                continue
            if not more:
                await wait_event(self._wake, poll)
                if self._stopping:
                    break
            self._wake.clear()
            limit = min(self._free(), cfg.batch)
            try:
                jobs = await self._db(
                    "fetch",
                    self.app.backend.job_fetch_available,
                    queues=queues,
                    worker_id=self.id,
                    limit=limit,
                    lease_s=cfg.lease_s,
                    tags=cfg.tags,
                )
            except Exception as exc:
                log.error("could not claim jobs, retrying in 1s: %s", exc)
                await asyncio.sleep(1.0)
                continue
            queues = queues[1:] + queues[:1]  # no queue always goes first
            more = len(jobs) == limit
            poll = 0.05 if jobs else min(poll * 2, cfg.poll_s)
            for job in jobs:
                self._start(job)
            if cfg.burst and not jobs and not self.running and not self.completer.backlog:
                log.info("worker %s: burst mode and nothing left to claim", self.id)
                self._begin_stop(False)

    # -- running ------------------------------------------------------------------------
    def _start(self, job: Job) -> None:
        previous = self.running.get(job.id)
        if previous is not None:
            # Our old lease on this job expired and was rescued, and we claimed it
            # again before the heartbeat noticed: the old run is superseded.
            self._abandon(previous, "claimed again under a new lease")
        self.leases[job.id] = job.lease_token or ""
        task = asyncio.create_task(self._run_job(job))
        self.running[job.id] = Running(job, task)

    async def _run_job(self, job: Job) -> None:
        task = self.app.tasks.get(job.task)
        try:
            if task is None:
                known = ", ".join(sorted(self.app.tasks)) or "none"
                outcome = fail(
                    job,
                    f"UnknownTask: no handler named {job.task!r} in this "
                    f"worker (registered: {known}); not retried",
                )
            else:
                entry = self.running.get(job.id)
                flag = entry.cancel if entry is not None else None
                result = await run_handler(task, job, self._pool, self._late_result, flag)
                outcome = classify(task, job, result)
        except asyncio.CancelledError:
            entry = self._finished(job)
            if entry is None or entry.lost or entry.released or not entry.cancel.is_set():
                return  # shutdown or a lost lease: nothing to record here
            outcome = cancelled(job)
        else:
            entry = self._finished(job)
            if entry is not None and entry.cancel.is_set():
                outcome = cancelled(job)  # cancelled while running: that wins
        if entry is None or entry.lost:
            return  # the lease is gone; someone else (or a newer run) owns the job now
        self._log_outcome(job, outcome)
        self.completer.add(outcome)

    def _finished(self, job: Job) -> Running | None:
        """Forget a run; ``None`` if a newer run of the same job replaced it."""
        entry = self.running.get(job.id)
        if entry is None or entry.job.lease_token != job.lease_token:
            return None
        del self.running[job.id]
        if self._free() >= self._slot_need:
            self._slot_freed.set()
        return entry

    def _late_result(self, task: Task, job: Job, outcome: Outcome) -> None:
        """From a sync handler's thread, after its timeout was already recorded."""
        if self._loop is None or self._loop.is_closed():
            return
        late = classify(task, job, outcome)

        def submit() -> None:
            log.warning(
                "job %d (%s) finished after its %gs timeout; submitting its late result, "
                "which fencing must refuse",
                job.id,
                job.task,
                job.timeout or 0,
            )
            self.completer.add(late)

        try:
            self._loop.call_soon_threadsafe(submit)
        except RuntimeError:
            pass

    def _log_outcome(self, job: Job, o: Finalize) -> None:
        if o.outcome == "retry":
            log.warning(
                "job %d %s attempt %d/%d failed, retrying in %.1fs: %s",
                job.id,
                job.task,
                job.attempts,
                job.max_attempts,
                o.retry_in_s or 0,
                o.error,
            )
        elif o.outcome == "failed":
            log.error("job %d %s failed: %s", job.id, job.task, o.error)
        else:
            log.debug("job %d %s %s", job.id, job.task, o.outcome)

    # -- recording outcomes ---------------------------------------------------------------
    async def _write_outcomes(self, batch: list[Finalize]) -> list[int]:
        accepted = await self._db(
            "complete", self.app.backend.job_finalize_many, worker_id=self.id, outcomes=batch
        )
        # Jobs that left 'running' may have made room under a limit: claim again now
        # rather than at the next poll (other workers get a NOTIFY on PostgreSQL).
        self._wake.set()
        return accepted

    def _outcome_written(self, o: Finalize, accepted: bool) -> None:
        if self.leases.get(o.job_id) == o.token:
            del self.leases[o.job_id]
        if self._free() >= self._slot_need:
            self._slot_freed.set()
        if accepted:
            self.stats.counts[o.outcome] += 1
        else:
            self.stats.counts["refused"] += 1
            log.warning(
                "outcome %r of job %d refused: this worker no longer holds its lease",
                o.outcome,
                o.job_id,
            )

    # -- leases ---------------------------------------------------------------------------
    async def _heartbeat_loop(self) -> None:
        cfg = self.config
        while True:
            # a cancel or stop request (NOTIFY "@cancel") brings it forward
            await wait_event(self._hb_wake, cfg.heartbeat_every)
            self._hb_wake.clear()
            snapshot = [Lease(i, t) for i, t in self.leases.items()]
            try:
                beat = await self._db(
                    "heartbeat",
                    self.app.backend.worker_heartbeat,
                    worker=self._info,
                    leases=snapshot,
                    lease_s=cfg.lease_s,
                )
            except Exception as exc:
                log.error(
                    "heartbeat failed (leases expire in %gs unless renewed): %s", cfg.lease_s, exc
                )
                continue
            held = set(beat.held)
            for lease in snapshot:
                if lease.job_id not in held and self.leases.get(lease.job_id) == lease.token:
                    self._lose(lease.job_id)
            for job_id in beat.cancel:
                self._cancel(job_id)
            if beat.stop and not self._stopping:
                log.info("worker %s: stop requested by an operator", self.id)
                self._begin_stop(False)

    def _cancel(self, job_id: int) -> None:
        entry = self.running.get(job_id)
        if entry is None or entry.cancel.is_set():
            return
        log.info("job %d %s: cancellation requested; cancelling it", job_id, entry.job.task)
        entry.cancel.set()  # what a sync handler sees through cancel_requested()
        entry.task.cancel()  # an async handler is interrupted; a sync one is let go

    def _lose(self, job_id: int) -> None:
        self.leases.pop(job_id, None)
        entry = self.running.get(job_id)
        if entry is not None:
            self._abandon(entry, "expired and rescued, or finished elsewhere")

    def _abandon(self, entry: Running, why: str) -> None:
        self.stats.counts["lost"] += 1
        log.warning("lost the lease of job %d (%s); stopping it here", entry.job.id, why)
        entry.lost = True
        entry.task.cancel()
        if self.running.get(entry.job.id) is entry:
            del self.running[entry.job.id]

    async def _maintenance_loop(self) -> None:
        service = Maintenance(
            self.app.backend,
            stale_worker_s=max(300.0, 10 * self.config.lease_s),
            aging_s=self.app.priority_aging_s,
            max_boost=self.app.priority_max_boost,
            retention=self.app.retention,
        )
        while True:
            try:
                await self._db("maintenance", service.step)
            except Exception as exc:
                log.error("maintenance pass failed: %s", exc)
            await asyncio.sleep(self.config.maintenance_s)

    async def _cron_loop(self) -> None:
        """Enqueue the due ticks of periodic tasks, just after every second."""
        if not self.app.periodics:
            return
        service = CronService(self.app)
        while True:
            try:
                await self._db("maintenance", service.step)
            except Exception as exc:
                log.error("cron pass (periodic tasks) failed: %s", exc)
            await asyncio.sleep(1.005 - time.time() % 1.0)

    async def _flow_loop(self) -> None:
        """The batch aggregator and chain advancer; acts only while leader."""
        cfg = self.config
        service = FlowService(self.app.backend, holder=self.id, ttl_s=cfg.flow_ttl_s)
        self._flow = service
        while True:
            self._flow_wake.clear()
            try:
                await self._db("flow", service.step)
            except Exception as exc:
                log.error("flow pass (batches, chains) failed: %s", exc)
            # The leader wakes on "@flow" hints; the others only poll for the lease.
            wait = cfg.flow_poll_s if service.is_leader else cfg.flow_ttl_s / 3
            await wait_event(self._flow_wake, wait)

    # -- shutdown -------------------------------------------------------------------------
    async def _drain(self) -> None:
        """Let running jobs finish within the grace period; release the rest."""
        cfg = self.config
        if self.running and not self._hard:
            log.info("waiting up to %gs for %d running job(s)", cfg.grace_s, len(self.running))
            finished = asyncio.gather(
                *(r.task for r in self.running.values()), return_exceptions=True
            )
            hard = asyncio.create_task(self._hard_event.wait())
            await asyncio.wait(
                [finished, hard], timeout=cfg.grace_s, return_when=asyncio.FIRST_COMPLETED
            )
            hard.cancel()
        remaining = list(self.running.values())
        if remaining:
            leases = [Lease(r.job.id, r.job.lease_token or "") for r in remaining]
            for r in remaining:
                r.released = True
                r.task.cancel()
            await asyncio.gather(*(r.task for r in remaining), return_exceptions=True)
            released = await self._db("complete", self.app.backend.job_release_many, leases=leases)
            for le in leases:
                self.leases.pop(le.job_id, None)
            self.stats.counts["released"] += len(released)
            log.info(
                "released %d unfinished job(s) back to the queue without using an attempt",
                len(released),
            )
        await self.completer.close()
