"""PostgreSQL: psycopg 3 with a connection pool, SKIP LOCKED claims, LISTEN/NOTIFY.

What differs from the shared operations: the hot paths run a whole batch in one
statement with arrays and RETURNING (in autocommit, so one round trip), and
inserts, finishes and rescues send NOTIFY in the same statement.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import re
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import psycopg
import psycopg.sql
from psycopg.rows import tuple_row

from ...records import (
    Finalize,
    Heartbeat,
    Inserted,
    JobInsert,
    JobRecord,
    JobState,
    Lease,
    RescueResult,
    WorkerInfo,
)
from ..interfaces import Notifier
from ..sql.logic import (
    KeyPair,
    QueueLimits,
    WindowSizes,
    first_outcomes,
    limited_params,
    queue_limits,
    queue_spends,
)
from .dialect import (
    _PARAM,
    CHANNEL,
    CLAIM_LIMITED_FUNCTION,
    EVENTS,
    KEYLESS_INSERT,
    MIGRATIONS,
    QUEUE_LIMITED_CLAIM,
    Q,
    plpgsql,
)
from .notifier import PostgresNotifier, PostgresPollingNotifier
from .session import (
    _MOVED,
    _SQLSTATE,
    PostgresSession,
    _connect_error,
    _result_rows,
    _send_error,
    _text_params,
    _translated,
    redact,
)

__all__ = [  # also read from here (tests, benchmarks): the dialect's and the session's
    "CHANNEL",
    "CLAIM_LIMITED_FUNCTION",
    "EVENTS",
    "KEYLESS_INSERT",
    "MIGRATIONS",
    "QUEUE_LIMITED_CLAIM",
    "PostgresBackend",
    "PostgresNotifier",
    "PostgresPollingNotifier",
    "Q",
    "plpgsql",
]

log = logging.getLogger("conveyor.postgres")
T = TypeVar("T")


def _positional(sql: str) -> tuple[tuple[str, ...], bytes]:
    """A statement's ``%(name)s`` parameters as libpq's ``$1``, ``$2``...: their
    names in that order, and the statement (see PostgresBackend._send_one)."""
    names: list[str] = []

    def number(m: re.Match[str]) -> str:
        if m.group(0).endswith("b"):
            raise ValueError(f"a binary parameter in a statement sent as text: {m.group(0)}")
        if m.group(1) not in names:
            names.append(m.group(1))
        return f"${names.index(m.group(1)) + 1}"

    made = _PARAM.sub(number, sql)
    if "%" in made:  # libpq takes the text as it is: a %% would reach the server
        raise ValueError(f"a % left in a statement sent as it is: {made!r}")
    return tuple(names), made.encode()


#: A plain send's statement, prepared once on each connection under this name
_SEND = b"conveyor_send_one"
_SEND_NAMES, _SEND_SQL = _positional(Q["job_insert_one"])
_TUPLES_OK = psycopg.pq.ExecStatus.TUPLES_OK
#: the server does not know the statement (DEALLOCATE ALL, a pooler's other session)
_NOT_PREPARED = b"26000"

#: the days of finished jobs are made this far ahead (partitions), this often
DAYS_AHEAD = 2
DAYS_EVERY_S = 3600.0
#: jobs without keys or limits written in one transaction go by COPY from this many
#: (fewer: one INSERT, a round trip less)
COPY_MIN = 200
#: a list of jobs goes to COPY in slices of this many rows: the server writes each
#: while the next is formatted (one slice of 20,000 left it idle until all were)
COPY_SLICE = 500


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
    "tenant": "tenant",
    "explicit": "explicit",
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
    "max_attempts",
)
_INSERT_INDEX = {f: JobInsert._fields.index(f) for f in _INSERT_COLUMNS}
_FINALIZE_INDEX = {f: Finalize._fields.index(f) for f in _FINALIZE_COLUMNS}


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
        "events": EVENTS,
    }
    for name in _FINALIZE_COLUMNS:
        values = columns[_FINALIZE_INDEX[name]]
        _spread(params, name, _floats(values) if name == "retry_in_s" else values)
    return params


def _copy_text(value: str) -> str:
    """A text field of COPY's text format (backslash is its escape character)."""
    escaped = value.replace("\\", "\\\\").replace("\t", "\\t")
    return escaped.replace("\n", "\\n").replace("\r", "\\r")


