"""Conveyor behind Debian's PgBouncer 1.18 in transaction mode (issue 38): a pooler
that lends its server sessions out a transaction at a time and keeps no prepared
statement across them. Migrations, `conveyor worker` processes, `send`,
`send_many`, `batch` and `conveyor server`, all pointed only at PgBouncer with
``?pooler=transaction``: every job runs exactly once and succeeds, nothing is
logged as an error, and idle workers pick up new work within a second (by
polling without a listen_url, by LISTEN on a direct session with one)."""

from __future__ import annotations

import collections
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import quote

import httpx
import psycopg
import pytest

from conveyor import Conveyor
from conveyor.backends import open_backend
from conveyor.backends.postgres.backend import _translated
from conveyor.errors import ConfigError, DatabaseUnavailable
from tests.ports import free_port

from .conftest import PgBouncer
from .pgbapp import register

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.deploy.pgbapp:app"
#: log levels and words that must not appear in a worker's or the server's log
TROUBLE = (" ERROR ", " WARNING ", " CRITICAL ", "Traceback")
#: but the warning every server without API tokens gives
EXPECTED = "no API tokens in the database"


def pooled(bouncer: PgBouncer, listen: str | None = None) -> str:
    url = bouncer.url + "?pooler=transaction"
    return url if listen is None else url + "&listen_url=" + quote(listen, safe="")


