"""How the façade writes jobs and batches: per-task-type settings filled in,
enqueue hooks run, the rows written (at once, or streamed in chunks while the
next chunk is encoded), and the handles built without reading the jobs back."""

from __future__ import annotations

import gc
import json
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from . import serialize
from .backends.interfaces import Backend
from .connections import call_with
from .encoding import FINGERPRINT_HEADER, call_fingerprint, with_headers
from .errors import ConfigError
from .hooks import Middleware, run_enqueue_hooks
from .job import Job, JobApp
from .records import Inserted, JobInsert, JobState
from .serving import Serving
from .task import Payloads, Task


class ProducerHost(Protocol):
    """What the producer calls on the app (``Conveyor`` is one)."""

    @property
    def plumbing(self) -> JobApp:
        """What the handles the producer returns are bound to."""
        ...

    @property
    def backend(self) -> Backend: ...

    @property
    def middleware(self) -> Sequence[Middleware]: ...


class Producer:
    """Writes the jobs and batches of one app."""

    def __init__(
        self, host: ProducerHost, serving: Serving, task_for: Callable[[str], Task]
    ) -> None:
        self._host = host
        self._serving = serving
        #: the task named so: the registered one, else a stand-in (``Registry.task_for``)
        self._task_for = task_for

    def enqueue(
        self,
        task: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any] | None,
        options: dict[str, Any],
    ) -> Job:
        """One job of the task named ``task`` (``Conveyor.enqueue``)."""
        conn = options.pop("conn", None)
        check_call_shape(task, args, kwargs)
        insert = self._task_for(task).build(args, kwargs or {}, **options)
        return self.insert_jobs([insert], conn=conn, payloads=[(args, kwargs or {})])[0]

    async def aenqueue(
        self,
        task: str,
        args: Sequence[Any],
        kwargs: Mapping[str, Any] | None,
        options: dict[str, Any],
    ) -> Job:
        """``enqueue`` off the event loop, on the caller's ``conn`` if it gave one."""
        conn = options.pop("conn", None)

        def enqueue(c: Any) -> Job:
            return self.enqueue(task, args, kwargs, {**options, "conn": c})

        return await call_with(conn, enqueue, warm=self._serving.cached_task_settings)

    def insert_jobs(
        self,
        inserts: Sequence[JobInsert],
        *,
        conn: Any = None,
        payloads: Payloads | None = None,
        write: Callable[[Sequence[JobInsert]], list[Inserted]] | None = None,
    ) -> list[Job]:
        """Write prepared jobs; returns handles in input order. ``payloads`` are the
        (args, kwargs) the inserts were encoded from, reused for the handles. Jobs
        whose key named an existing job come back as that job, read fresh, with
        ``created=False``. ``write`` writes them instead of ``job_insert_many``
        (a bulk action: its record in the same transaction)."""
        asked = inserts
        inserts = self._serving.settle(inserts)  # per-task-type settings fill in what was not sent
        if any(j.idempotency_key is not None for j in asked):
            # (after settle, which read what every task declared sensitive; of the
            # call as made, before the settings and hooks changed it)
            inserts = [
                fingerprinted(j, a) if a.idempotency_key is not None else j
                for j, a in zip(inserts, asked, strict=True)
            ]
        if self._host.middleware:
            changed = run_enqueue_hooks(self._host.middleware, list(inserts))
            if len(changed) != len(inserts):
                raise ConfigError("an on_enqueue hook must return one job per job it was given")
            inserts = changed
        now = datetime.now(UTC)
        if write is None:
            results = self._host.backend.job_insert_many(jobs=inserts, conn=conn)
        else:
            results = write(inserts)
        jobs = self.handles(inserts, results, payloads, now)
        for m in self._host.middleware:
            m.on_enqueued(jobs)
        return jobs

    def insert_stream(self, chunks: Iterable[tuple[Sequence[JobInsert], Payloads]]) -> list[Job]:
        """Write jobs without keys or limits (the caller guarantees it), each chunk
        with the (args, kwargs) its inserts were encoded from, in one transaction:
        the backend may write a chunk while the next one is encoded. With enqueue
        hooks (which see every job before any is written) it is ``insert_jobs``."""
        if self._host.middleware:
            inserts: list[JobInsert] = []
            payloads: list[tuple[Sequence[Any], Mapping[str, Any]]] = []
            for chunk, paid in chunks:
                inserts.extend(chunk)
                payloads.extend(paid)
            return self.insert_jobs(inserts, payloads=payloads)

        now = datetime.now(UTC)
        handles = _Handles(self._host.plumbing, now)
        unbound: list[Job] = []
        settle = self._serving.settler()  # not in settled(): the backend holds a connection there

        def settled() -> Iterator[Sequence[JobInsert]]:
            for chunk, paid in chunks:
                chunk = settle(chunk)
                yield chunk
                # The backend asks for the next chunk once this one is sent: the
                # handles' fields are built while the server writes it (on
                # PostgreSQL, 20,000 handles took 90 of a send_many's 300 ms after
                # the commit, with the server idle).
                for ins, (args, kwargs) in zip(chunk, paid, strict=True):
                    unbound.append(handles.unbound(ins, args, kwargs))

        with _collection_paused():
            results = self._host.backend.job_insert_stream(chunks=settled())
        if len(results) != len(unbound):
            raise RuntimeError(f"the backend wrote {len(results)} jobs of {len(unbound)}")
        return [job.bind(res.id) for job, res in zip(unbound, results, strict=True)]

    def handles(
        self,
        inserts: Sequence[JobInsert],
        results: Sequence[Inserted],
        payloads: Payloads | None,
        now: datetime,
    ) -> list[Job]:
        """The handles of written jobs, in input order: built from what was sent
        for the jobs this call created, read back for the ones a key named."""
        jobs = []
        handles = _Handles(self._host.plumbing, now)
        for n, (ins, res) in enumerate(zip(inserts, results, strict=True)):
            existing = None if res.created else self._host.backend.job_get(job_id=res.id)
            if existing is not None:
                jobs.append(Job.of(existing, self._host.plumbing, created=False))
                continue
            if payloads is not None:
                args, kwargs = payloads[n]
            else:
                decoded = json.loads(ins.args_json)
                args, kwargs = decoded["args"], decoded["kwargs"]
            jobs.append(handles.unbound(ins, args, kwargs).bind(res.id))
        return jobs

    def create_batch(
        self,
        name: str | None,
        task: str,
        idempotency_key: str | None,
        on_complete_json: str | None,
        jobs: Sequence[JobInsert],
        conn: Any = None,
        fingerprint: str | None = None,
    ) -> tuple[int, bool]:
        jobs = self._serving.settle(jobs)
        if self._host.middleware:
            jobs = run_enqueue_hooks(self._host.middleware, list(jobs))
        return self._host.backend.batch_create(
            name=name,
            task=task,
            idempotency_key=idempotency_key,
            on_complete_json=on_complete_json,
            jobs=jobs,
            conn=conn,
            fingerprint=fingerprint,
        )

    def create_batch_stream(
        self,
        *,
        name: str | None,
        task: str,
        on_complete_json: str | None,
        total: int,
        chunks: Callable[[int], Iterable[Sequence[JobInsert]]],
    ) -> int:
        """``create_batch`` for ``total`` jobs without keys or limits and no
        idempotency key, with no enqueue hooks to see them first (the caller
        checks all three), made by ``chunks(batch_id)`` once the batch row is
        written: the backend may write a chunk while the next is made."""
        if self._host.middleware:
            raise RuntimeError("create_batch_stream: enqueue hooks must see every job first")
        settle = self._serving.settler()  # not in settled(): the backend holds a connection there

        def settled(batch_id: int) -> Iterator[Sequence[JobInsert]]:
            for chunk in chunks(batch_id):
                yield settle(chunk)

        return self._host.backend.batch_create_stream(
            name=name, task=task, on_complete_json=on_complete_json, total=total, chunks=settled
        )


