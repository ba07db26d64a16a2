"""Run a real worker in a thread until a condition holds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from conveyor import Conveyor
from conveyor.runtime.worker import Worker, WorkerStats


class Running:
    def __init__(self, app: Conveyor, **options) -> None:
        options.setdefault("queues", ["default"])
        options.setdefault("poll_s", 0.1)
        self.worker = Worker(app, **options)
        self.stats: WorkerStats | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        try:
            self.stats = self.worker.run(install_signals=False)
        except BaseException as exc:
            self.error = exc

    def __enter__(self) -> Running:
        self.thread.start()
        return self

    def stop(self, timeout: float = 30) -> WorkerStats:
        self.worker.stop()
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "worker did not stop"
        if self.error:
            raise self.error
        assert self.stats is not None
        return self.stats

    def __exit__(self, *exc: object) -> None:
        if self.thread.is_alive():
            self.stop()


def wait_for(predicate: Callable[[], object], timeout: float = 20, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def finished(app: Conveyor, *job_ids: int) -> Callable[[], bool]:
    return lambda: all(app.get_job(i).state.finished for i in job_ids)
