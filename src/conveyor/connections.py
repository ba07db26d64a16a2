"""The caller's connection behind ``conn=``: an enqueue joins the caller's transaction.

``conn=`` takes the dialect's DB-API connection (psycopg 3, sqlite3, PyMySQL) or a
SQLAlchemy one: a ``Connection`` or an ORM ``Session`` for sync code, and (through
``await task.asend(..., conn=...)``) an ``AsyncConnection`` or ``AsyncSession``.
SQLAlchemy stays optional: objects are recognised by the module their class comes
from, and SQLAlchemy is imported only once one is seen.

A SQLAlchemy connection is used through its public API
(``Connection.connection.driver_connection``), inside the transaction it has open
(one is begun if none is: SQLAlchemy then commits or rolls back the enqueue with
the rest). An async driver (psycopg's async connection, aiosqlite, aiomysql) is
reached from inside ``AsyncConnection.run_sync``: SQLAlchemy runs our sync code
in a greenlet on the event loop, and each driver call is awaited there through
``AdaptedConnection.run_async`` (``GreenletConnection``), as SQLAlchemy's own
sync facades do.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from .errors import ConfigError

T = TypeVar("T")

#: SQLAlchemy's dialect names for each of Conveyor's backends
_SQLALCHEMY_NAMES = {
    "postgres": ("postgresql",),
    "sqlite": ("sqlite",),
    "mysql": ("mysql", "mariadb"),
}


def dbapi_connection(conn: Any, dialect: str) -> Any:
    """The DB-API connection an enqueue with ``conn=`` runs on, for a backend of
    ``dialect`` (``postgres``, ``sqlite``, ``mysql``): ``conn`` itself unless it
    is SQLAlchemy's. A SQLAlchemy connection to another kind of database is
    refused here, before anything is written."""
    if conn is None or not _is_sqlalchemy(conn):
        return conn
    if async_sqlalchemy(conn) is not None:
        raise ConfigError(
            f"conn= got SQLAlchemy's {type(conn).__name__} in sync code: await "
            "task.asend(..., conn=...) (or app.aenqueue) with it, or pass a sync "
            "Connection or Session"
        )
    connection = _sync_connection(conn)
    names = _SQLALCHEMY_NAMES.get(dialect, (dialect,))
    if connection.dialect.name not in names:
        raise ConfigError(
            f"conn= is a SQLAlchemy connection to {connection.dialect.name}, "
            f"but this app's database is {dialect}: pass a connection to the app's database"
        )
    if not connection.in_transaction():
        connection.begin()  # SQLAlchemy's commit() or rollback() then ends the enqueue too
    fairy = connection.connection  # the pool's proxy of the DB-API connection
    if connection.dialect.is_async:
        return GreenletConnection(fairy.dbapi_connection)
    return fairy.driver_connection


async def call_with(conn: Any, call: Callable[[Any], T], *, warm: Callable[[], object]) -> T:
    """``call(conn)`` off the event loop, for the async producers: in a thread, or,
    with an async SQLAlchemy connection (whose driver belongs to this loop), inside
    its ``run_sync`` with the sync ``Connection`` or ``Session`` it wraps. There
    our code runs on the loop and only the driver's calls are awaited: ``warm``
    (opening the app, reading the task settings a send applies, through
    connections of ours) runs in a thread first, so that what ``call`` reads
    through them is cached."""
    target = async_sqlalchemy(conn)
    if target is not None:
        await asyncio.to_thread(warm)
        result: T = await target.run_sync(call)
        return result
    return await asyncio.to_thread(call, conn)


def async_sqlalchemy(conn: Any) -> Any:
    """SQLAlchemy's ``AsyncConnection`` or ``AsyncSession`` that ``conn`` is (an
    ``async_scoped_session``: its current session), or None for anything else."""
    if conn is None or not _is_sqlalchemy(conn):
        return None
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession, async_scoped_session

    if isinstance(conn, async_scoped_session):
        conn = conn()
    return conn if isinstance(conn, AsyncConnection | AsyncSession) else None


def _is_sqlalchemy(conn: Any) -> bool:
    """A class of SQLAlchemy's (or derived from one) without importing SQLAlchemy."""
    return any(c.__module__.split(".", 1)[0] == "sqlalchemy" for c in type(conn).__mro__)


