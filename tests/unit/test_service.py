"""ThreadService: a service woken far more often than it needs to run (the
aggregator, woken by every finished batch job or every SQLite commit) runs at
most once per ``min_gap``, and still runs soon after a wake-up."""

from __future__ import annotations

import threading
import time

from conveyor.runtime.flow_service import FLOW_MIN_GAP_S, FlowService
from conveyor.runtime.service import ThreadService


class Counting(ThreadService):
    name = "counting"

    def __init__(self, min_gap: float) -> None:
        super().__init__(60.0, min_gap=min_gap)
        self.steps = 0
        self.stepped = threading.Event()

    def step(self) -> None:
        self.steps += 1
        self.stepped.set()


def _woken_for(service: Counting, seconds: float) -> int:
    service.start()
    try:
        assert service.stepped.wait(5)  # the first pass, at start
        service.steps = 0
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            service.wake()
            time.sleep(0.0005)
        return service.steps
    finally:
        service.stop()


def test_a_min_gap_bounds_passes_however_often_it_is_woken():
    assert _woken_for(Counting(min_gap=0.1), 0.5) <= 7  # 0.5 s / 0.1 s, and slack
    assert _woken_for(Counting(min_gap=0.0), 0.5) > 20  # without it, a pass per wake-up


def test_a_woken_service_still_runs_at_once():
    service = Counting(min_gap=0.05)
    service.start()
    try:
        assert service.stepped.wait(5)
        time.sleep(0.1)  # past the gap: idle, waiting out its 60 s interval
        service.stepped.clear()
        service.wake()
        assert service.stepped.wait(1.0), "a wake-up after the gap waited for the interval"
    finally:
        service.stop()


def test_the_aggregator_has_a_gap():
    assert FlowService(backend=None, interval=1.0).min_gap == FLOW_MIN_GAP_S > 0  # type: ignore[arg-type]
