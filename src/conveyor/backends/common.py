"""Dialect-independent helpers the backends share (no SQL here)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, NamedTuple

from ..errors import SchemaError
from ..job import Attempt, Job, JobState
from .base import BatchRecord, Heartbeat, Inserted, JobInsert
from .sqlfiles import Migration

KeyPair = tuple[str | None, str | None]


def match_inserted(
    jobs: Sequence[JobInsert], created: Sequence[tuple[int, KeyPair]]
) -> list[int | None]:
    """Map rows an INSERT .. ON CONFLICT DO NOTHING returned back to its inputs.

    ``created`` is (id, (unique_key, idempotency_key)) per inserted row. Ids grow in
    input order, and only keyed inputs can be skipped, so one ordered walk pairs
    them; ``None`` marks an input whose key named an existing job.
    """
    rows = sorted(created)
    out: list[int | None] = []
    pos = 0
    for job in jobs:
        keys = (job.unique_key, job.idempotency_key)
        if pos < len(rows) and (keys == (None, None) or rows[pos][1] == keys):
            out.append(rows[pos][0])
            pos += 1
        else:
            out.append(None)
    return out


InsertFn = Callable[[Sequence[JobInsert]], list[tuple[int, KeyPair]]]
FindFn = Callable[[list[str], list[str]], list[tuple[int, str | None, str | None]]]


def insert_resolving(jobs: Sequence[JobInsert], insert: InsertFn, find: FindFn) -> list[Inserted]:
    """Insert jobs, then name the existing job behind every key that conflicted.

    Runs inside one transaction. If a conflicting unique-key job finished between
    the insert and the lookup, only those inputs are inserted again and the index
    decides again; nothing is ever decided by reading first.
    """
    results: list[Inserted | None] = [None] * len(jobs)
    pending = list(range(len(jobs)))
    for _ in range(10):
        subset = [jobs[i] for i in pending]
        ids = match_inserted(subset, insert(subset))
        missing = []
        for i, jid in zip(pending, ids, strict=True):
            if jid is None:
                missing.append(i)
            else:
                results[i] = Inserted(jid, True)
        if not missing:
            break
        found = find(
            [k for i in missing if (k := jobs[i].unique_key)],
            [k for i in missing if (k := jobs[i].idempotency_key)],
        )
        by_idem = {ik: jid for jid, _, ik in found if ik}
        by_unique = {uk: jid for jid, uk, _ in found if uk}
        pending = []
        for i in missing:
            job = jobs[i]
            existing = by_idem.get(job.idempotency_key or "") or by_unique.get(job.unique_key or "")
            if existing is None:
                pending.append(i)
            else:
                results[i] = Inserted(existing, False)
        if not pending:
            break
    else:
        raise RuntimeError("unique-key insert kept racing with jobs finishing; giving up")
    return [r for r in results if r is not None]


def check_schema(current: int, migrations: Sequence[Migration], where: str) -> list[Migration]:
    """Migrations still to apply; refuses a database newer than this code."""
    latest = migrations[-1].version if migrations else 0
    if current > latest:
        raise SchemaError(
            f"{where} has schema version {current}, but this Conveyor only knows up to "
            f"version {latest}: upgrade the conveyor package instead of migrating down"
        )
    return [m for m in migrations if m.version > current]


def job_from_row(
    row: dict[str, Any], ts: Callable[[Any], datetime | None], loads: Callable[[Any], Any]
) -> Job:
    """``ts`` and ``loads`` convert the dialect's timestamps and JSON columns (psycopg
    hands back decoded JSON, sqlite3 hands back text)."""
    args = loads(row["args"]) or {}
    return Job(
        id=row["id"],
        queue=row["queue"],
        task=row["task"],
        args=list(args.get("args", [])),
        kwargs=dict(args.get("kwargs", {})),
        state=JobState(row["state"]),
        priority=row["priority"],
        attempts=row["attempt"],
        max_attempts=row["max_attempts"],
        created_at=ts(row["created_at"]) or datetime.now(UTC),
        scheduled_at=ts(row["scheduled_at"]) or datetime.now(UTC),
        started_at=ts(row["started_at"]),
        finished_at=ts(row["finished_at"]),
        result=loads(row["result"]) if row["result"] is not None else None,
        error=row["error"],
        stage=row["stage"],
        timeout=row["timeout_s"],
        backoff=loads(row["backoff"]) if row["backoff"] is not None else None,
        unique_key=row["unique_key"],
        idempotency_key=row["idempotency_key"],
        lease_owner=row["lease_owner"],
        lease_token=row["lease_token"],
        lease_expires_at=ts(row["lease_expires_at"]),
        batch_id=row.get("batch_id"),
        context=loads(row["context"]) if row.get("context") is not None else None,
        chain_root=row.get("chain_root"),
        chain_next=row.get("chain_next"),
        chain=loads(row["chain"]) if row.get("chain") is not None else None,
    )


def attempt_from_row(row: dict[str, Any], ts: Callable[[Any], datetime | None]) -> Attempt:
    return Attempt(
        job_id=row["job_id"],
        attempt=row["attempt"],
        worker_id=row["worker_id"],
        started_at=ts(row["started_at"]),
        finished_at=ts(row["finished_at"]) or datetime.now(UTC),
        outcome=row["outcome"],
        stage=row.get("stage"),
        error=row["error"],
        traceback=row["traceback"],
    )


def batch_from_row(
    row: dict[str, Any], ts: Callable[[Any], datetime | None], loads: Callable[[Any], Any]
) -> BatchRecord:
    return BatchRecord(
        id=row["id"],
        name=row["name"],
        task=row["task"],
        total=row["total"],
        state=row["state"],
        idempotency_key=row["idempotency_key"],
        on_complete=loads(row["on_complete"]) if row["on_complete"] is not None else None,
        closings=row["closings"],
        counts=loads(row["counts"]) if row["counts"] is not None else None,
        created_at=ts(row["created_at"]) or datetime.now(UTC),
        finished_at=ts(row["finished_at"]),
        cancelled_at=ts(row["cancelled_at"]),
    )


def close_state(counts: dict[str, int], *, cancelled: bool) -> str | None:
    """The state a batch closes in, or ``None`` while it still has work to do."""
    if any(counts.get(s, 0) for s in ("scheduled", "available", "running")):
        return None
    if cancelled:
        return "cancelled"
    if counts.get("failed", 0) or counts.get("cancelled", 0):
        return "completed_with_failures"
    return "succeeded"


def callback_insert(batch: BatchRecord) -> JobInsert | None:
    """The ``on_complete`` job of a just-closed batch: ``callback(batch_id, counts)``.
    Its idempotency key names the batch and the closing, so however many
    aggregators try, each closing enqueues it once."""
    if batch.on_complete is None or batch.state == "cancelled":
        return None
    template = JobInsert(**batch.on_complete)
    args = json.dumps({"args": [batch.id, batch.counts or {}], "kwargs": {}})
    key = f"conveyor:batch:{batch.id}:close:{batch.closings}"
    return template._replace(args_json=args, idempotency_key=key, unique_key=None)


def rate_spending(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tokens the jobs just claimed take from their buckets: one entry per key."""
    spend: dict[str, dict[str, Any]] = {}
    for r in rows:
        key = r.get("rate_key")
        if key:
            entry = spend.setdefault(
                key, {"key": key, "taken": 0, "rate": r["rate_per_s"], "burst": r["rate_burst"]}
            )
            entry["taken"] += 1
    return list(spend.values())


