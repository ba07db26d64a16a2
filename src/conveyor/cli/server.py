"""``conveyor server``: the HTTP API (REST under /v1, remote workers, asyncflow
under /api), served with uvicorn."""

from __future__ import annotations

import logging

import click

from ..errors import redact_url
from ..observability.logs import configure as configure_logging
from ..server.context import DEFAULT_MAX_BODY, is_loopback
from .core import CliError, State, app_option, pass_state, wait_for_database_option
from .worker import LOG_LEVELS

log = logging.getLogger("conveyor.server")


@click.command("server", short_help="Serve the HTTP API: REST, remote workers, asyncflow.")
@app_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8081, show_default=True, help="Port to bind."
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
    "scheduling, batches, cron): needed when only remote workers run.",
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
    conveyor server --host 0.0.0.0         needs API tokens (conveyor tokens create)

    OpenAPI at /openapi.json, interactive docs at /docs, probes at /healthz and
    /readyz. With no API token in the database the server is open, to loopback
    clients only; it refuses to bind any other address until a token exists.
    """
    import uvicorn

    from ..server.app import create_app

    configure_logging(log_level, log_format)
    app = state.app(auto_migrate=True)
    app.connect(wait_s=connect_wait_s)  # and migrates
    if not app.tokens_configured():
        if not is_loopback(host):
            raise CliError(
                f"refusing to serve on {host} without API tokens: anyone who can reach it "
                "could create, cancel and delete jobs. Create one first (`conveyor tokens "
                "create --scope admin`), or bind a loopback address (--host 127.0.0.1)"
            )
        log.warning(
            "no API tokens in the database: serving without authentication, to loopback "
            "clients only (`conveyor tokens create --scope ...` turns authentication on)"
        )
    api = create_app(
        app,
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
    )


@click.command("dashboard", short_help="Serve the web dashboard (the server, at /).")
@app_option
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option(
    "--port", type=click.IntRange(0, 65535), default=8081, show_default=True, help="Port to bind."
)
@click.pass_context
def dashboard(ctx: click.Context, host: str, port: int) -> None:
    """Serve the web dashboard: `conveyor server` with its defaults, whose `/` is
    the dashboard. Open the URL it prints; sign in with an API token if the
    database has any (`conveyor tokens create --scope read|producer|admin`)."""
    click.echo(f"dashboard: http://{host}:{port}/  (Ctrl-C stops it)", err=True)
    ctx.invoke(server, host=host, port=port)
