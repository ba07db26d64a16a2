"""MySQL's DDL commits statement by statement, so a migration cut off midway is
left half done. Run again from the top, it failed for good ("Duplicate column
name 'part'": seen when a server's start-up migration lost its connection). The
migrator now records how far each migration got and goes on from there.

Each case kills the migrating session on the server (KILL CONNECTION, from
another session) at the worst moment: right after a statement committed and
before its progress was written, so the migrator that comes back runs that
statement again and must take "already done" for an answer. The schema it ends
with is compared with one migrated without a cut."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from conveyor import Conveyor
from conveyor.backends import open_backend

from ..conftest import _mysql_connect, mysql_database_url, only_on
from ..mysql_pool import mysql_schema

pytestmark = pytest.mark.slow

#: (migration, statement index): a CREATE TABLE of the first schema; migration
#: 22's ALTER TABLE ... ADD COLUMN (the failure once seen), its prepared
#: ALTER ... PARTITION BY (a SET @ / PREPARE / EXECUTE group, run again whole)
#: and its REMOVE PARTITIONING
CUTS = [(1, 2), (22, 0), (22, 11), (22, 14)]


def _schema(url: str) -> dict[str, Any]:
    """Tables, triggers and routines as the server shows them (AUTO_INCREMENT
    counters aside), the versions recorded, and the progress rows left."""
    conn = _mysql_connect(url)
    try:
        with conn.cursor() as cur:
            shown = mysql_schema(cur)
            cur.execute("SELECT version FROM conveyor_schema_version ORDER BY version")
            versions = [r[0] for r in cur.fetchall()]
            cur.execute("SELECT count(*) FROM conveyor_migration_progress")
            progress = cur.fetchone()[0]
    finally:
        conn.close()
    return {**shown, "versions": versions, "progress rows": progress}


def _cut_at(backend: Any, killer: Any, version: int, index: int) -> list:
    """Kills ``backend``'s migrating session once statement ``index`` of migration
    ``version`` has run, as its progress is about to be written."""
    real_q = backend._q
    cut: list = []

    def q(cur: Any, query: str, params: Any = None) -> Any:
        if query == "migration_progress_set" and (params["version"], params["done"]) == (
            version,
            index + 1,
        ):
            with killer.cursor() as k:  # the statement committed; now the cut
                k.execute(f"KILL CONNECTION {cur.connection.thread_id()}")
            cut.append(index)
        return real_q(cur, query, params)

    backend._q = q
    return cut


@only_on("mysql")
def test_a_migration_cut_off_midway_goes_on_where_it_stopped(db_url: str, request) -> None:
    Conveyor(db_url).migrate()
    expected = _schema(db_url)
    assert expected["progress rows"] == 0

    base = request.getfixturevalue("mysql_base")
    for version, index in CUTS:
        name = f"conveyor_t_cut_{uuid.uuid4().hex[:8]}"
        with _mysql_connect(base) as conn, conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE utf8mb4_bin")
        url = mysql_database_url(base, name)
        try:
            backend: Any = open_backend(url)
            killer = _mysql_connect(url)
            cut = _cut_at(backend, killer, version, index)
            with pytest.raises(Exception):  # noqa: B017 - the cut, as the driver reports it
                backend.migrate()
            assert cut, f"no cut at migration {version}, statement {index}"
            killer.close()
            backend.close()

            Conveyor(url).migrate()  # comes back: goes on from the cut
            assert _schema(url) == expected, (version, index)
            app = Conveyor(url)  # and the schema works
            try:
                job = app.enqueue("t", [1])
                assert app.get_job(job.id).state == "available"
            finally:
                app.close()
        finally:
            with _mysql_connect(base) as conn, conn.cursor() as cur:
                cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
