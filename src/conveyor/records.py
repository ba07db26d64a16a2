"""States and records: what every layer of Conveyor passes around.

A leaf module: it imports nothing of Conveyor's but its errors, so the backends, the runtime, the
façade and its clients can all depend on it without a cycle. States are
string-valued enums, so the database and JSON keep their text
(``JobState.SUCCEEDED == "succeeded"``). Records are frozen dataclasses, read
from the database at one moment; the façade wraps some of them in handles with
methods (``conveyor.Job``, ``conveyor.Batch``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, NamedTuple, TypeVar

from .errors import ConfigError


class JobState(StrEnum):
    """scheduled -> available -> running -> succeeded | failed | cancelled.

    A retry goes from running back to scheduled, with a backoff time.
    """

    SCHEDULED = "scheduled"
    AVAILABLE = "available"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in FINISHED_STATES

    @property
    def waiting(self) -> bool:
        return self in WAITING_STATES


FINISHED_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED})
WAITING_STATES = frozenset({JobState.SCHEDULED, JobState.AVAILABLE})
ACTIVE_STATES = WAITING_STATES | {JobState.RUNNING}
#: display order, also the columns of `conveyor status`
STATE_ORDER = tuple(JobState)


class BatchState(StrEnum):
    """A batch is running until the aggregator closes it; then it is final,
    unless ``retry_failed`` reopens it. ``callback_failed`` is a closed batch
    whose ``on_complete`` job failed (read from that job, never stored)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    COMPLETED_WITH_FAILURES = "completed_with_failures"
    CANCELLED = "cancelled"
    CALLBACK_FAILED = "callback_failed"


class Outcome(StrEnum):
    """How an attempt ended, as recorded in the attempt log."""

    SUCCEEDED = "succeeded"
    RETRY = "retry"
    FAILED = "failed"
    #: the worker stopped heartbeating (crashed, cut off) and the job was rescued
    LOST = "lost"
    CANCELLED = "cancelled"
    #: NextStage: the job went back to the queue at its next stage
    STAGE = "stage"
    SNOOZED = "snoozed"
    #: graceful shutdown gave the job back without using the attempt
    RELEASED = "released"


@dataclass(frozen=True)
class JobRecord:
    """A job as the database holds it, at the moment it was read."""

    id: int
    queue: str
    task: str
    args: list[Any]
    kwargs: dict[str, Any]
    state: JobState
    priority: int
    attempts: int
    max_attempts: int
    created_at: datetime
    scheduled_at: datetime
    started_at: datetime | None = None
    finished_at: datetime | None = None
    result: Any = None
    error: str | None = None
    stage: str | None = None
    timeout: float | None = None
    backoff: dict[str, float] | None = None
    unique_key: str | None = None
    idempotency_key: str | None = None
    lease_owner: str | None = None
    lease_token: str | None = None
    lease_expires_at: datetime | None = None
    #: the batch the job belongs to, if any
    batch_id: int | None = None
    #: data a multi-stage handler carries from one stage to the next (NextStage)
    context: Any = None
    #: chains: the first job of this job's chain, and the job run after this one
    #: (0 once a failed step ended the chain)
    chain_root: int | None = None
    chain_next: int | None = None
    #: steps still to run after this job, if it is part of a chain
    chain: list[dict[str, Any]] | None = None
    #: the user or tenant the job is for (a filter in lists and the API)
    tenant: str | None = None
    #: the priority it was sent with, before aging raised it
    base_priority: int | None = None
    concurrency_key: str | None = None
    rate_key: str | None = None
    #: worker ids or tags, one of which a worker must have to run the job
    pinned_to: list[str] | None = None
    #: an operator asked to cancel it while it ran
    cancel_requested: bool = False
    #: metadata that travels with the job, not to the handler (a trace's
    #: ``traceparent``, ...): stored in the arguments document as "headers"
    headers: dict[str, str] = field(default_factory=dict)
    #: why some of what the job carries (its arguments, result, context or chain)
    #: could not be read back (stored by hand or by an older version: not JSON,
    #: nested too deeply, ...): those fields are then empty. A worker fails such a
    #: job without running it.
    unreadable: str | None = None


