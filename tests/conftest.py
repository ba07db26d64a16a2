"""Every test that takes ``db_url`` (or ``app``) runs once on SQLite, once on
PostgreSQL and once on MySQL (MariaDB). The servers are not optional: without
one the run fails, saying how to get it (``make test`` finds or starts both)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from urllib.parse import quote

import psycopg
import pymysql
import pytest

from conveyor import Conveyor
from conveyor.backends import open_backend

from .mysql_pool import MySQLPool, mysql_database_url, new_mysql_database
from .mysql_pool import mysql_connect as _mysql_connect

# tests/django is a Django project with its own virtualenv (Python 3.12+) and
# pytest.ini: scripts/test-django.sh runs it (`make test` does, after this suite)
collect_ignore = ["django"]

if os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get("COLUMNS") == "80":
    # pytest-xdist's workers set COLUMNS=80 for themselves; the CLI's tables would
    # then be squeezed as they are in no serial run (piped output gets 160 columns)
    del os.environ["COLUMNS"]

PG_ENV = "CONVEYOR_TEST_POSTGRES_URL"
PG_DEFAULT = "postgresql://postgres@127.0.0.1:5432/postgres"


def _pg_base() -> str:
    url = os.environ.get(PG_ENV, PG_DEFAULT)
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.OperationalError as exc:
        pytest.exit(
            f"PostgreSQL is required for the test suite and did not answer at {url}: {exc}\n"
            f"Run `make test` (it starts a throwaway cluster if it finds initdb/pg_ctl), or set "
            f"{PG_ENV} to a server you can create databases on.",
            returncode=3,
        )
    return url


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A database of our own for this run, dropped afterwards."""
    _selected("postgres")
    base = _pg_base()
    name = f"conveyor_test_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    info = psycopg.conninfo.conninfo_to_dict(base)
    info["dbname"] = name
    yield psycopg.conninfo.make_conninfo(**info)
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def pg_schema_url(database_url: str, schema: str) -> str:
    """A URL whose connections see only ``schema`` (subprocess workers inherit it)."""
    info = psycopg.conninfo.conninfo_to_dict(database_url)
    dsn = f"postgresql://{info.get('user', 'postgres')}@{info.get('host', '127.0.0.1')}:"
    dsn += f"{info.get('port', 5432)}/{info['dbname']}"
    return dsn + "?options=" + quote(f"-csearch_path={schema}")


MYSQL_ENV = "CONVEYOR_TEST_MYSQL_URL"
MYSQL_DEFAULT = "mysql://root@127.0.0.1:3306/mysql"


@pytest.fixture(scope="session")
def mysql_base() -> str:
    """A MySQL/MariaDB server we can create databases on (checked once per run)."""
    _selected("mysql")
    url = os.environ.get(MYSQL_ENV, MYSQL_DEFAULT)
    try:
        _mysql_connect(url).close()
    except pymysql.Error as exc:
        pytest.exit(
            f"MySQL/MariaDB is required for the test suite and did not answer at {url}: {exc}\n"
            f"Run `make test` (it starts MariaDB with scripts/ensure-mysql.sh), or set "
            f"{MYSQL_ENV} to a server you can create databases on.",
            returncode=3,
        )
    return url


@pytest.fixture(scope="session")
def mysql_pool(mysql_base: str) -> Iterator[MySQLPool]:
    pool = MySQLPool(mysql_base)
    yield pool
    pool.close()


DATABASES_ENV = "CONVEYOR_TEST_DATABASES"


def _selected(kind: str) -> None:
    """Skip unless ``kind`` is among $CONVEYOR_TEST_DATABASES (all three when
    unset): `make test-versions` runs the SQLite part alone on other Pythons."""
    chosen = os.environ.get(DATABASES_ENV)
    if chosen and kind not in chosen.split(","):
        pytest.skip(f"{kind} is not among {DATABASES_ENV}={chosen}")


@pytest.fixture(params=["sqlite", "postgres", "mysql"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> Iterator[str]:
    _selected(request.param)
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'conveyor.db'}"
        return
    if (
        request.param == "mysql"
        and {"app", "backend"} & set(request.fixturenames)
        and request.node.get_closest_marker("own_database") is None
    ):
        # the test sees its database migrated (the app migrates it first thing):
        # one of the pool's, emptied back to that state (tests/mysql_pool.py)
        pool = request.getfixturevalue("mysql_pool")
        name = pool.take()
        yield pool.url(name)
        pool.give_back(name)
        return
    if request.param == "mysql":
        base = request.getfixturevalue("mysql_base")
        name = new_mysql_database(base)
        yield mysql_database_url(base, name)
        with _mysql_connect(base) as conn, conn.cursor() as cur:
            cur.execute(f"DROP DATABASE IF EXISTS `{name}`")
        return
    database = request.getfixturevalue("pg_database")
    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    yield pg_schema_url(database, schema)
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


def skip_unless(db_url: str, capability: str, why: str) -> None:
    """Skip the test unless the backend at ``db_url`` has ``capability``
    (``Backend.supports``): a test of what some backends can do, whichever they are."""
    backend = open_backend(db_url)
    try:
        able = backend.supports(capability)
    finally:
        backend.close()
    if not able:
        pytest.skip(why)


def only_on(*kinds: str) -> pytest.MarkDecorator:
    """Run a test on these databases alone (``db_url``'s ids): a test of one
    dialect's own SQL (its plans, locks, partitions, driver paths), which the
    others do not have. A test of what a backend can do uses ``skip_unless``."""
    return pytest.mark.parametrize("db_url", kinds, indirect=True)


@pytest.fixture
def app(db_url: str) -> Iterator[Conveyor]:
    conveyor = Conveyor(db_url)
    yield conveyor
    conveyor.close()


@pytest.fixture
def backend(app: Conveyor):
    return app.backend
