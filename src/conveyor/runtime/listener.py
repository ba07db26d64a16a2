"""Turns the database's hints into wake-ups: new work for the claim loop, finished
batch or chain jobs for the flow service, cancel and stop requests for the
heartbeat. A thread of its own; hints may be lost, so everything also polls."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable

from ..backends.interfaces import SENDER, Notifier, sent_by
from .service import Health

log = logging.getLogger("conveyor.worker")


class Listener:
    name = "listener"

    def __init__(
        self,
        notifier: Callable[[], Notifier],
        queues: Iterable[str],
        *,
        on_work: Callable[[], None],
        on_flow: Callable[[], None],
        on_cancel: Callable[[], None],
        me: str | None = None,
    ) -> None:
        self._make = notifier
        self._queues = set(queues)
        # hints from other workers' outcomes (sent_by); this worker's own are
        # skipped: it claims again after each write of its outcomes anyway
        self._from = tuple(q + SENDER for q in self._queues)
        self._mine = {sent_by(q, me) for q in self._queues} if me is not None else set()
        self._on_work = on_work
        self._on_flow = on_flow
        self._on_cancel = on_cancel
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._notifier: Notifier | None = None

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        notifier = self._notifier = self._make()
        self._thread = threading.Thread(
            target=self._run, args=(notifier,), name="conveyor-listen", daemon=True
        )
        self._thread.start()

    def _run(self, notifier: Notifier) -> None:
        while not self._stop.is_set():
            try:
                hints = notifier.wait(0.5)
            except Exception:
                self._stop.wait(0.5)
                continue
            if hints:
                self.dispatch(hints)

    def dispatch(self, hints: set[str]) -> None:
        """Wake whoever these hints concern (one pass of the listener's loop)."""
        anything = "*" in hints
        if anything or self._work(hints):
            self._on_work()
        if anything or "@flow" in hints:
            self._on_flow()
        if "@cancel" in hints:
            self._on_cancel()

    def pace(self, eager: bool) -> None:
        """Whether the claim loop waits for a hint now (see ``Notifier.pace``)."""
        notifier = self._notifier
        if notifier is not None:
            notifier.pace(eager)

    def _work(self, hints: set[str]) -> bool:
        if hints & self._queues:
            return True
        return any(h.startswith(self._from) for h in hints - self._mine)

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        notifier, self._notifier = self._notifier, None
        if notifier is not None:
            notifier.close()  # waits for the listener's current wait() to return
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join(timeout)

    def health(self) -> Health:
        alive = self._thread is not None and self._thread.is_alive()
        return Health(self.name, alive, None, None, 0)
