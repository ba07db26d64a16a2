"""Turning what handlers produce into text every database can store, alike on
every backend: JSON without NUL characters or lone surrogates (PostgreSQL's
jsonb refuses both), nested no deeper than every database and every reader
takes, and messages of bounded size. And reading it back: a stored value that
cannot be read (``read_json``) is reported, never raised at whoever reads a list."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

_ENCODE = json.JSONEncoder(allow_nan=False, ensure_ascii=False, separators=(",", ":")).encode

#: How deeply lists and dicts may nest in one value a job carries: each positional
#: argument, each keyword argument's value, a context, a result (``[[1]]`` is 2
#: deep, ``1`` is 0). MariaDB stores no JSON document deeper than 31 levels, and
#: Conveyor stores a value inside up to three of its own (a chain's later steps:
#: the list of steps, a step, its argument list); 28 leaves every backend able to
#: store whatever was accepted. Checked when a value is encoded (send, send_many,
#: batch, chains, enqueue by name, the HTTP API, a worker's result or context),
#: before anything is written.
MAX_DEPTH = 28
#: How deeply a stored document may nest and still be read. Above the written
#: limit, for documents stored by older versions or by hand; every reader of a
#: record (the HTTP API, the dashboard, the CLI, the event stream) recurses once
#: or twice per level, and this keeps them far from Python's recursion limit.
READ_DEPTH = 100


#: what JSON nests: objects and arrays (the encoder takes tuples as arrays)
_CONTAINERS = (dict, list, tuple)


class TooDeep(ValueError):
    """A value nests lists and dicts deeper than the limit."""

    def __init__(self, what: str, limit: int = MAX_DEPTH) -> None:
        super().__init__(
            f"{what} nests lists and dicts more than {limit} levels deep (or holds itself); "
            f"at most {limit} are accepted"
        )


class Unreadable(ValueError):
    """A stored JSON document that cannot be read back: not JSON, nested too deeply,
    holding NaN or a lone surrogate (none of which Conveyor writes)."""


def nesting(value: Any, limit: int) -> int:
    """How deeply lists (and tuples) and dicts nest in ``value``, counted up to
    ``limit + 1`` (deeper is not measured: a value that holds itself ends there
    too). Level by level, not recursive: a deep value does not exhaust the stack
    that measures it."""
    level = [value] if isinstance(value, _CONTAINERS) else []
    depth = 0
    while level and depth <= limit:
        depth += 1
        inner: list[Any] = []
        add = inner.append
        for item in level:  # plain loops: a comprehension per container cost 1.6x
            for child in item.values() if isinstance(item, dict) else item:
                if isinstance(child, _CONTAINERS):
                    add(child)
        level = inner
    return depth


def may_nest_over(text: str, limit: int) -> bool:
    """Whether the JSON ``text`` may nest deeper than ``limit``: no, for certain,
    when it has no more opening brackets than that (two C scans; the walk of
    ``nesting`` is only for the rare document with many). Callers on a hot path
    first rule out a text shorter than ``2 * limit`` (too short to nest deeper)."""
    return text.count("[") + text.count("{") > limit


def check_depth(parts: Mapping[str, Any]) -> None:
    """``TooDeep`` naming the first of ``parts`` (name -> value) that nests deeper
    than ``MAX_DEPTH``."""
    for name, value in parts.items():
        if nesting(value, MAX_DEPTH) > MAX_DEPTH:
            raise TooDeep(name)


def argument_parts(
    args: Sequence[Any], kwargs: Mapping[str, Any], suffix: str = ""
) -> dict[str, Any]:
    """A job's arguments by the names an error gives them: ``args[0]``, ``kwargs['k']``
    (each followed by ``suffix``)."""
    parts = {f"args[{i}]{suffix}": v for i, v in enumerate(args)}
    parts.update((f"kwargs[{k!r}]{suffix}", v) for k, v in kwargs.items())
    return parts


def not_run_message(unreadable: str) -> str:
    """The error of a job failed unrun because what it carries cannot be read."""
    return (
        f"not run: the job's data cannot be read back ({unreadable}); correct it in the "
        "database and retry the job, or delete it"
    )


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


_DECODE = json.JSONDecoder(parse_constant=_no_constant).decode
#: an escaped UTF-16 surrogate (paired ones decode to one character; lone ones
#: cannot be sent as UTF-8)
_SURROGATE = re.compile(r"\\u[dD][89a-fA-F]")


def read_json(text: str, limit: int = READ_DEPTH) -> Any:
    """A stored JSON document, decoded; ``Unreadable`` saying why when it cannot be
    read or served back as JSON (SQLite keeps any text; older versions wrote what
    this one refuses)."""
    try:
        value = _DECODE(text)
    except RecursionError:
        raise Unreadable(f"nested more than {limit} levels deep") from None
    except ValueError as exc:
        raise Unreadable(f"not valid JSON ({exc})") from None
    if len(text) > 2 * limit and may_nest_over(text, limit) and nesting(value, limit) > limit:
        raise Unreadable(f"nested more than {limit} levels deep")
    if "\\u" in text and _SURROGATE.search(text):
        try:
            _ENCODE(value).encode("utf-8")
        except UnicodeEncodeError:
            raise Unreadable("holds a lone surrogate (invalid UTF-16)") from None
    return value


#: a JSON-escaped NUL (an odd run of backslashes before "u0000")
JSON_NUL = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")
REPLACEMENT = "\ufffd"


#: a job's header never shown: the fingerprint of the call that created it under an
#: idempotency key (a hash of its task and arguments, sensitive ones left out), so
#: a repeat of the key can be told apart from a different request
FINGERPRINT_HEADER = "conveyor-request-fingerprint"
#: the fingerprints this version writes; others (an HTTP body's, before v0.2) are
#: not compared: a repeat of their key returns the job, as a retry
FINGERPRINT_PREFIX = "call:sha256:"


def call_fingerprint(task: str, args: Any, kwargs: Any) -> str:
    """The fingerprint of a call: its task and arguments, as canonical JSON, hashed."""
    text = json.dumps([task, args, kwargs], sort_keys=True, separators=(",", ":"))
    return FINGERPRINT_PREFIX + hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def stored_fingerprint(args: Any) -> str | None:
    """The call fingerprint a stored (or about to be stored) arguments document
    carries: JSON text, or the document a driver decoded; None when it has none
    this version compares."""
    try:
        doc = json.loads(args) if isinstance(args, str | bytes) else args
        found = ((doc or {}).get("headers") or {}).get(FINGERPRINT_HEADER)
    except (ValueError, AttributeError, TypeError):
        return None
    return found if isinstance(found, str) and found.startswith(FINGERPRINT_PREFIX) else None


def with_headers(args_json: str, headers: dict[str, str]) -> str:
    """An encoded ``{"args", "kwargs"}`` document with ``headers`` added (metadata
    that travels with the job without reaching the handler)."""
    doc = json.loads(args_json)
    doc["headers"] = {**(doc.get("headers") or {}), **headers}
    return storable_json(doc, checked=False)


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


def storable_json(value: Any, what: str = "the value", *, checked: bool = True) -> str:
    """JSON text of ``value`` that every database stores: NULs become U+FFFD, lone
    surrogates too. Raises TypeError/ValueError for what JSON cannot hold, and
    ``TooDeep`` (a ValueError naming ``what``) for a value nested deeper than
    ``MAX_DEPTH``; ``checked=False`` skips that (a document Conveyor wraps itself)."""
    if value is None:
        return "null"
    try:
        text: str = _ENCODE(value)
    except RecursionError:
        raise TooDeep(what) from None
    if checked and len(text) > 2 * MAX_DEPTH and may_nest_over(text, MAX_DEPTH):
        check_depth({what: value})
    if "\\u0000" in text:
        text = JSON_NUL.sub(lambda m: m.group(1) + REPLACEMENT, text)
    return storable_text(text)
