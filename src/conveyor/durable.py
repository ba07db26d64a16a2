"""Durable steps inside one job: what ``current_job()`` offers a handler beyond
the job's fields, and the events its waits are woken by.

A handler's ``ctx.step(name, fn, ...)`` stores ``fn``'s result by (job, name)
once it returns; when the handler runs again (a retry, a wake-up) the stored
value comes back instead of running ``fn``. ``ctx.sleep`` and
``ctx.wait_for_event`` end the attempt without using it up (as ``Snooze``) and
schedule the job again: no worker waits. Every write is fenced by the attempt's
lease token, as its outcome is. Async handlers ``await`` the three methods; sync
handlers call them plainly (the same methods: whether the calling thread runs an
event loop decides).
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
from collections.abc import Callable
from contextvars import ContextVar
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from .checks import MAX_NAME, MAX_UNIQUE_KEY, check_name
from .encoding import storable_json
from .errors import ConfigError, ConveyorError, Permanent
from .records import Emitted, JobRecord, StepRecord, frozen_record

if TYPE_CHECKING:
    from .backends.interfaces import DurableStore

#: the database a running handler's steps are stored in (set by the executor)
_store: ContextVar[Callable[[], DurableStore] | None] = ContextVar(
    "conveyor_step_store", default=None
)

#: event keys are at most this long (the databases' key limits; step names: MAX_NAME)
MAX_KEY = MAX_UNIQUE_KEY
#: a wait without a timeout looks again after this long (a year)
FOREVER_S = 365 * 86400.0


class Suspend(BaseException):
    """Ends the attempt without using it up; the job runs again in ``seconds``.
    Raised by ``sleep`` and ``wait_for_event``: a ``BaseException``, so a
    handler's ``except Exception`` does not swallow it."""

    def __init__(self, seconds: float, why: str) -> None:
        super().__init__(seconds, why)
        self.seconds = max(0.0, float(seconds))
        self.why = why


class EventTimeout(TimeoutError):
    """``wait_for_event`` reached its timeout before the event was emitted."""

    def __init__(self, key: str, name: str) -> None:
        super().__init__(f"no event {key!r} arrived before the timeout of wait {name!r}")
        self.key = key


class StepError(ConveyorError, Permanent):
    """A durable step cannot be stored as asked (a result JSON cannot hold, a name
    used by another kind of step, a bad name): the job fails without retrying."""


class StepRefused(ConveyorError):
    """The attempt no longer holds its job (its lease was lost: another attempt
    may run it now, or it was cancelled): the step was not stored."""


