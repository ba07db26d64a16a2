"""The Django app: its migration creates Conveyor's tables, its command runs workers."""

from __future__ import annotations

from django.apps import AppConfig
from django.db.models.signals import post_migrate


class ConveyorConfig(AppConfig):
    name = "conveyor.contrib.django"
    label = "conveyor"
    verbose_name = "Conveyor"

    def ready(self) -> None:
        from .schema import after_migrate

        post_migrate.connect(after_migrate, sender=self, dispatch_uid="conveyor.after_migrate")
