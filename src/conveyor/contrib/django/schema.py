"""Conveyor's own migrations, run by Django's ``migrate``."""

from __future__ import annotations

from typing import Any

from django.db import DEFAULT_DB_ALIAS


def migrate_database(alias: str) -> list[int]:
    """Apply Conveyor's pending migrations for every Conveyor task backend kept in
    the Django database ``alias`` (a backend with a URL of its own goes with the
    ``default`` database). Returns the versions applied."""
    from django.tasks import task_backends

    from .backend import ConveyorBackend

    applied: list[int] = []
    done: set[str] = set()
    for name in task_backends.settings:
        backend = task_backends[name]
        if not isinstance(backend, ConveyorBackend):
            continue
        target = backend.database or DEFAULT_DB_ALIAS
        if target != alias or backend.url in done:
            continue
        done.add(backend.url)
        applied += backend.app.migrate()
    return applied


def after_migrate(using: str = DEFAULT_DB_ALIAS, plan: Any = None, **kwargs: Any) -> None:
    """``post_migrate``: every ``manage.py migrate`` brings Conveyor's schema up to
    the installed package's, so an upgrade of Conveyor needs no new Django
    migration. ``flush`` sends the signal too, without a plan: nothing to do then."""
    if plan is not None:
        migrate_database(using)
