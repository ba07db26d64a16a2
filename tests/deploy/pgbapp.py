"""The app of the PgBouncer deployment test, loaded by `conveyor worker` and
`conveyor server` subprocesses (``--app tests.deploy.pgbapp:app``). Each run of a
handler appends ``<job id> <pid> <unix time at start>`` to $EFFECTS_FILE (O_APPEND,
one short write: lines from concurrent processes never interleave), so the test
counts how often each job ran and when it started."""

from __future__ import annotations

import os
import time

from conveyor import Conveyor, current_job


def record() -> None:
    line = f"{current_job().id} {os.getpid()} {time.time():.6f}\n".encode()
    fd = os.open(os.environ["EFFECTS_FILE"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def register(app: Conveyor) -> Conveyor:
    """The same tasks on any app: the test's producer sends what the workers run."""

    @app.task
    def plain(i: int) -> int:
        record()
        return i

    # Claimed by the limited claim (its key's limit), not the fast path.
    @app.task(queue="keyed", concurrency_key=lambda i: f"k{i % 8}", concurrency_limit=2)
    def keyed(i: int) -> int:
        record()
        return i

    # Run by the worker that listens on a direct session (listen_url).
    @app.task(queue="listened")
    def heard(i: int) -> int:
        record()
        return i

    return app


#: URL from CONVEYOR_DATABASE_URL; the test passes -d, which overrides it.
app = register(Conveyor())
