"""Conveyor deployed as it really is: behind Debian's PgBouncer (1.18, no prepared
statements in transaction mode). Each test module starts PgBouncer processes of
its own (a config in a temporary directory, a free port, auth_type trust) in
front of the suite's PostgreSQL, on a schema of its own in the run's database
(PgBouncer sets the search_path on each server session it opens: it refuses the
``options`` a schema URL would send), and stops them at the end. Without the
binary the tests skip, saying how to get it (`make test` installs it:
scripts/ensure-pgbouncer.sh)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from tests.ports import free_port

from .replication import pair  # noqa: F401 (a fixture: a primary and its replica)

PGBOUNCER_ENV = "CONVEYOR_TEST_PGBOUNCER"


def pgbouncer_binary() -> str | None:
    given = os.environ.get(PGBOUNCER_ENV)
    if given:
        return given
    found = shutil.which("pgbouncer")
    if found:
        return found
    return "/usr/sbin/pgbouncer" if os.access("/usr/sbin/pgbouncer", os.X_OK) else None


class PgBouncer:
    """A PgBouncer process in front of ``upstream`` (the suite's database), pooling
    by ``mode``; ``url`` reaches ``schema`` in that database through it."""

    def __init__(
        self, binary: str, upstream: str, schema: str, mode: str, *, pool_size: int = 5
    ) -> None:
        info = psycopg.conninfo.conninfo_to_dict(upstream)
        user = info.get("user", "postgres")
        server = f"host={info.get('host', '127.0.0.1')} port={info.get('port', 5432)}"
        server += f" dbname={info['dbname']} user={user}"
        if info.get("password"):
            server += f" password={info['password']}"
        server += f" connect_query='SET search_path = {schema}'"
        self.port = free_port()
        # Readable by "nobody": PgBouncer refuses to run as root, so it runs as
        # nobody then, and pytest's tmp_path is in a directory only root may enter.
        self.dir = Path(tempfile.mkdtemp(prefix="conveyor-pgbouncer-"))
        self.dir.chmod(0o755)
        (self.dir / "users.txt").write_text(f'"{user}" ""\n')
        ini = self.dir / "pgbouncer.ini"
        ini.write_text(
            f"[databases]\n{schema} = {server}\n"
            "[pgbouncer]\n"
            f"listen_addr = 127.0.0.1\nlisten_port = {self.port}\nunix_socket_dir =\n"
            f"auth_type = trust\nauth_file = {self.dir / 'users.txt'}\n"
            f"pool_mode = {mode}\ndefault_pool_size = {pool_size}\nmax_client_conn = 500\n"
        )
        for f in self.dir.iterdir():
            f.chmod(0o644)
        self.log = self.dir / "pgbouncer.log"
        argv = [binary, *(["-u", "nobody"] if os.getuid() == 0 else []), str(ini)]
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        self.url = f"postgresql://{user}@127.0.0.1:{self.port}/{schema}"
        self._wait_up()

    def _wait_up(self) -> None:
        deadline = time.monotonic() + 20
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"pgbouncer exited: {self.log.read_text()}")
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"pgbouncer not up: {self.log.read_text()}") from None
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def pgb_schema(pg_database: str) -> Iterator[str]:
    """A schema of this module's own in the run's database (reached through
    PgBouncer by a database name of the same name)."""
    name = f"conveyor_pgb_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    yield name
    with psycopg.connect(pg_database, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{name}" CASCADE')


def _bouncer(upstream: str, schema: str, mode: str) -> Iterator[PgBouncer]:
    binary = pgbouncer_binary()
    if binary is None:
        pytest.skip(
            "PgBouncer is not installed: `make test` installs Debian's package"
            " (scripts/ensure-pgbouncer.sh), or apt-get install pgbouncer, or set"
            f" {PGBOUNCER_ENV} to a pgbouncer binary"
        )
    bouncer = PgBouncer(binary, upstream, schema, mode)
    try:
        yield bouncer
    finally:
        bouncer.stop()


@pytest.fixture(scope="module")
def pgbouncer(pg_database: str, pgb_schema: str) -> Iterator[PgBouncer]:
    """PgBouncer in transaction mode in front of the module's schema."""
    yield from _bouncer(pg_database, pgb_schema, "transaction")


@pytest.fixture(scope="module")
def session_pgbouncer(pg_database: str, pgb_schema: str) -> Iterator[PgBouncer]:
    """PgBouncer in session mode (one server session per client)."""
    yield from _bouncer(pg_database, pgb_schema, "session")
