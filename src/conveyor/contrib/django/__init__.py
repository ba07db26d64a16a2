"""Conveyor as a backend of Django's tasks framework (``django.tasks``, Django 6.0+;
the Conveyor options of ``@task(...)`` need Django 6.1).

.. code-block:: python

    INSTALLED_APPS += ["conveyor.contrib.django"]
    TASKS = {"default": {"BACKEND": "conveyor.contrib.django.ConveyorBackend"}}

``python manage.py migrate`` creates Conveyor's tables in Django's ``default``
database and ``python manage.py conveyor_worker`` runs a worker. See the Django
guide (docs/guides/django.md) for the rest.

The names are imported on first use: Django imports this package while it reads
``INSTALLED_APPS``, before the tasks framework may be loaded.
"""

from __future__ import annotations

from typing import Any

__all__ = ["ConveyorBackend", "ConveyorTask", "periodic"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import backend

        return getattr(backend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