def _copy_field(value: Any) -> str:
    if value is None:
        return "\\N"
    if isinstance(value, str):
        return _copy_text(value)
    if isinstance(value, float):
        return repr(value)
    return str(int(value))


class _CopyRows:
    """Jobs as the text rows of the ``job_copy`` statement (``job_copy_now`` with
    ``starts_now``: no times and no change stamp, their column defaults fill them
    in; a job with a delay among them is noted in ``delayed``). Jobs sent
    together differ only in their arguments, so the rest of a row is formatted
    once per run of equal jobs (``JobInsert.but_args``)."""

    def __init__(self, now: datetime, change: Any, *, starts_now: bool = False) -> None:
        self.now, self.change, self.starts_now = now, change, starts_now
        self.count = 0
        self.woken: set[str] = set()
        #: with starts_now: (row number, delay) of each job that does not start now
        self.delayed: list[tuple[int, float]] = []
        self._shared: tuple[Any, ...] = ()
        self._tail = ""
        self._delay = 0.0

    def format(self, jobs: Sequence[JobInsert]) -> str:
        out = []
        for n, job in enumerate(jobs, self.count):
            shared = job.but_args()
            if shared != self._shared:
                self._shared, self._tail = shared, self._row_tail(job)
            if self._delay:
                self.delayed.append((n, self._delay))
            out.append(_copy_text(job.args_json) + self._tail)
        self.count += len(jobs)
        return "".join(out)

    def _row_tail(self, job: JobInsert) -> str:
        if job.unique_key or job.idempotency_key or job.limited:
            raise ValueError(
                "job_insert_stream takes jobs without keys or limits; "
                "job_insert_many resolves those"
            )
        delay = float(job.delay_s or 0.0)
        if delay <= 0:
            self.woken.add(job.queue)
        self._delay = delay if self.starts_now and delay > 0 else 0.0
        fields: tuple[Any, ...] = (
            job.queue,
            job.task,
            "scheduled" if delay > 0 else "available",
            job.priority,
            job.max_attempts,
            None if job.timeout_s is None else float(job.timeout_s),
            job.backoff_json,
            job.batch_id,
            job.stage,
            job.context_json,
            job.chain_json,
            job.chain_root,
            job.tenant,
            job.explicit,
        )
        if not self.starts_now:
            fields += (
                self.now.isoformat(),
                (self.now + timedelta(seconds=delay)).isoformat(),
                str(self.change),
            )
        return "\t" + "\t".join(_copy_field(v) for v in fields) + "\n"


