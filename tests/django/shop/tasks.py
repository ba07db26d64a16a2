"""The test project's tasks."""

import os
import time
from pathlib import Path

from django.tasks import task

from conveyor.contrib.django import periodic

from .models import Event, Order


class Flaky(Exception):
    """Raised by flaky() until its attempt comes."""


@task
def add(a: int, b: int) -> int:
    return a + b


@task
async def async_add(a: int, b: int) -> int:
    return a + b


@task
def record(label: str) -> str:
    """Writes an Event through the ORM from the worker, stamped with its time."""
    Event.objects.create(kind="ran", detail=label)
    return label


@task(
    queue_name="emails",
    max_attempts=2,
    timeout=30,
    backoff={"base": 0.1, "cap": 0.1},
    unique_key=lambda order_id: f"receipt-{order_id}",
    concurrency_key="order_id",
    concurrency_limit=1,
)
def send_receipt(order_id: int) -> str:
    order = Order.objects.get(pk=order_id)
    return f"sent to {order.email}"


@task(takes_context=True, max_attempts=3, backoff={"base": 0.1, "cap": 0.1})
def flaky(context, fails: int) -> int:
    """Fails its first ``fails`` attempts, then returns the attempt number."""
    if context.attempt <= fails:
        raise Flaky(f"attempt {context.attempt} fails")
    return context.attempt


@task(takes_context=True, max_attempts=3, queue_name="slow")
def slow_first(context, marker: str) -> int:
    """Its first attempt writes ``marker`` (with its pid) and sleeps for good."""
    if context.attempt == 1:
        Path(marker).write_text(str(os.getpid()))
        time.sleep(600)
    return context.attempt


@task(queue_name="cron")
def report() -> None:
    Event.objects.create(kind="tick", detail="report")


@periodic("*/1 * * * * *", name="every-second")
@task(queue_name="cron")
def heartbeat() -> None:
    Event.objects.create(kind="tick", detail="heartbeat")
