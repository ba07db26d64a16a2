"""MySQL sessions: a connection per thread (pinged after a while idle, made
anew in a forked child), how each is set up, PyMySQL's errors as Conveyor's, the
retry of a transaction after a deadlock or a lock wait timeout, and the change
numbers that stamp a transaction's writes.

The backend's connection hooks (``_tx``, ``_rows``, ``_count``,
``_snapshot_reads``, ``_retrying``) are here, in ``MySQLSession``, the base of
``MySQLBackend``, which adds the operations."""

from __future__ import annotations

import logging
import os
import random
import socket
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import pymysql
import pymysql.cursors

from ...connections import GreenletConnection
from ...errors import ConfigError, DatabaseUnavailable, connect_advice
from .. import waits
from ..sql.backend import SqlBackend
from ..threads import ThreadConnections
from .dialect import _CHANGE, _HORIZON, Q
from .driver import DRIVERS, Driver, driver, errors
from .notifier import HUB, close_quietly

#: a connection of PyMySQL's or of mysqlclient's (the URL's driver option)
Connection = Any

log = logging.getLogger("conveyor.mysql")
T = TypeVar("T")

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
    options = _options(url)
    unknown = set(options) - {"connect_timeout", "unix_socket", "poll_ms", "driver"}
    if unknown:
        raise ConfigError(
            f"unknown MySQL URL option(s) {sorted(unknown)}: the options are "
            "'connect_timeout' (seconds), 'unix_socket' (a path), 'poll_ms' (how "
            "often a worker that was just busy looks for new work, 1 to 1000 ms) and "
            f"'driver' ({' or '.join(DRIVERS)})"
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


def driver_of(url: str) -> Driver:
    """The driver the URL's ``driver`` option names (PyMySQL when it names none)."""
    return driver(_options(url).get("driver", "pymysql"))


def _options(url: str) -> dict[str, str]:
    """The URL's query options, the last of each name."""
    return {k: v[-1] for k, v in parse_qs(urlsplit(url).query).items()}


def poll_seconds(url: str, default_ms: float = 2.0) -> float:
    """The URL's ``poll_ms`` (the notifier's fast cadence: see MySQLNotifier), in seconds."""
    text = _options(url).get("poll_ms")
    if text is None:
        return default_ms / 1000
    try:
        ms = float(text)
    except ValueError:
        ms = -1.0
    if not 1 <= ms <= 1000:
        raise ConfigError(f"MySQL URL option poll_ms must be 1 to 1000 (ms), got {text!r}")
    return ms / 1000


def redact(url: str) -> str:
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()


class MySQLSession(SqlBackend):
    """The connections of a MySQL backend: one per thread, and the hooks through
    which every operation runs its statements."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._kwargs = parse_url(url)
        self._driver = driver_of(url)
        #: the notifier's poll while work was seen lately (the URL's poll_ms)
        self.poll_s = poll_seconds(url)
        self.database = self._kwargs["database"]
        self.hub_key = f"{self._kwargs['host']}:{self._kwargs['port']}/{self.database}"
        self.where = f"the MySQL database {self.database}"
        self._local = threading.local()  # a thread's transaction state (hints, change)
        #: each thread's connection
        self._conns: ThreadConnections[Connection] = ThreadConnections(_reset, close_quietly)
        #: the READ UNCOMMITTED reader of _horizon, one for the process's threads (one
        #: each, a threaded server held twice its threads' connections), when last used
        self._reader: Connection | None = None
        self._reader_used = 0.0
        self._reader_lock = threading.Lock()
        #: the process the connections are this one's in (see _after_fork)
        self._pid = os.getpid()
        #: deadlocks and lock wait timeouts retried so far (racing workers)
        self.deadlock_retries = 0
        conn = self._conn()  # fail now, with the server's reason, if we cannot connect
        self.mariadb = _is_mariadb(conn)

    # -- connections -------------------------------------------------------------------
    def _connect(self) -> Connection:
        kwargs = self._kwargs
        bound = waits.connection_wait_s()  # a server's request: an answer now
        if bound is not None and bound < kwargs["connect_timeout"]:
            kwargs = {**kwargs, "connect_timeout": bound}
        try:
            conn = self._driver.connect(kwargs)
            self._driver.set_socket_options(conn, _NETWORK_DEFAULTS)
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
        except self._driver.Error as exc:
            raise self._unavailable(exc) from exc
        return conn

    def _unavailable(self, exc: BaseException) -> DatabaseUnavailable:
        where = f"{self._kwargs['host']}:{self._kwargs['port']}/{self.database}"
        return DatabaseUnavailable(
            f"cannot connect to MySQL at {where} (user {self._kwargs['user']}): {exc}. "
            f"{connect_advice(str(exc))}",
            transient=_code(exc) in _TRANSIENT_CODES,
        )

    def _conn(self) -> Connection:
        """This thread's connection. One idle for a while is pinged first: after a
        server restart it is dead, and the statement about to use it would fail
        although the server is back (PostgreSQL's pool does the same check)."""
        if self._pid != os.getpid():
            self._after_fork()
        conn = self._conns.mine()  # (one an ended thread left is checked first)
        now = time.monotonic()
        if conn is not None and now - getattr(self._local, "used", now) > CHECK_IDLE_S:
            try:
                self._driver.ping(conn)
            except self._driver.Error:
                self._drop()
                conn = None
        if conn is None:
            conn = self._conns.add(self._connect())
        self._local.used = now
        return conn

    def _after_fork(self) -> None:
        """In a child forked from the process that opened the connections: forget
        them, unclosed, and connect anew. Each is a session of the parent's; a
        statement of the child's on one would interleave with the parent's on the
        same socket, and closing one (a QUIT) would end the parent's session. Their
        sockets close with the child (pymysql closes without a QUIT when collected),
        which the parent's copies do not notice. Kept, never collected: mysqlclient
        sends a QUIT when it collects a connection."""
        self._pid = os.getpid()
        self._local = threading.local()
        _FORGOTTEN.extend(self._conns.after_fork())
        if self._reader is not None:
            _FORGOTTEN.append(self._reader)
        self._reader = None
        self._reader_lock = threading.Lock()

    def _drop(self) -> None:
        """Forget this thread's connection after a connection error: the next call
        connects again."""
        self._conns.discard()

    def _fail(self, exc: Exception, *, drop: bool = True) -> Exception:
        """The error to raise for a driver's: a lost connection (dropped, unless
        ``drop`` is False: not this thread's) as DatabaseUnavailable."""
        if isinstance(exc, self._driver.InterfaceError) or _code(exc) in CONNECTION_ERRORS:
            if drop:
                self._drop()
            return self._unavailable(exc)
        failed: Exception = exc
        return failed

    def _retrying(self, run: Callable[[], T]) -> T:
        """Run ``run`` (one whole transaction of ours) again after a deadlock or a
        lock wait timeout, a bounded number of times, with jittered backoff: the
        hook the shared operations go through (``retried``), and our own."""
        delay = 0.005
        for attempt in range(MAX_RETRIES + 1):
            try:
                return run()
            except self._driver.OperationalError as exc:
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
            if isinstance(exc, self._driver.Error):
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
        if not isinstance(
            conn, pymysql.connections.Connection | GreenletConnection
        ) and not module.startswith("MySQLdb"):
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

            return self._retrying(write)

        def run() -> list[Any]:
            try:
                with self._conn().cursor() as cur:
                    if _HORIZON in text and "horizon" not in params:
                        params["horizon"] = self._horizon()
                    cur.execute(text, params)
                    return list(cur.fetchall()) if cur.description else []
            except self._driver.OperationalError as exc:
                if _code(exc) in RETRYABLE:
                    raise
                raise self._fail(exc) from exc
            except self._driver.InterfaceError as exc:
                raise self._fail(exc) from exc

        return self._retrying(run)

    @contextmanager
    def _snapshot_reads(self) -> Iterator[Callable[..., list[Any]]]:
        """One horizon for every read: numbers below it are all committed, so
        statements that each see the latest commits agree up to it."""
        horizon = self._retrying(self._horizon)

        def read(name: str, params: dict[str, Any], *, sql: str | None = None) -> list[Any]:
            return self._rows(name, {**params, "horizon": horizon}, sql=sql)

        yield read

    def _count(self, name: str, params: dict[str, Any]) -> int:
        def run() -> int:
            with self._tx() as cur:
                return self._qc(cur, name, params)

        return self._retrying(run)

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

    def _taken(self) -> list[int]:
        """The change numbers taken, committed or not: a dirty read on the shared
        reader (pinged first after a while idle, as every connection of ours is)."""
        with self._reader_lock:
            ru = self._reader
            now = time.monotonic()
            try:
                if ru is not None and now - self._reader_used > CHECK_IDLE_S:
                    try:
                        self._driver.ping(ru)
                    except self._driver.Error:
                        close_quietly(ru)
                        self._reader = ru = None
                if ru is None:
                    ru = self._connect()
                    with ru.cursor() as cur:
                        cur.execute("SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")
                    self._reader = ru
                with ru.cursor() as cur:
                    cur.execute(Q["change_numbers"])
                    taken = [int(r["id"]) for r in cur.fetchall()]
            except self._driver.Error as exc:
                self._reader = None
                close_quietly(ru)
                raise self._fail(exc, drop=False) from exc
            self._reader_used = now
            return taken

    def _horizon(self) -> int:
        """The smallest change number that may still commit: stamps below it are
        final. A dirty read (READ UNCOMMITTED) lists the numbers taken, committed
        or not; a committed read then tells which are committed. A number taken
        after the first read is larger than all it saw, so only those count."""
        taken = self._taken()
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
        sql = self.Q[name]
        params = self._stamped(cur, sql, params)
        if name in ("batch_insert", "workflow_insert"):  # no RETURNING: the one row's id
            cur.execute(sql, params)
            return [{"id": cur.lastrowid}] if cur.rowcount == 1 else []
        return super()._q(cur, name, params)

    def _qc(self, cur: Any, name: str, params: dict[str, Any] | None = None) -> int:
        return super()._qc(cur, name, self._stamped(cur, self.Q[name], params))

    def close(self) -> None:
        if self._pid != os.getpid():
            self._after_fork()  # a child closes its own connections, not the parent's
        self._conns.close_all()
        with self._reader_lock:
            reader, self._reader = self._reader, None
        close_quietly(reader)
        self._local = threading.local()


def _reset(conn: Connection) -> bool:
    """Fit for another thread? A transaction its ended thread left open is rolled
    back (a round trip: a connection the server ended fails here, and is closed)."""
    try:
        conn.rollback()
    except errors():
        return False
    return True


def _is_mariadb(conn: Any) -> bool:
    """Whether the server is MariaDB (``conn``'s handshake names it), not MySQL."""
    return "mariadb" in str(conn.get_server_info()).lower()


#: TCP keepalives and a send timeout on each connection's socket (as the PostgreSQL
#: backend asks libpq for): through a network that silently drops packets, a read
#: or write fails within seconds instead of hanging for the kernel's default of
#: many minutes, so a worker cut off from the database stays able to stop and to
#: reconnect. (level, option, value); options this platform lacks are left out.
_NETWORK_DEFAULTS = [
    (level, name, value)
    for level, name, value in (
        (socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPIDLE", None), 10),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPINTVL", None), 3),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_KEEPCNT", None), 3),
        (socket.IPPROTO_TCP, getattr(socket, "TCP_USER_TIMEOUT", None), 15_000),
    )
    if name is not None
]

#: connections a forked child inherited and forgot (see _after_fork)
_FORGOTTEN: list[Any] = []


def _dict_cursor(conn: Any) -> Any:
    """The dict cursor class of the caller's driver (PyMySQL, mysqlclient; under
    SQLAlchemy's asyncio, aiomysql or asyncmy): ``<package>.cursors.DictCursor``."""
    if isinstance(conn, GreenletConnection):
        conn = conn.driver
    if not isinstance(conn, pymysql.connections.Connection):
        import importlib

        package = type(conn).__module__.split(".", 1)[0]
        return importlib.import_module(f"{package}.cursors").DictCursor
    return pymysql.cursors.DictCursor
