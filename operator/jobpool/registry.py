"""Plug-ins by name: job kinds (`@jobpool.kind`), maintenance steps (`@cleanup_step`) and
attachment fetchers (`jobpool.register_fetcher`), held by a `Registry`.

The module-level decorators fill `REGISTRY`, the one `jobpool run` and `jobpool.testing` use
unless given another; a worker hands its registry to its handlers (`job.context.registry`).
A test that wants isolation makes a `Registry()` (or `REGISTRY.copy()`) and registers with
its methods of the same names.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

import msgspec
from psycopg import AsyncConnection

from jobpool.core.kinds import BUILTIN_KINDS, KindDefaults, check_kind_name, kind_defaults
from jobpool.errors import InvalidPayloadError, UnknownKindError
from jobpool.extras import missing_modules
from jobpool.payloads import decode_payload

if TYPE_CHECKING:  # a Job carries its worker's registry in its context
    from jobpool.job import Job

Handler = Callable[["Job", AsyncConnection[Any]], Awaitable[Mapping[str, Any] | None]]
"""`async def handler(job, tx)`; may return a JSON-able mapping stored as the job's result."""

Step = Callable[[AsyncConnection[Any]], Awaitable[dict[str, int]]]
"""`async def step(tx) -> {counter: n}`: a periodic maintenance step, in its own transaction."""

Fetcher = Callable[[str], AsyncIterator[bytes]]
"""`fetch(uri)` → the object's bytes in chunks (an attachment's storage URI)."""

ENTRY_POINT_GROUP = "jobpool.kinds"


@dataclass(frozen=True)
class KindSpec:
    """A registered kind: its handler (which decodes a typed payload first), its defaults and
    its payload model (None: the payload reaches the handler as decoded JSON)."""

    name: str
    handler: Handler
    defaults: KindDefaults
    payload: type[msgspec.Struct] | None = None


class Registry:
    """Kinds by name, maintenance steps by name and attachment fetchers by URI scheme.

    Registering a name (or scheme) again replaces the earlier entry, so that importing a
    module twice changes nothing.
    """

    def __init__(self) -> None:
        self._kinds: dict[str, KindSpec] = {}
        self._steps: dict[str, Step] = {}
        self._fetchers: dict[str, Fetcher] = {}

    def copy(self) -> Registry:
        """A registry holding what this one holds now; later registrations stay apart."""
        other = Registry()
        other._kinds.update(self._kinds)
        other._steps.update(self._steps)
        other._fetchers.update(self._fetchers)
        return other

    # -- kinds

    def kind(
        self,
        name: str,
        *,
        priority: int | None = None,
        max_attempts: int | None = None,
        stale_ttl: float | None = None,
        timeout: float | None = None,
        backoff_base: float | None = None,
        backoff_max: float | None = None,
        backoff_jitter: float | None = None,
        payload: type[msgspec.Struct] | None = None,
    ) -> Callable[[Handler], Handler]:
        """Register `async def handler(job, tx)` as the handler of job kind `name`.

        The options are the kind's defaults, declared here once: `jobpool migrate` and every
        worker write priority, max_attempts and stale_ttl to `mdm.aa_job_kind`. Unset options
        take the generic ones (`jobpool.core.kinds.KindDefaults`). Units: stale_ttl, timeout,
        backoff_base and backoff_max in seconds; backoff_jitter a fraction 0..1. `payload`, a
        `msgspec.Struct` subclass, types the payload (`jobpool.payloads`): the handler receives
        `job.payload` as its instance, and a payload that does not match goes to the DLQ
        before the handler runs. Raises ValueError for a bad name or value, and TypeError when
        the decorated handler is not an `async def` function or `payload` is not a Struct.
        """
        check_kind_name(name)
        defaults = kind_defaults(name, priority=priority, max_attempts=max_attempts,
                                 stale_ttl=stale_ttl, timeout=timeout, backoff_base=backoff_base,
                                 backoff_max=backoff_max, backoff_jitter=backoff_jitter)

        if payload is not None and not (
                isinstance(payload, type) and issubclass(payload, msgspec.Struct)):
            raise TypeError(f"the payload of job kind {name!r} must be a msgspec.Struct "
                            f"subclass, got {payload!r}")

        def register(handler: Handler) -> Handler:
            if not inspect.iscoroutinefunction(handler):
                raise TypeError(
                    f"the handler of job kind {name!r} must be an `async def` function, "
                    f"got {handler!r}"
                )
            runs = handler if payload is None else _decoding(name, payload, handler)
            self.add(KindSpec(name, runs, defaults, payload))
            return handler

        return register

    def add(self, spec: KindSpec) -> None:
        """Register `spec`, replacing an earlier registration of the same handler (its module
        imported again). Raises ValueError when another handler has the name (a module of
        yours declaring a built-in kind's name, or two modules one name): one would silently
        replace the other, and its defaults those the database holds for the kind."""
        known = self._kinds.get(spec.name)
        if known is not None and _origin(known.handler) != _origin(spec.handler):
            raise ValueError(
                f"job kind {spec.name!r} is registered already, by {_origin(known.handler)}; "
                f"{_origin(spec.handler)} registers it again: a kind's name names one handler "
                "(choose another name)")
        self._kinds[spec.name] = spec

    def get(self, name: str) -> KindSpec:
        """The kind called `name`; raises UnknownKindError."""
        try:
            return self._kinds[name]
        except KeyError:
            raise UnknownKindError(name) from None

    def find(self, name: str) -> KindSpec | None:
        """The kind called `name`, or None when this registry does not hold it."""
        return self._kinds.get(name)

    def names(self) -> tuple[str, ...]:
        return tuple(sorted(self._kinds))

    def payload_problem(self, name: str, payload: Any) -> str | None:
        """Why kind `name`'s payload model refuses `payload` (the InvalidPayloadError's
        message), or None: accepted, or the kind has no model (or is not registered here)."""
        spec = self._kinds.get(name)
        if spec is None or spec.payload is None:
            return None
        try:
            decode_payload(name, spec.payload, payload)
        except InvalidPayloadError as exc:
            return str(exc)
        return None

    def specs(self) -> tuple[KindSpec, ...]:
        return tuple(self._kinds[name] for name in self.names())

    # -- maintenance steps

    def cleanup_step(self, name: str) -> Callable[[Step], Step]:
        """Register `async def step(tx) -> {counter: n}` to run every maintenance period
        (and in every `cleanup_jobs` job), under `name` in the logs."""

        def register(step: Step) -> Step:
            self._steps[name] = step
            return step

        return register

    def steps(self) -> tuple[tuple[str, Step], ...]:
        """The maintenance steps by name, in the order they were first registered."""
        return tuple(self._steps.items())

    # -- attachment fetchers

    def register_fetcher(self, scheme: str, fetcher: Fetcher) -> None:
        """Stream attachment URIs of `scheme` (e.g. "s3") with `fetcher`, replacing an earlier
        one and the built-in fetcher of that scheme (`file`, `https`)."""
        self._fetchers[scheme.lower()] = fetcher

    def fetchers(self) -> Mapping[str, Fetcher]:
        """The registered fetchers by lower-case scheme (read-only)."""
        return MappingProxyType(self._fetchers)


