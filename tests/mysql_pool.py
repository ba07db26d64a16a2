"""Migrated MariaDB databases, reused from test to test.

A test that opens the app (the ``app`` or ``backend`` fixture) sees its database
only once it is migrated, so it cannot tell a new one from one emptied back to
the freshly migrated state (but by its ids, which go on from the last test's: a
test must not expect job 1). Such tests take one from this pool. Making one costs
the whole migration, about 180 statements of DDL: 0.4 s on an idle server, and
1.5 s on average within the suite, because MariaDB's DDL waits for the purge of
the history that earlier DDL and DML left (its purge wakes once a second). That
was 62% of the worker time of ``tests/backend``.

A test that changes the schema itself takes a new database instead (the marker
``own_database``): MariaDB refused, now and then, to rename a column that a
generated column reads in a job table that earlier tests had used ("Unknown
column 'priority' in 'GENERATED ALWAYS AS'"), where a new one took it.

Emptied: each table's rows deleted (the job table's first, so its triggers' count
rows go with the rest), and the few rows the migration wrote put back. A database
whose shape a test changed (columns, indexes, partitions, triggers, routines), or
that could not be emptied in a few seconds (a test's leftover transaction holding
locks), is not reused. All of them are dropped when the session ends.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable
from typing import Any

import pymysql

from conveyor.backends import open_backend

#: the queries whose answers make up a database's shape (the schema is %s)
SHAPE = (
    "SELECT TABLE_NAME, COLUMN_NAME, COLUMN_TYPE, IS_NULLABLE, COLUMN_DEFAULT, "
    "GENERATION_EXPRESSION FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = %s "
    "ORDER BY TABLE_NAME, ORDINAL_POSITION",
    "SELECT TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX, COLUMN_NAME FROM information_schema.STATISTICS "
    "WHERE TABLE_SCHEMA = %s ORDER BY TABLE_NAME, INDEX_NAME, SEQ_IN_INDEX",
    "SELECT TABLE_NAME, PARTITION_NAME, PARTITION_DESCRIPTION FROM information_schema.PARTITIONS "
    "WHERE TABLE_SCHEMA = %s ORDER BY TABLE_NAME, PARTITION_ORDINAL_POSITION",
    "SELECT TRIGGER_NAME, ACTION_STATEMENT FROM information_schema.TRIGGERS "
    "WHERE TRIGGER_SCHEMA = %s ORDER BY TRIGGER_NAME",
    "SELECT ROUTINE_NAME, ROUTINE_DEFINITION FROM information_schema.ROUTINES "
    "WHERE ROUTINE_SCHEMA = %s ORDER BY ROUTINE_NAME",
    "SELECT TABLE_NAME FROM information_schema.VIEWS WHERE TABLE_SCHEMA = %s ORDER BY 1",
)
#: how long emptying may wait for a lock before the database is given up
LOCK_WAIT_S = 3


class MySQLPool:
    """The migrated databases of one test process (an xdist worker)."""

    def __init__(
        self,
        connect: Callable[[str | None], pymysql.connections.Connection],
        url: Callable[[str], str],
    ) -> None:
        """``connect(database)``: a connection in autocommit to the server (to
        ``database``, if not None); ``url(name)``: the URL of database ``name``."""
        self._connect_to = connect
        self.url = url
        self._idle: list[str] = []
        self._made: list[str] = []
        # name -> (shape, {table: rows the migration wrote})
        self._fresh: dict[str, tuple[str, dict[str, list[tuple[Any, ...]]]]] = {}

    def take(self) -> str:
        """A migrated database, empty but for what the migration wrote."""
        if self._idle:
            return self._idle.pop()
        name = f"conveyor_t_{uuid.uuid4().hex[:12]}"
        with self._connect() as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        self._made.append(name)
        backend = open_backend(self.url(name))
        try:
            backend.migrate()
        finally:
            backend.close()
        with self._connect(name) as conn, conn.cursor() as cur:
            rows = {}
            for table in _tables(cur, name):
                cur.execute(f"SELECT * FROM `{table}`")
                found = cur.fetchall()
                if found:
                    rows[table] = list(found)
            self._fresh[name] = (_shape(cur, name), rows)
        return name

    def give_back(self, name: str) -> None:
        """Empty ``name`` back to its migrated state for the next test, unless the
        test changed its shape or emptying it would wait on a lock."""
        shape, rows = self._fresh[name]
        try:
            with self._connect(name) as conn, conn.cursor() as cur:
                if _shape(cur, name) != shape:
                    return
                cur.execute(
                    f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_S}, "
                    f"lock_wait_timeout = {LOCK_WAIT_S}, foreign_key_checks = 0"
                )
                conn.begin()
                for table in _tables(cur, name):
                    cur.execute(f"DELETE FROM `{table}`")
                for table, values in rows.items():
                    marks = ", ".join(["%s"] * len(values[0]))
                    cur.executemany(f"INSERT INTO `{table}` VALUES ({marks})", values)
                conn.commit()
        except pymysql.Error:
            return
        self._idle.append(name)

    def close(self) -> None:
        """Drop every database this pool made."""
        with self._connect() as conn, conn.cursor() as cur:
            for name in self._made:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        self._idle.clear()
        self._made.clear()

    def _connect(self, database: str | None = None) -> pymysql.connections.Connection:
        conn = self._connect_to(database)
        conn.cursorclass = pymysql.cursors.Cursor  # rows as tuples, for INSERT ... VALUES
        return conn


def _tables(cur: Any, schema: str) -> list[str]:
    """The schema's tables, the job table first (its DELETE triggers write count rows)."""
    cur.execute(
        "SELECT TABLE_NAME FROM information_schema.TABLES "
        "WHERE TABLE_SCHEMA = %s AND TABLE_TYPE = 'BASE TABLE' "
        "ORDER BY TABLE_NAME <> 'conveyor_jobs', TABLE_NAME",
        (schema,),
    )
    return [row[0] for row in cur.fetchall()]


def _shape(cur: Any, schema: str) -> str:
    digest = hashlib.sha256()
    for query in SHAPE:
        cur.execute(query, (schema,))
        digest.update(repr(cur.fetchall()).encode())
    return digest.hexdigest()
