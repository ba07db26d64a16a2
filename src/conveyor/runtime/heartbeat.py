"""The worker's heartbeat: one row written every ``heartbeat_s``, on a thread of
its own, so no handler (not even one that blocks the event loop) can starve it.

Each beat reports what the worker holds in the database; the worker compares it
with what it runs. The heartbeat thread also watches the event loop: a loop
that has not ticked for a second is reported, once per episode, with the
handler on its stack.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import traceback
from datetime import datetime
from types import FrameType
from typing import Protocol

from ..backends.interfaces import WorkerStore
from ..records import Heartbeat, WorkerInfo
from .service import ThreadService

log = logging.getLogger("conveyor.worker")

#: the loop is reported blocked after this long without a tick
BLOCKED_AFTER_S = 1.0
#: how often the watchdog looks at the heartbeat and the event loop
WATCH_EVERY_S = 0.25
#: A worker whose heartbeat has failed this many ttls stops its jobs (they have
#: run elsewhere since). Not after one: the leader judges a worker only once it
#: has been in touch with the database for a ttl itself, so when the database
#: was out of reach for everybody (a restart, a failover: the common silence),
#: a worker that stopped its jobs after one ttl gave back work nobody took.
#: A heartbeat that gets through sooner says which jobs ran elsewhere, and the
#: worker stops those alone.
FENCE_AFTER_TTLS = 2


class HeartbeatClient(Protocol):
    """What the heartbeat needs of the worker it keeps alive (``Worker`` is one).
    Called on the heartbeat's threads, never on the worker's event loop."""

    def leases_snapshot(self) -> dict[int, str]:
        """The jobs the worker holds (id -> lease token), taken before a beat."""

    def on_beat(self, beat: Heartbeat, before: dict[int, str]) -> None:
        """A beat reached the database: what it holds there, against ``before``."""

    def on_silence(self, silent_s: float) -> None:
        """No beat reached the database for ``FENCE_AFTER_TTLS`` times the
        worker's ttl."""

    def loop_tick(self) -> float:
        """``time.monotonic()`` of the event loop's last tick."""

    def loop_thread(self) -> int | None:
        """The ident of the thread running the event loop (``None``: not running)."""

    def blocking_jobs(self, frames: list[object]) -> str:
        """Which running jobs are on these frames (the blocked loop's stack)."""


class HeartbeatService(ThreadService):
    name = "heartbeat"

    def __init__(
        self,
        backend: WorkerStore,
        info: WorkerInfo,
        client: HeartbeatClient,
        *,
        interval: float,
        worker_ttl_s: float,
    ) -> None:
        super().__init__(interval)
        self.backend = backend
        self.info = info
        self.client = client
        self.worker_ttl_s = worker_ttl_s
        #: silence past this stops the worker's jobs (on_silence)
        self.fence_after_s = FENCE_AFTER_TTLS * worker_ttl_s
        self.last_ok = time.monotonic()
        self._blocked_since: float | None = None
        self._silence_reported = False
        self._watch: threading.Thread | None = None

    def start(self) -> None:
        super().start()
        if self._watch is None:
            self._watch = threading.Thread(
                target=self._watch_loop, name="conveyor-loop-watch", daemon=True
            )
            self._watch.start()

    def stop(self, timeout: float = 5.0) -> None:
        super().stop(timeout)
        watch, self._watch = self._watch, None
        if watch is not None:
            watch.join(timeout)

    def step(self, now: datetime | None = None) -> None:
        before = self.client.leases_snapshot()
        try:
            beat = self.backend.worker_heartbeat(worker=self.info, now=now)
        except Exception:
            silent = time.monotonic() - self.last_ok
            if silent > self.fence_after_s and not self._silence_reported:
                self._silence_reported = True
                self.client.on_silence(silent)
            raise
        self.last_ok = time.monotonic()
        if self._silence_reported:
            log.warning("heartbeats reach the database again")
            self._silence_reported = False
        self.client.on_beat(beat, before)

    # -- the event loop watchdog ----------------------------------------------------------
    def _watch_loop(self) -> None:
        while not self.wait_stop(WATCH_EVERY_S):
            self.watch(time.monotonic())

    def watch(self, clock: float) -> None:
        """One look of the watchdog, at ``clock`` (``time.monotonic()``): silence
        reported once, a blocked event loop reported once per episode."""
        # A heartbeat stuck in a call that never returns (a network that drops
        # packets) counts as silence too.
        silent = clock - self.last_ok
        if silent > self.fence_after_s and not self._silence_reported:
            self._silence_reported = True
            self.client.on_silence(silent)
        lag = clock - self.client.loop_tick()
        if lag > BLOCKED_AFTER_S and self._blocked_since is None:
            self._blocked_since = clock - lag
            log.warning(
                "the event loop has been blocked for %.1fs: an async handler is running "
                "blocking code (use a sync handler, or asyncio.to_thread); %s",
                lag,
                self._culprit(),
            )
        elif lag <= BLOCKED_AFTER_S and self._blocked_since is not None:
            log.warning(
                "the event loop ran again after being blocked for %.1fs",
                clock - self._blocked_since,
            )
            self._blocked_since = None

    def _culprit(self) -> str:
        ident = self.client.loop_thread()
        frame = sys._current_frames().get(ident) if ident is not None else None
        if frame is None:
            return "its stack is not available"
        frames: list[object] = []
        f: FrameType | None = frame
        while f is not None:
            frames.append(f)
            f = f.f_back
        stack = "".join(traceback.format_stack(frame, limit=6)).rstrip()
        return f"{self.client.blocking_jobs(frames)}; the loop is at:\n{stack}"
