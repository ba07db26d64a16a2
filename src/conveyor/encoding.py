"""Turning what handlers produce into text every database can store, alike on
every backend: JSON without NUL characters or lone surrogates (PostgreSQL's
jsonb refuses both), and messages of bounded size."""

from __future__ import annotations

import json
import re
from typing import Any

_ENCODE = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode
#: a JSON-escaped NUL (an odd run of backslashes before "u0000")
JSON_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")
REPLACEMENT = "\ufffd"


def with_headers(args_json: str, headers: dict[str, str]) -> str:
    """An encoded ``{"args", "kwargs"}`` document with ``headers`` added (metadata
    that travels with the job without reaching the handler)."""
    doc = json.loads(args_json)
    doc["headers"] = {**(doc.get("headers") or {}), **headers}
    return storable_json(doc)


def storable_text(text: str, limit: int | None = None) -> str:
    """``text`` with NUL characters and lone surrogates replaced by U+FFFD, cut to
    ``limit`` characters (saying so)."""
    if "\x00" in text:
        text = text.replace("\x00", REPLACEMENT)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    if limit is not None and len(text) > limit:
        text = text[:limit] + f"\n... [{len(text) - limit:,} more characters cut]"
    return text


def storable_json(value: Any) -> str:
    """JSON text of ``value`` that every database stores: NULs become U+FFFD, lone
    surrogates too. Raises TypeError/ValueError/RecursionError for what JSON cannot
    hold."""
    if value is None:
        return "null"
    text: str = _ENCODE(value)
    if "\\u0000" in text:
        text = JSON_NUL.sub(lambda m: m.group(1) + REPLACEMENT, text)
    return storable_text(text)
