"""PostgreSQL backend: psycopg 3, a connection pool, SKIP LOCKED claims, LISTEN/NOTIFY."""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.string import TextLoader
from psycopg_pool import ConnectionPool

from ...errors import ConfigError, DatabaseUnavailable
from ...job import Attempt, Job
from ..base import (
    BatchRecord,
    ChainLink,
    Finalize,
    Heartbeat,
    Inserted,
    JobInsert,
    Lease,
    Notifier,
    QueueCount,
    QueueInfo,
    RescueResult,
    WorkerInfo,
)
from ..common import (
    KeyPair,
    QueueLimits,
    attempt_from_row,
    batch_from_row,
    check_schema,
    heartbeat_result,
    insert_resolving,
    job_from_row,
    limited_params,
    needs_limits,
    queue_limits,
    rate_spending,
)
from ..shared import SharedSqlBackend
from ..sqlfiles import load_migrations, load_queries, split_statements

log = logging.getLogger("conveyor.postgres")

Q = load_queries(__package__ or "conveyor.backends.postgres")
MIGRATIONS = load_migrations(__package__ or "conveyor.backends.postgres")
CHANNEL = "conveyor_jobs"
# Without keys no row can conflict, and ON CONFLICT checking costs ~10% of a bulk insert.
if "ON CONFLICT DO NOTHING" not in Q["job_insert_many"]:
    raise RuntimeError("job_insert_many lost its ON CONFLICT clause")
KEYLESS_INSERT = Q["job_insert_many"].replace("ON CONFLICT DO NOTHING", "")


def _json(value: Any) -> Any:
    return None if value is None else json.loads(value)  # jsonb arrives as text: see _configure


# Statements never prepared (planned afresh each run). None at present: the
# lease writes fence on id + token only, which keeps their generic plans sound
# (see job_finalize_many); bench/bench_batches.py probes for a plan flip.
UNPREPARED: frozenset[str] = frozenset()


def _configure(conn: psycopg.Connection[Any]) -> None:
    """Hand jsonb back as text: both dialects then decode JSON the same way, and a
    JSON string result is never mistaken for an encoded document."""
    conn.adapters.register_loader("jsonb", TextLoader)
    # Our statements are short and touch few rows; JIT compiling them costs far more
    # than it saves (a claim estimated expensive spent 935 ms compiling, 4 ms running).
    conn.execute("SET jit = off")


def _ts(value: Any) -> datetime | None:
    return value  # type: ignore[no-any-return]  # psycopg returns aware datetimes


def _connect_error(url: str, exc: Exception) -> DatabaseUnavailable:
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return DatabaseUnavailable(
        f"cannot connect to PostgreSQL at {redact(url)}: {first}. "
        "Check that the server is running and the URL (host, port, user, database) is right."
    )


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable URL>"
    info.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in info.items())


# JobInsert field -> query parameter, for every column but args (always full).
_INSERT_COLUMNS = {
    "queue": "queue",
    "task": "task",
    "priority": "priority",
    "max_attempts": "max_attempts",
    "timeout_s": "timeout_s",
    "backoff_json": "backoff",
    "unique_key": "unique_key",
    "idempotency_key": "idempotency_key",
    "delay_s": "delay_s",
    "batch_id": "batch_id",
    "stage": "stage",
    "context_json": "context",
    "chain_json": "chain",
    "chain_root": "chain_root",
    "concurrency_key": "concurrency_key",
    "concurrency_limit": "concurrency_limit",
    "rate_key": "rate_key",
    "rate_per_s": "rate_per_s",
    "rate_burst": "rate_burst",
    "pinned_to": "pinned_to",
    "spread_group": "spread_group",
}
_FLOAT_COLUMNS = frozenset({"delay_s", "timeout_s", "rate_per_s", "rate_burst"})
_FINALIZE_COLUMNS = (
    "state",
    "outcome",
    "result_json",
    "error",
    "traceback",
    "retry_in_s",
    "ran_attempt",
    "ran_stage",
    "next_stage",
    "context_json",
    "priority",
)


