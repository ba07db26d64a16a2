"""Django's task signals, recorded as Event rows (in the worker: through the ORM,
from the worker's threads)."""

from django.dispatch import receiver
from django.tasks.signals import task_enqueued, task_finished, task_started

from .models import Event


def _record(kind: str, task_result) -> None:
    Event.objects.create(
        kind=kind,
        task=task_result.task.name,
        result_id=task_result.id,
        status=task_result.status,
        detail=f"attempts={task_result.attempts} errors={len(task_result.errors)}",
    )


@receiver(task_enqueued)
def enqueued(sender, task_result, **kwargs) -> None:
    _record("enqueued", task_result)


@receiver(task_started)
def started(sender, task_result, **kwargs) -> None:
    _record("started", task_result)


@receiver(task_finished)
def finished(sender, task_result, **kwargs) -> None:
    _record("finished", task_result)