@dataclass(frozen=True)
class Attempt:
    """One execution of a job, as recorded when it ended."""

    job_id: int
    attempt: int
    worker_id: str | None
    started_at: datetime | None
    finished_at: datetime
    outcome: str  # an Outcome value
    error: str | None = None
    traceback: str | None = None
    stage: str | None = None

    @property
    def duration_s(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.finished_at - self.started_at).total_seconds()


@dataclass(frozen=True)
class BatchRecord:
    id: int
    name: str | None
    task: str
    total: int
    state: BatchState
    idempotency_key: str | None
    on_complete: dict[str, Any] | None
    closings: int
    counts: dict[str, int] | None
    created_at: datetime
    finished_at: datetime | None
    cancelled_at: datetime | None
    #: the on_complete job of the last closing, and its state
    callback_job_id: int | None = None
    callback_state: JobState | None = None
    #: what a batch created under an idempotency key was asked for, hashed: a
    #: repeat under the key must ask for the same (None: no key, or before v21)
    fingerprint: str | None = None


#: what a workflow node that runs although a parent failed
#: (``on_parent_failure="run"``) receives in that parent's place:
#: ``{PARENT_FAILED: {"node": <name>, "state": "failed", "error": <reason>}}``
PARENT_FAILED = "conveyor_parent_failed"


