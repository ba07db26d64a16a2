"""Running one job: a linear pipeline of small steps, ending in a ``Finalize``.

invoke the handler (with its timeout, inside the middlewares) -> classify the
outcome (result, next stage, snooze, or an exception the classifiers judge) ->
encode what is stored. Whatever goes wrong on the way, even while describing
the error, the attempt ends as a record a person can read: never a job left
running with nobody to finish it.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..durable import Suspend, _store
from ..encoding import storable_json, storable_text
from ..errors import JobTimeout, Permanent
from ..flow import NextStage, Snooze
from ..hooks import Fail, Middleware, Retry
from ..records import Finalize, JobRecord, JobState, Outcome
from ..retry import Backoff
from ..task import Task
from .context import CancelFlag, _cancel, _current
from .pool import DaemonPool

if TYPE_CHECKING:
    from ..backends.interfaces import DurableStore

#: stored errors and tracebacks are cut to these many characters
ERROR_LIMIT = 16_000
TRACEBACK_LIMIT = 64_000
#: a result larger than this (as JSON) fails the job instead of being stored
RESULT_LIMIT = 16 << 20


@dataclass
class Run:
    """What happened when the handler ran, before it becomes a database write."""

    result: Any = None
    exc: BaseException | None = None
    #: time.monotonic() when the handler started (None: it never did)
    started: float | None = None
    ended: float | None = None

    @property
    def duration_s(self) -> float | None:
        if self.started is None:
            return None
        return (self.ended or time.monotonic()) - self.started


def safe_str(exc: BaseException) -> str:
    try:
        return str(exc)
    except BaseException as inner:  # a hostile __str__
        return f"<str() of the exception raised {type(inner).__name__}>"


def describe(exc: BaseException) -> str:
    text = safe_str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def format_traceback(exc: BaseException) -> str:
    try:
        return "".join(traceback.format_exception(exc))
    except BaseException:
        frames = "".join(traceback.format_tb(exc.__traceback__))
        return f"Traceback (most recent call last):\n{frames}{describe(exc)}\n"


class InProcess:
    """Runs handlers in this process: async ones on the event loop, sync ones on a
    pool of daemon threads. A sync job's timeout starts when a thread starts it;
    a job cancelled before then never runs."""

    def __init__(
        self,
        size: int,
        on_late: Callable[[Task, JobRecord, Run], None],
        store: Callable[[], DurableStore] | None = None,
    ) -> None:
        self.pool = DaemonPool(size)
        self._on_late = on_late
        #: where handlers' durable steps are stored (the worker's database)
        self._store = store

    async def invoke(self, task: Task, job: JobRecord, cancel: CancelFlag | None, run: Run) -> Any:
        """The handler's result; raises what it raised (``JobTimeout`` at its timeout)."""
        token = _current.set(job)
        cancel_token = _cancel.set(cancel)
        store_token = _store.set(self._store)
        try:
            if task.is_async:
                return await self._invoke_async(task, job, run)
            return await self._invoke_sync(task, job, run)
        finally:
            run.ended = time.monotonic()
            _current.reset(token)
            _cancel.reset(cancel_token)
            _store.reset(store_token)

    async def _invoke_async(self, task: Task, job: JobRecord, run: Run) -> Any:
        run.started = time.monotonic()
        if not job.timeout:
            return await task.fn(*job.args, **job.kwargs)
        deadline = asyncio.timeout(job.timeout)
        try:
            async with deadline:
                return await task.fn(*job.args, **job.kwargs)
        except TimeoutError:
            if deadline.expired():  # ours, not a TimeoutError the handler raised itself
                raise JobTimeout(f"{task.name} exceeded its {job.timeout:g}s timeout") from None
            raise

    async def _invoke_sync(self, task: Task, job: JobRecord, run: Run) -> Any:
        loop = asyncio.get_running_loop()
        started = loop.create_future()

        def on_start() -> None:  # on the pool thread, just before the handler
            run.started = time.monotonic()
            loop.call_soon_threadsafe(_resolve, started, None)

        ctx = contextvars.copy_context()
        cf = self.pool.submit(
            functools.partial(ctx.run, task.fn, *job.args, **job.kwargs), on_start
        )
        try:
            await started  # the timeout counts from here, not while waiting for a thread
        except asyncio.CancelledError:
            if not cf.cancel():  # it started meanwhile: let its thread go
                self.pool.abandon(cf)
            raise
        fut = asyncio.wrap_future(cf)
        try:
            return await asyncio.wait_for(asyncio.shield(fut), job.timeout)
        except TimeoutError:
            if cf.done():
                return cf.result()
            self.pool.abandon(cf)
            cf.add_done_callback(lambda f: self._on_late(task, job, _run_of(f, run)))
            raise JobTimeout(f"{task.name} exceeded its {job.timeout:g}s timeout") from None
        except asyncio.CancelledError:
            if not cf.done():
                self.pool.abandon(cf)  # a sync handler cannot be interrupted
            raise

    def shutdown(self) -> None:
        self.pool.shutdown()


def _resolve(fut: asyncio.Future[Any], value: Any) -> None:
    if not fut.done():
        fut.set_result(value)


def _run_of(fut: Any, run: Run) -> Run:
    exc = fut.exception()
    late = Run(started=run.started, ended=time.monotonic())
    if exc is not None:
        late.exc = exc
    else:
        late.result = fut.result()
    return late


# -- classification -----------------------------------------------------------------------
def _finalize(job: JobRecord, **fields: Any) -> Finalize:
    return Finalize(
        job_id=job.id,
        token=job.lease_token or "",
        ran_attempt=job.attempts,
        ran_stage=job.stage,
        **fields,
    )


