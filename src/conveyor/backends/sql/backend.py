"""Every operation of the seam, written once for all SQL dialects.

A dialect supplies its SQL (``queries.sql``, over ``common.sql``), its
connections, how values travel (time, lists, JSON), and the few operations whose
strategy truly differs: the hot paths (claim, finalize, release, rescue,
heartbeat, bulk insert), where PostgreSQL does a whole batch in one statement
with arrays and ``RETURNING``, and SQLite (one writer) runs a statement per row
inside one write transaction.
"""

from __future__ import annotations

import abc
import functools
import json
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Concatenate, ParamSpec, TypeVar

from ...connections import dbapi_connection
from ...encoding import stored_fingerprint
from ...errors import ConfigError
from ...records import (
    ActionRecord,
    ApiToken,
    Attempt,
    BatchRecord,
    ChainLink,
    Change,
    ChangeCursor,
    Emitted,
    Finalize,
    Inserted,
    JobFilter,
    JobInsert,
    JobRecord,
    JobState,
    Lease,
    QueueCount,
    QueueInfo,
    StepRecord,
    TaskSettings,
    WorkerInfo,
    WorkflowNode,
    WorkflowNodeSpec,
    WorkflowRecord,
)
from ..interfaces import CAPABILITIES, Backend
from . import workflows
from .loader import Migration
from .logic import KeyPair, callback_insert, check_schema, close_state, insert_resolving
from .rows import (
    action_from_row,
    attempt_from_row,
    batch_from_row,
    chain_link_from_row,
    job_from_row,
    job_reader,
    queue_from_row,
    step_from_row,
    task_settings_from_row,
    token_from_row,
    worker_from_row,
    workflow_from_row,
    workflow_node_from_row,
)

#: JobFilter field -> the name of its condition in the query files (filter_<field>)
_FILTER_FIELDS = (
    "ids",
    "queues",
    "tasks",
    "states",
    "stage",
    "tenant",
    "batch_id",
    "created_after",
    "created_before",
    "finished_after",
    "finished_before",
    "search",
    "due_before",
    "unpaused",
    "idempotency_keys",
)
_LIST_FIELDS = frozenset({"ids", "queues", "tasks", "states", "idempotency_keys"})
_TIME_FIELDS = frozenset(
    {"created_after", "created_before", "finished_after", "finished_before", "due_before"}
)


P = ParamSpec("P")
T = TypeVar("T")
B = TypeVar("B", bound="SqlBackend")


def retried(op: Callable[Concatenate[B, P], T]) -> Callable[Concatenate[B, P], T]:
    """An operation that is one transaction of ours, run through the dialect's
    ``_retrying`` hook: a dialect whose server rolls a transaction back on a
    deadlock or a lock wait timeout (MySQL) runs it again whole. Inside a
    caller's transaction (``conn=``) it runs once: that retry is the caller's."""

    @functools.wraps(op)
    def run(self: B, /, *args: P.args, **kwargs: P.kwargs) -> T:
        if kwargs.get("conn") is not None:
            return op(self, *args, **kwargs)
        return self._retrying(lambda: op(self, *args, **kwargs))

    return run