class JobContext(JobRecord):
    """The running job (every field of its ``JobRecord``) and its durable steps."""

    @classmethod
    def of(cls, job: JobRecord) -> JobContext:
        values = dict(job.__dict__)
        values.pop("_steps", None)
        return frozen_record(cls, values)

    # -- the three verbs -------------------------------------------------------------------
    def step(self, name: str, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)``, stored as ``name``; its stored value if it ran
        before (decoded JSON, as a job's result). Awaitable in an async handler
        (``fn`` may then be async)."""
        _check_name(name)
        if _in_event_loop():
            return self._step_async(name, fn, args, kwargs)
        stored = self._load().get(name)
        if stored is not None:
            return _value(stored, name, "step")
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            _close(value)
            raise StepError(f"step {name!r}: an async function in a sync handler; make it sync")
        return self._keep(name, value)

    def sleep(self, name: str, delta: timedelta | float) -> Any:
        """End this attempt and run the job again once ``delta`` has passed since
        the sleep first began (stored by ``name``: a rerun after it returns at
        once, one before it sleeps the remainder). Awaitable in an async handler."""
        _check_name(name)
        seconds = _seconds(delta, "sleep")
        if _in_event_loop():
            return asyncio.to_thread(self._sleep, name, seconds)
        return self._sleep(name, seconds)

    def wait_for_event(
        self, key: str, *, timeout: timedelta | float | None = None, name: str | None = None
    ) -> Any:
        """The payload of event ``key`` (``emit_event``): at once if it was emitted,
        even before this wait; else the attempt ends and the job runs again when it
        is, or at ``timeout`` (from the first wait), where ``EventTimeout`` is
        raised. The payload is kept as a step (``name``, default ``event:<key>``).
        Awaitable in an async handler."""
        _check_key(key, StepError)
        name = name or _wait_name(key)
        _check_name(name)
        timeout_s = None if timeout is None else _seconds(timeout, "timeout")
        if _in_event_loop():
            return asyncio.to_thread(self._wait, key, name, timeout_s)
        return self._wait(key, name, timeout_s)

    # -- how ---------------------------------------------------------------------------------
    async def _step_async(
        self, name: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        stored = (await asyncio.to_thread(self._load)).get(name)
        if stored is not None:
            return _value(stored, name, "step")
        value = fn(*args, **kwargs)
        if inspect.isawaitable(value):
            value = await value
        return await asyncio.to_thread(self._keep, name, value)

    def _load(self) -> dict[str, StepRecord]:
        """The job's stored steps, read once per run of the handler."""
        steps: dict[str, StepRecord] | None = self.__dict__.get("_steps")
        if steps is None:
            steps = {s.name: s for s in _backend().step_list(job_id=self.id)}
            self.__dict__["_steps"] = steps
        return steps

    def _keep(self, name: str, value: Any) -> Any:
        try:
            text = storable_json(value, f"step {name!r}")
        except (TypeError, ValueError, RecursionError) as exc:
            raise StepError(
                f"step {name!r} returned a value that cannot be stored as JSON: {exc}"
            ) from None
        stored = self._save(name, "step", result_json=text)
        self._load()[name] = stored
        return _value(stored, name, "step")  # the first write's, if another won

    def _sleep(self, name: str, seconds: float) -> None:
        stored = self._save(name, "sleep", wake_in_s=seconds)
        if stored.kind != "sleep":
            raise _clash(name, stored.kind, "sleep")
        if stored.due_in_s is not None and stored.due_in_s > 0:
            raise Suspend(stored.due_in_s, f"sleep {name!r}")

    def _wait(self, key: str, name: str, timeout_s: float | None) -> Any:
        stored = _backend().step_wait(
            job_id=self.id, token=self.lease_token or "", name=name, key=key, timeout_s=timeout_s
        )
        if stored is None:
            raise _refused(self, name)
        if stored.kind != "wait" or stored.event_key != key:
            raise _clash(name, stored.kind if stored.kind != "wait" else "wait (other key)", "wait")
        if stored.timed_out:
            raise EventTimeout(key, name)
        if stored.done:
            return None if stored.result_json is None else json.loads(stored.result_json)
        due = FOREVER_S if stored.due_in_s is None else stored.due_in_s
        raise Suspend(due, f"wait for event {key!r}")

    def _save(self, name: str, kind: str, **fields: Any) -> StepRecord:
        stored = _backend().step_save(
            job_id=self.id, token=self.lease_token or "", name=name, kind=kind, **fields
        )
        if stored is None:
            raise _refused(self, name)
        return stored


def emit(store: DurableStore, key: str, payload: Any = None) -> Emitted:
    """Store event ``key`` with ``payload`` (JSON) and wake the jobs waiting for
    it. The first payload for a key wins: a later emit returns ``created=False``."""
    _check_key(key)
    try:
        text = storable_json(payload, "payload")
    except (TypeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"payload: cannot be stored as JSON: {exc}") from None
    return store.event_emit(key=key, payload_json=text)


# -- helpers ------------------------------------------------------------------------------------
def _backend() -> DurableStore:
    get = _store.get()
    if get is None:
        raise RuntimeError(
            "durable steps need a worker's database: call them from a handler a Conveyor "
            "worker runs"
        )
    return get()


def _in_event_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _close(value: Any) -> None:
    close = getattr(value, "close", None)
    if callable(close):
        close()


def _value(stored: StepRecord, name: str, kind: str) -> Any:
    if stored.kind != kind:
        raise _clash(name, stored.kind, kind)
    return None if stored.result_json is None else json.loads(stored.result_json)


def _clash(name: str, stored: str, asked: str) -> StepError:
    return StepError(
        f"step name {name!r} is stored as a {stored}, not a {asked}: every step, sleep and "
        "wait of a handler needs a name of its own"
    )


def _refused(job: JobRecord, name: str) -> StepRefused:
    return StepRefused(
        f"job {job.id}, attempt {job.attempts}: step {name!r} was not stored, as this attempt "
        "no longer holds the job (its lease was lost or it ended)"
    )


def _check_name(name: str) -> None:
    _checked(name, "name: a step's name", MAX_NAME, StepError)


def _check_key(key: str, error: type[ConveyorError] = ConfigError) -> None:
    _checked(key, "key: an event key", MAX_KEY, error)


def _checked(value: str, what: str, max_length: int, error: type[ConveyorError]) -> None:
    """``check_name``'s rule (printable text: the CLI and the dashboard show step
    names and event keys), raising ``error``: a handler's ``StepError`` fails its
    job at once, as every other step it cannot store does."""
    try:
        check_name(value, what, max_length=max_length)
    except ConfigError as exc:
        raise error(str(exc)) from None


def _wait_name(key: str) -> str:
    name = f"event:{key}"
    if len(name) <= MAX_NAME:
        return name
    return "event:#" + hashlib.sha256(key.encode()).hexdigest()


def _seconds(delta: timedelta | float, field: str) -> float:
    seconds = delta.total_seconds() if isinstance(delta, timedelta) else delta
    if not isinstance(seconds, int | float) or isinstance(seconds, bool) or seconds < 0:
        raise StepError(f"{field}: a timedelta or seconds >= 0, got {delta!r}")
    return float(seconds)
