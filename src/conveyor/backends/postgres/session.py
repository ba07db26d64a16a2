"""PostgreSQL sessions: the connection pool (opened again in a forked child),
how a connection is set up and checked before use, the URL's own options and a
transaction pooler told at start, one transaction of ours run again after a
row moved under it, and psycopg's errors as Conveyor's.

The backend's connection hooks (``_tx``, ``_rows``, ``_count``,
``_snapshot_reads``) are here, in ``PostgresSession``, the base of
``PostgresBackend``, which adds the operations."""

from __future__ import annotations

import functools
import logging
import os
import random
import re
import select
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
from psycopg.rows import dict_row
from psycopg.types.string import TextLoader
from psycopg_pool import ConnectionPool, PoolClosed, PoolTimeout

from ...connections import GreenletConnection
from ...errors import ConfigError, DatabaseUnavailable, connect_advice, redact_url
from .. import waits
from ..sql.backend import SqlBackend
from .dialect import CHANNEL, EVENTS, Q

log = logging.getLogger("conveyor.postgres")
T = TypeVar("T")

#: pools a forked child inherited (PostgresBackend.pool): kept, so never closed
_INHERITED: list[Any] = []
_FORK_LOCK = threading.Lock()


def _new_fork_lock() -> None:
    """In a forked child: a lock a parent's thread held at the fork stays held."""
    global _FORK_LOCK
    _FORK_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_fork_lock)

_SQLSTATE = psycopg.pq.DiagnosticField.SQLSTATE


def _send_error(pg: Any, res: Any, encoding: str) -> psycopg.Error:
    """The error psycopg's ``execute`` would raise for this result: the server's,
    by its SQLSTATE; a connection lost without one (a cut network, a server gone
    before it could say why) is an OperationalError, as psycopg's wait makes it."""
    if not res.error_field(_SQLSTATE) and pg.status == psycopg.pq.ConnStatus.BAD:
        message = res.get_error_message(encoding).strip()
        return psycopg.OperationalError(message or "the connection to the server was lost")
    return psycopg.errors.error_from_result(res, encoding=encoding)


def _text_params(values: Iterable[Any], encoding: str) -> list[bytes | None] | None:
    """Parameters in PostgreSQL's text format, each typed by the statement it goes
    to (as psycopg sends them, less its per-value adapter lookups). None for a
    value this does not write the way psycopg would: the caller then sends the
    statement through psycopg, whose error is the one to give. A NUL is one
    (libpq ends a text parameter at it), and so is a string the connection's
    encoding cannot hold."""
    out: list[bytes | None] = []
    for v in values:
        kind = type(v)
        if v is None:
            out.append(None)
        elif kind is str:
            try:
                data = v.encode(encoding)
            except UnicodeEncodeError:
                return None
            if b"\0" in data:
                return None
            out.append(data)
        elif kind is int:  # (not bool: type(True) is bool)
            out.append(str(v).encode())
        elif kind is float:  # repr round-trips; PostgreSQL reads nan and inf too
            out.append(repr(v).encode())
        elif kind is bool:
            out.append(b"t" if v else b"f")
        elif kind is datetime:  # naive: read in the session's time zone, as psycopg's
            out.append(v.isoformat().encode())
        else:
            return None
    return out


#: A row another transaction moved to a different partition since this statement's
#: snapshot (an outcome moves its job out of the live partition, schema v17), or a
#: deadlock: the transaction is rolled back, and the backend runs it again.
_MOVED = (psycopg.errors.SerializationFailure, psycopg.errors.DeadlockDetected)
#: how many times a transaction is run before the error is the caller's
MOVED_TRIES = 8
#: a pooled connection idle this long is checked before use (a server restart
#: leaves dead connections in the pool; a busy one is not pinged every time)
CHECK_IDLE_S = 2.0


