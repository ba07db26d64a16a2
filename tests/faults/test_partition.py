"""A worker cut off from the database for longer than it may stay silent: the
cluster runs its job elsewhere, and its late outcome, if it ever arrives, is
refused: the job counts once (issue 8)."""

from __future__ import annotations

import signal
import threading
import time
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from conveyor import Conveyor
from conveyor.errors import DatabaseUnavailable
from tests.conftest import only_on, skip_unless

from ..runtime.conftest import Procs
from .conftest import wait_until

pytestmark = pytest.mark.slow


def _via(url: str, port: int) -> str:
    """The same URL, through 127.0.0.1:``port``."""
    parts = urlsplit(url)
    user = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    return urlunsplit(parts._replace(netloc=f"{user}127.0.0.1:{port}"))


def test_a_worker_cut_off_longer_than_its_ttl_loses_its_job_to_another(db_url, tmp_path, proxy_to):
    skip_unless(db_url, "network", "a network partition needs a database across a network")
    if db_url.startswith("mysql"):
        from conveyor.backends.mysql.backend import parse_url

        info = parse_url(db_url)
    else:
        info = psycopg.conninfo.conninfo_to_dict(db_url)
    proxy = proxy_to(info.get("host", "127.0.0.1"), int(info.get("port", 5432)))
    producer = Conveyor(db_url)
    producer.task(name="sleepy")(lambda *a: None)
    producer.migrate()
    job = producer.tasks["sleepy"].send(4.0)
    cut_off = Procs(_via(db_url, proxy.port), tmp_path / "effects.log")
    rescuer = Procs(db_url, tmp_path / "effects.log")
    opts = {"worker_ttl_s": 3, "heartbeat_s": 0.5, "leader_ttl_s": 2, "grace_s": 1}
    try:
        victim = cut_off.worker(**opts)
        wait_until(lambda: cut_off.lines("start"), 30, "the job started on the victim")
        proxy.cut()
        other = rescuer.worker(**opts)
        wait_until(
            lambda: producer.get_job(job.id).state == "succeeded", 60, "the job done elsewhere"
        )
        proxy.restore()
        time.sleep(3)  # the victim reconnects; whatever it sends now must be refused
        got = producer.get_job(job.id)
        outcomes = [a.outcome for a in got.attempt_log()]
        assert outcomes.count("succeeded") == 1 and outcomes[0] == "lost", outcomes
        ran_by = {pid for _, pid in cut_off.lines("start")}
        assert other.pid in {pid for _, pid in rescuer.lines("end")} or other.pid in ran_by | {
            pid for _, pid in rescuer.lines("start")
        }
        for p in (victim, other):
            p.send_signal(signal.SIGTERM)
        assert [p.wait(30) for p in (victim, other)] == [0, 0]
    finally:
        cut_off.cleanup()
        rescuer.cleanup()
        producer.close()


@only_on("postgres")
def test_a_send_cut_off_mid_statement_fails_clearly_and_the_next_one_goes(db_url, proxy_to):
    """A lone send on PostgreSQL runs through libpq directly (PostgresBackend.
    _send_one). Cut off while the server holds its statement (a lock), it raises
    DatabaseUnavailable naming the server, as psycopg's own path does, not a bare
    driver error; once the network is back, the next send goes on a new
    connection."""
    info = psycopg.conninfo.conninfo_to_dict(db_url)
    proxy = proxy_to(info.get("host", "127.0.0.1"), int(info.get("port", 5432)))
    via = _via(db_url, proxy.port)
    producer = Conveyor(via + ("&" if "?" in via else "?") + "application_name=cut_send")
    task = producer.task(name="t")(lambda *a: None)
    producer.migrate()
    task.send(0)  # its statement is prepared on the pooled connection now
    failed: list[BaseException] = []

    def send() -> None:
        try:
            task.send(1)
        except BaseException as exc:
            failed.append(exc)

    with psycopg.connect(db_url) as locker:
        locker.execute("LOCK TABLE conveyor_jobs IN SHARE MODE")  # inserts wait for it
        sender = threading.Thread(target=send)
        sender.start()
        wait_until(
            lambda: locker.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                " AND application_name = 'cut_send'"
            ).fetchone()[0],
            30,
            "the send waiting on the lock",
        )
        proxy.cut()
        sender.join(30)
        locker.rollback()
    assert not sender.is_alive()
    assert len(failed) == 1 and isinstance(failed[0], DatabaseUnavailable), failed
    assert "PostgreSQL at" in str(failed[0])
    proxy.restore()
    job = task.send(2)
    assert producer.get_job(job.id).args == [2]
    producer.close()