class WorkflowState(StrEnum):
    """running -> succeeded | failed | cancelled (a retry makes it running again)."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class NodeState(StrEnum):
    """pending (parents still running) -> running (its job, or a map's items, made)
    -> succeeded | failed | cancelled | skipped."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SKIPPED = "skipped"

    @property
    def ended(self) -> bool:
        return self not in (NodeState.PENDING, NodeState.RUNNING)


@dataclass(frozen=True)
class WorkflowNodeSpec:
    """A node as declared, before the workflow starts: its task call as a step
    template (``Step.to_dict()``: queue, task, options, args, kwargs), the nodes
    it runs after (indexes of nodes declared before it), and for a ``map`` the
    node whose list result it fans out over (also its first parent)."""

    name: str
    kind: str  # "task" or "map"
    step: dict[str, Any]
    parents: tuple[int, ...] = ()
    over_node: int | None = None
    on_parent_failure: str = "fail"


@dataclass(frozen=True)
class WorkflowRecord:
    id: int
    name: str
    state: WorkflowState
    idempotency_key: str | None
    #: declared nodes, those not ended yet, and those that ended failed or cancelled
    total: int
    open_nodes: int
    failures: int
    #: how many times it was retried
    round: int
    #: the first failure's reason (node name: error)
    error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    cancelled_at: datetime | None
    fingerprint: str | None = None


@dataclass(frozen=True)
class WorkflowNode:
    """One node of a workflow as stored: ``item`` is -1 for a declared node and
    0..n-1 for the items of a ``map`` node."""

    workflow_id: int
    node: int
    item: int
    name: str
    kind: str
    task: str | None
    parents: list[int]
    children: list[int]
    over_node: int | None
    on_parent_failure: str
    state: NodeState
    job_id: int | None
    #: a map node's number of items, once made
    items: int | None
    #: the node's result as stored JSON text (None until it succeeded)
    result_json: str | None
    error: str | None
    round: int
    updated_at: datetime
    finished_at: datetime | None

    @property
    def result(self) -> Any:
        return None if self.result_json is None else json.loads(self.result_json)


@dataclass(frozen=True)
class QueueInfo:
    name: str
    paused: bool
    counts: dict[str, int]
    max_running: int | None = None
    rate_per_s: float | None = None
    rate_burst: float | None = None


@dataclass(frozen=True)
class WorkerInfo:
    id: str
    hostname: str
    pid: int
    queues: list[str]
    concurrency: int
    tags: list[str] = field(default_factory=list)
    started_at: datetime | None = None
    last_seen_at: datetime | None = None
    #: task names this worker has handlers for; None: it runs any task
    tasks: list[str] | None = None
    #: jobs it holds now (filled in by lists, not by heartbeats)
    running: int = 0
    stop_requested: bool = False


@dataclass(frozen=True)
class QueueCount:
    queue: str
    state: str
    count: int
    task: str | None = None


class JobInsert(NamedTuple):
    """One job to create. ``args_json`` is already-encoded ``{"args":..,"kwargs":..}``.
    A NamedTuple rather than a dataclass: bulk enqueue builds thousands per call."""

    queue: str
    task: str
    args_json: str
    priority: int = 0
    max_attempts: int = 3
    delay_s: float = 0.0
    timeout_s: float | None = None
    backoff_json: str | None = None
    unique_key: str | None = None
    idempotency_key: str | None = None
    batch_id: int | None = None
    stage: str | None = None
    context_json: str | None = None
    #: steps still to run after this job: a JSON list of step templates
    chain_json: str | None = None
    chain_root: int | None = None
    #: at most concurrency_limit jobs with this key run at once, cluster-wide
    concurrency_key: str | None = None
    concurrency_limit: int | None = None
    #: a token bucket shared by all workers: rate_per_s tokens a second, up to burst
    rate_key: str | None = None
    rate_per_s: float | None = None
    rate_burst: float | None = None
    #: JSON list of worker ids/tags; one must be the claiming worker's
    pinned_to: str | None = None
    #: jobs of one spread group each run on a different worker
    spread_group: str | None = None
    tenant: str | None = None
    #: which options were sent explicitly (``EXPLICIT_*`` bits): per-task-type
    #: settings never override those, on this job or when they change later
    explicit: int = 0

    @property
    def limited(self) -> bool:
        """Jobs the fast claim path leaves to the serialized, limit-aware one: keyed,
        rate-limited, pinned or spread jobs."""
        return bool(self.concurrency_key or self.rate_key or self.pinned_to or self.spread_group)

    def with_args(self, args_json: str) -> JobInsert:
        """This job with other arguments: a tuple spliced around the one field,
        a third of ``_replace``'s cost (bulk enqueue makes one per item)."""
        return _make_insert((*self[:_ARGS_AT], args_json, *self[_ARGS_AT + 1 :]))

    def but_args(self) -> tuple[Any, ...]:
        """Every field but the arguments: jobs sent together compare equal on it
        (in C), so what depends only on it is worked out once per run of them."""
        return self[:_ARGS_AT] + self[_ARGS_AT + 1 :]


_ARGS_AT = JobInsert._fields.index("args_json")
_make_insert = JobInsert._make
_R = TypeVar("_R")


def frozen_record(cls: type[_R], values: dict[str, Any]) -> _R:
    """A frozen dataclass from the values of all its fields, ``__init__`` skipped:
    it sets each field through ``object.__setattr__`` (12 us of a claimed job's
    43 us of Python in a worker, for a job's 35 fields). Same result as
    ``cls(**values)`` for classes without ``__post_init__``
    (tests/unit/test_rows.py compares them)."""
    record = object.__new__(cls)
    object.__setattr__(record, "__dict__", values)
    return record


class Inserted(NamedTuple):
    """Outcome of one ``JobInsert``: the job id, and whether this call created it
    (``False`` when a unique or idempotency key already named an existing job). A
    NamedTuple, like ``JobInsert``: bulk enqueue makes thousands per call."""

    id: int
    created: bool


@dataclass(frozen=True)
class Lease:
    """Proof that a worker holds a running job: only the holder knows the token."""

    job_id: int
    token: str


class Finalize(NamedTuple):
    """End of one attempt, written only if the lease is still held.

    ``state`` is the job's next state: ``succeeded``, ``failed``, ``cancelled``, or
    ``scheduled`` (a retry, due ``retry_in_s`` seconds after ``now``). A NamedTuple:
    a busy worker makes one per job.
    """

    job_id: int
    token: str
    state: str
    outcome: str
    result_json: str | None = None
    error: str | None = None
    traceback: str | None = None
    retry_in_s: float | None = None
    #: the attempt number and stage this outcome ends (recorded with the attempt)
    ran_attempt: int | None = None
    ran_stage: str | None = None
    #: outcome "stage": the job moves on to this stage, attempts start again
    next_stage: str | None = None
    context_json: str | None = None
    priority: int | None = None
    #: a retry that may use one more attempt than max_attempts allowed (error classifier)
    max_attempts: int | None = None


def step_job(step: dict[str, Any], first: list[Any]) -> JobInsert:
    """The job of a stored step template (``Step.to_dict()``: its options, ``args``
    and ``kwargs``), with ``first`` before its own arguments: a chain's next step,
    a workflow node."""
    step = dict(step)
    args = [*first, *step.pop("args")]
    encoded = json.dumps({"args": args, "kwargs": step.pop("kwargs")}, separators=(",", ":"))
    known = {k: v for k, v in step.items() if k in JobInsert._fields and k != "args_json"}
    return JobInsert(**known, args_json=encoded)


@dataclass(frozen=True)
class ChainLink:
    """A finished job whose chain has not been advanced yet."""

    id: int
    state: str
    result_json: str | None
    error: str | None
    chain: list[dict[str, Any]]
    chain_root: int | None


@dataclass(frozen=True)
class Heartbeat:
    """What a heartbeat learns: the jobs this worker still holds (id -> token),
    those whose cancellation was requested, whether an operator asked the worker
    to stop, and the database's schema version (a newer one: stop claiming)."""

    held: dict[int, str] = field(default_factory=dict)
    cancel: list[int] = field(default_factory=list)
    stop: bool = False
    schema_version: int = 0
    #: the worker's row was gone (it was judged dead): every job it held is lost
    resurrected: bool = False


@dataclass(frozen=True)
class RescueResult:
    requeued: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)


