"""Conveyor: a durable task queue and batch-job engine on SQLite or PostgreSQL."""

from .app import Conveyor
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
from .job import Attempt, Job, JobState
from .retry import Backoff
from .runtime.context import current_job

__all__ = [
    "Attempt",
    "Backoff",
    "BadArguments",
    "ConfigError",
    "Conveyor",
    "ConveyorError",
    "DatabaseUnavailable",
    "Job",
    "JobNotFound",
    "JobState",
    "JobTimeout",
    "Permanent",
    "SchemaError",
    "SerializationError",
    "UnknownTask",
    "current_job",
]

__version__ = "0.1.0"
