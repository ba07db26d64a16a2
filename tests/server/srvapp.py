"""The app ``conveyor server --app tests.server.srvapp:app`` serves in the server
tests: a few registered tasks (the server checks their arguments); any other
task name is served by remote workers."""

from __future__ import annotations

from conveyor import Backoff, Conveyor

app = Conveyor()  # the URL comes from -d


@app.task(max_attempts=4, timeout=60, backoff=Backoff(base=0.0, jitter=0.0))
def add(a: int, b: int) -> int:
    return a + b


@app.task(queue="emails")
def send_email(to: str) -> str:
    return f"sent to {to}"


@app.task
def summarise(batch_id: int, counts: dict) -> None:
    return None
