"""``manage.py conveyor_worker``: ``conveyor worker`` for Django's tasks."""

from __future__ import annotations

import sys
from typing import Any

from django.core.management.base import BaseCommand, CommandError

from conveyor.registry import user_tasks

#: Django's own options, already applied by manage.py: not the worker's
_DJANGO_VALUED = ("--settings", "--pythonpath")
_DJANGO_FLAGS = ("--skip-checks", "--traceback", "--no-color", "--force-color")
HELP = """Run a Conveyor worker for Django's tasks (the TASKS backend --backend, default
"default"). It imports every installed app's tasks module, serves the backend's
QUEUES unless --queues is given, and takes the options of `conveyor worker`
(below, where --app is set for you)."""


class Command(BaseCommand):
    help = HELP

    def run_from_argv(self, argv: list[str]) -> None:
        """The worker's options are click's (``conveyor worker``): handed over as
        they are, not parsed by Django's argparse."""
        args, alias, skip_checks = _split(argv[2:])
        prog = f"{argv[0]} {argv[1]}"
        if "-h" in args or "--help" in args:
            print(HELP + "\n\n  --backend ALIAS  the TASKS backend to serve [default: default]\n")
        elif not skip_checks:
            self.check()
        sys.exit(self.run_worker(alias, args, prog))

    def run_worker(self, alias: str, args: list[str], prog: str) -> int:
        from conveyor import ConveyorError
        from conveyor.cli.main import cli

        from ...worker import worker_app

        if not {"-h", "--help"} & set(args):
            try:
                app = worker_app(alias)
            except ConveyorError as exc:  # one line, as `conveyor worker` says it
                self.stderr.write(f"error: {exc}")
                return 2
            if not _has_queues(args):
                args = ["--queues", ",".join(_queues(alias, app)), *args]
        spec = f"conveyor.contrib.django.worker:{alias}"
        result: Any = cli.main(["worker", "--app", spec, *args], prog_name=prog)
        return result if isinstance(result, int) else 0

    def handle(self, *args: Any, **options: Any) -> None:
        raise CommandError(
            "conveyor_worker runs from the command line: python manage.py conveyor_worker [OPTIONS]"
        )


def _split(args: list[str]) -> tuple[list[str], str, bool]:
    """(the worker's arguments, the backend alias, --skip-checks given)."""
    out: list[str] = []
    alias, skip, it = "default", False, iter(args)
    for arg in it:
        name = arg.split("=", 1)[0]
        if name == "--backend":
            alias = arg.split("=", 1)[1] if "=" in arg else next(it, "default")
        elif name in _DJANGO_VALUED:
            if "=" not in arg:
                next(it, None)
        elif arg in _DJANGO_FLAGS or arg.startswith("--verbosity") or arg == "-v":
            skip = skip or arg == "--skip-checks"
            if arg == "-v":
                next(it, None)
        else:
            out.append(arg)
    return out, alias, skip


def _has_queues(args: list[str]) -> bool:
    return any(a in ("-Q", "--queues") or a.startswith(("--queues=", "-Q")) for a in args)


def _queues(alias: str, app: Any) -> list[str]:
    """The backend's QUEUES; every queue its tasks use when QUEUES is empty (any)."""
    from django.tasks import task_backends

    queues = sorted(task_backends[alias].queues)
    return queues or sorted({t.defaults.queue for t in user_tasks(app.tasks)}) or ["default"]