def _mark_limited(cur: psycopg.Cursor[Any], jobs: Sequence[JobInsert]) -> None:
    """Queues receiving keyed, rate-limited, pinned or spread jobs: from now on
    their claims go through the serialized, limit-aware path."""
    limited = sorted({j.queue for j in jobs if needs_limits(j)})
    if limited:
        cur.execute(Q["queue_mark_keyed"], {"queues": limited})


def _spread(params: dict[str, Any], name: str, values: Sequence[Any]) -> None:
    """Send ``values`` as one scalar ``<name>_all`` when they are all equal (the
    query coalesces the padded NULLs), else as a full array. ``tuple.count`` does
    the comparison in C: this runs for some twenty columns of every chunk."""
    first = values[0]
    if values.count(first) == len(values):
        params[name], params[f"{name}_all"] = None, first
    else:
        params[name], params[f"{name}_all"] = list(values), None


def _floats(values: Sequence[Any]) -> tuple[Any, ...]:
    """Binary arrays must not mix int and float."""
    return tuple(None if v is None else float(v) for v in values)


_INSERT_INDEX = {f: JobInsert._fields.index(f) for f in _INSERT_COLUMNS}
_FINALIZE_INDEX = {f: Finalize._fields.index(f) for f in _FINALIZE_COLUMNS}


def _insert_params(jobs: Sequence[JobInsert], now: datetime | None) -> dict[str, Any]:
    columns = list(zip(*jobs, strict=True))  # NamedTuples: transposed in C
    params: dict[str, Any] = {
        "args": list(columns[JobInsert._fields.index("args_json")]),
        "now": now,
        "channel": CHANNEL,
    }
    for field, name in _INSERT_COLUMNS.items():
        values = columns[_INSERT_INDEX[field]]
        _spread(params, name, _floats(values) if field in _FLOAT_COLUMNS else values)
    return params


def _finalize_params(
    worker_id: str, outcomes: Sequence[Finalize], now: datetime | None
) -> dict[str, Any]:
    columns = list(zip(*outcomes, strict=True))
    params: dict[str, Any] = {
        "id": list(columns[0]),
        "token": list(columns[1]),
        "worker_id": worker_id,
        "now": now,
        "channel": CHANNEL,
    }
    for name in _FINALIZE_COLUMNS:
        values = columns[_FINALIZE_INDEX[name]]
        _spread(params, name, _floats(values) if name == "retry_in_s" else values)
    return params


def _batch(row: dict[str, Any]) -> BatchRecord:
    return batch_from_row(row, _ts, _json)


class PostgresNotifier(Notifier):
    """LISTEN on a dedicated connection; payloads are queue names."""

    def __init__(self, url: str) -> None:
        try:
            self._conn = psycopg.connect(url, autocommit=True)
        except psycopg.OperationalError as exc:
            raise _connect_error(url, exc) from exc
        self._conn.execute(f"LISTEN {CHANNEL}")
        self._lock = threading.Lock()
        self._closed = False

    def wait(self, timeout: float) -> set[str]:
        queues: set[str] = set()
        with self._lock:
            if self._closed:
                return queues
            try:
                for note in self._conn.notifies(timeout=timeout, stop_after=1):
                    queues.add(note.payload)
                # Drain whatever else arrived, without waiting again.
                for note in self._conn.notifies(timeout=0.0):
                    queues.add(note.payload)
            except psycopg.OperationalError:
                if self._closed:
                    return queues
                log.warning("LISTEN connection lost; relying on polling until it is back")
                self._reconnect()
        return queues

    def _reconnect(self) -> None:
        try:
            self._conn.close()
            self._conn = psycopg.connect(self._conn.info.dsn, autocommit=True)
            self._conn.execute(f"LISTEN {CHANNEL}")
        except psycopg.OperationalError:
            pass

    def close(self) -> None:
        # Never close the connection under a thread blocked in notifies() on it:
        # libpq would use freed memory. wait() holds the lock and returns within
        # its timeout, so taking the lock here is enough.
        self._closed = True
        with self._lock:
            try:
                self._conn.close()
            except Exception:
                pass