def _configure(
    conn: psycopg.Connection[Any], *, owner: type[SqlBackend], pooled: bool = False
) -> None:
    """Hand jsonb back as text: every dialect then decodes JSON the same way, and a
    JSON string result is never mistaken for an encoded document.

    ``pooled`` (a transaction pooler): no settings, which would stay on whichever
    server session ran the SET, another client's next; set them on the role
    instead (``ALTER ROLE ... SET jit = off``). ``owner``: the backend's class,
    read for its IDLE_TRANSACTION_S when each connection is made."""
    conn.adapters.register_loader("jsonb", TextLoader)
    if pooled:
        return
    # Our statements are short and touch few rows; JIT compiling them costs far more
    # than it saves (a claim estimated expensive spent 935 ms compiling, 4 ms running).
    # A transaction of ours left idle mid-way is ended by the server (see
    # SqlBackend.IDLE_TRANSACTION_S), its locks with it.
    idle_ms = int(owner.IDLE_TRANSACTION_S * 1000)
    conn.execute(f"SET jit = off; SET idle_in_transaction_session_timeout = {idle_ms}")


def _result_rows(cur: psycopg.Cursor[Any]) -> list[Any]:
    """The rows the statement returned; none for one that returns no rows. Told
    by the result's status, not ``cur.description``, which builds a Column object
    per column each time (9 us a statement)."""
    res = cur.pgresult
    if res is None or res.status != psycopg.pq.ExecStatus.TUPLES_OK:
        return []
    return cur.fetchall()


_returned: dict[int, float] = {}


#: How long a call waits for a connection the pool cannot make (the database
#: down, restarting or out of reach) before it raises DatabaseUnavailable
DOWN_WAIT_S = 3.0


class _Unanswered(PoolTimeout):
    """No connection within the bound while the pool had room for one: the
    server does not answer (a busy pool is waited for: not this)."""

    def __init__(self, bound: float) -> None:
        super().__init__(f"no connection could be made within {bound:g}s")


class _Pool(ConnectionPool):
    """Notes when each connection came back, for ``_check``. Here and not in a
    ``reset=`` callback: with one, the pool hands every returned connection to
    its worker thread (a thread switch per statement: a tenth of a lone send's
    520 us in py-spy), and the next statement may find it not yet back.

    And hands out the connection returned last (LIFO, as PgBouncer does by
    default) instead of the one idle longest: psycopg_pool's round robin sends
    a lone producer's statements to each server process in turn, whose caches
    are then cold every time (one-by-one sends alternating between two
    connections: twice the time of the same sends on one)."""

    def getconn(self, timeout: float | None = None) -> psycopg.Connection[Any]:
        # A bound before the pool's own 30 s (the caller's context's: a server's
        # request; else DOWN_WAIT_S): while the database is down, no connection
        # comes back at all, and a send that waited 30 s for one said nothing of
        # why (a warm producer's send during an outage; a cold one failed at once).
        if timeout is not None:
            return super().getconn(timeout)
        bound = waits.connection_wait_s() or DOWN_WAIT_S
        try:
            return super().getconn(bound)
        except PoolTimeout as exc:
            # Every connection the pool may have is lent out: the database answers,
            # the process is busy. The bound is for a database that is down; a busy
            # one is waited for as long as anyone waits.
            stats = self.get_stats()
            if stats.get("pool_size", 0) < self.max_size or stats.get("pool_available", 0):
                raise _Unanswered(bound) from exc
            return super().getconn(max(self.timeout - bound, 0.1))

    def putconn(self, conn: psycopg.Connection[Any]) -> None:
        _returned[id(conn)] = time.monotonic()
        super().putconn(conn)
        idle = getattr(self, "_pool", None)  # psycopg_pool's deque, taken from the left
        if isinstance(idle, deque) and len(idle) > 1:
            with self._lock:
                if idle and idle[-1] is conn:
                    idle.rotate(1)


