"""Bounded load runners: closed-loop users (``closed_loop``), open-loop Poisson arrivals (``open_loop``), and
``BackgroundLoad``, either of them on its own thread for sync code, shaped by a ``LoadShape`` and counted in a
``LoadTally``. Load goes to this machine only unless the caller allows otherwise (``check_target``); the open-files
limit is raised for one socket per user."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import ipaddress
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from llmdiag.client.endpoint import normalise_base_url, redact_url
from llmdiag.client.openai import ClientOptions, OpenAIClient
from llmdiag.client.result import RequestFactory, RequestPlan, RequestResult, ResultCallback, _monotonic
from llmdiag.errors import UsageError, option

try:  # not on every platform
    import resource
except ImportError:  # pragma: no cover
    HAS_RESOURCE = False
else:
    HAS_RESOURCE = True

DEFAULT_ERROR_BACKOFF_SECONDS = 0.1
MAX_RETRY_AFTER_SECONDS = 1.0  # a runner honours Retry-After up to this; a load run is short
OPEN_FILES_MARGIN = 64  # sockets beyond one per user: the event loop, logs, the pool's spares


LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost")


def is_loopback(base_url: str) -> bool:
    host = (urlsplit(normalise_base_url(base_url)).hostname or "").lower()
    if host in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_target(base_url: str, allow_remote: bool) -> None:
    """Load goes to this machine only, unless the user says otherwise: a load run against someone's production
    server by a typo is the accident to prevent."""
    if not allow_remote and not is_loopback(base_url):
        raise UsageError(
            f"refusing to send load to {redact_url(base_url)}: it is not this machine",
            f"pass {option('allow_remote')} (allow_remote=True) to load a server on another machine",
        )


def raise_open_files_limit(wanted: int) -> int:
    """Raise this process's soft limit on open files toward ``wanted`` (never above the hard limit, never down).
    Returns the soft limit in force; one socket per user needs it on machines whose default soft limit is 1024."""
    if not HAS_RESOURCE:  # pragma: no cover
        return wanted
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return wanted if soft == resource.RLIM_INFINITY else soft
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target


async def _next_plan(request_factory: RequestFactory) -> RequestPlan:
    plan = request_factory()
    if inspect.isawaitable(plan):
        plan = await plan
    if not isinstance(plan, RequestPlan):
        raise TypeError(f"the request factory returned {type(plan).__name__}, not a RequestPlan")
    return plan


def _backoff_seconds(result: RequestResult, base_seconds: float) -> float:
    if result.retry_after_seconds is not None:
        return min(max(result.retry_after_seconds, base_seconds), max(MAX_RETRY_AFTER_SECONDS, base_seconds))
    return base_seconds


class _Run:
    """What a runner shares between its tasks: the caps, the results, the requests in flight."""

    def __init__(
        self,
        client: OpenAIClient,
        request_factory: RequestFactory,
        duration_seconds: float,
        max_requests: int | None,
        on_result: ResultCallback | None,
        keep_results: bool,
        allow_remote: bool,
    ) -> None:
        check_target(client.base_url, allow_remote)
        if not duration_seconds > 0 or math.isinf(duration_seconds):
            raise UsageError(f"duration_seconds must be positive and finite, got {duration_seconds!r}")
        if max_requests is not None and max_requests < 0:
            raise UsageError(f"max_requests must be 0 or more, got {max_requests}")
        self.client = client
        self.request_factory = request_factory
        self.deadline = _monotonic() + duration_seconds
        self.max_requests = max_requests
        self.on_result = on_result
        self.keep_results = keep_results
        self.claimed = 0
        self.results: list[RequestResult] = []

    def claim(self) -> bool:
        if _monotonic() >= self.deadline or (self.max_requests is not None and self.claimed >= self.max_requests):
            return False
        self.claimed += 1
        return True

    async def send(self, plan: RequestPlan) -> RequestResult:
        result = self.client.new_result(plan.request_id)
        try:
            await self.client.execute(plan, result)
        except asyncio.CancelledError:  # at the deadline: the result says "cancelled", with what had arrived
            self.record(result)
            raise
        self.record(result)
        return result

    def record(self, result: RequestResult) -> None:
        if self.keep_results:
            self.results.append(result)
        if self.on_result is not None:
            self.on_result(result)

    async def wait(self, tasks: set[asyncio.Task[Any]]) -> list[RequestResult]:
        """Until every task ends or the deadline; then cancel what is left (recorded as "cancelled")."""
        try:
            while tasks:
                remaining = self.deadline - _monotonic()
                if remaining <= 0:
                    break
                done, _ = await asyncio.wait(tasks, timeout=remaining, return_when=asyncio.FIRST_EXCEPTION)
                tasks -= done
                failures = [e for t in done if not t.cancelled() and (e := t.exception()) is not None]
                if failures:
                    raise failures[0]  # a bug in a factory or callback
        finally:
            for task in tasks:
                task.cancel()
            if tasks:
                await asyncio.gather(*tasks, return_exceptions=True)
        self.results.sort(key=lambda r: r.started_at)
        return self.results


async def closed_loop(
    client: OpenAIClient,
    users: int,
    request_factory: RequestFactory,
    *,
    duration_seconds: float,
    max_requests: int | None,
    think_time_seconds: float = 0.0,
    on_result: ResultCallback | None = None,
    allow_remote: bool = False,
    keep_results: bool = True,
    error_backoff_seconds: float = DEFAULT_ERROR_BACKOFF_SECONDS,
) -> list[RequestResult]:
    """``users`` users, each sending its next request when its last one ends (after ``think_time_seconds``).

    Stops starting requests after ``duration_seconds`` or ``max_requests`` started (None: no count cap); requests
    still in flight at the deadline are cancelled and recorded with error_kind "cancelled". After a failure a user
    waits ``error_backoff_seconds`` (or the server's Retry-After, up to a second) so that a 429 or 503 does not make
    it spin. ``on_result`` is called with each result as it ends; ``keep_results=False`` keeps none in memory (for
    long runs that only count). Returns the kept results in the order they started.
    """
    if users < 1:
        raise UsageError(f"a closed loop needs at least one user, got {users}")
    run = _Run(client, request_factory, duration_seconds, max_requests, on_result, keep_results, allow_remote)
    raise_open_files_limit(users + OPEN_FILES_MARGIN)

    async def user() -> None:
        while run.claim():
            result = await run.send(await _next_plan(request_factory))
            if result.error_kind is not None and result.error_kind != "cancelled":
                await asyncio.sleep(_backoff_seconds(result, error_backoff_seconds))
            elif think_time_seconds > 0:
                await asyncio.sleep(think_time_seconds)

    tasks = {asyncio.create_task(user(), name=f"llmdiag-user-{i}") for i in range(users)}
    return await run.wait(tasks)


async def open_loop(
    client: OpenAIClient,
    rate_per_second: float,
    request_factory: RequestFactory,
    *,
    duration_seconds: float,
    max_requests: int | None,
    seed: int = 0,
    on_result: ResultCallback | None = None,
    allow_remote: bool = False,
    keep_results: bool = True,
) -> list[RequestResult]:
    """Requests arriving as a Poisson process of ``rate_per_second``, whatever the server's speed (each in its own
    task; ``client.max_connections`` caps how many are in flight). Arrival times are drawn ahead, so a late
    event loop catches up instead of lowering the rate. Bounded like ``closed_loop``."""
    if not rate_per_second > 0 or math.isinf(rate_per_second):
        raise UsageError(f"rate_per_second must be positive and finite, got {rate_per_second!r}")
    run = _Run(client, request_factory, duration_seconds, max_requests, on_result, keep_results, allow_remote)
    wanted = client.max_connections or max(4096, int(rate_per_second * 60))
    raise_open_files_limit(wanted + OPEN_FILES_MARGIN)
    rng = random.Random(seed)
    tasks: set[asyncio.Task[Any]] = set()

    async def one(plan: RequestPlan) -> None:
        await run.send(plan)

    async def arrivals() -> None:
        next_at = _monotonic()
        while True:
            next_at += rng.expovariate(rate_per_second)
            if next_at >= run.deadline:
                return
            delay = next_at - _monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if not run.claim():
                return
            task = asyncio.create_task(one(await _next_plan(request_factory)))
            tasks.add(task)
            task.add_done_callback(_forget_if_clean(tasks))

    source = asyncio.create_task(arrivals(), name="llmdiag-arrivals")
    try:
        await run.wait({source})
    finally:
        await run.wait(tasks)  # at the deadline: cancels what is in flight
    return run.results


def _forget_if_clean(tasks: set[asyncio.Task[Any]]) -> Callable[[asyncio.Task[Any]], None]:
    """Drop a finished request task from the set (keeps the set small in long runs), unless it raised."""

    def forget(task: asyncio.Task[Any]) -> None:
        if task.cancelled() or task.exception() is None:
            tasks.discard(task)

    return forget


# --- load from sync code -------------------------------------------------------------------------------------


@dataclass
class LoadTally:
    """Running counts of a load, updated as each request ends (read them from any thread). The successful
    requests' TTFTs are kept, a float each."""

    started: int = 0  # requests planned (sent, or about to be)
    ok: int = 0
    rejected: int = 0  # HTTP 503: the server turned it away (a full queue)
    cancelled: int = 0  # in flight when the load stopped: not the server's failure
    errors: Counter[str] = field(default_factory=Counter)  # other failures: "HTTP 500", "connect", "stream" ...
    completion_tokens: int = 0  # of the successful requests
    ttft_seconds: list[float] = field(default_factory=list)  # client side, successful requests: sent → first token
    last_error: str | None = None

    def add(self, result: RequestResult) -> None:
        if result.ok:
            self.ok += 1
            self.completion_tokens += result.output_tokens or 0
            if result.ttft_seconds is not None:
                self.ttft_seconds.append(result.ttft_seconds)
            return
        if result.error_kind == "cancelled":
            self.cancelled += 1
            return
        if result.error_kind == "http" and result.status == 503:
            self.rejected += 1
        elif result.error_kind == "http":
            self.errors[f"HTTP {result.status}"] += 1
        else:
            self.errors[result.error_kind or "error"] += 1
        self.last_error = result.error


