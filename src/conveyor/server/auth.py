"""Bearer tokens and scopes. ``401`` without a valid token, ``403`` with one whose
scope does not allow the route. Until a first token is created (and with
``tokens_required`` not set) the server is open, to loopback clients only; once one
was, it stays closed, even with every token revoked (see ``ServerContext.closed``)."""

from __future__ import annotations

import asyncio
import functools
from typing import Any

from fastapi import Depends, HTTPException, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from ..records import ApiToken, TokenScope
from .context import ServerContext, is_loopback
from .dependencies import Ctx

#: what each scope allows, said the same way in errors and the OpenAPI document
_SCOPES = (
    "read: GET only; producer: read, plus send, cancel and retry jobs, batches and "
    "workflows; "
    "worker: read, plus lease jobs and report their outcomes, but not send, cancel or "
    "retry them (producer and worker are separate: neither includes the other); "
    "admin: everything"
)

bearer = HTTPBearer(
    auto_error=False,
    description="An API token (`conveyor tokens create --scope ...`): "
    f"`Authorization: Bearer cvy_<id>_<secret>`. Scopes: {_SCOPES}.",
)

READ = TokenScope.READ
PRODUCER = TokenScope.PRODUCER
WORKER = TokenScope.WORKER
ADMIN = TokenScope.ADMIN


def _refuse(status: int, detail: str) -> HTTPException:
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return HTTPException(status_code=status, detail=detail, headers=headers)


#: the dashboard's session: the token, in an HttpOnly, SameSite=Strict cookie
COOKIE = "conveyor_token"
#: a write authenticated by the cookie must carry this header, which a page from
#: another site cannot send without the browser asking this server first (CORS)
DASHBOARD_HEADER = "x-conveyor-dashboard"


async def authorize(
    ctx: ServerContext, request: Request, raw: str | None, scope: TokenScope
) -> ApiToken | None:
    """The caller's token (``raw``: from the Authorization header, else the
    dashboard's cookie), checked for ``scope``; ``None`` on an open server.
    Raises 401 or 403."""
    if ctx.tokens_required is False:
        return None
    app = ctx.conveyor
    if not await asyncio.to_thread(ctx.closed):
        host = request.client.host if request.client else None
        if not is_loopback(host):
            raise _refuse(401, _loopback_only(host))
        return None
    if raw is None:
        raise _refuse(401, "an API token is required: `Authorization: Bearer <token>`")
    token = await asyncio.to_thread(app.serving.authenticate, raw)
    if token is None:
        raise _refuse(401, "the API token is not valid (unknown, revoked or mistyped)")
    if not token.scope.allows(scope):
        raise _refuse(
            403,
            f"a {token.scope} token cannot do this: it needs a {scope} or admin token ({_SCOPES})",
        )
    return token


def _credential(request: Request, credentials: HTTPAuthorizationCredentials | None) -> str | None:
    """The token a request carries: the Authorization header's, else the dashboard's cookie."""
    if credentials is not None:
        return credentials.credentials
    return request.cookies.get(COOKIE)


#: how often, at most, an event stream waits between checks of the token it was opened with
RECHECK_S = 1.0


async def still_allowed(ctx: ServerContext, request: Request, scope: TokenScope) -> bool:
    """Whether the request's credential (header or cookie) still allows ``scope``,
    by the same path as ``requires``: an event stream asks this between its reads and
    ends once its token is revoked (on this server at once, on another within the
    token cache's ``AUTH_CACHE_S``), instead of delivering events to it for good."""
    try:
        await authorize(ctx, request, _credential(request, await bearer(request)), scope)
    except HTTPException:
        return False
    return True


def _loopback_only(host: str | None) -> str:
    text = (
        "this server has no active API token, so it serves loopback clients only "
        f"(this client is {host!r}); create one with `conveyor tokens create --scope ...` "
        "and send it as `Authorization: Bearer <token>`"
    )
    if host == "testclient":
        text += (
            ". Starlette's TestClient calls itself 'testclient', which is not a loopback "
            "address: send a token, or build the app with create_app(..., "
            "tokens_required=False) for a test"
        )
    return text


@functools.cache
def requires(scope: TokenScope) -> Any:
    """A dependency: the caller's token must allow ``scope``: a read token only
    ``read``; a producer or worker token ``read`` and its own scope (neither includes
    the other); admin everything. Returns the token, or ``None`` on an open server. A
    browser signed in to the dashboard sends its token as a cookie instead of the header."""

    async def check(
        request: Request,
        ctx: Ctx,
        credentials: HTTPAuthorizationCredentials | None = Security(bearer),
    ) -> ApiToken | None:
        raw = _credential(request, credentials)
        by_cookie = credentials is None and raw is not None
        if (
            by_cookie
            and request.method not in ("GET", "HEAD")
            and DASHBOARD_HEADER not in request.headers
        ):
            raise _refuse(
                403,
                "a change signed in by the dashboard's cookie must come from the "
                f"dashboard (the {DASHBOARD_HEADER} header); API clients send "
                "`Authorization: Bearer <token>`",
            )
        return await authorize(ctx, request, raw, scope)

    return Depends(check)