class PostgresBackend(SharedSqlBackend):
    name = "postgres"
    pushes_notifications = True
    Q = Q

    # -- hooks of the shared SQL operations ------------------------------------------------
    def _now(self, now: datetime | None) -> Any:
        return now  # None: the server's clock

    def _keys(self, keys: list[str]) -> Any:
        return keys

    def _insert_rows(self, cur: Any, jobs: Sequence[JobInsert], now: Any) -> list[int]:
        _mark_limited(cur, jobs)
        keyed = any(j.unique_key or j.idempotency_key for j in jobs)
        query = Q["job_insert_many"] if keyed else KEYLESS_INSERT
        return [int(r["id"]) for r in cur.execute(query, _insert_params(jobs, now)).fetchall()]

    def _batch_record(self, row: dict[str, Any]) -> BatchRecord:
        return _batch(row)

    def __init__(self, url: str, *, max_connections: int = 10) -> None:
        self.url = url
        try:
            psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise ConfigError(f"malformed PostgreSQL URL: {exc}") from exc
        # Connect once directly: psycopg's own error says *why* (refused, no such
        # database, auth), which a pool timeout would hide.
        try:
            psycopg.connect(url, connect_timeout=10).close()
        except psycopg.OperationalError as exc:
            raise _connect_error(url, exc) from exc
        self._limits_cache: dict[tuple[str, ...], tuple[float, dict[str, QueueLimits]]] = {}
        self.pool = ConnectionPool(
            url,
            min_size=1,
            max_size=max_connections,
            kwargs={"autocommit": True, "row_factory": dict_row},
            configure=_configure,
            open=True,
            name="conveyor",
        )

    @property
    def latest_schema(self) -> int:
        return MIGRATIONS[-1].version

    def close(self) -> None:
        self.pool.close()

    @contextmanager
    def _cursor(self, conn: Any = None) -> Iterator[psycopg.Cursor[Any]]:
        """The caller's connection (inside their transaction), else one of ours in
        autocommit: every statement through it is atomic on its own."""
        if conn is not None:
            with self._tx(conn) as cur:
                yield cur
            return
        try:
            with self.pool.connection() as c, c.cursor() as cur:
                yield cur
        except psycopg.OperationalError as exc:
            raise _connect_error(self.url, exc) from exc

    @contextmanager
    def _tx(self, conn: Any = None) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor in a transaction: the caller's (``conn``) or our own from the pool."""
        if conn is not None:
            if not isinstance(conn, psycopg.Connection):
                raise ConfigError(
                    "conn= must be a psycopg (3) Connection for a PostgreSQL app, "
                    f"got {type(conn).__name__}"
                )
            with conn.cursor(row_factory=dict_row) as cur:
                yield cur
            return
        try:
            with self.pool.connection() as c, c.transaction(), c.cursor() as cur:
                yield cur
        except psycopg.OperationalError as exc:
            raise _connect_error(self.url, exc) from exc

    def _run(self, query: str, params: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """One statement in autocommit: a single round trip, no BEGIN/COMMIT.

        The array-joined lease writes are never prepared (see UNPREPARED); every
        other statement is, after a few runs, and keeps its plan."""
        try:
            with self.pool.connection() as c:
                cur = c.execute(Q[query], params, prepare=False if query in UNPREPARED else None)
                return cur.fetchall() if cur.description else []
        except psycopg.OperationalError as exc:
            raise _connect_error(self.url, exc) from exc

    def notifier(self) -> Notifier:
        return PostgresNotifier(self.url)

    # -- schema -----------------------------------------------------------------------
    def schema_version(self) -> int:
        with self._tx() as cur:
            exists = cur.execute(Q["schema_version_exists"]).fetchone()
            if not exists or not next(iter(exists.values())):
                return 0
            row = cur.execute(Q["schema_version"]).fetchone()
            return int(next(iter(row.values()))) if row else 0

    def migrate(self) -> list[int]:
        applied: list[int] = []
        with self._tx() as cur:
            cur.execute(Q["migration_lock"])
            cur.execute(Q["schema_version_table"])
            row = cur.execute(Q["schema_version"]).fetchone()
            current = int(next(iter(row.values()))) if row else 0
            for mig in check_schema(current, MIGRATIONS, "the PostgreSQL database"):
                for stmt in split_statements(mig.sql):
                    cur.execute(stmt)
                cur.execute(Q["schema_version_insert"], {"version": mig.version, "name": mig.name})
                applied.append(mig.version)
        return applied

    # -- producers ---------------------------------------------------------------------
    def job_insert_many(
        self, *, jobs: Sequence[JobInsert], conn: Any = None, now: datetime | None = None
    ) -> list[Inserted]:
        if not jobs:
            return []
        keyed = any(j.unique_key or j.idempotency_key for j in jobs)
        query = Q["job_insert_many"] if keyed else KEYLESS_INSERT
        with self._cursor(conn) as cur:
            _mark_limited(cur, jobs)

            def insert(subset: Sequence[JobInsert]) -> list[tuple[int, KeyPair]]:
                rows = cur.execute(query, _insert_params(subset, now)).fetchall()
                return [(r["id"], (r["unique_key"], r["idempotency_key"])) for r in rows]

            def find(uks: list[str], iks: list[str]) -> list[tuple[int, str | None, str | None]]:
                found = cur.execute(
                    Q["job_find_by_keys"], {"unique_keys": uks, "idempotency_keys": iks}
                ).fetchall()
                return [(r["id"], r["unique_key"], r["idempotency_key"]) for r in found]

            return insert_resolving(jobs, insert, find)

    # -- workers -----------------------------------------------------------------------
    def job_fetch_available(
        self,
        *,
        queues: Sequence[str],
        worker_id: str,
        limit: int,
        lease_s: float,
        tags: Sequence[str] = (),
        now: datetime | None = None,
    ) -> list[Job]:
        if limit <= 0 or not queues:
            return []
        limits = self._queue_limits(queues)
        free = [q for q in queues if q not in limits]
        params = {"worker_id": worker_id, "lease_s": float(lease_s), "now": now}
        rows = []
        if free:  # the fast path: SKIP LOCKED, no limits to respect
            rows = self._run("job_fetch_available", {**params, "queues": free, "limit": limit})
        for queue in (q for q in queues if q in limits):
            if len(rows) >= limit:
                break
            with self._tx() as cur:
                cur.execute(Q["limits_lock"])
                claimed = cur.execute(
                    Q["job_fetch_limited"],
                    {
                        **params,
                        **limited_params(queue, limits[queue], limit - len(rows)),
                        "limit": limit - len(rows),
                        "identity": [worker_id, *tags],
                    },
                ).fetchall()
                spends = rate_spending(claimed)
                if claimed and limits[queue].spend:  # the queue's own bucket
                    spends.append(
                        {**limits[queue].spend, "key": f"queue={queue}", "taken": len(claimed)}
                    )
                for spend in spends:  # same transaction, same lock
                    cur.execute(Q["rate_spend"], {**spend, "now": now})
                rows += claimed
        jobs = [job_from_row(r, _ts, _json) for r in rows]
        order = {q: i for i, q in enumerate(queues)}
        jobs.sort(key=lambda j: (order[j.queue], -j.priority, j.scheduled_at, j.id))
        return jobs

    def _queue_limits(self, queues: Sequence[str]) -> dict[str, QueueLimits]:
        """Queues whose claims must respect limits -> their max_running, read at most
        once a second. Keyed jobs are never claimed by the fast path, so a stale
        answer can delay them but not over-admit them."""
        key = tuple(queues)
        cached = self._limits_cache.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        limits = queue_limits(self._run("queue_limits", {"queues": list(queues)}))
        self._limits_cache[key] = (time.monotonic() + 1.0, limits)
        return limits

    def job_finalize_many(
        self, *, worker_id: str, outcomes: Sequence[Finalize], now: datetime | None = None
    ) -> list[int]:
        if not outcomes:
            return []
        rows = self._run("job_finalize_many", _finalize_params(worker_id, outcomes, now))
        return [r["job_id"] for r in rows]

    def job_release_many(
        self, *, leases: Sequence[Lease], now: datetime | None = None
    ) -> list[int]:
        if not leases:
            return []
        rows = self._run(
            "job_release_many",
            {
                "id": [le.job_id for le in leases],
                "token": [le.token for le in leases],
                "channel": CHANNEL,
            },
        )
        return [r["id"] for r in rows]

    def worker_heartbeat(
        self,
        *,
        worker: WorkerInfo,
        leases: Sequence[Lease],
        lease_s: float,
        now: datetime | None = None,
    ) -> Heartbeat:
        [me] = self._run(
            "worker_upsert",
            {
                "id": worker.id,
                "hostname": worker.hostname,
                "pid": worker.pid,
                "queues": list(worker.queues),
                "concurrency": worker.concurrency,
                "tags": list(worker.tags),
                "now": now,
            },
        )
        rows = (
            self._run(
                "job_heartbeat",
                {
                    "id": [le.job_id for le in leases],
                    "token": [le.token for le in leases],
                    "lease_s": float(lease_s),
                    "now": now,
                },
            )
            if leases
            else []
        )
        return heartbeat_result(me, rows)

    def worker_request_stop(self, *, worker_id: str) -> bool:
        return bool(self._run("worker_request_stop", {"id": worker_id, "channel": CHANNEL}))

    def job_request_cancel(self, *, job_id: int) -> bool:
        return bool(self._run("job_request_cancel", {"id": job_id, "channel": CHANNEL}))

    def queue_set_paused(self, *, name: str, paused: bool, now: datetime | None = None) -> None:
        self._run("queue_set_paused", {"name": name, "paused": paused, "now": now})

    def queue_list(self) -> list[QueueInfo]:
        return [
            QueueInfo(r["name"], bool(r["paused"]), json.loads(r["counts"]), r["max_running"])
            for r in self._run("queue_list")
        ]

    def queue_set_rate(
        self,
        *,
        name: str,
        rate_per_s: float | None,
        rate_burst: float | None,
        now: datetime | None = None,
    ) -> None:
        self._run(
            "queue_set_rate",
            {"name": name, "rate_per_s": rate_per_s, "rate_burst": rate_burst, "now": now},
        )
        self._limits_cache.clear()

    def queue_set_limit(
        self, *, name: str, max_running: int | None, now: datetime | None = None
    ) -> None:
        self._run("queue_set_limit", {"name": name, "max_running": max_running, "now": now})
        self._limits_cache.clear()

    def job_age_priorities(
        self, *, aging_s: float, max_boost: int, limit: int = 1000, now: datetime | None = None
    ) -> int:
        return len(
            self._run(
                "job_age_priorities",
                {"aging_s": float(aging_s), "max_boost": max_boost, "limit": limit, "now": now},
            )
        )

    def job_prune(
        self,
        *,
        state: str,
        older_than_s: float,
        limit: int = 1000,
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> int:
        params = {"state": state, "older_than_s": float(older_than_s), "limit": limit, "now": now}
        if dry_run:
            return int(self._run("job_prune_count", params)[0]["n"])
        return len(self._run("job_prune", params))

    def worker_deregister(self, *, worker_id: str) -> None:
        self._run("worker_delete", {"id": worker_id})

    def worker_prune_stale(self, *, older_than_s: float, now: datetime | None = None) -> int:
        with self._cursor() as cur:
            cur.execute(Q["worker_prune_stale"], {"older_than_s": older_than_s, "now": now})
            return cur.rowcount

    def worker_list(self) -> list[WorkerInfo]:
        return [
            WorkerInfo(
                id=r["id"],
                hostname=r["hostname"],
                pid=r["pid"],
                queues=list(r["queues"]),
                concurrency=r["concurrency"],
                started_at=r["started_at"],
                last_seen_at=r["last_seen_at"],
            )
            for r in self._run("worker_list")
        ]

    # -- maintenance -------------------------------------------------------------------
    def job_rescue_expired(self, *, limit: int = 1000, now: datetime | None = None) -> RescueResult:
        rows = self._run("job_rescue_expired", {"limit": limit, "now": now, "channel": CHANNEL})
        return RescueResult(
            requeued=[r["id"] for r in rows if r["state"] == "available"],
            failed=[r["id"] for r in rows if r["state"] == "failed"],
        )

    def job_schedule_due(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        rows = self._run("job_schedule_due", {"limit": limit, "now": now, "channel": CHANNEL})
        return int(rows[0]["n"]) if rows else 0

    # -- inspection ------------------------------------------------------------------
    def job_get(self, *, job_id: int) -> Job | None:
        rows = self._run("job_get", {"id": job_id})
        return job_from_row(rows[0], _ts, _json) if rows else None

    def job_list(
        self,
        *,
        queue: str | None = None,
        state: str | None = None,
        task: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
    ) -> list[Job]:
        rows = self._run(
            "job_list",
            {"queue": queue, "state": state, "task": task, "limit": limit, "before_id": before_id},
        )
        return [job_from_row(r, _ts, _json) for r in rows]

    def job_attempts(self, *, job_id: int) -> list[Attempt]:
        return [attempt_from_row(r, _ts) for r in self._run("job_attempts", {"id": job_id})]

    def job_retry(self, *, job_id: int, now: datetime | None = None) -> bool:
        return bool(self._run("job_retry", {"id": job_id, "now": now, "channel": CHANNEL}))

    def job_cancel(self, *, job_id: int, now: datetime | None = None) -> bool:
        return bool(self._run("job_cancel", {"id": job_id, "now": now}))

    def queue_counts(self) -> list[QueueCount]:
        return [QueueCount(r["queue"], r["state"], r["n"]) for r in self._run("queue_counts")]

    # -- batches ------------------------------------------------------------------------
    def batch_get(self, *, batch_id: int) -> BatchRecord | None:
        rows = self._run("batch_get", {"id": batch_id})
        return _batch(rows[0]) if rows else None

    def batch_list(
        self, *, state: str | None = None, limit: int = 50, before_id: int | None = None
    ) -> list[BatchRecord]:
        rows = self._run("batch_list", {"state": state, "limit": limit, "before_id": before_id})
        return [_batch(r) for r in rows]

    def batch_progress(self, *, batch_id: int) -> dict[str, int]:
        return {r["state"]: int(r["n"]) for r in self._run("batch_progress", {"id": batch_id})}

    def batch_finished_jobs(
        self, *, batch_id: int, after: tuple[datetime, int] | None = None, limit: int = 500
    ) -> list[Job]:
        after_at, after_id = after or (datetime.min.replace(tzinfo=UTC), 0)
        rows = self._run(
            "batch_finished_jobs",
            {"id": batch_id, "after_at": after_at, "after_id": after_id, "limit": limit},
        )
        return [job_from_row(r, _ts, _json) for r in rows]

    def batch_jobs(self, *, batch_id: int) -> list[Job]:
        return [job_from_row(r, _ts, _json) for r in self._run("batch_jobs", {"id": batch_id})]

    def batch_cancel(self, *, batch_id: int, now: datetime | None = None) -> int:
        rows = self._run("batch_cancel", {"id": batch_id, "now": now, "channel": CHANNEL})
        return int(rows[0]["n"])

    def batch_retry_failed(self, *, batch_id: int, now: datetime | None = None) -> int:
        rows = self._run("batch_retry_failed", {"id": batch_id, "now": now, "channel": CHANNEL})
        return int(rows[0]["n"])

    def batch_ready(self, *, limit: int = 100) -> list[int]:
        return [int(r["id"]) for r in self._run("batch_ready", {"limit": limit})]

    # -- chains -------------------------------------------------------------------------
    def job_chain_append(self, *, job_id: int, steps_json: str) -> bool:
        return bool(self._run("job_chain_append", {"id": job_id, "steps": steps_json}))

    def job_chain_due(self, *, limit: int = 100) -> list[ChainLink]:
        return [
            ChainLink(
                id=r["id"],
                state=r["state"],
                result_json=r["result"],
                error=r["error"],
                chain=json.loads(r["chain"]),
                chain_root=r["chain_root"],
            )
            for r in self._run("job_chain_due", {"limit": limit})
        ]

    # -- leadership -----------------------------------------------------------------------
    def leader_attempt_elect(
        self, *, name: str, holder: str, ttl_s: float, now: datetime | None = None
    ) -> bool:
        rows = self._run(
            "leader_attempt_elect",
            {"name": name, "holder": holder, "ttl_s": float(ttl_s), "now": now},
        )
        return bool(rows)

    def leader_resign(self, *, name: str, holder: str) -> None:
        self._run("leader_resign", {"name": name, "holder": holder})
