"""Tasks: a handler plus the defaults its jobs are created with."""

from __future__ import annotations

import functools
import inspect
import itertools
import json
import re
import uuid
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypedDict, Unpack, cast, overload

from typing_extensions import ParamSpec, TypeVar

from .batch import Batch, BatchApp, batch_fingerprint, check_same_batch
from .checks import MAX_LIMIT_KEY, MAX_UNIQUE_KEY, check_name
from .connections import call_with
from .encoding import MAX_DEPTH, TooDeep, argument_parts, check_depth, may_nest_over
from .errors import BadArguments, ConfigError, SerializationError
from .hooks import Middleware
from .job import Job, JobApp
from .records import (
    EXPLICIT_BACKOFF,
    EXPLICIT_MAX_ATTEMPTS,
    EXPLICIT_TIMEOUT,
    BatchRecord,
    BatchState,
    JobInsert,
    TaskSettings,
)
from .retry import Backoff

#: the (args, kwargs) each insert was encoded from, reused for the jobs' handles
Payloads = Sequence[tuple[Sequence[Any], Mapping[str, Any]]]

_ENCODER = json.JSONEncoder(separators=(",", ":"), allow_nan=False, ensure_ascii=False)


def _fast_encode() -> Callable[[Any], str] | None:
    """``_ENCODER.encode`` without its per-call set-up: ``JSONEncoder.encode``
    builds a new C encoder for every value (two thirds of the 2 us it takes for
    a job's arguments). The C encoder is CPython's own, the one ``encode`` uses;
    it is used only if it gives the same text here, else ``encode`` is. It keeps
    no circular-reference markers: a cycle ends in RecursionError, which
    ``encode_json`` reports as a value nested too deeply."""
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    try:
        encoder = make(
            None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",",
            False, False, False,
        )  # fmt: skip

        def encode(value: Any) -> str:
            return "".join(encoder(value, 0))

        sample = {"args": [1, 0.5, "é\n", None, True, [{}]], "kwargs": {"k": -2e300}}
        if encode(sample) != _ENCODER.encode(sample):
            return None
        encode(float("nan"))
    except ValueError:  # NaN refused, as allow_nan=False does
        return encode
    except Exception:
        return None
    return None  # NaN was accepted: not the encoder we asked for


_ENCODE: Callable[[Any], str] = _fast_encode() or _ENCODER.encode
#: a JSON-escaped NUL that is not itself an escaped backslash followed by "u0000"
_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

#: Keyword arguments of ``send()`` that configure the job rather than reach the handler.
SEND_OPTIONS = frozenset(
    {
        "delay",
        "priority",
        "unique_key",
        "idempotency_key",
        "conn",
        "queue",
        "max_attempts",
        "timeout",
        "backoff",
        "pinned_to",
        "run_at",
    }
)
#: the handler's parameters and result: ``Task[P, R]``, ``Job[R]``. Their
#: defaults (any parameters, any result) keep a bare ``Task`` or ``Job`` meaning
#: what it meant before the handles were generic.
P = ParamSpec("P", default=...)
R = TypeVar("R", default=Any)
_P = ParamSpec("_P")
_R = TypeVar("_R")


class SendOptions(TypedDict, total=False):
    """``SEND_OPTIONS`` with their types, for ``task.options(...)`` and
    ``send_many``: a type checker cannot mix them into ``send``'s keywords,
    which are the handler's."""

    delay: float | None
    priority: int | None
    unique_key: str | None
    idempotency_key: str | None
    #: a connection of the caller's (psycopg, sqlite3, PyMySQL, SQLAlchemy) to join its transaction
    conn: Any
    queue: str | None
    max_attempts: int | None
    timeout: float | None
    backoff: Backoff | dict[str, Any] | None
    pinned_to: Sequence[str] | str | None
    run_at: datetime | None
    #: ``task.options(tenant=...)`` only (a handler may have a ``tenant`` parameter)
    tenant: str | None


#: options of ``app.enqueue`` (by name) on top of SEND_OPTIONS: names a handler
#: may use as parameters, so they cannot be ``send()`` keywords. ``stage`` and
#: ``context`` start a multi-stage job at a stage, with a context (the HTTP API).
ENQUEUE_OPTIONS = frozenset({"tenant", "stage", "context"})