def _tuple(value: Any, name: str) -> tuple[Any, ...] | None:
    if value is None:
        return None
    if isinstance(value, str | int):
        return (value,)
    if isinstance(value, Iterable):
        out = tuple(value)
        return out or None
    raise ConfigError(f"filter {name} must be a value or a list of values, got {value!r}")


@dataclass(frozen=True)
class JobFilter:
    """Which jobs a list, a count or a bulk action applies to. Every field narrows
    the selection; a filter with no field set selects every job.

    ``search`` matches a substring of the arguments as stored (JSON text), case
    insensitive. Times are compared with ``created_at`` / ``finished_at``.
    """

    ids: tuple[int, ...] | None = None
    queues: tuple[str, ...] | None = None
    tasks: tuple[str, ...] | None = None
    states: tuple[JobState, ...] | None = None
    stage: str | None = None
    tenant: str | None = None
    batch_id: int | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    finished_after: datetime | None = None
    finished_before: datetime | None = None
    search: str | None = None
    #: due by then (``scheduled_at <= due_before``)
    due_before: datetime | None = None
    #: True: only jobs of queues that are not paused
    unpaused: bool | None = None
    #: jobs sent under one of these idempotency keys
    idempotency_keys: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        for name in ("ids", "queues", "tasks", "states", "idempotency_keys"):
            object.__setattr__(self, name, _tuple(getattr(self, name), name))
        if self.states is not None:
            try:
                object.__setattr__(self, "states", tuple(JobState(s) for s in self.states))
            except ValueError:
                names = ", ".join(s.value for s in JobState)
                raise ConfigError(
                    f"unknown job state in {self.states!r}; states are: {names}"
                ) from None
        if self.ids is not None:
            try:
                object.__setattr__(self, "ids", tuple(int(i) for i in self.ids))
            except (TypeError, ValueError):
                raise ConfigError(f"job ids must be integers, got {self.ids!r}") from None

    @property
    def empty(self) -> bool:
        """Selects every job (no field set)."""
        return all(getattr(self, f) is None for f in self.__dataclass_fields__)

    def describe(self) -> str:
        """A short human form, for logs and confirmations."""
        parts = []
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, tuple):
                value = ",".join(str(v) for v in value)
            elif isinstance(value, datetime):
                value = value.isoformat()
            parts.append(f"{name}={value}")
        return " ".join(parts) or "all jobs"


@dataclass(frozen=True)
class BulkResult:
    """What a bulk action did: ``matched`` jobs the filter selected in the states
    the action applies to (counted first), ``done`` jobs it changed (fewer if some
    moved on meanwhile); for a cancel, ``requested`` running jobs were flagged."""

    action: str
    filter: JobFilter
    matched: int
    done: int = 0
    requested: int = 0
    dry_run: bool = False


_BIG_ID = 2**62


@dataclass(frozen=True, order=True)
class ChangeCursor:
    """A position in the stream of changes: the change stamp of a transaction, then
    the jobs it changed by id (kind 0, "j" in text), then its batches (kind 1, "b").
    Its text is an event id: ``1234-j56``."""

    change: int
    kind: int = 1
    id: int = _BIG_ID

    def __str__(self) -> str:
        return f"{self.change}-{'jb'[self.kind]}{self.id}"

    @classmethod
    def parse(cls, text: str) -> ChangeCursor:
        """An event id back into a cursor; ConfigError saying what it should look like."""
        try:
            change, rest = str(text).strip().split("-", 1)
            value = cls(int(change), "jb".index(rest[0]), int(rest[1:]))
        except (ValueError, IndexError):
            value = None
        if value is None or value.change < 0 or value.id < 0 or value.change >= 2**64:
            raise ConfigError(
                f"event id {text!r} is not one of ours: it looks like 1234-j56 (the id of "
                "the last event received)"
            )
        return value

    def after_job(self) -> tuple[int, int]:
        """Jobs strictly after this cursor: (stamp, id) to compare with."""
        return (self.change, self.id) if self.kind == 0 else (self.change, _BIG_ID)

    def after_batch(self) -> tuple[int, int]:
        return (self.change, self.id) if self.kind == 1 else (self.change, 0)


