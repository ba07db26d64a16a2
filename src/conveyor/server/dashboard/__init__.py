"""The web dashboard, served by ``conveyor server`` at ``/``.

Pages are rendered on the server (Jinja2) from the façade and the one
serialisation (``serialize``); a small script (``static/app.js``) updates them
from the SSE streams and runs actions through the same ``/v1`` API as every other
client. Every asset ships in the package: nothing is fetched from the network.

Sign-in: the token is posted once to ``/login`` and kept in an HttpOnly,
SameSite=Strict cookie, never in a URL; the API accepts that cookie too, and a
change made with it must carry the dashboard's header (see ``auth``). An open
server (no tokens, loopback only) needs no sign-in. What a token may do decides
which buttons a page shows; the API refuses the rest anyway.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape
from importlib import resources
from itertools import pairwise
from typing import Annotated, Any
from urllib.parse import parse_qs, quote, urlencode

from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from jinja2 import Environment, PackageLoader, select_autoescape
from pydantic import AfterValidator, BaseModel, StringConstraints, TypeAdapter, ValidationError

from ... import serialize
from ...checks import MAX_LIMIT_KEY
from ...encoding import storable_text
from ...errors import ConfigError, ConveyorError, JobNotFound
from ...records import ApiToken, JobFilter, JobState, TokenScope
from .. import errors
from ..auth import COOKIE, authorize
from ..context import ServerContext
from ..dependencies import Ctx, Facade
from ..models import FilterFields, JobId, clean_text
from ..routes.workflows import view as workflow_view
from . import graph

log = logging.getLogger("conveyor.dashboard")

STATIC = {"app.css": "text/css; charset=utf-8", "app.js": "text/javascript; charset=utf-8"}
STATES = [s.value for s in JobState]
PAGE = 50
#: workers a page, as ``/v1/workers`` gives them
WORKERS_PAGE = 100

env = Environment(
    loader=PackageLoader("conveyor.server.dashboard", "templates"),
    autoescape=select_autoescape(["html"]),
)
env.filters["tojson_attr"] = lambda v: json.dumps(v, default=str)


def _ago(value: Any) -> str:
    if not value:
        return "-"
    when = datetime.fromisoformat(value) if isinstance(value, str) else value
    secs = (datetime.now(UTC) - when).total_seconds()
    if secs < 0:
        return f"in {_span(-secs)}"
    return f"{_span(secs)} ago"


def _span(secs: float) -> str:
    if secs < 1:
        return f"{secs * 1000:.0f} ms"
    if secs < 120:
        return f"{secs:.0f} s"
    if secs < 7200:
        return f"{secs / 60:.0f} min"
    return f"{secs / 3600:.1f} h"


env.filters["ago"] = _ago


@dataclass(frozen=True)
class Viewer:
    """Who is looking: their token (None on an open server)."""

    token: ApiToken | None

    def can(self, scope: TokenScope) -> bool:
        return self.token is None or self.token.scope.allows(scope)

    @property
    def label(self) -> str:
        if self.token is None:
            return "open server (loopback)"
        return f"{self.token.name or self.token.id} ({self.token.scope})"


class History:
    """The last hour as the overview charts it: every ``every_s`` seconds, jobs
    finished so far and the oldest waiting job's age, per queue, read from the
    count rollup and the waiting index (no scan). Kept in memory from the first
    dashboard visit on, so a chart starts when the server does."""

    def __init__(self, ctx: ServerContext, every_s: float = 10.0, keep_s: float = 3600.0) -> None:
        self.ctx, self.every_s = ctx, every_s
        self.points: deque[tuple[float, dict[str, int], dict[str, float]]] = deque(
            maxlen=int(keep_s / every_s) + 1
        )
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="conveyor-dashboard-history", daemon=True
                )
                self._thread.start()

    def _run(self) -> None:
        while True:
            time.sleep(self.every_s)  # the first sample was taken by the first visit
            try:
                self.sample()
            except Exception as exc:  # the database may be down for a while: try again
                log.debug("dashboard history: %s", exc)

    def sample(self) -> None:
        app = self.ctx.conveyor
        finished: dict[str, int] = {}
        for c in app.counts():
            if JobState(c.state).finished:
                finished[c.queue] = finished.get(c.queue, 0) + c.count
                key = f"@{c.state}"  # totals per final state, across queues
                finished[key] = finished.get(key, 0) + c.count
        now = datetime.now(UTC)
        waits = {
            q: max(0.0, (now - t).total_seconds()) for q, t in app.serving.oldest_waiting().items()
        }
        self.points.append((time.time(), finished, waits))

    def series(self) -> list[dict[str, Any]]:
        """Per queue: finished per minute and oldest wait (s), as SVG polylines."""
        pts = list(self.points)
        queues = sorted({q for _, f, w in pts for q in (*f, *w) if not q.startswith("@")})
        out = []
        for q in queues:
            rate = []
            for (t0, f0, _), (t1, f1, _) in pairwise(pts):
                done = max(0, f1.get(q, 0) - f0.get(q, 0))  # pruning can lower a count
                rate.append((t1, done * 60 / max(t1 - t0, 1e-6)))
            wait = [(t, w.get(q, 0.0)) for t, _, w in pts]
            out.append(
                {
                    "queue": q,
                    "rate": _polyline(rate),
                    "rate_now": round(rate[-1][1]) if rate else None,
                    "rate_max": round(max((v for _, v in rate), default=0)),
                    "wait": _polyline(wait),
                    "wait_now": _span(wait[-1][1]) if wait else None,
                    "wait_max": _span(max((v for _, v in wait), default=0)),
                }
            )
        return out

    def window(self) -> dict[str, Any]:
        """Jobs that ended per final state between the oldest sample kept (at most
        an hour ago) and now, from the rollup's totals: no scan of the jobs."""
        pts = list(self.points)
        if len(pts) < 2:
            return {"span": None}
        (t0, f0, _), (t1, f1, _) = pts[0], pts[-1]
        out: dict[str, Any] = {"span": _span(t1 - t0)}
        for state in ("succeeded", "failed", "cancelled"):
            key = f"@{state}"
            out[state] = max(0, f1.get(key, 0) - f0.get(key, 0))
        out["per_min"] = round(
            (out["succeeded"] + out["failed"] + out["cancelled"]) * 60 / max(t1 - t0, 1e-6), 1
        )
        return out


