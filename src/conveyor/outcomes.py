"""Outcomes reported by workers outside this process (the remote-worker protocol
over HTTP, and asyncflow's ``setTask``), turned into the same ``Finalize`` an
in-process worker writes, so they are fenced exactly alike: an outcome whose
lease is no longer held changes nothing and is refused, saying why."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .encoding import storable_json, storable_text
from .errors import ConfigError
from .records import Finalize, JobRecord, JobState, Outcome
from .retry import Backoff

#: stored errors and tracebacks are cut to these many characters (as in-process)
ERROR_LIMIT = 16_000
TRACEBACK_LIMIT = 64_000
#: the longest retry delay or snooze a remote worker may ask for (a year)
MAX_DELAY_S = 365 * 86400.0


class OutcomeKind(StrEnum):
    COMPLETE = "complete"
    FAIL = "fail"
    NEXT_STAGE = "next_stage"
    SNOOZE = "snooze"


class Refusal(StrEnum):
    """Why an outcome changed nothing."""

    NOT_FOUND = "not_found"
    #: the token is not the job's current lease: another worker may hold the job
    #: now, or the token is wrong; or the job went back to the queue
    LEASE_LOST = "lease_lost"
    CANCELLED = "cancelled"
    #: it had already finished (a second outcome for the same attempt)
    FINISHED = "finished"
    #: the token is right but the worker is not the one it was given to
    WRONG_WORKER = "wrong_worker"


@dataclass(frozen=True)
class RemoteOutcome:
    """How one attempt ended, as a remote worker reports it, with its lease token.

    ``complete``: ``result``. ``fail``: ``error`` (and ``traceback``); retried after
    ``retry_in_s`` (default: the job's backoff) unless ``permanent`` or out of
    attempts. ``next_stage``: back to the queue at ``stage`` with ``context``, after
    ``delay_s``, attempts counted afresh. ``snooze``: run again in ``delay_s``
    without using the attempt. ``priority`` and ``max_attempts`` change the job's
    from then on (asyncflow's ``setTask`` may set them)."""

    job_id: int
    token: str
    kind: OutcomeKind
    result: Any = None
    error: str | None = None
    traceback: str | None = None
    permanent: bool = False
    retry_in_s: float | None = None
    stage: str | None = None
    context: Any = None
    delay_s: float = 0.0
    priority: int | None = None
    max_attempts: int | None = None
    #: the longest the backoff may make this retry wait (asyncflow's maxRetryInterval)
    retry_cap_s: float | None = None


@dataclass(frozen=True)
class OutcomeResult:
    """What became of one reported outcome: accepted (the job's next ``state``) or
    refused (``reason`` and a sentence saying it)."""

    job_id: int
    accepted: bool
    state: str | None = None
    reason: Refusal | None = None
    message: str = ""


def to_finalize(outcome: RemoteOutcome, job: JobRecord, backoff: Backoff) -> Finalize:
    """The write for ``outcome`` of ``job`` (as read while running under the
    outcome's token). ``backoff``: the task's default, for jobs without their own.
    ``ConfigError`` if the outcome cannot be stored (a result JSON cannot hold)."""
    base = Finalize(
        job_id=job.id,
        token=outcome.token,
        state=JobState.SUCCEEDED,
        outcome=Outcome.SUCCEEDED,
        ran_attempt=job.attempts,
        ran_stage=job.stage,
        priority=outcome.priority,
        max_attempts=outcome.max_attempts,
    )
    if outcome.kind == OutcomeKind.COMPLETE:
        return base._replace(result_json=_json("result", outcome.result))
    if outcome.kind == OutcomeKind.SNOOZE:
        return base._replace(
            state=JobState.SCHEDULED, outcome=Outcome.SNOOZED, retry_in_s=_delay(outcome.delay_s)
        )
    if outcome.kind == OutcomeKind.NEXT_STAGE:
        if not outcome.stage:
            raise ConfigError("stage: a next-stage outcome needs the name of the next stage")
        delay = _delay(outcome.delay_s)
        return base._replace(
            state=JobState.SCHEDULED if delay > 0 else JobState.AVAILABLE,
            outcome=Outcome.STAGE,
            next_stage=outcome.stage,
            context_json=_json("context", outcome.context),
            retry_in_s=delay,
        )
    return _failure(outcome, job, base, backoff)


def _failure(outcome: RemoteOutcome, job: JobRecord, base: Finalize, backoff: Backoff) -> Finalize:
    error = storable_text(outcome.error or "failed (the worker gave no error message)", ERROR_LIMIT)
    tb = None if outcome.traceback is None else storable_text(outcome.traceback, TRACEBACK_LIMIT)
    failed = base._replace(state=JobState.FAILED, outcome=Outcome.FAILED, traceback=tb)
    if outcome.permanent:
        return failed._replace(error=f"{error} (permanent: not retried)")
    budget = outcome.max_attempts or job.max_attempts
    if job.attempts >= budget:
        return failed._replace(
            error=f"{error} (attempt {job.attempts} of {budget}: no attempts left)"
        )
    if outcome.retry_in_s is not None:
        delay = _delay(outcome.retry_in_s)
    else:
        delay = (Backoff.from_dict(job.backoff) or backoff).delay(job.attempts)
        if outcome.retry_cap_s is not None:
            delay = min(delay, _delay(outcome.retry_cap_s))
    return failed._replace(
        state=JobState.SCHEDULED, outcome=Outcome.RETRY, error=error, retry_in_s=delay
    )


def refusal(job: JobRecord | None, job_id: int, token: str, worker: str) -> OutcomeResult | None:
    """Why an outcome of ``worker`` under ``token`` cannot be written to ``job`` (as
    read now), or ``None`` if that worker holds it with that token. The token alone
    fences the write (a new lease, a new token); the worker is checked here, as a
    token leaked to, or mixed up by, another worker must not end the attempt."""
    if job is None:
        return OutcomeResult(job_id, False, None, Refusal.NOT_FOUND, f"no job with id {job_id}")
    if job.state == JobState.RUNNING and job.lease_token == token:
        if job.lease_owner == worker:
            return None
        text = (
            f"job {job_id} is held by worker {job.lease_owner!r}, not {worker!r}: a lease "
            "token is good only with the worker it was given to; nothing was changed"
        )
        return OutcomeResult(job_id, False, str(job.state), Refusal.WRONG_WORKER, text)
    if job.state == JobState.CANCELLED:
        why = Refusal.CANCELLED
        text = f"job {job_id} was cancelled ({job.error or 'by an operator'}); nothing was changed"
    elif job.state.finished:
        why = Refusal.FINISHED
        text = f"job {job_id} has already finished ({job.state}); nothing was changed"
    else:
        why = Refusal.LEASE_LOST
        if job.state == JobState.RUNNING:
            text = (
                f"the token does not match job {job_id}'s current lease: another worker may "
                "hold it now (this lease was lost: its holder stopped heartbeating or passed "
                "its deadline), or the token is wrong; nothing was changed"
            )
        else:
            text = (
                f"the lease on job {job_id} was lost: the job went back to the queue (its "
                "holder stopped heartbeating or passed its deadline); nothing was changed"
            )
    return OutcomeResult(job_id, False, str(job.state), why, text)


def accepted(final: Finalize, job: JobRecord) -> OutcomeResult:
    """An outcome the database took. A job whose cancellation was requested while
    it ran ends cancelled unless it failed (as in-process)."""
    state = final.state
    if job.cancel_requested and state != JobState.FAILED:
        state = JobState.CANCELLED
    return OutcomeResult(job.id, True, str(state), None, f"job {job.id} is now {state}")


def _json(field: str, value: Any) -> str:
    try:
        return storable_json(value, field)
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{field} cannot be stored as JSON: {exc}") from None


def _delay(seconds: float) -> float:
    if not 0 <= seconds <= MAX_DELAY_S:
        raise ConfigError(f"a delay must be from 0 to {MAX_DELAY_S:g} seconds, got {seconds!r}")
    return float(seconds)