def needs_limits(job: JobInsert) -> bool:
    """Jobs the fast claim path leaves to the serialized, limit-aware one: keyed,
    rate-limited, pinned or spread jobs."""
    return bool(job.concurrency_key or job.rate_key or job.pinned_to or job.spread_group)


class QueueLimits(NamedTuple):
    """What a limited queue's claims must respect (from conveyor_queues)."""

    max_running: int | None
    rate_per_s: float | None
    rate_burst: float | None

    @property
    def spend(self) -> dict[str, Any] | None:
        return (
            None if self.rate_per_s is None else {"rate": self.rate_per_s, "burst": self.rate_burst}
        )


def queue_limits(rows: Sequence[dict[str, Any]]) -> dict[str, QueueLimits]:
    """Queues whose claims must go through the limit-aware path, with their limits."""
    return {
        r["name"]: QueueLimits(r["max_running"], r["rate_per_s"], r["rate_burst"])
        for r in rows
        if r["keyed"] or r["max_running"] is not None or r["rate_per_s"] is not None
    }


def limited_params(queue: str, limits: QueueLimits, limit: int) -> dict[str, Any]:
    return {
        "queue": queue,
        "max_running": limits.max_running,
        "window": max(100, 10 * limit),
        "queue_rate": limits.rate_per_s,
        "queue_burst": limits.rate_burst,
    }


def heartbeat_result(worker_row: dict[str, Any], lease_rows: Sequence[dict[str, Any]]) -> Heartbeat:
    """What a heartbeat learned: leases still held, cancels requested, stop asked."""
    return Heartbeat(
        held=[r["id"] for r in lease_rows],
        cancel=[r["id"] for r in lease_rows if r["cancel_requested"]],
        stop=bool(worker_row["stop_requested"]),
    )
