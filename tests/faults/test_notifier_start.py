"""A worker whose database goes away while it starts (a restart between its
first connection and its LISTEN one) keeps going: its notifier starts in the
state of a lost connection, polls, and listens once the server is back. Before,
the notifier's constructor raised and the worker process exited (seen in
tests/faults/test_restart.py when the restart met an idle worker still starting)."""

from __future__ import annotations

from conveyor.backends.postgres.backend import CHANNEL, PostgresBackend, PostgresNotifier

from ..backend.helpers import ins
from .conftest import wait_until


def test_a_notifier_made_while_the_server_is_down_listens_once_it_is_back(cluster):
    backend = PostgresBackend(cluster.url)
    backend.migrate()
    cluster.stop()
    notifier = PostgresNotifier(cluster.url, CHANNEL)  # no exception: the server is down
    try:
        assert notifier.wait(0.2) == set()
        cluster.start()
        back: list[set[str]] = []
        wait_until(lambda: back.append(notifier.wait(0.5)) or "*" in back[-1], 60, "LISTEN back")
        backend.job_insert_many(jobs=[ins(queue="mail")])
        heard: set[str] = set()
        wait_until(lambda: heard.update(notifier.wait(0.5)) or "mail" in heard, 30, "the hint")
    finally:
        notifier.close()
        backend.close()
