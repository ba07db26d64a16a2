"""System-check messages for a misconfigured Conveyor task backend (``manage.py check``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from django.apps import apps
from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from conveyor import ConfigError, Periodic

if TYPE_CHECKING:
    from .backend import ConveyorBackend

APP = "conveyor.contrib.django"
URL_SCHEMES = ("sqlite", "postgresql", "postgres", "mysql", "mariadb")


def backend_messages(backend: ConveyorBackend) -> Iterator[checks.CheckMessage]:
    where = f"TASKS[{backend.alias!r}]"
    from .backend import OPTION_KEYS

    unknown = sorted(set(backend.options) - set(OPTION_KEYS))
    if unknown:
        yield checks.Error(
            f"{where}['OPTIONS'] has unknown key(s) {unknown}",
            hint=f"the keys are {', '.join(OPTION_KEYS)}",
            id="conveyor.E001",
        )
    if "URL" in backend.options and "DATABASE" in backend.options:
        yield checks.Error(
            f"{where}['OPTIONS'] names both a DATABASE and a URL",
            hint="DATABASE joins a Django database (and its transactions); URL is a "
            "Conveyor database of its own: keep one",
            id="conveyor.E002",
        )
    yield from _database_messages(backend, where)
    yield from _periodic_messages(backend, where)
    if not apps.is_installed(APP):
        yield checks.Warning(
            f"{where} uses Conveyor but {APP!r} is not in INSTALLED_APPS",
            hint=f"add {APP!r}: `manage.py migrate` then creates Conveyor's tables and "
            "`manage.py conveyor_worker` runs the workers",
            id="conveyor.W001",
        )


def _database_messages(backend: ConveyorBackend, where: str) -> Iterator[checks.CheckMessage]:
    try:
        url = backend.url
    except ImproperlyConfigured as exc:
        yield checks.Error(f"{where}: {exc}", id="conveyor.E003")
        return
    if backend.database is None:
        if url.split(":", 1)[0].lower() not in URL_SCHEMES:
            yield checks.Error(
                f"{where}['OPTIONS']['URL'] is not a Conveyor database URL",
                hint="sqlite:///path/to/file.db, postgresql://user@host:5432/dbname or "
                "mysql://user:pass@host:3306/dbname",
                id="conveyor.E004",
            )
        return
    wrapper = connections[backend.database]
    if wrapper.vendor == "postgresql":
        from django.db.backends.postgresql.psycopg_any import is_psycopg3

        if not is_psycopg3:
            yield checks.Error(
                f"database {backend.database!r} runs on psycopg2: Conveyor joins Django's "
                "transactions through psycopg 3",
                hint="pip install 'psycopg[binary]' (Django prefers it when both are installed)",
                id="conveyor.E005",
            )
    if wrapper.vendor == "sqlite":
        mode = (wrapper.settings_dict.get("OPTIONS") or {}).get("transaction_mode")
        if str(mode).upper() != "IMMEDIATE":
            yield checks.Warning(
                f"database {backend.database!r} is SQLite without "
                "OPTIONS['transaction_mode'] = 'IMMEDIATE'",
                hint="a deferred transaction that reads, then writes while a worker commits "
                "fails at once with 'database is locked'; IMMEDIATE waits for its turn",
                id="conveyor.W002",
            )


def _periodic_messages(backend: ConveyorBackend, where: str) -> Iterator[checks.CheckMessage]:
    schedules: Any = backend.options.get("PERIODIC") or {}
    if not isinstance(schedules, dict):
        yield checks.Error(
            f"{where}['OPTIONS']['PERIODIC'] must be a dict of schedules by name",
            id="conveyor.E006",
        )
        return
    for name, spec in schedules.items():
        try:
            periodic_spec(name, spec)
        except (ConfigError, TypeError) as exc:
            yield checks.Error(
                f"{where}['OPTIONS']['PERIODIC'][{name!r}]: {exc}", id="conveyor.E006"
            )


def periodic_spec(name: str, spec: Any) -> tuple[str, dict[str, Any]]:
    """A schedule of ``OPTIONS["PERIODIC"]`` checked: (its task's path, the keyword
    arguments of ``Conveyor.periodic``). ``ConfigError`` says what is wrong."""
    if not isinstance(spec, dict) or not isinstance(spec.get("task"), str):
        raise ConfigError('a schedule is a dict with "task" (its import path) and "cron"')
    options = {k: v for k, v in spec.items() if k != "task"}
    options.setdefault("name", name)
    if "cron" not in options:
        raise ConfigError('a schedule needs "cron", e.g. "0 * * * *"')
    Periodic(task=spec["task"], **options)  # raises ConfigError on a bad schedule
    return spec["task"], options
