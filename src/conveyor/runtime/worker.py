"""The worker: a set of services around one claim loop.

The claim loop (asyncio) claims jobs for its free slots and runs each through
the executor; outcomes go to the completer, which writes them in batches.
Around it, each on a thread of its own: the heartbeat (one row per worker,
which keeps every job it holds), the listener (database hints), leader
election, maintenance and the flow service (leader only), and cron.
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
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from ..encoding import not_run_message
from ..errors import ConfigError, DatabaseUnavailable, UnknownTask
from ..hooks import chain_execute
from ..records import (
    Finalize,
    Heartbeat,
    JobFilter,
    JobRecord,
    JobState,
    Lease,
    Outcome,
    WorkerInfo,
)
from ..registry import INTERNAL_QUEUE, user_tasks
from ..task import Task
from .completer import Completer
from .context import CancelFlag
from .executor import InProcess, Run, cancelled, classify, fail
from .flow_service import FlowService
from .heartbeat import HeartbeatService
from .host import cluster_services
from .listener import Listener
from .resolver import TaskResolver, resolver_for
from .service import Services
from .stores import WorkerBackend

if TYPE_CHECKING:
    from collections.abc import Callable

    from ..app import Conveyor

log = logging.getLogger("conveyor.worker")
#: one line per attempt (see _log_outcome)
jobs_log = logging.getLogger("conveyor.jobs")
T = TypeVar("T")
#: exit status of a worker whose code is older than the database schema (deploy the
#: new code), whether it finds that at start or while it runs
EXIT_SCHEMA_TOO_NEW = 3
#: exit status of a burst worker whose claim failed with an error other than the
#: database being out of reach (a schema the code does not match, say)
EXIT_CLAIM_FAILED = 1


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
    #: jobs run at once: coroutines for async handlers, threads (started as needed)
    #: for sync ones. 100 keeps a worker busy with short jobs; long or heavy jobs
    #: want fewer (or --processes)
    concurrency: int = 100
    #: a worker silent this long is dead: its jobs run again elsewhere
    worker_ttl_s: float = 7.0
    #: how often the worker heartbeats (default: 2 s, at most a third of the ttl)
    heartbeat_s: float | None = None
    #: longest wait between polls when no notification arrives (the safety net)
    poll_s: float = 1.0
    #: most jobs claimed in one statement (default: concurrency)
    fetch_batch: int | None = None
    #: most outcomes written in one statement, and how long to wait for more
    #: before a write (0: write as soon as the previous write is done)
    completion_batch: int = 500
    completion_wait_s: float = 0.0
    #: on SIGTERM/SIGINT, how long running jobs may take to finish before release
    grace_s: float = 30.0
    #: exit once nothing it could run is waiting and nothing is running
    burst: bool = False
    #: labels jobs can be pinned to (besides the worker's id)
    tags: tuple[str, ...] = ()
    worker_id: str | None = None
    #: which handlers run: "registered" (the app's tasks), "import" (module:function
    #: names too) or "none" (claim nothing)
    resolver: str = "registered"
    #: run handlers in this many child processes instead of in this one
    processes: int | None = None
    #: --processes: kill a child whose memory grows past this (MB)
    max_memory_mb: float | None = None
    #: the app, as module:attribute, for child processes to import
    app_spec: str | None = None
    #: leader lease and how often the leader's maintenance runs
    leader_ttl_s: float = 5.0
    maintenance_s: float = 1.0
    #: flow service poll when no notification arrives
    flow_poll_s: float = 1.0
    #: run cluster-wide services (leader election, maintenance, flow, cron) here
    services: bool = True
    #: at start, keep trying this long to reach a database that does not answer
    #: yet (refused, starting up, restarting) before giving up with its error; a
    #: database that answers no (a password, a database name) fails at once
    connect_wait_s: float = 30.0

    def __post_init__(self) -> None:
        if not self.queues or not all(isinstance(q, str) and q for q in self.queues):
            raise ConfigError(
                f"queues must be a non-empty list of queue names, got {self.queues!r}"
            )
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be >= 1, got {self.concurrency}")
        if self.worker_ttl_s <= 0 or self.poll_s <= 0 or self.grace_s < 0:
            raise ConfigError("worker_ttl_s and poll_s must be > 0 and grace_s >= 0")
        if self.heartbeat_s is not None and not 0 < self.heartbeat_s < self.worker_ttl_s:
            raise ConfigError(
                f"heartbeat_s ({self.heartbeat_s}) must be > 0 and shorter than "
                f"worker_ttl_s ({self.worker_ttl_s})"
            )
        if self.fetch_batch is not None and self.fetch_batch < 1:
            raise ConfigError(f"fetch_batch must be >= 1, got {self.fetch_batch}")
        if self.completion_batch < 1 or not 0 <= self.completion_wait_s <= 10:
            raise ConfigError(
                "completion_batch must be >= 1 and completion_wait_s between 0 and 10 s, got "
                f"{self.completion_batch} and {self.completion_wait_s}"
            )
        if not 0 <= self.connect_wait_s <= 86400:
            raise ConfigError(
                f"connect_wait_s must be between 0 and 86400 s, got {self.connect_wait_s}"
            )
        if self.processes is not None and self.processes < 1:
            raise ConfigError(f"processes must be >= 1, got {self.processes}")
        if self.max_memory_mb is not None and self.processes is None:
            raise ConfigError("max_memory_mb needs processes (handlers in child processes)")

    @property
    def heartbeat_every(self) -> float:
        return self.heartbeat_s or min(2.0, self.worker_ttl_s / 3)

    @property
    def slots(self) -> int:
        return self.processes or self.concurrency

    @property
    def batch(self) -> int:
        return min(self.fetch_batch or self.slots, self.slots)


@dataclass
class Running:
    job: JobRecord
    task: asyncio.Task[None]
    lost: bool = False
    released: bool = False
    #: set when an operator cancels the job or its lease is lost; handlers read it
    #: through cancel_requested()
    cancel: CancelFlag = field(default_factory=CancelFlag)
    handler: Task | None = None
    cancelling: bool = False


@dataclass
class WorkerStats:
    counts: Counter[str] = field(default_factory=Counter)


class Executor(Protocol):
    async def invoke(
        self, task: Task, job: JobRecord, cancel: CancelFlag | None, run: Run
    ) -> Any: ...

    def shutdown(self) -> None: ...


def trace_id(job: JobRecord) -> str | None:
    """The trace a job belongs to, from its W3C ``traceparent`` header."""
    parts = job.headers.get("traceparent", "").split("-")
    return parts[1] if len(parts) == 4 else None


def _worker_config(config: WorkerConfig | None, options: dict[str, Any]) -> WorkerConfig:
    """``config``, or one made of ``Worker``'s keyword options (queues and tags
    may be given as one comma-separated string)."""
    if config is not None and options:
        raise ConfigError("pass either config= or keyword options, not both")
    for name in ("queues", "tags"):
        value = options.get(name)
        if isinstance(value, str):
            options[name] = tuple(v.strip() for v in value.split(",") if v.strip())
        elif value is not None:
            options[name] = tuple(value)
    if "lease_s" in options:  # older name: a job is lost this long after its worker died
        options.setdefault("worker_ttl_s", options.pop("lease_s"))
    return config or WorkerConfig(**options)


class Worker:
    def __init__(
        self,
        app: Conveyor,
        config: WorkerConfig | None = None,
        *,
        task_resolver: TaskResolver | None = None,
        **options: Any,
    ) -> None:
        self.app = app
        self.config = _worker_config(config, options)
        self.resolver = task_resolver or resolver_for(app, self.config.resolver)
        self.id = self.config.worker_id or (
            f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        )
        self.stats = WorkerStats()
        self.running: dict[int, Running] = {}
        self.leases: dict[int, str] = {}
        self.exit_code = 0
        self._stop_requested = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_ident: int | None = None
        self._tick = time.monotonic()
        self._stopping = False
        self._hard = False
        self._unknown: set[int] = set()
        # New work: set by the listener's thread, outcomes and stop. A threading
        # event, waited on by the fetch thread itself (_claim_when_woken), so a
        # NOTIFY reaches the claim in one thread wake-up instead of two (listener
        # -> event loop -> fetch thread: 0.33 ms of an idle worker's 3.2 ms).
        self._wake = threading.Event()
        #: told whether the claim loop waits for hints (Listener.pace); made at start
        self._listener: Listener | None = None
        # Known at start, once the database is open and every task is registered:
        # the schema this code knows, and the tasks it claims ([] until then).
        self._schema = 0
        self._tasks: list[str] | None = []
        #: the heartbeat, the listener and the cluster-wide services, made at start
        self._services = Services()
        #: one thread each for claims and for writes (threads start on first use)
        self._db_threads = {
            name: ThreadPoolExecutor(1, thread_name_prefix=f"conveyor-{name}")
            for name in ("fetch", "complete")
        }
        #: runs the handlers in this process; with processes=, replaced at start by a
        #: pool of child processes (app_spec is checked then)
        self.executor: Executor = InProcess(
            self.config.concurrency, self._late_result, store=lambda: self.app.backend
        )
        self.completer = Completer(
            self._write_outcomes,
            self._outcome_written,
            self._was_written,
            max_batch=self.config.completion_batch,
            gather_s=self.config.completion_wait_s,
        )
        #: set when a running job ends while the claim loop waits for _slot_need slots
        self._slot_freed = asyncio.Event()
        self._slot_need = 1
        #: set by a second (or non-graceful) stop: running jobs are released at once
        self._hard_event = asyncio.Event()

    @functools.cached_property
    def backend(self) -> WorkerBackend:
        """The app's database; first read at start, once ``Conveyor.connect`` opened it."""
        return self.app.backend

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
            try:
                self._loop.call_soon_threadsafe(self._begin_stop, hard)
            except RuntimeError:
                pass  # the loop closed meanwhile

    def health(self) -> dict[str, Any]:
        """Each service's health, for a readiness probe."""
        return {h.name: h for h in self._services.health()}

    # -- lifecycle --------------------------------------------------------------------
    async def run_async(self, *, install_signals: bool = False) -> WorkerStats:
        await self._start_up(install_signals)
        ticker = asyncio.create_task(self._ticker(), name="conveyor-tick")
        try:
            await self._fetch_loop()
            await self._drain()
        finally:
            ticker.cancel()
            await self._shut_down()
        c = self.stats.counts
        log.info(
            "worker %s stopped: %d succeeded, %d failed, %d retried, %d released, %d refused",
            self.id,
            c[Outcome.SUCCEEDED],
            c[Outcome.FAILED],
            c[Outcome.RETRY],
            c[Outcome.RELEASED],
            c["refused"],
        )
        return self.stats

    async def _start_up(self, install_signals: bool) -> None:
        """Open the database, register, and start the services: everything before
        the first claim."""
        cfg = self.config
        self._loop = asyncio.get_running_loop()
        self._loop_ident = threading.get_ident()
        # Opens and migrates; errors surface before we start (a database that does
        # not answer yet is waited for, up to connect_wait_s: Conveyor.connect).
        self.app.connect(wait_s=self.config.connect_wait_s)
        self._schema = self.backend.latest_schema
        self._tasks = self.resolver.names()
        self._warn_unused_queues()
        if cfg.processes:
            self.executor = self._process_pool(cfg.processes)
        self.completer.start()
        info = WorkerInfo(
            id=self.id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            queues=list(cfg.queues),
            concurrency=cfg.slots,
            tags=list(cfg.tags),
            tasks=self._tasks,
        )
        # Registered before the first claim: a job claimed by a worker without a
        # row would be rescued at once.
        first = await self._db("complete", self.backend.worker_heartbeat, worker=info)
        self._check_schema(first)
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._loop.add_signal_handler(sig, self.stop)
        if self._stop_requested.is_set():
            self._begin_stop(False)
        log.info(
            "worker %s started: queues=%s %s database=%s (%s)",
            self.id,
            ",".join(cfg.queues),
            f"processes={cfg.processes}" if cfg.processes else f"concurrency={cfg.concurrency}",
            self.backend.name,
            "LISTEN/NOTIFY + polling" if self.backend.supports("push_notifications") else "polling",
        )
        self._add_services(info)
        self._services.start()

    async def _shut_down(self) -> None:
        self._stop_requested.set()
        await asyncio.to_thread(self._services.stop)
        try:
            await self._db("complete", self.backend.worker_deregister, worker_id=self.id)
        except Exception as exc:
            log.warning("could not deregister worker %s: %s", self.id, exc)
        for ex in self._db_threads.values():  # each finishes at most its current call
            await asyncio.to_thread(ex.shutdown, True)
        self.executor.shutdown()

    def _process_pool(self, processes: int) -> Executor:
        from .supervisor import ProcessPool

        if not self.config.app_spec:
            raise ConfigError(
                "processes= needs app_spec='module:attribute' so child processes can "
                "import the app (conveyor worker --app does this)"
            )
        return ProcessPool(
            self.config.app_spec,
            processes,
            url=self.app.url,
            max_memory_mb=self.config.max_memory_mb,
        )

    def _add_services(self, info: WorkerInfo) -> None:
        """The heartbeat, the cluster-wide services (unless ``services=False``) and
        the listener, which wakes the claim loop, the flow service and the heartbeat."""
        cfg = self.config
        heartbeat = HeartbeatService(
            self.app.backend,
            info,
            self,
            interval=cfg.heartbeat_every,
            worker_ttl_s=cfg.worker_ttl_s,
        )
        self._services.add(heartbeat)
        flow: FlowService | None = None
        if cfg.services:
            cluster = cluster_services(
                self.app,
                self.id,
                leader_ttl_s=cfg.leader_ttl_s,
                maintenance_s=cfg.maintenance_s,
                worker_ttl_s=cfg.worker_ttl_s,
                flow_poll_s=cfg.flow_poll_s,
            )
            for service in cluster.services.services:
                self._services.add(service)
            flow = cluster.flow
        self._listener = Listener(
            lambda: self.backend.notifier(),
            cfg.queues,
            on_work=self._hinted,
            on_flow=flow.wake if flow is not None else (lambda: None),
            on_cancel=heartbeat.wake,
            me=self.id,
        )
        self._services.add(self._listener)

    def _warn_unused_queues(self) -> None:
        tasks = user_tasks(self.app.tasks)
        if INTERNAL_QUEUE in self.config.queues:
            return  # Conveyor's own tasks use it
        if tasks and not any(t.defaults.queue in self.config.queues for t in tasks):
            log.warning(
                "no registered task uses queues %s; tasks use %s",
                list(self.config.queues),
                sorted({t.defaults.queue for t in tasks}),
            )

    def _hinted(self) -> None:
        """New work (from the listener's thread): wake the claim loop. The fetch
        thread waits on this event itself, with no hop through the event loop."""
        self._wake.set()

    def _threadsafe(self, fn: Callable[[], Any]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            loop.call_soon_threadsafe(fn)
        except RuntimeError:
            pass  # the loop closed meanwhile

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
            self._db_threads[thread], functools.partial(fn, **kwargs)
        )

    async def _ticker(self) -> None:
        """Proof of life of the event loop, for the heartbeat's watchdog."""
        while True:
            self._tick = time.monotonic()
            await asyncio.sleep(0.2)

    # -- claiming -----------------------------------------------------------------------
    def _free(self) -> int:
        """Slots to claim for. Finished jobs whose outcome is not written yet still
        hold their jobs: past one concurrency's worth of them, they take slots too,
        so a slow database slows claiming instead of piling up leases."""
        slots = self.config.slots
        unwritten = self.completer.backlog
        return slots - len(self.running) - max(0, unwritten - slots)

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
            limit = min(free, cfg.batch)
            left = threading.Event()  # set when this loop stops awaiting the claim
            try:
                claimed = await self._db(
                    "fetch",
                    self._claim_when_woken,
                    wait=None if more else poll,
                    left=left,
                    queues=queues,
                    limit=limit,
                )
            except asyncio.CancelledError:
                left.set()  # the fetch thread must not claim for a loop that left
                self._wake.set()
                raise
            except Exception as exc:
                if cfg.burst and not isinstance(exc, DatabaseUnavailable):
                    # Trying again cannot help, and a burst worker's caller waits for
                    # it to finish: it must not wait for ever, nor hear "done".
                    log.error("could not claim jobs, stopping (burst mode): %s", exc)
                    self.exit_code = EXIT_CLAIM_FAILED
                    self._begin_stop(False)
                    break
                log.error("could not claim jobs, retrying in 1s: %s", exc)
                await asyncio.sleep(1.0)
                continue
            if claimed is None:  # stopping, woken before the claim
                break
            jobs, took, asked = claimed
            self._hook("on_claimed", jobs, took)
            queues = queues[1:] + queues[:1]  # no queue always goes first
            more = len(jobs) == asked
            poll = 0.05 if jobs else min(poll * 2, cfg.poll_s)
            for job in jobs:
                self._start(job)
            if jobs and not more:
                # The handlers first, then the next claim: submitted before they
                # ran, the fetch thread's wake-up took the GIL between the claim
                # and an idle worker's handler start.
                await asyncio.sleep(0)
            idle = not jobs and not self.running and not self.completer.backlog
            if cfg.burst and idle and not await self._anything_waiting():
                log.info("worker %s: burst mode and nothing left it could run", self.id)
                self._begin_stop(False)

    def _claim_when_woken(
        self, *, wait: float | None, left: threading.Event, queues: list[str], limit: int
    ) -> tuple[list[JobRecord], float, int] | None:
        """In the fetch thread: wait up to ``wait`` seconds for new work (None: claim
        at once), then claim up to ``limit`` jobs, or more if slots freed up during the
        wait; the jobs, the claim's duration and how many it asked for. None when the
        worker is stopping (or the loop stopped awaiting) first: no job is claimed
        then.

        Slots are counted again after the wait: under a queue limit the wait is for
        this worker's own outcomes, whose jobs held slots when ``limit`` was counted.
        Claiming only for those slots, a claim that filled the limit again looked
        full, and the next claim, made at once, found nothing. Only this thread adds
        running jobs (the loop starts each claim's jobs before it asks for the next),
        so slots only free up meanwhile. A count read while the loop moves a job from
        running to the completer's queue may free one slot too many; unwritten
        outcomes count only while they exceed the slots, and then that one slot is
        still among them."""
        listener = self._listener
        if wait is not None:
            if listener is not None:
                listener.pace(True)
            self._wake.wait(wait)
            limit = max(limit, min(self._free(), self.config.batch))
        elif listener is not None:
            # The last claim was full: this one is made without a hint, and so is
            # the next while claims come back full. The hints can come slower.
            listener.pace(False)
        if self._stopping or left.is_set():
            return None
        self._wake.clear()  # a hint from now on is for the next claim
        began = time.perf_counter()
        jobs = self.backend.job_claim(
            queues=queues,
            worker_id=self.id,
            limit=limit,
            tasks=self._tasks,
            tags=self.config.tags,
            schema_version=self._schema,
        )
        return jobs, time.perf_counter() - began, limit

    async def _anything_waiting(self) -> bool:
        """Burst mode: is a job this worker could run still waiting (a limit may be
        full, or another worker about to finish)? Then stay."""
        f = JobFilter(
            queues=self.config.queues,
            tasks=None if self._tasks is None else tuple(self._tasks),
            states=(JobState.AVAILABLE, JobState.SCHEDULED),
            due_before=datetime.now(UTC),
            unpaused=True,
        )
        try:
            counts = await self._db("fetch", self.backend.job_count, filter=f)
        except Exception:
            return True
        return any(counts.values())

    # -- running ------------------------------------------------------------------------
    def _start(self, job: JobRecord) -> None:
        previous = self.running.get(job.id)
        if previous is not None:
            # Our old claim on this job was rescued, and we claimed it again before
            # the heartbeat noticed: the old run is superseded.
            self._abandon(previous, "claimed again")
        self.leases[job.id] = job.lease_token or ""
        entry = Running(job, asyncio.create_task(self._run_job(job)))
        self.running[job.id] = entry

    async def _run_job(self, job: JobRecord) -> None:
        if job.unreadable is not None:
            # Its arguments could not be read back: the handler would run on
            # empty ones. Failed, not retried: no later attempt reads them better.
            entry = self._finished(job)
            if entry is not None and not entry.lost:
                outcome = fail(job, not_run_message(job.unreadable))
                self._observe(job, outcome, None)
                self.completer.add(outcome)
            return
        run = Run()
        task: Task | None = None
        entry = self.running.get(job.id)  # _start registered it before this task ran
        flag = entry.cancel if entry is not None else None
        try:
            task = self.resolver.resolve(job.task)
            if entry is not None:
                entry.handler = task
            if task is None:
                raise UnknownTask(
                    f"no handler for task {job.task!r} in worker {self.id} (it claimed the job "
                    "by import path and could not import it)"
                )
            executor = self.executor
            handler = task

            def call() -> Any:
                return executor.invoke(handler, job, flag, run)

            run.result = await chain_execute(self.app.middleware, job, call)()
        except asyncio.CancelledError:
            entry = self._finished(job)
            if entry is None or entry.lost or entry.released or not entry.cancel.is_set():
                return  # shutdown or a lost lease: nothing to record here
            outcome = cancelled(job)
        except BaseException as exc:  # SystemExit and KeyboardInterrupt too: data, not a crash
            run.exc = exc
            entry = self._finished(job)
            outcome = classify(task, job, run, self.app.middleware)
        else:
            entry = self._finished(job)
            outcome = classify(task, job, run, self.app.middleware)
        if entry is not None and entry.cancel.is_set() and not entry.lost:
            outcome = cancelled(job)  # cancelled while running: that wins
        if entry is None or entry.lost:
            return  # the lease is gone; someone else (or a newer run) owns the job now
        self._observe(job, outcome, run.duration_s)
        self.completer.add(outcome)

    def _observe(self, job: JobRecord, o: Finalize, duration: float | None) -> None:
        self._log_outcome(job, o, duration)
        self._hook("on_outcome", job, o, duration)

    def _hook(self, name: str, *args: Any) -> None:
        """Call every middleware's ``name``; a failing hook is logged, never fatal."""
        for m in self.app.middleware:
            try:
                getattr(m, name)(*args)
            except Exception as exc:
                log.error("middleware %s.%s failed: %s", type(m).__name__, name, exc)

    def _finished(self, job: JobRecord) -> Running | None:
        """Forget a run; ``None`` if a newer run of the same job replaced it."""
        entry = self.running.get(job.id)
        if entry is None or entry.job.lease_token != job.lease_token:
            return None
        del self.running[job.id]
        if self._free() >= self._slot_need:
            self._slot_freed.set()
        return entry

    def _late_result(self, task: Task, job: JobRecord, run: Run) -> None:
        """From a sync handler's thread, after its timeout was already recorded."""
        late = classify(task, job, run, self.app.middleware)

        def submit() -> None:
            log.warning(
                "job %d (%s) finished after its %gs timeout; submitting its late result, "
                "which fencing must refuse",
                job.id,
                job.task,
                job.timeout or 0,
            )
            self.completer.add(late)

        self._threadsafe(submit)

    def _log_outcome(self, job: JobRecord, o: Finalize, duration: float | None) -> None:
        """One line per attempt on ``conveyor.jobs``: retries and failures always,
        the rest at INFO (shown with --log-format json, or --log-level debug)."""
        level = (
            logging.WARNING
            if o.outcome == Outcome.RETRY
            else logging.ERROR
            if o.outcome == Outcome.FAILED
            else logging.INFO
        )
        if not jobs_log.isEnabledFor(level):
            return
        extra = {
            "job_id": job.id,
            "task": job.task,
            "queue": job.queue,
            "attempt": job.attempts,
            "outcome": str(o.outcome),
            "duration_s": None if duration is None else round(duration, 6),
            "trace_id": trace_id(job),
            "worker": self.id,
        }
        if o.outcome == Outcome.RETRY:
            jobs_log.warning(
                "job %d %s attempt %d/%d failed, retrying in %.1fs: %s",
                job.id,
                job.task,
                job.attempts,
                o.max_attempts or job.max_attempts,
                o.retry_in_s or 0,
                o.error,
                extra=extra,
            )
        elif o.outcome == Outcome.FAILED:
            jobs_log.error("job %d %s failed: %s", job.id, job.task, o.error, extra=extra)
        else:
            jobs_log.info("job %d %s %s", job.id, job.task, o.outcome, extra=extra)

    # -- recording outcomes ---------------------------------------------------------------
    async def _write_outcomes(self, batch: list[Finalize]) -> list[int]:
        began = time.perf_counter()
        accepted = await self._db(
            "complete", self.backend.job_finalize_many, worker_id=self.id, outcomes=batch
        )
        self._hook("on_flushed", batch, time.perf_counter() - began)
        # Jobs that stopped running may have made room under a limit: claim again now
        # rather than at the next poll (other workers get a NOTIFY on PostgreSQL).
        self._wake.set()
        return accepted

    async def _was_written(self, o: Finalize) -> bool:
        return await self._db(
            "complete", self.backend.job_outcome_written, outcome=o, worker_id=self.id
        )

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
                "outcome %r of job %d refused: this worker no longer holds the job "
                "(it was rescued after the worker was judged dead, or cancelled)",
                o.outcome,
                o.job_id,
            )
        self._hook("on_written", o, accepted)

    # -- the heartbeat's client (called on the heartbeat thread) --------------------------
    def leases_snapshot(self) -> dict[int, str]:
        return self.leases.copy()

    def loop_tick(self) -> float:
        return self._tick

    def loop_thread(self) -> int | None:
        return self._loop_ident

    def blocking_jobs(self, frames: list[object]) -> str:
        codes = {getattr(f, "f_code", None) for f in frames}
        culprits = [
            f"job {r.job.id} ({r.job.task})"
            for r in list(self.running.values())
            if r.handler is not None and getattr(r.handler.fn, "__code__", None) in codes
        ]
        return "blocked by " + ", ".join(culprits) if culprits else "no handler found on its stack"

    def on_beat(self, beat: Heartbeat, before: dict[int, str]) -> None:
        for job_id in beat.cancel:  # sync handlers see it even if the loop is blocked
            entry = self.running.get(job_id)
            if entry is not None:
                entry.cancel.set()
        self._threadsafe(functools.partial(self._handle_beat, beat, before))

    def on_silence(self, silent_s: float) -> None:
        log.error(
            "no heartbeat reached the database for %.0fs: the cluster counts this worker "
            "as dead and runs its jobs elsewhere; stopping them here (their outcomes would be "
            "refused anyway)",
            silent_s,
        )
        self._threadsafe(self._lose_all)

    def _lose_all(self) -> None:
        for job_id in list(self.leases):
            self._lose(job_id, "this worker could not heartbeat")

    def _handle_beat(self, beat: Heartbeat, before: dict[int, str]) -> None:
        if beat.resurrected:
            log.warning(
                "worker %s was judged dead and forgotten (no heartbeat for a long time); "
                "it registered again",
                self.id,
            )
        for job_id, token in before.items():
            if beat.held.get(job_id) != token and self.leases.get(job_id) == token:
                self._lose(
                    job_id, "rescued after this worker was judged dead, or finished elsewhere"
                )
        for job_id in beat.cancel:
            self._cancel(job_id)
        if beat.stop and not self._stopping:
            log.info("worker %s: stop requested by an operator", self.id)
            self._begin_stop(False)
        self._check_schema(beat)
        self._release_unknown(beat)

    def _check_schema(self, beat: Heartbeat) -> None:
        if beat.schema_version > self._schema and not self._stopping:
            log.error(
                "the database schema is now version %d, newer than this worker's code knows "
                "(%d): this worker stops claiming and exits; upgrade it and start it again",
                beat.schema_version,
                self._schema,
            )
            self.exit_code = EXIT_SCHEMA_TOO_NEW
            self._begin_stop(False)

    def _release_unknown(self, beat: Heartbeat) -> None:
        """Jobs the database says this worker holds, which it does not run (an
        outcome it could not store, a claim whose answer was lost): after two beats
        in a row, give them back."""
        unknown = {
            jid
            for jid in beat.held
            if jid not in self.leases and jid not in self.running and not self.completer.holds(jid)
        }
        again = unknown & self._unknown
        self._unknown = unknown - again
        if again:
            leases = [Lease(jid, beat.held[jid]) for jid in sorted(again)]
            log.warning("giving back %d job(s) this worker holds but does not run", len(leases))

            async def release() -> None:
                try:
                    await self._db(
                        "complete", self.backend.job_release_many, worker_id=self.id, leases=leases
                    )
                except Exception as exc:
                    log.error("could not give back jobs: %s", exc)

            asyncio.get_running_loop().create_task(release())

    def _cancel(self, job_id: int) -> None:
        entry = self.running.get(job_id)
        if entry is None or entry.task.done():
            return
        log.info("job %d %s: cancellation requested; cancelling it", job_id, entry.job.task)
        entry.cancel.set()  # what a sync handler sees through cancel_requested()
        if not entry.cancelling:
            entry.cancelling = True
            entry.task.cancel()  # an async handler is interrupted; a sync one is let go

    def _lose(self, job_id: int, why: str) -> None:
        self.leases.pop(job_id, None)
        entry = self.running.get(job_id)
        if entry is not None:
            self._abandon(entry, why)

    def _abandon(self, entry: Running, why: str) -> None:
        self.stats.counts["lost"] += 1
        log.warning("lost job %d (%s); stopping it here", entry.job.id, why)
        entry.lost = True
        entry.cancel.set()  # a sync handler sees cancel_requested() turn true
        entry.task.cancel()
        if self.running.get(entry.job.id) is entry:
            del self.running[entry.job.id]
            if self._free() >= self._slot_need:
                self._slot_freed.set()

    # -- shutdown -------------------------------------------------------------------------
    async def _drain(self) -> None:
        """Let running jobs finish within the grace period; release the rest."""
        cfg = self.config
        if self.running and not self._hard:
            log.info("waiting up to %gs for %d running job(s)", cfg.grace_s, len(self.running))
            finished: asyncio.Future[Any] = asyncio.gather(
                *(r.task for r in self.running.values()), return_exceptions=True
            )
            hard: asyncio.Future[Any] = asyncio.ensure_future(self._hard_event.wait())
            await asyncio.wait(
                [finished, hard], timeout=cfg.grace_s, return_when=asyncio.FIRST_COMPLETED
            )
            hard.cancel()
        remaining = list(self.running.values())
        if remaining:
            leases = [Lease(r.job.id, r.job.lease_token or "") for r in remaining]
            for r in remaining:
                r.released = True
                r.cancel.set()
                r.task.cancel()
            await asyncio.gather(*(r.task for r in remaining), return_exceptions=True)
            try:
                released = await self._db(
                    "complete", self.backend.job_release_many, worker_id=self.id, leases=leases
                )
            except Exception as exc:
                released = []
                log.error("could not release %d job(s): %s", len(leases), exc)
            for le in leases:
                self.leases.pop(le.job_id, None)
            self.stats.counts[Outcome.RELEASED] += len(released)
            log.info(
                "released %d unfinished job(s) back to the queue without using an attempt",
                len(released),
            )
        await self.completer.close()
