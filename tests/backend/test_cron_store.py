"""CronStore: when each periodic schedule was first seen, shared by every worker."""

from __future__ import annotations

from .helpers import later


def test_first_seen_is_recorded_once_and_shared(backend):
    t0 = later(0)
    first = backend.cron_first_seen(names=["a", "b"], now=t0)
    assert set(first) == {"a", "b"}
    assert abs((first["a"] - t0).total_seconds()) < 0.01
    again = backend.cron_first_seen(names=["a", "c"], now=later(60))
    assert again["a"] == first["a"]  # the first sighting stands
    assert (again["c"] - t0).total_seconds() > 59
