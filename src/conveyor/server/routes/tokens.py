"""``/v1/tokens`` (admin): create a token (its secret is shown once), list them,
revoke one. Only a hash of each secret is stored."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Response

from ... import serialize
from ...errors import JobNotFound
from ...records import TokenScope
from ..auth import ADMIN, requires
from ..dependencies import Facade
from ..models import Name, Strict


class TokenCreate(Strict):
    scope: TokenScope
    name: Name | None = None


router = APIRouter(tags=["tokens"], dependencies=[requires(ADMIN)])


@router.get("/tokens", summary="Every token (never their secrets)")
def list_tokens(app: Facade) -> Any:
    return {"tokens": [serialize.token(t) for t in app.tokens()]}


@router.post("/tokens", status_code=201, summary="Create a token")
def create_token(body: TokenCreate, app: Facade) -> Any:
    """The answer's ``token`` is the secret to send as ``Authorization: Bearer``;
    it is not stored and cannot be shown again."""
    record, secret = app.create_token(body.scope, name=body.name)
    return {**serialize.token(record), "token": secret}


@router.delete("/tokens/{token_id}", status_code=204, summary="Revoke a token")
def revoke_token(token_id: Annotated[Name, Path()], app: Facade) -> Response:
    if not app.revoke_token(token_id):
        raise JobNotFound(f"no active token with id {token_id!r}")
    return Response(status_code=204)
