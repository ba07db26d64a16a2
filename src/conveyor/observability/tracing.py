"""OpenTelemetry traces from enqueue to execution (``pip install conveyor[otel]``).

``app.add_middleware(Tracing())``: a job sent inside a span carries that span's
context (W3C ``traceparent`` in the job's headers, through a short ``send
{queue}`` producer span); the worker's ``process {queue}`` span is its child on
the first attempt, and each retry starts a trace of its own that links back, so
a job retried for a day is not one endless trace. Attribute names follow the
OpenTelemetry messaging semantic conventions. Without the package installed,
nothing of this is imported and nothing costs anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from opentelemetry import context, propagate, trace
from opentelemetry.trace import Link, SpanKind, Status, StatusCode

from ..encoding import with_headers
from ..hooks import CallNext, Middleware
from ..records import JobInsert, JobRecord

SYSTEM = "conveyor"


class Tracing(Middleware):
    def __init__(self, tracer_provider: trace.TracerProvider | None = None) -> None:
        self.tracer = trace.get_tracer("conveyor", tracer_provider=tracer_provider)

    def on_enqueue(self, jobs: list[JobInsert]) -> list[JobInsert]:
        if not jobs or not trace.get_current_span().get_span_context().is_valid:
            return jobs  # nothing to continue: no producer span, no headers
        queue = jobs[0].queue
        with self.tracer.start_as_current_span(
            f"send {queue}",
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.destination.name": queue,
                "messaging.operation.type": "send",
                "messaging.operation.name": "send",
                "messaging.batch.message_count": len(jobs),
            },
        ):
            carrier: dict[str, str] = {}
            propagate.inject(carrier)
        return [j._replace(args_json=with_headers(j.args_json, carrier)) for j in jobs]

    async def execute(self, job: JobRecord, call_next: CallNext) -> Any:
        sent = propagate.extract(job.headers) if job.headers else None
        sent_span = trace.get_current_span(sent).get_span_context() if sent else None
        first = job.attempts <= 1 and job.stage is None
        parent = sent if first and sent is not None else context.Context()
        links: Sequence[Link] = (
            [Link(sent_span)] if not first and sent_span is not None and sent_span.is_valid else []
        )
        with self.tracer.start_as_current_span(
            f"process {job.queue}",
            context=parent,
            kind=SpanKind.CONSUMER,
            links=links,
            attributes={
                "messaging.system": SYSTEM,
                "messaging.destination.name": job.queue,
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.message.id": str(job.id),
                "conveyor.task": job.task,
                "conveyor.job.attempt": job.attempts,
                **({"conveyor.job.stage": job.stage} if job.stage else {}),
            },
            record_exception=True,
            set_status_on_exception=True,
        ) as span:
            result = await call_next()
            span.set_status(Status(StatusCode.OK))
            return result
