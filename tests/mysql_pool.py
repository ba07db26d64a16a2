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
whose schema a test changed (tables with their columns, indexes and partitions;
triggers; routines), or
that could not be emptied in a few seconds (a test's leftover transaction holding
locks), is not reused. All of them are dropped when the session ends.

Also here: the suite's MariaDB helpers that the pool uses (a connection, a
database's URL, a new database, a database's schema as the server shows it).
"""

from __future__ import annotations

import re
import uuid
from typing import Any

import pymysql

from conveyor.backends import open_backend
from conveyor.backends.mysql.backend import parse_url

#: how long emptying may wait for a lock before the database is given up
LOCK_WAIT_S = 3


def mysql_connect(url: str, database: str | None = None) -> pymysql.connections.Connection:
    """A connection in autocommit to the server of ``url`` (to ``database``, if given)."""
    kwargs = parse_url(url)
    if database is not None:
        kwargs["database"] = database
    return pymysql.connect(**kwargs, autocommit=True)


def mysql_database_url(base: str, name: str) -> str:
    """``base`` naming database ``name`` instead, its options (say driver=) kept."""
    path, _, query = base.partition("?")
    return f"{path.rsplit('/', 1)[0]}/{name}" + (f"?{query}" if query else "")


def new_mysql_database(base: str) -> str:
    """A new, empty database on the server of ``base``: its name."""
    name = f"conveyor_t_{uuid.uuid4().hex[:12]}"
    with mysql_connect(base) as conn, conn.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
    return name


def mysql_schema(cur: Any) -> dict[str, Any]:
    """The current database's tables (columns, indexes, checks, partitions), triggers
    and routines as the server shows them (AUTO_INCREMENT counters aside); ``cur``
    gives rows as tuples."""
    cur.execute("SHOW TABLES")
    tables = sorted(r[0] for r in cur.fetchall())
    shown = {}
    for t in tables:
        cur.execute(f"SHOW CREATE TABLE `{t}`")
        shown[t] = re.sub(r" AUTO_INCREMENT=\d+", "", cur.fetchone()[1])
    cur.execute(
        "SELECT trigger_name, action_timing, event_manipulation, action_statement"
        " FROM information_schema.triggers WHERE trigger_schema = DATABASE()"
        " ORDER BY trigger_name"
    )
    triggers = cur.fetchall()
    cur.execute(
        "SELECT routine_name, routine_definition FROM information_schema.routines"
        " WHERE routine_schema = DATABASE() ORDER BY routine_name"
    )
    return {"tables": shown, "triggers": triggers, "routines": cur.fetchall()}


class MySQLPool:
    """The migrated databases of one test process (an xdist worker), on the
    server of ``base``."""

    def __init__(self, base: str) -> None:
        self._base = base
        self._idle: list[str] = []
        self._made: list[str] = []
        # name -> (schema, {table: rows the migration wrote})
        self._fresh: dict[str, tuple[dict[str, Any], dict[str, list[tuple[Any, ...]]]]] = {}

    def url(self, name: str) -> str:
        return mysql_database_url(self._base, name)

    def take(self) -> str:
        """A migrated database, empty but for what the migration wrote."""
        if self._idle:
            return self._idle.pop()
        name = new_mysql_database(self._base)
        self._made.append(name)
        backend = open_backend(self.url(name))
        try:
            backend.migrate()
        finally:
            backend.close()
        with mysql_connect(self._base, name) as conn, conn.cursor() as cur:
            schema = mysql_schema(cur)
            rows = {}
            for table in schema["tables"]:
                cur.execute(f"SELECT * FROM `{table}`")
                found = cur.fetchall()
                if found:
                    rows[table] = list(found)
        self._fresh[name] = (schema, rows)
        return name

    def give_back(self, name: str) -> None:
        """Empty ``name`` back to its migrated state for the next test, unless the
        test changed its schema or emptying it would wait on a lock."""
        schema, rows = self._fresh[name]
        # the job table first: its DELETE triggers write count rows
        tables = sorted(schema["tables"], key=lambda t: (t != "conveyor_jobs", t))
        try:
            with mysql_connect(self._base, name) as conn, conn.cursor() as cur:
                if mysql_schema(cur) != schema:
                    return
                cur.execute(
                    f"SET SESSION innodb_lock_wait_timeout = {LOCK_WAIT_S}, "
                    f"lock_wait_timeout = {LOCK_WAIT_S}, foreign_key_checks = 0"
                )
                conn.begin()
                for table in tables:
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
        with mysql_connect(self._base) as conn, conn.cursor() as cur:
            for name in self._made:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        self._idle.clear()
        self._made.clear()