@dataclass(frozen=True)
class TaskDefaults:
    queue: str
    priority: int = 0
    max_attempts: int = 5
    timeout: float | None = None
    backoff: Backoff = field(default_factory=Backoff)
    retry_on: tuple[type[BaseException], ...] = (Exception,)
    concurrency_key: str | Callable[..., str] | None = None
    concurrency_limit: int | None = None
    rate_limit: str | None = None
    rate_burst: float | None = None
    rate_key: str | Callable[..., str] | None = None
    #: worker ids or tags, one of which a worker must have to run these jobs
    pinned_to: tuple[str, ...] | None = None
    #: decides per exception: Retry / Fail / Snooze / None (see conveyor.hooks)
    classify: Callable[..., Any] | None = None
    #: a parameter (or callable) whose value is the job's tenant
    tenant_key: str | Callable[..., str] | None = None

    @property
    def rate_per_s(self) -> float | None:
        return None if self.rate_limit is None else parse_rate(self.rate_limit)

    def __post_init__(self) -> None:
        if self.rate_limit is None and (self.rate_burst is not None or self.rate_key is not None):
            raise ConfigError("rate_burst and rate_key need a rate_limit, e.g. rate_limit='100/m'")
        if self.rate_limit is not None:
            parse_rate(self.rate_limit)
        if self.rate_burst is not None and (
            not isinstance(self.rate_burst, int | float) or self.rate_burst < 1
        ):
            raise ConfigError(f"rate_burst must be a number >= 1, got {self.rate_burst!r}")
        if (self.concurrency_key is None) != (self.concurrency_limit is None):
            raise ConfigError("concurrency_key and concurrency_limit go together: pass both")
        if self.concurrency_limit is not None and (
            not isinstance(self.concurrency_limit, int) or self.concurrency_limit < 1
        ):
            raise ConfigError(
                f"concurrency_limit must be an integer >= 1, got {self.concurrency_limit!r}"
            )
        _check_options(
            priority=self.priority,
            max_attempts=self.max_attempts,
            timeout=self.timeout,
            queue=self.queue,
        )
        bad = [
            r for r in self.retry_on if not (isinstance(r, type) and issubclass(r, BaseException))
        ]
        if bad:
            raise ConfigError(f"retry_on must hold exception classes, got {bad!r}")
        if self.classify is not None and not callable(self.classify):
            raise ConfigError(
                f"classify must be a function (exc, job) -> decision, got {self.classify!r}"
            )


def _check_options(**opts: Any) -> None:
    if "queue" in opts:
        check_name(opts["queue"], "a queue name")
    if "priority" in opts and (
        not isinstance(opts["priority"], int) or isinstance(opts["priority"], bool)
    ):
        raise ConfigError(
            f"priority must be an integer (higher runs first), got {opts['priority']!r}"
        )
    if "max_attempts" in opts and (
        not isinstance(opts["max_attempts"], int) or opts["max_attempts"] < 1
    ):
        raise ConfigError(f"max_attempts must be an integer >= 1, got {opts['max_attempts']!r}")
    timeout = opts.get("timeout")
    if timeout is not None and (not isinstance(timeout, int | float) or timeout <= 0):
        raise ConfigError(f"timeout must be a positive number of seconds or None, got {timeout!r}")
    delay = opts.get("delay")
    if delay is not None and (not isinstance(delay, int | float) or delay < 0):
        raise ConfigError(f"delay must be a number of seconds >= 0, got {delay!r}")
    stage = opts.get("stage")
    if stage is not None:
        check_name(stage, "stage")
    for key, longest in (
        ("unique_key", MAX_UNIQUE_KEY),
        ("idempotency_key", MAX_UNIQUE_KEY),
        ("tenant", MAX_LIMIT_KEY),
    ):
        if opts.get(key) is not None:
            check_name(opts[key], key, max_length=longest)
    run_at = opts.get("run_at")
    if run_at is not None:
        if not isinstance(run_at, datetime) or run_at.tzinfo is None:
            raise ConfigError(
                f"run_at must be a timezone-aware datetime (e.g. datetime.now(UTC)), got {run_at!r}"
            )
        if opts.get("delay"):
            raise ConfigError("pass delay= or run_at=, not both")


@dataclass(frozen=True)
class _Call:
    """Positional and keyword arguments of one job, for internal batch items."""

    args: Sequence[Any]
    kwargs: Mapping[str, Any]


def _pins(value: Sequence[str] | str | None) -> str | None:
    """``pinned_to`` as stored: a JSON list of worker ids and tags."""
    if value is None:
        return None
    pins = [value] if isinstance(value, str) else list(value)
    if not pins or not all(isinstance(p, str) and p for p in pins):
        raise ConfigError(f"pinned_to must be worker ids or tags (strings), got {value!r}")
    return json.dumps(sorted(set(pins)))