def _check(conn: psycopg.Connection[Any]) -> None:
    """Ping a connection that sat idle in the pool: after a server restart it is
    dead, and the statement about to use it would fail although the server is up.
    One used moments ago is pinged only if the server spoke on it since, which it
    does not on an idle connection unless it is going away (a shutdown's or a
    crash's last message, then the end of the stream): one poll of the socket, no
    round trip, and the first statement after a quick restart finds a live one."""
    if time.monotonic() - _returned.get(id(conn), 0.0) > CHECK_IDLE_S or _spoke(conn):
        ConnectionPool.check_connection(conn)


def _spoke(conn: psycopg.Connection[Any]) -> bool:
    try:
        return _readable([conn.pgconn.socket], 0)
    except (OSError, ValueError, psycopg.OperationalError):
        return True  # no usable socket: let the ping say so


def _network_defaults(url: str) -> dict[str, Any]:
    """TCP keepalives and a send timeout, unless the URL sets its own: a connection
    through a network that silently drops packets fails within seconds instead of
    hanging for the kernel's default of many minutes."""
    given = psycopg.conninfo.conninfo_to_dict(url)
    defaults = {
        "keepalives": 1,
        "keepalives_idle": 10,
        "keepalives_interval": 3,
        "keepalives_count": 3,
        "tcp_user_timeout": 15_000,
    }
    return {k: v for k, v in defaults.items() if k not in given}


#: Conveyor's options in a PostgreSQL URL (PostgresBackend), which libpq would refuse
_URL_OPTIONS = ("pooler", "listen_url")
POOLERS = ("transaction", "session")


def split_url(url: str) -> tuple[str, str | None, str | None]:
    """The URL for libpq, without Conveyor's own options, and their values:
    ``pooler`` and ``listen_url`` (see PostgresBackend). The rest of the query is
    kept as written. Only the first ``?`` starts the query, so a listen_url may
    have one option of its own unencoded; more need their ``&`` as ``%26``."""
    parts = urlsplit(url)
    if not parts.query or parts.scheme.lower() not in ("postgresql", "postgres"):
        return url, None, None
    kept, ours = [], {}
    for pair in parts.query.split("&"):
        key, _, value = pair.partition("=")
        if key in _URL_OPTIONS:
            ours[key] = unquote(value)
        else:
            kept.append(pair)
    pooler, listen_url = ours.get("pooler"), ours.get("listen_url")
    if pooler is not None and pooler not in POOLERS:
        raise ConfigError(
            f"pooler: {pooler!r} is not a pooling mode; use pooler=transaction behind"
            " PgBouncer's pool_mode = transaction (or a pooler like it), pooler=session"
            " behind one that keeps a server session per client"
        )
    if listen_url is not None:
        try:
            psycopg.conninfo.conninfo_to_dict(listen_url)
        except psycopg.ProgrammingError as exc:
            raise ConfigError(
                "listen_url: expected a postgresql:// URL straight to PostgreSQL"
                f" (percent-encoded if it has options of its own): {exc}"
            ) from exc
    return urlunsplit(parts._replace(query="&".join(kept))), pooler, listen_url


#: the SQLSTATEs of a connection that could not be made or was lost; every other
#: code is an answer from the server (or a pooler), and says what it is
_CONNECTION_FAILED = frozenset({"08001", "08003", "08004", "08006"})


def _connect_error(url: str, exc: Exception) -> DatabaseUnavailable:
    if isinstance(exc, _Unanswered):
        return DatabaseUnavailable(
            f"cannot connect to PostgreSQL at {redact(url)}: {exc} (the server is down,"
            " restarting or out of reach); try again",
            transient=True,
        )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    state = getattr(exc, "sqlstate", None)
    if state and state not in _CONNECTION_FAILED and not state.startswith("57P"):
        # 08P01 (a protocol violation) among them: a pooler's error, or a prepared
        # statement the pooler's next session does not have.
        hint = (
            " (a pooler in transaction mode in between? then add ?pooler=transaction to the URL)"
            if state == "08P01" and "prepared statement" in first
            else ""
        )
        return DatabaseUnavailable(
            f"PostgreSQL at {redact(url)} could not run the statement now ({state}: {first})"
            f"{hint}; it is retried"
        )
    return DatabaseUnavailable(
        f"cannot connect to PostgreSQL at {redact(url)}: {first}. {connect_advice(first)}",
        transient=state in (None, "57P01", "57P02", "57P03")
        and _TRANSIENT.search(str(exc)) is not None
        and _ANSWERED.search(str(exc)) is None,
    )


