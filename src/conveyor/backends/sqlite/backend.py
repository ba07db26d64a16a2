"""SQLite: the embedded default. One file, WAL, every write under BEGIN IMMEDIATE.

What differs from the shared operations: SQLite has one writer, so there is no
SKIP LOCKED and nothing to skip. The hot paths run a statement per row inside one
write transaction (in-process, a statement costs microseconds); claims from
several processes serialise on the write lock.
"""

from __future__ import annotations

import functools
import json
import operator
import os
import re
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import UTC, datetime
from typing import Any

from ...connections import GreenletConnection
from ...errors import ConfigError, DatabaseUnavailable
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
from ..interfaces import Notifier
from ..sql.backend import SqlBackend
from ..sql.loader import Dialect, load_migrations, load_queries
from ..sql.logic import (
    KeyPair,
    WindowSizes,
    first_outcomes,
    limited_params,
    plain_success,
    queue_limits,
    queue_spends,
)
from ..threads import ThreadConnections

DIALECT = Dialect(
    name="sqlite",
    paramstyle="named",
    macros={
        "NOW": lambda a: ":now",
        "NOW_PLUS": lambda a: f"(:now + ({a[0]}))",
        "NOW_MINUS": lambda a: f"(:now - ({a[0]}))",
        "SECONDS_SINCE": lambda a: f"(:now - ({a[0]}))",
        "IN": lambda a: f"IN (SELECT value FROM json_each({a[0]}))",
        "JSON": lambda a: a[0],
        "TS": lambda a: a[0],
        # BEGIN IMMEDIATE holds the only write lock: nothing to lock row by row.
        "FOR_UPDATE": lambda a: "",
        # SQLite plans without statistics (no ANALYZE): where two partial indexes
        # fit, it may take the wrong one (see job_chain_due).
        "INDEXED_BY": lambda a: f"INDEXED BY {a[0]}",
        "ICONTAINS": lambda a: f"{a[0]} LIKE {a[1]} ESCAPE '\\'",
        "GREATEST": lambda a: f"max({', '.join(a)})",
        # One writer at a time: one more than any change stamped so far is in commit
        # order (an index lookup on each table: the "IS NOT NULL" lets SQLite use the
        # partial indexes; without it each statement scanned the whole table).
        "CHANGE": lambda a: (
            "(max(coalesce((SELECT max(changed) FROM conveyor_jobs WHERE changed IS NOT NULL),"
            " 0), coalesce((SELECT max(changed) FROM conveyor_batches"
            " WHERE changed IS NOT NULL), 0)) + 1)"
        ),
        # the IS NOT NULL lets the planner pick the partial (changed, id) index
        "CHANGED_AFTER": lambda a: f"{a[0]} IS NOT NULL AND ({a[0]}, {a[1]}) > ({a[2]}, {a[3]})",
        "CHANGE_HORIZON": lambda a: "1 = 1",  # committed in stamp order already
        "CHANGE_TEXT": lambda a: a[0],
    },
)
Q = load_queries(__package__ or "conveyor.backends.sqlite", DIALECT)


def _numbered(sql: str) -> tuple[str, Callable[[Sequence[Any]], tuple[Any, ...]]]:
    """A statement written with numbered parameters (``?3``, one used twice) as
    plain ``?`` ones, and what picks its values from a row in that order. Python
    3.12+ warns, and 3.14 refuses, when ``?N`` parameters are given a sequence
    (it counts them as named), yet a row bound as the tuple it is keeps a bulk
    enqueue cheap: itemgetter makes the parameters in C."""
    sql = "\n".join(ln for ln in sql.splitlines() if not ln.lstrip().startswith("--"))
    order = [int(n) - 1 for n in re.findall(r"\?(\d+)", sql)]
    return re.sub(r"\?\d+", "?", sql), operator.itemgetter(*order)


#: job_insert_many with plain parameters, and the values a (*JobInsert, now) row gives them
_INSERT_SQL, _insert_params = _numbered(Q["job_insert_many"])
#: and without its RETURNING, for executemany: the sqlite3 of Python 3.12+ refuses
#: a statement that returns rows there ("bad parameter or other API misuse")
_INSERT_MANY_SQL = _INSERT_SQL[: _INSERT_SQL.rindex("RETURNING")]
MIGRATIONS = load_migrations(__package__ or "conveyor.backends.sqlite")
_SYNC_MODES = {"off", "normal", "full", "extra"}
#: the modes whose every commit waits for the disk (a claim's does not, see _tx)
_SYNCED = {"FULL", "EXTRA"}
# The write turn of each database file among this process's threads (see _tx),
# by (process id, path): a forked child never shares a turn a parent's thread holds.
_WRITERS: dict[tuple[int, str], threading.RLock] = {}


