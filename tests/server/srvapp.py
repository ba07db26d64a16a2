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


@app.task(queue="accounts", sensitive=("password",))
def sign_up(user: str, password: str) -> str:
    return f"welcome {user}"


@app.task(max_attempts=1)
def fragile(flag: str) -> str:
    """Fails until the file ``flag`` exists (the dashboard tests retry it then)."""
    import os

    if not os.path.exists(flag):
        raise RuntimeError(f"{flag} is missing")
    return "fixed"
