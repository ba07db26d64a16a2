"""Log formats for ``conveyor worker --log-format``: the human one, and JSON,
one object per line, with the job's id, task, queue, attempt, outcome, duration
and trace id on the lines that concern a job."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime

TEXT_FORMAT = "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s"
TEXT_DATEFMT = "%Y-%m-%d %H:%M:%S"
#: job fields a log record may carry (``extra=``), copied into the JSON object
JOB_FIELDS = ("job_id", "task", "queue", "attempt", "outcome", "duration_s", "trace_id", "worker")


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in JOB_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                data[name] = value
        if record.exc_info:
            data["exception"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str, ensure_ascii=False)


def configure(level: str, fmt: str = "text") -> None:
    """Root logging for a worker process. With JSON every attempt's outcome is a
    line (logger ``conveyor.jobs`` at INFO); in text only retries and failures are,
    unless the level is DEBUG."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter(TEXT_FORMAT, TEXT_DATEFMT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level.upper())
    jobs = logging.getLogger("conveyor.jobs")
    jobs.setLevel(logging.INFO if fmt == "json" or level.upper() == "DEBUG" else logging.WARNING)
