"""The façade's checks of what callers pass: filters, ids, retention, the
sensitive parameters a task declares. Shared by the façade and its helpers."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .errors import ConfigError
from .records import JobFilter, JobState

DAY = 86400.0
DEFAULT_RETENTION: dict[str, float | None] = {
    JobState.SUCCEEDED: 7 * DAY,
    JobState.FAILED: 30 * DAY,
    JobState.CANCELLED: 7 * DAY,
}
MAX_RETENTION_S = 100 * 365 * DAY

_ALIASES = {"state": "states", "queue": "queues", "task": "tasks", "id": "ids"}


def make_filter(filter: JobFilter | None = None, **fields: Any) -> JobFilter:
    """A ``JobFilter`` from one, or from keyword fields (``state=JobState.FAILED`` and the
    other singular aliases too); ``None`` values are ignored."""
    given = {_ALIASES.get(k, k): v for k, v in fields.items() if v is not None}
    unknown = set(given) - {f.name for f in dataclasses.fields(JobFilter)}
    if unknown:
        raise ConfigError(f"unknown job filter field(s) {sorted(unknown)}")
    if filter is None:
        return JobFilter(**given)
    return dataclasses.replace(filter, **given) if given else filter


#: The longest name (a task, queue, stage, batch, token...), tenant or limit key
#: (concurrency, rate), and unique or idempotency key: what every database stores
#: whole (MariaDB's columns are varchar(255) and varchar(512); its inserts that
#: skip conflicting rows cut a longer value short, and cut keys stop matching).
MAX_NAME, MAX_LIMIT_KEY, MAX_UNIQUE_KEY = 200, 255, 512


def check_name(value: Any, what: str, *, max_length: int = MAX_NAME) -> str:
    """A name or key a caller gives (a task, queue, tenant, token, batch, workflow,
    limit key): printable text, as the CLI and the dashboard show it. A control
    character (NUL, newline, an ANSI escape) could forge or garble a line there."""
    if (
        not isinstance(value, str)
        or not value.strip()
        or len(value) > max_length
        or not value.isprintable()
    ):
        raise ConfigError(
            f"{what} must be a non-empty printable string (no control characters) of at "
            f"most {max_length} characters, got {value!r}"
        )
    return value


def check_id(value: Any, what: str) -> int:
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ConfigError(f"a {what} id is an integer, got {value!r}") from None
    if isinstance(value, bool) or not 0 < n < 2**63:
        raise ConfigError(f"a {what} id is a positive integer, got {value!r}")
    return n


def sensitive_parameters(
    fn: Callable[..., Any], task: str, names: Sequence[str]
) -> dict[str, int | None]:
    """``@app.task(sensitive=)`` checked: each name -> its position among the
    positional parameters (None: keyword-only)."""
    if not names:
        return {}
    if isinstance(names, str):
        names = (names,)
    params = list(inspect.signature(fn).parameters.values())
    by_name = {p.name: p for p in params}
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise ConfigError(f"sensitive: {', '.join(unknown)} is not a parameter of {task}")
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return {n: params.index(by_name[n]) if by_name[n].kind in positional else None for n in names}


def check_retention(retention: Mapping[str, float | None]) -> dict[str, float | None]:
    """Seconds per finished state, each between 0 and 100 years, or None (forever)."""
    unknown = set(retention) - set(DEFAULT_RETENTION)
    if unknown:
        raise ConfigError(
            f"retention is per finished state {sorted(DEFAULT_RETENTION)}, got {sorted(unknown)}"
        )
    for state, keep in retention.items():
        if keep is not None and (
            isinstance(keep, bool)
            or not isinstance(keep, int | float)
            or not 0 <= keep <= MAX_RETENTION_S
        ):
            raise ConfigError(
                f"retention for {state!r} must be seconds from 0 to 100 years, "
                f"or None to keep forever; got {keep!r}"
            )
    return {JobState(k): v for k, v in retention.items()}


def check_tuning(*, vacuum_dead_rows: int | None, priority_aging_s: float | None) -> None:
    """``Conveyor(vacuum_dead_rows=, priority_aging_s=)``: a positive count of rows
    and a positive number of seconds, or None."""
    if vacuum_dead_rows is not None and (
        not isinstance(vacuum_dead_rows, int)
        or isinstance(vacuum_dead_rows, bool)
        or vacuum_dead_rows < 1
    ):
        raise ConfigError(
            f"vacuum_dead_rows must be a positive number of rows or None, got {vacuum_dead_rows!r}"
        )
    if priority_aging_s is not None and priority_aging_s <= 0:
        raise ConfigError(f"priority_aging_s must be > 0 or None, got {priority_aging_s}")