class PostgresBackend(PostgresSession):
    """PostgreSQL, at a libpq URL, with Conveyor's own options in its query:

    ``pooler=transaction``: a pooler lends the server sessions out a transaction at
    a time (PgBouncer's ``pool_mode = transaction``, whatever its version; managed
    poolers alike). Nothing then relies on a session across transactions: no
    prepared statements (psycopg's ``prepare_threshold=None``, a lone send through
    psycopg's unprepared path), the limited claim statement by statement in one
    transaction instead of a function in ``pg_temp``, no session settings (set
    ``jit = off`` on the role; PgBouncer's ``idle_transaction_timeout`` stands in
    for ``idle_in_transaction_session_timeout``), and no LISTEN through the
    pooler: wake-ups by a session of their own at ``listen_url``, else by polling
    the change stamps every 50-200 ms (new and re-queued work; a waiter for a
    finished job sees it at its own poll, within a second). Advisory locks are
    transaction-scoped everywhere, and the leader is elected by a lease row, so
    both work as they are.
    ``listen_url=postgresql://...``: a URL straight to PostgreSQL (not through the
    pooler) for LISTEN, percent-encoded if it has more than one option.
    ``pooler=session``: a pooler that keeps one server session per client; the
    same as none, without the check that tells a transaction pooler at start.

    Without ``pooler``, a URL whose session pid is not the one the connection was
    told (a pooler's) is checked at start: a transaction pooler is refused, with
    the option to add."""

    name = "postgres"
    capabilities = frozenset({"push_notifications", "skip_locked", "network"})
    where = "the PostgreSQL database"
    Q = Q
    MIGRATIONS = MIGRATIONS

    def __init__(self, url: str, *, max_connections: int = 10) -> None:
        super().__init__(url, max_connections=max_connections)
        self._days_made_at = -math.inf
        self._limits_cache: dict[tuple[str, ...], tuple[float, dict[str, QueueLimits]]] = {}
        #: per keyed queue, how far past its size a claim looks (next_window_factor)
        self._windows = WindowSizes()
        #: the pooled connections whose session has the limited claim's function
        self._claim_functions: weakref.WeakSet[psycopg.Connection[Any]] = weakref.WeakSet()
        #: the pooled connections whose session has a lone send's statement
        #: (_send_one), and their encodings
        self._send_statements: weakref.WeakKeyDictionary[psycopg.Connection[Any], str] = (
            weakref.WeakKeyDictionary()
        )
        #: False once the role was refused a temporary function (no TEMP privilege),
        #: and behind a transaction pooler (the function is the session's)
        self._temp_functions = not self.pooled

    def notifier(self, *, events: bool = False) -> Notifier:
        # Events: finished jobs ("done"), and new or re-queued work (queue names).
        channels = (EVENTS, CHANNEL) if events else (CHANNEL,)
        if not self.pooled:
            return PostgresNotifier(self.url, *channels)
        if self.listen_url is not None:
            log.info(
                "wake-ups by LISTEN on a session of their own at %s (listen_url), past the pooler",
                redact(self.listen_url),
            )
            return PostgresNotifier(self.listen_url, *channels)
        log.info(
            "behind a transaction pooler without listen_url: wake-ups by polling the"
            " database every 50-200 ms (add listen_url=postgresql://... straight to"
            " PostgreSQL to LISTEN instead)"
        )
        return PostgresPollingNotifier(self._change_stamp)

    def replica_lag(self) -> float | None:
        [row] = self._rows("replica_lag", {})
        return None if row["lag"] is None else float(row["lag"])

    def _change_stamp(self) -> tuple[Any, ...]:
        [row] = self._rows("change_stamp", {})
        return (row["jobs"], row["batches"])

    def _migration_lock(self, cur: Any) -> None:
        self._q(cur, "migration_lock")

    # -- values -----------------------------------------------------------------------
    def _now(self, now: datetime | None) -> Any:
        return now  # None: the server's clock

    def _ts(self, value: Any) -> datetime | None:
        return value  # type: ignore[no-any-return]  # psycopg returns aware datetimes

    def _wake(self, cur: Any, queues: Sequence[str]) -> None:
        work = [q for q in queues if q != "@done"]
        if work:
            self._q(cur, "notify", {"queues": work})
        if "@done" in queues:
            self._q(cur, "notify_events", {"queues": ["done"]})

    def tidy(self, *, min_dead: int = 50_000, dead_fraction: float = 0.1) -> list[str]:
        """VACUUM the tables whose dead rows piled up, ANALYZE those that changed
        a lot since their statistics were taken (autovacuum off, or behind a
        queue's churn or a bulk load). SKIP_LOCKED: a table autovacuum is on now
        is skipped, and nothing waits. A role that does not own a table gets a
        warning from the server and changes nothing.

        A table the ANALYZE found empty while its pages are still on disk (the
        live jobs' partition, drained) is vacuumed as well, which hands the empty
        pages back: left so, it is planned as holding 1 row whatever fills it
        next (see table_planned_empty)."""
        rows = self._rows("tables_to_tidy", {"min_dead": min_dead, "dead_fraction": dead_fraction})
        done = []
        for r in rows:
            if r["vacuum"]:
                command = (
                    "VACUUM (SKIP_LOCKED, ANALYZE)" if r["analyze"] else "VACUUM (SKIP_LOCKED)"
                )
            else:
                command = "ANALYZE (SKIP_LOCKED)"
            self._maintain(command, r["name"], r["dead"], r["changed"])
            if not r["vacuum"] and self._rows("table_planned_empty", {"name": r["name"]}):
                self._maintain("VACUUM (SKIP_LOCKED)", r["name"], r["dead"], r["changed"])
            done.append(r["name"])
        return done

    def _maintain(self, command: str, table: str, dead: int, changed: int) -> None:
        statement = psycopg.sql.SQL(command + " {}").format(psycopg.sql.Identifier(table))
        began = time.monotonic()
        try:
            with self.pool.connection() as c:
                c.execute(statement, prepare=False)
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise _connect_error(self.url, exc) from exc
        log.info(
            "%s %s (%d dead rows, %d changed since its last ANALYZE) in %.2fs",
            command.split(" ")[0].lower(),
            table,
            dead,
            changed,
            time.monotonic() - began,
        )

    def _limits_changed(self) -> None:
        self._limits_cache.clear()

    # -- the hot paths --------------------------------------------------------------------
    def job_insert_many(
        self, *, jobs: Sequence[JobInsert], conn: Any = None, now: datetime | None = None
    ) -> list[Inserted]:
        if (
            conn is None
            and jobs
            and not any(j.unique_key or j.idempotency_key or j.limited for j in jobs)
        ):
            # Nothing to resolve: one statement in autocommit (its NOTIFY is sent at
            # its commit), no BEGIN and COMMIT round trips. Ids grow in input order.
            if len(jobs) == 1:
                # (prepared once per session: not behind a transaction pooler)
                sent = None if self.pooled else self._send_one(jobs[0], now)
                if sent is None:  # a value _text_params leaves to psycopg
                    rows = self._rows("job_insert_one", {**jobs[0]._asdict(), "now": now})
                    sent = rows[0]["id"]
                return [Inserted(sent, True)]
            rows = self._rows("job_insert_many", _insert_params(jobs, now), sql=KEYLESS_INSERT)
            return [Inserted(jid, True) for jid in sorted(r["id"] for r in rows)]
        return super().job_insert_many(jobs=jobs, conn=conn, now=now)

    def _send_one(self, job: JobInsert, now: datetime | None) -> int | None:
        """One plain job sent straight through libpq (psycopg's ``pq`` layer): the
        statement prepared once on each connection, its parameters written as text
        here. psycopg's cursor spends about 40 us of CPU per statement on what a
        send does not need (parsing the query, an adapter per value, a cursor, a
        description of the result): a third of a one-by-one send's client time
        (a send alternating with the cursor path: 1.086x). The id, or None when a
        value needs psycopg (``_text_params``). Errors are psycopg's, as from
        ``execute``; the server forgetting the statement prepares it again."""
        params = {**job._asdict(), "now": now, "channel": CHANNEL}
        with _translated(self.url, self.pool), self.pool.connection() as conn:
            pg: Any = conn.pgconn  # (its stub leaves out None, the NULL libpq takes)
            encoding = self._send_statements.get(conn) or self._prepare_send(conn)
            values = _text_params([params[name] for name in _SEND_NAMES], encoding)
            if values is None:
                return None
            res = pg.exec_prepared(_SEND, values)
            if res.status != _TUPLES_OK and res.error_field(_SQLSTATE) == _NOT_PREPARED:
                encoding = self._prepare_send(conn)
                res = pg.exec_prepared(_SEND, values)
            if res.status != _TUPLES_OK:
                raise _send_error(pg, res, encoding)
            job_id = res.get_value(0, 0)
            if job_id is None:
                raise RuntimeError("the send's INSERT returned no id")
            return int(job_id)

    def _prepare_send(self, conn: psycopg.Connection[Any]) -> str:
        """Prepares the send's statement on this connection; its encoding."""
        pg = conn.pgconn
        encoding = conn.info.encoding
        res = pg.prepare(_SEND, _SEND_SQL)
        if res.status != psycopg.pq.ExecStatus.COMMAND_OK:
            # 42P05: the session has a statement of that name (a pooler's session,
            # where another process of ours prepared it): made again, as ours
            if res.error_field(_SQLSTATE) == b"42P05":
                pg.exec_(b"DEALLOCATE " + _SEND)
                res = pg.prepare(_SEND, _SEND_SQL)
            if res.status != psycopg.pq.ExecStatus.COMMAND_OK:
                raise _send_error(pg, res, encoding)
        self._send_statements[conn] = encoding
        return encoding

    def job_insert_stream(
        self, *, chunks: Iterable[Sequence[JobInsert]], now: datetime | None = None
    ) -> list[Inserted]:
        with self._tx() as cur:
            ids = self._copy_jobs(cur, chunks, now)
        return [Inserted(jid, True) for jid in ids]

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
        # The batch row first, then its jobs made with its id and sent by COPY a
        # chunk at a time: the server writes one while the next is encoded (a
        # batch of 20,000: 37,000 -> 52,000 jobs/s). Run again whole after a
        # moved row: its chunks are made anew.
        with self._tx() as cur:
            [row] = self._batch_insert(cur, name, task, total, now, None, on_complete_json)
            batch_id = int(row["id"])
            written = len(self._copy_jobs(cur, chunks(batch_id), now))
            if written != total:  # raised inside the transaction: nothing is kept
                raise RuntimeError(f"batch {batch_id}: {written} jobs made of {total}")
        return batch_id

    def _copy_jobs(
        self, cur: Any, chunks: Iterable[Sequence[JobInsert]], now: datetime | None
    ) -> list[int]:
        """Jobs without keys or limits by one COPY, in the transaction of ``cur``;
        their ids in input order. Each chunk's rows go out as they are formatted
        and the server writes them while the caller encodes the next chunk, so
        Python's time and the server's overlap instead of adding up. COPY returns
        no ids: the rows this transaction stamped after the ones it had already
        written (ids only grow) are read back. When the first job starts now (the
        usual bulk send), the rows carry no times and no change stamp: their
        column defaults are the same values (schema v18), and a later job with a
        delay gets its due time by one UPDATE before the commit."""
        [begun] = self._q(cur, "job_copy_begin", {"now": now})
        it = iter(chunks)
        first = next((c for c in it if c), None)
        if first is None:
            return []
        starts_now = now is None and float(first[0].delay_s or 0.0) <= 0
        rows = _CopyRows(begun["now"], begun["change"], starts_now=starts_now)
        with cur.copy(Q["job_copy_now" if starts_now else "job_copy"]) as copy:
            copy.write(rows.format(first))
            for jobs in it:
                if jobs:
                    copy.write(rows.format(jobs))
        read = cur.connection.cursor(row_factory=tuple_row)
        params = {"change": begun["change"], "after": begun["after"]}
        # One row, not one per job (reading 20,000 ids was a tenth of a send_many).
        [(written, low, high)] = read.execute(Q["job_copy_span"], params).fetchall()
        if written != rows.count:
            raise RuntimeError(f"COPY wrote {written} jobs of {rows.count}")
        if high - low + 1 == written:
            ids = list(range(low, high + 1))
        else:  # another writer took ids from the sequence in between: read them
            ids = [r[0] for r in read.execute(Q["job_copy_ids"], params).fetchall()]
        if rows.delayed:
            later = {
                "ids": [ids[n] for n, _ in rows.delayed],
                "delays": [d for _, d in rows.delayed],
            }
            cur.execute(Q["job_copy_delays"], later)
        if rows.woken:
            self._wake(cur, sorted(rows.woken))
        return ids

    def _insert_rows(
        self, cur: Any, jobs: Sequence[JobInsert], now: Any
    ) -> list[tuple[int, KeyPair]]:
        limited = sorted({j.queue for j in jobs if j.limited})
        if limited:  # from now on, claims from these queues take the limit-aware path
            cur.execute(Q["queue_mark_keyed"], {"queues": limited})
        keyed = any(j.unique_key or j.idempotency_key for j in jobs)
        if not keyed and not limited and len(jobs) >= COPY_MIN:
            slices = (jobs[i : i + COPY_SLICE] for i in range(0, len(jobs), COPY_SLICE))
            return [(jid, (None, None)) for jid in self._copy_jobs(cur, slices, now)]
        query = Q["job_insert_many"] if keyed else KEYLESS_INSERT
        rows = cur.execute(query, _insert_params(jobs, now)).fetchall()
        out = [(r["id"], (r["unique_key"], r["idempotency_key"])) for r in rows]
        idempotent = [r["id"] for r in rows if r["idempotency_key"]]
        if idempotent:  # a key taken while the insert ran (job_drop_taken_keys)
            gone = {r["id"] for r in self._fetch(cur, "job_drop_taken_keys", {"ids": idempotent})}
            out = [o for o in out if o[0] not in gone]
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
        limits = self._queue_limits(queues)
        free = [q for q in queues if q not in limits]
        params = {
            "worker_id": worker_id,
            "lease_s": None if lease_s is None else float(lease_s),
            "now": now,
            "tasks": None if tasks is None else list(tasks),
            "schema_version": schema_version if schema_version is not None else self.latest_schema,
        }
        jobs: list[JobRecord] = []
        if free:  # the fast path: SKIP LOCKED, no limits to respect
            jobs = self._again(
                lambda: self._job_rows("job_claim", {**params, "queues": free, "limit": limit})
            )

        def claim_limited(queue: str, asked: int) -> list[JobRecord]:
            factor = self._windows.factor(queue)
            lim = limits[queue]
            # Only a queue limit and no rate: the claim counts nothing but the queue.
            queue_only = not lim.keyed and lim.rate_per_s is None and lim.max_running is not None
            claimed = self._claim_limited(
                {
                    **params,
                    **limited_params(queue, lim, asked, factor),
                    "queues": [queue],  # job_claim's, under a queue limit alone
                    "identity": [worker_id, *tags],
                    "limit": asked,
                    # A queue limited by its jobs' keys alone takes no queue lock:
                    # its claims serialise per key (job_claim_candidates).
                    "queue_lock": lim.queue_locked,
                    "queue_only": queue_only,
                }
            )
            if not queue_only:
                self._windows.update(queue, factor, asked, len(claimed))
            return claimed

        # Each queue in a transaction of its own, retried alone: a claim that
        # committed is never run again (its jobs would be leased and lost).
        for queue in (q for q in queues if q in limits):
            if len(jobs) >= limit:
                break
            asked = limit - len(jobs)
            jobs += self._again(lambda q=queue, n=asked: claim_limited(q, n))  # type: ignore[misc]
        order = {q: i for i, q in enumerate(queues)}
        jobs.sort(key=lambda j: (order[j.queue], -j.priority, j.scheduled_at, j.id))
        return jobs

    def _job_rows(self, name: str, params: dict[str, Any]) -> list[JobRecord]:
        """``_rows`` for a statement returning jobs, read as tuples and decoded by
        position (``job_reader``): no dict made per row."""
        with (
            _translated(self.url, self.pool),
            self.pool.connection() as c,
            c.cursor(row_factory=tuple_row) as cur,
        ):
            return self._decoded(cur.execute(Q[name], self._params(params)))

    def _decoded(self, cur: psycopg.Cursor[Any]) -> list[JobRecord]:
        """The jobs a statement run on a ``tuple_row`` cursor returned."""
        rows = _result_rows(cur)
        res = cur.pgresult
        if not rows or res is None:
            return []
        return self._jobs([(res.fname(i) or b"").decode() for i in range(res.nfields)], rows)

    def _claim_limited(self, params: dict[str, Any]) -> list[JobRecord]:
        """One limited claim, one statement (job_claim_limited_function; under a
        queue limit alone, job_claim sized by queue_room_function). The session's
        functions are made on its first limited claim. (Statement by statement in
        a transaction, the claim took five round trips; in pipeline mode two, but
        psycopg waited on the socket 13 times per claim instead of 6, and inside a
        worker, where the claim thread takes the GIL back after every wait, drains
        were slower: per key 0.66x -> 0.71x of unlimited.)"""
        if self._temp_functions:
            with _translated(self.url, self.pool), self.pool.connection() as c:
                if c in self._claim_functions or self._make_claim_function(c):
                    call = (
                        QUEUE_LIMITED_CLAIM if params["queue_only"] else Q["job_claim_limited_call"]
                    )
                    with c.cursor(row_factory=tuple_row) as cur:
                        try:
                            cur.execute(call, self._params(params))
                        except (psycopg.errors.UndefinedFunction, psycopg.errors.InvalidSchemaName):
                            # Gone with the session's temporary objects (DISCARD ALL).
                            c.execute(CLAIM_LIMITED_FUNCTION)
                            cur.execute(call, self._params(params))
                        return self._decoded(cur)
        return [self._job(r) for r in self._claim_limited_statements(params)]

    def _make_claim_function(self, conn: psycopg.Connection[Any]) -> bool:
        try:
            conn.execute(CLAIM_LIMITED_FUNCTION)
        except psycopg.errors.InsufficientPrivilege as exc:
            log.warning(
                "limited claims run statement by statement (five round trips instead of"
                " one): this role may not create temporary objects (GRANT TEMPORARY ON"
                " DATABASE ... lifts that): %s",
                str(exc).splitlines()[0],
            )
            self._temp_functions = False
            return False
        self._claim_functions.add(conn)
        return True

    def _claim_limited_statements(self, params: dict[str, Any]) -> list[Any]:
        """The limited claim's function, statement by statement in a transaction of
        its own: for a role that may not create temporary objects."""
        with self._tx() as cur:
            cur.execute(Q["limits_lock"], params)
            if params["queue_only"]:
                [running] = self._fetch(cur, "queue_running", params)
                room = min(params["limit"], params["max_running"] - running["n"])
                if room <= 0:
                    return []
                return self._fetch(
                    cur, "job_claim", {**params, "queues": [params["queue"]], "limit": room}
                )
            cands = self._fetch(cur, "job_claim_candidates", params)
            if not cands:
                return []
            ids = [r["id"] for r in cands]
            claimed = self._fetch(cur, "job_claim_limited", {**params, "ids": ids})
            own = QueueLimits(params["max_running"], params["queue_rate"], params["queue_burst"])
            for spend in queue_spends(params["queue"], own, claimed):
                cur.execute(Q["rate_spend"], {**spend, "now": params["now"]})
            return claimed

    def _queue_limits(self, queues: Sequence[str]) -> dict[str, QueueLimits]:
        """Queues whose claims must respect limits, read at most once a second.
        Keyed jobs are never claimed by the fast path, so a stale answer can delay
        them but not over-admit them."""
        key = tuple(queues)
        cached = self._limits_cache.get(key)
        if cached is not None and cached[0] > time.monotonic():
            return cached[1]
        limits = queue_limits(self._rows("queue_limits", {"queues": list(queues)}))
        self._limits_cache[key] = (time.monotonic() + 1.0, limits)
        return limits

    def job_finalize_many(
        self, *, worker_id: str, outcomes: Sequence[Finalize], now: datetime | None = None
    ) -> list[int]:
        if not outcomes:
            return []
        outcomes = first_outcomes(outcomes)
        rows = self._rows("job_finalize_many", _finalize_params(worker_id, outcomes, now))
        return [r["job_id"] for r in rows]

    def job_release_many(
        self, *, worker_id: str, leases: Sequence[Lease], now: datetime | None = None
    ) -> list[int]:
        if not leases:
            return []
        rows = self._rows(
            "job_release_many",
            {
                "id": [le.job_id for le in leases],
                "token": [le.token for le in leases],
                "worker_id": worker_id,
                "now": now,
            },
        )
        return [r["id"] for r in rows]

    def worker_heartbeat(self, *, worker: WorkerInfo, now: datetime | None = None) -> Heartbeat:
        [row] = self._rows(
            "worker_heartbeat",
            {
                "id": worker.id,
                "hostname": worker.hostname,
                "pid": worker.pid,
                "queues": list(worker.queues),
                "concurrency": worker.concurrency,
                "tags": list(worker.tags),
                "tasks": None if worker.tasks is None else json.dumps(sorted(worker.tasks)),
                "now": now,
            },
        )
        held = json.loads(row["held"])
        return Heartbeat(
            held={int(i): str(t) for i, t, _ in held},
            cancel=[int(i) for i, _, c in held if c],
            stop=bool(row["stop_requested"]),
            schema_version=int(row["schema_version"] or 0),
            resurrected=bool(row["inserted"]),
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
        """Whole days of finished jobs first (dropped partitions, schema v17), then
        row by row what is left: the day that straddles the cutoff, jobs in a
        state's catch-all partition, and a day kept for an open batch."""
        gone = 0
        if not dry_run:
            if time.monotonic() - self._days_made_at > DAYS_EVERY_S:
                self._partition_upkeep("job_add_days", {"ahead": DAYS_AHEAD})
                self._days_made_at = time.monotonic()
            gone = self._partition_upkeep(
                "job_drop_days",
                {"state": str(state), "older_than_s": float(older_than_s), "now": now},
            )
        return gone + super().job_prune(
            state=state, older_than_s=older_than_s, limit=limit, dry_run=dry_run, now=now
        )

    def _partition_upkeep(self, name: str, params: dict[str, Any]) -> int:
        """A partition-keeping statement in a transaction of its own, which gives
        up rather than wait: creating or dropping a partition locks its parent,
        and outcomes must not queue behind it. Skipped now, done at a later pass."""
        try:
            with self.pool.connection() as c, c.transaction():
                c.execute("SET LOCAL lock_timeout = '1s'", prepare=False)
                row: Any = c.execute(Q[name], self._params(params)).fetchone()
                return int(row["n"] or 0) if row else 0
        except (*_MOVED, psycopg.errors.LockNotAvailable, psycopg.errors.DuplicateTable) as exc:
            log.info("%s skipped this time: %s", name, str(exc).splitlines()[0])
            return 0
        except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
            raise _connect_error(self.url, exc) from exc

    def job_rescue(
        self, *, worker_ttl_s: float, limit: int = 1000, now: datetime | None = None
    ) -> RescueResult:
        rows = self._rows(
            "job_rescue", {"worker_ttl_s": float(worker_ttl_s), "limit": limit, "now": now}
        )
        return RescueResult(
            requeued=[r["id"] for r in rows if r["state"] == JobState.AVAILABLE],
            failed=[r["id"] for r in rows if r["state"] == JobState.FAILED],
        )


def _run_again(fn: Callable[..., T]) -> Callable[..., T]:
    @functools.wraps(fn)
    def method(self: PostgresBackend, *args: Any, **kwargs: Any) -> T:
        if kwargs.get("conn") is not None:  # the caller's transaction: theirs to retry
            return fn(self, *args, **kwargs)
        return self._again(lambda: fn(self, *args, **kwargs))

    return method


#: Not run again whole: job_claim retries each of its transactions itself (one
#: that committed must not run twice); a stream is consumed once; the rest run no
#: statement on jobs that another transaction moves.
_RUN_ONCE = {"close", "notifier", "job_claim", "job_insert_stream", "supports", "migrate", "tidy"}
for _name, _fn in inspect.getmembers(PostgresBackend, inspect.isfunction):
    if not (_name.startswith("_") or _name in _RUN_ONCE or inspect.isgeneratorfunction(_fn)):
        setattr(PostgresBackend, _name, _run_again(_fn))
