"""The façade's serving methods: per-task-type settings and their precedence,
API tokens, and leases for remote workers fenced like in-process ones."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from conveyor import ConfigError, Conveyor, JobState
from conveyor.outcomes import OutcomeKind, Refusal, RemoteOutcome
from conveyor.records import TokenScope, WorkerInfo


def remote(wid: str = "remote-1", **kw) -> WorkerInfo:
    return WorkerInfo(id=wid, hostname="elsewhere", pid=0, queues=["default"], concurrency=1, **kw)


# -- settings ----------------------------------------------------------------------------------
def test_settings_are_validated_naming_the_field(app):
    with pytest.raises(ConfigError, match="max_attempts must be an integer"):
        app.set_task_settings("lark", max_attempts=2.5)
    with pytest.raises(ConfigError, match="batch_size must be from 1"):
        app.set_task_settings("lark", batch_size=0)
    with pytest.raises(ConfigError, match="poll_interval_s must be a number"):
        app.set_task_settings("lark", poll_interval_s=True)
    with pytest.raises(ConfigError, match="max_processing_s must be from"):
        app.set_task_settings("lark", max_processing_s=float("inf"))
    with pytest.raises(ConfigError, match="unknown task setting"):
        app.set_task_settings("lark", schedule_limit=3)
    assert app.task_settings() == []


def test_precedence_send_options_then_settings_then_decorator(app):
    @app.task(max_attempts=7, timeout=60)
    def lark():
        return None

    assert (lark.send().max_attempts, lark.send().timeout) == (7, 60)  # decorator
    s = app.set_task_settings("lark", max_attempts=3, max_processing_s=30, retry_interval_s=5)
    assert (s.max_attempts, s.max_processing_s, s.retry_interval_s) == (3, 30.0, 5.0)
    job = app.get_job(lark.send().id)
    assert (job.max_attempts, job.timeout) == (3, 30.0)  # settings win over the decorator
    assert job.backoff["base"] == 5.0 and job.backoff["factor"] == 2.0
    own = app.get_job(lark.send(max_attempts=9).id)
    assert (own.max_attempts, own.timeout) == (9, 30.0)  # the job's own option wins


def test_a_settings_change_reaches_waiting_jobs_but_not_explicit_options(app):
    plain = app.enqueue("lark")
    own = app.enqueue("lark", max_attempts=9, timeout=5)
    app.set_task_settings("lark", max_attempts=2, max_processing_s=12)
    assert (app.get_job(plain.id).max_attempts, app.get_job(plain.id).timeout) == (2, 12.0)
    assert (app.get_job(own.id).max_attempts, app.get_job(own.id).timeout) == (9, 5.0)
    # a patch keeps the other fields; None unsets one (waiting jobs keep their value)
    s = app.set_task_settings("lark", batch_size=50, max_processing_s=None)
    assert (s.batch_size, s.max_attempts, s.max_processing_s) == (50, 2, None)
    assert app.get_job(plain.id).timeout == 12.0
    assert [t.task for t in app.task_settings()] == ["lark"]
    assert app.delete_task_settings("lark") and app.get_task_settings("lark").max_attempts is None


# -- tokens ------------------------------------------------------------------------------------
def test_tokens_are_hashed_checked_and_revoked(app, db_url):
    assert not app.serving.tokens_configured()
    token, text = app.create_token("worker", name="ci")
    assert text.startswith(f"cvy_{token.id}_") and token.scope == TokenScope.WORKER
    assert app.serving.tokens_configured()
    assert app.serving.authenticate(text).id == token.id
    assert app.serving.authenticate(text[:-1] + ("A" if text[-1] != "A" else "B")) is None
    assert (
        app.serving.authenticate("cvy_nope_secret") is None
        and app.serving.authenticate("Bearer x") is None
    )
    assert [t.id for t in app.tokens()] == [token.id]
    assert app.revoke_token(token.id) and app.serving.authenticate(text) is None
    assert not app.revoke_token(token.id)
    # a token existed: that stays a fact (servers stay closed), none is active
    assert app.serving.tokens_configured() and not app.serving.tokens_active()
    other = Conveyor(db_url)  # another process on the database, with its own caches
    try:
        assert other.serving.tokens_configured() and not other.serving.tokens_active()
    finally:
        other.close()
    with pytest.raises(ConfigError, match="scope must be one of"):
        app.create_token("root")


# -- remote leases -----------------------------------------------------------------------------
def test_remote_claim_report_and_fencing(app):
    jobs = [app.enqueue("remote_task", [i]) for i in range(3)]
    app.serving.heartbeat_worker(remote())
    claimed = app.serving.claim("remote-1", ["default"], limit=10, tasks=["remote_task"])
    assert sorted(j.id for j in claimed) == [j.id for j in jobs]
    a, b, c = sorted(claimed, key=lambda j: j.id)
    results = app.serving.report(
        "remote-1",
        [
            RemoteOutcome(a.id, a.lease_token, OutcomeKind.COMPLETE, result={"ok": 1}),
            RemoteOutcome(b.id, "not-the-token", OutcomeKind.COMPLETE),
            RemoteOutcome(c.id, c.lease_token, OutcomeKind.FAIL, error="boom", retry_in_s=0),
        ],
    )
    assert [r.accepted for r in results] == [True, False, True]
    assert results[1].reason == Refusal.LEASE_LOST
    # the job is still this worker's: the token is wrong, no other worker holds it
    assert "does not match" in results[1].message and "or the token is wrong" in results[1].message
    assert "another worker holds it now" not in results[1].message
    assert app.get_job(a.id).result == {"ok": 1} and app.get_job(a.id).state == JobState.SUCCEEDED
    assert app.get_job(c.id).state == JobState.SCHEDULED
    assert app.get_job(b.id).state == JobState.RUNNING  # the wrong token changed nothing
    again = app.serving.report(
        "remote-1", [RemoteOutcome(a.id, a.lease_token, OutcomeKind.COMPLETE)]
    )
    assert again[0].reason == Refusal.FINISHED
    attempts = app.job_attempts(a.id)
    assert [(x.worker_id, x.outcome) for x in attempts] == [("remote-1", "succeeded")]


def test_remote_next_stage_snooze_and_cancelled(app):
    job = app.enqueue("flow", stage="one", context={"n": 1})
    assert (job.stage, app.get_job(job.id).context) == ("one", {"n": 1})
    app.serving.heartbeat_worker(remote())
    [held] = app.serving.claim("remote-1", ["default"], limit=1)
    [res] = app.serving.report(
        "remote-1",
        [RemoteOutcome(held.id, held.lease_token, OutcomeKind.NEXT_STAGE, stage="two", context=2)],
    )
    assert res.accepted and res.state == JobState.AVAILABLE
    again = app.get_job(job.id)
    assert (again.stage, again.context, again.attempts) == ("two", 2, 0)
    [held] = app.serving.claim("remote-1", ["default"], limit=1)
    assert app.cancel_job(held.id) == "requested"
    [res] = app.serving.report(
        "remote-1", [RemoteOutcome(held.id, held.lease_token, OutcomeKind.COMPLETE)]
    )
    assert res.accepted and res.state == JobState.CANCELLED


def test_a_timeout_becomes_the_remote_lease_deadline(app):
    app.set_task_settings("slow", max_processing_s=30)
    job = app.enqueue("slow")
    app.serving.heartbeat_worker(remote())
    [held] = app.serving.claim("remote-1", ["default"], limit=1)
    assert held.lease_expires_at is not None
    later = datetime.now(UTC) + timedelta(seconds=31)
    app.backend.worker_heartbeat(worker=remote(), now=later)  # still alive
    assert app.backend.job_rescue(worker_ttl_s=7, now=later).requeued == [job.id]
    [res] = app.serving.report(
        "remote-1", [RemoteOutcome(held.id, held.lease_token, OutcomeKind.COMPLETE)]
    )
    assert not res.accepted and res.reason == Refusal.LEASE_LOST
