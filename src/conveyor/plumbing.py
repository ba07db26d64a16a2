"""What the handles call on their app: the façade's plumbing, out of its door.

A ``Task``, ``Job``, ``Batch``, ``Chain`` or ``Workflow`` is bound to the
app's ``Plumbing`` (``app.plumbing``), not to the ``Conveyor`` itself: it
implements the handles' Protocols (``TaskApp``, ``ChainApp``, ``WorkflowApp``),
writing prepared jobs, batches and workflows and waiting for changes, and hands
what users call too (``get_job``, ``cancel_batch``, ...) to the façade. The
server and the CLI use it for the same plumbing (workflow nodes, event pages,
bulk actions in the background)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol

from .actions import Actions
from .backends.interfaces import Backend
from .batch import Batch
from .checks import check_id
from .errors import JobNotFound
from .hooks import Middleware
from .job import Chained, Job
from .records import (
    ActionRecord,
    Attempt,
    BulkResult,
    JobFilter,
    JobInsert,
    NodeState,
    TaskSettings,
    WorkflowNode,
    WorkflowNodeSpec,
    WorkflowRecord,
)
from .registry import BULK_TASK, INTERNAL_QUEUE, Registry
from .task import Payloads


class PlumbingHost(Protocol):
    """What the plumbing hands to the app (``Conveyor`` is one): the calls of
    the handles that users make on the app too."""

    @property
    def backend(self) -> Backend: ...

    @property
    def max_payload_bytes(self) -> int: ...

    @property
    def middleware(self) -> Sequence[Middleware]: ...

    def get_job(self, job_id: int) -> Job: ...

    def wait_job(self, job_id: int, timeout: float | None = None) -> Job: ...

    async def await_result(self, job_id: int, timeout: float | None = None) -> Any: ...

    def job_attempts(self, job_id: int) -> list[Attempt]: ...

    def get_chain(self, chain_id: int) -> Chained: ...

    def get_batch(self, batch_id: int) -> Batch: ...

    def batch_progress(self, batch_id: int) -> dict[str, int]: ...

    def batch_jobs(self, batch_id: int) -> list[Job]: ...

    def batch_finished_jobs(
        self, batch_id: int, *, after: tuple[datetime, int] | None = None, limit: int = 500
    ) -> list[Job]: ...

    def cancel_batch(self, batch_id: int) -> int: ...

    def retry_batch_failed(self, batch_id: int) -> int: ...

    def cancel_workflow(self, workflow_id: int) -> bool: ...

    def retry_workflow(self, workflow_id: int) -> int: ...


class ProducerSide(Protocol):
    """The app's producer (``producing.Producer``), as the plumbing uses it."""

    def insert_jobs(
        self, inserts: Sequence[JobInsert], *, conn: Any = None, payloads: Payloads | None = None
    ) -> list[Job]: ...

    def insert_stream(
        self, chunks: Iterable[tuple[Sequence[JobInsert], Payloads]]
    ) -> list[Job]: ...

    def create_batch(
        self,
        name: str | None,
        task: str,
        idempotency_key: str | None,
        on_complete_json: str | None,
        jobs: Sequence[JobInsert],
        conn: Any,
        fingerprint: str | None,
    ) -> tuple[int, bool]: ...

    def create_batch_stream(
        self,
        *,
        name: str | None,
        task: str,
        on_complete_json: str | None,
        total: int,
        chunks: Callable[[int], Iterable[Sequence[JobInsert]]],
    ) -> int: ...


class EventsSide(Protocol):
    """The app's events (``events.Events``), as the plumbing uses them."""

    def change_generation(self) -> int: ...

    def wait_for_change(self, generation: int, timeout: float) -> None: ...

    def stream_event_pages(
        self,
        after: str | None,
        filter: JobFilter | None,
        batches: bool,
        progress: bool,
        until_batch_closed: int | None,
        limit: int,
        debounce_s: float,
        **fields: Any,
    ) -> AsyncIterator[list[dict[str, Any]]]: ...


