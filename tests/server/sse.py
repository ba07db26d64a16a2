"""A small Server-Sent Events reader over httpx (what a browser's EventSource does:
fields per line, an event per blank line, ``Last-Event-ID`` on reconnect)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx


def events(
    client: httpx.Client, path: str, *, last_event_id: str | None = None, **params
) -> Iterator[dict]:
    headers = {"Accept": "text/event-stream"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = last_event_id
    with client.stream("GET", path, params=params, headers=headers, timeout=120) as r:
        assert r.status_code == 200, r.read().decode()
        assert r.headers["content-type"].startswith("text/event-stream")
        event: dict = {}
        for line in r.iter_lines():
            if not line:
                if "data" in event:
                    event["data"] = json.loads(event["data"])
                    yield event
                event = {}
                continue
            if line.startswith(":"):
                continue  # a comment (keep-alive)
            name, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if name == "data" and "data" in event:
                event["data"] += "\n" + value
            else:
                event[name] = value
