"""``conveyor server``: the HTTP API (REST under /v1, remote workers, asyncflow
under /api), served with uvicorn."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import click

from ..errors import redact_url
from ..observability.logs import configure as configure_logging
from ..server.context import DEFAULT_MAX_BODY, is_loopback
from ..server.perimeter import allowed_host
from .core import CliError, State, app_option, pass_state, wait_for_database_option
from .worker import LOG_LEVELS

if TYPE_CHECKING:
    from ..app import Conveyor

log = logging.getLogger("conveyor.server")


def _allowed_host(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> Any:
    try:
        return tuple(allowed_host(v) for v in values)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None


allowed_host_option = click.option(
    "--allowed-host",
    "allowed_hosts",
    multiple=True,
    metavar="NAME",
    callback=_allowed_host,
    help="A Host name clients reach this server by (repeatable): NAME, .NAME (it and its "
    "subdomains) or * (any). Loopback names (localhost, 127.0.0.1, [::1]) are always "
    "served, and so is the --host address itself; other names get 400 (so DNS rebinding "
    "gets nowhere). Required when --host is 0.0.0.0 or ::.",
)


read_url_option = click.option(
    "--read-url",
    envvar="CONVEYOR_READ_URL",
    metavar="URL",
    help="A streaming replica of the database ($CONVEYOR_READ_URL): lists, counts, "
    "metrics, event streams and the dashboard read there (it says how far behind it "
    "is); writes, claims and a job read by id go to the primary.",
)


@click.command("server", short_help="Serve the HTTP API: REST, remote workers, asyncflow.")
@app_option
@read_url_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8081, show_default=True, help="Port to bind."
)
@allowed_host_option
@click.option(
    "--open",
    "reopen",
    is_flag=True,
    help="Serve loopback clients without a token while no token is active, although "
    "tokens existed (all are revoked). Without it, a server whose database ever had a "
    "token refuses every request without a valid one. Loopback addresses only; logged "
    "at start as a warning.",
)
@click.option(
    "--header-timeout",
    "header_timeout_s",
    type=click.FloatRange(min=0.1),
    default=10.0,
    show_default=True,
    metavar="SECONDS",
    help="A connection whose request line and headers are not all in by then is closed "
    "(slow or silent clients cannot hold sockets open).",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1024),
    default=DEFAULT_MAX_BODY,
    show_default=True,
    help="Larger request bodies get 413.",
)
@click.option(
    "--services/--no-services",
    default=True,
    show_default=True,
    help="Run the leader-elected cluster services here (rescue the jobs of dead workers, "
    "scheduling, batches, cron), and a worker of the 'conveyor' queue (bulk actions): "
    "needed when only remote workers run.",
)
@click.option(
    "--worker-ttl",
    "worker_ttl_s",
    type=click.FloatRange(min=0.5),
    default=7.0,
    show_default=True,
    metavar="SECONDS",
    help="A remote worker silent this long is dead: its jobs go back to the queue.",
)
@click.option(
    "--max-wait",
    "max_wait_s",
    type=click.FloatRange(min=0),
    default=30.0,
    show_default=True,
    metavar="SECONDS",
    help="The longest a lease request long-polls for work (its wait_s is capped to this).",
)
@wait_for_database_option
@click.option("--access-log", is_flag=True, help="Log every request.")
@click.option("--log-level", type=click.Choice(LOG_LEVELS), default="info", show_default=True)
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    default="text",
    show_default=True,
    help="json: one object per line.",
)
@pass_state
def server(
    state: State,
    host: str,
    port: int,
    allowed_hosts: tuple[str, ...],
    reopen: bool,
    header_timeout_s: float,
    read_url: str | None,
    max_body_bytes: int,
    services: bool,
    worker_ttl_s: float,
    max_wait_s: float,
    connect_wait_s: float,
    access_log: bool,
    log_level: str,
    log_format: str,
) -> None:
    """Serve Conveyor over HTTP until SIGTERM/SIGINT.

    \b
    conveyor server --app myapp:app        REST API, your tasks' defaults
    conveyor server                        a pure task service for remote workers
    conveyor server --host 0.0.0.0 --allowed-host queue.example.com
                                           needs API tokens (conveyor tokens create)

    OpenAPI at /openapi.json, interactive docs at /docs, probes at /healthz and
    /readyz. Until a first API token is created the server is open, to loopback
    clients only, and refuses to bind any other address; from then on every
    request needs a valid token, even once every token is revoked (--open).
    Browsers' writes from other sites are refused, and so are Host names the
    server was not given (--allowed-host).
    """
    import uvicorn

    from ..server.app import create_app
    from ..server.protocol import HeadDeadline

    configure_logging(log_level, log_format)
    app = state.app(auto_migrate=True)
    app.connect(wait_s=connect_wait_s)  # and migrates
    if read_url:
        app.read_url = read_url
        log.info("reading lists, counts and the dashboard from %s", redact_url(read_url))
    allowed_hosts = _check_access(app, host, allowed_hosts, reopen)
    api = create_app(
        app,
        reopen=reopen,
        allowed_hosts=allowed_hosts,
        max_body_bytes=max_body_bytes,
        run_services=services,
        worker_ttl_s=worker_ttl_s,
        max_wait_s=max_wait_s,
    )
    log.info(
        "serving %s on http://%s:%d (docs at /docs)", redact_url(app.url).split("?")[0], host, port
    )
    # open event streams never end by themselves: a stop waits 5 s for them, then closes them
    uvicorn.run(
        api,
        host=host,
        port=port,
        log_level=log_level,
        access_log=access_log,
        timeout_graceful_shutdown=5,
        http=HeadDeadline.with_timeout(header_timeout_s),
    )


def _check_access(
    app: Conveyor, host: str, allowed_hosts: tuple[str, ...], reopen: bool
) -> tuple[str, ...]:
    """Refuse an address that would expose an open server or answer to any name;
    say loudly how the server is open. Returns the Host names to serve."""
    ever, active = app.serving.tokens_configured(), app.serving.tokens_active()
    open_now = not ever or (reopen and not active)
    if not is_loopback(host):
        if open_now or reopen:
            raise CliError(
                f"refusing to serve on {host} without API tokens: anyone who can reach it "
                "could create, cancel and delete jobs. Create one first (`conveyor tokens "
                "create --scope admin`), or bind a loopback address (--host 127.0.0.1)"
                + ("; --open is for a loopback address only" if reopen else "")
            )
        if host not in ("0.0.0.0", "::", ""):
            try:
                allowed_hosts = (*allowed_hosts, allowed_host(host))
            except ValueError as exc:
                raise CliError(f"--host: {exc}") from None
        elif not allowed_hosts:
            raise CliError(
                f"--host {host} answers to any name pointed at this machine: name the ones "
                "clients use with --allowed-host (e.g. --allowed-host queue.example.com, "
                "--allowed-host .example.com for subdomains too), or --allowed-host '*' to "
                "answer to any (e.g. behind a proxy that checks the name)"
            )
    if open_now and "*" in allowed_hosts:
        raise CliError(
            "refusing --allowed-host '*' without API tokens: any web page could then reach "
            "this open server by pointing a name of its own at 127.0.0.1 (DNS rebinding); "
            "name the hosts, or create a token first (`conveyor tokens create`)"
        )
    if not ever:
        log.warning(
            "no API tokens in the database: serving without authentication, to loopback "
            "clients only (`conveyor tokens create --scope ...` turns authentication on)"
        )
    elif reopen and not active:
        log.warning(
            "OPEN (--open): every token is revoked and this server serves loopback clients "
            "WITHOUT A TOKEN until one is created; restart without --open to close it"
        )
    elif reopen:
        log.warning("--open: no effect while tokens are active (it opens once all are revoked)")
    elif not active:
        log.warning(
            "every API token is revoked: this server refuses every request (401) until one "
            "is created (`conveyor tokens create`), or it is restarted with --open"
        )
    if open_now and allowed_hosts:
        log.warning(
            "serving without authentication and answering to %s: a proxy on this machine "
            "forwarding them would make every client loopback; create a token",
            ", ".join(allowed_hosts),
        )
    return allowed_hosts


@click.command("dashboard", short_help="Serve the web dashboard (the server, at /).")
@app_option
@read_url_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8081, show_default=True, help="Port to bind."
)
@allowed_host_option
@click.pass_context
def dashboard(
    ctx: click.Context,
    host: str,
    port: int,
    allowed_hosts: tuple[str, ...],
    read_url: str | None,
) -> None:
    """Serve the web dashboard: `conveyor server` with its defaults, whose `/` is
    the dashboard. Open the URL it prints; sign in with an API token if the
    database has any (`conveyor tokens create --scope read|producer|admin`)."""
    click.echo(f"dashboard: http://{host}:{port}/  (Ctrl-C stops it)", err=True)
    ctx.invoke(server, host=host, port=port, allowed_hosts=allowed_hosts, read_url=read_url)
