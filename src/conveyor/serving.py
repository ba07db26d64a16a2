"""The serving side of the façade: per-task-type settings, sensitive
arguments, API tokens, and leases for workers outside this process (remote
workers and asyncflow clients). ``Conveyor`` owns one, ``app.serving``: the
façade's settings and token methods hand over to it, and the server, the
runtime and the CLI call its plumbing (claims, outcomes, heartbeats of remote
workers, authentication) there; nothing here touches SQL.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Protocol

from . import serialize
from . import settings as task_settings
from .backends import waits
from .checks import check_id, check_name
from .encoding import not_run_message
from .errors import ConfigError, Conflict
from .outcomes import (
    OutcomeKind,
    OutcomeResult,
    Refusal,
    RemoteOutcome,
    accepted,
    refusal,
    to_finalize,
)
from .records import (
    ApiToken,
    Finalize,
    Heartbeat,
    JobFilter,
    JobInsert,
    JobRecord,
    Lease,
    TaskSettings,
    TokenScope,
    WorkerInfo,
)
from .waiter import ChangeWaiter

if TYPE_CHECKING:
    from .backends.interfaces import Backend
    from .task import Task

log = logging.getLogger("conveyor.server")

TOKEN_PREFIX = "cvy"
#: a token's validity and the count of tokens are re-read at most this often
AUTH_CACHE_S = 2.0
#: most jobs one lease call, or one outcome report, may carry
MAX_LEASE = 1000
#: clocks of two hosts may differ by this much: a job created this long before the
#: last read of the sensitive parameters may still belong to a declaration after it
CLOCK_SKEW_S = 5.0


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


@dataclass
class ServingState:
    """What the serving methods keep per app: caches and the work waiter."""

    settings: task_settings.SettingsCache
    work: ChangeWaiter
    lock: threading.Lock = field(default_factory=threading.Lock)
    #: token id -> (token, secret hash, read at)
    tokens: dict[str, tuple[ApiToken, str, float]] = field(default_factory=dict)
    #: (any token ever created, read at): once true it stays true, tokens are never deleted
    configured: tuple[bool, float] = (False, 0.0)
    #: (any active token, read at)
    active: tuple[bool, float] = (False, 0.0)
    #: the database records sensitive parameters (it is open, at schema v20 or later)
    sensitive_stored: bool = False
    #: tasks with sensitive parameters at the last read, and when (monotonic, epoch)
    sensitive_tasks: frozenset[str] = frozenset()
    sensitive_read: tuple[float, float] = (-math.inf, -math.inf)


class ServingHost(Protocol):
    """What the serving side calls on the app (``Conveyor`` is one)."""

    @property
    def backend(self) -> Backend: ...

    @property
    def reads(self) -> Backend: ...


class Serving:
    """The serving side of one app. ``opened`` gives the app's database if it
    is open, without opening it."""

    def __init__(
        self,
        host: ServingHost,
        opened: Callable[[], Backend | None],
        task_for: Callable[[str], Task],
    ) -> None:
        self._host = host
        self._opened = opened
        #: the task named so: the registered one, else a stand-in (``Registry.task_for``)
        self._task_for = task_for
        #: what this app's tasks declare sensitive, recorded whenever the database opens
        self.sensitive: dict[str, dict[str, int | None]] = {}
        self.state = self._fresh_state()

    @property
    def backend(self) -> Backend:
        return self._host.backend

    def _fresh_state(self) -> ServingState:
        return ServingState(
            settings=task_settings.SettingsCache(lambda: self.backend.task_settings_list()),
            work=ChangeWaiter(lambda: self.backend, events=False),
        )

    def reset(self) -> None:
        """The app closed its database: stop the work waiter, forget the caches."""
        self.state.work.close()
        self.state = self._fresh_state()

    # -- per-task-type settings ---------------------------------------------------------
    def task_settings(self) -> list[TaskSettings]:
        return self.backend.task_settings_list()

    def get_task_settings(self, name: str) -> TaskSettings:
        check_name(name, "a task name")
        return self.backend.task_settings_get(task=name) or TaskSettings(task=name)

    def set_task_settings(self, name: str, **fields: Any) -> TaskSettings:
        check_name(name, "a task name")
        checked = task_settings.check_fields(fields)
        merged = replace(self.get_task_settings(name), **checked, updated_at=None)
        changed = self.backend.task_settings_set(
            settings=merged, backoff_json=self._settings_backoff_json(merged)
        )
        self.state.settings.invalidate()
        log.info("settings of task %s set (%s); %d waiting job(s) updated", name, checked, changed)
        return self.get_task_settings(name)

    def delete_task_settings(self, name: str) -> bool:
        check_name(name, "a task name")
        deleted = self.backend.task_settings_delete(task=name)
        self.state.settings.invalidate()
        return deleted

    def cached_task_settings(self) -> Mapping[str, TaskSettings]:
        """Every task type's settings, as producers see them (at most
        ``settings.CACHE_S`` seconds old)."""
        return self.state.settings.all()

    def _settings_backoff_json(self, s: TaskSettings) -> str | None:
        backoff = task_settings.settings_backoff(s, self._task_for(s.task).defaults.backoff)
        return None if backoff is None else json.dumps(backoff.to_dict())

    def settle(self, inserts: Sequence[JobInsert]) -> Sequence[JobInsert]:
        """Fill in options the jobs were not sent with from their tasks' settings."""
        return self.settler()(inserts)

    def settler(self) -> Callable[[Sequence[JobInsert]], Sequence[JobInsert]]:
        """``_settle`` with the settings read now, once: what settles the chunks of
        a stream, which the backend takes while it holds a connection. Reading
        the settings there took a second connection from the pool: with every
        connection held so, no stream went on (issue 36)."""
        settings = self.cached_task_settings()
        backoff_json = self._settings_backoff_json

        def settle(inserts: Sequence[JobInsert]) -> Sequence[JobInsert]:
            return task_settings.settle(inserts, settings, backoff_json)

        return settle

    # -- sensitive arguments ----------------------------------------------------------------
    def hide_arguments(self, task: str, parameters: Mapping[str, int | None]) -> None:
        for name, position in parameters.items():
            check_name(name, "a parameter name")
            if position is not None and (not isinstance(position, int) or position < 0):
                raise ConfigError(f"{name}: a position is an integer >= 0, got {position!r}")
        serialize.hide_arguments(task, parameters)
        self.sensitive[task] = {**self.sensitive.get(task, {}), **parameters}
        backend = self._opened()
        if backend is not None and self.state.sensitive_stored:
            backend.task_sensitive_add(task=task, parameters=parameters)

    def open_sensitive(self, backend: Backend) -> None:
        """The database opens: record this app's declarations, read everyone's."""
        for task, parameters in self.sensitive.items():
            backend.task_sensitive_add(task=task, parameters=parameters)
        self.state.sensitive_stored = True
        self._read_sensitive(backend)

    def _read_sensitive(self, backend: Backend) -> None:
        declared = backend.task_sensitive_list()
        for task, parameters in declared.items():
            serialize.hide_arguments(task, parameters)
        self.state.sensitive_tasks = frozenset(declared)
        self.state.sensitive_read = (time.monotonic(), time.time())

    def before_shown(self, records: Sequence[JobRecord]) -> None:
        """Before jobs are shown, the declarations they may fall under are known: read
        again every ``settings.CACHE_S`` seconds, and at once for a job of a task
        without any created since the last read (an app declares its tasks'
        sensitive parameters when it opens the database, before it sends a job)."""
        state = self.state
        if not state.sensitive_stored:
            return
        at, epoch = state.sensitive_read
        stale = time.monotonic() - at > task_settings.CACHE_S or any(
            r.task not in state.sensitive_tasks
            and r.created_at is not None
            and r.created_at.timestamp() >= epoch - CLOCK_SKEW_S
            for r in records
        )
        if stale:
            self._read_sensitive(self.backend)

    # -- API tokens ------------------------------------------------------------------------
    def create_token(self, scope: str, *, name: str | None = None) -> tuple[ApiToken, str]:
        try:
            checked = TokenScope(scope)
        except ValueError:
            scopes = ", ".join(s.value for s in TokenScope)
            raise ConfigError(f"scope must be one of {scopes}; got {scope!r}") from None
        if name is not None:
            check_name(name, "a token name")
        token_id, secret = secrets.token_hex(6), secrets.token_urlsafe(32)
        token = ApiToken(id=token_id, name=name, scope=checked, created_at=datetime.now(UTC))
        self.backend.token_insert(token=token, secret_hash=_digest(secret))
        self.state.configured = self.state.active = (True, time.monotonic())
        return token, f"{TOKEN_PREFIX}_{token_id}_{secret}"

    def tokens(self) -> list[ApiToken]:
        return self.backend.token_list()

    def revoke_token(self, token_id: str) -> bool:
        revoked = self.backend.token_revoke(token_id=str(token_id))
        with self.state.lock:
            self.state.tokens.pop(str(token_id), None)
            self.state.active = (False, 0.0)
        return revoked

    def authenticate(self, text: str) -> ApiToken | None:
        """The active token ``text`` is, or ``None``. Secrets are compared as hashes,
        in constant time; a token is looked up by its id at most every few seconds."""
        prefix, _, rest = text.partition("_")
        token_id, _, secret = rest.partition("_")
        if prefix != TOKEN_PREFIX or not token_id or not secret:
            return None
        with self.state.lock:
            cached = self.state.tokens.get(token_id)
        if cached is None or time.monotonic() - cached[2] > AUTH_CACHE_S:
            found = self.backend.token_find(token_id=token_id)
            if found is None:
                return None
            cached = (found[0], found[1], time.monotonic())
            with self.state.lock:
                if len(self.state.tokens) > 10_000:
                    self.state.tokens.clear()
                self.state.tokens[token_id] = cached
        token, digest, _ = cached
        if not hmac.compare_digest(digest, _digest(secret)) or not token.active:
            return None
        return token

    def tokens_configured(self) -> bool:
        """Whether any token was ever created, revoked or not (re-read at most every
        few seconds while none was). Revoked tokens stay as rows, so this fact lives
        in the database, shared by every server on it and kept across restarts: once
        true, a server requires tokens even after the last one is revoked."""
        configured, at = self.state.configured
        if not configured and time.monotonic() - at > AUTH_CACHE_S:
            configured = self.backend.token_count_all() > 0
            self.state.configured = (configured, time.monotonic())
        return configured

    def tokens_active(self) -> bool:
        """Whether any token is active (not revoked); re-read at most every few seconds."""
        active, at = self.state.active
        if time.monotonic() - at > AUTH_CACHE_S:
            active = self.backend.token_count_active() > 0
            self.state.active = (active, time.monotonic())
        return active

    # -- remote workers --------------------------------------------------------------------
    def heartbeat_worker(self, worker: WorkerInfo) -> Heartbeat:
        """Record a remote worker as alive (registering it on first call): it keeps
        the jobs it holds as long as it heartbeats, like an in-process worker."""
        return self.backend.worker_heartbeat(worker=worker)

    def claim(
        self,
        worker_id: str,
        queues: Sequence[str],
        *,
        limit: int,
        tasks: Sequence[str] | None = None,
        tags: Sequence[str] = (),
        lease_s: float | None = None,
    ) -> list[JobRecord]:
        """Claim up to ``limit`` jobs for a worker outside this process, each with its
        lease token. The worker keeps them while it heartbeats; a job with a timeout
        (its own, or its task's ``max_processing_s``) must also end within it, and
        ``lease_s`` is the deadline of the others (clients that never heartbeat)."""
        if not isinstance(limit, int) or not 1 <= limit <= MAX_LEASE:
            raise ConfigError(f"limit must be an integer from 1 to {MAX_LEASE}, got {limit!r}")
        for q in queues:
            check_name(q, "a queue name")
        jobs = self.backend.job_claim(
            queues=list(queues),
            worker_id=worker_id,
            limit=limit,
            tasks=None if tasks is None else list(tasks),
            tags=list(tags),
            lease_s=lease_s,
        )
        return self._deadlines(self._servable(worker_id, jobs))

    def _servable(self, worker_id: str, jobs: list[JobRecord]) -> list[JobRecord]:
        """The claimed jobs that can be handed out. One whose data cannot be read
        back (``JobRecord.unreadable``) is failed at once, not retried, as an
        in-process worker fails it: handing it out would send its worker empty
        arguments, and leaving it unclaimed would have every poll claim it again."""
        bad = [j for j in jobs if j.unreadable is not None]
        if not bad:
            return jobs
        self.report(
            worker_id,
            [
                RemoteOutcome(
                    j.id,
                    j.lease_token or "",
                    OutcomeKind.FAIL,
                    error=not_run_message(j.unreadable or ""),
                    permanent=True,
                )
                for j in bad
            ],
        )
        return [j for j in jobs if j.unreadable is None]

    def _deadlines(self, jobs: list[JobRecord]) -> list[JobRecord]:
        """Jobs with a timeout get it as their lease deadline (one write per timeout)."""
        by_timeout: dict[float, list[Lease]] = {}
        for j in jobs:
            if j.timeout and j.lease_token:
                by_timeout.setdefault(float(j.timeout), []).append(Lease(j.id, j.lease_token))
        now = datetime.now(UTC)
        for seconds, leases in by_timeout.items():
            self.backend.job_set_deadline(leases=leases, seconds=seconds)
        return [
            replace(j, lease_expires_at=now + timedelta(seconds=j.timeout)) if j.timeout else j
            for j in jobs
        ]

    def extend_deadline(self, job_id: int, token: str, seconds: float) -> bool:
        """Move a held job's deadline to ``seconds`` from now; False if the lease is lost."""
        return self.backend.job_set_deadline(leases=[Lease(job_id, token)], seconds=seconds) > 0

    def release(self, worker_id: str, leases: Sequence[Lease]) -> list[int]:
        """Give held jobs back without using their attempt (a worker shutting down).
        ``Conflict`` if another worker holds one under its token: nothing is released
        (the token fences the write; the worker is checked, as for outcomes)."""
        jobs = self._jobs_by_id([le.job_id for le in leases]) if leases else {}
        for le in leases:
            refused = refusal(jobs.get(le.job_id), le.job_id, le.token, worker_id)
            if refused is not None and refused.reason == Refusal.WRONG_WORKER:
                raise Conflict(refused.message)
        return self.backend.job_release_many(worker_id=worker_id, leases=leases)

    def report(self, worker_id: str, outcomes: Sequence[RemoteOutcome]) -> list[OutcomeResult]:
        """Record how remote attempts ended, fenced by their lease tokens exactly as
        in-process outcomes are. Returns one result per outcome, in order; a refused
        one changed nothing and says why (lease lost, cancelled, ...)."""
        ids = [o.job_id for o in outcomes]
        if len(set(ids)) != len(ids):
            raise ConfigError("outcomes: each job may appear once per report")
        if len(ids) > MAX_LEASE:
            raise ConfigError(f"outcomes: at most {MAX_LEASE} per report, got {len(ids)}")
        if not outcomes:
            return []
        jobs = self._jobs_by_id(ids)
        results: dict[int, OutcomeResult] = {}
        finals: list[tuple[Finalize, JobRecord]] = []
        for o in outcomes:
            job = jobs.get(o.job_id)
            refused = refusal(job, o.job_id, o.token, worker_id)
            if refused is not None or job is None:
                results[o.job_id] = refused or OutcomeResult(o.job_id, False)
                continue
            finals.append((to_finalize(o, job, self._task_for(job.task).defaults.backoff), job))
        written = set(
            self.backend.job_finalize_many(worker_id=worker_id, outcomes=[f for f, _ in finals])
        )
        lost = [f.job_id for f, _ in finals if f.job_id not in written]
        now = self._jobs_by_id(lost) if lost else {}
        for f, job in finals:
            if f.job_id in written:
                results[f.job_id] = accepted(f, job)
            else:  # the lease went between our read and the write
                why = refusal(now.get(f.job_id), f.job_id, f.token, worker_id)
                results[f.job_id] = why or OutcomeResult(f.job_id, False, message="refused")
        return [results[i] for i in ids]

    def _jobs_by_id(self, ids: Sequence[int]) -> dict[int, JobRecord]:
        records = self.backend.job_list(filter=JobFilter(ids=tuple(ids)), limit=len(ids))
        return {r.id: r for r in records}

    def work_generation(self) -> int:
        """Moves whenever the database hints at new work (jobs inserted, retried,
        made available): read it before claiming, wait for it to move after."""
        return self.state.work.generation

    async def await_work(self, generation: int, timeout: float) -> None:
        """Wait without blocking the event loop until a work hint after
        ``generation``, or ``timeout`` (at most a second: hints may be lost)."""
        await self.state.work.await_change(generation, timeout)

    # -- what only the server reads and bounds ----------------------------------------------
    def bounded_waits(self, seconds: float) -> AbstractContextManager[None]:
        """Within this block, and the threads it hands calls to through asyncio or
        anyio, a call waits at most ``seconds`` for a database connection (a free
        one from PostgreSQL's pool, a new one to MySQL), then raises
        ``DatabaseUnavailable``: a server's request handler answers 503 at once
        while the database is down, instead of after the pool's 30 s. Outside
        it, calls wait as long as they always did (workers, which retry)."""
        return waits.bounded(seconds)

    def oldest_waiting(self) -> dict[str, datetime]:
        """Per queue with jobs waiting, when its oldest due job became due."""
        return self._host.reads.queue_oldest_waiting()

    def open_batches(self) -> int:
        """How many batches are not closed yet."""
        return self._host.reads.batch_count_open()

    def worker_counts(self, worker_ttl_s: float) -> dict[str, int]:
        """How many workers are ``alive`` and how many ``silent`` (counted, not listed)."""
        return self._host.reads.worker_count(ttl_s=worker_ttl_s)

    def batch_first_finished(self, batch_id: int) -> datetime | None:
        """When the batch's first job finished (its first result)."""
        return self._host.reads.batch_first_finished(batch_id=check_id(batch_id, "batch"))
