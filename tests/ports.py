"""Loopback ports for the servers, clusters and metrics endpoints the tests start.

Each test process (pytest-xdist worker) picks from a range of its own below the
kernel's ephemeral ports (32768 and up), so two processes never pick the same
port, and neither picks one the kernel is about to hand an outgoing connection.
A port found free here is free when the test's server binds it moments later,
unless something outside the suite takes it meanwhile."""

from __future__ import annotations

import os
import random
import socket

_SPAN = 2500


def _base() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")  # "gw0", "gw1", ...
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    return 20000 + (index % 5) * _SPAN


def free_port() -> int:
    base = _base()
    for _ in range(200):
        port = random.randrange(base, base + _SPAN)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use, or still in TIME_WAIT: another
            return port
    raise RuntimeError(f"no free loopback port in {base}-{base + _SPAN - 1}")
