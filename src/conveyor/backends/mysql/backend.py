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
import logging
import math
import os
import random
import secrets
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import pymysql
import pymysql.cursors
from pymysql.constants import CLIENT

from ...errors import ConfigError, DatabaseUnavailable
from ...records import (
    Finalize,
    Heartbeat,
    Inserted,
    JobInsert,
    JobRecord,
    JobState,
    Lease,
    Outcome,
    RescueResult,
    WorkerInfo,
)
from .. import waits
from ..interfaces import Notifier, sent_by
from ..sql.backend import SqlBackend, chunks
from ..sql.loader import Dialect, load_migrations, load_queries
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

log = logging.getLogger("conveyor.mysql")
T = TypeVar("T")

_NOW = "coalesce(CAST(%(now)s AS DATETIME(6)), UTC_TIMESTAMP(6))"
#: A change stamp: the writing transaction's number (see ``_change``), sent as a
#: parameter the backend adds to every statement that stamps.
_CHANGE = "%(change)s"
#: The first number that may still commit (see ``_horizon``), also a parameter.
_HORIZON = "%(horizon)s"


def _in(args: list[str]) -> str:
    # PyMySQL sends a tuple as "(a, b, ...)"; the backend sends (NULL) for an
    # empty list, which matches nothing (PostgreSQL: = ANY(array)).
    return f"IN {args[0]}"


DIALECT = Dialect(
    name="mysql",
    paramstyle="pyformat",
    macros={
        "NOW": lambda a: _NOW,
        # Whole microseconds: INTERVAL 1.5 SECOND would round to 2 seconds.
        # (an argument may hold commas: the loader split it, join it again)
        "NOW_PLUS": lambda a: f"({_NOW} + INTERVAL ROUND(({', '.join(a)}) * 1000000) MICROSECOND)",
        "NOW_MINUS": lambda a: f"({_NOW} - INTERVAL ROUND(({', '.join(a)}) * 1000000) MICROSECOND)",
        "SECONDS_SINCE": lambda a: f"(TIMESTAMPDIFF(MICROSECOND, {a[0]}, {_NOW}) / 1000000)",
        "IN": _in,
        "JSON": lambda a: a[0],
        "TS": lambda a: f"CAST({a[0]} AS DATETIME(6))",
        "FOR_UPDATE": lambda a: "FOR UPDATE",
        "INDEXED_BY": lambda a: "",  # the planner has statistics
        # The tables' collation is binary (exact keys): lower both sides.
        "ICONTAINS": lambda a: f"LOWER(CAST({a[0]} AS CHAR)) LIKE LOWER({a[1]})",
        "GREATEST": lambda a: f"GREATEST({', '.join(a)})",
        "CHANGE": lambda a: _CHANGE,
        "HORIZON": lambda a: _HORIZON,
        "CHANGED_AFTER": lambda a: (
            f"({a[0]} > CAST({a[2]} AS SIGNED)"
            f" OR ({a[0]} = CAST({a[2]} AS SIGNED) AND {a[1]} > {a[3]}))"
        ),
        "CHANGE_HORIZON": lambda a: f"{a[0]} < {_HORIZON}",
        "CHANGE_TEXT": lambda a: a[0],
    },
)
Q = load_queries(__package__ or "conveyor.backends.mysql", DIALECT, own_named=True)
MIGRATIONS = load_migrations(__package__ or "conveyor.backends.mysql")

#: MySQL error codes: deadlock, lock wait timeout (the transaction is rolled back
#: or the statement fails; either way we retry the whole transaction)
RETRYABLE = frozenset({1213, 1205})
#: connection-level failures (gone away, lost, cannot connect, server shutdown)
CONNECTION_ERRORS = frozenset({2003, 2006, 2013, 2055, 1053, 1927, 4031})
MAX_RETRIES = 8
#: a connection idle this long is pinged before use
CHECK_IDLE_S = 2.0
#: a server that does not answer yet or is going away: those, and too many
#: connections, no socket, unknown host; 1045 (access denied) and 1049 (unknown
#: database) are answers, not outages
_TRANSIENT_CODES = CONNECTION_ERRORS | {1040, 2002, 2005}
#: the server ends a session of ours idle this long (wait_timeout)
SESSION_IDLE_S = 300
#: the days of finished jobs are made this far ahead (partitions, schema v21),
#: this often, and their upkeep waits this long for the table before giving up
DAYS_AHEAD = 2
DAYS_EVERY_S = 3600.0
UPKEEP_WAIT_S = 2


