"""``POST /v1/events``: emit an event that durable waits wake on
(``current_job().wait_for_event(key)``). ``GET /v1/events`` is the change
stream (routes/events.py): the same path, another method."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Response
from pydantic import Field, StringConstraints

from ...durable import MAX_KEY
from ..auth import PRODUCER, requires
from ..dependencies import Facade
from ..models import Key, Strict

#: a key as durable's wait_for_event takes it: printable, as every REST key
EventKey = Annotated[Key, StringConstraints(max_length=MAX_KEY)]


class EventEmit(Strict):
    key: EventKey = Field(description="what the waiters wait for (wait_for_event's key)")
    payload: Any = Field(None, description="any JSON: what wait_for_event returns")


router = APIRouter(tags=["events"])


@router.post(
    "/events",
    status_code=201,
    summary="Emit an event",
    dependencies=[requires(PRODUCER)],
    responses={200: {"description": "the key had an event already: nothing changed"}},
)
def emit_event(body: EventEmit, response: Response, app: Facade) -> Any:
    """Store the event and wake the jobs waiting for it (``woken``); a wait that
    comes later returns at once. The first payload for a key wins: a later emit
    of the key changes nothing and answers 200 with ``created: false``."""
    emitted = app.emit_event(body.key, body.payload)
    response.status_code = 201 if emitted.created else 200
    return {"key": emitted.key, "created": emitted.created, "woken": emitted.woken}