def _polyline(points: list[tuple[float, float]], w: int = 240, h: int = 40) -> str:
    """SVG polyline points over the last hour (x: time, y: value scaled to its max)."""
    if not points:
        return ""
    end = time.time()
    top = max(v for _, v in points) or 1.0
    return " ".join(
        f"{max(0.0, w - (end - t) / 3600 * w):.1f},{h - v / top * (h - 2) - 1:.1f}"
        for t, v in points
    )


router = APIRouter(include_in_schema=False)


async def viewer(ctx: ServerContext, request: Request) -> Viewer | Response:
    """Who is looking; or, for someone not signed in, the page that says so."""
    try:
        token = await authorize(ctx, request, request.cookies.get(COOKIE), TokenScope.READ)
    except HTTPException as exc:
        if exc.status_code == 401 and "loopback clients only" not in str(exc.detail):
            target = quote(_here(request) + (f"?{request.url.query}" if request.url.query else ""))
            return RedirectResponse(f"{_root(request)}/login?next={target}", status_code=303)
        return error_page(exc.status_code, str(exc.detail), request)
    return Viewer(token)


def error_page(status: int, text: str, request: Request) -> HTMLResponse:
    """An error page in the dashboard's style, with a way back to the overview
    (no navigation that needs a signed-in viewer). Its text is escaped: it may
    carry what the client sent (an address uvicorn took from ``X-Forwarded-For``,
    a name in a URL)."""
    root = escape(_root(request))
    return HTMLResponse(
        '<!doctype html><html lang="en"><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<title>{status} · Conveyor</title><link rel="stylesheet" href="{root}/static/app.css">'
        f'<header><a class="brand" href="{root}/">Conveyor</a></header>'
        f"<main><h1>{status}</h1><p>{escape(text)}</p>"
        f'<p><a href="{root}/">Back to the overview</a></p></main></html>',
        status,
    )


def render(name: str, request: Request, who: Viewer, **data: Any) -> HTMLResponse:
    html = env.get_template(name).render(
        request=request,
        root=_root(request),
        here=_here(request),
        who=who,
        can_produce=who.can(TokenScope.PRODUCER),
        can_admin=who.can(TokenScope.ADMIN),
        open_server=who.token is None,
        replica=_replica_note(request),
        **data,
    )
    return HTMLResponse(html, headers={"Cache-Control": "no-store"})