def _code(exc: BaseException) -> int:
    args = getattr(exc, "args", ())
    return int(args[0]) if args and isinstance(args[0], int) else 0


def parse_url(url: str) -> dict[str, Any]:
    """``mysql://user:pass@host:3306/db`` (or ``mariadb://``) as PyMySQL arguments."""
    parts = urlsplit(url)
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ConfigError(
            f"MySQL URL {redact(url)} names no database: use mysql://user:pass@host:3306/dbname"
        )
    try:
        port = parts.port or 3306
    except ValueError as exc:
        raise ConfigError(f"malformed MySQL URL {redact(url)}: {exc}") from exc
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = set(options) - {"connect_timeout", "unix_socket"}
    if unknown:
        raise ConfigError(
            f"unknown MySQL URL option(s) {sorted(unknown)}: the options are "
            "'connect_timeout' (seconds) and 'unix_socket' (a path)"
        )
    kwargs: dict[str, Any] = {
        "host": parts.hostname or "127.0.0.1",
        "port": port,
        "user": unquote(parts.username) if parts.username else "root",
        "password": unquote(parts.password) if parts.password else "",
        "database": database,
        "connect_timeout": float(options.get("connect_timeout", 10)),
    }
    if "unix_socket" in options:
        kwargs["unix_socket"] = options["unix_socket"]
    return kwargs


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


class _Hub:
    """Wake-ups inside one process: a commit that made work wakes this process's
    notifiers of the same database at once (other processes poll)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._notifiers: dict[str, weakref.WeakSet[MySQLNotifier]] = {}

    def add(self, key: str, notifier: MySQLNotifier) -> None:
        with self._lock:
            self._notifiers.setdefault(key, weakref.WeakSet()).add(notifier)

    def fire(self, key: str, hints: set[str]) -> None:
        with self._lock:
            targets = list(self._notifiers.get(key, ()))
        for n in targets:
            n.hint(hints)


HUB = _Hub()


class MySQLNotifier(Notifier):
    """No LISTEN on MySQL: hints from this process arrive at once (the hub), and
    changes committed by other processes are noticed by polling the largest change
    stamp, every ``fast`` seconds while changes keep coming, backing off to
    ``slow`` when idle. Stamps that do not move (a flag set, a late commit of an
    older stamp) are left to the worker's own polling."""

    def __init__(self, backend: MySQLBackend, fast: float = 0.02, slow: float = 0.25) -> None:
        self._backend = backend
        self._fast, self._slow = fast, slow
        self._interval = fast
        self._event = threading.Event()
        self._hints: set[str] = set()
        self._lock = threading.Lock()
        self._closed = False
        self._conn: pymysql.connections.Connection[Any] | None = None
        self._last: tuple[Any, Any] | None = None
        HUB.add(backend.hub_key, self)
        self._last = self._poll()

    def hint(self, hints: set[str]) -> None:
        with self._lock:
            self._hints |= hints
        self._event.set()

    def _poll(self) -> tuple[Any, Any] | None:
        try:
            if self._conn is None:
                self._conn = self._backend._connect()
            with self._conn.cursor() as cur:
                cur.execute(Q["max_change"])
                row = cur.fetchone()
            return (row["jobs"], row["batches"])
        except pymysql.Error:
            conn, self._conn = self._conn, None
            if conn is not None:
                try:
                    conn.close()
                except Exception:
                    pass
            return None

    def wait(self, timeout: float) -> set[str]:
        deadline = time.monotonic() + timeout
        while not self._closed:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return set()
            if self._event.wait(min(self._interval, remaining)):
                with self._lock:
                    hints, self._hints = self._hints, set()
                    self._event.clear()
                if hints:
                    self._interval = self._fast
                    return hints
                continue
            if self._closed:
                break
            stamp = self._poll()
            if stamp is not None and stamp != self._last:
                self._last = stamp
                self._interval = self._fast
                return {"*"}
            self._interval = min(self._interval * 2, self._slow)
        return set()

    def close(self) -> None:
        self._closed = True
        self._event.set()
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass


