"""The Conveyor app of a Django task backend, for workers: ``manage.py
conveyor_worker`` runs ``conveyor worker --app conveyor.contrib.django.worker:ALIAS``,
and the child processes of ``--processes`` import the same. Importing this
module sets Django up (from ``DJANGO_SETTINGS_MODULE``) if it is not yet."""

from __future__ import annotations

from django.apps import apps
from django.utils.module_loading import autodiscover_modules, import_string

import django
from conveyor import ConfigError, Conveyor

if not apps.ready:
    django.setup()


def worker_app(alias: str) -> Conveyor:
    """Backend ``alias``'s app with every task a worker may run registered: each
    installed app's ``tasks`` module is imported, and the schedules of
    ``OPTIONS["PERIODIC"]`` are added."""
    from django.tasks import task_backends
    from django.tasks.exceptions import InvalidTaskBackend

    from .backend import ConveyorBackend
    from .checks import periodic_spec

    try:
        backend = task_backends[alias]
    except InvalidTaskBackend as exc:
        raise ConfigError(f"no task backend {alias!r} in TASKS: {exc}") from None
    if not isinstance(backend, ConveyorBackend):
        raise ConfigError(
            f"task backend {alias!r} is a {type(backend).__name__}, not "
            "conveyor.contrib.django.ConveyorBackend"
        )
    autodiscover_modules("tasks")
    app = backend.app
    for name, spec in (backend.options.get("PERIODIC") or {}).items():
        path, options = periodic_spec(name, spec)
        if options["name"] in app.periodics:
            continue
        handler = backend.register(import_string(path))
        app.periodic(**options)(handler)
    return app


def __getattr__(name: str) -> Conveyor:
    if name.startswith("__"):
        raise AttributeError(name)
    return worker_app(name)
