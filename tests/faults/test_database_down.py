"""The database goes down under a running ``conveyor server`` (issue 36, item 6):
requests get 503 with ``Retry-After`` at once instead of hanging 30 s, ``/readyz``
says so at once, and neither body names the host, port, user or URL (the
server's log does). When the database is back, so is the server.

PostgreSQL: a cluster of the test's own, stopped. MariaDB: the shared server
behind a proxy the test cuts (it refuses and resets, as a stopped server does).
SQLite has no server to lose."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import httpx
import psycopg
import pytest

from tests.conftest import only_on, skip_unless
from tests.server.conftest import Server, wait_for

from .conftest import PASSWORD
from .test_partition import _via

pytestmark = pytest.mark.slow

#: far below the 30 s a request hung for before; the times measured are printed
PATIENCE_S = 10.0
READY_PATIENCE_S = 5.0


def _outage(db_url: str, request: pytest.FixtureRequest) -> tuple[str, Callable, Callable, list]:
    """(the URL the server uses, take the database down, bring it back, the
    connection details no answer may show)."""
    skip_unless(db_url, "network", "a database in a file has no server to go down")
    if db_url.startswith("mysql"):
        from conveyor.backends.mysql.backend import parse_url

        info = parse_url(db_url)
        proxy = request.getfixturevalue("proxy_to")(info["host"], int(info["port"]))
        secrets = [str(proxy.port), info["user"], info["database"], "127.0.0.1"]
        return _via(db_url, proxy.port), proxy.cut, proxy.restore, secrets
    cluster = request.getfixturevalue("cluster")
    secrets = [str(cluster.port), "postgres", "127.0.0.1", PASSWORD, "s3cret"]
    return cluster.url, cluster.stop, cluster.start, secrets


def _timed(call: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    began = time.monotonic()
    answer = call()
    return answer, time.monotonic() - began


def _ready(api: httpx.Client) -> bool:
    return api.get("/readyz").status_code == 200


def _created(api: httpx.Client) -> bool:
    return api.post("/v1/jobs", json={"task": "t"}).status_code == 201


def test_a_server_whose_database_is_down_answers_503_at_once(db_url, request, tmp_path: Path):
    url, down, up, secrets = _outage(db_url, request)
    server = Server(url, tmp_path / "server.log", [])
    try:
        with httpx.Client(base_url=server.url, timeout=PATIENCE_S) as api:
            assert _created(api)
            wait_for(lambda: _ready(api), timeout=60, what="ready")  # (a check may take 0.8 s)
            down()
            answers = {
                "POST /v1/jobs": _timed(lambda: api.post("/v1/jobs", json={"task": "t"})),
                "GET /v1/jobs": _timed(lambda: api.get("/v1/jobs")),
                "GET /readyz": _timed(lambda: api.get("/readyz", timeout=READY_PATIENCE_S)),
                "GET /readyz again": _timed(lambda: api.get("/readyz", timeout=READY_PATIENCE_S)),
            }
            for what, (answer, took) in answers.items():
                print(f"{db_url.split(':')[0]} down: {what} -> {answer.status_code} in {took:.2f}s")
            for what, (answer, _) in answers.items():
                assert answer.status_code == 503, (what, answer.text)
                shown = answer.text + str(answer.headers)
                assert not [s for s in secrets if s in shown], (what, answer.text)
                if "readyz" not in what:
                    assert int(answer.headers["Retry-After"]) > 0, what
            assert any(s in server.log.read_text() for s in secrets[:1]), "the log says where"
            up()
            wait_for(lambda: _ready(api), timeout=60, what="ready")
            # (MariaDB: a thread's connection cut less than 2 s ago is not pinged
            # first, so its next request may still get a 503)
            wait_for(lambda: _created(api), timeout=60, what="a job created")
    finally:
        server.stop()


def test_readyz_answers_in_time_while_the_database_holds_every_statement(
    db_url, tmp_path: Path, proxy_to
):
    """A database that takes statements and never answers (a frozen host) holds
    whatever waits for it; /readyz still answers, within its deadline, and the
    probes that come meanwhile share the one check held (one thread)."""
    skip_unless(db_url, "network", "a database in a file has no server to go quiet")
    if db_url.startswith("mysql"):
        from conveyor.backends.mysql.backend import parse_url

        host, port = parse_url(db_url)["host"], parse_url(db_url)["port"]
    else:
        info = psycopg.conninfo.conninfo_to_dict(db_url)
        host, port = info.get("host", "127.0.0.1"), info.get("port", 5432)
    proxy = proxy_to(host, int(port))
    server = Server(_via(db_url, proxy.port), tmp_path / "server.log", [])
    try:
        with httpx.Client(base_url=server.url, timeout=READY_PATIENCE_S) as api:
            wait_for(lambda: _ready(api), timeout=60, what="ready")
            proxy.hold()
            try:
                probes = [_timed(lambda: api.get("/readyz")) for _ in range(3)]
            finally:
                proxy.release()
            kind = db_url.split(":")[0]
            for answer, took in probes:
                print(f"{kind} held: GET /readyz -> {answer.status_code} in {took:.2f}s")
            assert [answer.status_code for answer, _ in probes] == [503] * 3
            wait_for(lambda: _ready(api), timeout=60, what="ready")
    finally:
        server.stop()


@only_on("postgres")  # the pool of connections is PostgreSQL's
def test_a_busy_pool_is_waited_for_past_the_bound(db_url: str) -> None:
    """The bound is for a database that is down. With every pooled connection
    lent out to other requests of a live database, a request waits its turn
    instead of answering 503 (a busy server is not an outage)."""
    import threading

    from conveyor import Conveyor

    app = Conveyor(db_url)
    try:
        pool = app.backend.pool  # type: ignore[attr-defined]
        held = [pool.getconn() for _ in range(pool.max_size)]
        releaser = threading.Timer(2.5, lambda: [pool.putconn(c) for c in held])
        releaser.start()
        began = time.monotonic()
        with app.serving.bounded_waits(1.0):
            counts = app.count_jobs()
        waited = time.monotonic() - began
        releaser.join()
        assert counts == {} or isinstance(counts, dict)
        assert waited >= 2.0, f"answered after {waited:.2f}s without a free connection?"
    finally:
        app.close()