def _like_pattern(text: str) -> str:
    """A LIKE pattern matching ``text`` literally anywhere (backslash escapes)."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class SqlBackend(Backend):
    #: the dialect's named queries (common.sql overridden by its own)
    Q: dict[str, str]
    MIGRATIONS: list[Migration]
    #: what ``supports`` answers yes to
    capabilities: frozenset[str] = frozenset()
    #: where, in messages ("the PostgreSQL database", "SQLite database /x.db")
    where: str = "the database"
    #: Seconds a transaction of ours may sit idle, between two of its statements,
    #: before the server ends its session. Ours never pause there, so one that does
    #: belongs to a client cut off mid-way (a network gone silent, a process
    #: frozen): the server would otherwise keep its row locks, and every worker
    #: would wait on them, until its own keepalive gave up, hours later.
    IDLE_TRANSACTION_S: float = 15.0

    # -- dialect hooks: connections -------------------------------------------------
    @abc.abstractmethod
    def _tx(self, conn: Any = None) -> AbstractContextManager[Any]:
        """A cursor (rows as dicts) in one transaction: the caller's with ``conn``,
        else one of ours, committed at the end. Writes under it may wait for locks."""

    @abc.abstractmethod
    def _rows(self, name: str, params: dict[str, Any], *, sql: str | None = None) -> list[Any]:
        """Run one statement on its own (autocommit) and return its rows as dicts
        (none for a statement without result)."""

    @contextmanager
    def _snapshot_reads(self) -> Iterator[Callable[..., list[Any]]]:
        """Reads that see one moment of the database (as ``_rows`` takes them):
        the change stream reads jobs and batches in two statements, and a batch
        closed between them must not be seen without the job outcomes before it.
        A dialect whose statements each see their own moment overrides this."""
        yield self._rows

    @abc.abstractmethod
    def _count(self, name: str, params: dict[str, Any]) -> int:
        """Run one write statement on its own; rows it changed."""

    def _retrying(self, run: Callable[[], T]) -> T:
        """``run()``, one whole transaction of ours (see ``retried``), run again
        by a dialect whose server rolls transactions back under contention; once
        here."""
        return run()

    # -- dialect hooks: values ------------------------------------------------------------
    @abc.abstractmethod
    def _now(self, now: datetime | None) -> Any:
        """``now`` as the queries take it (``None`` may mean the server's clock)."""

    @abc.abstractmethod
    def _ts(self, value: Any) -> datetime | None:
        """A timestamp column as read back."""

    def _ts_param(self, value: datetime) -> Any:
        """A timestamp sent as a parameter."""
        return value

    def _list(self, values: Sequence[Any]) -> Any:
        """A list parameter, for ``{IN(:p)}``."""
        return list(values)

    def _wake(self, cur: Any, queues: Sequence[str]) -> None:
        """Hint workers that ``queues`` have new work (or ``@flow``, ``@cancel``,
        ``@done``), at commit. Dialects without push notifications do nothing: their
        workers notice changes by polling."""

    # -- dialect hooks: the hot paths ---------------------------------------------------
    @abc.abstractmethod
    def _insert_rows(
        self, cur: Any, jobs: Sequence[JobInsert], now: Any
    ) -> list[tuple[int, KeyPair]]:
        """Insert jobs on ``cur``: (id, (unique_key, idempotency_key)) of each row
        created; an input whose key conflicted creates none."""

    @abc.abstractmethod
    def _migration_lock(self, cur: Any) -> None:
        """Make a second, concurrent migrator wait until this one commits."""

    # -- helpers ---------------------------------------------------------------------
    def _q(self, cur: Any, name: str, params: dict[str, Any] | None = None) -> list[Any]:
        cur.execute(self.Q[name], params or {})
        return list(cur.fetchall()) if cur.description else []

    def _qc(self, cur: Any, name: str, params: dict[str, Any] | None = None) -> int:
        cur.execute(self.Q[name], params or {})
        if cur.description:
            cur.fetchall()
        return int(cur.rowcount)

    def _job(self, row: dict[str, Any]) -> JobRecord:
        return job_from_row(row, self._ts)

    def _jobs(self, names: Sequence[str], rows: Iterable[tuple[Any, ...]]) -> list[JobRecord]:
        """Jobs from tuple rows whose columns are ``names`` (a claim's: no dict per row)."""
        read = job_reader(names, self._ts)
        return [read(r) for r in rows]

    def _filter(self, f: JobFilter, before_id: int | None = None) -> tuple[str, dict[str, Any]]:
        """The WHERE conditions of a filter (each a named query ``filter_<field>``)
        and their parameters."""
        parts: list[str] = []
        params: dict[str, Any] = {}
        for name in _FILTER_FIELDS:
            value = getattr(f, name)
            if value is None:
                continue
            parts.append(self.Q[f"filter_{name}"])
            if name in _LIST_FIELDS:
                value = self._list([str(v) if name == "states" else v for v in value])
            elif name in _TIME_FIELDS:
                value = self._ts_param(value)
            elif name == "search":
                value = _like_pattern(value)
            elif name == "unpaused":
                if not value:
                    parts.pop()  # unpaused=False: no condition
                continue  # the condition has no parameter
            params[f"f_{name}"] = value
        if before_id is not None:
            parts.append(self.Q["filter_before_id"])
            params["f_before_id"] = int(before_id)
        return (" AND ".join(f"({p})" for p in parts) or "1 = 1"), params

    def _with_filter(self, name: str, where: str) -> str:
        return self.Q[name].replace("{FILTER}", where)

    def _filtered_ids(
        self, cur: Any, name: str, f: JobFilter, limit: int, extra: dict[str, Any] | None = None
    ) -> list[int]:
        where, params = self._filter(f)
        cur.execute(self._with_filter(name, where), {**params, **(extra or {}), "limit": limit})
        return [int(r["id"]) for r in cur.fetchall()]

    # -- schema ----------------------------------------------------------------------
    def supports(self, capability: str) -> bool:
        if capability not in CAPABILITIES:
            raise ValueError(f"unknown capability {capability!r}; known: {sorted(CAPABILITIES)}")
        return capability in self.capabilities

    @property
    def latest_schema(self) -> int:
        return self.MIGRATIONS[-1].version

    def schema_version(self) -> int:
        with self._tx() as cur:
            if not self._q(cur, "schema_version_exists")[0]["present"]:
                return 0
            return int(self._q(cur, "schema_version")[0]["version"])

    def migrate(self) -> list[int]:
        applied: list[int] = []
        with self._tx() as cur:
            self._migration_lock(cur)  # a second migrator waits, then finds nothing to do
            self._q(cur, "schema_version_table")
            current = int(self._q(cur, "schema_version")[0]["version"])
            for mig in check_schema(current, self.MIGRATIONS, self.where):
                self._apply(cur, mig)
                self._q(cur, "schema_version_insert", {"version": mig.version, "name": mig.name})
                applied.append(mig.version)
        return applied

    def _apply(self, cur: Any, migration: Migration) -> None:
        from .loader import split_statements

        for stmt in split_statements(migration.sql):
            cur.execute(stmt)

    # -- jobs: producers -----------------------------------------------------------------
    @retried
    def job_insert_many(
        self, *, jobs: Sequence[JobInsert], conn: Any = None, now: datetime | None = None
    ) -> list[Inserted]:
        if not jobs:
            return []
        with self._tx(dbapi_connection(conn, self.name)) as cur:
            return self._insert_resolving(cur, jobs, self._now(now))

    def _insert_resolving(self, cur: Any, jobs: Sequence[JobInsert], ts: Any) -> list[Inserted]:
        """``job_insert_many`` on the caller's cursor: each job's id, an existing
        job's where its key named one."""

        def insert(subset: Sequence[JobInsert]) -> list[tuple[int, KeyPair]]:
            return self._insert_rows(cur, subset, ts)

        def find(
            uks: list[str], iks: list[str]
        ) -> list[tuple[int, str | None, str | None, str, str | None]]:
            rows = self._q(
                cur,
                "job_find_by_keys",
                {"unique_keys": self._list(uks), "idempotency_keys": self._list(iks)},
            )
            return [
                (
                    r["id"],
                    r["unique_key"],
                    r["idempotency_key"],
                    r["task"],
                    stored_fingerprint(r["args"]) if r["idempotency_key"] else None,
                )
                for r in rows
            ]

        return insert_resolving(jobs, insert, find)

    # -- jobs: reading ------------------------------------------------------------------
    def job_get(self, *, job_id: int) -> JobRecord | None:
        rows = self._rows("job_get", {"id": job_id})
        return self._job(rows[0]) if rows else None

    def job_list(
        self, *, filter: JobFilter, limit: int = 50, before_id: int | None = None
    ) -> list[JobRecord]:
        where, params = self._filter(filter, before_id)
        sql = self._with_filter("job_list", where)
        return [self._job(r) for r in self._rows("job_list", {**params, "limit": limit}, sql=sql)]

    def job_count(self, *, filter: JobFilter, cap: int | None = None) -> dict[str, int]:
        where, params = self._filter(filter)
        dims = {"queues", "tasks", "states"}
        if all(getattr(filter, f) is None for f in _FILTER_FIELDS if f not in dims):
            name = "counts_by_state"
        elif cap is not None:
            name = "job_count_capped"
            params["cap"] = cap
        else:
            name = "job_count"
        rows = self._rows(name, params, sql=self._with_filter(name, where))
        return {r["state"]: int(r["n"]) for r in rows}

    def job_attempts(self, *, job_id: int) -> list[Attempt]:
        return [attempt_from_row(r, self._ts) for r in self._rows("job_attempts", {"id": job_id})]

    # -- jobs: operator actions -----------------------------------------------------------
    @retried
    def job_retry_many(
        self, *, filter: JobFilter, limit: int = 500, now: datetime | None = None
    ) -> list[int]:
        ts = self._now(now)
        with self._tx() as cur:
            ids = self._filtered_ids(cur, "job_select_retryable", filter, limit)
            if not ids:
                return []
            params = {"ids": self._list(ids), "now": ts}
            # A closed batch one of these jobs belongs to reopens: it closes again
            # when they finish, and calls its callback again (a new closing).
            self._qc(cur, "batch_reopen_for_jobs", params)
            queues = [r["queue"] for r in self._q(cur, "job_queues_of", params)]
            self._qc(cur, "job_retry_ids", params)
            self._wake(cur, sorted(set(queues)))
        return ids

    @retried
    def job_cancel_many(
        self, *, filter: JobFilter, limit: int = 500, now: datetime | None = None
    ) -> tuple[list[int], list[int]]:
        ts = self._now(now)
        with self._tx() as cur:
            pending = self._filtered_ids(cur, "job_select_cancellable", filter, limit)
            if pending:
                self._qc(cur, "job_cancel_ids", {"ids": self._list(pending), "now": ts})
                self._wake(cur, ["@flow", "@done"])
            running = self._filtered_ids(cur, "job_select_running", filter, limit - len(pending))
            if running:
                self._qc(cur, "job_flag_cancel_ids", {"ids": self._list(running)})
                self._wake(cur, ["@cancel"])
        return pending, running

    @retried
    def job_delete_many(self, *, filter: JobFilter, limit: int = 500) -> list[int]:
        with self._tx() as cur:
            ids = self._filtered_ids(cur, "job_select_deletable", filter, limit)
            if ids:
                params = {"ids": self._list(ids)}
                self._qc(cur, "attempt_delete_ids", params)
                self._qc(cur, "step_delete_ids", params)
                self._qc(cur, "job_delete_ids", params)
        return ids

    def job_outcome_written(self, *, outcome: Finalize, worker_id: str) -> bool:
        rows = self._rows(
            "attempt_find",
            {
                "job_id": outcome.job_id,
                "attempt": outcome.ran_attempt,
                "worker_id": worker_id,
                "outcome": outcome.outcome,
            },
        )
        return bool(rows)

    # -- maintenance ---------------------------------------------------------------------
    def job_schedule_due(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        with self._tx() as cur:
            rows = self._q(cur, "job_schedule_due", {"limit": limit, "now": self._now(now)})
            self._wake(cur, sorted({r["queue"] for r in rows}))
        return len(rows)

    def job_age_priorities(
        self,
        *,
        aging_s: float,
        max_boost: int,
        limit: int = 1000,
        window_s: float | None = None,
        now: datetime | None = None,
    ) -> int:
        return self._count(
            "job_age_priorities", self._age_params(aging_s, max_boost, limit, window_s, now)
        )

    def _age_params(
        self,
        aging_s: float,
        max_boost: int,
        limit: int,
        window_s: float | None,
        now: datetime | None,
    ) -> dict[str, Any]:
        """Parameters of a priority-aging pass (every dialect's statements take these)."""
        return {
            "aging_s": float(aging_s),
            "max_boost": max_boost,
            "limit": limit,
            "window_s": None if window_s is None else float(window_s),
            "ks": json.dumps(list(range(1, max_boost + 1))),
            "now": self._now(now),
        }

    @retried
    def job_prune(
        self,
        *,
        state: str,
        older_than_s: float,
        limit: int = 1000,
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> int:
        params = {
            "state": str(state),
            "older_than_s": float(older_than_s),
            "limit": limit,
            "now": self._now(now),
        }
        if dry_run:
            return int(self._rows("job_prune_count", params)[0]["n"])
        with self._tx() as cur:
            ids = [int(r["id"]) for r in self._q(cur, "job_prune_ids", params)]
            if ids:
                self._qc(cur, "attempt_delete_ids", {"ids": self._list(ids)})
                self._qc(cur, "step_delete_ids", {"ids": self._list(ids)})
                self._qc(cur, "job_delete_ids", {"ids": self._list(ids)})
        return len(ids)

    # -- workers and leadership -------------------------------------------------------------
    def worker_deregister(self, *, worker_id: str) -> None:
        self._count("worker_delete", {"id": worker_id})

    @retried
    def worker_request_stop(self, *, worker_id: str) -> bool:
        with self._tx() as cur:
            found = self._qc(cur, "worker_request_stop", {"id": worker_id}) > 0
            if found:
                self._wake(cur, ["@cancel"])
        return found

    def worker_list(
        self,
        *,
        limit: int | None = None,
        after_id: str = "",
        alive: bool | None = None,
        ttl_s: float = 7.0,
        now: datetime | None = None,
    ) -> list[WorkerInfo]:
        params = {
            "limit": 2**62 if limit is None else limit,
            "after_id": after_id,
            "alive": -1 if alive is None else int(alive),
            "ttl_s": float(ttl_s),
            "now": self._now(now),
        }
        return [worker_from_row(r, self._ts) for r in self._rows("worker_list", params)]

    def worker_count(self, *, ttl_s: float = 7.0, now: datetime | None = None) -> dict[str, int]:
        [row] = self._rows("worker_count", {"ttl_s": float(ttl_s), "now": self._now(now)})
        return {"alive": int(row["alive"]), "silent": int(row["total"]) - int(row["alive"])}

    def worker_prune_stale(self, *, older_than_s: float, now: datetime | None = None) -> int:
        return self._count(
            "worker_prune_stale", {"older_than_s": float(older_than_s), "now": self._now(now)}
        )

    @retried
    def leader_attempt_elect(
        self, *, name: str, holder: str, ttl_s: float, now: datetime | None = None
    ) -> bool:
        params = {"name": name, "holder": holder, "ttl_s": float(ttl_s), "now": self._now(now)}
        with self._tx() as cur:
            self._q(cur, "leader_attempt_elect", params)
            rows = self._q(cur, "leader_get", params)
        return bool(rows) and rows[0]["holder"] == holder

    def leader_resign(self, *, name: str, holder: str) -> None:
        self._count("leader_resign", {"name": name, "holder": holder})

    # -- queues ---------------------------------------------------------------------------
    @retried
    def queue_set_paused(self, *, name: str, paused: bool, now: datetime | None = None) -> None:
        with self._tx() as cur:
            self._qc(
                cur, "queue_set_paused", {"name": name, "paused": paused, "now": self._now(now)}
            )
            if not paused:
                self._wake(cur, [name])

    @retried
    def queue_set_limit(
        self, *, name: str, max_running: int | None, now: datetime | None = None
    ) -> None:
        params = {"name": name, "max_running": max_running, "now": self._now(now)}
        with self._tx() as cur:
            self._qc(cur, "queue_set_limit", params)
            self._wake(cur, [name])
        self._limits_changed()

    @retried
    def queue_set_rate(
        self,
        *,
        name: str,
        rate_per_s: float | None,
        rate_burst: float | None,
        now: datetime | None = None,
    ) -> None:
        params = {
            "name": name,
            "rate_per_s": rate_per_s,
            "rate_burst": rate_burst,
            "now": self._now(now),
        }
        with self._tx() as cur:
            self._qc(cur, "queue_set_rate", params)
            self._wake(cur, [name])
        self._limits_changed()

    def _limits_changed(self) -> None:
        """A dialect that caches queue limits forgets them."""

    def queue_list(self) -> list[QueueInfo]:
        return [queue_from_row(r) for r in self._rows("queue_list", {})]

    def queue_oldest_waiting(self, *, now: datetime | None = None) -> dict[str, datetime]:
        rows = self._rows("queue_oldest_waiting", {"now": self._now(now)})
        return {r["queue"]: at for r in rows if (at := self._ts(r["since"])) is not None}

    def counts_fold(self) -> None:
        self._count("counts_fold", {})

    def queue_counts(self) -> list[QueueCount]:
        return [
            QueueCount(r["queue"], r["state"], int(r["n"]), r["task"])
            for r in self._rows("queue_counts", {})
        ]

    # -- batches --------------------------------------------------------------------------
    @retried
    def batch_create(
        self,
        *,
        name: str | None,
        task: str,
        idempotency_key: str | None,
        on_complete_json: str | None,
        jobs: Sequence[JobInsert],
        conn: Any = None,
        now: datetime | None = None,
        fingerprint: str | None = None,
    ) -> tuple[int, bool]:
        ts = self._now(now)
        with self._tx(dbapi_connection(conn, self.name)) as cur:
            rows = self._batch_insert(
                cur,
                name,
                task,
                len(jobs),
                ts,
                idempotency_key,
                on_complete_json,
                fingerprint=fingerprint,
            )
            if not rows:  # the key named an existing batch: return it, write nothing
                found = self._q(cur, "batch_find_by_key", {"idempotency_key": idempotency_key})
                return int(found[0]["id"]), False
            batch_id = int(rows[0]["id"])
            if jobs:
                self._insert_rows(cur, [j._replace(batch_id=batch_id) for j in jobs], ts)
        return batch_id, True

    def _batch_insert(
        self,
        cur: Any,
        name: str | None,
        task: str,
        total: int,
        ts: Any,
        idempotency_key: str | None,
        on_complete_json: str | None,
        *,
        fingerprint: str | None = None,
    ) -> list[Any]:
        """The batch row: its id, or no row when ``idempotency_key`` names one already."""
        params = {
            "name": name,
            "task": task,
            "total": total,
            "now": ts,
            "idempotency_key": idempotency_key,
            "fingerprint": fingerprint,
            "on_complete": on_complete_json,
        }
        return self._q(cur, "batch_insert", params)

    def batch_create_stream(
        self,
        *,
        name: str | None,
        task: str,
        on_complete_json: str | None,
        total: int,
        chunks: Callable[[int], Iterable[Sequence[JobInsert]]],
        now: datetime | None = None,
    ) -> int:
        # Here the jobs are all made first, outside the transaction (SQLite's one
        # writer is not held while they are encoded), then written as one list.
        jobs = [job for chunk in chunks(0) for job in chunk]
        if len(jobs) != total:
            raise RuntimeError(f"a batch of {total} jobs was given {len(jobs)}")
        batch_id, _ = self.batch_create(
            name=name,
            task=task,
            idempotency_key=None,
            on_complete_json=on_complete_json,
            jobs=jobs,
            now=now,
        )
        return batch_id

    def batch_get(self, *, batch_id: int) -> BatchRecord | None:
        rows = self._rows("batch_get", {"id": batch_id})
        return batch_from_row(rows[0], self._ts) if rows else None

    def batch_list(
        self, *, state: str | None = None, limit: int = 50, before_id: int | None = None
    ) -> list[BatchRecord]:
        rows = self._rows(
            "batch_list",
            {
                "state": state or "",
                "limit": limit,
                "before_id": before_id if before_id is not None else 2**62,
            },
        )
        return [batch_from_row(r, self._ts) for r in rows]

    def batch_progress(self, *, batch_id: int) -> dict[str, int]:
        return {r["state"]: int(r["n"]) for r in self._rows("batch_progress", {"id": batch_id})}

    def batch_finished_jobs(
        self, *, batch_id: int, after: tuple[datetime, int] | None = None, limit: int = 500
    ) -> list[JobRecord]:
        after_at, after_id = after or (datetime(1970, 1, 1, tzinfo=UTC), 0)
        rows = self._rows(
            "batch_finished_jobs",
            {
                "id": batch_id,
                "after_at": self._ts_param(after_at),
                "after_id": after_id,
                "limit": limit,
            },
        )
        return [self._job(r) for r in rows]

    def batch_jobs(self, *, batch_id: int) -> list[JobRecord]:
        return [self._job(r) for r in self._rows("batch_jobs", {"id": batch_id})]

    @retried
    def batch_cancel(self, *, batch_id: int, now: datetime | None = None) -> int:
        params = {"id": batch_id, "now": self._now(now)}
        with self._tx() as cur:
            if not self._qc(cur, "batch_mark_cancelled", params):
                return 0
            n = self._qc(cur, "batch_cancel_jobs", params)
            self._wake(cur, ["@flow", "@done"])
        return n

    def batch_retry_failed(self, *, batch_id: int, now: datetime | None = None) -> int:
        return len(
            self.job_retry_many(
                filter=JobFilter(batch_id=batch_id, states=(JobState.FAILED,)),
                limit=2**31 - 1,
                now=now,
            )
        )

    def batch_count_open(self) -> int:
        return int(self._rows("batch_count_open", {})[0]["n"])

    def batch_first_finished(self, *, batch_id: int) -> datetime | None:
        rows = self._rows("batch_first_finished", {"id": batch_id})
        return self._ts(rows[0]["at"]) if rows else None

    def batch_ready(self, *, limit: int = 100) -> list[int]:
        return [int(r["id"]) for r in self._rows("batch_ready", {"limit": limit})]

    @retried
    def batch_close(self, *, batch_id: int, now: datetime | None = None) -> BatchRecord | None:
        ts = self._now(now)
        with self._tx() as cur:
            # A row lock (or, on SQLite, the write lock): an overlapping aggregator
            # waits here and then finds the batch closed.
            row = self._q(cur, "batch_lock_open", {"id": batch_id})
            if not row:
                return None
            counts = {
                r["state"]: int(r["n"]) for r in self._q(cur, "batch_progress", {"id": batch_id})
            }
            state = close_state(counts, cancelled=row[0]["cancelled_at"] is not None)
            if state is None:
                return None  # work came back (a retry) since batch_ready looked
            params = {"id": batch_id, "state": str(state), "counts": json.dumps(counts), "now": ts}
            self._qc(cur, "batch_mark_closed", params)
            closed = batch_from_row(self._q(cur, "batch_get", {"id": batch_id})[0], self._ts)
            callback = callback_insert(closed)
            if callback is not None:
                created = self._insert_rows(cur, [callback], ts)
                if created:
                    self._qc(cur, "batch_set_callback", {"id": batch_id, "job_id": created[0][0]})
                    closed = replace(closed, callback_job_id=created[0][0])
                self._wake(cur, [callback.queue])
        return closed

    # -- chains ---------------------------------------------------------------------------
    @retried
    def job_chain_append(self, *, job_id: int, steps_json: str) -> bool:
        with self._tx() as cur:
            rows = self._q(cur, "job_chain_get", {"id": job_id})
            if not rows:
                return False
            if rows[0]["chain"] is not None and json.loads(rows[0]["chain"]) == []:
                raise ConfigError(
                    f"job {job_id} is a node of a workflow: add the step to its workflow instead"
                )
            chain = (json.loads(rows[0]["chain"]) if rows[0]["chain"] else []) + json.loads(
                steps_json
            )
            self._qc(cur, "job_chain_set", {"id": job_id, "chain": json.dumps(chain)})
        return True

    def job_chain_due(self, *, limit: int = 100) -> list[ChainLink]:
        return [chain_link_from_row(r) for r in self._rows("job_chain_due", {"limit": limit})]

    @retried
    def job_chain_advance(
        self,
        *,
        job_id: int,
        next_job: JobInsert | None,
        state: str,
        now: datetime | None = None,
    ) -> int | None:
        ts = self._now(now)
        with self._tx() as cur:
            rows = self._q(cur, "job_chain_lock", {"id": job_id})
            if not rows:  # deleted since it was read
                return None
            row = rows[0]
            if row["chain_next"] is not None:  # linked already: advancing is idempotent
                return int(row["chain_next"]) or None
            if row["state"] != state:  # retried since it was read: a later pass decides
                return None
            next_id = 0
            if next_job is not None:
                created = self._insert_rows(cur, [next_job], ts)
                if created:
                    next_id = created[0][0]
                    self._wake(cur, [next_job.queue])
                else:  # advanced before (its idempotency key exists): link to that job
                    found = self._q(
                        cur,
                        "job_find_by_keys",
                        {
                            "unique_keys": self._list([]),
                            "idempotency_keys": self._list([next_job.idempotency_key or ""]),
                        },
                    )
                    next_id = int(found[0]["id"])
            self._qc(cur, "job_chain_link", {"id": job_id, "next_id": next_id})
        return next_id or None

    # -- workflows (the graph itself: workflows.py) ----------------------------------------
    @retried
    def workflow_create(
        self,
        *,
        name: str,
        nodes: Sequence[WorkflowNodeSpec],
        idempotency_key: str | None = None,
        fingerprint: str | None = None,
        conn: Any = None,
        now: datetime | None = None,
    ) -> tuple[int, bool]:
        return workflows.create(
            self,
            name=name,
            nodes=nodes,
            idempotency_key=idempotency_key,
            fingerprint=fingerprint,
            conn=conn,
            now=now,
        )

    def workflow_get(self, *, workflow_id: int) -> WorkflowRecord | None:
        rows = self._rows("workflow_get", {"id": workflow_id})
        return workflow_from_row(rows[0], self._ts) if rows else None

    def workflow_list(
        self, *, state: str | None = None, limit: int = 50, before_id: int | None = None
    ) -> list[WorkflowRecord]:
        params = {
            "state": state or "",
            "limit": limit,
            "before_id": before_id if before_id is not None else 2**62,
        }
        return [workflow_from_row(r, self._ts) for r in self._rows("workflow_list", params)]

    def workflow_nodes(self, *, workflow_id: int) -> list[WorkflowNode]:
        rows = self._rows("workflow_nodes", {"id": workflow_id})
        return [workflow_node_from_row(r, self._ts) for r in rows]

    def workflow_items(self, *, workflow_id: int, node: int) -> list[WorkflowNode]:
        rows = self._rows("workflow_items", {"id": workflow_id, "node": node})
        return [workflow_node_from_row(r, self._ts) for r in rows]

    def workflow_item_counts(self, *, workflow_id: int, node: int) -> dict[str, int]:
        rows = self._rows("workflow_item_counts", {"id": workflow_id, "node": node})
        return {r["state"]: int(r["n"]) for r in rows}

    @retried
    def workflow_settle(self, *, links: Sequence[ChainLink], now: datetime | None = None) -> int:
        if not links:
            return 0
        with self._tx() as cur:
            return workflows.settle(self, cur, links, now)

    @retried
    def workflow_cancel(self, *, workflow_id: int, now: datetime | None = None) -> bool:
        return workflows.cancel(self, workflow_id=workflow_id, now=now)

    @retried
    def workflow_retry(self, *, workflow_id: int, now: datetime | None = None) -> int:
        return workflows.retry(self, workflow_id=workflow_id, now=now)

    @retried
    def workflow_prune(
        self, *, state: str, older_than_s: float, limit: int = 500, now: datetime | None = None
    ) -> int:
        params = {"state": state, "older_than_s": float(older_than_s), "limit": limit}
        with self._tx() as cur:
            rows = self._q(cur, "workflow_prune_ids", {**params, "now": self._now(now)})
            ids = self._list([int(r["id"]) for r in rows])
            if rows:
                self._qc(cur, "workflow_nodes_delete_ids", {"ids": ids})
                self._qc(cur, "workflow_delete_ids", {"ids": ids})
        return len(rows)

    # -- cron ------------------------------------------------------------------------------
    @retried
    def cron_first_seen(
        self, *, names: Sequence[str], now: datetime | None = None
    ) -> dict[str, datetime]:
        ts = self._now(now)
        with self._tx() as cur:
            for name in sorted(names):  # one order everywhere: racing workers wait, not deadlock
                self._qc(cur, "periodic_register", {"name": name, "now": ts})
            rows = self._q(cur, "periodic_first_seen", {"names": self._list(list(names))})
        return {r["name"]: self._ts(r["first_seen_at"]) or datetime.now(UTC) for r in rows}

    # -- changes -------------------------------------------------------------------------
    def changes_head(self) -> ChangeCursor:
        head = self._rows("changes_head", {})[0]["head"]
        return ChangeCursor(max(0, int(head or 0)))

    def changes_since(
        self, *, after: ChangeCursor, filter: JobFilter, batches: bool = True, limit: int = 500
    ) -> list[Change]:
        with self._snapshot_reads() as read:
            return self._changes_since(read, after, filter, batches, limit)

    def _changes_since(
        self,
        read: Callable[..., list[Any]],
        after: ChangeCursor,
        filter: JobFilter,
        batches: bool,
        limit: int,
    ) -> list[Change]:
        where, params = self._filter(filter)
        change, ident = after.after_job()
        rows = read(
            "changes_jobs",
            {**params, "after_change": str(change), "after_id": ident, "limit": limit},
            sql=self._with_filter("changes_jobs", where),
        )
        out = [
            Change(ChangeCursor(int(r["change_stamp"]), 0, int(r["id"])), job=self._job(r))
            for r in rows
        ]
        if batches and filter.ids is None:
            change, ident = after.after_batch()
            brows = read(
                "changes_batches",
                {
                    "batch_id": filter.batch_id or 0,
                    "after_change": str(change),
                    "after_id": ident,
                    "limit": limit,
                },
            )
            out += [
                Change(
                    ChangeCursor(int(r["change_stamp"]), 1, int(r["id"])),
                    batch=batch_from_row(r, self._ts),
                )
                for r in brows
            ]
            out.sort(key=lambda c: c.cursor)  # stamps first, then jobs before batches
        return out[:limit]

    # -- the server's own storage ---------------------------------------------------------
    @retried
    def token_insert(
        self, *, token: ApiToken, secret_hash: str, now: datetime | None = None
    ) -> None:
        params = {
            "id": token.id,
            "name": token.name,
            "scope": str(token.scope),
            "secret_hash": secret_hash,
            "now": self._now(now),
        }
        with self._tx() as cur:
            self._qc(cur, "token_insert", params)

    def token_find(self, *, token_id: str) -> tuple[ApiToken, str] | None:
        rows = self._rows("token_get", {"id": token_id})
        if not rows:
            return None
        return token_from_row(rows[0], self._ts), str(rows[0]["secret_hash"])

    def token_list(self) -> list[ApiToken]:
        return [token_from_row(r, self._ts) for r in self._rows("token_list", {})]

    def token_revoke(self, *, token_id: str, now: datetime | None = None) -> bool:
        return self._count("token_revoke", {"id": token_id, "now": self._now(now)}) > 0

    def token_count_active(self) -> int:
        return int(self._rows("token_count_active", {})[0]["n"])

    def token_count_all(self) -> int:
        return int(self._rows("token_count_all", {})[0]["n"])

    @retried
    def action_insert(
        self,
        *,
        action_id: str,
        action: str,
        filter_json: str,
        actor: str | None,
        matched: int,
        jobs: Sequence[JobInsert] = (),
        now: datetime | None = None,
    ) -> list[Inserted]:
        params = {
            "id": action_id,
            "action": action,
            "filter": filter_json,
            "actor": actor,
            "matched": matched,
            "now": self._now(now),
        }
        with self._tx() as cur:
            self._qc(cur, "action_insert", params)
            return self._insert_resolving(cur, jobs, params["now"]) if jobs else []

    @retried
    def action_update(
        self,
        *,
        action_id: str,
        done: int,
        requested: int,
        state: str,
        error: str | None = None,
        now: datetime | None = None,
    ) -> None:
        params = {
            "id": action_id,
            "done": done,
            "requested": requested,
            "state": state,
            "error": error,
            "now": self._now(now),
        }
        with self._tx() as cur:
            self._qc(cur, "action_update", params)

    def action_list(self, *, limit: int = 50) -> list[ActionRecord]:
        return [action_from_row(r, self._ts) for r in self._rows("action_list", {"limit": limit})]

    def action_get(self, *, action_id: str) -> ActionRecord | None:
        rows = self._rows("action_get", {"id": action_id})
        return action_from_row(rows[0], self._ts) if rows else None

    def task_settings_list(self) -> list[TaskSettings]:
        return [task_settings_from_row(r, self._ts) for r in self._rows("task_settings_list", {})]

    def task_settings_get(self, *, task: str) -> TaskSettings | None:
        rows = self._rows("task_settings_get", {"task": task})
        return task_settings_from_row(rows[0], self._ts) if rows else None

    @retried
    def task_settings_set(
        self, *, settings: TaskSettings, backoff_json: str | None, now: datetime | None = None
    ) -> int:
        s = settings
        row = {
            "task": s.task,
            "batch_size": s.batch_size,
            "poll_interval_s": s.poll_interval_s,
            "max_processing_s": s.max_processing_s,
            "max_attempts": s.max_attempts,
            "retry_interval_s": s.retry_interval_s,
            "retry_cap_s": s.retry_cap_s,
            "now": self._now(now),
        }
        apply = {
            "task": s.task,
            "max_attempts": s.max_attempts,
            "timeout_s": s.max_processing_s,
            "backoff": backoff_json,
        }
        with self._tx() as cur:
            self._qc(cur, "task_settings_upsert", row)
            return self._qc(cur, "task_settings_apply", apply)

    def task_settings_delete(self, *, task: str) -> bool:
        return self._count("task_settings_delete", {"task": task}) > 0

    def task_sensitive_list(self) -> dict[str, dict[str, int | None]]:
        out: dict[str, dict[str, int | None]] = {}
        for r in self._rows("task_sensitive_list", {}):
            position = r["position"]
            out.setdefault(r["task"], {})[r["name"]] = None if position is None else int(position)
        return out

    def task_sensitive_add(self, *, task: str, parameters: Mapping[str, int | None]) -> None:
        with self._tx() as cur:
            for name, position in parameters.items():
                self._qc(
                    cur, "task_sensitive_upsert", {"task": task, "name": name, "position": position}
                )

    def job_set_deadline(
        self, *, leases: Sequence[Lease], seconds: float, now: datetime | None = None
    ) -> int:
        if not leases:
            return 0
        params = {
            "ids": self._list([le.job_id for le in leases]),
            "tokens": self._list([le.token for le in leases]),
            "seconds": float(seconds),
            "now": self._now(now),
        }
        return self._count("job_set_deadline", params)

    # -- durable steps and events (schema v24) ---------------------------------------------
    def step_list(self, *, job_id: int, now: datetime | None = None) -> list[StepRecord]:
        rows = self._rows("step_list", {"job_id": job_id, "now": self._now(now)})
        return [step_from_row(r) for r in rows]

    @retried
    def step_save(
        self,
        *,
        job_id: int,
        token: str,
        name: str,
        kind: str,
        result_json: str | None = None,
        wake_in_s: float | None = None,
        now: datetime | None = None,
    ) -> StepRecord | None:
        key = {"job_id": job_id, "name": name, "now": self._now(now)}
        with self._tx() as cur:
            if not self._q(cur, "job_lease_held", {"id": job_id, "token": token}):
                return None
            row = {"kind": kind, "result": result_json, "done": kind == "step"}
            extra = {"wake_in_s": wake_in_s, "event_key": None}
            self._qc(cur, "step_insert", {**key, **row, **extra})
            return step_from_row(self._q(cur, "step_get", key)[0])

    @retried
    def step_wait(
        self,
        *,
        job_id: int,
        token: str,
        name: str,
        key: str,
        timeout_s: float | None,
        now: datetime | None = None,
    ) -> StepRecord | None:
        at = {"job_id": job_id, "name": name, "now": self._now(now)}
        with self._tx() as cur:
            if not self._q(cur, "job_lease_held", {"id": job_id, "token": token}):
                return None
            rows = self._q(cur, "step_get", at)
            if rows and (
                rows[0]["kind"] != "wait" or rows[0]["done"] or rows[0]["event_key"] != key
            ):
                return step_from_row(rows[0])  # a stored outcome, or a name clash: as it is
            if not rows:
                row = {"kind": "wait", "result": None, "done": False, "event_key": key}
                self._qc(cur, "step_insert", {**at, **row, "wake_in_s": timeout_s})
            event = self._q(cur, "event_get", {"key": key})
            if event:  # the first payload, kept with the step from now on
                done = {"result": event[0]["payload"], "timed_out": False}
                self._qc(cur, "step_resolve_wait", {**at, **done})
            else:
                step = step_from_row(self._q(cur, "step_get", at)[0])
                if step.due_in_s is not None and step.due_in_s <= 0:
                    self._qc(cur, "step_resolve_wait", {**at, "result": None, "timed_out": True})
            return step_from_row(self._q(cur, "step_get", at)[0])

    def event_emit(
        self, *, key: str, payload_json: str | None, now: datetime | None = None
    ) -> Emitted:
        # Two transactions, in this order, never one: the event commits before the
        # waiters are looked for. A waiter ends its attempt in three moves: it
        # looks for the event (none), writes its outcome (scheduled at its
        # deadline), and the leader's pass (event_wake_waiters, every second) looks
        # again. If the event committed before that pass read, the pass wakes the
        # job; if not, the event committed after the outcome did, so the wake
        # below, which starts after the event committed, sees the job scheduled
        # and wakes it. Either way the waiter is not left asleep until its
        # deadline. (In one transaction, the wake could read before the outcome
        # committed and the pass before the event did.)
        created = self._insert_event(key, payload_json, now) > 0
        return Emitted(key=key, created=created, woken=self._wake_waiters(key, 1000, now))

    @retried
    def _insert_event(self, key: str, payload_json: str | None, now: datetime | None) -> int:
        with self._tx() as cur:
            params = {"key": key, "payload": payload_json, "now": self._now(now)}
            return self._qc(cur, "event_insert", params)

    def event_wake_waiters(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        return self._wake_waiters(None, limit, now)

    @retried
    def _wake_waiters(self, key: str | None, limit: int, now: datetime | None) -> int:
        with self._tx() as cur:
            rows = self._q(cur, "job_waiters_due", {"key": key, "limit": limit})
            if not rows:
                return 0
            ids = self._list([int(r["id"]) for r in rows])
            woken = self._qc(cur, "job_wake_ids", {"ids": ids, "now": self._now(now)})
            self._wake(cur, sorted({r["queue"] for r in rows}))
        return woken

    @retried
    def event_prune(
        self, *, older_than_s: float, limit: int = 1000, now: datetime | None = None
    ) -> int:
        params = {"older_than_s": float(older_than_s), "limit": limit, "now": self._now(now)}
        with self._tx() as cur:
            gone = self._qc(cur, "event_prune", params)
            orphans = [int(r["job_id"]) for r in self._q(cur, "step_orphans", {"limit": limit})]
            if orphans:
                self._qc(cur, "step_delete_ids", {"ids": self._list(orphans)})
        return gone


def chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
