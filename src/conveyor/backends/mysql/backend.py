"""MySQL 8.0+ and MariaDB 10.6+: PyMySQL, SKIP LOCKED claims, polling for wake-ups.

What differs from the shared operations:

- No ``UPDATE ... RETURNING``: a claim selects its rows ``FOR UPDATE SKIP LOCKED``,
  updates them by primary key and reads them back, in one short transaction;
  finishes, releases and rescues likewise lock, update and read back.
- Deadlocks (1213) and lock wait timeouts (1205) roll the transaction back: our
  own transactions are retried whole, a bounded number of times with jitter
  (``deadlock_retries`` counts them). A caller's transaction (``conn=``) is the
  caller's to retry.
- No LISTEN/NOTIFY: a worker in the same process is woken at once at commit (an
  in-process hub); other processes notice changes by polling the change index,
  often while changes keep coming, less often when idle (``MySQLNotifier``).
- Change stamps: MySQL exposes no transaction id nor snapshot horizon, so a
  writing transaction of ours takes a number of its own first (a row of
  conveyor_change_tx, locked until it ends) and stamps its rows with it; readers
  stop at the smallest number whose row is not committed yet (``_horizon``).
- Bulk inserts: one multi-row ``INSERT IGNORE ... RETURNING`` on MariaDB; MySQL
  has no ``INSERT ... RETURNING``, so there a row per statement (ids from
  ``lastrowid``, which is exact for one row whatever innodb_autoinc_lock_mode).
"""

from __future__ import annotations

import json
import math
import secrets
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from ...records import (
    Finalize,
    Heartbeat,
    JobInsert,
    JobRecord,
    JobState,
    Lease,
    Outcome,
    RescueResult,
    WorkerInfo,
)
from ..interfaces import Notifier, sent_by
from ..sql.backend import chunks
from ..sql.loader import Migration, split_statements
from ..sql.logic import (
    KeyPair,
    QueueLimits,
    WindowSizes,
    candidate_keys,
    claim_keys,
    first_outcomes,
    limited_params,
    plain_success,
    queue_limits,
    queue_spends,
)
from .dialect import MIGRATIONS, Q
from .notifier import HUB, MySQLNotifier
from .session import RETRYABLE, MySQLSession, _code, log, parse_url

__all__ = [  # also read from here (tests): the dialect's, the notifier's, the session's
    "HUB",
    "MIGRATIONS",
    "MySQLBackend",
    "MySQLNotifier",
    "Q",
    "parse_url",
]


#: the days of finished jobs are made this far ahead (partitions, schema v22),
#: this often, and their upkeep waits this long for the table before giving up
DAYS_AHEAD = 2
DAYS_EVERY_S = 3600.0
UPKEEP_WAIT_S = 2


#: what a migration statement says when its work is already done: the table (1050),
#: column (1060), key (1061), row (1062), primary key (1068), trigger (1359),
#: procedure (1304), partition (1517) or foreign key (1826) is there, what it
#: drops is gone (1091), or the table it unpartitions is not partitioned (1505)
ALREADY_DONE = frozenset({1050, 1060, 1061, 1062, 1068, 1091, 1304, 1359, 1505, 1517, 1826})


