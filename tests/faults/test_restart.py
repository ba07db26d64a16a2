"""A PostgreSQL restart under busy and idle workers, with a password in the URL:
the workers resume alone, idle ones stay quiet meanwhile, and a producer's first
send after the restart works (issue 8, items 17 and 18). The busy worker's queue
has a limit, so its claims are the limited claim's function, which every new
session after the restart makes again."""

from __future__ import annotations

import json
import time

import pytest

from conveyor import Conveyor

from ..runtime.conftest import Procs
from .conftest import cpu_seconds, wait_until

pytestmark = pytest.mark.slow


def test_workers_resume_alone_after_a_restart_and_idle_ones_stay_quiet(cluster, tmp_path):
    producer = Conveyor(cluster.url)
    for name in ("effect", "sleepy"):
        producer.task(name=name)(lambda *a: None)
    producer.migrate()
    producer.set_queue_limit(producer.tasks["effect"].defaults.queue, max_running=3)
    procs = Procs(cluster.url, tmp_path / "effects.log")
    try:
        opts = {"worker_ttl_s": 5, "heartbeat_s": 0.5, "concurrency": 4}
        busy = procs.worker(**opts)
        idle = procs.worker(**{**opts, "queues": ["nothing-here"]})
        first = producer.tasks["effect"].send_many([(i,) for i in range(50)])
        wait_until(lambda: len(procs.lines("ran")) >= 50, 60, "the first jobs ran")
        # Both running before the outage: a worker that cannot reach its database
        # while it starts exits with the error (on a loaded machine the idle one
        # was still importing when the server went down, and did so).
        wait_until(
            lambda: all(" started: " in w.log.read_text() for w in (busy, idle)),
            60,
            "both workers started",
        )

        cluster.stop()
        down_at, cpu_before = time.monotonic(), cpu_seconds(idle.pid)
        time.sleep(6)  # an outage longer than a heartbeat or two
        outage_cpu = cpu_seconds(idle.pid) - cpu_before
        outage_s = time.monotonic() - down_at
        cluster.start()

        # the producer's pool holds connections from before the restart
        again = producer.tasks["effect"].send_many([(i,) for i in range(50, 100)])
        wait_until(lambda: len(procs.lines("ran")) >= 100, 60, "jobs ran after the restart")
        exited = {name: p.poll() for name, p in (("busy", busy), ("idle", idle))}
        assert set(exited.values()) == {None}, (  # both still running
            exited,
            busy.log.read_text()[-4000:],
            idle.log.read_text()[-4000:],
        )
        done = {j.id: producer.get_job(j.id).state for j in [*first, *again]}
        assert set(done.values()) == {"succeeded"}

        # an idle worker waited for the server quietly: little CPU, few log lines
        assert outage_cpu < 0.25 * outage_s, f"{outage_cpu:.2f}s of CPU in {outage_s:.1f}s"
        log = idle.log.read_text()
        lost = log.count("LISTEN connection to")
        assert 1 <= lost <= 4, log[-3000:]
        assert "password" not in log and "s3cret" not in log  # never printed
        assert log.count("\n") < 60, log[-3000:]
        procs.drain_and_stop(producer, [busy, idle])
    finally:
        procs.cleanup()
        producer.close()
    assert json.dumps  # (keeps the import used when the test is trimmed)


def test_a_short_outage_reruns_and_fails_no_running_job(cluster, tmp_path):
    """The database gone for longer than the workers' ttl, shorter than two: the
    jobs running through it finish once, on their first and only attempt. (The
    leader that got back first judged every worker dead, their beats having
    failed as its own calls did, and the workers stopped their own jobs after a
    ttl without a beat: an outage of 3 to 5 s reran every running job, and failed
    those on their last attempt; outside fault probe.)"""
    producer = Conveyor(cluster.url)
    producer.task(name="sleepy", max_attempts=1)(lambda *a: None)
    producer.migrate()
    procs = Procs(cluster.url, tmp_path / "effects.log")
    try:
        opts = {"worker_ttl_s": 4, "heartbeat_s": 0.5, "leader_ttl_s": 2, "concurrency": 4}
        workers = [procs.worker(**opts), procs.worker(**opts)]
        jobs = producer.tasks["sleepy"].send_many([(10.0,)] * 6, max_attempts=1)
        wait_until(lambda: len(procs.lines("start")) >= 6, 60, "every job started")
        cluster.stop()
        time.sleep(5)  # past the ttl (4 s), short of two
        cluster.start()
        wait_until(
            lambda: all(producer.get_job(j.id).state in ("succeeded", "failed") for j in jobs),
            90,
            "every job finished",
        )
        states = [producer.get_job(j.id).state for j in jobs]
        logs = "".join(w.log.read_text()[-2000:] for w in workers)
        assert states == ["succeeded"] * 6, (states, logs)
        assert len(procs.lines("start")) == 6, (procs.lines("start"), logs)  # none ran twice
        assert all(producer.get_job(j.id).attempts == 1 for j in jobs)
        procs.drain_and_stop(producer, workers)
    finally:
        procs.cleanup()
        producer.close()


def test_a_warm_producers_send_while_the_database_is_down_raises_soon_as_transient(cluster):
    """A producer whose pool held connections when the server went away: its send
    waited the pool's 30 s for a connection, then raised a DatabaseUnavailable
    that said neither why nor that it is worth retrying (a cold producer's failed
    at once, transient). Outside fault probe."""
    from conveyor import DatabaseUnavailable

    producer = Conveyor(cluster.url)
    task = producer.task(name="effect")(lambda *a: None)
    try:
        task.send(1)  # warm: the pool holds a connection
        cluster.stop()
        began = time.monotonic()
        with pytest.raises(DatabaseUnavailable) as raised:
            task.send(2)
        waited = time.monotonic() - began
        assert raised.value.transient, str(raised.value)
        assert waited < 20, f"the send waited {waited:.1f}s (the pool's 30 s?)"
        cluster.start()
        wait_until(lambda: _sends(task), 30, "a send after the restart")
    finally:
        producer.close()


def _sends(task) -> bool:
    from conveyor import DatabaseUnavailable

    try:
        task.send(3)
    except DatabaseUnavailable:
        return False
    return True