class Plumbing:
    """The handles' side of one app."""

    def __init__(
        self,
        host: PlumbingHost,
        producer: ProducerSide,
        events: EventsSide,
        actions: Actions,
        registry: Registry,
        settings: Callable[[], Mapping[str, TaskSettings]],
    ) -> None:
        self._host, self._producer, self._events = host, producer, events
        self._settings = settings
        self._actions = actions
        #: the task named ``name``: the registered one, else a stand-in with default
        #: options for a task this process has no handler for (remote workers run it)
        self.task_for = registry.task_for
        # Conveyor's own tasks, bound here: every app has them
        registry.add_builtin(self, BULK_TASK, actions.run_bulk, INTERNAL_QUEUE)

    # -- handed to the app ------------------------------------------------------------------
    @property
    def max_payload_bytes(self) -> int:
        return self._host.max_payload_bytes

    @property
    def middleware(self) -> Sequence[Middleware]:
        return self._host.middleware

    def cached_task_settings(self) -> Mapping[str, TaskSettings]:
        """Every task type's settings, as producers see them (``Serving``'s)."""
        return self._settings()

    def get_job(self, job_id: int) -> Job:
        return self._host.get_job(job_id)

    def wait_job(self, job_id: int, timeout: float | None = None) -> Job:
        return self._host.wait_job(job_id, timeout)

    async def await_result(self, job_id: int, timeout: float | None = None) -> Any:
        return await self._host.await_result(job_id, timeout)

    def job_attempts(self, job_id: int) -> list[Attempt]:
        return self._host.job_attempts(job_id)

    def get_chain(self, chain_id: int) -> Chained:
        return self._host.get_chain(chain_id)

    def get_batch(self, batch_id: int) -> Batch:
        return self._host.get_batch(batch_id)

    def batch_progress(self, batch_id: int) -> dict[str, int]:
        return self._host.batch_progress(batch_id)

    def batch_jobs(self, batch_id: int) -> list[Job]:
        return self._host.batch_jobs(batch_id)

    def batch_finished_jobs(
        self, batch_id: int, *, after: tuple[datetime, int] | None = None, limit: int = 500
    ) -> list[Job]:
        return self._host.batch_finished_jobs(batch_id, after=after, limit=limit)

    def cancel_batch(self, batch_id: int) -> int:
        return self._host.cancel_batch(batch_id)

    def retry_batch_failed(self, batch_id: int) -> int:
        return self._host.retry_batch_failed(batch_id)

    def cancel_workflow(self, workflow_id: int) -> bool:
        return self._host.cancel_workflow(workflow_id)

    def retry_workflow(self, workflow_id: int) -> int:
        return self._host.retry_workflow(workflow_id)

    # -- writing -------------------------------------------------------------------------------
    def insert_jobs(
        self,
        inserts: Sequence[JobInsert],
        *,
        conn: Any = None,
        payloads: Payloads | None = None,
    ) -> list[Job]:
        """Write prepared jobs; returns handles in input order (``Producer.insert_jobs``)."""
        return self._producer.insert_jobs(inserts, conn=conn, payloads=payloads)

    def insert_stream(self, chunks: Iterable[tuple[Sequence[JobInsert], Payloads]]) -> list[Job]:
        """Write jobs without keys or limits, streamed (``Producer.insert_stream``)."""
        return self._producer.insert_stream(chunks)

    def create_batch(
        self,
        *,
        name: str | None,
        task: str,
        idempotency_key: str | None,
        on_complete_json: str | None,
        jobs: Sequence[JobInsert],
        conn: Any = None,
        fingerprint: str | None = None,
    ) -> tuple[int, bool]:
        """The batch row and its jobs in one transaction (``Task.batch`` builds them,
        and the ``fingerprint`` of what it was asked for, kept with the key)."""
        return self._producer.create_batch(
            name, task, idempotency_key, on_complete_json, jobs, conn, fingerprint
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
        """``create_batch``, streamed (``Producer.create_batch_stream``)."""
        return self._producer.create_batch_stream(
            name=name, task=task, on_complete_json=on_complete_json, total=total, chunks=chunks
        )

    def append_to_chain(self, job_id: int, steps_json: str) -> bool:
        """Add steps after a chain's last job; False if it was advanced meanwhile."""
        backend = self._host.backend
        return backend.job_chain_append(job_id=check_id(job_id, "job"), steps_json=steps_json)

    def start_workflow(
        self,
        name: str,
        nodes: Sequence[WorkflowNodeSpec],
        *,
        idempotency_key: str | None = None,
        fingerprint: str | None = None,
        conn: Any = None,
    ) -> tuple[int, bool]:
        """The rows of ``Workflow.start()``: (its id, whether it was created now)."""
        return self._host.backend.workflow_create(
            name=name,
            nodes=nodes,
            idempotency_key=idempotency_key,
            fingerprint=fingerprint,
            conn=conn,
        )

    # -- bulk actions in the background (the server's) ---------------------------------------
    def bulk_method(self, action: str) -> Callable[..., BulkResult]:
        """``app.retry_jobs``, ``cancel_jobs`` or ``delete_jobs``, by the action's name."""
        return self._actions.bulk_method(action)

    def start_bulk(
        self, action: str, filter: JobFilter, *, actor: str | None = None
    ) -> ActionRecord:
        """Run ``retry``, ``cancel`` or ``delete`` of every job matching ``filter`` in
        the background: as a job of the built-in task ``conveyor.bulk_action`` on
        the ``conveyor`` queue (the server runs it; it survives restarts), in the same
        bounded transactions as ``retry_jobs`` and the others, recording who asked,
        what it matched and how far it got (``bulk_action``, ``app.bulk_actions``:
        the audit log)."""
        return self._actions.start_bulk(action, filter, actor=actor)

    def bulk_action(self, action_id: str) -> ActionRecord:
        """One bulk action of the audit log, by id."""
        return self._actions.bulk_action(action_id)

    # -- reading workflows -----------------------------------------------------------------
    def workflow_record(self, workflow_id: int) -> WorkflowRecord:
        """The workflow's row; ``JobNotFound`` if there is none."""
        wid = check_id(workflow_id, "workflow")
        record = self._host.backend.workflow_get(workflow_id=wid)
        if record is None:
            raise JobNotFound(f"no workflow with id {workflow_id}")
        return record

    def workflow_nodes(self, workflow_id: int) -> list[WorkflowNode]:
        wid = check_id(workflow_id, "workflow")
        return self._host.backend.workflow_nodes(workflow_id=wid)

    def workflow_items(self, workflow_id: int, node: int) -> list[WorkflowNode]:
        wid = check_id(workflow_id, "workflow")
        return self._host.backend.workflow_items(workflow_id=wid, node=int(node))

    def workflow_item_counts(self, workflow_id: int, node: int) -> dict[str, int]:
        """A map node's items per state (every node state, 0 for none)."""
        wid = check_id(workflow_id, "workflow")
        found = self._host.backend.workflow_item_counts(workflow_id=wid, node=int(node))
        return {s.value: found.get(s.value, 0) for s in NodeState}

    # -- waiting for changes -----------------------------------------------------------------
    def change_generation(self) -> int:
        """Read it before looking; ``wait_for_change`` waits for it to move."""
        return self._events.change_generation()

    def wait_for_change(self, generation: int, timeout: float) -> None:
        """Block until the database hints at a change after ``generation``
        (``change_generation()``), at most ``timeout`` (and at most a second)."""
        self._events.wait_for_change(generation, timeout)

    def stream_event_pages(
        self,
        after: str | None = None,
        filter: JobFilter | None = None,
        *,
        batches: bool = True,
        progress: bool = True,
        until_batch_closed: int | None = None,
        limit: int = 500,
        debounce_s: float = 0.025,
        **fields: Any,
    ) -> AsyncIterator[list[dict[str, Any]]]:
        """``app.stream_events`` a page at a time (``Events.stream_event_pages``)."""
        return self._events.stream_event_pages(
            after, filter, batches, progress, until_batch_closed, limit, debounce_s, **fields
        )
