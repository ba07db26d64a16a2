"""A client cut off in the middle of one of our transactions (a network gone
silent, a frozen process) leaves the server holding its row locks: the server
must end that session, or every worker waits on those rows until the server's
keepalive gives up, hours later. Seen as a worker that could not stop within 30 s
after a network cut (tests/faults/test_partition.py, MariaDB, in CI)."""

from __future__ import annotations

import threading

import pytest

from conveyor import Conveyor
from conveyor.backends.sql.backend import SqlBackend
from tests.conftest import skip_unless

pytestmark = pytest.mark.slow


def test_a_transaction_left_idle_mid_way_does_not_hold_its_locks(db_url, monkeypatch):
    skip_unless(db_url, "network", "a database in a file has no server to end a session")
    monkeypatch.setattr(SqlBackend, "IDLE_TRANSACTION_S", 2.0)
    stuck, other = Conveyor(db_url), Conveyor(db_url)
    try:
        stuck.task(name="t")(lambda: None)
        job = stuck.tasks["t"].send()
        # Ours, stopped between two statements with the job's row locked: what the
        # server sees of a worker whose network went silent mid-transaction.
        tx = stuck.backend._tx()  # type: ignore[attr-defined]
        cur = tx.__enter__()
        cur.execute("UPDATE conveyor_jobs SET priority = priority WHERE id = %s", (job.id,))
        outcome: list[object] = []
        waiter = threading.Thread(
            target=lambda: outcome.append(other.cancel_job(job.id)), daemon=True
        )
        waiter.start()
        # Unbounded without the server's timeout (PostgreSQL waits for the lock
        # for ever; MariaDB retries its 10 s lock waits for over a minute).
        waiter.join(45)
        assert not waiter.is_alive(), "the lock of the idle transaction is still held"
        assert outcome == ["cancelled"]
        with pytest.raises(Exception):  # noqa: B017 - the server ended that session
            tx.__exit__(None, None, None)
        assert other.get_job(job.id).state == "cancelled"
    finally:
        stuck.close()
        other.close()