REGISTRY = Registry()
"""The registry the module-level decorators fill: what this process imported."""

kind = REGISTRY.kind
cleanup_step = REGISTRY.cleanup_step
register_fetcher = REGISTRY.register_fetcher


def _decoding(name: str, model: type[msgspec.Struct], handler: Handler) -> Handler:
    """`handler`, given `job.payload` decoded as `model`; InvalidPayloadError (permanent)
    before it runs when the payload does not match."""

    @functools.wraps(handler)  # named as the handler (`_origin`, tracebacks)
    async def decoded(job: Job, tx: AsyncConnection[Any]) -> Mapping[str, Any] | None:
        return await handler(replace(job, payload=decode_payload(name, model, job.payload)), tx)

    return decoded


def load_kind_modules(modules: Iterable[str] = ()) -> Registry:
    """Import the kinds of the `jobpool.kinds` entry points, then `modules`; return REGISTRY.

    The built-in kinds are left out where the worker extra is missing: their handlers need
    it, no process of this install can run them, and a worker registers them. Raises
    ImportError naming the module that failed (also for a name that is not a module name,
    such as a path, and for any error the module raised while imported, a `sys.exit()`
    included).
    """
    builtins = not missing_modules("worker")
    for point in entry_points(group=ENTRY_POINT_GROUP):
        if builtins or point.name not in BUILTIN_KINDS:
            point.load()
    for module in modules:
        if not MODULE_NAME.fullmatch(module):
            raise ImportError(f"cannot import kind module {module!r}: not a module name "
                              "(dotted Python identifiers, e.g. mykinds or mypackage.kinds; "
                              "a file path is not one)")
        try:
            importlib.import_module(module)
        except (Exception, SystemExit) as exc:  # ImportError, or what the module raised:
            # a sys.exit() in it would end the command quietly, with its status
            raise ImportError(f"cannot import kind module {module!r}: "
                              f"{type(exc).__name__}: {exc}") from exc
    return REGISTRY


def _origin(handler: Handler) -> str:
    """`module.qualname` of a registered handler, through wrappers that name what they wrap
    (a payload model's decoding wrapper, `functools.wraps` decorators); for a callable
    without those names (a `functools.partial`), the object itself."""
    inner = inspect.unwrap(handler)
    module, name = getattr(inner, "__module__", None), getattr(inner, "__qualname__", None)
    if module is None or name is None:
        return f"{type(inner).__name__} object at {id(inner):#x}"
    return f"{module}.{name}"


MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", re.ASCII)
"""What `--import` takes: an absolute, dotted module name."""


def builtin_kinds() -> tuple[KindSpec, ...]:
    """The built-in kinds as their declarations state them, by name.

    () where the worker extra is missing: their modules need it, and a worker registers them
    when it starts.
    """
    if missing_modules("worker"):
        return ()
    for point in entry_points(group=ENTRY_POINT_GROUP):
        if point.name in BUILTIN_KINDS:
            point.load()
    return tuple(REGISTRY.get(name) for name in sorted(BUILTIN_KINDS))
