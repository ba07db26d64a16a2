"""An app with periodic tasks, for ``conveyor periodic list`` and ``conveyor status``.
Only ever loaded in process: a worker running it would enqueue ticks."""

from __future__ import annotations

from conveyor import Conveyor

app = Conveyor()


@app.periodic("*/5 * * * *")
def refresh_rates() -> None:
    pass


@app.periodic("30 2 * * *", timezone="Europe/Paris", args=("eu",), catch_up=3, queue="reports")
def nightly_report(region: str) -> str:
    return region


#: an app that declares no schedule
bare = Conveyor()
