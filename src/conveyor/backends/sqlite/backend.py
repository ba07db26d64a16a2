"""SQLite backend: the embedded default. One file, WAL, claims under BEGIN IMMEDIATE."""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

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

Q = load_queries(__package__ or "conveyor.backends.sqlite")
MIGRATIONS = load_migrations(__package__ or "conveyor.backends.sqlite")
_SYNC_MODES = {"off", "normal", "full", "extra"}


def _epoch(now: datetime | None) -> float:
    return time.time() if now is None else now.timestamp()


def _json(value: Any) -> Any:
    return None if value is None else json.loads(value)


def _ts(value: Any) -> datetime | None:
    return None if value is None else datetime.fromtimestamp(value, UTC)


def _dict_row(cur: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    return {d[0]: v for d, v in zip(cur.description, row, strict=True)}


def _mark_limited(cur: sqlite3.Cursor, jobs: Sequence[JobInsert], ts: float) -> None:
    """Queues receiving keyed, rate-limited, pinned or spread jobs: from now on
    their claims go through the limit-aware path."""
    for queue in sorted({j.queue for j in jobs if needs_limits(j)}):
        cur.execute(Q["queue_mark_keyed"], {"queue": queue, "now": ts})


class SQLiteNotifier(Notifier):
    """SQLite has no LISTEN: watch ``PRAGMA data_version``, which moves whenever
    another connection commits. Costs one trivial read per ``interval``."""

    def __init__(self, backend: SQLiteBackend, interval: float = 0.01) -> None:
        self._conn = backend._new_connection()
        self._interval = interval
        self._last = self._version()
        self._closed = False
        self._lock = threading.Lock()

    def _version(self) -> int:
        return int(self._conn.execute(Q["data_version"]).fetchone()[0])

    def wait(self, timeout: float) -> set[str]:
        deadline = time.monotonic() + timeout
        while not self._closed:
            with self._lock:  # close() must not pull the connection from under us
                if self._closed:
                    break
                version = self._version()
            if version != self._last:
                self._last = version
                return {"*"}
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            time.sleep(min(self._interval, remaining))
        return set()

    def close(self) -> None:
        self._closed = True
        with self._lock:
            self._conn.close()


class SQLiteBackend(SharedSqlBackend):
    name = "sqlite"
    Q = Q

    # -- hooks of the shared SQL operations ------------------------------------------------
    def _now(self, now: datetime | None) -> Any:
        return _epoch(now)

    def _keys(self, keys: list[str]) -> Any:
        return json.dumps(keys)

    def _insert_rows(self, cur: Any, jobs: Sequence[JobInsert], now: Any) -> list[int]:
        _mark_limited(cur, jobs, now)
        ids = []
        for j in jobs:  # in-process: a statement per row costs microseconds
            row = cur.execute(Q["job_insert_many"], {**j._asdict(), "now": now}).fetchone()
            if row is not None:
                ids.append(int(row["id"]))
        return ids

    def _batch_record(self, row: dict[str, Any]) -> BatchRecord:
        return batch_from_row(row, _ts, _json)

    def __init__(
        self, path: str, *, synchronous: str = "full", busy_timeout_s: float = 30.0
    ) -> None:
        if path in ("", ":memory:"):
            raise ConfigError(
                "an in-memory SQLite database cannot be shared by workers: "
                "use a file, e.g. sqlite:///conveyor.db"
            )
        if synchronous.lower() not in _SYNC_MODES:
            raise ConfigError(
                f"synchronous must be one of {sorted(_SYNC_MODES)}, got {synchronous!r}"
            )
        self.path = os.path.abspath(path)
        folder = os.path.dirname(self.path)
        if not os.path.isdir(folder):
            raise DatabaseUnavailable(
                f"cannot open SQLite database {self.path}: folder {folder} does not exist"
            )
        self.synchronous = synchronous.upper()
        self.busy_timeout_s = busy_timeout_s
        self._local = threading.local()
        self._all: list[sqlite3.Connection] = []
        self._lock = threading.Lock()
        self._conn()  # fail now, with a clear message, if the file cannot be opened

    # -- connections -------------------------------------------------------------------
    def _new_connection(self) -> sqlite3.Connection:
        try:
            conn = sqlite3.connect(
                self.path,
                timeout=self.busy_timeout_s,
                isolation_level=None,
                check_same_thread=False,
            )
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
        except sqlite3.Error as exc:
            raise DatabaseUnavailable(f"cannot open SQLite database {self.path}: {exc}") from exc
        with self._lock:
            self._all.append(conn)
        return conn

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._local.conn = self._new_connection()
        return conn

    @contextmanager
    def _tx(self, conn: Any = None, *, write: bool = True) -> Iterator[sqlite3.Cursor]:
        """A cursor in a transaction: the caller's (``conn``) or an IMMEDIATE one of ours.

        IMMEDIATE takes the write lock up front, so two claimers never both read
        the same rows and then race to upgrade (SQLite's answer to SKIP LOCKED).
        """
        if conn is not None:
            self._check_caller_conn(conn)
            cur = conn.cursor()
            cur.row_factory = _dict_row
            yield cur
            return
        own = self._conn()
        cur = own.cursor()
        cur.row_factory = _dict_row
        cur.execute("BEGIN IMMEDIATE" if write else "BEGIN")
        try:
            yield cur
        except BaseException:
            cur.close()
            own.execute("ROLLBACK")
            raise
        cur.close()  # a RETURNING statement not read to its end would block COMMIT
        own.execute("COMMIT")

    def _check_caller_conn(self, conn: Any) -> None:
        if not isinstance(conn, sqlite3.Connection):
            raise ConfigError(
                f"conn= must be a sqlite3.Connection for a SQLite app, got {type(conn).__name__}"
            )
        files = {row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main"}
        if not any(f and os.path.samefile(f, self.path) for f in files):
            raise ConfigError(
                f"conn= is connected to {sorted(files)}, not to this app's database {self.path}"
            )

    @property
    def latest_schema(self) -> int:
        return MIGRATIONS[-1].version

    def close(self) -> None:
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except sqlite3.Error:
                pass
        self._local = threading.local()

    def notifier(self) -> Notifier:
        return SQLiteNotifier(self)

    # -- schema -----------------------------------------------------------------------
    def schema_version(self) -> int:
        cur = self._conn().cursor()
        if not cur.execute(Q["schema_version_exists"]).fetchone()[0]:
            return 0
        return int(cur.execute(Q["schema_version"]).fetchone()[0])

    def migrate(self) -> list[int]:
        applied: list[int] = []
        with self._tx() as cur:  # BEGIN IMMEDIATE: a second migrator waits, then finds nothing
            cur.execute(Q["schema_version_table"])
            current = int(next(iter(cur.execute(Q["schema_version"]).fetchone().values())))
            for mig in check_schema(current, MIGRATIONS, f"SQLite database {self.path}"):
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
        ts = _epoch(now)
        with self._tx(conn) as cur:
            _mark_limited(cur, jobs, ts)

            def insert(subset: Sequence[JobInsert]) -> list[tuple[int, KeyPair]]:
                out = []
                for j in subset:
                    row = cur.execute(Q["job_insert_many"], {**j._asdict(), "now": ts}).fetchone()
                    if row:
                        out.append((row["id"], (row["unique_key"], row["idempotency_key"])))
                return out

            def find(uks: list[str], iks: list[str]) -> list[tuple[int, str | None, str | None]]:
                rows = cur.execute(
                    Q["job_find_by_keys"],
                    {"unique_keys": json.dumps(uks), "idempotency_keys": json.dumps(iks)},
                ).fetchall()
                return [(r["id"], r["unique_key"], r["idempotency_key"]) for r in rows]

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
        ts = _epoch(now)
        peek = self._conn().execute(
            Q["job_peek_available"], {"queues": json.dumps(list(queues)), "now": ts}
        )
        if peek.fetchone() is None:
            return []
        jobs: list[Job] = []
        with self._tx() as cur:
            limits = queue_limits(
                cur.execute(Q["queue_limits"], {"queues": json.dumps(list(queues))}).fetchall()
            )
            for queue in queues:
                if len(jobs) >= limit:
                    break
                params = {
                    "queue": queue,
                    "worker_id": worker_id,
                    "limit": limit - len(jobs),
                    "lease_s": lease_s,
                    "now": ts,
                }
                if queue in limits:  # under BEGIN IMMEDIATE the counts cannot move under us
                    params.update(
                        limited_params(queue, limits[queue], limit - len(jobs)),
                        identity=json.dumps([worker_id, *tags]),
                    )
                    rows = cur.execute(Q["job_fetch_limited"], params).fetchall()
                    spends = rate_spending(rows)
                    if rows and limits[queue].spend:  # the queue's own bucket
                        spends.append(
                            {**limits[queue].spend, "key": f"queue={queue}", "taken": len(rows)}
                        )
                    for spend in spends:
                        cur.execute(Q["rate_spend"], {**spend, "now": ts})
                else:
                    rows = cur.execute(Q["job_fetch_available"], params).fetchall()
                claimed = [job_from_row(r, _ts, _json) for r in rows]
                claimed.sort(key=lambda j: (-j.priority, j.scheduled_at, j.id))
                jobs.extend(claimed)
        return jobs

    def job_finalize_many(
        self, *, worker_id: str, outcomes: Sequence[Finalize], now: datetime | None = None
    ) -> list[int]:
        if not outcomes:
            return []
        ts = _epoch(now)
        accepted: list[int] = []
        with self._tx() as cur:
            for o in outcomes:
                params = {**o._asdict(), "id": o.job_id, "now": ts}
                row = cur.execute(Q["job_finalize_one"], params).fetchone()
                if row is None:
                    continue  # lease no longer held: refused, nothing changed
                cur.execute(
                    Q["attempt_insert"],
                    {
                        "job_id": o.job_id,
                        "attempt": o.ran_attempt or row["attempt"],
                        "stage": o.ran_stage,
                        "worker_id": worker_id,
                        "started_at": row["started_at"],
                        "now": ts,
                        "outcome": o.outcome,
                        "error": o.error,
                        "traceback": o.traceback,
                    },
                )
                accepted.append(o.job_id)
        return accepted

    def job_release_many(
        self, *, leases: Sequence[Lease], now: datetime | None = None
    ) -> list[int]:
        released = []
        with self._tx() as cur:
            for le in leases:
                if cur.execute(
                    Q["job_release_one"], {"id": le.job_id, "token": le.token}
                ).fetchone():
                    released.append(le.job_id)
        return released

    def worker_heartbeat(
        self,
        *,
        worker: WorkerInfo,
        leases: Sequence[Lease],
        lease_s: float,
        now: datetime | None = None,
    ) -> Heartbeat:
        ts = _epoch(now)
        with self._tx() as cur:
            me = cur.execute(
                Q["worker_upsert"],
                {
                    "id": worker.id,
                    "hostname": worker.hostname,
                    "pid": worker.pid,
                    "queues": json.dumps(list(worker.queues)),
                    "concurrency": worker.concurrency,
                    "tags": json.dumps(list(worker.tags)),
                    "now": ts,
                },
            ).fetchone()
            rows = (
                cur.execute(
                    Q["job_heartbeat"],
                    {
                        "leases": json.dumps([[le.job_id, le.token] for le in leases]),
                        "lease_s": lease_s,
                        "now": ts,
                    },
                ).fetchall()
                if leases
                else []
            )
        return heartbeat_result(me, rows)

    def worker_request_stop(self, *, worker_id: str) -> bool:
        with self._tx() as cur:
            return bool(cur.execute(Q["worker_request_stop"], {"id": worker_id}).fetchall())

    def job_request_cancel(self, *, job_id: int) -> bool:
        with self._tx() as cur:
            return bool(cur.execute(Q["job_request_cancel"], {"id": job_id}).fetchall())

    def queue_set_paused(self, *, name: str, paused: bool, now: datetime | None = None) -> None:
        with self._tx() as cur:
            cur.execute(
                Q["queue_set_paused"], {"name": name, "paused": int(paused), "now": _epoch(now)}
            )

    def queue_list(self) -> list[QueueInfo]:
        with self._tx(write=False) as cur:
            rows = cur.execute(Q["queue_list"]).fetchall()
        return [
            QueueInfo(r["name"], bool(r["paused"]), json.loads(r["counts"]), r["max_running"])
            for r in rows
        ]

    def queue_set_rate(
        self,
        *,
        name: str,
        rate_per_s: float | None,
        rate_burst: float | None,
        now: datetime | None = None,
    ) -> None:
        with self._tx() as cur:
            cur.execute(
                Q["queue_set_rate"],
                {
                    "name": name,
                    "rate_per_s": rate_per_s,
                    "rate_burst": rate_burst,
                    "now": _epoch(now),
                },
            )

    def queue_set_limit(
        self, *, name: str, max_running: int | None, now: datetime | None = None
    ) -> None:
        with self._tx() as cur:
            cur.execute(
                Q["queue_set_limit"], {"name": name, "max_running": max_running, "now": _epoch(now)}
            )

    def job_age_priorities(
        self, *, aging_s: float, max_boost: int, limit: int = 1000, now: datetime | None = None
    ) -> int:
        with self._tx() as cur:
            return len(
                cur.execute(
                    Q["job_age_priorities"],
                    {
                        "aging_s": float(aging_s),
                        "max_boost": max_boost,
                        "limit": limit,
                        "now": _epoch(now),
                    },
                ).fetchall()
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
        params = {
            "state": state,
            "older_than_s": float(older_than_s),
            "limit": limit,
            "now": _epoch(now),
        }
        if dry_run:
            with self._tx(write=False) as cur:
                return int(cur.execute(Q["job_prune_count"], params).fetchone()["n"])
        with self._tx() as cur:
            ids = json.dumps([r["id"] for r in cur.execute(Q["job_prune_ids"], params)])
            cur.execute(Q["attempt_delete_ids"], {"ids": ids})
            return cur.execute(Q["job_delete_ids"], {"ids": ids}).rowcount

    def worker_deregister(self, *, worker_id: str) -> None:
        with self._tx() as cur:
            cur.execute(Q["worker_delete"], {"id": worker_id})

    def worker_prune_stale(self, *, older_than_s: float, now: datetime | None = None) -> int:
        with self._tx() as cur:
            cur.execute(Q["worker_prune_stale"], {"older_than_s": older_than_s, "now": _epoch(now)})
            return cur.rowcount

    def worker_list(self) -> list[WorkerInfo]:
        with self._tx(write=False) as cur:
            rows = cur.execute(Q["worker_list"]).fetchall()
        return [
            WorkerInfo(
                id=r["id"],
                hostname=r["hostname"],
                pid=r["pid"],
                queues=json.loads(r["queues"]),
                concurrency=r["concurrency"],
                started_at=_ts(r["started_at"]),
                last_seen_at=_ts(r["last_seen_at"]),
            )
            for r in rows
        ]

    # -- maintenance -------------------------------------------------------------------
    def job_rescue_expired(self, *, limit: int = 1000, now: datetime | None = None) -> RescueResult:
        ts = _epoch(now)
        requeued: list[int] = []
        failed: list[int] = []
        with self._tx() as cur:
            expired = cur.execute(Q["job_expired_leases"], {"now": ts, "limit": limit}).fetchall()
            for e in expired:
                row = cur.execute(Q["job_rescue_one"], {"id": e["id"], "now": ts}).fetchone()
                if row is None:
                    continue
                cur.execute(
                    Q["attempt_insert"],
                    {
                        "job_id": row["id"],
                        "attempt": row["attempt"],
                        "stage": row["stage"],
                        "worker_id": e["lease_owner"],
                        "started_at": e["started_at"],
                        "now": ts,
                        "outcome": "lost",
                        "error": row["error"],
                        "traceback": None,
                    },
                )
                (failed if row["state"] == "failed" else requeued).append(row["id"])
        return RescueResult(requeued=requeued, failed=failed)

    def job_schedule_due(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        with self._tx() as cur:
            return len(
                cur.execute(Q["job_schedule_due"], {"now": _epoch(now), "limit": limit}).fetchall()
            )

    # -- inspection ------------------------------------------------------------------
    def job_get(self, *, job_id: int) -> Job | None:
        with self._tx(write=False) as cur:
            row = cur.execute(Q["job_get"], {"id": job_id}).fetchone()
        return job_from_row(row, _ts, _json) if row else None

    def job_list(
        self,
        *,
        queue: str | None = None,
        state: str | None = None,
        task: str | None = None,
        limit: int = 50,
        before_id: int | None = None,
    ) -> list[Job]:
        with self._tx(write=False) as cur:
            rows = cur.execute(
                Q["job_list"],
                {
                    "queue": queue,
                    "state": state,
                    "task": task,
                    "limit": limit,
                    "before_id": before_id,
                },
            ).fetchall()
        return [job_from_row(r, _ts, _json) for r in rows]

    def job_attempts(self, *, job_id: int) -> list[Attempt]:
        with self._tx(write=False) as cur:
            rows = cur.execute(Q["job_attempts"], {"id": job_id}).fetchall()
        return [attempt_from_row(r, _ts) for r in rows]

    def job_retry(self, *, job_id: int, now: datetime | None = None) -> bool:
        with self._tx() as cur:
            return bool(cur.execute(Q["job_retry"], {"id": job_id, "now": _epoch(now)}).fetchall())

    def job_cancel(self, *, job_id: int, now: datetime | None = None) -> bool:
        with self._tx() as cur:
            return bool(cur.execute(Q["job_cancel"], {"id": job_id, "now": _epoch(now)}).fetchall())

    def queue_counts(self) -> list[QueueCount]:
        with self._tx(write=False) as cur:
            rows = cur.execute(Q["queue_counts"]).fetchall()
        return [QueueCount(r["queue"], r["state"], r["n"]) for r in rows]

    # -- batches ------------------------------------------------------------------------
    def batch_get(self, *, batch_id: int) -> BatchRecord | None:
        with self._tx(write=False) as cur:
            row = cur.execute(Q["batch_get"], {"id": batch_id}).fetchone()
        return batch_from_row(row, _ts, _json) if row else None

    def batch_list(
        self, *, state: str | None = None, limit: int = 50, before_id: int | None = None
    ) -> list[BatchRecord]:
        with self._tx(write=False) as cur:
            rows = cur.execute(
                Q["batch_list"], {"state": state, "limit": limit, "before_id": before_id}
            ).fetchall()
        return [batch_from_row(r, _ts, _json) for r in rows]

    def batch_progress(self, *, batch_id: int) -> dict[str, int]:
        with self._tx(write=False) as cur:
            rows = cur.execute(Q["batch_progress"], {"id": batch_id}).fetchall()
        return {r["state"]: int(r["n"]) for r in rows}

    def batch_finished_jobs(
        self, *, batch_id: int, after: tuple[datetime, int] | None = None, limit: int = 500
    ) -> list[Job]:
        after_at, after_id = (after[0].timestamp(), after[1]) if after else (0.0, 0)
        with self._tx(write=False) as cur:
            rows = cur.execute(
                Q["batch_finished_jobs"],
                {"id": batch_id, "after_at": after_at, "after_id": after_id, "limit": limit},
            ).fetchall()
        return [job_from_row(r, _ts, _json) for r in rows]

    def batch_jobs(self, *, batch_id: int) -> list[Job]:
        with self._tx(write=False) as cur:
            rows = cur.execute(Q["batch_jobs"], {"id": batch_id}).fetchall()
        return [job_from_row(r, _ts, _json) for r in rows]

    def batch_cancel(self, *, batch_id: int, now: datetime | None = None) -> int:
        params = {"id": batch_id, "now": _epoch(now)}
        with self._tx() as cur:
            if cur.execute(Q["batch_mark_cancelled"], params).fetchone() is None:
                return 0
            return cur.execute(Q["batch_cancel_jobs"], params).rowcount

    def batch_retry_failed(self, *, batch_id: int, now: datetime | None = None) -> int:
        params = {"id": batch_id, "now": _epoch(now)}
        with self._tx() as cur:
            if cur.execute(Q["batch_reopen"], params).fetchone() is None:
                return 0
            return cur.execute(Q["batch_retry_jobs"], params).rowcount

    def batch_ready(self, *, limit: int = 100) -> list[int]:
        with self._tx(write=False) as cur:
            return [int(r["id"]) for r in cur.execute(Q["batch_ready"], {"limit": limit})]

    # -- chains -------------------------------------------------------------------------
    def job_chain_append(self, *, job_id: int, steps_json: str) -> bool:
        with self._tx() as cur:
            row = cur.execute(Q["job_chain_get"], {"id": job_id}).fetchone()
            if row is None:
                return False
            chain = (json.loads(row["chain"]) if row["chain"] else []) + json.loads(steps_json)
            cur.execute(Q["job_chain_set"], {"id": job_id, "chain": json.dumps(chain)})
        return True

    def job_chain_due(self, *, limit: int = 100) -> list[ChainLink]:
        with self._tx(write=False) as cur:
            rows = cur.execute(Q["job_chain_due"], {"limit": limit}).fetchall()
        return [
            ChainLink(
                id=r["id"],
                state=r["state"],
                result_json=r["result"],
                error=r["error"],
                chain=json.loads(r["chain"]),
                chain_root=r["chain_root"],
            )
            for r in rows
        ]

    # -- leadership -----------------------------------------------------------------------
    def leader_attempt_elect(
        self, *, name: str, holder: str, ttl_s: float, now: datetime | None = None
    ) -> bool:
        with self._tx() as cur:
            row = cur.execute(
                Q["leader_attempt_elect"],
                {"name": name, "holder": holder, "ttl_s": ttl_s, "now": _epoch(now)},
            ).fetchone()
        return row is not None

    def leader_resign(self, *, name: str, holder: str) -> None:
        with self._tx() as cur:
            cur.execute(Q["leader_resign"], {"name": name, "holder": holder})
