"""Running one job: a linear pipeline of small steps, ending in a ``Finalize``.

resolve the task -> run the handler (with its timeout) -> classify the outcome ->
encode the result or error -> decide retry or not.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..backends.base import Finalize
from ..errors import JobTimeout, Permanent
from ..flow import NextStage, Snooze
from ..job import Job
from ..retry import Backoff
from ..task import Task
from .context import _cancel, _current
from .pool import DaemonPool

_ENCODE = json.JSONEncoder(allow_nan=False).encode  # one encoder, not one per result


@dataclass
class Outcome:
    """What happened, before it becomes a database write."""

    result: Any = None
    exc: BaseException | None = None


def describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _finalize(job: Job, **fields: Any) -> Finalize:
    return Finalize(
        job_id=job.id,
        token=job.lease_token or "",
        ran_attempt=job.attempts,
        ran_stage=job.stage,
        **fields,
    )


def fail(job: Job, error: str, tb: str | None = None) -> Finalize:
    return _finalize(job, state="failed", outcome="failed", error=error, traceback=tb)


async def run_handler(
    task: Task,
    job: Job,
    pool: DaemonPool,
    on_late: Callable[[Task, Job, Outcome], None],
    cancel: threading.Event | None = None,
) -> Outcome:
    """Run the handler. ``timeout`` bounds execution only. An async handler is
    cancelled at its timeout; a sync one cannot be, so its eventual result goes to
    ``on_late`` (where fencing refuses it)."""
    token = _current.set(job)
    cancel_token = _cancel.set(cancel)
    try:
        if task.is_async and not job.timeout:
            return Outcome(result=await task.fn(*job.args, **job.kwargs))
        if task.is_async:
            deadline = asyncio.timeout(job.timeout)
            try:
                async with deadline:
                    result = await task.fn(*job.args, **job.kwargs)
            except TimeoutError:
                if deadline.expired():  # ours, not a TimeoutError the handler raised itself
                    return Outcome(
                        exc=JobTimeout(f"{task.name} exceeded its {job.timeout:g}s timeout")
                    )
                raise
            return Outcome(result=result)
        ctx = contextvars.copy_context()
        cf = pool.submit(functools.partial(ctx.run, task.fn, *job.args, **job.kwargs))
        fut = asyncio.wrap_future(cf)
        try:
            return Outcome(result=await asyncio.wait_for(asyncio.shield(fut), job.timeout))
        except TimeoutError:
            if not cf.done():
                cf.add_done_callback(lambda f: on_late(task, job, _outcome_of(f)))
                return Outcome(exc=JobTimeout(f"{task.name} exceeded its {job.timeout:g}s timeout"))
            return _outcome_of(cf)
    except asyncio.CancelledError:
        raise
    except Exception as exc:  # a handler's error is data, not a crash of the worker
        return Outcome(exc=exc)
    finally:
        _current.reset(token)
        _cancel.reset(cancel_token)


def _outcome_of(fut: Any) -> Outcome:
    exc = fut.exception()
    return Outcome(exc=exc) if exc is not None else Outcome(result=fut.result())


def classify(task: Task | None, job: Job, outcome: Outcome) -> Finalize:
    """Turn an outcome into the job's next state."""
    if outcome.exc is None and isinstance(outcome.result, NextStage):
        return next_stage(job, outcome.result)
    if outcome.exc is None and isinstance(outcome.result, Snooze):
        return _finalize(
            job, state="scheduled", outcome="snoozed", retry_in_s=float(outcome.result.seconds)
        )
    if outcome.exc is None:
        try:
            result_json = _ENCODE(outcome.result)
        except (TypeError, ValueError) as exc:
            return fail(job, f"handler returned a value that cannot be stored as JSON: {exc}")
        return _finalize(job, state="succeeded", outcome="succeeded", result_json=result_json)
    exc = outcome.exc
    error = describe(exc)
    tb = "".join(traceback.format_exception(exc))
    if isinstance(exc, Permanent):
        return fail(job, f"{error} (permanent: not retried)", tb)
    retry_on = task.defaults.retry_on if task else (Exception,)
    if not isinstance(exc, retry_on):
        names = ", ".join(r.__name__ for r in retry_on)
        return fail(job, f"{error} (not in retry_on=({names}): not retried)", tb)
    if job.attempts >= job.max_attempts:
        left = f"attempt {job.attempts} of {job.max_attempts}: no attempts left"
        return fail(job, f"{error} ({left})", tb)
    backoff = Backoff.from_dict(job.backoff) or (task.defaults.backoff if task else Backoff())
    delay = backoff.delay(job.attempts)
    return _finalize(
        job, state="scheduled", outcome="retry", error=error, traceback=tb, retry_in_s=delay
    )


def next_stage(job: Job, step: NextStage) -> Finalize:
    """Back to the queue at the next stage, same id, attempts counted afresh."""
    try:
        context_json = _ENCODE(step.context)
    except (TypeError, ValueError) as exc:
        return fail(job, f"NextStage context cannot be stored as JSON: {exc}")
    return _finalize(
        job,
        state="scheduled" if step.delay > 0 else "available",
        outcome="stage",
        next_stage=step.stage,
        context_json=context_json,
        retry_in_s=float(step.delay),
        priority=step.priority,
    )


def cancelled(job: Job) -> Finalize:
    return _finalize(job, state="cancelled", outcome="cancelled", error="cancelled while running")
