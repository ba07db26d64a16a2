"""Multi-stage jobs and chains.

A handler returns ``NextStage(...)`` to put the same job back in the queue at its
next stage. A chain runs steps one after another, each receiving the previous
result as its first argument; the flow service (runtime/services.py) enqueues
each step when the previous one succeeds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from .errors import ConfigError, ConveyorError
from .job import Job
from .records import JobInsert, JobState, step_job
from .task import Payloads, Step, Task


class ChainApp(Protocol):
    """What a Chain calls on its app (``Conveyor`` is one)."""

    def get_job(self, job_id: int) -> Job: ...

    def append_to_chain(self, job_id: int, steps_json: str) -> bool: ...

    def insert_jobs(
        self, inserts: Sequence[JobInsert], *, conn: Any = None, payloads: Payloads | None = None
    ) -> list[Job]: ...

    def change_generation(self) -> int: ...

    def wait_for_change(self, generation: int, timeout: float) -> None: ...


@dataclass(frozen=True)
class NextStage:
    """Return this from a handler: the job goes back to the queue at ``stage``
    (other jobs get their turn in between), keeps its id, carries ``context``
    (read it with ``current_job().context``), and starts counting attempts
    afresh. ``priority`` changes the job's priority from then on."""

    stage: str
    context: Any = None
    delay: float = 0.0
    priority: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stage, str) or not self.stage:
            raise ConfigError(f"NextStage needs a non-empty stage name, got {self.stage!r}")
        if self.delay < 0:
            raise ConfigError(f"NextStage delay must be >= 0, got {self.delay}")


@dataclass(frozen=True)
class Snooze:
    """Return this from a handler to run the job again in ``seconds`` without
    using up an attempt (a resource is busy, a rate limit said wait, ...)."""

    seconds: float

    def __post_init__(self) -> None:
        if not isinstance(self.seconds, int | float) or self.seconds < 0:
            raise ConfigError(f"Snooze needs a number of seconds >= 0, got {self.seconds!r}")


def next_step_insert(
    link_id: int, chain_root: int | None, result_json: str | None, steps: Sequence[dict[str, Any]]
) -> JobInsert:
    """The job for ``steps[0]``, given the previous step's stored result."""
    rest = list(steps[1:])
    previous = json.loads(result_json) if result_json else None
    return step_job(dict(steps[0]), [previous])._replace(
        chain_json=json.dumps(rest) if rest else None,
        chain_root=chain_root or link_id,
        # However often the flow service retries this link, it enqueues one job.
        idempotency_key=f"conveyor:chain:{link_id}",
        unique_key=None,
    )


class ChainFailed(ConveyorError):
    """A step of the chain failed or was cancelled; later steps did not run."""


@dataclass(frozen=True)
class Chain:
    """Handle of a chain, named by its first job."""

    app: ChainApp
    id: int

    def then(self, step: Step | Task) -> Chain:
        """Add a step after the current last one."""
        step = _as_step(step)
        step.check(receives_result=True)
        payload = json.dumps([step.to_dict()])
        for _ in range(20):
            tail = self.jobs()[-1]
            if self.app.append_to_chain(tail.id, payload):
                return self
        raise ConveyorError(f"chain {self.id} kept moving on while adding a step; try again")

    def jobs(self) -> list[Job]:
        """The chain's jobs so far, first to last."""
        jobs = [self.app.get_job(self.id)]
        while jobs[-1].chain_next:
            jobs.append(self.app.get_job(jobs[-1].chain_next))
        return jobs

    def status(self) -> tuple[str, Job]:
        """(the chain's state as a job state's name, the last job so far)."""
        last = self.jobs()[-1]
        if not last.state.finished:
            return JobState.RUNNING, last
        if last.state != JobState.SUCCEEDED:
            return str(last.state), last
        waiting = bool(last.chain) and last.chain_next is None  # the next step is due
        return (JobState.RUNNING if waiting else JobState.SUCCEEDED), last

    def wait(self, timeout: float | None = None) -> Job:
        """Block until the chain ends; return its last job. Raises ``ChainFailed``
        with the failing step's reason, or ``TimeoutError``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            generation = self.app.change_generation()
            state, last = self.status()
            if state == JobState.SUCCEEDED:
                return last
            if state in (JobState.FAILED, JobState.CANCELLED):
                n = len(self.jobs())
                raise ChainFailed(
                    f"chain {self.id} stopped: step {n} ({last.task}) {state}: {last.error}"
                )
            remaining = 3600.0 if deadline is None else deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"chain {self.id} still running after {timeout}s")
            self.app.wait_for_change(generation, remaining)

    def result(self, timeout: float | None = None) -> Any:
        return self.wait(timeout).result


def _as_step(step: Step | Task) -> Step:
    if isinstance(step, Task):
        return step.s()
    if isinstance(step, Step):
        return step
    raise TypeError(f"a chain step is task.s(...) or a task, got {type(step).__name__}")


def start_chain(app: ChainApp, steps: Sequence[Step | Task], conn: Any = None) -> Chain:
    """Enqueue the first step now, carrying the others."""
    if not steps:
        raise ConfigError("a chain needs at least one step")
    first, *rest = [_as_step(s) for s in steps]
    first.check(receives_result=False)
    for step in rest:
        step.check(receives_result=True)
    insert = first.task.build(first.args, first.kwargs, **first.options)
    if rest:
        insert = insert._replace(chain_json=json.dumps([s.to_dict() for s in rest]))
    job = app.insert_jobs([insert], conn=conn, payloads=[(first.args, first.kwargs)])[0]
    return Chain(app, job.id)
