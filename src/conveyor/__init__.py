"""Conveyor: a durable task queue and batch-job engine on SQLite or PostgreSQL."""

from typing import cast

from .app import Conveyor
from .batch import Batch
from .cron import Periodic
from .durable import EventTimeout, JobContext, StepError, StepRefused
from .errors import (
    BadArguments,
    ConfigError,
    Conflict,
    ConveyorError,
    DatabaseUnavailable,
    JobFailed,
    JobNotFound,
    JobTimeout,
    KeyReused,
    Permanent,
    SchemaError,
    SchemaTooNew,
    SerializationError,
    UnknownTask,
)
from .flow import Chain, ChainApp, ChainFailed, NextStage, Snooze, start_chain
from .hooks import Fail, Middleware, Retry
from .job import Attempt, Job
from .records import (
    PARENT_FAILED,
    BatchState,
    BulkResult,
    Emitted,
    JobFilter,
    JobRecord,
    JobState,
    NodeState,
    Outcome,
    WorkflowNode,
    WorkflowRecord,
    WorkflowState,
)
from .retry import Backoff
from .runtime.context import cancel_requested, current_job
from .task import Step, Task
from .workflow import Node, Workflow, WorkflowFailed, WorkflowRun

__all__ = [
    "PARENT_FAILED",
    "Attempt",
    "Backoff",
    "BadArguments",
    "Batch",
    "BatchState",
    "BulkResult",
    "Chain",
    "ChainFailed",
    "ConfigError",
    "Conflict",
    "Conveyor",
    "ConveyorError",
    "DatabaseUnavailable",
    "Emitted",
    "EventTimeout",
    "Fail",
    "Job",
    "JobContext",
    "JobFailed",
    "JobFilter",
    "JobNotFound",
    "JobRecord",
    "JobState",
    "JobTimeout",
    "KeyReused",
    "Middleware",
    "NextStage",
    "Node",
    "NodeState",
    "Outcome",
    "Periodic",
    "Permanent",
    "Retry",
    "SchemaError",
    "SchemaTooNew",
    "SerializationError",
    "Snooze",
    "Step",
    "StepError",
    "StepRefused",
    "Task",
    "UnknownTask",
    "Workflow",
    "WorkflowFailed",
    "WorkflowNode",
    "WorkflowRecord",
    "WorkflowRun",
    "WorkflowState",
    "cancel_requested",
    "chain",
    "current_job",
]


def __getattr__(name: str) -> str:
    """``conveyor.__version__``, read from the package's metadata (pyproject.toml,
    the one source of truth) when first asked: importlib.metadata costs a worker
    about 30 ms of start-up it has no use for."""
    if name != "__version__":
        raise AttributeError(f"module 'conveyor' has no attribute {name!r}")
    from importlib.metadata import PackageNotFoundError, version

    try:
        found = version("conveyor")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        found = "0+unknown"
    globals()["__version__"] = found
    return found


def chain(*steps: Step | Task, conn: object = None) -> Chain:
    """``conveyor.chain(a.s(x), b.s(), c.s())``: each step is enqueued when the
    previous one succeeds and receives its result as first argument."""
    if not steps:
        raise ConfigError("a chain needs at least one step")
    first = steps[0]
    # a task is bound to its app's plumbing (``Conveyor.plumbing``), a ChainApp too
    app = cast(ChainApp, first.task.app if isinstance(first, Step) else first.app)
    return start_chain(app, steps, conn=conn)
