"""Periodic (cron) tasks: which ticks of a schedule are due, and the key naming each.

Pure: nothing here touches the database. ``runtime.cron_service`` turns the due
ticks into jobs, one per tick, under the idempotency key ``tick_key`` names, so
any number of workers may compute and insert the same tick and the unique index
keeps exactly one job.

Schedules are read by croniter in the periodic's time zone (``zoneinfo``), so
"every day at 02:30 Europe/Paris" follows the wall clock across DST changes:

- spring forward: a tick in the hour that does not exist runs at the first
  minute that does (``30 2 * * *`` runs at 03:00 that day);
- fall back: a schedule whose minute or hour field is a wildcard (``*/15 * * * *``,
  ``0 * * * *``) keeps its pace through the repeated hour, while a fixed-time
  schedule (``30 2 * * *``) runs once, at the first 02:30, not again an hour later.
  This is the rule of Vixie cron.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from .errors import ConfigError

if TYPE_CHECKING:
    from .task import Task

#: most ticks one ``due_ticks`` call returns (and the largest ``catch_up``)
MAX_TICKS = 1000
POLICIES = ("skip", "catch_up")


@dataclass(frozen=True)
class Periodic:
    """A task run on a cron schedule.

    ``cron``: 5 fields (minute hour day-of-month month day-of-week), or 6 with
    seconds as the last field (``*/10 * * * * *``: every 10 s), or an alias such
    as ``@hourly``. ``timezone``: an IANA name the schedule is read in.

    Ticks missed while no worker ran: ``missed="skip"`` (default) enqueues a tick
    only while it is at most ``grace_s`` old (every such tick, so a short restart
    loses nothing); ``catch_up=N`` (implies ``missed="catch_up"``) enqueues the N
    most recent ticks however old, each at most once.
    """

    task: Task | str
    cron: str
    timezone: str = "UTC"
    args: Sequence[Any] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    missed: str = "skip"
    catch_up: int | None = None
    grace_s: float = 60.0
    name: str = ""
    zone: ZoneInfo = field(init=False, repr=False, compare=False)
    #: minute or hour field is a wildcard: runs at its pace through a repeated hour
    wild: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        task_name = self.task if isinstance(self.task, str) else self.task.name
        name = self.name or task_name
        if not isinstance(name, str) or not name:
            raise ConfigError(f"a periodic task needs a non-empty name, got {name!r}")
        set_ = object.__setattr__
        set_(self, "name", name)
        set_(self, "zone", _zone(self.timezone, name))
        set_(self, "wild", _check_cron(self.cron, name, self.zone))
        if not isinstance(self.args, list | tuple):
            raise ConfigError(f"periodic {name!r}: args must be a tuple, got {self.args!r}")
        set_(self, "args", tuple(self.args))
        if self.kwargs is None:
            set_(self, "kwargs", {})
        if not isinstance(self.kwargs, Mapping):
            raise ConfigError(f"periodic {name!r}: kwargs must be a dict, got {self.kwargs!r}")
        set_(self, "kwargs", dict(self.kwargs))
        missed = self.missed
        if self.catch_up is not None and missed == "skip":
            missed = "catch_up"  # catch_up=N says it all
            set_(self, "missed", missed)
        if missed not in POLICIES:
            raise ConfigError(
                f"periodic {name!r}: missed must be 'skip' (with grace_s) or 'catch_up' "
                f"(with catch_up=N), got {missed!r}"
            )
        if missed == "catch_up" and (
            not isinstance(self.catch_up, int)
            or isinstance(self.catch_up, bool)
            or not 1 <= self.catch_up <= MAX_TICKS
        ):
            raise ConfigError(
                f"periodic {name!r}: catch_up must be a number of ticks from 1 to {MAX_TICKS}, "
                f"got {self.catch_up!r}"
            )
        if (
            not isinstance(self.grace_s, int | float)
            or isinstance(self.grace_s, bool)
            or not self.grace_s > 0
        ):
            raise ConfigError(
                f"periodic {name!r}: grace_s must be a positive number of seconds, "
                f"got {self.grace_s!r}"
            )

    @property
    def task_name(self) -> str:
        return self.task if isinstance(self.task, str) else self.task.name


def _zone(name: object, periodic: str) -> ZoneInfo:
    hint = (
        "use an IANA time zone name such as 'UTC' or 'Europe/Paris' (and install the "
        "tzdata package if this machine has no time zone database)"
    )
    if not isinstance(name, str) or not name:
        raise ConfigError(f"periodic {periodic!r}: bad timezone {name!r}: {hint}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigError(f"periodic {periodic!r}: unknown timezone {name!r}: {hint}") from exc


def _check_cron(expr: object, periodic: str, zone: ZoneInfo) -> bool:
    """Validate a cron expression; return whether it is "wild" (see ``Periodic.wild``)."""
    hint = (
        "use 5 fields 'minute hour day-of-month month day-of-week' (e.g. '*/5 * * * *'), "
        "6 with seconds last (e.g. '*/10 * * * * *'), or an alias such as '@hourly'"
    )
    if not isinstance(expr, str) or not expr.strip():
        raise ConfigError(f"periodic {periodic!r}: bad cron expression {expr!r}: {hint}")
    # imported where used: an app without periodics (and its workers) starts without it
    from croniter import CroniterBadDateError, CroniterError, croniter

    try:
        croniter(expr, datetime.now(zone)).get_next(datetime)
    except CroniterBadDateError as exc:
        raise ConfigError(
            f"periodic {periodic!r}: cron expression {expr!r} never fires ({exc}); "
            "check the day-of-month and month fields"
        ) from exc
    except (CroniterError, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(
            f"periodic {periodic!r}: bad cron expression {expr!r} ({exc}); {hint}"
        ) from exc
    text = expr.strip().lower()
    if text.startswith("@"):
        return text == "@hourly"
    minute, hour = text.split()[:2]
    return minute.startswith("*") or hour.startswith("*")


def tick_key(periodic: Periodic, tick: datetime) -> str:
    """The idempotency key of one tick: the same on every worker, in UTC so the two
    02:30s of a fall-back night are two keys."""
    return f"conveyor:cron:{periodic.name}:{tick.astimezone(UTC).isoformat()}"


def due_ticks(
    periodic: Periodic, now: datetime, *, max_age_s: float | None = None
) -> list[datetime]:
    """The ticks to enqueue at ``now`` (UTC datetimes, oldest first).

    ``skip``: every tick at most ``grace_s`` old. ``catch_up=N``: the N most recent
    ticks. Never more than ``MAX_TICKS``, never a tick after ``now``, never one older
    than ``max_age_s`` (the caller's guard: a tick whose job may have been deleted
    must not be enqueued again). A naive ``now`` is taken as UTC.
    """
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    now = now.astimezone(UTC)
    oldest: datetime | None = None
    if periodic.missed == "catch_up":
        want = periodic.catch_up or 1
    else:
        want = MAX_TICKS
        oldest = now - timedelta(seconds=periodic.grace_s)
    if max_age_s is not None:
        horizon = now - timedelta(seconds=max_age_s)
        oldest = horizon if oldest is None else max(oldest, horizon)
    ticks: list[datetime] = []
    for tick in _ticks_back(periodic, now):
        if oldest is not None and tick < oldest:
            break
        ticks.append(tick)
        if len(ticks) >= want:
            break
    ticks.reverse()
    return ticks


def _ticks_back(periodic: Periodic, now: datetime) -> Iterator[datetime]:
    """The schedule's ticks at or before ``now``, newest first, in UTC."""
    from croniter import CroniterBadDateError, croniter

    it = croniter(periodic.cron, now.astimezone(periodic.zone))
    try:
        prev = it.get_prev(datetime)  # strictly before now
        at_now = it.get_next(datetime, update_current=False)
        if at_now <= now:
            yield from _keep(periodic, at_now)
        while True:
            yield from _keep(periodic, prev)
            prev = it.get_prev(datetime)
    except CroniterBadDateError:  # no earlier tick within croniter's search range
        return


def _keep(periodic: Periodic, tick: datetime) -> Iterator[datetime]:
    utc = tick.astimezone(UTC)
    # via UTC: croniter may hand back fold=1 on a time that is not ambiguous
    if utc.astimezone(periodic.zone).fold and not periodic.wild:
        return  # a fixed-time schedule ran at the first occurrence of this wall time
    yield utc
