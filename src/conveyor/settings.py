"""Per-task-type settings (seed 001's ``t_schedule_cfg``): checking them, the
per-app cache producers read them through, and how they fill in a job's options.

Precedence, from strongest: a job's own send options (``max_attempts=``,
``timeout=``, ``backoff=``), then the settings stored in the database, then the
defaults of the ``@app.task`` decorator. A job records which options it was sent
with (``JobInsert.explicit``), so a later change of settings reaches exactly the
waiting jobs whose values came from settings or defaults (the backend updates
them in the same transaction), and every worker, in-process or remote, runs them
with the new values from its next claim.

What each setting is:

- ``max_attempts``: attempts before a job fails for good.
- ``max_processing_s``: the job's timeout (in-process workers stop the handler);
  for remote and asyncflow holders, the lease deadline past which the job is
  taken back and its late outcome refused.
- ``retry_interval_s`` / ``retry_cap_s``: the backoff's base and cap; the delay
  doubles (factor 2) from one retry to the next, as the seed describes.
- ``batch_size`` / ``poll_interval_s``: what remote workers are told to use (the
  default ``limit`` of a lease and the suggested poll interval). In-process
  workers keep their command-line flags (``--concurrency``, ``--poll``) for those.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from typing import Any

from .errors import ConfigError
from .records import (
    EXPLICIT_ALL,
    EXPLICIT_BACKOFF,
    EXPLICIT_MAX_ATTEMPTS,
    EXPLICIT_TIMEOUT,
    JobInsert,
    TaskSettings,
)
from .retry import Backoff

YEAR_S = 365 * 86400.0
#: field -> (kind, lowest, highest); None is always accepted (unset)
LIMITS: dict[str, tuple[type, float, float]] = {
    "batch_size": (int, 1, 10_000),
    "poll_interval_s": (float, 0.01, 86400.0),
    "max_processing_s": (float, 0.001, YEAR_S),
    "max_attempts": (int, 1, 2**31 - 1),
    "retry_interval_s": (float, 0.0, YEAR_S),
    "retry_cap_s": (float, 0.0, YEAR_S),
}
FIELDS = tuple(LIMITS)
#: how long producers may use settings they read (a change reaches new jobs within)
CACHE_S = 2.0
#: the factor between successive retry delays when the settings set the backoff
DOUBLING = 2.0


def check_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields, checked and normalised (ints stay ints, seconds become floats).
    ``ConfigError`` names the first field that is wrong."""
    unknown = sorted(set(fields) - set(LIMITS))
    if unknown:
        raise ConfigError(f"unknown task setting(s) {unknown}; settings are: {', '.join(FIELDS)}")
    out: dict[str, Any] = {}
    for name, value in fields.items():
        kind, low, high = LIMITS[name]
        if value is None:
            out[name] = None
            continue
        number = isinstance(value, int | float) and not isinstance(value, bool)
        if not number or (kind is int and not isinstance(value, int)):
            what = "an integer" if kind is int else "a number of seconds"
            raise ConfigError(f"{name} must be {what} or null, got {value!r}")
        if not math.isfinite(value) or not low <= value <= high:
            raise ConfigError(f"{name} must be from {low:g} to {high:g}, got {value!r}")
        out[name] = int(value) if kind is int else float(value)
    return out


def settings_backoff(settings: TaskSettings | None, default: Backoff) -> Backoff | None:
    """The backoff the settings make (``None`` if they set neither retry field):
    the decorator's, with the settings' base and cap, doubling."""
    if settings is None or (settings.retry_interval_s is None and settings.retry_cap_s is None):
        return None
    return replace(
        default,
        base=default.base if settings.retry_interval_s is None else settings.retry_interval_s,
        cap=default.cap if settings.retry_cap_s is None else settings.retry_cap_s,
        factor=DOUBLING,
    )


def apply_settings(
    insert: JobInsert, settings: TaskSettings, backoff_json: str | None
) -> JobInsert:
    """``insert`` with the settings filling in every option it was not sent with."""
    changes: dict[str, Any] = {}
    if settings.max_attempts is not None and not insert.explicit & EXPLICIT_MAX_ATTEMPTS:
        changes["max_attempts"] = settings.max_attempts
    if settings.max_processing_s is not None and not insert.explicit & EXPLICIT_TIMEOUT:
        changes["timeout_s"] = settings.max_processing_s
    if backoff_json is not None and not insert.explicit & EXPLICIT_BACKOFF:
        changes["backoff_json"] = backoff_json
    return insert._replace(**changes) if changes else insert


def settle(
    inserts: Sequence[JobInsert],
    settings: Mapping[str, TaskSettings],
    backoff_json: Callable[[TaskSettings], str | None],
) -> Sequence[JobInsert]:
    """Every insert with its task's settings applied (the same list if none apply).
    ``backoff_json(settings)`` is asked once per task."""
    if not settings:
        return inserts
    backoffs: dict[str, str | None] = {}
    out: list[JobInsert] = []
    for ins in inserts:
        found = settings.get(ins.task)
        if found is None or ins.explicit == EXPLICIT_ALL:
            out.append(ins)
            continue
        if ins.task not in backoffs:
            backoffs[ins.task] = backoff_json(found)
        out.append(apply_settings(ins, found, backoffs[ins.task]))
    return out


class SettingsCache:
    """Every task's settings, read at most once per ``ttl`` seconds: producers
    apply them to each job they send without a query per job."""

    def __init__(self, load: Callable[[], list[TaskSettings]], ttl: float = CACHE_S) -> None:
        self._load = load
        self._ttl = ttl
        self._lock = threading.Lock()
        self._until = 0.0
        self._settings: dict[str, TaskSettings] = {}

    def all(self) -> Mapping[str, TaskSettings]:
        if time.monotonic() < self._until:
            return self._settings
        with self._lock:
            if time.monotonic() >= self._until:
                self._settings = {s.task: s for s in self._load()}
                self._until = time.monotonic() + self._ttl
        return self._settings

    def invalidate(self) -> None:
        self._until = 0.0
