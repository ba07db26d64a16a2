"""Reads on a replica (issue 38): ``Conveyor(url, read_url=...)`` and ``conveyor
server --read-url`` send the lists, counts, metrics, event streams and the
dashboard to a streaming replica, and nothing that writes. Proof by the primary's
pg_stat_statements: while the dashboard and the list routes are used, no
statement there reads the job or batch tables. The dashboard says it reads a
replica, and how far behind it is."""

from __future__ import annotations

import time

import psycopg
import pytest

from conveyor import Conveyor

from ..server.conftest import Server
from .replication import ReplicatedPair

pytestmark = pytest.mark.slow

#: what the server's pages and list routes would read from the primary
_READS = "(query ILIKE '%conveyor_jobs%' OR query ILIKE '%conveyor_batches%')"


def _primary_reads(pair: ReplicatedPair) -> list[tuple]:
    return pair.primary.query(
        f"SELECT calls, query FROM pg_stat_statements WHERE {_READS} AND calls > 0"
    )


def _replica_has(pair: ReplicatedPair, n: int) -> bool:
    try:
        return pair.replica.query("SELECT count(*) FROM conveyor_jobs") == [(n,)]
    except psycopg.errors.UndefinedTable:  # not replayed yet
        return False


def test_lists_counts_and_the_dashboard_read_from_the_replica(pair: ReplicatedPair, tmp_path):
    pair.primary.query("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
    app = Conveyor(pair.url, read_url=pair.replica.url)
    app.task(name="effect")(lambda *a: None)
    app.migrate()
    jobs = app.tasks["effect"].send_many([(i,) for i in range(30)])
    app.tasks["effect"].batch([(i,) for i in range(5)])
    deadline = time.monotonic() + 30
    while not _replica_has(pair, 35):
        assert time.monotonic() < deadline, "the replica never caught up"
        time.sleep(0.05)
    # no cluster services in this server: they work on the primary, as workers do
    args = ["--read-url", pair.replica.url, "--no-services"]
    server = Server(pair.url, tmp_path / "server.log", args)
    try:
        with server.client() as api:
            api.get("/v1/jobs")  # the server has opened both databases
            pair.primary.query("SELECT pg_stat_statements_reset()")
            for path in (
                "/v1/jobs",
                "/v1/jobs?state=available",
                "/v1/batches",
                "/v1/queues",
                "/v1/workers",
                "/metrics",
                "/",
                "/jobs",
                "/batches",
                "/workers",
            ):
                r = api.get(path)
                assert r.status_code == 200, (path, r.text[:300])
            assert len(api.get("/v1/jobs", params={"limit": 100}).json()["jobs"]) == 35
            page = api.get("/").text
            assert "replica" in page and "behind" in page, page[:2000]
            metrics = api.get("/metrics").text
            assert "conveyor_replica_lag_seconds" in metrics
        # from Python too
        assert len(app.list_jobs(limit=100)) == 35
        assert sum(c.count for c in app.counts()) == 35
        assert _primary_reads(pair) == []
        # what writes, and a job read by id, go to the primary (the replica
        # refuses writes, and a job just sent is found at once)
        app.cancel_jobs(ids=[jobs[0].id])
        assert app.get_job(jobs[0].id).state == "cancelled"
        assert app.get_job(app.tasks["effect"].send(99).id).state == "available"
    finally:
        server.stop()
        app.close()