def fail(job: JobRecord, error: str, tb: str | None = None) -> Finalize:
    return _finalize(
        job,
        state=JobState.FAILED,
        outcome=Outcome.FAILED,
        error=storable_text(error, ERROR_LIMIT),
        traceback=None if tb is None else storable_text(tb, TRACEBACK_LIMIT),
    )


def cancelled(job: JobRecord) -> Finalize:
    return _finalize(
        job, state=JobState.CANCELLED, outcome=Outcome.CANCELLED, error="cancelled while running"
    )


def classify(
    task: Task | None, job: JobRecord, run: Run, middleware: Sequence[Middleware] = ()
) -> Finalize:
    """Turn what happened into the job's next state. Never raises: if deciding
    fails (a hostile exception, a classifier that raises, a result that cannot be
    encoded), the attempt fails with what could be said."""
    try:
        return _classify(task, job, run, middleware)
    except BaseException as exc:
        if isinstance(exc, asyncio.CancelledError):
            raise
        original = "" if run.exc is None else f"; the handler raised {type(run.exc).__name__}"
        return fail(
            job,
            f"the attempt's outcome could not be recorded as it was ({describe(exc)} while "
            f"classifying it{original})",
            format_traceback(exc),
        )


def _classify(
    task: Task | None, job: JobRecord, run: Run, middleware: Sequence[Middleware]
) -> Finalize:
    if isinstance(run.exc, Suspend):  # a durable sleep or wait: not an error, no attempt used
        return snoozed(job, run.exc.seconds)
    if run.exc is None:
        result = run.result
        if isinstance(result, NextStage):
            return next_stage(job, result)
        if isinstance(result, Snooze):
            return snoozed(job, result.seconds)
        try:
            result_json = storable_json(result, "the result")
        except (TypeError, ValueError, RecursionError) as exc:
            return fail(
                job, f"handler returned a value that cannot be stored as JSON: {describe(exc)}"
            )
        if len(result_json) > RESULT_LIMIT:
            return fail(
                job,
                f"handler returned {len(result_json):,} bytes of JSON, over the "
                f"{RESULT_LIMIT:,}-byte limit for results; store large data elsewhere and "
                "return a reference",
            )
        return _finalize(
            job, state=JobState.SUCCEEDED, outcome=Outcome.SUCCEEDED, result_json=result_json
        )
    raised: BaseException = run.exc
    error = describe(raised)
    tb = format_traceback(raised)
    decision = None
    if task is not None and task.defaults.classify is not None:
        decision = task.defaults.classify(raised, job)
    for m in middleware:
        if decision is not None:
            break
        decision = m.classify(job, raised)
    if decision is None:
        decision = _default_rule(task, raised)
    if isinstance(decision, Snooze):
        return snoozed(job, decision.seconds)
    if isinstance(decision, Fail):
        why = f" ({decision.reason})" if decision.reason else " (classified permanent: not retried)"
        return fail(job, error + why, tb)
    if not isinstance(decision, Retry):
        raise TypeError(
            f"an error classifier returned {decision!r}: return conveyor.Retry(...), "
            "conveyor.Fail(...), conveyor.Snooze(...) or None"
        )
    budget = decision.max_attempts or job.max_attempts
    if job.attempts >= budget:
        return fail(job, f"{error} (attempt {job.attempts} of {budget}: no attempts left)", tb)
    if decision.delay is not None:
        delay = float(decision.delay)
    else:
        backoff = Backoff.from_dict(job.backoff) or (task.defaults.backoff if task else Backoff())
        delay = backoff.delay(job.attempts)
    return _finalize(
        job,
        state=JobState.SCHEDULED,
        outcome=Outcome.RETRY,
        error=storable_text(error, ERROR_LIMIT),
        traceback=storable_text(tb, TRACEBACK_LIMIT),
        retry_in_s=delay,
        max_attempts=decision.max_attempts,
    )


def _default_rule(task: Task | None, exc: BaseException) -> Retry | Fail:
    """``Permanent``, or an exception outside the task's ``retry_on``, fails the
    job; anything else is retried with the task's backoff."""
    if isinstance(exc, Permanent):
        return Fail("permanent: not retried")
    if isinstance(exc, SystemExit | KeyboardInterrupt):
        return Fail(
            f"the handler raised {type(exc).__name__}, which would stop the worker; "
            "the worker went on: not retried"
        )
    retry_on = task.defaults.retry_on if task else (Exception,)
    if not isinstance(exc, retry_on):
        names = ", ".join(r.__name__ for r in retry_on)
        return Fail(f"not in retry_on=({names}): not retried")
    return Retry()


def next_stage(job: JobRecord, step: NextStage) -> Finalize:
    """Back to the queue at the next stage, same id, attempts counted afresh."""
    try:
        context_json = storable_json(step.context, "the context")
    except (TypeError, ValueError, RecursionError) as exc:
        return fail(job, f"NextStage context cannot be stored as JSON: {describe(exc)}")
    return _finalize(
        job,
        state=JobState.SCHEDULED if step.delay > 0 else JobState.AVAILABLE,
        outcome=Outcome.STAGE,
        next_stage=step.stage,
        context_json=context_json,
        retry_in_s=float(step.delay),
        priority=step.priority,
    )


def snoozed(job: JobRecord, seconds: float) -> Finalize:
    return _finalize(
        job, state=JobState.SCHEDULED, outcome=Outcome.SNOOZED, retry_in_s=float(seconds)
    )


def safe_error(job: JobRecord, message: str) -> Finalize:
    """The smallest outcome that can be stored: failed, with a message only."""
    return fail(job, message)