class Fleet:
    """`conveyor` subprocesses (the CLI, with the repository on PYTHONPATH, before
    the caller's: a worktree's src then runs in them too, as in the test) and the
    handlers' runs: ``<job id> <pid> <start time>`` lines in the effects file."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.effects = tmp / "effects.log"
        path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        self.env = {**os.environ, "EFFECTS_FILE": str(self.effects), "PYTHONPATH": path}
        self.env.pop("CONVEYOR_DATABASE_URL", None)
        self.procs: list[subprocess.Popen] = []

    def cli(self, url: str, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "conveyor.cli.main", "-d", url, *args]
        return subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True)

    def start(self, name: str, url: str, *args: str) -> subprocess.Popen:
        log = self.tmp / f"{name}.log"
        argv = [sys.executable, "-m", "conveyor.cli.main", "-d", url, *args]
        with open(log, "w") as out:
            proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=out, stderr=out)
        proc.log = log  # type: ignore[attr-defined]
        self.procs.append(proc)
        return proc

    def runs(self) -> dict[int, list[float]]:
        """Each job's start times, one per run of its handler."""
        out: dict[int, list[float]] = collections.defaultdict(list)
        if self.effects.exists():
            for line in self.effects.read_text().splitlines():
                job, _, started = line.split()
                out[int(job)].append(float(started))
        return out

    def wait(self, check, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not check():
            for p in self.procs:
                if p.poll() is not None:
                    raise AssertionError(f"{p.args} exited: {p.log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout}s waiting for {what}")
            time.sleep(0.02)

    def pickup(self, send, samples: int = 5) -> list[float]:
        """Seconds from a send to its handler's start, the worker idle before each."""
        out = []
        for i in range(samples):
            time.sleep(1.1)  # idle long enough for the worker's own poll to back off to 1 s
            sent = time.time()
            job = send(i)
            self.wait(lambda j=job: j.id in self.runs(), 10, f"job {job.id} to start")
            out.append(self.runs()[job.id][0] - sent)
        return out

    def stop(self) -> list[int | None]:
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        codes = []
        for p in self.procs:
            try:
                codes.append(p.wait(30))
            except subprocess.TimeoutExpired:
                p.kill()
                codes.append(p.wait())
        return codes

    def trouble(self) -> dict[str, list[str]]:
        found = {}
        for p in self.procs:
            lines = p.log.read_text().splitlines()
            bad = [ln for ln in lines if any(t in ln for t in TROUBLE) and EXPECTED not in ln]
            if bad:
                found[p.log.name] = bad[:10]
        return found


def send_3000(producer: Conveyor) -> set[int]:
    """1,000 by lone sends (psycopg prepares a statement run 5 times on a
    connection), 1,000 by send_many (one INSERT up to 200 jobs, COPY past; 200 with
    a concurrency key: the keyed insert and the limited claim) and 1,000 by a
    batch (its row, then COPY)."""
    plain, keyed = producer.tasks["plain"], producer.tasks["keyed"]
    ids = {plain.send(i).id for i in range(1000)}
    for size in (1, 5, 50, 150, 594):
        ids |= {j.id for j in plain.send_many([(i,) for i in range(size)])}
    ids |= {j.id for j in keyed.send_many([(i,) for i in range(200)])}
    batch = plain.batch([(i,) for i in range(1000)])
    ids |= {j.id for j in batch.jobs()}
    assert len(ids) == 3000
    return ids


def rest_calls(url: str) -> None:
    """A few calls to `conveyor server` behind the pooler: readiness, a job made
    over REST and taken by a long-polling remote worker (the server's wake-ups),
    completed, read back."""
    with httpx.Client(base_url=url, timeout=30) as api:
        assert api.get("/readyz").status_code == 200
        got: dict[str, httpx.Response] = {}
        lease = {"worker": "remote-1", "queues": ["remote"], "wait_s": 20}
        poll = threading.Thread(target=lambda: got.update(r=api.post("/v1/leases", json=lease)))
        poll.start()
        time.sleep(0.3)
        made = api.post("/v1/jobs", json={"task": "plain", "args": [7], "queue": "remote"})
        assert made.status_code == 201, made.text
        poll.join(30)
        [job] = got["r"].json()["jobs"]
        assert job["id"] == made.json()["id"]
        held = {"worker": "remote-1", "token": job["token"], "result": 49}
        assert api.post(f"/v1/leases/{job['id']}/complete", json=held).status_code == 200
        read = api.get(f"/v1/jobs/{job['id']}").json()
        assert (read["state"], read["result"]) == ("succeeded", 49)
        assert api.get("/v1/jobs", params={"limit": 5}).status_code == 200


def test_3000_jobs_through_pgbouncer_each_run_once(pgbouncer, pg_database, tmp_path):
    """(The listen_url, straight to PostgreSQL, is the run's database: LISTEN and
    NOTIFY are the database's, whatever the schema.)"""
    fleet = Fleet(tmp_path)
    url, listening = pooled(pgbouncer), pooled(pgbouncer, listen=pg_database)
    migrated = fleet.cli(url, "migrate")
    assert migrated.returncode == 0, migrated.stderr
    producer = register(Conveyor(url))
    try:
        workers = [
            fleet.start(f"worker-{n}", url, "worker", "--app", APP, "-Q", "default,keyed")
            for n in (1, 2)
        ]
        listener = fleet.start("listener", listening, "worker", "--app", APP, "-Q", "listened")
        port = free_port()
        fleet.start("server", url, "server", "--app", APP, "--port", str(port))
        began = time.monotonic()
        ids = send_3000(producer)
        fleet.wait(lambda: ids <= fleet.runs().keys(), 120, "all 3000 jobs to run")
        drained_s = time.monotonic() - began
        done = {("default", "succeeded", 2800), ("keyed", "succeeded", 200)}
        fleet.wait(
            lambda: {(c.queue, c.state, c.count) for c in producer.counts() if c.count} == done,
            30,
            "every outcome written",
        )
        runs = fleet.runs()
        twice = {job: len(r) for job, r in runs.items() if len(r) > 1}
        assert not twice, f"{len(twice)} jobs ran more than once"
        assert runs.keys() == ids

        polled = fleet.pickup(producer.tasks["plain"].send)
        listened = fleet.pickup(producer.tasks["heard"].send)
        assert max(polled) < 1.0 and max(listened) < 1.0, (polled, listened)

        fleet.wait(lambda: _up(port), 60, "the server to answer")
        rest_calls(f"http://127.0.0.1:{port}")

        # each worker says how it is woken
        for w in workers:
            assert "(polling)" in w.log.read_text()
            assert "wake-ups by polling" in w.log.read_text()
        assert "(LISTEN/NOTIFY + polling)" in listener.log.read_text()
        assert "wake-ups by LISTEN" in listener.log.read_text()
    finally:
        codes = fleet.stop()
        producer.close()
    assert codes[:3] == [0, 0, 0], codes  # every worker stopped gracefully
    assert fleet.trouble() == {}
    print(
        f"\nPgBouncer 1.18, pool_mode = transaction: 3000 jobs, {len(runs)} run, 0 twice,"
        f" drained in {drained_s:.1f}s; idle pickup, polling: median"
        f" {statistics.median(polled) * 1000:.0f} ms, max {max(polled) * 1000:.0f} ms;"
        f" with listen_url: median {statistics.median(listened) * 1000:.0f} ms,"
        f" max {max(listened) * 1000:.0f} ms"
    )


def _up(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def test_wake_ups_behind_the_pooler(pgbouncer, pg_database):
    """The notifier behind the pooler: polling hints at a change and is quiet
    without one; with a listen_url, a NOTIFY sent through the pooler arrives on
    the direct session."""
    polling = open_backend(pooled(pgbouncer))
    listening = open_backend(pooled(pgbouncer, listen=pg_database))
    producer = register(Conveyor(pooled(pgbouncer)))
    try:
        producer.migrate()
        assert not polling.supports("push_notifications")
        assert listening.supports("push_notifications")
        polled, listened = polling.notifier(), listening.notifier()
        try:
            time.sleep(0.3)
            assert polled.wait(0.5) == set()
            producer.tasks["plain"].send(1, queue="hinted")
            assert polled.wait(5) == {"*"}
            deadline = time.monotonic() + 5
            hints: set[str] = set()
            while "hinted" not in hints and time.monotonic() < deadline:
                hints |= listened.wait(0.5)
            assert "hinted" in hints
        finally:
            polled.close()
            listened.close()
    finally:
        producer.close()
        polling.close()
        listening.close()


def test_a_transaction_pooler_without_the_option_is_refused(pgbouncer, session_pgbouncer):
    with pytest.raises(ConfigError, match=r"add \?pooler=transaction to the URL"):
        Conveyor(pgbouncer.url).migrate()
    # one server session per client: nothing to refuse, and no option needed
    session = Conveyor(session_pgbouncer.url)
    try:
        session.migrate()
        assert session.backend.supports("push_notifications")
    finally:
        session.close()


def test_url_options_are_checked(pgbouncer):
    base = pgbouncer.url
    with pytest.raises(ConfigError, match="pooler: 'statement' is not a pooling mode"):
        open_backend(base + "?pooler=statement")
    with pytest.raises(ConfigError, match="listen_url: expected a postgresql:// URL"):
        open_backend(base + "?pooler=transaction&listen_url=mysql://root@127.0.0.1/x")
    # the rest of the query reaches libpq as written
    backend = open_backend(base + "?connect_timeout=5&pooler=transaction&application_name=c38")
    try:
        assert backend.url.endswith("?connect_timeout=5&application_name=c38")
    finally:
        backend.close()


def test_a_protocol_error_says_what_it_is(pg_database):
    """08P01 (what a pooler's lost prepared statement gives) is the server's answer,
    not a failure to connect."""
    with psycopg.connect(pg_database) as conn:
        res = conn.pgconn.exec_params(b"SELECT 1", [b"1"])  # one parameter too many
        error = psycopg.errors.error_from_result(res)
    assert error.sqlstate == "08P01"
    with pytest.raises(DatabaseUnavailable) as caught, _translated(pg_database):
        raise error
    message = str(caught.value)
    assert "08P01: bind message supplies 1 parameters" in message, message
    assert "cannot connect" not in message and "Check that the server is running" not in message
