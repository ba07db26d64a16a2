"""Decisions the backends make the same way whatever the dialect (no SQL here)."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from ...encoding import stored_fingerprint
from ...errors import KeyReused, SchemaTooNew
from ...records import (
    ACTIVE_STATES,
    BatchRecord,
    BatchState,
    Finalize,
    Inserted,
    JobInsert,
    JobState,
    Outcome,
)
from .loader import Migration

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
#: the existing jobs behind keys: (id, unique key, idempotency key, task, call
#: fingerprint or None)
FindFn = Callable[[list[str], list[str]], list[tuple[int, str | None, str | None, str, str | None]]]


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
        by_idem = {ik: (jid, task, fp) for jid, _, ik, task, fp in found if ik}
        by_unique = {uk: jid for jid, uk, _, _, _ in found if uk}
        pending = []
        for i in missing:
            job = jobs[i]
            named = by_idem.get(job.idempotency_key or "")
            if named is not None:
                check_same_call(job, named, i, results)
            existing = named[0] if named else by_unique.get(job.unique_key or "")
            if existing is None:
                pending.append(i)
            else:
                results[i] = Inserted(existing, False)
        if not pending:
            break
    else:
        raise RuntimeError("unique-key insert kept racing with jobs finishing; giving up")
    return [r for r in results if r is not None]


def check_same_call(
    job: JobInsert,
    named: tuple[int, str, str | None],
    index: int,
    results: Sequence[Inserted | None],
) -> None:
    """``KeyReused`` (in the transaction that would have written ``job``, so it
    writes nothing) when the job its idempotency key named was made by a
    different call: both fingerprinted, and their fingerprints differ. A job made
    without one (an older version, an internal job) is the key's answer.
    ``results``: the jobs written so far with ``job`` (another of them may be
    the one its key named)."""
    job_id, task, theirs = named
    if theirs is None:
        return
    mine = stored_fingerprint(job.args_json)
    if mine is not None and mine != theirs:
        made = f"job {job_id}, task {task!r}"
        for n, r in enumerate(results):
            if r is not None and r.created and r.id == job_id:
                made = f"jobs[{n}] of the same call"
        raise KeyReused(job.idempotency_key or "", made, index=index)


def check_schema(current: int, migrations: Sequence[Migration], where: str) -> list[Migration]:
    """Migrations still to apply; refuses a database newer than this code."""
    latest = migrations[-1].version if migrations else 0
    if current > latest:
        raise SchemaTooNew(
            f"{where} has schema version {current}, but this Conveyor only knows up to "
            f"version {latest}: upgrade the conveyor package instead of migrating down"
        )
    return [m for m in migrations if m.version > current]


def close_state(counts: dict[str, int], *, cancelled: bool) -> BatchState | None:
    """The state a batch closes in, or ``None`` while it still has work to do."""
    if any(counts.get(s, 0) for s in ACTIVE_STATES):
        return None
    if cancelled:
        return BatchState.CANCELLED
    if counts.get(JobState.FAILED, 0) or counts.get(JobState.CANCELLED, 0):
        return BatchState.COMPLETED_WITH_FAILURES
    return BatchState.SUCCEEDED


def callback_insert(batch: BatchRecord) -> JobInsert | None:
    """The ``on_complete`` job of a just-closed batch: ``callback(batch_id, counts)``.
    Its idempotency key names the batch and the closing, so however many
    aggregators try, each closing enqueues it once."""
    if batch.on_complete is None or batch.state == BatchState.CANCELLED:
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


class QueueLimits(NamedTuple):
    """What a limited queue's claims must respect (from conveyor_queues)."""

    max_running: int | None
    rate_per_s: float | None
    rate_burst: float | None
    keyed: bool = False  # jobs with a concurrency or rate key have been sent to it

    @property
    def queue_locked(self) -> bool:
        """Claims take the queue's lock: it has a limit of its own (a keyed claim
        locks its keys instead)."""
        return self.max_running is not None or self.rate_per_s is not None

    @property
    def spend(self) -> dict[str, Any] | None:
        return (
            None if self.rate_per_s is None else {"rate": self.rate_per_s, "burst": self.rate_burst}
        )