def _epoch(now: datetime | None) -> float:
    return time.time() if now is None else now.timestamp()


@functools.lru_cache(maxsize=4096)
def _from_epoch(value: float) -> datetime:
    """A stored time as a datetime, remembered: the rows of a claim share their
    start and lease expiry, and jobs sent together their creation time, so most
    of a claim's four times per row are one lookup instead of a conversion
    (datetimes are immutable: sharing one is safe)."""
    return datetime.fromtimestamp(value, UTC)


#: the column names of the last result's description (a claim's rows share one):
#: (description, names), swapped whole, so a thread never pairs one with another's
_NAMES: tuple[Any, tuple[str, ...]] = (None, ())


def _close(conn: sqlite3.Connection) -> None:
    with suppress(sqlite3.Error):
        conn.close()


def _dict_row(cur: sqlite3.Cursor, row: tuple[Any, ...]) -> dict[str, Any]:
    global _NAMES
    description = cur.description
    names = _NAMES
    if names[0] is not description:
        names = _NAMES = (description, tuple(d[0] for d in description))
    return dict(zip(names[1], row, strict=True))


class SQLiteNotifier(Notifier):
    """SQLite has no LISTEN: watch ``PRAGMA data_version``, which moves whenever
    another connection commits. One trivial read per poll: every ``interval``
    (2 ms) while the file changes, every ``idle_interval`` (10 ms) once it has not
    changed for ``idle_after`` seconds, so an idle worker wakes 100 times a second
    and one waiting for work notices it within about a millisecond.

    While its consumer is busy (``pace(False)``: a worker claiming full batches,
    which claims again without a hint) it polls every ``busy_interval`` (20 ms)
    instead, and at once when the consumer waits again. Polling every 2 ms
    through a drain, where every outcome's commit moves the version, cost its
    worker 4-8 % of its CPU and 3-7 % of its jobs per second."""

    def __init__(
        self,
        backend: SQLiteBackend,
        interval: float = 0.002,
        idle_interval: float = 0.01,
        idle_after: float = 5.0,
        busy_interval: float = 0.02,
    ) -> None:
        self._conn = backend._notifier_connection(self)
        self._interval = interval
        self._idle_interval = idle_interval
        self._idle_after = idle_after
        self._busy_interval = busy_interval
        self._last = self._version()
        self._changed_at = time.monotonic()
        self._closed = False
        self._lock = threading.Lock()
        self._eager = threading.Event()
        self._eager.set()

    def pace(self, eager: bool) -> None:
        if eager:
            self._eager.set()  # wakes a busy wait: the next poll is now
        else:
            self._eager.clear()

    def _version(self) -> int:
        return int(self._conn.execute(Q["data_version"]).fetchone()[0])

    def wait(self, timeout: float) -> set[str]:
        deadline = time.monotonic() + timeout
        while not self._closed:
            with self._lock:  # close() must not pull the connection from under us
                if self._closed:
                    break
                version = self._version()
            now = time.monotonic()
            if version != self._last:
                self._last = version
                self._changed_at = now
                return {"*"}
            remaining = deadline - now
            if remaining <= 0:
                break
            if not self._eager.is_set():
                self._eager.wait(min(self._busy_interval, remaining))
                continue
            idle = now - self._changed_at > self._idle_after
            time.sleep(min(self._idle_interval if idle else self._interval, remaining))
        return set()

    def close(self) -> None:
        self._closed = True
        self._eager.set()
        with self._lock:  # (not under a poll: SQLite would use the freed connection)
            self._conn.close()


