"""Long-running parts with one lifecycle: start, stop, health.

Most of a worker's services are a step function run every so often on a thread
of their own (:class:`ThreadService`): they call the synchronous backend
directly, so nothing they do depends on the event loop the handlers run on (a
handler that blocks the loop cannot starve a heartbeat). A worker is a set of
services (:class:`Services`); a server process can run the maintenance
services without claiming a job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from ..backends.interfaces import WorkerStore

log = logging.getLogger("conveyor.service")


@dataclass(frozen=True)
class Health:
    name: str
    running: bool
    #: time.time() of the last step that succeeded, and of the last failure
    last_ok: float | None
    last_error: str | None
    failures: int

    @property
    def ok(self) -> bool:
        return self.running and self.failures == 0


class Service(Protocol):
    name: str

    def start(self) -> None: ...

    def stop(self, timeout: float = 5.0) -> None: ...

    def health(self) -> Health: ...


class ThreadService:
    """Runs ``step()`` every ``interval`` seconds on a daemon thread, sooner when
    woken. A failing step is logged (once per streak, then every minute) and
    retried at the next interval; it never ends the service."""

    name = "service"

    def __init__(self, interval: float, *, min_gap: float = 0.0) -> None:
        self.interval = interval
        #: the shortest time between two passes, however often the service is woken
        self.min_gap = min_gap
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_ok: float | None = None
        self._last_error: str | None = None
        self._failures = 0
        self._logged_at = 0.0

    def step(self) -> object:
        """One pass; what it returns is for tests that step it."""
        raise NotImplementedError

    def next_wait(self) -> float:
        """Seconds until the next step (a subclass may vary it)."""
        return self.interval

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name=f"conveyor-{self.name}", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        self._wake.set()

    def stop(self, timeout: float = 5.0) -> None:
        if self._thread is None:
            return
        self._stopping.set()
        self._wake.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            log.warning("%s did not stop within %gs (a database call is slow)", self.name, timeout)
        self._thread = None

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def wait_stop(self, seconds: float) -> bool:
        """Wait ``seconds``, or less if the service is stopped; True if it is stopping."""
        return self._stopping.wait(seconds)

    def _run(self) -> None:
        while not self._stopping.is_set():
            self._wake.clear()
            self.run_once()
            if self.min_gap > 0 and self._stopping.wait(self.min_gap):
                break
            self._wake.wait(self.next_wait())

    def run_once(self) -> bool:
        """One step, with its failure recorded and logged; True if it succeeded."""
        try:
            self.step()
        except Exception as exc:
            self._failures += 1
            self._last_error = f"{type(exc).__name__}: {exc}"
            now = time.monotonic()
            if self._failures == 1 or now - self._logged_at > 60:
                self._logged_at = now
                log.error("%s failed (retrying every %gs): %s", self.name, self.interval, exc)
            return False
        if self._failures:
            log.info("%s works again after %d failure(s)", self.name, self._failures)
        self._failures = 0
        self._last_ok = time.time()
        return True

    def health(self) -> Health:
        return Health(
            self.name,
            self._thread is not None and self._thread.is_alive(),
            self._last_ok,
            self._last_error,
            self._failures,
        )


class Services:
    """Start in order, stop in reverse order."""

    def __init__(self, services: Iterable[Service] = ()) -> None:
        self.services: list[Service] = list(services)

    def add(self, service: Service) -> None:
        self.services.append(service)

    def start(self) -> None:
        for s in self.services:
            s.start()

    def stop(self, timeout: float = 5.0) -> None:
        for s in reversed(self.services):
            s.stop(timeout)

    def health(self) -> list[Health]:
        return [s.health() for s in self.services]


#: A call to the database that took this long waited for it (a connection
#: through an outage): the process was out of touch until it returned.
SLOW_CONTACT_S = 1.0


class Leadership(ThreadService):
    """One lease in the database, ``"leader"``: the holder runs the cluster-wide
    services (maintenance, batches and chains); when it dies its lease expires and
    another process takes over. Every candidate asks every ``ttl/5`` seconds, so a
    takeover happens at most ``ttl + ttl/5`` after the holder went silent."""

    name = "leader-election"

    def __init__(
        self,
        backend: WorkerStore,
        holder: str,
        *,
        ttl_s: float = 5.0,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        super().__init__(ttl_s / 5)
        self.backend = backend
        self.holder = holder
        self.ttl_s = ttl_s
        self.is_leader = False
        self._on_change = on_change
        #: ``time.monotonic()`` when this process was last out of touch with the
        #: database: an election that failed, or that waited for it (a pool waits
        #: for a connection through an outage)
        self.lost_at: float | None = None

    def step(self, now: datetime | None = None) -> None:
        was = self.is_leader
        began = time.monotonic()
        try:
            self.is_leader = self.backend.leader_attempt_elect(
                name="leader", holder=self.holder, ttl_s=self.ttl_s, now=now
            )
        except Exception:
            self.is_leader = False  # cannot renew: assume another may take over
            self.lost_at = time.monotonic()
            raise
        else:
            if time.monotonic() - began > SLOW_CONTACT_S:
                self.lost_at = time.monotonic()
        finally:
            if self.is_leader != was:
                if self.is_leader:
                    what = "maintenance, batches, chains, workflows"
                    log.info("%s is now the leader (%s)", self.holder, what)
                if self._on_change is not None:
                    self._on_change(self.is_leader)

    def stop(self, timeout: float = 5.0) -> None:
        super().stop(timeout)
        if self.is_leader:
            try:  # hand over now rather than when the lease expires
                self.backend.leader_resign(name="leader", holder=self.holder)
            except Exception as exc:
                log.warning("could not resign leadership: %s", exc)
            self.is_leader = False