#: libpq's words for a server that does not answer yet or is going away
_TRANSIENT = re.compile(
    r"connection refused|timeout expired|timed out|could not translate host name|"
    r"no such file or directory|starting up|shutting down|in recovery|too many clients|"
    r"server closed the connection|connection reset|network is unreachable|"
    r"no route to host|terminating connection",
    re.I,
)
#: and for a server that answered no: waiting will not change that
_ANSWERED = re.compile(r"password|authentication|does not exist|pg_hba|ssl|permission", re.I)


@contextmanager
def _translated(url: str, pool: ConnectionPool | None = None) -> Iterator[None]:
    """psycopg's errors of the connection or the server as DatabaseUnavailable,
    but a transaction the server rolled back for a row moved under it or a
    deadlock (_MOVED): that one goes up as it is, for _again to run it again.
    A server that refuses writes (25006) is a standby, or a primary a failover
    demoted: the pool's connections to it are replaced (``pool.drain``), and new
    ones go where the URL says (``target_session_attrs=read-write`` picks the
    writable host), instead of every statement failing there forever."""
    try:
        yield
    except _MOVED:
        raise
    except PoolClosed as exc:  # not the server's doing: say so, not "is it running?"
        raise DatabaseUnavailable(
            f"the connections to PostgreSQL at {redact(url)} were closed under this"
            " call (app.close()); the app opens new ones at its next call"
        ) from exc
    except (psycopg.OperationalError, psycopg.InterfaceError) as exc:
        raise _connect_error(url, exc) from exc
    except psycopg.errors.ReadOnlySqlTransaction as exc:
        if pool is not None:
            pool.drain()
        raise DatabaseUnavailable(
            f"PostgreSQL at {redact(url)} is read-only now (a standby, or a primary"
            " demoted by a failover): its connections are being replaced; try again",
            transient=True,
        ) from exc


def redact(url: str) -> str:
    """The URL without its password, for messages and logs (as it was given: a
    URL, or libpq's key=value words)."""
    if "://" in url:
        parts = urlsplit(url)
        query = "&".join(p for p in parts.query.split("&") if not p.lower().startswith("password="))
        return redact_url(urlunsplit(parts._replace(query=query)))
    try:
        info = psycopg.conninfo.conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        return "<unparseable URL>"
    info.pop("password", None)
    return " ".join(f"{k}={v}" for k, v in info.items())


def _readable(fds: list[int], timeout: float) -> bool:
    """Wait until one of ``fds`` can be read (True), or ``timeout`` seconds pass
    (False). poll() where there is one: select() refuses descriptors past 1023,
    which a busy process (a server with many clients) has."""
    if hasattr(select, "poll"):
        waiter = select.poll()
        for fd in fds:
            waiter.register(fd, select.POLLIN)
        return bool(waiter.poll(max(0.0, timeout) * 1000))
    return bool(select.select(fds, [], [], timeout)[0])


def _pid(conn: psycopg.Connection[Any]) -> int:
    """The pid of the server session that ran the statement (a tuple_row connection)."""
    row = conn.execute("SELECT pg_backend_pid()", prepare=False).fetchone()
    if row is None:
        raise RuntimeError("pg_backend_pid() returned no row")
    return int(row[0])