class MySQLBackend(SqlBackend):
    name = "mysql"
    capabilities = frozenset({"skip_locked", "network"})
    where = "the MySQL database"
    Q = Q
    MIGRATIONS = MIGRATIONS

    def __init__(self, url: str) -> None:
        self.url = url
        #: per keyed queue, how far past its size a claim looks (next_window_factor)
        self._windows = WindowSizes()
        self._kwargs = parse_url(url)
        self.database = self._kwargs["database"]
        self.hub_key = f"{self._kwargs['host']}:{self._kwargs['port']}/{self.database}"
        self.where = f"the MySQL database {self.database}"
        self._local = threading.local()
        self._all: list[pymysql.connections.Connection[Any]] = []
        self._lock = threading.Lock()
        #: the process the connections are this one's in (see _after_fork)
        self._pid = os.getpid()
        #: deadlocks and lock wait timeouts retried so far (racing workers)
        self.deadlock_retries = 0
        #: when this process last made the days ahead (job_prune)
        self._days_made_at = -math.inf
        conn = self._conn()  # fail now, with the server's reason, if we cannot connect
        self.mariadb = _is_mariadb(conn)

    # -- connections -------------------------------------------------------------------
    def _connect(self) -> pymysql.connections.Connection[Any]:
        kwargs = self._kwargs
        bound = waits.connection_wait_s()  # a server's request: an answer now
        if bound is not None and bound < kwargs["connect_timeout"]:
            kwargs = {**kwargs, "connect_timeout": bound}
        try:
            conn = pymysql.connect(
                **kwargs,
                charset="utf8mb4",
                autocommit=True,
                cursorclass=pymysql.cursors.DictCursor,
                # rowcount = rows matched, as on PostgreSQL and SQLite (not only changed)
                client_flag=CLIENT.FOUND_ROWS,
            )
            _network_defaults(conn)
            with conn.cursor() as cur:
                # UTC everywhere; READ COMMITTED: no gap locks (REPEATABLE READ's
                # next-key locks make SKIP LOCKED claims block each other), and each
                # statement sees what committed before it (limited claims rely on it).
                cur.execute("SET time_zone = '+00:00'")
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED")
                # Our transactions are short: a lock held for seconds belongs to a
                # client that is gone or stuck. Give up after 10 s (not InnoDB's 50)
                # and retry the whole transaction (error 1205), so a worker that
                # was cut off, or is stopping, is never held for most of a minute.
                cur.execute("SET SESSION innodb_lock_wait_timeout = 10")
                # A transaction of ours left idle mid-way is ended by the server,
                # its locks with it (SqlBackend.IDLE_TRANSACTION_S). MariaDB only:
                # MySQL has no such setting (there the locks stay until the
                # session's wait_timeout, 8 hours by default).
                if _is_mariadb(conn):
                    idle = max(1, round(self.IDLE_TRANSACTION_S))
                    cur.execute(f"SET SESSION idle_transaction_timeout = {idle}")
                # A session cut off from us between a claim's COMMIT and the release
                # of its key locks (limits_lock_keys) keeps them until the server
                # ends it: after 5 idle minutes, not 8 hours. Our idle connections
                # are pinged before use (CHECK_IDLE_S) and made again if ended.
                cur.execute(f"SET SESSION wait_timeout = {SESSION_IDLE_S}")
        except pymysql.Error as exc:
            raise self._unavailable(exc) from exc
        return conn

    def _unavailable(self, exc: BaseException) -> DatabaseUnavailable:
        where = f"{self._kwargs['host']}:{self._kwargs['port']}/{self.database}"
        return DatabaseUnavailable(
            f"cannot connect to MySQL at {where} (user {self._kwargs['user']}): {exc}. "
            "Check that the server is running and the URL (host, port, user, database) is right.",
            transient=_code(exc) in _TRANSIENT_CODES,
        )

    def _conn(self) -> pymysql.connections.Connection[Any]:
        """This thread's connection. One idle for a while is pinged first: after a
        server restart it is dead, and the statement about to use it would fail
        although the server is back (PostgreSQL's pool does the same check)."""
        if self._pid != os.getpid():
            self._after_fork()
        conn: pymysql.connections.Connection[Any] | None = getattr(self._local, "conn", None)
        now = time.monotonic()
        if conn is not None and now - getattr(self._local, "used", now) > CHECK_IDLE_S:
            try:
                conn.ping(reconnect=False)
            except pymysql.Error:
                self._drop()
                conn = None
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._lock:
                self._all.append(conn)
        self._local.used = now
        return conn

    def _after_fork(self) -> None:
        """In a child forked from the process that opened the connections: forget
        them, unclosed, and connect anew. Each is a session of the parent's; a
        statement of the child's on one would interleave with the parent's on the
        same socket, and closing one (a QUIT) would end the parent's session. Their
        sockets close with the child (pymysql closes without a QUIT when collected),
        which the parent's copies do not notice."""
        self._pid = os.getpid()
        self._local = threading.local()
        self._all = []
        self._lock = threading.Lock()  # the parent's may have been held at the fork

    def _drop(self) -> None:
        """Forget this thread's connection after a connection error: the next call
        connects again."""
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with self._lock:
                if conn in self._all:
                    self._all.remove(conn)
            try:
                conn.close()
            except Exception:
                pass

    def _fail(self, exc: pymysql.Error) -> Exception:
        if isinstance(exc, pymysql.err.InterfaceError) or _code(exc) in CONNECTION_ERRORS:
            self._drop()
            return self._unavailable(exc)
        failed: Exception = exc
        return failed

    def _retry(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` (one whole transaction of ours) again after a deadlock or a
        lock wait timeout, a bounded number of times, with jittered backoff."""
        delay = 0.005
        for attempt in range(MAX_RETRIES + 1):
            try:
                return fn()
            except pymysql.err.OperationalError as exc:
                if _code(exc) not in RETRYABLE or attempt == MAX_RETRIES:
                    raise
                self.deadlock_retries += 1
                log.debug("retrying after MySQL error %s: %s", _code(exc), exc)
            time.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 2, 0.5)
        raise AssertionError("unreachable")

    @contextmanager
    def _tx(self, conn: Any = None) -> Iterator[Any]:
        """A cursor in a transaction: the caller's (``conn``) or one of ours.
        Hints (``_wake``) of our own transactions are sent after the commit."""
        if conn is not None:
            self._check_caller_conn(conn)
            cur = conn.cursor(_dict_cursor(conn))
            self._local.hints = None  # the caller commits: hint at once
            self._local.change = None  # a number of its own, in the caller's transaction
            try:
                yield cur
            finally:
                cur.close()
            return
        own = self._conn()
        hints: set[str] = set()
        self._local.hints = hints
        self._local.change = None
        try:
            own.begin()
            cur = own.cursor()
            try:
                yield cur
            finally:
                cur.close()
            own.commit()
        except BaseException as exc:
            try:
                own.rollback()
            except Exception:
                pass
            if isinstance(exc, pymysql.Error):
                failed = self._fail(exc)
                if failed is not exc:
                    raise failed from exc
            raise
        finally:
            self._local.hints = None
        if hints:
            HUB.fire(self.hub_key, hints)

    def _check_caller_conn(self, conn: Any) -> None:
        module = type(conn).__module__
        if not isinstance(conn, pymysql.connections.Connection) and not module.startswith(
            "MySQLdb"
        ):
            raise ConfigError(
                "conn= must be a PyMySQL (or mysqlclient) connection for a MySQL app, "
                f"got {type(conn).__name__}"
            )
        cur = conn.cursor()
        try:
            cur.execute("SELECT DATABASE()")
            row = cur.fetchone()
        finally:
            cur.close()
        name = row[0] if isinstance(row, tuple | list) else next(iter(row.values()))
        if name != self.database:
            raise ConfigError(
                f"conn= is connected to database {name!r}, not to this app's {self.database!r}"
            )

    def _wake(self, cur: Any, queues: Sequence[str]) -> None:
        hints: set[str] | None = getattr(self._local, "hints", None)
        if hints is None:
            HUB.fire(self.hub_key, set(queues))
        else:
            hints.update(queues)

    def _rows(self, name: str, params: dict[str, Any], *, sql: str | None = None) -> list[Any]:
        text = sql or Q[name]
        if _CHANGE in text:  # a write that stamps: in a transaction with its number

            def write() -> list[Any]:
                with self._tx() as cur:
                    cur.execute(text, self._stamped(cur, text, params))
                    return list(cur.fetchall()) if cur.description else []

            return self._retry(write)

        def run() -> list[Any]:
            try:
                with self._conn().cursor() as cur:
                    if _HORIZON in text and "horizon" not in params:
                        params["horizon"] = self._horizon()
                    cur.execute(text, params)
                    return list(cur.fetchall()) if cur.description else []
            except pymysql.err.OperationalError as exc:
                if _code(exc) in RETRYABLE:
                    raise
                raise self._fail(exc) from exc
            except pymysql.err.InterfaceError as exc:
                raise self._fail(exc) from exc

        return self._retry(run)

    @contextmanager
    def _snapshot_reads(self) -> Iterator[Callable[..., list[Any]]]:
        """One horizon for every read: numbers below it are all committed, so
        statements that each see the latest commits agree up to it."""
        horizon = self._retry(self._horizon)

        def read(name: str, params: dict[str, Any], *, sql: str | None = None) -> list[Any]:
            return self._rows(name, {**params, "horizon": horizon}, sql=sql)

        yield read

    def _count(self, name: str, params: dict[str, Any]) -> int:
        def run() -> int:
            with self._tx() as cur:
                return self._qc(cur, name, params)

        return self._retry(run)

    def _stamped(self, cur: Any, sql: str, params: dict[str, Any] | None) -> dict[str, Any]:
        params = dict(params or {})
        if _CHANGE in sql:
            params["change"] = self._change(cur)
        return params

    def _change(self, cur: Any) -> int:
        """This transaction's change number, taken at its first stamped write: a new
        row of conveyor_change_tx, which stays locked (and, to other readers,
        uncommitted) until the transaction ends; numbers grow in the order taken."""
        change: int | None = getattr(self._local, "change", None)
        if change is None:
            cur.execute(Q["change_take"])
            change = self._local.change = int(cur.lastrowid)
        return change

    def _horizon(self) -> int:
        """The smallest change number that may still commit: stamps below it are
        final. A dirty read (READ UNCOMMITTED) lists the numbers taken, committed
        or not; a committed read then tells which are committed. A number taken
        after the first read is larger than all it saw, so only those count."""
        ru: pymysql.connections.Connection[Any] | None = getattr(self._local, "ru", None)
        if ru is None:
            ru = self._local.ru = self._connect()
            with self._lock:
                self._all.append(ru)
            with ru.cursor() as cur:
                cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
        try:
            with ru.cursor() as cur:
                cur.execute(Q["change_numbers"])
                taken = [int(r["id"]) for r in cur.fetchall()]
        except pymysql.Error as exc:
            self._local.ru = None
            raise self._fail(exc) from exc
        if not taken:
            return 1
        with self._conn().cursor() as cur:
            cur.execute(Q["change_numbers_committed"], {"low": taken[0], "high": taken[-1]})
            committed = {int(r["id"]) for r in cur.fetchall()}
        still_open = [i for i in taken if i not in committed]
        horizon = still_open[0] if still_open else taken[-1] + 1
        if len(taken) > 10_000:  # no leader pruned them (no worker runs services)
            self._count("change_prune", {"horizon": horizon})
        return horizon

    def _q(self, cur: Any, name: str, params: dict[str, Any] | None = None) -> list[Any]:
        sql = Q[name]
        params = self._stamped(cur, sql, params)
        if name == "batch_insert":  # no RETURNING on MySQL: the id of the one row
            cur.execute(sql, params)
            return [{"id": cur.lastrowid}] if cur.rowcount == 1 else []
        return super()._q(cur, name, params)

    def _qc(self, cur: Any, name: str, params: dict[str, Any] | None = None) -> int:
        return super()._qc(cur, name, self._stamped(cur, Q[name], params))

    def _migration_lock(self, cur: Any) -> None:
        pass  # a session lock taken around the whole migration (migrate)

    def migrate(self) -> list[int]:
        # DDL commits implicitly in MySQL: a migration is not atomic with its
        # version row. A named lock keeps two migrators apart.
        with self._conn().cursor() as cur:
            cur.execute(Q["migration_lock"])
        try:
            return super().migrate()
        finally:
            with self._conn().cursor() as cur:
                cur.execute(Q["migration_unlock"])

    def close(self) -> None:
        if self._pid != os.getpid():
            self._after_fork()  # a child closes its own connections, not the parent's
        with self._lock:
            conns, self._all = self._all, []
        for conn in conns:
            try:
                conn.close()
            except Exception:
                pass
        self._local = threading.local()

    def notifier(self, *, events: bool = False) -> Notifier:
        return MySQLNotifier(self)

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

    # -- retried operations --------------------------------------------------------------
    # Each of these is one transaction of ours: after a deadlock it runs again whole.
    def job_insert_many(
        self, *, jobs: Sequence[JobInsert], conn: Any = None, now: datetime | None = None
    ) -> list[Inserted]:
        if conn is not None:
            return super().job_insert_many(jobs=jobs, conn=conn, now=now)
        return self._retry(lambda: super(MySQLBackend, self).job_insert_many(jobs=jobs, now=now))

    def batch_create(self, **kw: Any) -> tuple[int, bool]:
        if kw.get("conn") is not None:
            return super().batch_create(**kw)
        return self._retry(lambda: super(MySQLBackend, self).batch_create(**kw))

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
            rows = self._retry(lambda: self._claim_free(free, base, limit))
        for queue in (q for q in queues if q in limits):
            if len(rows) >= limit:
                break
            room = limit - len(rows)
            lim = limits[queue]
            rows += self._retry(
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
        tokens = json.dumps({str(i): secrets.token_hex(16) for i in ids})
        self._qc(cur, "job_claim_update", {**base, "ids": self._list(ids), "tokens": tokens})
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
        except pymysql.Error:
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
        return self._retry(lambda: self._finalize(worker_id, firsts, self._now(now)))

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
                results = {str(o.job_id): json.loads(o.result_json) for o in plain if o.result_json}
                self._qc(
                    cur,
                    "job_succeed_many",
                    {
                        "ids": self._list([o.job_id for o in plain]),
                        "results": json.dumps(results),
                        "worker_id": worker_id,
                        "now": ts,
                    },
                )
                accepted += [o.job_id for o in plain]
            for o in mine:
                if plain_success(o):
                    continue
                params = {**o._asdict(), "id": o.job_id, "now": ts, "worker_id": worker_id}
                if self._qc(cur, "job_finalize_one", params):
                    accepted.append(o.job_id)
            if not accepted:
                return []
            after = {
                int(r["id"]): r
                for r in self._q(cur, "job_finalized", {"ids": self._list(accepted)})
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
                            "error": "released at worker shutdown; the attempt does not count",
                            "traceback": None,
                        },
                    )
                    released.append(jid)
                if rows:
                    self._wake(cur, sorted({r["queue"] for r in rows}))
            return released

        return self._retry(run)

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

        return self._retry(run)

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

        return self._retry(run)

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

        return self._retry(run)

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

        return self._retry(run)

    def job_prune(
        self,
        *,
        state: str,
        older_than_s: float,
        limit: int = 1000,
        dry_run: bool = False,
        now: datetime | None = None,
    ) -> int:
        """Whole days of finished jobs first (dropped partitions, schema v21), then
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
        shared = SqlBackend.job_prune
        return gone + self._retry(
            lambda: shared(
                self, state=state, older_than_s=older_than_s, limit=limit, dry_run=dry_run, now=now
            )
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
        except pymysql.err.OperationalError as exc:
            if _code(exc) not in RETRYABLE:
                raise self._fail(exc) from exc
            log.info("%s skipped this time: %s", name, exc)
            return 0
        return int(row["gone"] or 0) if row else 0

    def counts_fold(self) -> None:
        self._fold(
            "counts_fold_pick", "counts_add", "count_deltas_delete", ("queue", "task", "state")
        )
        self._fold(  # the batches' rollup (schema v16)
            "batch_counts_fold_pick",
            "batch_counts_add",
            "batch_count_deltas_delete",
            ("batch_id", "state"),
        )
        # The leader's pass also forgets change numbers no reader needs any more.
        self._count("change_prune", {"horizon": self._horizon()})

    def _fold(self, pick: str, add: str, delete: str, key: tuple[str, ...]) -> None:
        """Move the deltas the triggers appended into their rollup, 10,000 at a time:
        summed per key here, added, then exactly the rows read deleted."""

        def run() -> int:
            with self._tx() as cur:
                rows = self._q(cur, pick)
                sums: dict[tuple[Any, ...], int] = {}
                for r in rows:
                    k = tuple(r[c] for c in key)
                    sums[k] = sums.get(k, 0) + int(r["n"])
                for k, n in sorted(sums.items()):
                    if n:
                        self._qc(cur, add, {**dict(zip(key, k, strict=True)), "n": n})
                for ids in chunks([int(r["id"]) for r in rows], 1000):
                    self._qc(cur, delete, {"ids": self._list(list(ids))})
            return len(rows)

        while self._retry(run) >= 10000:
            pass


def _is_mariadb(conn: Any) -> bool:
    """Whether the server is MariaDB (``conn``'s handshake names it), not MySQL."""
    return "mariadb" in str(conn.get_server_info()).lower()


def _network_defaults(conn: Any) -> None:
    """TCP keepalives and a send timeout on the connection's socket (as the
    PostgreSQL backend asks libpq for): through a network that silently drops
    packets, a read or write fails within seconds instead of hanging for the
    kernel's default of many minutes, so a worker cut off from the database stays
    able to stop and to reconnect."""
    sock = getattr(conn, "_sock", None)
    if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    options = [
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), 10),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), 3),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), 3),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), 15_000),
    ]
    for level, name, value in options:
        if name is None:  # not on this platform
            continue
        try:
            sock.setsockopt(level, name, value)
        except OSError:
            pass


def _naive_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        return value
    return value.astimezone(UTC).replace(tzinfo=None)


def _dict_cursor(conn: Any) -> Any:
    """The dict cursor class of the caller's driver (PyMySQL or mysqlclient)."""
    if not isinstance(conn, pymysql.connections.Connection):
        import importlib

        return importlib.import_module("MySQLdb.cursors").DictCursor
    return pymysql.cursors.DictCursor


# Operations of the shared backend that are one transaction of ours each: retried
# whole after a deadlock or a lock wait timeout.
_RETRIED = (
    "job_retry_many",
    "job_cancel_many",
    "job_delete_many",
    "worker_request_stop",
    "leader_attempt_elect",
    "queue_set_paused",
    "queue_set_limit",
    "queue_set_rate",
    "batch_cancel",
    "batch_close",
    "job_chain_append",
    "job_chain_advance",
    "cron_first_seen",
    "token_insert",
    "action_insert",
    "action_update",
    "task_settings_set",
)


def _retried(name: str) -> Callable[..., Any]:
    shared = getattr(SqlBackend, name)

    def method(self: MySQLBackend, *args: Any, **kwargs: Any) -> Any:
        return self._retry(lambda: shared(self, *args, **kwargs))

    method.__name__ = name
    method.__doc__ = shared.__doc__
    return method


for _name in _RETRIED:
    setattr(MySQLBackend, _name, _retried(_name))
