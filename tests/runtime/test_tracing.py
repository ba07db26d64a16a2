"""OpenTelemetry: one span tree from a web request through send to the job's
execution; a retry starts a new trace linked back to the send."""

from __future__ import annotations

import pytest

# the dev extra installs the SDK: a missing one fails here, never skips
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from conveyor import Conveyor
from conveyor.observability.tracing import Tracing

from .helpers import Running, finished, wait_for


@pytest.fixture
def traced(db_url):
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = Conveyor(db_url, middleware=[Tracing(provider)])
    yield app, exporter, provider.get_tracer("web")
    app.close()


def test_a_web_request_send_and_execution_are_one_span_tree(traced):
    app, exporter, web = traced

    @app.task(queue="mail")
    def send_mail(to):
        return to

    with web.start_as_current_span("POST /signup", kind=SpanKind.SERVER) as request:
        job = send_mail.send("a@b.c")
    with Running(app, queues=["mail"]):
        wait_for(finished(app, job.id))
    wait_for(lambda: any(s.name == "process mail" for s in exporter.get_finished_spans()))
    spans = {s.name: s for s in exporter.get_finished_spans()}
    send, process = spans["send mail"], spans["process mail"]
    trace_id = request.get_span_context().trace_id
    assert send.context.trace_id == process.context.trace_id == trace_id
    assert send.parent.span_id == request.get_span_context().span_id
    assert process.parent.span_id == send.context.span_id
    assert process.kind == SpanKind.CONSUMER and send.kind == SpanKind.PRODUCER
    attrs = process.attributes
    assert attrs["messaging.system"] == "conveyor"
    assert attrs["messaging.destination.name"] == "mail"
    assert attrs["messaging.operation.type"] == "process"
    assert attrs["messaging.message.id"] == str(job.id)
    assert attrs["conveyor.job.attempt"] == 1


def test_a_retry_starts_a_new_trace_linked_to_the_send(traced):
    app, exporter, web = traced
    calls: list[int] = []

    @app.task(max_attempts=2, backoff={"base": 0.01, "jitter": 0})
    def flaky():
        calls.append(1)
        if len(calls) == 1:
            raise ValueError("first time")
        return "ok"

    with web.start_as_current_span("cron tick"):
        job = flaky.send()
    with Running(app):
        wait_for(finished(app, job.id))

    def processed() -> list:
        return [s for s in exporter.get_finished_spans() if s.name == "process default"]

    wait_for(lambda: len(processed()) == 2)
    send = next(s for s in exporter.get_finished_spans() if s.name == "send default")
    first, second = sorted(processed(), key=lambda s: s.start_time)
    assert first.context.trace_id == send.context.trace_id
    assert not first.status.is_ok and first.events[0].name == "exception"
    assert second.context.trace_id != send.context.trace_id  # a trace of its own
    assert second.parent is None
    assert [link.context.span_id for link in second.links] == [send.context.span_id]
    assert second.attributes["conveyor.job.attempt"] == 2


def test_without_an_active_span_nothing_is_added(traced):
    app, exporter, _ = traced

    @app.task
    def plain():
        return None

    job = plain.send()
    assert app.get_job(job.id).headers == {}
    assert exporter.get_finished_spans() == ()
