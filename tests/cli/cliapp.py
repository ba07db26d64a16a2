"""A small app for the CLI tests: loaded with ``--app tests.cli.cliapp:app`` in process
and by `conveyor worker` subprocesses (with the repository root on PYTHONPATH)."""

from __future__ import annotations

import time

from conveyor import Backoff, Conveyor, NextStage, Permanent, current_job


def register(app: Conveyor) -> Conveyor:
    """The same tasks on any app, so a test's producer app can send what the
    worker's app runs."""

    @app.task
    def add(a: int, b: int) -> int:
        return a + b

    @app.task(queue="slow")
    def sleepy(seconds: float) -> str:
        time.sleep(seconds)
        return "woke up"

    @app.task
    def boom() -> None:
        raise Permanent("boom: bad input")

    @app.task(max_attempts=2, backoff=Backoff(base=0.0, jitter=0.0))
    def always_fails() -> None:
        raise RuntimeError("still broken")

    @app.task
    def staged(n: int) -> int:
        # Two stages: the first hands its context on to the second.
        job = current_job()
        if job.stage is None:
            return NextStage("second", context={"n": n})
        return job.context["n"] * 10

    @app.task
    def summarise(batch_id: int, counts: dict[str, int]) -> str:
        # A batch's on_complete.
        return f"batch {batch_id}: {sorted(counts.items())}"

    return app


#: URL from CONVEYOR_DATABASE_URL; the tests pass -d, which overrides it.
app = register(Conveyor())