def _pooled_by_transaction(a: psycopg.Connection[Any], url: str, rounds: int = 3) -> bool:
    """Whether the sessions behind ``url`` are lent out a transaction at a time (a
    pooler such as PgBouncer in transaction mode), told by two connections: ``a``
    (autocommit, already open) asks for its session's pid, B begins a transaction
    and asks for its own, and A asks again while B holds its session. A session
    pooler keeps one session per
    client: A has the same pid every time, B another. A transaction pooler lends
    B the session A just gave back (PgBouncer takes the last returned), or A
    another one the second time (at once, or once B's transaction ends if every
    session was busy). Never a false yes; a round can miss when other clients
    took the sessions in between (8 probes in 50 with 8 busy clients on 5
    sessions; with three rounds, 1 in 50), so a few rounds."""
    with psycopg.connect(url, autocommit=True, connect_timeout=10) as b:
        a.pgconn.nonblocking = 0  # (its own result is read through libpq below)
        for _ in range(rounds):
            first = _pid(a)
            with b.transaction():
                if _pid(b) == first:
                    return True
                a.pgconn.send_query(b"SELECT pg_backend_pid()")
                _readable([a.pgconn.socket], 0.2)  # answered while B holds its session
            res = a.pgconn.get_result()
            while a.pgconn.get_result() is not None:
                pass
            if res is None or res.get_value(0, 0) != str(first).encode():
                return True
    return False


