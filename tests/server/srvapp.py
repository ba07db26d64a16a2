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


# -- workflows (tests/server/test_workflows_api.py, the dashboard's workflow page) --------
@app.task
def pages(n: int) -> list[int]:
    return list(range(1, n + 1))


@app.task
def double(x: int) -> int:
    return 2 * x


@app.task
def total(parts: list) -> int:
    """The sum of every number in its parents' results (lists of numbers too)."""
    flat = [y for p in parts for y in (p if isinstance(p, list) else [p])]
    return sum(y for y in flat if isinstance(y, int))


@app.task(max_attempts=1)
def gate(value: object, flag: str) -> object:
    """Fails until the file ``flag`` exists; then passes its parent's result on."""
    import os

    if not os.path.exists(flag):
        raise RuntimeError(f"{flag} is missing")
    return value


@app.task
def hold(value: object, flag: str) -> object:
    """Runs until the file ``flag`` exists (a workflow caught running)."""
    import os
    import time

    while not os.path.exists(flag):
        time.sleep(0.05)
    return value


@app.task
def echo(value: object) -> object:
    return value


@app.task
def hold_over(x: int, limit: int, flag: str) -> int:
    """Returns ``x`` at once up to ``limit``; past it, once the file ``flag`` exists."""
    import os
    import time

    while x > limit and not os.path.exists(flag):
        time.sleep(0.05)
    return x


@app.task(max_attempts=1)
def picky(x: int) -> int:
    if x == 3:
        raise ValueError("3 is not allowed")
    return x
