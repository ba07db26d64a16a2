"""Request models and field types shared by the routes. Every string the API
takes refuses NUL characters and lone surrogates (no database stores them), names
and keys every control character too, and each has a length limit; every number
has bounds the databases can hold, so hostile input gets a 422 naming the field,
never a database error."""

from __future__ import annotations

import base64
import binascii
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from ..checks import MAX_LIMIT_KEY, MAX_NAME, MAX_UNIQUE_KEY
from ..errors import ConfigError
from ..records import JobFilter, JobState
from ..registry import BUILTIN_TASKS, INTERNAL_QUEUE

MAX_INT32 = 2**31 - 1
MAX_ID = 2**63 - 1
#: delays and deadlines: ten years at most (timestamps stay far from overflow)
MAX_SECONDS = 10 * 365 * 86400.0


def clean_text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("must not contain lone surrogates (invalid UTF-16)") from None
    return value


def printable(value: str) -> str:
    """A name or key (not free text): a control character (newline, an ANSI escape)
    could forge or garble a line where the CLI and the dashboard show it."""
    if not value.isprintable():
        raise ValueError("must be printable: no control characters (newline, tab, escape...)")
    return value


def _near(value: datetime) -> datetime:
    if value.tzinfo is None:  # a time without offset is UTC (records are in UTC)
        value = value.replace(tzinfo=UTC)
    now = datetime.now(UTC)
    if not now - timedelta(seconds=MAX_SECONDS) <= value <= now + timedelta(seconds=MAX_SECONDS):
        raise ValueError("must be within ten years of now")
    return value


Text = Annotated[str, StringConstraints(max_length=10_000), AfterValidator(clean_text)]
Name = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_NAME),
    AfterValidator(clean_text),
    AfterValidator(printable),
]
#: a unique or idempotency key, a lease token
Key = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_UNIQUE_KEY),
    AfterValidator(clean_text),
    AfterValidator(printable),
]
#: a tenant (limit keys are the tasks' own: made from their arguments, never sent)
Tenant = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_LIMIT_KEY),
    AfterValidator(clean_text),
    AfterValidator(printable),
]


def _not_builtin(value: str) -> str:
    if value in BUILTIN_TASKS:
        raise ValueError(f"{value!r} is Conveyor's own task: it cannot be sent over HTTP")
    return value


def _not_internal(value: str) -> str:
    if value == INTERNAL_QUEUE:
        raise ValueError(
            f"{value!r} is Conveyor's own queue (its bulk actions): not for jobs or workers"
            " over HTTP"
        )
    return value


#: a task a client may send: any name but Conveyor's own (``BUILTIN_TASKS``)
TaskName = Annotated[Name, AfterValidator(_not_builtin)]
#: a queue a client may send to or lease from: any but Conveyor's own
QueueName = Annotated[Name, AfterValidator(_not_internal)]
JobId = Annotated[int, Field(ge=1, le=MAX_ID)]
Priority = Annotated[int, Field(ge=-MAX_INT32, le=MAX_INT32)]
Attempts = Annotated[int, Field(ge=1, le=MAX_INT32)]
Seconds = Annotated[float, Field(ge=0, le=MAX_SECONDS, allow_inf_nan=False)]
Timeout = Annotated[float, Field(gt=0, le=MAX_SECONDS, allow_inf_nan=False)]
Moment = Annotated[datetime, AfterValidator(_near)]
#: a substring of the arguments' JSON text to look for
Search = Annotated[str, StringConstraints(min_length=1, max_length=200), AfterValidator(clean_text)]


class Strict(BaseModel):
    """Unknown fields are refused: a typo is an error, not an option silently ignored."""

    model_config = ConfigDict(extra="forbid")


class SendOptions(Strict):
    """How a job is sent (the options of ``task.send``), all optional."""

    queue: QueueName | None = Field(None, description="default: the task's queue")
    priority: Priority | None = Field(None, description="higher runs first")
    delay: Seconds | None = Field(None, description="seconds from now before it may run")
    run_at: Moment | None = Field(None, description="when it may run (instead of delay)")
    max_attempts: Attempts | None = None
    timeout: Timeout | None = Field(None, description="seconds one attempt may take")
    tenant: Tenant | None = Field(None, description="the user or tenant it is for")
    pinned_to: list[Name] | None = Field(
        None, min_length=1, max_length=100, description="worker ids or tags that may run it"
    )

    def options(self) -> dict[str, Any]:
        return {
            name: getattr(self, name)
            for name in SendOptions.model_fields
            if getattr(self, name) is not None
        }