def queue_limits(rows: Sequence[dict[str, Any]]) -> dict[str, QueueLimits]:
    """Queues whose claims must go through the limit-aware path, with their limits."""
    return {
        r["name"]: QueueLimits(r["max_running"], r["rate_per_s"], r["rate_burst"], bool(r["keyed"]))
        for r in rows
        if r["keyed"] or r["max_running"] is not None or r["rate_per_s"] is not None
    }


#: how far past the claim's size a keyed claim looks: 10x at first, halving while
#: claims come back full (down to 1x: keys that do not bind cost no wider window
#: to lock and rank), doubling again after one comes back short
WINDOW_MIN, WINDOW_MAX = 1, 10


def next_window_factor(factor: int, asked: int, got: int) -> int:
    """The window factor for a queue's next keyed claim, from how its last went."""
    if got < asked:
        return min(WINDOW_MAX, factor * 2)
    return max(WINDOW_MIN, factor // 2)


class WindowSizes:
    """Per keyed queue, the window factor its next claim uses (one per backend
    instance: each worker process learns its own)."""

    def __init__(self) -> None:
        self._factor: dict[str, int] = {}

    def factor(self, queue: str) -> int:
        return self._factor.get(queue, WINDOW_MAX)

    def update(self, queue: str, factor: int, asked: int, got: int) -> None:
        self._factor[queue] = next_window_factor(factor, asked, got)


#: The most keys one limited claim locks (the server's lock table is shared by
#: the cluster); candidates of further keys are left to a later claim.
KEY_LOCKS_MAX = 128


def limited_params(
    queue: str, limits: QueueLimits, limit: int, window_factor: int = WINDOW_MAX
) -> dict[str, Any]:
    return {
        "queue": queue,
        "max_running": limits.max_running,
        # Keyed candidates may be skipped (their key is full): look further ahead.
        # Without keys every candidate fits, so the window is the claim's size.
        # Every candidate in the window is locked and ranked, so a wide window costs
        # (with 1,000 keys that rarely bind, 10x spent 1 of a claim's 6 ms locking).
        "window": max(100, window_factor * limit) if limits.keyed else limit,
        "queue_rate": limits.rate_per_s,
        "queue_burst": limits.rate_burst,
        "key_locks": KEY_LOCKS_MAX,
    }


def candidate_keys(cand: dict[str, Any]) -> set[str]:
    """The keys a candidate of a limited claim counts against (concurrency, rate)."""
    return {k for k in (cand["concurrency_key"], cand["rate_key"]) if k}


def claim_keys(cands: Sequence[dict[str, Any]]) -> set[str]:
    """The keys a limited claim locks: the first KEY_LOCKS_MAX of its candidates'
    keys, in claim order."""
    keys: dict[str, None] = {}
    for cand in cands:
        for key in (cand["concurrency_key"], cand["rate_key"]):
            if key and key not in keys:
                if len(keys) == KEY_LOCKS_MAX:
                    return set(keys)
                keys[key] = None
    return set(keys)


def queue_spends(
    queue: str, limits: QueueLimits, claimed: Sequence[dict[str, Any]], count: int | None = None
) -> list[dict[str, Any]]:
    """Every bucket a limited claim spends from: the keys' and the queue's own.
    ``claimed``: the jobs claimed, or (with ``count``, how many were) those of
    them with a rate key."""
    spends = rate_spending(claimed)
    taken = len(claimed) if count is None else count
    if taken and limits.spend:
        spends.append({**limits.spend, "key": f"queue={queue}", "taken": taken})
    return spends


def plain_success(o: Finalize) -> bool:
    """A success that changes nothing but the state, result and lease: the common
    outcome, which the dialects that finish jobs row by row write in one statement."""
    return (
        o.state == JobState.SUCCEEDED
        and o.outcome == Outcome.SUCCEEDED
        and o.error is None
        and o.traceback is None
        and o.retry_in_s is None
        and o.next_stage is None
        and o.context_json is None
        and o.priority is None
        and o.max_attempts is None
    )


def first_outcomes(outcomes: Sequence[Finalize]) -> Sequence[Finalize]:
    """The outcomes with a job named twice kept at its first: every dialect then
    records that one and answers the job once (a set-based UPDATE would otherwise
    apply either of the two)."""
    if len({o.job_id for o in outcomes}) == len(outcomes):
        return outcomes
    firsts: dict[int, Finalize] = {}
    for o in outcomes:
        firsts.setdefault(o.job_id, o)
    return list(firsts.values())
