"""A process that used Conveyor, then forked (a pre-forking web server that
imported the app and sent a job before forking its workers): the child must talk
to the database on connections of its own. The parent's are the parent's
sessions; one used by both would interleave their statements on one socket, and
a child closing them would end the parent's sessions."""

from __future__ import annotations

import json
import os
import sys
import warnings

import pytest

from conveyor import Conveyor

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
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # (3.12+: threads at fork)
        pid = os.fork()
    if pid == 0:  # the child: report, never return into pytest
        code = 1
        try:
            job = task.send(1)
            report = {"job": job.id, "session": _session(parent)}
            parent.close()  # closes the child's connections, not the parent's
            os.write(write, json.dumps(report).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    with os.fdopen(read) as pipe:
        got = pipe.read()
    assert os.waitstatus_to_exitcode(status) == 0 and got, "the child failed to send"
    report = json.loads(got)
    assert parent.get_job(report["job"]).args == [1]
    if before is not None:
        assert report["session"] != before  # the child had a session of its own
        assert _session(parent) == before  # and closing it left the parent's open
    assert parent.get_job(task.send(2).id).args == [2]
    parent.close()
