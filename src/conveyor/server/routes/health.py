"""``/healthz``: the process answers. ``/readyz``: the database answers and its
schema is the one this code knows. Neither needs a token (probes have none)."""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from ...errors import ConveyorError
from .. import outage
from ..context import ServerContext
from ..dependencies import Ctx

if TYPE_CHECKING:
    from ...app import Conveyor

log = logging.getLogger("conveyor.server")


class Readiness:
    """The database's answer to ``/readyz``, within ``outage.READY_DEADLINE_S``
    whatever the database does. One check runs at a time, in a thread of its
    own, and the probes that come while it runs share its answer: a database
    that holds every check (a network dropping packets) holds one thread, not
    one per probe. Why it is not ready goes to the log, once per change."""

    def __init__(self, ctx: ServerContext) -> None:
        self.conveyor: Conveyor = ctx.conveyor
        self._check: asyncio.Future[tuple[int, int]] | None = None
        #: why it was not ready, as logged (None: ready)
        self._said: str | None = None

    async def versions(self) -> tuple[int, int]:
        """(the database's schema version, the newest this code knows); raises
        ``TimeoutError`` or the check's error."""
        if self._check is None or self._check.done():
            self._check = asyncio.ensure_future(asyncio.to_thread(self._versions))
            self._check.add_done_callback(self._note)
        try:
            return await asyncio.wait_for(asyncio.shield(self._check), outage.READY_DEADLINE_S)
        except TimeoutError:
            self._say(f"the database did not answer in {outage.READY_DEADLINE_S:g}s")
            raise

    def _versions(self) -> tuple[int, int]:
        with self.conveyor.serving.bounded_waits(outage.READY_WAIT_S):
            return self.conveyor.schema_version()

    def _note(self, check: asyncio.Future[tuple[int, int]]) -> None:
        failed = None if check.cancelled() else check.exception()  # (read: never "unretrieved")
        self._say(None if failed is None else str(failed) or type(failed).__name__)

    def _say(self, why: str | None) -> None:
        if (why is None) == (self._said is None):
            return  # no change (a new reason while not ready is in the requests' log)
        if why is None:
            log.info("ready: the database answers")
        else:
            log.warning("not ready: %s", why)
        self._said = why


router = APIRouter(tags=["health"])


@router.get("/healthz", summary="The process is up")
async def healthz() -> dict[str, Any]:
    return {"status": "ok"}


@router.get("/readyz", summary="The database answers and its schema is current")
async def readyz(ctx: Ctx) -> JSONResponse:
    try:
        version, latest = await ctx.part(Readiness).versions()
    except (ConveyorError, TimeoutError):  # why is in the log: this answer is anyone's
        headers = {"Retry-After": str(outage.RETRY_AFTER_S)}
        unavailable = {"status": "unavailable", "detail": outage.UNAVAILABLE}
        return JSONResponse(unavailable, status_code=503, headers=headers)
    body: dict[str, Any] = {
        "status": "ready",
        "schema_version": version,
        "latest_schema": latest,
    }
    if version != latest:
        body["status"] = "schema_outdated" if version < latest else "schema_newer"
        return JSONResponse(body, status_code=503)
    return JSONResponse(body)
