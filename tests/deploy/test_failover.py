"""A primary failover under load (issue 38): a primary and its synchronous
streaming replica, Conveyor's URL naming both with ``target_session_attrs=
read-write``; two worker processes, an HTTP server and a producer sending at
about 150 jobs/s. The primary is stopped hard a third of the way in and the
replica promoted. Every job whose send was acknowledged then succeeds exactly
once, work resumes on the new primary within 20 s, the producer sees only
``DatabaseUnavailable`` meanwhile and the server answers 503 with Retry-After.
And a primary that turns read-only (demoted) under a worker: the worker moves to
the writable host instead of failing there forever."""

from __future__ import annotations

import threading
import time
from collections import Counter

import httpx
import psycopg
import pytest

from conveyor import Conveyor
from conveyor.errors import DatabaseUnavailable

from ..faults.conftest import wait_until
from ..runtime.conftest import Procs
from ..server.conftest import Server
from .replication import ReplicatedPair

pytestmark = pytest.mark.slow

TOTAL = 1_500
RATE = 150.0


class Producer(threading.Thread):
    """Sends ``TOTAL`` jobs one by one at ``RATE`` a second; an acknowledged send's
    job id goes to ``acked`` (with when it was acknowledged), every error to
    ``errors``: a send that failed is not retried (its job may or may not exist)."""

    def __init__(self, app: Conveyor) -> None:
        super().__init__(daemon=True)
        self.task = app.tasks["effect"]
        self.acked: list[tuple[int, float]] = []
        self.errors: list[Exception] = []

    def run(self) -> None:
        due = time.monotonic()
        for i in range(TOTAL * 2):
            if len(self.acked) >= TOTAL:
                return
            try:
                self.acked.append((self.task.send(i).id, time.monotonic()))
            except Exception as exc:  # what the test looks at
                self.errors.append(exc)
            due += 1 / RATE
            time.sleep(max(0.0, due - time.monotonic()))


def _states(url: str, ids: list[int]) -> dict[int, str]:
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, state FROM conveyor_jobs WHERE id = ANY(%s)", (ids,)
        ).fetchall()
    return dict(rows)


def _start(pair: ReplicatedPair, tmp_path) -> tuple[Conveyor, Procs, list]:
    app = Conveyor(pair.url)
    app.task(name="effect")(lambda *a: None)
    app.migrate()
    procs = Procs(pair.url, tmp_path / "effects.log")
    workers = [procs.worker(concurrency=4, heartbeat_s=0.5) for _ in range(2)]
    for w in workers:
        wait_until(lambda w=w: " started: " in w.log.read_text(), 60, "worker started")
    return app, procs, workers


def test_a_failover_under_load_loses_and_repeats_nothing(pair: ReplicatedPair, tmp_path):
    app, procs, workers = _start(pair, tmp_path)
    server = Server(pair.url, tmp_path / "server.log", [])
    producer = Producer(app)
    try:
        producer.start()
        wait_until(lambda: len(producer.acked) >= TOTAL // 3, 60, "a third of the jobs sent")
        pair.crash_primary()
        # no primary now: the server says so at once, with when to come back
        during = httpx.get(server.url + "/v1/jobs", timeout=10)
        pair.promote()
        promoted_at = time.monotonic()
        producer.join(120)
        assert not producer.is_alive(), "the producer never finished"

        ids = [job_id for job_id, _ in producer.acked]
        after = [job_id for job_id, at in producer.acked if at > promoted_at]
        wait_until(
            lambda: after[0] in {job for job, _pid in procs.lines("ran")},
            60,
            "the first job sent after the promotion ran",
        )
        resumed_s = time.monotonic() - promoted_at

        def all_done() -> bool:
            return set(_states(pair.replica.url, ids).values()) == {"succeeded"}

        wait_until(all_done, 90, "every acknowledged job succeeded")
        runs = Counter(job for job, _pid in procs.lines("ran"))
        twice = {job: n for job, n in runs.items() if n > 1}
        assert not twice, f"{len(twice)} jobs ran more than once: {sorted(twice)[:10]}"
        assert all(runs[i] == 1 for i in ids)
        with psycopg.connect(pair.replica.url, autocommit=True) as conn:
            stuck = conn.execute("SELECT count(*) FROM conveyor_jobs WHERE state = 'running'")
            assert stuck.fetchone() == (0,)
        assert resumed_s < 20, f"work resumed {resumed_s:.1f}s after the promotion"
        wrong = [e for e in producer.errors if not isinstance(e, DatabaseUnavailable)]
        assert not wrong, wrong[:3]
        assert during.status_code == 503 and "retry-after" in during.headers, during.text
        assert httpx.get(server.url + "/v1/jobs", timeout=10).status_code == 200
        assert [w.poll() for w in workers] == [None, None]
        print(
            f"failover: {len(ids)} acknowledged, {len(producer.errors)} send errors,"
            f" resumed {resumed_s:.2f}s after the promotion"
        )
    finally:
        server.stop()
        procs.cleanup()
        app.close()


def test_a_worker_on_a_demoted_primary_moves_to_the_writable_host(pair: ReplicatedPair, tmp_path):
    app, procs, workers = _start(pair, tmp_path)
    try:
        first = app.tasks["effect"].send_many([(i,) for i in range(20)])
        wait_until(lambda: len(procs.lines("ran")) >= 20, 60, "the first jobs ran")
        # The primary turns read-only under its sessions (as a demoted one
        # does: every write fails with 25006) and the replica is promoted.
        pair.primary.query("ALTER SYSTEM SET default_transaction_read_only = on")
        pair.primary.query("SELECT pg_reload_conf()")
        pair.promote()
        promoted_at = time.monotonic()
        deadline = promoted_at + 30
        later = None
        while later is None and time.monotonic() < deadline:
            try:
                later = app.tasks["effect"].send_many([(i,) for i in range(20, 40)])
            except DatabaseUnavailable:
                time.sleep(0.2)
        assert later is not None, "the producer never reached the writable host"
        ids = [j.id for j in later]
        wait_until(
            lambda: set(_states(pair.replica.url, ids).values()) == {"succeeded"},
            30,
            "the jobs sent to the new primary ran",
        )
        assert [w.poll() for w in workers] == [None, None]
        assert {j.id for j in first} <= {job for job, _ in procs.lines("ran")}
    finally:
        procs.cleanup()
        app.close()


def test_a_claim_waits_for_the_synchronous_standby(pair: ReplicatedPair):
    """A claim commits without waiting for its WAL on a lone server (a crash then
    loses a claim, not a job), but with a synchronous standby it waits as every
    commit does: a claim the promoted standby lacks would run its job again.
    With the standby stopped, a claim's commit waits until it is back."""
    from conveyor.backends import open_backend

    from ..backend.helpers import fetch, ins

    backend = open_backend(pair.url)
    try:
        backend.migrate()
        backend.job_insert_many(jobs=[ins() for _ in range(2)])
        pair.replica.stop()
        claimed: list = []
        claimer = threading.Thread(target=lambda: claimed.extend(fetch(backend, 1)), daemon=True)
        claimer.start()
        claimer.join(3)
        assert claimer.is_alive() and not claimed, "the claim did not wait for the standby"
        pair.replica.start("hot_standby=on")
        claimer.join(30)
        assert len(claimed) == 1
    finally:
        backend.close()
