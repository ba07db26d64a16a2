"""ServerStore: API tokens, per-task-type settings (and how they reach waiting
jobs), deadlines of jobs held by remote clients."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from conveyor.records import (
    EXPLICIT_BACKOFF,
    EXPLICIT_MAX_ATTEMPTS,
    EXPLICIT_TIMEOUT,
    ApiToken,
    JobFilter,
    JobInsert,
    Lease,
    TaskSettings,
    TokenScope,
)

from .helpers import fetch, ins, register


def _token(tid: str = "abc123", scope: TokenScope = TokenScope.READ) -> ApiToken:
    return ApiToken(id=tid, name="ci", scope=scope, created_at=datetime.now(UTC))


def test_tokens_are_stored_with_their_hash_listed_and_revoked(backend):
    assert backend.token_count_active() == 0 and backend.token_count_all() == 0
    backend.token_insert(token=_token("a1", TokenScope.ADMIN), secret_hash="h1")
    backend.token_insert(token=_token("b2"), secret_hash="h2")
    found = backend.token_find(token_id="a1")
    assert found is not None
    token, digest = found
    assert (token.id, token.name, token.scope, digest) == ("a1", "ci", TokenScope.ADMIN, "h1")
    assert token.active and token.created_at.tzinfo is not None
    assert backend.token_find(token_id="nope") is None
    assert [t.id for t in backend.token_list()] == ["a1", "b2"]
    assert backend.token_count_active() == 2
    assert backend.token_revoke(token_id="a1") is True
    assert backend.token_revoke(token_id="a1") is False  # already revoked
    assert backend.token_revoke(token_id="nope") is False
    assert backend.token_count_active() == 1
    assert backend.token_count_all() == 2  # a revoked token stays as a row
    revoked = backend.token_find(token_id="a1")[0]
    assert not revoked.active and revoked.revoked_at is not None


def test_task_settings_round_trip_and_replace(backend):
    assert backend.task_settings_list() == []
    assert backend.task_settings_get(task="lark") is None
    full = TaskSettings(
        task="lark",
        batch_size=100,
        poll_interval_s=10.0,
        max_processing_s=30.0,
        max_attempts=3,
        retry_interval_s=5.0,
        retry_cap_s=30.0,
    )
    assert backend.task_settings_set(settings=full, backoff_json=None) == 0
    got = backend.task_settings_get(task="lark")
    assert got is not None and got.updated_at is not None
    assert got == TaskSettings(**{**full.__dict__, "updated_at": got.updated_at})
    backend.task_settings_set(settings=TaskSettings(task="lark", batch_size=5), backoff_json=None)
    again = backend.task_settings_get(task="lark")
    assert (again.batch_size, again.max_attempts, again.poll_interval_s) == (5, None, None)
    backend.task_settings_set(settings=TaskSettings(task="a"), backoff_json=None)
    assert [s.task for s in backend.task_settings_list()] == ["a", "lark"]
    assert backend.task_settings_delete(task="a") is True
    assert backend.task_settings_delete(task="a") is False
    assert [s.task for s in backend.task_settings_list()] == ["lark"]


def test_settings_reach_waiting_jobs_not_sent_with_explicit_values(backend):
    plain, own_attempts, own_all = backend.job_insert_many(
        jobs=[
            ins(task="lark", max_attempts=5, timeout_s=None),
            ins(task="lark", max_attempts=9, explicit=EXPLICIT_MAX_ATTEMPTS),
            ins(
                task="lark",
                max_attempts=8,
                timeout_s=1.0,
                backoff_json='{"base": 1}',
                explicit=EXPLICIT_MAX_ATTEMPTS | EXPLICIT_TIMEOUT | EXPLICIT_BACKOFF,
            ),
        ]
    )
    [other] = backend.job_insert_many(jobs=[ins(task="other", max_attempts=5)])
    [running] = backend.job_insert_many(jobs=[ins(task="lark", queue="busy", max_attempts=5)])
    register(backend, queues=["busy"])
    fetch(backend, queues=("busy",))
    backoff = json.dumps({"base": 5.0, "factor": 2.0, "cap": 30.0, "jitter": 0.25})
    changed = backend.task_settings_set(
        settings=TaskSettings(task="lark", max_attempts=3, max_processing_s=30.0),
        backoff_json=backoff,
    )
    assert changed == 2  # plain and own_attempts (the third is explicit in every field)

    def row(r):
        j = backend.job_get(job_id=r.id)
        return j.max_attempts, j.timeout, j.backoff

    assert row(plain) == (3, 30.0, json.loads(backoff))
    assert row(own_attempts) == (9, 30.0, json.loads(backoff))
    assert row(own_all) == (8, 1.0, {"base": 1})
    assert row(other) == (5, None, None)
    assert row(running) == (5, None, None)  # running: it keeps what it was claimed with
    # unset fields leave the jobs' values alone
    backend.task_settings_set(settings=TaskSettings(task="lark", batch_size=7), backoff_json=None)
    assert row(plain) == (3, 30.0, json.loads(backoff))


def test_a_deadline_makes_a_held_job_rescuable_while_its_worker_lives(backend):
    backend.job_insert_many(jobs=[ins(), ins()])
    now = datetime.now(UTC)
    register(backend, now=now)
    a, b = fetch(backend, n=2, now=now)
    assert backend.job_set_deadline(leases=[Lease(a.id, a.lease_token)], seconds=30, now=now) == 1
    assert backend.job_set_deadline(leases=[Lease(b.id, "stale")], seconds=30, now=now) == 0
    later = now + timedelta(seconds=31)
    register(backend, now=later)  # the worker still heartbeats
    rescued = backend.job_rescue(worker_ttl_s=7, now=later)
    assert rescued.requeued == [a.id]
    assert backend.job_get(job_id=b.id).lease_token == b.lease_token


def test_bulk_actions_are_recorded_updated_and_listed_newest_first(backend):
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    backend.action_insert(
        action_id="a1",
        action="retry",
        filter_json='{"states": ["failed"]}',
        actor="ops",
        matched=7,
        now=t0,
    )
    backend.action_insert(
        action_id="a2",
        action="delete",
        filter_json='{"queues": ["q"]}',
        actor=None,
        matched=0,
        now=t0 + timedelta(seconds=1),
    )
    first = backend.action_get(action_id="a1")
    assert (first.action, first.filter, first.actor, first.matched) == (
        "retry",
        {"states": ["failed"]},
        "ops",
        7,
    )
    assert (first.done, first.state, first.finished_at) == (0, "running", None)
    backend.action_update(action_id="a1", done=3, requested=0, state="running", now=t0)
    assert backend.action_get(action_id="a1").done == 3
    end = t0 + timedelta(seconds=5)
    backend.action_update(action_id="a1", done=7, requested=1, state="done", now=end)
    done = backend.action_get(action_id="a1")
    assert (done.done, done.requested, done.state, done.finished_at) == (7, 1, "done", end)
    backend.action_update(
        action_id="a2", done=0, requested=0, state="failed", error="boom", now=end
    )
    assert [a.id for a in backend.action_list(limit=10)] == ["a2", "a1"]
    assert backend.action_get(action_id="a2").error == "boom"
    assert backend.action_get(action_id="nope") is None


def test_a_bulk_action_and_the_job_that_runs_it_are_written_together(backend, monkeypatch):
    job = JobInsert(queue="conveyor", task="conveyor.bulk_action", args_json='{"args": ["b1"]}')
    backend.action_insert(
        action_id="b1", action="retry", filter_json="{}", actor=None, matched=1, jobs=[job]
    )
    assert backend.action_get(action_id="b1").state == "running"
    assert [j.task for j in backend.job_list(filter=JobFilter(queues=("conveyor",)))] == [
        "conveyor.bulk_action"
    ]

    # The job's insert fails (here, injected): the record does not stay behind.
    def broken(cur, jobs, now):
        raise RuntimeError("the job's insert failed")

    monkeypatch.setattr(backend, "_insert_rows", broken)
    with pytest.raises(RuntimeError, match="insert failed"):
        backend.action_insert(
            action_id="b2", action="retry", filter_json="{}", actor=None, matched=1, jobs=[job]
        )
    assert backend.action_get(action_id="b2") is None


def _sent(task: str, args=(), kwargs=None) -> JobInsert:
    doc = {"args": list(args), "kwargs": kwargs or {}, "headers": {"h": "hunter2-in-headers"}}
    return JobInsert(queue="q", task=task, args_json=json.dumps(doc))


def test_sensitive_parameters_are_recorded_and_search_never_looks_inside_them(backend):
    assert backend.task_sensitive_list() == {}
    backend.task_sensitive_add(task="login", parameters={"password": 1, "pin": None})
    backend.task_sensitive_add(task="login", parameters={"password": 2})  # moved: kept, updated
    assert backend.task_sensitive_list() == {"login": {"password": 2, "pin": None}}
    by_position, by_name, other = (
        j.id
        for j in backend.job_insert_many(
            jobs=[
                _sent("login", ["bob", {"x": 1}, "hunter2"]),
                _sent("login", kwargs={"user": "Amy", "password": "hunter2", "pin": "4321"}),
                _sent("other", ["hunter2", "4321"]),
            ]
        )
    )

    def search(text: str) -> list[int]:
        found = backend.job_list(filter=JobFilter(search=text))
        counted = backend.job_count(filter=JobFilter(search=text))
        assert sum(counted.values()) == len(found)
        return sorted(j.id for j in found)

    assert search("hunter2") == [other]  # a secret is not found, by position or by name
    assert search("4321") == [other]
    assert search("password") == []  # (nor its name)
    assert search("bob") == [by_position]
    assert search('"x"') == [by_position]  # inside a value
    assert search("amy") == [by_name]  # a keyword's value, ignoring case
    assert search("user") == [by_name]  # and its name
    assert search("%") == []  # (% and _ are literal)
    backend.task_sensitive_add(task="other", parameters={"a": 0})
    assert search("hunter2") == []
    assert search("4321") == [other]  # its second argument is not sensitive
