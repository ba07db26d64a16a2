"""Conveyor: a durable task queue and batch-job engine on SQLite or PostgreSQL."""

from .app import Conveyor
from .batch import Batch
from .cron import Periodic
from .errors import (
    BadArguments,
    ConfigError,
    ConveyorError,
    DatabaseUnavailable,
    JobNotFound,
    JobTimeout,
    Permanent,
    SchemaError,
    SerializationError,
    UnknownTask,
)
from .flow import Chain, ChainFailed, NextStage, Snooze, Step
from .job import Attempt, Job, JobState
from .retry import Backoff
from .runtime.context import cancel_requested, current_job
from .task import Task

__all__ = [
    "Attempt",
    "Backoff",
    "BadArguments",
    "Batch",
    "Chain",
    "ChainFailed",
    "ConfigError",
    "Conveyor",
    "ConveyorError",
    "DatabaseUnavailable",
    "Job",
    "JobNotFound",
    "JobState",
    "JobTimeout",
    "NextStage",
    "Periodic",
    "Permanent",
    "SchemaError",
    "SerializationError",
    "Snooze",
    "Step",
    "Task",
    "UnknownTask",
    "cancel_requested",
    "chain",
    "current_job",
]

__version__ = "0.2.0"


def chain(*steps: Step | Task, conn: object = None) -> Chain:
    """``conveyor.chain(a.s(x), b.s(), c.s())``: each step is enqueued when the
    previous one succeeds and receives its result as first argument."""
    if not steps:
        raise ConfigError("a chain needs at least one step")
    first = steps[0]
    app = first.task.app if isinstance(first, Step) else first.app
    return app.chain(*steps, conn=conn)
