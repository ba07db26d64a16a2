"""The cluster-wide services, for any process: leader election, and, on the
leader, maintenance (rescue, scheduling, aging, retention) and the flow service
(batches, chains); cron in every process. A worker runs them beside its claim
loop; a server process can run them without claiming a single job."""

from __future__ import annotations

import os
import socket
import uuid
from dataclasses import dataclass
from typing import Protocol

from ..backends.interfaces import Backend
from .cron_service import CronHost, CronService
from .flow_service import FlowService
from .maintenance import Maintenance
from .service import Leadership, Services


class ClusterHost(CronHost, Protocol):
    """What the cluster services read of the app (``Conveyor`` is one): the
    database, whose narrow stores each service is handed here, maintenance's
    settings, and what the cron service reads."""

    @property
    def backend(self) -> Backend: ...

    @property
    def priority_aging_s(self) -> float | None: ...

    @property
    def priority_max_boost(self) -> int: ...

    @property
    def vacuum_dead_rows(self) -> int | None: ...


@dataclass
class ClusterServices:
    services: Services
    leader: Leadership
    flow: FlowService


def cluster_services(
    app: ClusterHost,
    holder: str | None = None,
    *,
    leader_ttl_s: float = 5.0,
    maintenance_s: float = 1.0,
    worker_ttl_s: float = 7.0,
    flow_poll_s: float = 1.0,
) -> ClusterServices:
    """The services, not started (``.services.start()``)."""
    backend = app.backend
    holder = holder or f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
    leader = Leadership(backend, holder, ttl_s=leader_ttl_s)
    flow = FlowService(backend, is_leader=lambda: leader.is_leader, interval=flow_poll_s)
    services = Services(
        [
            leader,
            Maintenance(
                backend,
                is_leader=lambda: leader.is_leader,
                lost_at=lambda: leader.lost_at,
                interval=maintenance_s,
                worker_ttl_s=worker_ttl_s,
                stale_worker_s=max(300.0, 10 * worker_ttl_s),
                aging_s=app.priority_aging_s,
                max_boost=app.priority_max_boost,
                retention=app.retention,
                tidy_min_dead=app.vacuum_dead_rows,
            ),
            flow,
        ]
    )
    if app.periodics:
        services.add(CronService(app))
    return ClusterServices(services, leader, flow)
