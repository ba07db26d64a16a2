"""SchemaStore: migrations, the schema version, capabilities, and a round trip of
every field of every record through every dialect."""

from __future__ import annotations

import json

import pytest

from conveyor.errors import SchemaError

from .helpers import done, fetch, ins, register


def test_migrate_is_idempotent(backend):
    assert backend.migrate() == []
    assert backend.schema_version() == backend.latest_schema >= 8


def test_schema_newer_than_code_is_refused(backend, monkeypatch):
    monkeypatch.setattr(type(backend), "MIGRATIONS", backend.MIGRATIONS[:0])
    with pytest.raises(SchemaError, match="upgrade the conveyor package"):
        backend.migrate()


def test_capabilities_are_answered_and_checked(backend):
    assert backend.supports("push_notifications") in (True, False)
    with pytest.raises(ValueError, match="unknown capability"):
        backend.supports("time_travel")


def test_every_job_field_round_trips(backend):
    [res] = backend.job_insert_many(
        jobs=[
            ins(
                task="t",
                queue="q",
                args=[1, "x", {"n": None}],
                priority=3,
                max_attempts=7,
                timeout_s=2.5,
                backoff_json='{"base": 1}',
                unique_key="u",
                idempotency_key="i",
                stage="s1",
                context_json='{"c": [1]}',
                chain_json='[{"task": "next"}]',
                chain_root=None,
                concurrency_key="k=1",
                concurrency_limit=2,
                rate_key="r",
                rate_per_s=2.0,
                rate_burst=4.0,
                pinned_to='["gpu", "w1"]',
                tenant="acme",
            )
        ]
    )
    job = backend.job_get(job_id=res.id)
    assert (job.task, job.queue, job.args, job.kwargs) == ("t", "q", [1, "x", {"n": None}], {})
    assert (job.priority, job.max_attempts, job.timeout, job.attempts) == (3, 7, 2.5, 0)
    assert (job.backoff, job.unique_key, job.idempotency_key) == ({"base": 1}, "u", "i")
    assert (job.stage, job.context, job.chain) == ("s1", {"c": [1]}, [{"task": "next"}])
    assert (job.concurrency_key, job.rate_key, job.tenant) == ("k=1", "r", "acme")
    assert job.pinned_to == ["gpu", "w1"]
    assert (job.state, job.cancel_requested, job.result, job.error) == (
        "available",
        False,
        None,
        None,
    )
    assert job.created_at.tzinfo is not None and job.scheduled_at >= job.created_at


def test_worker_fields_round_trip_tags_and_tasks_included(backend):
    register(backend, "w1", tags=["gpu", "eu"], tasks=["a", "b"], queues=["q", "r"])
    backend.job_insert_many(jobs=[ins()])
    fetch(backend, worker="w1")
    [w] = backend.worker_list()
    assert (w.id, w.hostname, w.pid, w.concurrency) == ("w1", "h", 1, 4)
    assert (w.queues, w.tags, w.tasks, w.running) == (["q", "r"], ["gpu", "eu"], ["a", "b"], 1)
    assert w.started_at is not None and w.last_seen_at is not None and not w.stop_requested
    register(backend, "any")  # tasks None: a worker that runs any task
    assert {x.id: x.tasks for x in backend.worker_list()}["any"] is None


def test_attempt_and_batch_fields_round_trip(backend):
    batch_id, _ = backend.batch_create(
        name="n", task="t", idempotency_key="bk", on_complete_json=None, jobs=[ins()]
    )
    [job] = fetch(backend)
    backend.job_finalize_many(
        worker_id="w1",
        outcomes=[done(job, state="failed", error="e", traceback="tb", ran_stage="s")],
    )
    [a] = backend.job_attempts(job_id=job.id)
    assert (a.job_id, a.attempt, a.worker_id, a.outcome, a.error, a.traceback, a.stage) == (
        job.id,
        1,
        "w1",
        "failed",
        "e",
        "tb",
        "s",
    )
    b = backend.batch_get(batch_id=batch_id)
    assert (b.name, b.task, b.total, b.state, b.idempotency_key) == ("n", "t", 1, "running", "bk")
    assert json.loads(json.dumps(b.counts)) is None and b.closings == 0
