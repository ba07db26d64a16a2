"""The handle users get back for a job: its record plus what to do with it."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import TYPE_CHECKING, Any, Generic, Protocol, cast

from typing_extensions import TypeVar

from .errors import JobFailed
from .records import Attempt, JobRecord, JobState, frozen_record

__all__ = ["Attempt", "Job", "JobApp", "JobState"]


class Chained(Protocol):
    """What ``Job.then`` gives back (``flow.Chain`` is one): the chain, to add
    steps to or wait on. A Protocol, so that this module, which ``flow`` builds
    on, need not import it."""

    @property
    def id(self) -> int: ...

    def then(self, step: Any) -> Chained: ...

    def jobs(self) -> list[Job]: ...

    def status(self) -> tuple[str, Job]: ...

    def wait(self, timeout: float | None = None) -> Job: ...

    def result(self, timeout: float | None = None) -> Any: ...


class JobApp(Protocol):
    """What a Job calls on the app that read it (``Conveyor`` is one)."""

    def get_job(self, job_id: int) -> Job: ...

    def wait_job(self, job_id: int, timeout: float | None = None) -> Job: ...

    async def await_result(self, job_id: int, timeout: float | None = None) -> Any: ...

    def job_attempts(self, job_id: int) -> list[Attempt]: ...

    def get_chain(self, chain_id: int) -> Chained: ...


#: the result type of the job's handler (``Job[int]``); a bare ``Job`` is ``Job[Any]``
R = TypeVar("R", default=Any)

_RECORD_FIELDS = tuple(f.name for f in fields(JobRecord))


@dataclass(frozen=True)
class Job(JobRecord, Generic[R]):
    """A job, fresh from the database at the moment it was read.

    ``app.get_job(job.id)`` (or ``job.refresh()``) reads it again.
    ``created`` is False when a ``unique_key`` or ``idempotency_key`` named a job
    that already existed: this handle is that job, and nothing was written.
    """

    created: bool = True
    _app: JobApp | None = field(default=None, repr=False, compare=False)
    if TYPE_CHECKING:
        #: what the handler returned (``R``, its return type, as JSON gives it
        #: back: a tuple comes back a list); None until the job succeeds
        result: R | None = None

    @classmethod
    def of(cls, record: JobRecord, app: JobApp | None, created: bool = True) -> Job:
        values = {name: getattr(record, name) for name in _RECORD_FIELDS}
        return cls(**values, created=created, _app=app)

    @classmethod
    def template(cls, app: JobApp | None, **values: Any) -> dict[str, Any]:
        """Every field of a new job's handle but those ``fresh`` sets per job: the
        defaults updated with ``values``. Jobs enqueued together share one."""
        state = dict(_DEFAULTS)
        state.update(values)
        state["_app"] = app
        return state

    @classmethod
    def fresh(
        cls, template: dict[str, Any], job_id: int, args: list[Any], kwargs: dict[str, Any]
    ) -> Job:
        """A new job's handle: a copy of ``template`` (see ``Job.template``) with
        its id, arguments and own headers. ``__init__`` is skipped (a frozen
        dataclass sets every field through ``object.__setattr__``, which costs more
        than the insert's other Python work); same result as ``Job(**fields)``."""
        state = template.copy()
        state["id"], state["args"], state["kwargs"], state["headers"] = job_id, args, kwargs, {}
        return frozen_record(cls, state)

    @classmethod
    def unbound(cls, template: dict[str, Any], args: list[Any], kwargs: dict[str, Any]) -> Job:
        """``fresh`` before the database gave the job its id (``bind`` sets it):
        built while the database still writes the job (``Conveyor.insert_stream``).
        Not to be handed out before ``bind``."""
        return cls.fresh(template, 0, args, kwargs)

    def bind(self, job_id: int) -> Job:
        """This ``unbound`` handle, with the id the database gave its job."""
        self.__dict__["id"] = job_id
        return self

    def _require_app(self) -> JobApp:
        if self._app is None:
            raise RuntimeError(
                "this Job record is not bound to a Conveyor app; use app.get_job(id)"
            )
        return self._app

    def refresh(self) -> Job[R]:
        """The same job, read again from the database."""
        return self._require_app().get_job(self.id)

    def wait(self, timeout: float | None = None) -> Job[R]:
        """Block until the job is finished (succeeded, failed or cancelled); return it.

        Raises ``TimeoutError`` if it is not finished within ``timeout`` seconds.
        Woken by the database's change hints, with a poll as the safety net.
        """
        return self._require_app().wait_job(self.id, timeout=timeout)

    async def await_result(self, timeout: float | None = None) -> R:
        """``await job.await_result()``: wait without blocking the event loop and
        return the result; raises ``JobFailed`` if the job failed or was cancelled."""
        return cast("R", await self._require_app().await_result(self.id, timeout=timeout))

    def result_or_raise(self) -> R:
        """The result of a succeeded job; ``JobFailed`` for a failed or cancelled one."""
        if self.state == JobState.SUCCEEDED:
            return cast("R", self.result)
        if self.state.finished:
            raise JobFailed(f"job {self.id} ({self.task}) {self.state}: {self.error}")
        raise RuntimeError(f"job {self.id} is still {self.state}")

    def then(self, step: Any) -> Chained:
        """Run ``step`` (``task.s(...)`` or a task) after this job succeeds, with this
        job's result as its first argument. Returns the chain, to add more steps."""
        return self._require_app().get_chain(self.chain_root or self.id).then(step)

    def attempt_log(self) -> list[Attempt]:
        """Every recorded attempt, oldest first."""
        return self._require_app().job_attempts(self.id)


#: every field's default (``headers``' factory is called per job in ``fresh``)
_DEFAULTS: dict[str, Any] = {
    f.name: f.default for f in fields(Job) if f.default is not MISSING or f.name == "headers"
}