def _replica_note(request: Request) -> str | None:
    """How far behind the replica the pages are read from is (None: the primary)."""
    ctx = getattr(request.app.state, "conveyor", None)
    app = ctx.conveyor if isinstance(ctx, ServerContext) else None
    if app is None or not app.read_url:
        return None
    try:
        lag = app.replica_lag()
    except ConveyorError:
        return "lag unknown (it does not answer)"
    return "lag unknown" if lag is None else f"{lag:.1f} s behind"


async def not_found(request: Request, exc: Exception) -> Response:
    """A 404 (an unknown path, most often) outside the APIs is a page someone
    asked for: the dashboard's error page. Under ``/v1`` and ``/api`` the API
    answers as ever (JSON, or asyncflow's envelope)."""
    if errors.is_api(request):
        return await errors.http_error(request, exc)
    return error_page(404, f"no page at {storable_text(_here(request), 200)}", request)


@router.get("/static/{name}")
def static(name: str, request: Request) -> Response:
    if name not in STATIC:
        return error_page(404, f"no dashboard asset {name!r}", request)
    body = resources.files(__package__ or __name__).joinpath("static", name).read_bytes()
    return Response(body, media_type=STATIC[name], headers={"Cache-Control": "max-age=300"})


@router.get("/favicon.ico")
def favicon() -> Response:
    return Response(status_code=204)


#: what ``/login?error=`` may say, by code: the page shows no text from the URL, so
#: a link cannot plant a message of its own (an unknown code shows nothing)
LOGIN_ERRORS = {"token": "That token is not valid."}


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str = "/", error: str | None = None) -> HTMLResponse:
    html = env.get_template("login.html").render(
        request=request,
        root=_root(request),
        here=_here(request),
        next=_local(next),
        error=LOGIN_ERRORS.get(error or ""),
        who=None,
    )
    return HTMLResponse(html)


@router.post("/login")
async def login(request: Request, app: Facade) -> Response:
    # a urlencoded form, read by hand (FastAPI's Form needs python-multipart)
    body = parse_qs((await request.body()).decode("utf-8", "replace"))
    token = body.get("token", [""])[0]
    next = body.get("next", ["/"])[0]
    found = (
        await asyncio.to_thread(app.serving.authenticate, token.strip()) if token.strip() else None
    )
    if found is None:
        query = urlencode({"next": _local(next), "error": "token"})
        return RedirectResponse(f"{_root(request)}/login?{query}", status_code=303)
    response = RedirectResponse(_root(request) + _local(next), status_code=303)
    response.set_cookie(
        COOKIE,
        token.strip(),
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
        path="/",
    )
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    response = RedirectResponse(f"{_root(request)}/login", status_code=303)
    response.delete_cookie(COOKIE, path="/")
    return response


@router.get("/", response_class=HTMLResponse)
async def overview(request: Request, ctx: Ctx) -> Response:
    who = await viewer(ctx, request)
    if not isinstance(who, Viewer):
        return who
    app, history = ctx.conveyor, ctx.part(History)
    if history._thread is None:
        await asyncio.to_thread(history.sample)  # a first point at once
        history.start()

    def gather() -> dict[str, Any]:
        return {
            "queues": [serialize.queue(q) for q in app.queues()],
            "oldest": {q: _ago(t) for q, t in app.serving.oldest_waiting().items()},
            "unserved": [serialize.count(c) for c in app.unserved(worker_ttl_s=ctx.worker_ttl_s)],
            **app.serving.worker_counts(ctx.worker_ttl_s),
            "recent": history.window(),
            "open_batches": app.serving.open_batches(),
            "states": STATES,
            "charts": history.series(),
            "chart_points": len(history.points),
        }

    return render("overview.html", request, who, **await asyncio.to_thread(gather))