class PostgresSession(SqlBackend):
    """The connections of a PostgreSQL backend (see PostgresBackend for the URL's
    options): the pool, and the hooks through which every operation runs its
    statements."""

    def __init__(self, url: str, *, max_connections: int = 10) -> None:
        url, pooler, self.listen_url = split_url(url)
        self.url = url
        try:
            psycopg.conninfo.conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            raise ConfigError(f"malformed PostgreSQL URL: {exc}") from exc
        #: a transaction pooler in between: nothing may outlive a transaction
        self.pooled = pooler == "transaction"
        if self.pooled and self.listen_url is None:
            self.capabilities = self.capabilities - {"push_notifications"}
        self._check_session(pooler)
        self._max_connections = max_connections
        self._pid = os.getpid()
        self._pool = self._open_pool()

    def _check_session(self, pooler: str | None) -> None:
        """Connect once directly: psycopg's own error says *why* (refused, no such
        database, auth), which a pool timeout would hide. And without ``pooler``,
        refuse a transaction pooler (see the class)."""
        try:
            with psycopg.connect(self.url, connect_timeout=10, autocommit=True) as conn:
                # A pooler tells its client a pid of its own (PgBouncer: a random one).
                proxied = pooler is None and _pid(conn) != conn.info.backend_pid
                pooled = proxied and _pooled_by_transaction(conn, self.url)
            if pooled:
                raise ConfigError(
                    f"PostgreSQL at {redact(self.url)} is behind a pooler that lends its"
                    " sessions out a transaction at a time (PgBouncer's pool_mode ="
                    " transaction, or a pooler like it), where prepared statements, LISTEN"
                    " and session functions are lost between transactions: add"
                    " ?pooler=transaction to the URL (and &listen_url=postgresql://... straight"
                    " to PostgreSQL for instant wake-ups; without one, workers poll)"
                )
        except psycopg.OperationalError as exc:
            raise _connect_error(self.url, exc) from exc

    def _open_pool(self) -> _Pool:
        kwargs: dict[str, Any] = {"autocommit": True, "row_factory": dict_row}
        if self.pooled:  # psycopg prepares a statement run 5 times: on one session
            kwargs["prepare_threshold"] = None
        return _Pool(
            self.url,
            min_size=1,
            max_size=self._max_connections,
            kwargs={**kwargs, **_network_defaults(self.url)},
            configure=functools.partial(_configure, owner=type(self), pooled=self.pooled),
            check=_check,
            open=True,
            name="conveyor",
        )

    @property
    def pool(self) -> _Pool:
        """The connection pool, opened again in a child forked from the process
        that opened it. The parent's pooled connections are the parent's sessions:
        a statement of the child's on one would interleave with the parent's on the
        same socket, and its pool's threads, which make and check connections, did
        not survive the fork. The parent's pool is kept, neither used nor closed:
        closing a connection tells the server to end the session, the parent's too
        (psycopg does not finish a connection collected in another process than
        its own, but a pool's close would)."""
        if self._pid != os.getpid():
            with _FORK_LOCK:
                if self._pid != os.getpid():
                    _INHERITED.append(self._pool)
                    self._pool = self._open_pool()
                    self._pid = os.getpid()
        return self._pool

    def close(self) -> None:
        self.pool.close()

    # -- connections --------------------------------------------------------------------
    @contextmanager
    def _tx(self, conn: Any = None) -> Iterator[psycopg.Cursor[Any]]:
        """A cursor in a transaction: the caller's (``conn``) or our own from the pool."""
        if conn is not None:
            if not isinstance(conn, psycopg.Connection | GreenletConnection):
                raise ConfigError(
                    "conn= must be a psycopg (3) Connection for a PostgreSQL app, "
                    f"got {type(conn).__name__}"
                )
            with conn.cursor(row_factory=dict_row) as cur:
                yield cur
            return
        with (
            _translated(self.url, self.pool),
            self.pool.connection() as c,
            c.transaction(),
            c.cursor() as cur,
        ):
            yield cur

    @contextmanager
    def _snapshot_reads(self) -> Iterator[Callable[..., list[Any]]]:
        """REPEATABLE READ: every statement of the transaction sees its first
        snapshot (in READ COMMITTED each would take its own), the horizon of
        in-flight transactions included."""
        with _translated(self.url, self.pool), self.pool.connection() as c, c.transaction():
            c.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY", prepare=False)

            def read(name: str, params: dict[str, Any], *, sql: str | None = None) -> list[Any]:
                return _result_rows(c.execute(sql or Q[name], self._params(params)))

            yield read

    def _fetch(self, cur: Any, name: str, params: dict[str, Any]) -> list[Any]:
        """Run a statement that returns rows and read them."""
        cur.execute(Q[name], self._params(params))
        return list(cur.fetchall())

    def _params(self, params: dict[str, Any]) -> dict[str, Any]:
        return {"channel": CHANNEL, "events": EVENTS, **params}

    def _rows(self, name: str, params: dict[str, Any], *, sql: str | None = None) -> list[Any]:
        """One statement in autocommit: a single round trip, no BEGIN/COMMIT."""
        with _translated(self.url, self.pool), self.pool.connection() as c:
            return _result_rows(c.execute(sql or Q[name], self._params(params)))

    def _count(self, name: str, params: dict[str, Any]) -> int:
        with _translated(self.url, self.pool), self.pool.connection() as c:
            return c.execute(Q[name], self._params(params)).rowcount

    def _q(self, cur: Any, name: str, params: dict[str, Any] | None = None) -> list[Any]:
        return super()._q(cur, name, self._params(params or {}))

    def _qc(self, cur: Any, name: str, params: dict[str, Any] | None = None) -> int:
        return super()._qc(cur, name, self._params(params or {}))

    def _again(self, run: Callable[[], T]) -> T:
        """``run()``, a whole transaction, run again when the server rolled it back
        for a row moved under it or a deadlock (_MOVED); a short random pause
        between tries. Never around a transaction of the caller's (conn=)."""
        for tried in range(1, MOVED_TRIES + 1):
            try:
                return run()
            except _MOVED as exc:
                if tried == MOVED_TRIES:
                    raise _connect_error(self.url, exc) from exc
                log.debug("run again (try %d): %s", tried + 1, str(exc).splitlines()[0])
                time.sleep(random.uniform(0, 0.0005 * 2**tried))
        raise AssertionError("unreachable")