class SQLiteBackend(SqlBackend):
    name = "sqlite"
    Q = Q
    MIGRATIONS = MIGRATIONS

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
        self.where = f"SQLite database {self.path}"
        folder = os.path.dirname(self.path)
        if not os.path.isdir(folder):
            raise DatabaseUnavailable(
                f"cannot open SQLite database {self.path}: folder {folder} does not exist"
            )
        self.synchronous = synchronous.upper()
        self.busy_timeout_s = busy_timeout_s
        #: each thread's connection
        self._conns: ThreadConnections[sqlite3.Connection] = ThreadConnections(self._reset, _close)
        #: the notifiers, closed with the backend (each under its own lock: one may be
        #: in a poll on its connection in another thread); weak: one let go closes
        #: its connection as it goes (a server makes one per event stream)
        self._notifiers: weakref.WeakSet[SQLiteNotifier] = weakref.WeakSet()
        self._lock = threading.Lock()
        #: the process the connections are this one's in (see _after_fork)
        self._pid = os.getpid()
        #: a forked child's: its parent's connections, kept, never used or closed
        self._inherited: list[sqlite3.Connection] = []
        self._writer_pid = -1
        #: per keyed queue, how far past its size a claim looks (next_window_factor)
        self._windows = WindowSizes()
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
            self._use_wal(conn)
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
        except sqlite3.Error as exc:
            raise DatabaseUnavailable(f"cannot open SQLite database {self.path}: {exc}") from exc
        return conn

    def _notifier_connection(self, notifier: SQLiteNotifier) -> sqlite3.Connection:
        conn = self._new_connection()
        with self._lock:
            self._notifiers.add(notifier)
        return conn

    def _reset(self, conn: sqlite3.Connection) -> bool:
        """Fit for another thread? A transaction its ended thread left open is rolled
        back, and the configured synchronous set again (a claim relaxes it)."""
        try:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
        except sqlite3.Error:
            return False
        return True

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        """Put the file in WAL mode, once: the mode is stored in the file.

        Switching needs the file to itself, and SQLite answers "database is
        locked" at once (its busy timeout does not apply) while another process
        is creating or switching the same file: retry until the busy timeout.
        """
        deadline = time.monotonic() + self.busy_timeout_s
        delay = 0.005
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
                if str(mode).lower() == "wal":
                    return
                conn.execute("PRAGMA journal_mode=WAL")
                return
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) and "busy" not in str(exc):
                    raise
                if time.monotonic() >= deadline:
                    raise
            time.sleep(delay)
            delay = min(delay * 2, 0.2)

    def _conn(self) -> sqlite3.Connection:
        if self._pid != os.getpid():
            self._after_fork()
        conn = self._conns.mine()  # (one an ended thread left, if any)
        if conn is None:
            conn = self._conns.add(self._new_connection())
        return conn

    def _after_fork(self) -> None:
        """In a child forked from the process that opened the connections: open new
        ones. SQLite's connections must not cross a fork (the child would share
        the parent's file locks and WAL state). The parent's are kept unused and
        unclosed (a close could write to the file the parent is using): in the
        child, the parent's other threads look ended, and their connections would
        otherwise pass to the child's threads."""
        self._pid = os.getpid()
        self._lock = threading.Lock()  # the parent's may have been held at the fork
        self._inherited += self._conns.after_fork() + [n._conn for n in list(self._notifiers)]
        self._notifiers = weakref.WeakSet()

    def _busy(self, exc: sqlite3.OperationalError) -> Exception:
        """'database is locked' after the busy timeout says nothing of why."""
        if "locked" in str(exc) or "busy" in str(exc):
            return DatabaseUnavailable(
                f"SQLite database {self.path} stayed locked for {self.busy_timeout_s:g}s: "
                "another connection holds a write transaction open (a conn= transaction "
                "not committed, or a long write). SQLite allows one writer at a time; "
                "commit or roll back sooner, or use PostgreSQL for long transactions"
            )
        return exc

    @contextmanager
    def _tx(self, conn: Any = None, *, durable: bool = True) -> Iterator[sqlite3.Cursor]:
        """A cursor in a transaction: the caller's (``conn``) or an IMMEDIATE one of ours.

        IMMEDIATE takes the write lock up front, so two claimers never both read
        the same rows and then race to upgrade (SQLite's answer to SKIP LOCKED).

        ``durable=False`` (a claim): under synchronous FULL or EXTRA, our own
        transaction commits as under NORMAL, without waiting for the WAL to reach
        the disk, as a PostgreSQL claim commits with synchronous_commit off. A
        power loss (not a process crash) can undo it: the job is waiting again
        with its attempt not counted. Any later durable commit on the file syncs
        the WAL, earlier frames included. The setting is put back before the
        write turn is released, whatever happens in the transaction.
        """
        if conn is not None:
            self._check_caller_conn(conn)
            cur = conn.cursor()
            cur.row_factory = _dict_row
            try:
                yield cur
            except sqlite3.OperationalError as exc:
                raise self._busy(exc) from exc
            return
        own = self._conn()
        # Our own writers in this process queue on a lock and take turns at once;
        # left to SQLite, the loser of BEGIN IMMEDIATE sleeps in its busy handler
        # (1, 2, 5, 10 ms...) while the winner is long done: a worker's claims and
        # completions, on two threads, lost a third of a drain's time that way.
        # Other processes still meet at SQLite's lock, under its busy timeout.
        writer = self._writer()
        if not writer.acquire(timeout=self.busy_timeout_s):
            raise self._busy(sqlite3.OperationalError("database is locked"))
        relaxed = not durable and self.synchronous in _SYNCED
        try:
            if relaxed:
                own.execute("PRAGMA synchronous=NORMAL")
            cur = own.cursor()
            cur.row_factory = _dict_row
            try:
                cur.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise self._busy(exc) from exc
            try:
                yield cur
            except BaseException as exc:
                cur.close()
                own.execute("ROLLBACK")
                if isinstance(exc, sqlite3.OperationalError):
                    raise self._busy(exc) from exc
                raise
            cur.close()  # a RETURNING statement not read to its end would block COMMIT
            own.execute("COMMIT")
        finally:
            try:
                if relaxed:
                    self._resync(own)
            finally:
                writer.release()

    def _resync(self, conn: sqlite3.Connection) -> None:
        """Back to the configured synchronous after a claim. A connection that could
        not be put back is dropped, never left to commit outcomes unsynced."""
        try:
            conn.execute(f"PRAGMA synchronous={self.synchronous}")
        except sqlite3.Error:
            self._conns.discard()  # (conn, this thread's)
            raise

    def _writer(self) -> threading.RLock:
        """This process's write turn for the file: one per file, whichever app
        opened it (looked up again in a forked child; setdefault is atomic)."""
        pid = os.getpid()
        if self._writer_pid != pid:
            self._writer_lock = _WRITERS.setdefault((pid, self.path), threading.RLock())
            self._writer_pid = pid
        return self._writer_lock

    def _check_caller_conn(self, conn: Any) -> None:
        if not isinstance(conn, sqlite3.Connection | GreenletConnection):
            raise ConfigError(
                f"conn= must be a sqlite3.Connection for a SQLite app, got {type(conn).__name__}"
            )
        files = {row[2] for row in conn.execute("PRAGMA database_list") if row[1] == "main"}
        if not any(f and os.path.samefile(f, self.path) for f in files):
            raise ConfigError(
                f"conn= is connected to {sorted(files)}, not to this app's database {self.path}"
            )

    def _rows(self, name: str, params: dict[str, Any], *, sql: str | None = None) -> list[Any]:
        cur = self._conn().cursor()
        cur.row_factory = _dict_row
        try:
            cur.execute(sql or Q[name], params)
            return cur.fetchall()
        except sqlite3.OperationalError as exc:
            raise self._busy(exc) from exc
        finally:
            cur.close()

    @contextmanager
    def _snapshot_reads(self) -> Iterator[Callable[..., list[Any]]]:
        """A deferred read transaction: in WAL mode its reads share the snapshot
        of its first one, and it takes no write lock."""
        conn = self._conn()
        if conn.in_transaction:  # (never on our own thread-local connection)
            yield self._rows
            return
        conn.execute("BEGIN")
        try:
            yield self._rows
        finally:
            conn.execute("COMMIT")

    def _count(self, name: str, params: dict[str, Any]) -> int:
        with self._tx() as cur:
            return self._qc(cur, name, params)

    def _migration_lock(self, cur: Any) -> None:
        pass  # BEGIN IMMEDIATE: a second migrator waits for the write lock

    def close(self) -> None:
        if self._pid != os.getpid():
            self._after_fork()  # a child closes its own connections, not the parent's
        self._conns.close_all()
        with self._lock:
            notifiers, self._notifiers = list(self._notifiers), weakref.WeakSet()
        for notifier in notifiers:
            notifier.close()

    def notifier(self, *, events: bool = False) -> Notifier:
        return SQLiteNotifier(self)

    # -- values --------------------------------------------------------------------------
    def _now(self, now: datetime | None) -> Any:
        return _epoch(now)

    def _ts(self, value: Any) -> datetime | None:
        return None if value is None else _from_epoch(value)

    def _ts_param(self, value: datetime) -> Any:
        return value.timestamp()

    def _list(self, values: Sequence[Any]) -> Any:
        return json.dumps(list(values))

    # -- the hot paths ---------------------------------------------------------------------
    def _insert_rows(
        self, cur: Any, jobs: Sequence[JobInsert], now: Any
    ) -> list[tuple[int, KeyPair]]:
        for queue in sorted({j.queue for j in jobs if j.limited}):
            cur.execute(Q["queue_mark_keyed"], {"queue": queue, "now": now})
        sql = _INSERT_SQL  # positional: a JobInsert binds as the tuple it is
        if len(jobs) > 1 and not any(j.unique_key or j.idempotency_key for j in jobs):
            # Nothing can conflict: one executemany, then the ids it made, in order.
            [top] = self._q(cur, "job_max_id")
            cur.executemany(_INSERT_MANY_SQL, [_insert_params((*j, now)) for j in jobs])
            made = self._q(cur, "job_ids_after", {"after": top["id"], "n": len(jobs)})
            if len(made) != len(jobs):
                raise RuntimeError(f"inserted {len(jobs)} jobs but found {len(made)} new ids")
            return [(r["id"], (None, None)) for r in made]
        out = []
        for j in jobs:  # in-process: a statement per row costs microseconds
            row = cur.execute(sql, _insert_params((*j, now))).fetchone()
            if row is not None:
                out.append((row["id"], (row["unique_key"], row["idempotency_key"])))
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
        ts = _epoch(now)
        # Read-only look before taking the write lock: idle workers of several
        # processes then poll without queueing behind one another.
        if not self._rows("job_peek_available", {"queues": self._list(queues), "now": ts}):
            return []
        base = {
            "worker_id": worker_id,
            "lease_s": lease_s,
            "now": ts,
            "tasks": None if tasks is None else self._list(tasks),
            "schema_version": schema_version if schema_version is not None else self.latest_schema,
        }
        # Rows are decoded after COMMIT: the write lock is held for SQL only (a claim
        # decoding its rows under it kept the completer's writes waiting).
        # (column names, tuple rows): decoded without a dict each (job_reader)
        claims: list[tuple[list[str], list[Any]]] = []
        taken = 0
        with self._tx(durable=False) as cur:
            limits = queue_limits(self._q(cur, "queue_limits", {"queues": self._list(queues)}))
            for queue in queues:
                if taken >= limit:
                    break
                params = {**base, "queue": queue, "limit": limit - taken}
                limited = queue in limits  # under BEGIN IMMEDIATE the counts cannot move
                if limited:
                    asked, factor = limit - taken, self._windows.factor(queue)
                    params.update(
                        limited_params(queue, limits[queue], asked, factor),
                        identity=self._list([worker_id, *tags]),
                    )
                cur.row_factory = None
                try:
                    cur.execute(Q["job_claim_limited" if limited else "job_claim"], params)
                    rows = cur.fetchall()
                finally:
                    cur.row_factory = _dict_row
                names = [d[0] for d in cur.description]
                if limited:
                    self._windows.update(queue, factor, asked, len(rows))
                    key = names.index("rate_key")  # only rated jobs spend from a key's bucket
                    rated = [dict(zip(names, r, strict=True)) for r in rows if r[key]]
                    for spend in queue_spends(queue, limits[queue], rated, len(rows)):
                        cur.execute(Q["rate_spend"], {**spend, "now": ts})
                claims.append((names, rows))
                taken += len(rows)
        jobs: list[JobRecord] = []
        for names, rows in claims:  # one queue's each, in the order the queues were tried
            claimed = self._jobs(names, rows)
            claimed.sort(key=lambda j: (-j.priority, j.scheduled_at, j.id))
            jobs.extend(claimed)
        return jobs

    def job_finalize_many(
        self, *, worker_id: str, outcomes: Sequence[Finalize], now: datetime | None = None
    ) -> list[int]:
        if not outcomes:
            return []
        outcomes = first_outcomes(outcomes)
        ts = _epoch(now)
        accepted: list[int] = []
        # Everything that needs no database is done before the write lock is taken.
        simple = [plain_success(o) for o in outcomes]
        plain = [
            [o.job_id, o.token, o.result_json] for o, p in zip(outcomes, simple, strict=True) if p
        ]
        batch = json.dumps(plain) if plain else None
        with self._tx() as cur:
            done: dict[int, dict[str, Any]] = {}
            if batch is not None:  # the common case: one statement for the batch
                params = {"batch": batch, "now": ts, "worker_id": worker_id}
                done = {row["id"]: row for row in self._q(cur, "job_succeed_many", params)}
            for o, is_plain in zip(outcomes, simple, strict=True):
                if is_plain:
                    row = done.get(o.job_id)
                else:
                    params = {**o._asdict(), "id": o.job_id, "now": ts, "worker_id": worker_id}
                    row = cur.execute(Q["job_finalize_one"], params).fetchone()
                if row is None:
                    continue  # lease no longer held: refused, nothing changed
                accepted.append(o.job_id)
                if row["state"] == JobState.SUCCEEDED:
                    continue  # the job row is its attempt's record (schema v12)
                overruled = row["state"] == JobState.CANCELLED and o.state != JobState.CANCELLED
                cur.execute(
                    Q["attempt_insert"],
                    {
                        "job_id": o.job_id,
                        "attempt": o.ran_attempt or row["attempt"],
                        "stage": o.ran_stage,
                        "worker_id": worker_id,
                        "started_at": row["started_at"],
                        "now": ts,
                        "outcome": Outcome.CANCELLED if overruled else o.outcome,
                        "error": row["error"] if overruled else o.error,
                        "traceback": o.traceback,
                    },
                )
        return accepted

    def job_release_many(
        self, *, worker_id: str, leases: Sequence[Lease], now: datetime | None = None
    ) -> list[int]:
        ts = _epoch(now)
        released = []
        with self._tx() as cur:
            for le in leases:
                row = cur.execute(
                    Q["job_release_one"], {"id": le.job_id, "token": le.token}
                ).fetchone()
                if row is None:
                    continue
                cur.execute(
                    Q["attempt_insert"],
                    {
                        "job_id": le.job_id,
                        "attempt": row["ran"],
                        "stage": row["stage"],
                        "worker_id": worker_id,
                        "started_at": row["started_at"],
                        "now": ts,
                        "outcome": Outcome.RELEASED,
                        "error": "released by its worker; the attempt does not count",
                        "traceback": None,
                    },
                )
                released.append(le.job_id)
        return released

    def worker_heartbeat(self, *, worker: WorkerInfo, now: datetime | None = None) -> Heartbeat:
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
                    "tasks": None if worker.tasks is None else json.dumps(sorted(worker.tasks)),
                    "now": ts,
                },
            ).fetchone()
            held = self._q(cur, "job_held", {"id": worker.id})
            version = self._q(cur, "schema_version")[0]["version"]
        return Heartbeat(
            held={int(r["id"]): str(r["lease_token"]) for r in held},
            cancel=[int(r["id"]) for r in held if r["cancel_requested"]],
            stop=bool(me["stop_requested"]),
            schema_version=int(version),
            resurrected=bool(me["inserted"]),
        )

    def job_rescue(
        self, *, worker_ttl_s: float, limit: int = 1000, now: datetime | None = None
    ) -> RescueResult:
        ts = _epoch(now)
        requeued: list[int] = []
        failed: list[int] = []
        with self._tx() as cur:
            expired = self._q(
                cur,
                "job_expired_leases",
                {"now": ts, "limit": limit, "worker_ttl_s": float(worker_ttl_s)},
            )
            for e in expired:
                row = cur.execute(
                    Q["job_rescue_one"], {"id": e["id"], "now": ts, "why": e["why"]}
                ).fetchone()
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
                        "outcome": Outcome.LOST,
                        "error": row["error"],
                        "traceback": None,
                    },
                )
                (failed if row["state"] == JobState.FAILED else requeued).append(row["id"])
        return RescueResult(requeued=requeued, failed=failed)
