"""PostgreSQL: a claim commits without waiting for the disk (synchronous_commit off
for its own transaction), and only the claim: the setting must not outlive it on
the pooled connection, or every enqueue that follows on that connection could be
lost to a server crash."""

from __future__ import annotations

import pytest

from ..conftest import only_on
from .helpers import fetch, ins, pg_setting


def _setting(conn) -> str:
    return pg_setting(conn, "synchronous_commit")


#: synchronous_commit is PostgreSQL's
pytestmark = only_on("postgres")


@pytest.fixture
def pg(backend):
    return backend


@pytest.mark.parametrize("limited", [False, True], ids=["fast-path", "queue-limit"])
def test_a_claim_leaves_the_connection_durable(pg, limited):
    if limited:
        pg.queue_set_limit(name="q", max_running=5)
    pg.job_insert_many(jobs=[ins() for _ in range(3)])
    pool = pg.pool
    held = [pool.getconn() for _ in range(2)]
    for conn in held:
        pool.putconn(conn)
    assert len(fetch(pg, 2)) == 2
    for conn in [pool.getconn() for _ in range(2)]:
        try:
            assert _setting(conn) == "on"
        finally:
            pool.putconn(conn)


def test_the_claim_statements_turn_it_off_for_their_transaction_only(pg):
    from conveyor.backends.postgres.backend import Q

    pg.job_insert_many(jobs=[ins()])
    with pg.pool.connection() as conn:
        with conn.transaction():
            conn.execute(Q["limits_lock"], {"queue": "q", "queue_lock": True})
            assert _setting(conn) == "off"
        assert _setting(conn) == "on"
    [job] = fetch(pg, 1)  # the plain claim, its own autocommit transaction
    with pg.pool.connection() as conn:
        with conn.transaction():
            params = {
                "now": None,
                "queues": ["q"],
                "schema_version": pg.latest_schema,
                "tasks": None,
                "limit": 1,
                "worker_id": "w2",
                "lease_s": None,
            }
            conn.execute(
                Q["job_claim"], pg._params(params)
            )  # nothing left to claim; still its setting
            assert _setting(conn) == "off"
        assert _setting(conn) == "on"
    assert job.lease_owner == "w1"