@router.get("/jobs", response_class=HTMLResponse)
async def jobs(
    request: Request,
    ctx: Ctx,
    state: str | None = None,
    queue: str | None = None,
    task: str | None = None,
    batch_id: str | None = None,
    tenant: str | None = None,
    search: str | None = None,
    stage: str | None = None,
    created_after: str | None = None,
    created_before: str | None = None,
    before: str | None = None,
) -> Response:
    who = await viewer(ctx, request)
    if not isinstance(who, Viewer):
        return who
    app = ctx.conveyor
    filters = {
        k: v.strip()
        for k, v in {
            "state": state,
            "queue": queue,
            "task": task,
            "batch_id": batch_id,
            "tenant": tenant,
            "search": search,
            "stage": stage,
            "created_after": created_after,
            "created_before": created_before,
        }.items()
        if v and v.strip()
    }
    error = None
    try:
        f, before_id = _page_filter(filters, before)
    except ValidationError as exc:
        f, before_id, error = JobFilter(), None, f"bad filter: {_fields_wrong(exc)}"

    def gather() -> dict[str, Any]:
        if error:  # nothing is read for a filter that is wrong
            return {"jobs": [], "more": False}
        rows = app.list_jobs(f, limit=PAGE, before_id=before_id)
        return {"jobs": [serialize.job(j) for j in rows], "more": len(rows) == PAGE}

    data = await asyncio.to_thread(gather)
    next_before = data["jobs"][-1]["id"] if data["more"] and not error else None
    page = render(
        "jobs.html",
        request,
        who,
        filters=filters,
        states=STATES,
        error=error,
        next_url=_next_url("/jobs", filters, "before", next_before),
        filter_json=json.dumps({} if error else _api_filter(filters)),
        **data,
    )
    page.status_code = 422 if error else 200
    return page


@router.get("/jobs/{job_id}", response_class=HTMLResponse)
async def job(request: Request, job_id: int, ctx: Ctx) -> Response:
    who = await viewer(ctx, request)
    if not isinstance(who, Viewer):
        return who
    app = ctx.conveyor

    def gather() -> dict[str, Any]:
        record = app.get_job(job_id)
        return {
            "job": serialize.job(record),
            "attempts": [serialize.attempt(a) for a in app.job_attempts(job_id)],
            "why": app.why_waiting(job_id, worker_ttl_s=ctx.worker_ttl_s),
        }

    try:
        data = await asyncio.to_thread(gather)
    except JobNotFound:
        return error_page(404, f"no job with id {job_id}", request)
    return render("job.html", request, who, pretty=_pretty, **data)


@router.get("/batches", response_class=HTMLResponse)
async def batches(request: Request, ctx: Ctx, state: str | None = None) -> Response:
    who = await viewer(ctx, request)
    if not isinstance(who, Viewer):
        return who
    app = ctx.conveyor

    def gather() -> list[dict[str, Any]]:
        rows = app.list_batches(state=state or None, limit=PAGE)
        return [serialize.batch(b.record, b.progress(refresh=False)) for b in rows]

    return render("batches.html", request, who, batches=await asyncio.to_thread(gather))


@router.get("/batches/{batch_id}", response_class=HTMLResponse)
async def batch(request: Request, batch_id: int, ctx: Ctx) -> Response:
    who = await viewer(ctx, request)
    if not isinstance(who, Viewer):
        return who
    app = ctx.conveyor

    def gather() -> dict[str, Any]:
        b = app.get_batch(batch_id)
        failed = app.list_jobs(JobFilter(batch_id=batch_id, states=(JobState.FAILED,)), limit=20)
        return {
            "batch": serialize.batch(b.record, b.progress()),
            "failures": [serialize.job(j) for j in failed],
            "first": [serialize.job(j) for j in app.batch_finished_jobs(batch_id, limit=10)],
        }

    try:
        data = await asyncio.to_thread(gather)
    except JobNotFound:
        return error_page(404, f"no batch with id {batch_id}", request)
    return render("batch.html", request, who, pretty=_pretty, **data)


@router.get("/workflows", response_class=HTMLResponse)
async def workflows(request: Request, ctx: Ctx, state: str | None = None) -> Response:
    who = await viewer(ctx, request)
    if not isinstance(who, Viewer):
        return who
    app = ctx.conveyor

    def gather() -> list[dict[str, Any]]:
        return [serialize.workflow(r) for r in app.list_workflows(state=state or None, limit=PAGE)]

    try:
        runs = await asyncio.to_thread(gather)
    except ConfigError as exc:
        return error_page(422, str(exc), request)
    return render("workflows.html", request, who, workflows=runs, state=state or "")