_paused_lock = threading.Lock()
_paused = False


@contextmanager
def _collection_paused() -> Iterator[None]:
    """No cyclic garbage collection while a bulk send runs: the thousands of
    handles and inserts it keeps alive are what set off collections, each of
    which walks them all again, and they form no cycles (a fifth of a 20,000-job
    send_many's CPU time). The send that paused the collector turns it back on
    when it ends; sends that start meanwhile (other threads: a server's bulk
    requests) run as they find it, so overlapping sends never keep it off past
    the first one's end. With the collector already off (the caller's choice),
    nothing changes."""
    global _paused
    with _paused_lock:
        mine = not _paused and gc.isenabled()
        if mine:
            _paused = True
            gc.disable()
    try:
        yield
    finally:
        if mine:
            with _paused_lock:
                _paused = False
                gc.enable()


class _Handles:
    """The handles of jobs this process just created, before their ids (``Job.unbound``),
    built without a read-back. Jobs sent together differ only in their arguments:
    one template serves a run of them."""

    def __init__(self, app: JobApp, now: datetime) -> None:
        self.app, self.now = app, now
        self._shared: tuple[Any, ...] = ()
        self._template: dict[str, Any] = {}

    def unbound(self, ins: JobInsert, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Job:
        fields = ins.but_args()
        if fields != self._shared:
            self._shared, self._template = fields, _job_template(self.app, ins, self.now)
        return Job.unbound(self._template, list(args), dict(kwargs))


def _job_template(app: JobApp, ins: JobInsert, now: datetime) -> dict[str, Any]:
    """The fields of the handles of jobs this process just created from inserts like
    ``ins``, built without a read-back (``Job.template``, ``Job.fresh``: send_many
    makes thousands)."""
    return Job.template(
        app,
        queue=ins.queue,
        task=ins.task,
        state=JobState.SCHEDULED if ins.delay_s > 0 else JobState.AVAILABLE,
        priority=ins.priority,
        attempts=0,
        max_attempts=ins.max_attempts,
        created_at=now,
        scheduled_at=now + timedelta(seconds=ins.delay_s) if ins.delay_s else now,
        timeout=ins.timeout_s,
        backoff=json.loads(ins.backoff_json) if ins.backoff_json else None,
        unique_key=ins.unique_key,
        idempotency_key=ins.idempotency_key,
        batch_id=ins.batch_id,
        tenant=ins.tenant,
        stage=ins.stage,
    )


def check_call_shape(task: str, args: Any, kwargs: Any) -> None:
    """``enqueue``'s arguments are a list (or tuple) and a dict: a string would be
    read as a list of its characters, a dict as its keys."""
    if isinstance(args, str | bytes | Mapping) or not isinstance(args, Sequence):
        fix = (
            "keyword arguments go in kwargs, after args"
            if isinstance(args, Mapping)
            else f"pass [{args!r:.60}]"
        )
        raise ConfigError(
            f"args of task {task!r}: a list or tuple of positional arguments, got"
            f" {type(args).__name__} {args!r:.60}: {fix}"
        )
    if kwargs is not None and not isinstance(kwargs, Mapping):
        raise ConfigError(
            f"kwargs of task {task!r}: a dict of keyword arguments, got"
            f" {type(kwargs).__name__} {kwargs!r:.60}"
        )


def fingerprinted(insert: JobInsert, asked: JobInsert) -> JobInsert:
    """A job sent under an idempotency key carries its call's fingerprint in a
    header: its task and arguments as ``asked`` (before settings and hooks), those
    its task declared sensitive left out. A repeat of the key with another task
    or other arguments is refused (``KeyReused``) in the transaction that would
    write it, and the answer never tells whether a sensitive value matched.
    Options are not compared: the key names the work (the same job sent again
    with another priority or delay is still that job)."""
    doc = serialize.hidden_document(asked.task, asked.args_json)
    headers = {FINGERPRINT_HEADER: call_fingerprint(asked.task, doc["args"], doc["kwargs"])}
    return insert._replace(args_json=with_headers(insert.args_json, headers))