_PER = {"s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "hour": 3600.0}


def parse_rate(spec: str) -> float:
    """``"100/m"`` -> tokens per second. Units: s, m, h."""
    try:
        count, per = str(spec).replace(" ", "").split("/")
        rate = float(count) / _PER[per]
    except (ValueError, KeyError):
        raise ConfigError(
            f"rate_limit {spec!r} is not a rate: write it as COUNT/UNIT, e.g. '100/m', "
            "'5/s' or '1000/h'"
        ) from None
    if rate <= 0:
        raise ConfigError(f"rate_limit {spec!r} must be positive")
    return rate


def _callback_json(on_complete: Task | None) -> str | None:
    """A batch's ``on_complete`` task as the job template kept to call it, once
    its handler is known to take ``(batch_id, counts)``."""
    if on_complete is None:
        return None
    if not isinstance(on_complete, Task):
        raise ConfigError(f"on_complete must be a task, got {type(on_complete).__name__}")
    on_complete.check_args((0, {}), {})  # it will be called as (batch_id, counts)
    return json.dumps(on_complete.template()._asdict())


def encode_args(task: str, args: Sequence[Any], kwargs: Mapping[str, Any], limit: int) -> str:
    return encode_json(
        f"arguments of task {task!r}",
        {"args": list(args), "kwargs": dict(kwargs)},
        limit,
        arguments=True,
    )


def encode_json(what: str, value: Any, limit: int, *, arguments: bool = False) -> str:
    """``value`` as JSON text every database stores, at most ``limit`` characters
    and nested at most ``MAX_DEPTH`` deep; ``SerializationError`` (saying what to
    change) otherwise. ``arguments``: ``value`` is a job's arguments document
    (``{"args": [...], "kwargs": {...}}``): the limit is each argument's, two levels
    down, and an error names the argument (``args[1] of task 't'``)."""
    try:
        text: str = _ENCODE(value)
    except RecursionError:
        text = ""  # deeper than the encoder goes: the depth check names what
    except (TypeError, ValueError) as exc:
        raise SerializationError(
            f"{what} cannot be stored as JSON ({exc}); pass str, int, float, "
            "bool, None, lists and dicts, or convert the value first. Nothing was enqueued."
        ) from exc
    limit_here = MAX_DEPTH + 2 if arguments else MAX_DEPTH
    if not text or (len(text) > 2 * limit_here and may_nest_over(text, limit_here)):
        _check_depth(what, value, arguments)
        if not text:
            raise SerializationError(f"{what} cannot be stored as JSON (nested too deeply)")
    # Both checks are rare failures: a plain substring test (a C loop) and the
    # ASCII flag rule them out for almost every payload without a regex or an
    # encode per job.
    if ("\\u0000" in text and _NUL.search(text)) or not (text.isascii() or _encodable(text)):
        raise SerializationError(
            f"there is a NUL character or a lone surrogate in {what}, which "
            "a database cannot store as JSON text; remove it (or encode binary data, e.g. "
            "as base64). Nothing was enqueued."
        )
    if len(text) > limit:
        raise SerializationError(
            f"{what}: {len(text):,} bytes as JSON, over the "
            f"{limit:,}-byte limit (Conveyor(max_payload_bytes=...)); store large data elsewhere "
            "and pass a reference. Nothing was enqueued."
        )
    return text


def _check_depth(what: str, value: Any, arguments: bool) -> None:
    """``SerializationError`` naming the part of ``value`` nested deeper than
    ``MAX_DEPTH`` (see ``encode_json``), if one is."""
    if arguments:
        parts = argument_parts(value["args"], value["kwargs"], what.removeprefix("arguments"))
    else:
        parts = {what: value}
    try:
        check_depth(parts)
    except TooDeep as exc:
        raise SerializationError(
            f"{exc}: flatten the data, or store it elsewhere and pass a reference. "
            "Nothing was enqueued."
        ) from None


#: send_many encodes and hands over this many jobs at a time when nothing needs
#: to see them all first, so that PostgreSQL writes one chunk while the next is
#: encoded. 25 to 500 enqueued within run-to-run noise of each other on the
#: 2-core bench machine (about 52-65k jobs/s in 1,000-job calls), one statement
#: for the whole call 51k.
STREAM_CHUNK = 100


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _no_handler(*args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("this task has no handler in this process")


class TaskApp(JobApp, BatchApp, Protocol):
    """What a Task calls on its app (``Conveyor`` is one): where its jobs and
    batches are written, and what the handles it returns call in turn."""

    @property
    def max_payload_bytes(self) -> int: ...

    @property
    def middleware(self) -> Sequence[Middleware]: ...

    def cached_task_settings(self) -> Mapping[str, TaskSettings]: ...

    def insert_jobs(
        self, inserts: Sequence[JobInsert], *, conn: Any = None, payloads: Payloads | None = None
    ) -> list[Job]: ...

    def insert_stream(
        self, chunks: Iterable[tuple[Sequence[JobInsert], Payloads]]
    ) -> list[Job]: ...

    def create_batch(
        self,
        *,
        name: str | None,
        task: str,
        idempotency_key: str | None,
        on_complete_json: str | None,
        jobs: Sequence[JobInsert],
        conn: Any = None,
        fingerprint: str | None = None,
    ) -> tuple[int, bool]: ...

    def create_batch_stream(
        self,
        *,
        name: str | None,
        task: str,
        on_complete_json: str | None,
        total: int,
        chunks: Callable[[int], Iterable[Sequence[JobInsert]]],
    ) -> int: ...


class TaskDecorator(Protocol):
    """What ``@app.task(...)`` returns: a decorator that makes a typed ``Task``;
    an async handler's result type is what its coroutine returns."""

    @overload
    def __call__(self, fn: Callable[_P, Awaitable[_R]], /) -> Task[_P, _R]: ...

    @overload
    def __call__(self, fn: Callable[_P, _R], /) -> Task[_P, _R]: ...


class Task(Generic[P, R]):
    """A registered handler. Call it directly to run it in-process; ``send`` to enqueue.

    ``fn=None`` makes a stand-in for a task that has no handler in this process
    (another app's workers, or remote ones, run it): arguments are not checked."""

    def __init__(
        self, app: TaskApp, fn: Callable[..., Any] | None, name: str, defaults: TaskDefaults
    ):
        self.app = app
        self.fn = fn if fn is not None else _no_handler
        self.local = fn is not None
        self.name = name
        self.defaults = defaults
        self.is_async = inspect.iscoroutinefunction(fn)
        self.signature = inspect.signature(self.fn)
        for option in ("concurrency_key", "rate_key", "tenant_key"):
            key = getattr(defaults, option)
            if isinstance(key, str) and key not in self.signature.parameters:
                params = ", ".join(self.signature.parameters) or "none"
                raise ConfigError(
                    f"{option} {key!r} of task {name!r} is not one of its parameters "
                    f"({params}); name one, or pass a callable"
                )
        clash = SEND_OPTIONS & set(self.signature.parameters)
        if clash:
            raise ConfigError(
                f"task {name!r} has parameter(s) {sorted(clash)} with the same name as send() "
                f"options; rename them (the send() options are {sorted(SEND_OPTIONS)})"
            )
        plain = all(p.kind is p.POSITIONAL_OR_KEYWORD for p in self.signature.parameters.values())
        required = sum(p.default is p.empty for p in self.signature.parameters.values())
        self._arity = (required, len(self.signature.parameters)) if plain else None
        self.__doc__ = self.fn.__doc__
        self.__name__ = getattr(self.fn, "__name__", name)

    def __repr__(self) -> str:
        return f"<Task {self.name} queue={self.defaults.queue}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Any:
        return self.fn(*args, **kwargs)

    # -- building inserts ------------------------------------------------------------
    def build(self, args: Sequence[Any], kwargs: Mapping[str, Any], **options: Any) -> JobInsert:
        """Validate arguments and options; encode them. Raises before anything is written."""
        return self._build(args, kwargs, self.template(**options))

    def template(self, **options: Any) -> JobInsert:
        """The job every call with these options creates, minus its arguments: options
        are checked once per ``send_many``, not once per item. With no options it
        is the same every time (the defaults are frozen), so it is made once (a
        plain ``build``: 4.7 -> 2.4 us)."""
        return self._bare if not options else self._template(options)

    @functools.cached_property
    def _bare(self) -> JobInsert:
        """The template of a call with no options (``template()``), made once."""
        return self._template({})

    def _template(self, options: dict[str, Any]) -> JobInsert:
        unknown = set(options) - SEND_OPTIONS - ENQUEUE_OPTIONS - {"conn"}
        if unknown:
            raise ConfigError(f"unknown send option(s) {sorted(unknown)} for task {self.name!r}")
        _check_options(**{k: v for k, v in options.items() if v is not None})
        d = self.defaults
        backoff = Backoff.coerce(options.get("backoff"))
        delay = float(options.get("delay") or 0.0)
        if options.get("run_at") is not None:
            delay = max(0.0, (options["run_at"] - datetime.now(UTC)).total_seconds())
        # Options given here win over per-task-type settings, now and when the
        # settings change later (app.insert_jobs applies them to the others).
        explicit = (
            (EXPLICIT_MAX_ATTEMPTS if options.get("max_attempts") is not None else 0)
            | (EXPLICIT_TIMEOUT if options.get("timeout") is not None else 0)
            | (EXPLICIT_BACKOFF if backoff else 0)
        )
        context = options.get("context")
        return JobInsert(
            queue=options.get("queue") or d.queue,
            task=self.name,
            args_json="",
            priority=d.priority if options.get("priority") is None else options["priority"],
            max_attempts=options.get("max_attempts") or d.max_attempts,
            delay_s=delay,
            tenant=options.get("tenant"),
            timeout_s=options.get("timeout") or d.timeout,
            backoff_json=json.dumps(backoff.to_dict()) if backoff else None,
            unique_key=options.get("unique_key"),
            idempotency_key=options.get("idempotency_key"),
            pinned_to=_pins(options.get("pinned_to") or d.pinned_to),
            stage=options.get("stage"),
            context_json=None
            if context is None
            else encode_json(
                f"the context of task {self.name!r}", context, self.app.max_payload_bytes
            ),
            explicit=explicit,
        )

    def check_args(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> None:
        """Raise ``BadArguments`` unless the handler accepts these arguments (a task
        with no handler here accepts any)."""
        if self.local and not self._fits(args, kwargs):
            try:
                self.signature.bind(*args, **kwargs)
            except TypeError as exc:
                hint = ""
                options = sorted(ENQUEUE_OPTIONS & set(kwargs) - set(self.signature.parameters))
                if options:
                    # not send() options (a handler may take arguments of those names)
                    hint = (
                        f" ({options[0]!r} is an option of options(), not of send():"
                        f" {self.name.rsplit('.', 1)[-1]}.options({options[0]}=...).send(...))"
                    )
                raise BadArguments(f"bad arguments for task {self.name!r}: {exc}{hint}") from None

    def _build(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], template: JobInsert
    ) -> JobInsert:
        self.check_args(args, kwargs)
        encoded = encode_args(self.name, args, kwargs, self.app.max_payload_bytes)
        d = self.defaults
        if d.concurrency_key is None and d.rate_limit is None and d.tenant_key is None:
            return template.with_args(encoded)
        limits: dict[str, Any] = {}
        if d.tenant_key is not None and template.tenant is None:
            what = f"the tenant of a job of task {self.name!r} (tenant_key)"
            tenant = self._value(d.tenant_key, args, kwargs)
            limits["tenant"] = check_name(tenant, what, max_length=MAX_LIMIT_KEY)
        if d.concurrency_key is not None:
            limits.update(
                concurrency_key=self._key(d.concurrency_key, args, kwargs),
                concurrency_limit=d.concurrency_limit,
            )
        if d.rate_limit is not None:
            rate = parse_rate(d.rate_limit)
            key = f"task={self.name}" if d.rate_key is None else self._key(d.rate_key, args, kwargs)
            # Default burst: one second's worth (at least 1), so a worker polling at
            # most once a second never lets tokens overflow and go to waste.
            limits.update(rate_key=key, rate_per_s=rate, rate_burst=d.rate_burst or max(1.0, rate))
        return template._replace(args_json=encoded, **limits)

    def _key(
        self, spec: str | Callable[..., str], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> str:
        """A limit's key: ``"<param>=<value>"`` for a parameter name, or what a
        callable of the job's arguments returns."""
        if callable(spec):
            what = f"what a key function of task {self.name!r} returns"
            return check_name(spec(*args, **kwargs), what, max_length=MAX_LIMIT_KEY)
        what = f"a limit key of task {self.name!r} (from its parameter {spec!r})"
        key = f"{spec}={self._value(spec, args, kwargs)}"
        return check_name(key, what, max_length=MAX_LIMIT_KEY)

    def _value(
        self, spec: str | Callable[..., str], args: Sequence[Any], kwargs: Mapping[str, Any]
    ) -> str:
        """The value of parameter ``spec`` in this call (or what a callable returns)."""
        if callable(spec):
            return self._key(spec, args, kwargs)
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        return str(bound.arguments[spec])

    def _inserts(
        self,
        items: Iterable[Sequence[Any] | Mapping[str, Any] | _Call],
        template: JobInsert,
        start: int = 0,
    ) -> tuple[list[JobInsert], list[tuple[Sequence[Any], Mapping[str, Any]]]]:
        inserts, payloads = [], []
        for n, item in enumerate(items, start):
            args: Sequence[Any]
            kwargs: Mapping[str, Any]
            if type(item) is tuple:  # the common item, before the slower ABC checks
                args, kwargs = item, {}
            elif isinstance(item, _Call):
                args, kwargs = item.args, item.kwargs
            elif isinstance(item, Mapping):
                args, kwargs = (), item
            elif isinstance(item, list | tuple):
                args, kwargs = item, {}
            else:
                raise TypeError(
                    f"item {n} for task {self.name!r} is a {type(item).__name__}: pass a tuple "
                    "of positional arguments (e.g. [(1,), (2,)]) or a dict of kwargs"
                )
            try:
                inserts.append(self._build(args, kwargs, template))
            except (BadArguments, SerializationError) as exc:
                # which of (maybe) thousands of items: the message alone does not say
                raise type(exc)(f"item {n}: {exc}") from exc.__cause__
            payloads.append((args, kwargs))
        return inserts, payloads

    def _fits(self, args: Sequence[Any], kwargs: Mapping[str, Any]) -> bool:
        """Fast yes for the common call (positional arguments only, plain signature);
        anything else goes through ``Signature.bind``, which also words the error."""
        if kwargs or self._arity is None:
            return False
        return self._arity[0] <= len(args) <= self._arity[1]

    def _split(self, kwargs: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """The handler's keywords (``P.kwargs`` to a type checker, which never sees
        options among them) and the send options."""
        options = {k: kwargs.pop(k) for k in list(kwargs) if k in SEND_OPTIONS}
        return kwargs, options

    # -- enqueueing ---------------------------------------------------------------------
    def send(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        """Enqueue one job. Keyword arguments named in ``SEND_OPTIONS`` configure the job
        (``delay``, ``priority``, ``unique_key``, ``idempotency_key``, ``conn``, ...);
        the rest go to the handler.

        An ``idempotency_key`` seen before returns the job it named (``created`` is
        False); sent with other arguments it raises ``KeyReused`` and writes
        nothing, as ``POST /v1/jobs`` answers 422 (options and ``sensitive``
        arguments are not compared)."""
        kwargs, options = self._split(kwargs)
        return self._send(args, kwargs, options)

    def _send(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], options: dict[str, Any]
    ) -> Job[R]:
        conn = options.pop("conn", None)
        insert = self.build(args, kwargs, **options)
        return self.app.insert_jobs([insert], conn=conn, payloads=[(args, kwargs)])[0]

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Step:
        """A call to make later, for chains: ``chain(a.s(1), b.s(), c.s(x=2))``. Send
        options (``queue``, ``priority``, ...) among the keyword arguments apply to it."""
        kwargs, options = self._split(kwargs)
        options.pop("conn", None)
        self.template(**options)  # options are checked now, not when the step runs
        return Step(self, tuple(args), kwargs, options)

    def batch(
        self,
        items: Iterable[Sequence[Any] | Mapping[str, Any] | _Call],
        *,
        name: str | None = None,
        idempotency_key: str | None = None,
        on_complete: Task | None = None,
        conn: Any = None,
        distinct_workers: bool = False,
        **options: Any,
    ) -> Batch:
        """Create a batch: the batch row and one job per item, in one transaction.

        ``on_complete`` is a task called as ``on_complete(batch_id, counts)`` exactly
        once when the batch closes. An ``idempotency_key`` seen before returns the
        existing batch and writes nothing, if that batch was asked for by the same
        call (task, items, name, callback, options); for a different one it raises
        ``KeyReused`` (a ``ConfigError``): a key names one batch. ``conn`` joins
        the caller's transaction.
        """
        if options.get("unique_key") or options.get("idempotency_key"):
            raise ConfigError(
                "batch items cannot share one unique_key/idempotency_key; "
                "pass idempotency_key= for the batch itself"
            )
        _check_options(idempotency_key=idempotency_key)
        if name is not None:
            check_name(name, "a batch name")
        callback = _callback_json(on_complete)
        template = self.template(**options)
        if distinct_workers:  # each job of this batch on a different worker
            template = template._replace(spread_group=f"batch:{uuid.uuid4().hex}")
        if (
            conn is None
            and idempotency_key is None
            and not self.app.middleware
            and self._plain(template)
        ):
            return self._stream_batch(list(items), template, name, callback)
        inserts, _ = self._inserts(items, template)
        fingerprint = None
        if idempotency_key is not None:
            asked = {
                "name": name,
                "on_complete": None if on_complete is None else on_complete.name,
                "distinct_workers": distinct_workers,
                "options": options,
            }
            fingerprint = batch_fingerprint(self.name, asked, inserts)
        batch_id, created = self.app.create_batch(
            name=name,
            task=self.name,
            idempotency_key=idempotency_key,
            on_complete_json=callback,
            jobs=inserts,
            conn=conn,
            fingerprint=fingerprint,
        )
        if conn is not None and created:
            # not committed yet: the batch is only visible inside the caller's transaction
            return self._uncommitted_batch(batch_id, name, len(inserts), idempotency_key)
        batch = Batch(self.app.get_batch(batch_id).record, created, self.app)
        if not created and fingerprint is not None:
            check_same_batch(batch, fingerprint, self.name, len(inserts))
        return batch

    def _stream_batch(
        self, listed: list[Any], template: JobInsert, name: str | None, callback: str | None
    ) -> Batch:
        """No keys, no limits, no hooks: the jobs are made in chunks once the
        batch row is written (with its id), and the backend may write one
        while the next is made (PostgreSQL: COPY)."""

        def chunks(batch_id: int) -> Iterator[list[JobInsert]]:
            made = template._replace(batch_id=batch_id)
            return (inserts for inserts, _ in self._chunks(listed, made))

        batch_id = self.app.create_batch_stream(
            name=name,
            task=self.name,
            on_complete_json=callback,
            total=len(listed),
            chunks=chunks,
        )
        return Batch(self.app.get_batch(batch_id).record, True, self.app)

    def _uncommitted_batch(
        self, batch_id: int, name: str | None, total: int, idempotency_key: str | None
    ) -> Batch:
        """The handle of a batch written in the caller's transaction, not committed
        yet: built from what was sent, as no other connection can read it back."""
        record = BatchRecord(
            id=batch_id,
            name=name,
            task=self.name,
            total=total,
            state=BatchState.RUNNING,
            idempotency_key=idempotency_key,
            on_complete=None,
            closings=0,
            counts=None,
            created_at=datetime.now(UTC),
            finished_at=None,
            cancelled_at=None,
        )
        return Batch(record, True, self.app)

    def send_distinct(self, n: int, *args: P.args, **kwargs: P.kwargs) -> Batch:
        """Run the same call on ``n`` different workers (a broadcast, a redundant
        check): a batch of ``n`` jobs no two of which run on the same worker. It
        succeeds when all ``n`` have succeeded (``batch.wait()``, ``on_complete``)."""
        if not isinstance(n, int) or n < 1:
            raise ConfigError(f"send_distinct needs n >= 1 workers, got {n!r}")
        kwargs, options = self._split(kwargs)
        return self.batch(
            [_Call(args, kwargs)] * n,
            name=f"{self.name} on {n} workers",
            distinct_workers=True,
            **options,
        )

    async def asend(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        """``send`` for async code: the database call runs in a thread, or with an
        async SQLAlchemy ``conn=`` (``AsyncSession``, ``AsyncConnection``) inside its
        ``run_sync``, in the transaction it has open (see ``conveyor.connections``)."""
        conn = kwargs.pop("conn", None)
        send: Any = self.send  # (conn= is an option, not one of the handler's keywords)
        return cast(
            "Job[R]",
            await call_with(
                conn, lambda c: send(*args, conn=c, **kwargs), warm=self.app.cached_task_settings
            ),
        )

    async def asend_many(
        self, items: Iterable[Sequence[Any] | Mapping[str, Any]], **options: Unpack[SendOptions]
    ) -> list[Job[R]]:
        """``send_many`` for async code: encoding and the database call run in a
        thread (or, with an async SQLAlchemy ``conn=``, inside its ``run_sync``)."""
        conn = options.pop("conn", None)
        send_many: Any = self.send_many
        return cast(
            "list[Job[R]]",
            await call_with(
                conn,
                lambda c: send_many(items, conn=c, **options),
                warm=self.app.cached_task_settings,
            ),
        )

    async def abatch(
        self,
        items: Iterable[Sequence[Any] | Mapping[str, Any]],
        *,
        name: str | None = None,
        idempotency_key: str | None = None,
        on_complete: Task | None = None,
        conn: Any = None,
        distinct_workers: bool = False,
        **options: Any,
    ) -> Batch:
        """``batch`` for async code: encoding and the database calls run in a
        thread (or, with an async SQLAlchemy ``conn=``, inside its ``run_sync``)."""

        def batch(c: Any) -> Batch:
            return self.batch(
                items,
                name=name,
                idempotency_key=idempotency_key,
                on_complete=on_complete,
                conn=c,
                distinct_workers=distinct_workers,
                **options,
            )

        return await call_with(conn, batch, warm=self.app.cached_task_settings)

    def options(self, **options: Unpack[SendOptions]) -> Sender[P, R]:
        """This task's sends with these options: ``add.options(priority=5,
        conn=conn).send(1, 2)``. The typed way to pass them: a type checker reads
        ``send``'s keywords as the handler's (at run time ``send(1, 2, priority=5)``
        works the same). The options are checked now."""
        given = {k: v for k, v in options.items() if k != "conn"}
        self.template(**given)
        return Sender(self, dict(options))

    def send_many(
        self, items: Iterable[Sequence[Any] | Mapping[str, Any]], **options: Unpack[SendOptions]
    ) -> list[Job[R]]:
        """Enqueue many jobs in one transaction and one statement. Each item is a tuple of
        positional arguments (or a dict of keyword arguments); ``options`` apply to all."""
        conn = options.pop("conn", None)
        if options.get("unique_key") or options.get("idempotency_key"):
            raise ConfigError("send_many cannot share one unique_key/idempotency_key across jobs")
        template = self.template(**options)
        # Listed first: the stream takes its chunks while the backend holds a
        # connection, and an iterator of the caller's might use the database.
        items = list(items)
        if conn is None and self._plain(template) and len(items) > STREAM_CHUNK:
            # No keys to resolve, no limits: the jobs go out in chunks, and the
            # backend may write one while the next is encoded.
            return self.app.insert_stream(self._chunks(items, template))
        inserts, payloads = self._inserts(items, template)
        return self.app.insert_jobs(inserts, conn=conn, payloads=payloads)

    def _plain(self, template: JobInsert) -> bool:
        """Jobs of this template need no keys resolved and no limits respected:
        they may be written as a stream (``_chunks``). Nor a tenant function: the
        stream makes its jobs while the backend holds a connection, and code of
        the caller's may use the database (a second connection, which a pool
        whose every connection is held so never gives)."""
        d = self.defaults
        return (
            not template.limited
            and d.concurrency_key is None
            and not d.rate_limit
            and not callable(d.tenant_key)
        )

    def _chunks(
        self, items: Iterable[Sequence[Any] | Mapping[str, Any] | _Call], template: JobInsert
    ) -> Iterator[tuple[list[JobInsert], list[tuple[Sequence[Any], Mapping[str, Any]]]]]:
        """``items`` encoded ``STREAM_CHUNK`` at a time."""
        it = iter(items)
        start = 0
        while part := list(itertools.islice(it, STREAM_CHUNK)):
            yield self._inserts(part, template, start)
            start += len(part)


class Sender(Generic[P, R]):
    """``task.options(...)``: the task's sends, each with the same options."""

    def __init__(self, task: Task[P, R], options: dict[str, Any]) -> None:
        self.task = task
        self.options = options

    def __repr__(self) -> str:
        return f"<Sender {self.task.name} {self.options}>"

    def send(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        """``task.send`` with these options (``tenant`` among them: not a keyword of
        ``send``, where a handler's parameter may have that name)."""
        handler_kwargs, options = self.task._split(dict(kwargs))
        return self.task._send(args, handler_kwargs, {**self.options, **options})

    async def asend(self, *args: P.args, **kwargs: P.kwargs) -> Job[R]:
        """``task.asend`` with these options (an async SQLAlchemy ``conn`` among them)."""
        handler_kwargs, options = self.task._split(dict(kwargs))
        options = {**self.options, **options}
        conn = options.pop("conn", None)
        task = self.task
        return await call_with(
            conn,
            lambda c: task._send(args, handler_kwargs, {**options, "conn": c}),
            warm=task.app.cached_task_settings,
        )

    def s(self, *args: P.args, **kwargs: P.kwargs) -> Step:
        """``task.s`` with these options, for chains (``conn`` is the chain's own)."""
        s: Callable[..., Step] = self.task.s
        return s(*args, **{**self.options, **kwargs})


@dataclass(frozen=True)
class Step:
    """A task call to make later: ``task.s(*args, **kwargs)``. In a chain, every step
    after the first receives the previous step's result as its first argument."""

    task: Task
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)

    def check(self, *, receives_result: bool) -> None:
        """Arguments must fit the handler, and be storable (a later step's are kept
        with the chain's first job until it runs), now, not when the step finally runs."""
        self.task.check_args((None, *self.args) if receives_result else self.args, self.kwargs)
        encode_args(self.task.name, self.args, self.kwargs, self.task.app.max_payload_bytes)

    def to_dict(self) -> dict[str, Any]:
        template = self.task.template(**self.options)._asdict()
        template.pop("args_json")
        return {**template, "args": list(self.args), "kwargs": dict(self.kwargs)}
