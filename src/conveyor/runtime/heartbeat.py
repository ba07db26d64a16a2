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
from collections.abc import Callable
from types import FrameType
from typing import Protocol

from ..backends.interfaces import Backend
from ..records import Heartbeat, WorkerInfo
from .service import ThreadService

log = logging.getLogger("conveyor.worker")

#: the loop is reported blocked after this long without a tick
BLOCKED_AFTER_S = 1.0


class HeartbeatClient(Protocol):
    def leases_snapshot(self) -> dict[int, str]: ...

    def on_beat(self, beat: Heartbeat, before: dict[int, str]) -> None: ...

    def on_silence(self, silent_s: float) -> None: ...

    def loop_tick(self) -> float: ...

    def blocking_jobs(self, frames: list[object]) -> str: ...


class HeartbeatService(ThreadService):
    name = "heartbeat"

    def __init__(
        self,
        backend: Backend,
        info: WorkerInfo,
        client: HeartbeatClient,
        *,
        interval: float,
        worker_ttl_s: float,
        loop_thread: Callable[[], int | None] = lambda: None,
    ) -> None:
        super().__init__(interval)
        self.backend = backend
        self.info = info
        self.client = client
        self.worker_ttl_s = worker_ttl_s
        self._loop_thread = loop_thread
        self.last_ok = time.monotonic()
        self._blocked_since: float | None = None
        self._silence_reported = False
        self._watch = threading.Thread(
            target=self._watch_loop, name="conveyor-loop-watch", daemon=True
        )

    def start(self) -> None:
        super().start()
        if not self._watch.is_alive():
            self._watch.start()

    def step(self) -> None:
        before = self.client.leases_snapshot()
        try:
            beat = self.backend.worker_heartbeat(worker=self.info)
        except Exception:
            silent = time.monotonic() - self.last_ok
            if silent > self.worker_ttl_s and not self._silence_reported:
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
        while not self.stopping:
            time.sleep(0.25)
            # A heartbeat stuck in a call that never returns (a network that drops
            # packets) counts as silence too.
            silent = time.monotonic() - self.last_ok
            if silent > self.worker_ttl_s and not self._silence_reported:
                self._silence_reported = True
                self.client.on_silence(silent)
            lag = time.monotonic() - self.client.loop_tick()
            if lag > BLOCKED_AFTER_S and self._blocked_since is None:
                self._blocked_since = time.monotonic() - lag
                log.warning(
                    "the event loop has been blocked for %.1fs: an async handler is running "
                    "blocking code (use a sync handler, or asyncio.to_thread); %s",
                    lag,
                    self._culprit(),
                )
            elif lag <= BLOCKED_AFTER_S and self._blocked_since is not None:
                log.warning(
                    "the event loop ran again after being blocked for %.1fs",
                    time.monotonic() - self._blocked_since,
                )
                self._blocked_since = None

    def _culprit(self) -> str:
        ident = self._loop_thread()
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