def _sync_connection(conn: Any) -> Any:
    """The SQLAlchemy ``Connection`` of ``conn``: a ``Session``'s begins the
    session's transaction if none is open (``Session.connection()``)."""
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session, scoped_session

    if isinstance(conn, scoped_session):
        conn = conn()
    if isinstance(conn, Session):
        conn = conn.connection()
    if not isinstance(conn, Connection):
        raise ConfigError(
            "conn= takes a SQLAlchemy Connection or Session (or the driver's "
            f"connection), got {type(conn).__name__}"
        )
    return conn


class GreenletConnection:
    """A sync face on an async driver's connection, valid inside SQLAlchemy's
    ``run_sync``: each call that returns an awaitable is awaited on the loop
    through ``AdaptedConnection.run_async`` (the greenlet SQLAlchemy runs sync
    code in). The backends use it as they use their own driver's connection."""

    def __init__(self, adapted: Any) -> None:
        self.adapted = adapted
        self.driver = adapted.driver_connection

    def run(self, value: Any) -> Any:
        """``value``, awaited first if it is an awaitable."""
        if inspect.isawaitable(value):
            awaitable: Awaitable[Any] = value
            return self.adapted.run_async(lambda _driver: awaitable)
        return value

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        """The driver's cursor (made with the backend's arguments) behind a sync
        face; typed Any, as the backends type the driver cursor they stand for."""
        return GreenletCursor(self, self.run(self.driver.cursor(*args, **kwargs)))

    def execute(self, sql: str, params: Any = ()) -> GreenletCursor:
        cur: GreenletCursor = self.cursor()
        cur.execute(sql, params)
        return cur


class GreenletCursor:
    """A sync face on an async driver's cursor (see ``GreenletConnection``)."""

    def __init__(self, connection: GreenletConnection, cursor: Any) -> None:
        self.connection = connection
        self._cursor = cursor

    def execute(self, sql: str, params: Any = None) -> GreenletCursor:
        run = self.connection.run
        run(self._cursor.execute(sql, params) if params is not None else self._cursor.execute(sql))
        return self

    def executemany(self, sql: str, params: Any) -> GreenletCursor:
        self.connection.run(self._cursor.executemany(sql, params))
        return self

    def fetchone(self) -> Any:
        return self.connection.run(self._cursor.fetchone())

    def fetchall(self) -> list[Any]:
        return list(self.connection.run(self._cursor.fetchall()))

    def mogrify(self, sql: str, params: Any = None) -> str:
        return str(self.connection.run(self._cursor.mogrify(sql, params)))

    def close(self) -> None:
        self.connection.run(self._cursor.close())

    def copy(self, statement: str) -> _GreenletCopy:
        return _GreenletCopy(self.connection, self._cursor.copy(statement))

    @property
    def description(self) -> Any:
        return self._cursor.description

    @property
    def rowcount(self) -> int:
        return int(self._cursor.rowcount)

    @property
    def lastrowid(self) -> Any:
        return self._cursor.lastrowid

    @property
    def row_factory(self) -> Any:
        return self._cursor.row_factory

    @row_factory.setter
    def row_factory(self, factory: Any) -> None:
        self._cursor.row_factory = factory

    def __iter__(self) -> Iterator[Any]:
        return iter(self.fetchall())

    def __enter__(self) -> GreenletCursor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _GreenletCopy:
    """psycopg's async ``COPY`` context as a sync one (``GreenletCursor.copy``)."""

    def __init__(self, connection: GreenletConnection, manager: Any) -> None:
        self.connection, self._manager, self._copy = connection, manager, None

    def __enter__(self) -> _GreenletCopy:
        self._copy = self.connection.run(self._manager.__aenter__())
        return self

    def write(self, data: Any) -> None:
        assert self._copy is not None
        self.connection.run(self._copy.write(data))

    def __exit__(self, *exc: Any) -> None:
        self.connection.run(self._manager.__aexit__(*exc))