@router.get("/workflows/{workflow_id}", response_class=HTMLResponse)
async def workflow(request: Request, workflow_id: JobId, ctx: Ctx) -> Response:
    """The run, its graph drawn (nodes in layers by depth, coloured by state) and
    its nodes listed; ``app.js`` follows ``/v1/workflows/{id}/events`` to repaint."""
    who = await viewer(ctx, request)
    if not isinstance(who, Viewer):
        return who
    try:
        run = await asyncio.to_thread(workflow_view, ctx.conveyor, workflow_id)
    except JobNotFound:
        return error_page(404, f"no workflow with id {workflow_id}", request)
    drawn = graph.layout(run["nodes"]) if len(run["nodes"]) <= graph.MOST_DRAWN else None
    names = {n["node"]: n["name"] for n in run["nodes"]}
    return render(
        "workflow.html", request, who, run=run, drawn=drawn, names=names, pretty=_pretty, g=graph
    )


@router.get("/workers", response_class=HTMLResponse)
async def workers(
    request: Request, ctx: Ctx, alive: str | None = None, after: str | None = None
) -> Response:
    """A page of workers by id (``after``: the last id of the one before), alive,
    silent or both; paged as the jobs page is."""
    who = await viewer(ctx, request)
    if not isinstance(who, Viewer):
        return who
    app, filters = ctx.conveyor, {"alive": alive} if alive else {}
    error = None
    try:
        asked = _WorkersPage.model_validate({"alive": alive or None, "after": after or None})
    except ValidationError as exc:
        asked, error = _WorkersPage(), f"bad filter: {_fields_wrong(exc)}"

    def gather() -> list[dict[str, Any]]:
        if error:  # nothing is read for a filter that is wrong
            return []
        rows = app.workers(
            limit=WORKERS_PAGE, after=asked.after, alive=asked.alive, worker_ttl_s=ctx.worker_ttl_s
        )
        now = datetime.now(UTC)
        return [serialize.worker(w, now=now, ttl_s=ctx.worker_ttl_s) for w in rows]

    shown = await asyncio.to_thread(gather)
    last = shown[-1]["id"] if len(shown) == WORKERS_PAGE else None
    page = render(
        "workers.html",
        request,
        who,
        workers=shown,
        alive=alive or "",
        error=error,
        next_url=_next_url("/workers", filters, "after", last),
    )
    page.status_code = 422 if error else 200
    return page


@router.get("/tasks", response_class=HTMLResponse)
async def tasks(request: Request, ctx: Ctx) -> Response:
    who = await viewer(ctx, request)
    if not isinstance(who, Viewer):
        return who
    app = ctx.conveyor

    def gather() -> dict[str, Any]:
        settings = [serialize.task_settings(s) for s in app.task_settings()]
        names = sorted({*app.tasks, *(s["task"] for s in settings)})
        return {"settings": settings, "names": names}

    return render("tasks.html", request, who, **await asyncio.to_thread(gather))


@router.get("/actions", response_class=HTMLResponse)
async def actions(request: Request, ctx: Ctx) -> Response:
    who = await viewer(ctx, request)
    if not isinstance(who, Viewer):
        return who
    app = ctx.conveyor

    def gather() -> list[dict[str, Any]]:
        return [serialize.action(a) for a in app.bulk_actions(limit=200)]

    return render("actions.html", request, who, actions=await asyncio.to_thread(gather))


@router.get("/trigger", response_class=HTMLResponse)
async def trigger(request: Request, ctx: Ctx, again: int | None = Query(None)) -> Response:
    who = await viewer(ctx, request)
    if not isinstance(who, Viewer):
        return who
    app = ctx.conveyor

    def gather() -> dict[str, Any]:
        names = sorted({*app.tasks, *(s.task for s in app.task_settings())})
        preset: dict[str, Any] = {}
        if again is not None:
            shown = serialize.job(app.get_job(again))  # sensitive values stay hidden
            preset = {
                **_again(shown),
                "task": shown["task"],
                "queue": shown["queue"],
                "priority": shown["base_priority"] or shown["priority"],
            }
        return {"names": names, "preset": preset}

    try:
        data = await asyncio.to_thread(gather)
    except JobNotFound:
        return error_page(404, f"no job with id {again}", request)
    return render("trigger.html", request, who, **data)