class MySQLBackend(MySQLSession):
    name = "mysql"
    capabilities = frozenset({"skip_locked", "network"})
    where = "the MySQL database"
    Q = Q
    MIGRATIONS = MIGRATIONS

    def __init__(self, url: str) -> None:
        super().__init__(url)
        #: per keyed queue, how far past its size a claim looks (next_window_factor)
        self._windows = WindowSizes()
        #: when this process last made the days ahead (job_prune)
        self._days_made_at = -math.inf

    def _migration_lock(self, cur: Any) -> None:
        pass  # a session lock taken around the whole migration (migrate)

    def migrate(self) -> list[int]:
        # DDL commits implicitly in MySQL: a migration is not atomic with its
        # version row. A named lock keeps two migrators apart.
        with self._conn().cursor() as cur:
            cur.execute(Q["migration_lock"])
        try:
            with self._conn().cursor() as cur:
                cur.execute(Q["migration_progress_table"])
            applied = super().migrate()
            with self._conn().cursor() as cur:
                cur.execute(Q["migration_progress_clear"])
            return applied
        finally:
            with self._conn().cursor() as cur:
                cur.execute(Q["migration_unlock"])

    def _apply(self, cur: Any, migration: Migration) -> None:
        """One migration, resumed where a cut left it. MySQL's DDL commits statement
        by statement, so a migration cut off midway (the network, the server, a
        killed process) was left half done, and run again from the top it failed
        for good ("Duplicate column name 'part'"). Now each statement that leaves
        no session state behind records how far the migration got (not SET @,
        PREPARE or EXECUTE: a prepared group runs again whole, in the new session),
        and a migrator that comes back goes on from there. The statements it runs
        first may have committed before the cut, their record lost with it: until
        one of them succeeds, an error saying their work is done (the column, key,
        table, trigger, procedure, partition or row already there) is not one."""
        rows = self._q(cur, "migration_progress", {"version": migration.version})
        done = int(rows[0]["done"]) if rows else 0
        resuming = True
        for i, stmt in enumerate(split_statements(migration.sql)):
            if i < done:
                continue
            try:
                cur.execute(stmt)
            except self._driver.Error as exc:
                if not (resuming and _code(exc) in ALREADY_DONE):
                    raise
                log.warning(
                    "migration %d (%s), statement %d: already done before a cut (%s); going on",
                    migration.version,
                    migration.name,
                    i + 1,
                    exc,
                )
            if not stmt.lstrip().upper().startswith(("SET @", "PREPARE", "EXECUTE")):
                resuming = False
                self._q(
                    cur, "migration_progress_set", {"version": migration.version, "done": i + 1}
                )

    def notifier(self, *, events: bool = False) -> Notifier:
        return MySQLNotifier(
            self._connect, self.hub_key, fast=self.poll_s, error=self._driver.Error
        )

    # -- values --------------------------------------------------------------------------
    def _now(self, now: datetime | None) -> Any:
        # None: the server's clock (UTC_TIMESTAMP), as on PostgreSQL
        return None if now is None else _naive_utc(now)

    def _ts(self, value: Any) -> datetime | None:
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        return value.replace(tzinfo=UTC)  # type: ignore[no-any-return]

    def _ts_param(self, value: datetime) -> Any:
        return _naive_utc(value)

    def _list(self, values: Sequence[Any]) -> Any:
        return tuple(values) if values else (None,)

    # -- the hot paths ---------------------------------------------------------------------
    def _insert_rows(
        self, cur: Any, jobs: Sequence[JobInsert], now: Any
    ) -> list[tuple[int, KeyPair]]:
        for queue in sorted({j.queue for j in jobs if j.limited}):
            cur.execute(Q["queue_mark_keyed"], {"queue": queue, "now": now})
        out: list[tuple[int, KeyPair]] = []
        head, row = Q["job_insert_head"], Q["job_insert_row"]
        if self.mariadb:
            # MariaDB: one statement per chunk; RETURNING names the rows created
            # (inputs whose key conflicted return none), in input order.
            for chunk in chunks(jobs, 500):
                change = self._change(cur)
                values = ",\n".join(
                    cur.mogrify(row, {**j._asdict(), "now": now, "change": change}) for j in chunk
                )
                cur.execute(f"{head}\n{values}\nRETURNING id, unique_key, idempotency_key")
                out += [(r["id"], (r["unique_key"], r["idempotency_key"])) for r in cur.fetchall()]
        else:
            # MySQL: no INSERT ... RETURNING; lastrowid is exact for a one-row insert.
            for j in jobs:
                cur.execute(
                    f"{head}\n{row}", {**j._asdict(), "now": now, "change": self._change(cur)}
                )
                if cur.rowcount == 1:
                    out.append((cur.lastrowid, (j.unique_key, j.idempotency_key)))
        if out:
            self._wake(cur, sorted({j.queue for j in jobs}))
        return out

    def job_claim(
        self,
        *,
        queues: Sequence[str],
        worker_id: str,
        limit: int,
        tasks: Sequence[str] | None = None,
        tags: Sequence[str] = (),
        lease_s: float | None = None,
        schema_version: int | None = None,
        now: datetime | None = None,
    ) -> list[JobRecord]:
        if limit <= 0 or not queues:
            return []
        base = {
            "worker_id": worker_id,
            "lease_s": None if lease_s is None else float(lease_s),
            "now": self._now(now),
            "tasks": None if tasks is None else 1,
            "task_list": self._list(list(tasks or [])),
            "schema_version": schema_version if schema_version is not None else self.latest_schema,
        }
        limits = queue_limits(self._rows("queue_limits", {"queues": self._list(queues)}))
        free = [q for q in queues if q not in limits]
        rows: list[Any] = []
        if free:  # the fast path: SKIP LOCKED, no limits to respect
            rows = self._retrying(lambda: self._claim_free(free, base, limit))
        for queue in (q for q in queues if q in limits):
            if len(rows) >= limit:
                break
            room = limit - len(rows)
            lim = limits[queue]
            rows += self._retrying(
                lambda q=queue, n=room, lim=lim: self._claim_limited(q, lim, base, n, tags)  # type: ignore[misc]
            )
        jobs = [self._job(r) for r in rows]
        order = {q: i for i, q in enumerate(queues)}
        jobs.sort(key=lambda j: (order[j.queue], -j.priority, j.scheduled_at, j.id))
        return jobs

    def _take(self, cur: Any, ids: list[int], base: dict[str, Any]) -> list[Any]:
        """The picked (locked) rows become the worker's: one UPDATE by primary key,
        then read back (MySQL has no UPDATE ... RETURNING)."""
        if not ids:
            return []
        token = secrets.token_hex(16)  # a row's token: a hash of this and its id
        self._qc(cur, "job_claim_update", {**base, "ids": self._list(ids), "token": token})
        return self._q(cur, "job_get_claimed", {"ids": self._list(ids)})

    def _claim_free(self, queues: list[str], base: dict[str, Any], limit: int) -> list[Any]:
        with self._tx() as cur:
            ids: list[int] = []
            for queue in queues:
                if len(ids) >= limit:
                    break
                picked = self._q(
                    cur, "job_claim_pick", {**base, "queue": queue, "limit": limit - len(ids)}
                )
                ids += [int(r["id"]) for r in picked]
            return self._take(cur, ids, base)

    def _claim_limited(
        self, queue: str, lim: QueueLimits, base: dict[str, Any], limit: int, tags: Sequence[str]
    ) -> list[Any]:
        """One limited queue (see the PostgreSQL job_claim_limited, whose ranking this
        does in Python over the same window of candidates): under the queue's row
        lock if it has a limit of its own, and the locks of its candidates' keys
        (limits_lock_keys: those no other claim holds), released after the COMMIT."""
        factor = self._windows.factor(queue)
        qp = limited_params(queue, lim, limit, factor)
        locked = False
        try:
            with self._tx() as cur:
                if lim.queue_locked:
                    self._q(cur, "limits_lock", {"queue": queue})
                cands = self._q(
                    cur,
                    "job_claim_candidates",
                    {
                        **base,
                        "queue": queue,
                        "window": qp["window"],
                        "identity": self._list([base["worker_id"], *tags]),
                    },
                )
                keys = claim_keys(cands)
                if keys:
                    locked = True
                    held = self._q(cur, "limits_lock_keys", {"keys": json.dumps(sorted(keys))})
                    ours = {r["key"] for r in held if r["got"] == 1}
                    # candidates of keys another claim holds, or past the first
                    # KEY_LOCKS_MAX, are left to a later claim
                    cands = [c for c in cands if candidate_keys(c) <= ours]
                if not cands:
                    return []
                return self._rank_and_take(cur, queue, lim, base, limit, factor, cands)
        finally:
            if locked:
                self._unlock_keys()

    def _unlock_keys(self) -> None:
        """Release this session's key locks; a session that cannot is closed (the
        server then releases them)."""
        try:
            with self._conn().cursor() as cur:
                cur.execute(Q["limits_unlock_keys"])
        except self._driver.Error:
            self._drop()

    def _rank_and_take(
        self,
        cur: Any,
        queue: str,
        lim: QueueLimits,
        base: dict[str, Any],
        limit: int,
        factor: int,
        cands: list[Any],
    ) -> list[Any]:
        """The candidates ranked as the PostgreSQL job_claim_limited ranks them, and
        those that fit taken: under the claim's locks every count is current."""
        room = limit
        if lim.max_running is not None:
            [running] = self._q(cur, "queue_running", {"queue": queue})
            room = min(room, lim.max_running - int(running["n"]))
        keys = sorted({c["rate_key"] for c in cands if c["rate_key"]})
        bucket_keys = keys + ([f"queue={queue}"] if lim.rate_per_s is not None else [])
        stored = {
            r["key"]: (float(r["tokens"]), float(r["elapsed"]))
            for r in (
                self._q(cur, "limits_tokens", {"keys": self._list(bucket_keys), "now": base["now"]})
                if bucket_keys
                else []
            )
        }

        def tokens(key: str, rate: float, burst: float) -> float:
            if key not in stored:
                return burst
            have, elapsed = stored[key]
            return min(burst, have + elapsed * rate)

        if lim.rate_per_s is not None:
            burst = lim.rate_burst if lim.rate_burst is not None else lim.rate_per_s
            room = min(room, math.floor(tokens(f"queue={queue}", lim.rate_per_s, burst)))
        room = max(0, room)
        ckeys = sorted({c["concurrency_key"] for c in cands if c["concurrency_key"]})
        busy = (
            {
                r["concurrency_key"]: int(r["n"])
                for r in self._q(cur, "limits_busy", {"keys": self._list(ckeys)})
            }
            if ckeys
            else {}
        )
        rates: dict[str, tuple[float, float]] = {}
        for c in cands:
            if c["rate_key"]:
                rate, burst = rates.get(c["rate_key"], (0.0, 0.0))
                rates[c["rate_key"]] = (
                    max(rate, float(c["rate_per_s"] or 0)),
                    max(burst, float(c["rate_burst"] or 0)),
                )
        allowance = {k: math.floor(tokens(k, r, b)) for k, (r, b) in rates.items()}
        seen_c: dict[str, int] = {}
        seen_r: dict[str, int] = {}
        seen_s: dict[str, int] = {}
        picked: list[int] = []
        for c in cands:  # in claim order already
            ck, rk, sg = c["concurrency_key"], c["rate_key"], c["spread_group"]
            rn = seen_c[ck] = seen_c.get(ck, 0) + 1 if ck else 0
            rate_rn = seen_r[rk] = seen_r.get(rk, 0) + 1 if rk else 0
            spread_rn = seen_s[sg] = seen_s.get(sg, 0) + 1 if sg else 0
            if ck and rn + busy.get(ck, 0) > (c["concurrency_limit"] or 0):
                continue
            if rk and rate_rn > allowance[rk]:
                continue
            if sg and spread_rn != 1:  # one per group per claim
                continue
            if len(picked) < room:
                picked.append(int(c["id"]))
        rows = self._take(cur, picked, base)
        self._windows.update(queue, factor, limit, len(rows))
        for spend in queue_spends(queue, lim, rows):
            self._qc(cur, "rate_spend", {**spend, "now": base["now"]})
        return rows

    def job_finalize_many(
        self, *, worker_id: str, outcomes: Sequence[Finalize], now: datetime | None = None
    ) -> list[int]:
        if not outcomes:
            return []
        firsts = first_outcomes(outcomes)
        return self._retrying(lambda: self._finalize(worker_id, firsts, self._now(now)))

    def _finalize(self, worker_id: str, outcomes: Sequence[Finalize], ts: Any) -> list[int]:
        accepted: list[int] = []
        with self._tx() as cur:
            held = {
                int(r["id"]): r
                for r in self._q(
                    cur,
                    "job_finalize_pick",
                    {
                        "ids": self._list([o.job_id for o in outcomes]),
                        "tokens": self._list([o.token for o in outcomes]),
                    },
                )
            }
            mine = [
                o
                for o in sorted(outcomes, key=lambda o: o.job_id)
                if o.job_id in held and held[o.job_id]["lease_token"] == o.token
            ]
            plain = [o for o in mine if plain_success(o)]
            if plain:  # one statement for the common case
                self._qc(cur, "job_succeed_many", _successes(plain, worker_id, ts, self._list))
                accepted += [o.job_id for o in plain]
            for o in mine:
                if plain_success(o):
                    continue
                params = {**o._asdict(), "id": o.job_id, "now": ts, "worker_id": worker_id}
                if self._qc(cur, "job_finalize_one", params):
                    accepted.append(o.job_id)
            if not accepted:
                return []
            # a plain success not cancelled meanwhile is succeeded: no need to read it
            # back (by id alone, across every finished partition)
            known = {o.job_id for o in plain if not held[o.job_id]["cancel_requested"]}
            after: dict[int, Any] = {
                i: {"state": JobState.SUCCEEDED, "queue": held[i]["queue"]} for i in known
            }
            if len(known) < len(accepted):
                unknown = [i for i in accepted if i not in known]
                after |= {
                    int(r["id"]): r
                    for r in self._q(cur, "job_finalized", {"ids": self._list(unknown)})
                }
            hints: set[str] = set()
            for o in mine:
                if o.job_id not in after:
                    continue
                row, before = after[o.job_id], held[o.job_id]
                if row["state"] == JobState.AVAILABLE:
                    hints.add(sent_by(row["queue"], worker_id))
                elif row["state"] in (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED):
                    hints.add("@done")
                    if before["flow"]:
                        hints.add("@flow")
                if row["state"] == JobState.SUCCEEDED:
                    continue  # the job row is its attempt's record (schema v12)
                overruled = row["state"] == JobState.CANCELLED and o.state != JobState.CANCELLED
                self._qc(
                    cur,
                    "attempt_insert",
                    {
                        "job_id": o.job_id,
                        "attempt": o.ran_attempt or before["attempt"],
                        "stage": o.ran_stage,
                        "worker_id": worker_id,
                        "started_at": before["started_at"],
                        "now": ts,
                        "outcome": Outcome.CANCELLED if overruled else o.outcome,
                        "error": row["error"] if overruled else o.error,
                        "traceback": o.traceback,
                    },
                )
            if hints:
                self._wake(cur, sorted(hints))
        return accepted

    def job_release_many(
        self, *, worker_id: str, leases: Sequence[Lease], now: datetime | None = None
    ) -> list[int]:
        if not leases:
            return []
        ts = self._now(now)

        def run() -> list[int]:
            released: list[int] = []
            with self._tx() as cur:
                rows = self._q(
                    cur,
                    "job_release_pick",
                    {
                        "ids": self._list([le.job_id for le in leases]),
                        "tokens": self._list([le.token for le in leases]),
                    },
                )
                tokens = {le.job_id: le.token for le in leases}
                for r in rows:
                    jid = int(r["id"])
                    if not self._qc(cur, "job_release_one", {"id": jid, "token": tokens[jid]}):
                        continue
                    self._qc(
                        cur,
                        "attempt_insert",
                        {
                            "job_id": jid,
                            "attempt": r["ran"],
                            "stage": r["stage"],
                            "worker_id": worker_id,
                            "started_at": r["started_at"],
                            "now": ts,
                            "outcome": Outcome.RELEASED,
                            "error": "released by its worker; the attempt does not count",
                            "traceback": None,
                        },
                    )
                    released.append(jid)
                if rows:
                    self._wake(cur, sorted({r["queue"] for r in rows}))
            return released

        return self._retrying(run)

    def worker_heartbeat(self, *, worker: WorkerInfo, now: datetime | None = None) -> Heartbeat:
        ts = self._now(now)

        def run() -> Heartbeat:
            with self._tx() as cur:
                self._qc(
                    cur,
                    "worker_upsert",
                    {
                        "id": worker.id,
                        "hostname": worker.hostname,
                        "pid": worker.pid,
                        "queues": json.dumps(list(worker.queues)),
                        "concurrency": worker.concurrency,
                        "tags": json.dumps(list(worker.tags)),
                        "tasks": None if worker.tasks is None else json.dumps(sorted(worker.tasks)),
                        "now": ts,
                    },
                )
                [me] = self._q(cur, "worker_get", {"id": worker.id})
                held = self._q(cur, "job_held", {"id": worker.id})
                version = self._q(cur, "schema_version")[0]["version"]
            return Heartbeat(
                held={int(r["id"]): str(r["lease_token"]) for r in held},
                cancel=[int(r["id"]) for r in held if r["cancel_requested"]],
                stop=bool(me["stop_requested"]),
                schema_version=int(version),
                resurrected=bool(me["inserted"]),
            )

        return self._retrying(run)

    def job_rescue(
        self, *, worker_ttl_s: float, limit: int = 1000, now: datetime | None = None
    ) -> RescueResult:
        ts = self._now(now)

        def run() -> RescueResult:
            with self._tx() as cur:
                expired = self._q(
                    cur,
                    "job_expired_leases",
                    {"now": ts, "limit": limit, "worker_ttl_s": float(worker_ttl_s)},
                )
                moved = [
                    e
                    for e in expired
                    if self._qc(cur, "job_rescue_one", {"id": e["id"], "now": ts, "why": e["why"]})
                ]
                if not moved:
                    return RescueResult(requeued=[], failed=[])
                rows = {
                    int(r["id"]): r
                    for r in self._q(
                        cur, "job_rescued", {"ids": self._list([e["id"] for e in moved])}
                    )
                }
                requeued: list[int] = []
                failed: list[int] = []
                hints: set[str] = set()
                for e in moved:
                    row = rows[int(e["id"])]
                    self._qc(
                        cur,
                        "attempt_insert",
                        {
                            "job_id": row["id"],
                            "attempt": row["attempt"],
                            "stage": row["stage"],
                            "worker_id": e["lease_owner"],
                            "started_at": e["started_at"],
                            "now": ts,
                            "outcome": Outcome.LOST,
                            "error": row["error"],
                            "traceback": None,
                        },
                    )
                    if row["state"] == JobState.FAILED:
                        failed.append(int(row["id"]))
                        hints.add("@done")
                        if row["flow"]:
                            hints.add("@flow")
                    else:
                        requeued.append(int(row["id"]))
                        hints.add(row["queue"])
                self._wake(cur, sorted(hints))
            return RescueResult(requeued=requeued, failed=failed)

        return self._retrying(run)

    def job_schedule_due(self, *, limit: int = 1000, now: datetime | None = None) -> int:
        ts = self._now(now)

        def run() -> int:
            with self._tx() as cur:
                rows = self._q(cur, "job_schedule_pick", {"limit": limit, "now": ts})
                if rows:
                    ids = self._list([r["id"] for r in rows])
                    self._qc(cur, "job_schedule_ids", {"ids": ids, "now": ts})
                    self._wake(cur, sorted({r["queue"] for r in rows}))
            return len(rows)

        return self._retrying(run)

    def job_age_priorities(
        self,
        *,
        aging_s: float,
        max_boost: int,
        limit: int = 1000,
        window_s: float | None = None,
        now: datetime | None = None,
    ) -> int:
        params = self._age_params(aging_s, max_boost, limit, window_s, now)

        def run() -> int:
            with self._tx() as cur:
                rows = self._q(cur, "job_age_pick", params)
                for r in rows:
                    self._qc(
                        cur,
                        "job_age_one",
                        {"id": r["id"], "base": r["base"], "target": int(r["target"])},
                    )
            return len(rows)

        return self._retrying(run)

    def job_prune(
        self,
        *,
        state: str,
        older_than_s: float,
        limit: int = 1000,
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> int:
        """Whole days of finished jobs first (dropped partitions, schema v22), then
        row by row what is left: the day that straddles the cutoff, the jobs in a
        state's catch-all partition, and a day kept for an open batch."""
        gone = 0
        if not dry_run:
            if time.monotonic() - self._days_made_at > DAYS_EVERY_S:
                self._partition_upkeep("job_add_days", {"ahead": DAYS_AHEAD})
                self._days_made_at = time.monotonic()
            gone = self._partition_upkeep(
                "job_drop_days",
                {"state": str(state), "older_than_s": float(older_than_s), "now": self._now(now)},
            )
        return gone + super().job_prune(  # (retried through the hook: SqlBackend's)
            state=state, older_than_s=older_than_s, limit=limit, dry_run=dry_run, now=now
        )

    def _partition_upkeep(self, name: str, params: dict[str, Any]) -> int:
        """A partition-keeping procedure, which gives up rather than wait long:
        its ALTERs take the table's metadata lock, and every statement on the
        table queues behind them. Skipped now, done at a later pass. Returns how
        many jobs went (job_drop_days)."""
        conn = self._conn()
        try:
            with conn.cursor() as cur:
                cur.execute(Q["upkeep_wait"], {"wait_s": UPKEEP_WAIT_S})
                try:
                    cur.execute(Q[name], params)
                    cur.execute(Q["job_days_result"])
                    row = cur.fetchone()
                finally:
                    cur.execute(Q["upkeep_wait_default"])
            conn.commit()
        except self._driver.OperationalError as exc:
            if _code(exc) not in RETRYABLE:
                raise self._fail(exc) from exc
            log.info("%s skipped this time: %s", name, exc)
            return 0
        return int(row["gone"] or 0) if row else 0

    def counts_fold(self) -> None:
        self._fold("counts")
        self._fold("batch_counts")  # the batches' rollup (schema v16)
        # The leader's pass also forgets change numbers no reader needs any more.
        self._count("change_prune", {"horizon": self._horizon()})

    def _fold(self, rollup: str) -> None:
        """Fold the deltas the triggers appended into their rollup, 10,000 at a
        time, in the database (see counts_fold_high)."""

        def run() -> int:
            with self._tx() as cur:
                [row] = self._q(cur, f"{rollup}_fold_high")
                if row["high"] is None:
                    return 0
                high = {"high": int(row["high"])}
                [locked] = self._q(cur, f"{rollup}_fold_lock", high)
                self._qc(cur, f"{rollup}_fold_add", high)
                self._qc(cur, f"{rollup}_fold_delete", high)
            return int(locked["n"])

        while self._retrying(run) >= 10000:
            pass


def _naive_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        return value
    return value.astimezone(UTC).replace(tzinfo=None)


def _successes(plain: Sequence[Finalize], worker_id: str, ts: Any, as_list: Any) -> dict[str, Any]:
    """job_succeed_many's parameters: the results by id, or the one result all share."""
    first = plain[0].result_json
    uniform = all(o.result_json == first for o in plain)
    results = (
        {}
        if uniform
        else {str(o.job_id): json.loads(o.result_json) for o in plain if o.result_json}
    )
    return {
        "ids": as_list([o.job_id for o in plain]),
        "uniform": uniform,
        "result_json": first if uniform else None,
        "results": json.dumps(results),
        "worker_id": worker_id,
        "now": ts,
    }
