"""A process that used Conveyor, then forked (a pre-forking web server that
imported the app and sent a job before forking its workers): the child must talk
to the database on connections of its own. The parent's are the parent's
sessions; one used by both would interleave their statements on one socket, and
a child closing them would end the parent's sessions."""

from __future__ import annotations

import os
import sys
from typing import Any

import pytest

from conveyor import Conveyor

from .conftest import in_a_forked_child

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork") or sys.platform == "darwin", reason="needs fork"
)


def _session(app: Conveyor) -> int | None:
    """The server's id of the session the app's next statement in this thread runs
    in (PostgreSQL's pool hands out the connection returned last)."""
    backend = app.backend
    if backend.name == "postgres":
        with backend.pool.connection() as conn:
            return int(conn.execute("SELECT pg_backend_pid() AS s").fetchone()["s"])
    if backend.name == "mysql":
        with backend._conn().cursor() as cur:
            cur.execute("SELECT CONNECTION_ID() AS s")
            return int(cur.fetchone()["s"])
    return None  # SQLite: no server session (tests/faults/test_sqlite_fork.py)


def test_a_forked_child_uses_connections_of_its_own_and_leaves_the_parents_open(db_url):
    parent = Conveyor(db_url)
    task = parent.task(name="t")(lambda *a: None)
    parent.migrate()
    task.send(0)
    before = _session(parent)

    def child() -> dict[str, Any]:
        job = task.send(1)
        report = {"job": job.id, "session": _session(parent)}
        parent.close()  # closes the child's connections, not the parent's
        return report

    code, report = in_a_forked_child(child)
    assert code == 0 and report, "the child failed to send"
    assert parent.get_job(report["job"]).args == [1]
    if before is not None:
        assert report["session"] != before  # the child had a session of its own
        assert _session(parent) == before  # and closing it left the parent's open
    assert parent.get_job(task.send(2).id).args == [2]
    parent.close()
