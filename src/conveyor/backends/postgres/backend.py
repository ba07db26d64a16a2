"""PostgreSQL backend: psycopg 3, a connection pool, SKIP LOCKED claims, LISTEN/NOTIFY."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import psycopg
from psycopg.rows import dict_row
from psycopg.types.string import TextLoader
from psycopg_pool import ConnectionPool

from ...errors import ConfigError, DatabaseUnavailable
from ...job import Attempt, Job
from ..base import (
    Backend,
    Finalize,
    Inserted,
    JobInsert,
    Lease,
    Notifier,
    QueueCount,
    RescueResult,
    WorkerInfo,
)
from ..common import KeyPair, attempt_from_row, check_schema, insert_resolving, job_from_row
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


def _configure(conn: psycopg.Connection[Any]) -> None:
    """Hand jsonb back as text: both dialects then decode JSON the same way, and a
    JSON string result is never mistaken for an encoded document."""
    conn.adapters.register_loader("jsonb", TextLoader)


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


def _insert_params(jobs: Sequence[JobInsert], now: datetime | None) -> dict[str, Any]:
    return {
        "queue": [j.queue for j in jobs],
        "task": [j.task for j in jobs],
        "args": [j.args_json for j in jobs],
        "priority": [j.priority for j in jobs],
        "max_attempts": [j.max_attempts for j in jobs],
        "timeout_s": [j.timeout_s for j in jobs],
        "backoff": [j.backoff_json for j in jobs],
        "unique_key": [j.unique_key for j in jobs],
        "idempotency_key": [j.idempotency_key for j in jobs],
        "delay_s": [float(j.delay_s) for j in jobs],
        "now": now,
        "channel": CHANNEL,
    }


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


class PostgresBackend(Backend):
    name = "postgres"
    pushes_notifications = True

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
        """One statement in autocommit: a single round trip, no BEGIN/COMMIT."""
        try:
            with self.pool.connection() as c:
                cur = c.execute(Q[query], params)
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
        now: datetime | None = None,
    ) -> list[Job]:
        if limit <= 0 or not queues:
            return []
        rows = self._run(
            "job_fetch_available",
            {
                "queues": list(queues),
                "worker_id": worker_id,
                "limit": limit,
                "lease_s": float(lease_s),
                "now": now,
            },
        )
        jobs = [job_from_row(r, _ts, _json) for r in rows]
        order = {q: i for i, q in enumerate(queues)}
        jobs.sort(key=lambda j: (order[j.queue], -j.priority, j.scheduled_at, j.id))
        return jobs

    def job_finalize_many(
        self, *, worker_id: str, outcomes: Sequence[Finalize], now: datetime | None = None
    ) -> list[int]:
        if not outcomes:
            return []
        rows = self._run(
            "job_finalize_many",
            {
                "id": [o.job_id for o in outcomes],
                "token": [o.token for o in outcomes],
                "state": [o.state for o in outcomes],
                "result": [o.result_json for o in outcomes],
                "error": [o.error for o in outcomes],
                "traceback": [o.traceback for o in outcomes],
                "retry_in_s": [o.retry_in_s for o in outcomes],
                "outcome": [o.outcome for o in outcomes],
                "worker_id": worker_id,
                "now": now,
            },
        )
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
    ) -> list[int]:
        self._run(
            "worker_upsert",
            {
                "id": worker.id,
                "hostname": worker.hostname,
                "pid": worker.pid,
                "queues": list(worker.queues),
                "concurrency": worker.concurrency,
                "now": now,
            },
        )
        if not leases:
            return []
        rows = self._run(
            "job_heartbeat",
            {
                "id": [le.job_id for le in leases],
                "token": [le.token for le in leases],
                "lease_s": float(lease_s),
                "now": now,
            },
        )
        return [r["id"] for r in rows]

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