@dataclass(frozen=True)
class LoadShape:
    """How hard and how long a BackgroundLoad runs: ``users`` (a closed loop) or ``rate_per_second`` (an open
    loop), until ``duration_seconds`` or ``max_requests`` started requests (None: no count cap)."""

    duration_seconds: float
    users: int | None = None
    rate_per_second: float | None = None
    max_requests: int | None = None
    think_time_seconds: float = 0.0  # closed loop: a user's pause between requests
    error_backoff_seconds: float = DEFAULT_ERROR_BACKOFF_SECONDS  # closed loop: a user's pause after a failure
    seed: int = 0  # open loop: the draw of arrival times

    def __post_init__(self) -> None:
        if (self.users is None) == (self.rate_per_second is None):
            raise UsageError("give users (a closed loop) or rate_per_second (an open loop), not both or neither")


class BackgroundLoad:
    """A bounded load on its own event loop in a background thread, for sync code (the simulator's demo load,
    tests, ``llmdiag capacity --simulate``):

        with BackgroundLoad(url, factory, LoadShape(30, users=8)) as load:
            time.sleep(10)
        load.tally.ok, load.tally.errors

    ``shape`` says how hard and how long (``LoadShape``); ``client`` how to talk to the server (``ClientOptions``).
    It ends by itself at the shape's duration or request count, or when ``stop()`` (or leaving the block) cancels
    what is in flight. ``prepare(client)`` runs first (e.g. calibrating prompts); ``start()`` returns once it has.
    ``on_result`` is called on the load's thread. ``keep_results`` keeps every result in ``results`` (memory grows
    with the run). Refuses a server that is not on this machine unless ``allow_remote``.
    """

    def __init__(
        self,
        base_url: str,
        request_factory: RequestFactory,
        shape: LoadShape,
        *,
        client: ClientOptions | None = None,
        allow_remote: bool = False,
        keep_results: bool = False,
        on_result: ResultCallback | None = None,
        prepare: Callable[[OpenAIClient], Awaitable[None]] | None = None,
        name: str = "llmdiag-load",
    ) -> None:
        check_target(base_url, allow_remote)
        self.base_url = base_url
        self.shape = shape
        self.allow_remote = allow_remote
        self.keep_results = keep_results
        self.on_result = on_result
        self.prepare = prepare
        self.name = name
        self._factory = request_factory
        self._client_options = client or ClientOptions()
        self.tally = LoadTally()
        self.results: list[RequestResult] = []
        self.client: OpenAIClient | None = None
        self.error: BaseException | None = None  # what stopped the load thread, if anything did
        self._setup_error: BaseException | None = None  # what failed before requests began (raised by start)
        self.started_at: float | None = None  # time.time() when requests began
        self.stopped_at: float | None = None
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task[Any] | None = None
        self._ready = threading.Event()
        self._done = threading.Event()

    # control

    def start(self, ready_timeout_seconds: float = 60.0) -> BackgroundLoad:
        if self._thread is not None:
            raise RuntimeError("the load is already started")
        self._thread = threading.Thread(target=self._main, name=self.name, daemon=True)
        self._thread.start()
        if not self._ready.wait(ready_timeout_seconds):
            self.stop()
            raise UsageError(f"the load did not start within {ready_timeout_seconds:g} s")
        if self._setup_error is not None:
            raise self._setup_error
        return self

    def stop(self, timeout_seconds: float = 30.0) -> None:
        """Cancel what is in flight and end the load; returns when its thread has ended (or after the timeout)."""
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not self._done.is_set():
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(task.cancel)
        if self._thread is not None:
            self._thread.join(timeout_seconds)

    def wait(self, timeout_seconds: float | None = None) -> bool:
        """Until the load ends by itself (duration or request count); True when it has."""
        if self._thread is None:
            return True
        return self._done.wait(timeout_seconds)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> BackgroundLoad:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # the load's thread

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            self._task = loop.create_task(self._run())
            loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass  # stopped
        except BaseException as exc:  # surfaced by start() or .error; a thread has nowhere else to report it
            self.error = exc
            if not self._ready.is_set():
                self._setup_error = exc
        finally:
            self.stopped_at = time.time()
            self._ready.set()
            self._done.set()
            try:
                _cancel_what_is_left(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                loop.close()

    def _record(self, result: RequestResult) -> None:
        self.tally.add(result)
        if self.keep_results:
            self.results.append(result)
        if self.on_result is not None:
            self.on_result(result)

    def _plan(self) -> RequestPlan | Awaitable[RequestPlan]:
        self.tally.started += 1
        return self._factory()

    async def _run(self) -> None:
        shape = self.shape
        # the runners keep no results: _record keeps them when asked, as they end
        run_options: dict[str, Any] = dict(
            duration_seconds=shape.duration_seconds,
            max_requests=shape.max_requests,
            on_result=self._record,
            allow_remote=self.allow_remote,
            keep_results=False,
        )
        async with self._client_options.open(self.base_url) as client:
            self.client = client
            if self.prepare is not None:
                await self.prepare(client)
            self.started_at = time.time()
            self._ready.set()
            if shape.users is not None:
                await closed_loop(
                    client,
                    shape.users,
                    self._plan,
                    think_time_seconds=shape.think_time_seconds,
                    error_backoff_seconds=shape.error_backoff_seconds,
                    **run_options,
                )
            else:
                assert shape.rate_per_second is not None
                await open_loop(client, shape.rate_per_second, self._plan, seed=shape.seed, **run_options)


def _cancel_what_is_left(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel the tasks still pending on a load's loop (the model's look-up, shielded from the requests that wait
    for it) and let them unwind, as ``asyncio.run`` does: a task destroyed pending keeps its connection open."""
    pending = [task for task in asyncio.all_tasks(loop) if not task.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