def _again(shown: dict[str, Any]) -> dict[str, Any]:
    """A job's arguments to send again, without its sensitive ones: shown as
    ``***``, sent back they would run the task with ``"***"``. A keyword one is
    left out; a positional one, and those after it (a list cannot skip it), too.
    ``sensitive``: what the person must enter again, by name."""
    positions, declared = serialize.sensitive_parameters(shown["task"])
    args, kwargs = shown["args"], shown["kwargs"]
    missing = [name for name in sorted(declared) if name in kwargs]
    kwargs = {k: v for k, v in kwargs.items() if k not in declared}
    dropped: list[str] = []
    if isinstance(args, list):
        cut = min((p for p in positions if p < len(args)), default=len(args))
        for i in range(cut, len(args)):
            names = sorted(n for n, at in declared.items() if i in at)
            if names:
                missing.append(f"{' or '.join(names)} (argument {i + 1})")
            else:
                dropped.append(f"argument {i + 1}")
        args = args[:cut]
    return {
        "args": json.dumps(args),
        "kwargs": json.dumps(kwargs),
        "sensitive": missing,
        "after": dropped,
    }


def _local(target: str) -> str:
    """Only paths on this server are redirect targets (no open redirect)."""
    return target if target.startswith("/") and not target.startswith("//") else "/"


#: the jobs page's query parameters, checked as the API checks its own (every
#: string free of NUL, ids and times within what the databases hold)
_PAGE_BEFORE = TypeAdapter(JobId)


class _WorkersPage(BaseModel):
    """The workers page's: ``alive`` (true: only those heard from within the
    worker ttl, false: only the silent ones) and ``after``, the last id of the
    page before (any text a worker's id may be, but NUL; MariaDB's hold 255)."""

    alive: bool | None = None
    after: (
        Annotated[str, StringConstraints(max_length=MAX_LIMIT_KEY), AfterValidator(clean_text)]
        | None
    ) = None


def _next_url(path: str, filters: dict[str, str], cursor: str, last: object) -> str | None:
    """The link to a list's next page: its filters and the key of the last row
    shown (None when this page was the last one)."""
    return None if last is None else f"{path}?{urlencode({**filters, cursor: last})}"


def _page_filter(filters: dict[str, str], before: str | None) -> tuple[JobFilter, int | None]:
    """The jobs page's filter and cursor; ``ValidationError`` names what is wrong."""
    fields: dict[str, Any] = dict(filters)
    for key in ("state", "queue", "task"):
        if key in fields:
            fields[key] = [fields[key]]
    checked = FilterFields.model_validate(fields).to_filter()
    return checked, None if not before else _PAGE_BEFORE.validate_python(before)


def _fields_wrong(exc: ValidationError) -> str:
    """Each wrong parameter by name, with why (``before`` is the page cursor)."""
    return "; ".join(
        f"{e['loc'][0] if e['loc'] else 'before'}: {storable_text(e['msg'], 200)}"
        for e in exc.errors()
    )


def _moment(text: str | None) -> datetime | None:
    """A time from the page's filter (a browser's datetime-local is naive: UTC)."""
    if not text:
        return None
    moment = datetime.fromisoformat(text)
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def _api_filter(filters: dict[str, str]) -> dict[str, Any]:
    """The page's filter as the bulk-action API takes it."""
    out: dict[str, Any] = {}
    for key in ("state", "queue", "task"):
        if key in filters:
            out[key] = [filters[key]]
    if "batch_id" in filters:
        out["batch_id"] = int(filters["batch_id"])
    for key in ("tenant", "search", "stage"):
        if key in filters:
            out[key] = filters[key]
    for key in ("created_after", "created_before"):
        if key in filters:
            moment = _moment(filters[key])
            out[key] = moment.isoformat() if moment else None
    return out


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, default=str, ensure_ascii=False)


def _root(request: Request) -> str:
    """Where the dashboard is mounted: "" at the root of its server, "/queue" in
    an application that mounted it there. Its links, forms, redirects and
    scripts' requests all go under it."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _here(request: Request) -> str:
    """The page's path within the dashboard (Starlette's path includes the mount)."""
    root, path = _root(request), request.url.path
    return (path[len(root) :] or "/") if root and path.startswith(root) else path
