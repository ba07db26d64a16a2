"""psycopg converts a query's text once and caches it only up to a size: a hot
statement past it pays the conversion on every call (a one-by-one send spent a
third of its time there). The loader strips comments and indentation to stay under."""

from __future__ import annotations

from psycopg import _queries

from conveyor.backends.postgres import backend as pg

HOT = [
    "job_insert_many",
    "job_claim",
    "job_claim_candidates",
    "job_claim_limited",
    "job_claim_limited_call",
    "job_finalize_many",
    "worker_heartbeat",
]


def test_hot_statements_fit_psycopgs_conversion_cache() -> None:
    limit = _queries.MAX_CACHED_STATEMENT_LENGTH
    sizes = {name: len(pg.Q[name].encode()) for name in HOT if name in pg.Q}
    assert set(sizes) >= {"job_insert_many", "job_finalize_many"}, sizes
    assert len(pg.KEYLESS_INSERT.encode()) <= limit
    assert len(pg.QUEUE_LIMITED_CLAIM.encode()) <= limit
    assert all(size <= limit for size in sizes.values()), (limit, sizes)