class JobCreate(SendOptions):
    task: TaskName
    args: list[Any] = Field(default_factory=list, max_length=10_000)
    kwargs: dict[str, Any] = Field(default_factory=dict)
    unique_key: Key | None = Field(None, description="no second unfinished job with this key")
    idempotency_key: Key | None = Field(
        None, description="at most one job ever (or the Idempotency-Key header)"
    )
    stage: Name | None = Field(None, description="the stage a multi-stage job starts at")
    context: Any = Field(None, description="data a multi-stage job carries between stages")

    def send_options(self) -> dict[str, Any]:
        out = self.options()
        for name in ("unique_key", "idempotency_key", "stage", "context"):
            if getattr(self, name) is not None:
                out[name] = getattr(self, name)
        return out


class JobsCreate(Strict):
    jobs: list[JobCreate] = Field(min_length=1, max_length=10_000)


class FilterFields(Strict):
    """Which jobs: every field narrows the selection."""

    ids: list[JobId] | None = Field(None, max_length=10_000)
    task: list[Name] | None = Field(None, max_length=100)
    queue: list[Name] | None = Field(None, max_length=100)
    state: list[JobState] | None = None
    stage: Name | None = None
    tenant: Tenant | None = None
    batch_id: JobId | None = None
    created_after: Moment | None = None
    created_before: Moment | None = None
    finished_after: Moment | None = None
    finished_before: Moment | None = None
    search: Search | None = None

    def to_filter(self) -> JobFilter:
        return JobFilter(
            ids=None if self.ids is None else tuple(self.ids),
            tasks=None if self.task is None else tuple(self.task),
            queues=None if self.queue is None else tuple(self.queue),
            states=None if self.state is None else tuple(self.state),
            stage=self.stage,
            tenant=self.tenant,
            batch_id=self.batch_id,
            created_after=self.created_after,
            created_before=self.created_before,
            finished_after=self.finished_after,
            finished_before=self.finished_before,
            search=self.search,
        )


class BulkAction(FilterFields):
    """A bulk action on every job matching the filter (in the states it applies to)."""

    all: bool = Field(False, description="required to act on every job (an empty filter)")
    dry_run: bool = Field(False, description="only count what would change")
    background: bool = Field(
        False,
        description="run in the background and answer 202 with the action's record at "
        "once; follow it at /v1/actions/{id} (the audit log of bulk actions)",
    )

    def checked_filter(self) -> JobFilter:
        f = self.to_filter()
        if f.empty and not self.all:
            raise ConfigError(
                "filter: no field given; pass at least one (task, queue, state, ...) or "
                '"all": true to act on every job'
            )
        return f


# -- cursors: opaque to clients, never an OFFSET ----------------------------------------------
def encode_cursor(*parts: object) -> str:
    text = "|".join(str(p) for p in parts)
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _cursor_text(cursor: str) -> str:
    """A cursor decoded ("" when it is not one this API returned)."""
    try:
        return base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return ""


def decode_cursor(cursor: str, n: int) -> list[str]:
    """The ``n`` parts of a cursor this API returned; ``ConfigError`` otherwise."""
    parts = _cursor_text(cursor).split("|")
    if len(parts) != n or not all(parts):
        raise ConfigError("cursor: not a cursor this API returned (pass next_cursor as it came)")
    return parts


def cursor_name(cursor: str | None) -> str | None:
    """The name a one-part cursor holds whole (a worker's id: any text, ``|`` too)."""
    if cursor is None:
        return None
    text = _cursor_text(cursor)
    if not text:
        raise ConfigError("cursor: not a cursor this API returned (pass next_cursor as it came)")
    return text


def cursor_id(cursor: str | None) -> int | None:
    if cursor is None:
        return None
    (raw,) = decode_cursor(cursor, 1)
    if not raw.isdigit() or not 0 < int(raw) <= MAX_ID:
        raise ConfigError("cursor: not a cursor this API returned (pass next_cursor as it came)")
    return int(raw)