@dataclass(frozen=True)
class Change:
    """A job or a batch as a change left it, with its place in the stream."""

    cursor: ChangeCursor
    job: JobRecord | None = None
    batch: BatchRecord | None = None


# -- the HTTP server: API tokens and per-task-type settings ----------------------------------
#: JobInsert.explicit bits: the option was given when the job was sent
EXPLICIT_MAX_ATTEMPTS = 1
EXPLICIT_TIMEOUT = 2
EXPLICIT_BACKOFF = 4
EXPLICIT_ALL = EXPLICIT_MAX_ATTEMPTS | EXPLICIT_TIMEOUT | EXPLICIT_BACKOFF


class TokenScope(StrEnum):
    """What an API token may do. ``read``: GET only; ``producer``: read, plus
    create, cancel and retry jobs, batches and workflows; ``worker``: read, plus
    lease jobs and report their outcomes, but not create, cancel or retry them (producer and worker
    are separate: neither includes the other); ``admin``: everything (settings,
    tokens, queues, workers, deletes)."""

    READ = "read"
    PRODUCER = "producer"
    WORKER = "worker"
    ADMIN = "admin"

    def allows(self, needed: TokenScope) -> bool:
        return self == needed or self == TokenScope.ADMIN or needed == TokenScope.READ


@dataclass(frozen=True)
class ActionRecord:
    """A bulk action (retry, cancel or delete of every job matching a filter) run
    in the background, as recorded: who asked, what it matched, how far it got."""

    id: str
    action: str
    filter: dict[str, Any]
    actor: str | None
    matched: int
    done: int
    requested: int
    state: str  # running, done or failed
    error: str | None
    created_at: datetime
    finished_at: datetime | None = None


@dataclass(frozen=True)
class ApiToken:
    """An API token as stored: its id and scope, never its secret (only a hash of
    it is kept, and the hash never leaves the backend's ``token_find``)."""

    id: str
    name: str | None
    scope: TokenScope
    created_at: datetime
    revoked_at: datetime | None = None

    @property
    def active(self) -> bool:
        return self.revoked_at is None


@dataclass(frozen=True)
class TaskSettings:
    """Per-task-type settings stored in the database (seed 001's t_schedule_cfg).
    ``None`` fields are unset: the decorator's default applies.

    ``max_attempts``, ``max_processing_s`` (the job timeout, and the lease deadline
    of remote holders) and ``retry_interval_s``/``retry_cap_s`` (backoff base and
    cap, doubling) apply to jobs not sent with their own values; ``batch_size``
    and ``poll_interval_s`` are what remote workers are told to use."""

    task: str
    batch_size: int | None = None
    poll_interval_s: float | None = None
    max_processing_s: float | None = None
    max_attempts: int | None = None
    retry_interval_s: float | None = None
    retry_cap_s: float | None = None
    updated_at: datetime | None = None


@dataclass(frozen=True)
class StepRecord:
    """A durable step of a job as stored (``conveyor_job_steps``): ``kind`` is
    ``step`` (``result_json`` its value), ``sleep`` (``due_in_s``: seconds until it
    ends, negative once it has) or ``wait`` (``event_key``; ``due_in_s`` to its
    deadline; ``done`` once it has the event's payload in ``result_json`` or
    ``timed_out``)."""

    name: str
    kind: str
    result_json: str | None = None
    done: bool = False
    timed_out: bool = False
    event_key: str | None = None
    due_in_s: float | None = None


@dataclass(frozen=True)
class Emitted:
    """What ``emit_event`` did: ``created`` False when the key had an event already
    (the first payload wins: this emit changed nothing); ``woken``: waiting jobs
    made available now."""

    key: str
    created: bool
    woken: int = 0
