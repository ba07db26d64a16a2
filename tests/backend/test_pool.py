"""PostgreSQL's pool hands a lone caller the connection it returned last: one
server process keeps its caches warm, instead of statements going round every
connection the pool ever opened (a one-by-one send took twice as long)."""

from __future__ import annotations

from ..conftest import only_on


@only_on("postgres")  # PostgreSQL's connection pool
def test_a_lone_caller_keeps_using_one_connection(backend):
    pool = backend.pool
    held = [pool.getconn() for _ in range(3)]  # the pool has three open now
    for conn in held:
        pool.putconn(conn)

    def pid() -> int:
        with pool.connection() as conn:
            return int(conn.execute("SELECT pg_backend_pid() AS pid").fetchone()["pid"])

    pids = [pid() for _ in range(6)]
    assert len(set(pids)) == 1, pids
    assert pool.get_stats()["pool_available"] >= 3
