"""``conn=`` with SQLAlchemy: an enqueue joins the transaction of a ``Connection``,
a ``Session``, an ``AsyncConnection`` or an ``AsyncSession`` (issue 39), on each
database, and exists only if that transaction commits."""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Iterator

import pytest

sqlalchemy = pytest.importorskip("sqlalchemy")

from sqlalchemy import create_engine, text  # noqa: E402
from sqlalchemy.ext.asyncio import (  # noqa: E402
    AsyncSession,
    async_scoped_session,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import Session, scoped_session, sessionmaker  # noqa: E402

from conveyor import ConfigError, Conveyor, JobNotFound  # noqa: E402
from tests.conftest import only_on  # noqa: E402

SYNC_DRIVERS = {"postgresql": "postgresql+psycopg", "mysql": "mysql+pymysql", "sqlite": "sqlite"}
ASYNC_DRIVERS = {
    "postgresql": "postgresql+psycopg",
    "mysql": "mysql+aiomysql",
    "sqlite": "sqlite+aiosqlite",
}


def sqlalchemy_url(db_url: str, drivers: dict[str, str]) -> str:
    """The test database's URL for SQLAlchemy (the same server, database and schema)."""
    scheme, rest = db_url.split(":", 1)
    # (Conveyor's own driver= option picks its MySQL driver: SQLAlchemy's is named here)
    rest = re.sub(r"[?&]driver=[^&]*$", "", re.sub(r"([?&])driver=[^&]*&", r"\1", rest))
    return drivers[scheme] + ":" + rest


@pytest.fixture
def app(db_url: str) -> Iterator[Conveyor]:
    conveyor = Conveyor(db_url)
    conveyor.migrate()
    yield conveyor
    conveyor.close()


@pytest.fixture
def engine(db_url: str, app: Conveyor) -> Iterator[sqlalchemy.engine.Engine]:
    engine = create_engine(sqlalchemy_url(db_url, SYNC_DRIVERS))
    with engine.begin() as c:
        c.execute(text("CREATE TABLE orders (id INTEGER PRIMARY KEY)"))
    yield engine
    engine.dispose()


def ship(n: int) -> int:
    return n


def exists(app: Conveyor, job_id: int, *, batch: bool = False) -> bool:
    try:
        app.get_batch(job_id) if batch else app.get_job(job_id)
    except JobNotFound:
        return False
    return True


def orders(engine: sqlalchemy.engine.Engine) -> list[int]:
    with engine.connect() as c:
        return [r[0] for r in c.execute(text("SELECT id FROM orders"))]


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_connection_transaction(app: Conveyor, engine, commit: bool) -> None:
    task = app.task(name="ship")(ship)
    with engine.connect() as c:
        c.execute(text("INSERT INTO orders (id) VALUES (1)"))
        job = task.send(1, conn=c)
        many = task.send_many([(2,), (3,)], conn=c)
        batch = task.batch([(4,), (5,)], conn=c)
        chain = app.chain(task.s(6), task.s(), conn=c)
        c.commit() if commit else c.rollback()
    ids = [job.id, *(j.id for j in many), chain.id]
    assert [exists(app, i) for i in ids] == [commit] * 4
    assert exists(app, batch.id, batch=True) is commit
    assert orders(engine) == ([1] if commit else [])


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_session_transaction(app: Conveyor, engine, commit: bool) -> None:
    task = app.task(name="ship")(ship)
    with Session(engine) as session:
        # no statement yet: the enqueue begins the session's transaction itself
        job = task.send(1, conn=session)
        session.execute(text("INSERT INTO orders (id) VALUES (1)"))
        session.commit() if commit else session.rollback()
    assert exists(app, job.id) is commit
    assert orders(engine) == ([1] if commit else [])


def test_scoped_session(app: Conveyor, engine) -> None:
    """Flask-SQLAlchemy's ``db.session`` and the like: the current session's transaction."""
    task = app.task(name="ship")(ship)
    current = scoped_session(sessionmaker(engine))
    kept = task.send(1, conn=current)
    current.commit()
    dropped = task.send(2, conn=current)
    current.rollback()
    current.remove()
    assert (exists(app, kept.id), exists(app, dropped.id)) == (True, False)


def test_connection_without_a_statement_commits(app: Conveyor, engine) -> None:
    """The enqueue is the first statement: the transaction SQLAlchemy commits is
    the one it ran in (one begun for it), not one the driver left open."""
    task = app.task(name="ship")(ship)
    with engine.connect() as c:
        job = task.send(1, conn=c)
        c.commit()
    assert exists(app, job.id)


@pytest.mark.parametrize("commit", [True, False], ids=["commit", "rollback"])
def test_async_session_and_connection(app: Conveyor, db_url: str, engine, commit: bool) -> None:
    task = app.task(name="ship")(ship)

    async def main() -> list[int]:
        aengine = create_async_engine(sqlalchemy_url(db_url, ASYNC_DRIVERS))
        try:
            async with AsyncSession(aengine) as session:
                await session.execute(text("INSERT INTO orders (id) VALUES (1)"))
                first = await task.asend(1, conn=session)
                second = await app.aenqueue("ship", [2], conn=session)
                # more jobs than PostgreSQL's COPY threshold, through the sync facade
                many = await session.run_sync(
                    lambda s: task.send_many([(n,) for n in range(250)], conn=s)
                )
                await (session.commit() if commit else session.rollback())
            async with aengine.connect() as c:
                third = await task.asend(3, conn=c)
                await (c.commit() if commit else c.rollback())
            scoped = async_scoped_session(
                async_sessionmaker(aengine), scopefunc=asyncio.current_task
            )
            fourth = await task.asend(4, conn=scoped)
            await (scoped.commit() if commit else scoped.rollback())
            await scoped.remove()
            return [first.id, second.id, third.id, fourth.id, many[0].id, many[-1].id]
        finally:
            await aengine.dispose()

    ids = asyncio.run(main())
    assert [exists(app, i) for i in ids] == [commit] * 6
    assert orders(engine) == ([1] if commit else [])


def test_async_object_in_sync_code_is_refused(app: Conveyor, db_url: str) -> None:
    task = app.task(name="ship")(ship)
    aengine = create_async_engine(sqlalchemy_url(db_url, ASYNC_DRIVERS))
    with pytest.raises(ConfigError, match=r"await task\.asend"):
        task.send(1, conn=AsyncSession(aengine))


@only_on("postgres", "mysql")
def test_another_kind_of_database_is_refused(app: Conveyor) -> None:
    task = app.task(name="ship")(ship)
    other = create_engine("sqlite://")
    with other.connect() as c, pytest.raises(ConfigError, match="connection to sqlite"):
        task.send(1, conn=c)
    other.dispose()


def test_async_send_reads_our_own_database_state_in_a_thread(
    db_url: str, app: Conveyor, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under ``run_sync`` our code runs on the event loop: opening a fresh app and
    reading the task settings (our own connections, not awaited) happen in a
    thread before it, so the loop only waits on the driver's awaited calls."""
    fresh = Conveyor(db_url)
    task = fresh.task(name="ship")(ship)
    read = fresh.serving.cached_task_settings
    threads: list[int] = []

    def spy() -> object:
        threads.append(threading.get_ident())
        return read()

    monkeypatch.setattr(fresh.serving, "cached_task_settings", spy)

    async def main() -> tuple[int, int]:
        aengine = create_async_engine(sqlalchemy_url(db_url, ASYNC_DRIVERS))
        try:
            async with AsyncSession(aengine) as session:
                job = await task.asend(1, conn=session)
                await session.commit()
            return threading.get_ident(), job.id
        finally:
            await aengine.dispose()

    loop_thread, job_id = asyncio.run(main())
    fresh.close()
    assert threads[0] != loop_thread  # the first read, which opened the app
    assert exists(app, job_id)
