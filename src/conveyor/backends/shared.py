"""Operations both SQL dialects run the same way, statement for statement.

Each is a short sequence of named queries inside one transaction; the dialects
differ only in what the hooks below do (how time and key lists are passed, how a
chunk of jobs is inserted), so the sequence is written once, here.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from .base import Backend, BatchRecord, JobInsert
from .common import callback_insert, close_state


class SharedSqlBackend(Backend):
    #: the dialect's named queries
    Q: dict[str, str]

    # -- hooks ---------------------------------------------------------------------------
    @abc.abstractmethod
    def _tx(self, conn: Any = None) -> AbstractContextManager[Any]:
        """A cursor in a transaction (the caller's, with ``conn``)."""

    @abc.abstractmethod
    def _now(self, now: datetime | None) -> Any:
        """``now`` as the dialect's queries take it."""

    @abc.abstractmethod
    def _keys(self, keys: list[str]) -> Any:
        """A list of keys as the dialect's queries take it."""

    @abc.abstractmethod
    def _insert_rows(self, cur: Any, jobs: Sequence[JobInsert], now: Any) -> list[int]:
        """Insert jobs on ``cur``; ids of the rows created (conflicting keys: none)."""

    @abc.abstractmethod
    def _batch_record(self, row: dict[str, Any]) -> BatchRecord: ...

    # -- batches -------------------------------------------------------------------------
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
    ) -> tuple[int, bool]:
        ts = self._now(now)
        with self._tx(conn) as cur:
            row = cur.execute(
                self.Q["batch_insert"],
                {
                    "name": name,
                    "task": task,
                    "total": len(jobs),
                    "now": ts,
                    "idempotency_key": idempotency_key,
                    "on_complete": on_complete_json,
                },
            ).fetchone()
            if row is None:  # the key named an existing batch: return it, write nothing
                found = cur.execute(
                    self.Q["batch_find_by_key"], {"idempotency_key": idempotency_key}
                ).fetchone()
                return int(found["id"]), False
            batch_id = int(row["id"])
            if jobs:
                self._insert_rows(cur, [j._replace(batch_id=batch_id) for j in jobs], ts)
        return batch_id, True

    def batch_close(self, *, batch_id: int, now: datetime | None = None) -> BatchRecord | None:
        ts = self._now(now)
        with self._tx() as cur:
            # PostgreSQL: FOR UPDATE, so an overlapping aggregator waits here and then
            # finds the batch closed; SQLite: the transaction holds the write lock.
            row = cur.execute(self.Q["batch_lock_open"], {"id": batch_id}).fetchone()
            if row is None:
                return None
            counts = {
                r["state"]: int(r["n"])
                for r in cur.execute(self.Q["batch_progress"], {"id": batch_id}).fetchall()
            }
            state = close_state(counts, cancelled=row["cancelled_at"] is not None)
            if state is None:
                return None  # work came back (retry_failed) since batch_ready looked
            closed = self._batch_record(
                cur.execute(
                    self.Q["batch_mark_closed"],
                    {
                        "id": batch_id,
                        "state": state,
                        "counts": json.dumps(counts),
                        "now": ts,
                    },
                ).fetchone()
            )
            callback = callback_insert(closed)
            if callback is not None:
                self._insert_rows(cur, [callback], ts)
        return closed

    # -- chains --------------------------------------------------------------------------
    def job_chain_advance(
        self, *, job_id: int, next_job: JobInsert | None, now: datetime | None = None
    ) -> int | None:
        ts = self._now(now)
        with self._tx() as cur:
            next_id = 0
            if next_job is not None:
                created = self._insert_rows(cur, [next_job], ts)
                if created:
                    next_id = created[0]
                else:  # advanced before (its idempotency key exists): link to that job
                    found = cur.execute(
                        self.Q["job_find_by_keys"],
                        {
                            "unique_keys": self._keys([]),
                            "idempotency_keys": self._keys([next_job.idempotency_key or ""]),
                        },
                    ).fetchone()
                    next_id = int(found["id"])
            cur.execute(self.Q["job_chain_link"], {"id": job_id, "next_id": next_id}).fetchall()
        return next_id or None
