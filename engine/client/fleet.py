"""Several OpenAI-compatible endpoints serving one model (``[provider] base_urls``), used like one client.

:class:`EndpointFleet` has the two calls the run makes of a :class:`~engine.client.chat.ChatClient`
(``complete`` and ``get_json``) and holds one ``ChatClient`` per endpoint. Which endpoint takes a
request and when an endpoint leaves or rejoins the rotation is decided by the pure
:class:`~engine.client.endpoints.EndpointSet`; this module does the I/O around it:

- ``complete`` waits for a slot on a healthy endpoint (the fewest in flight, below its cap), sends
  the request there, and reports the outcome. With no healthy endpoint at all it raises ``connect``
  (``no healthy endpoint``), an ordinary retried error.
- A failed request names its endpoint in the message (``URL: ...``). Whose fault it is:
  ``connect`` (refused, connect timeout) is the endpoint's; a ``disconnect`` or ``stall`` is the
  endpoint's when the endpoint is then found down (already marked, or its health probe fails right
  away: a replica killed mid-stream, a host gone). Those errors carry ``endpoint_fault`` and are retried at once on the
  other endpoints without counting against the prompt (:class:`~engine.client.retry.RetryPolicy`
  ``endpoint_retries``). Every other error is the request's, counts as usual, and feeds the
  endpoint's error streak (5xx, timeouts...).
- A background task probes every endpoint out of rotation when its backoff is due:
  ``GET {base}/models`` within ``probe_timeout_s``. Any HTTP answer below 500 is healthy (a server
  without ``/models`` still answers 404); a transport failure or a 5xx is not.
- ``get_json`` (``/credits``, ``/models``, ``/generation``) asks the healthy endpoints first and moves
  on only when one cannot be reached; ``getters`` gives one ``get_json`` per endpoint, for what each
  answers for itself (its own credits: ``/key`` is read from every replica and summed).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, NamedTuple
from urllib.parse import urlsplit, urlunsplit

from .accumulate import StreamProgress
from .chat import ChatClient
from .endpoints import Endpoint, EndpointSet, EndpointSnapshot, EndpointState, HealthPolicy, StateChange
from .responses import truncate
from .types import ChatRequest, Completion, ErrorClass, RequestError

__all__ = ["EndpointFleet", "ProbeResult"]

log = logging.getLogger(__name__)

#: Path of the health probe, below each endpoint's API root (vLLM and SGLang serve ``/v1/models``).
PROBE_PATH = "/models"

#: ``on_change(level, message)``: an endpoint changed state (``level``: ``"warning"`` | ``"info"``).
OnChange = Callable[[str, str], None]


def shown_url(url: str) -> str:
    """``url`` as messages and figures show it: credentials in it (``http://user:pass@host``) masked."""
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc="***@" + parts.netloc.rsplit("@", 1)[1]))


class ProbeResult(NamedTuple):
    """One health probe: whether the endpoint answered, why not, and how long it took (s)."""

    ok: bool
    reason: str
    seconds: float


class EndpointFleet:
    """Requests spread over several endpoints of one model, with health tracking.

    Args:
        endpoints: ``(url, cap)`` per endpoint in config order (cap None: no per-endpoint cap).
        make_client: builds the :class:`ChatClient` of one endpoint url (same key, timeouts and pool
            settings as a single ``base_url`` would get).
        policy: error streak and probe backoff (:class:`~engine.client.endpoints.HealthPolicy`).
        probe_timeout_s: limit of one health probe (s).
        on_change: called on every state change with a log level and a one-line message.
        clock: monotonic clock (s).
        send: ``await send(endpoint_index, req, progress) -> Completion``: ONE attempt on that endpoint
            (a run passes :meth:`engine.stream.pool.StreamWorkerPool.send`: the streams live in the
            stream workers, the clients here serve probes and ``get_json``). None: the endpoint's own
            client sends it.

    Raises:
        ValueError: as :class:`~engine.client.endpoints.EndpointSet` (no endpoint, repeated url, cap < 1).
    """

    def __init__(self, endpoints: list[tuple[str, int | None]], make_client: Callable[[str], ChatClient], *,
                 policy: HealthPolicy | None = None, probe_timeout_s: float = 10.0,
                 on_change: OnChange | None = None, clock: Callable[[], float] = time.monotonic,
                 send: "Callable[[int, ChatRequest, StreamProgress | None], Awaitable[Completion]] | None" = None
                 ) -> None:
        self.clock = clock
        self._t0 = clock()
        # messages, events and figures name an endpoint by its url without any user:password in it
        self.set = EndpointSet([(shown_url(u), c) for u, c in endpoints], policy, now=self._t0)
        self._clients = [make_client(url) for url, _ in endpoints]
        self._probe_timeout = float(probe_timeout_s)
        self._on_change = on_change
        self._waiters: collections.deque[asyncio.Future] = collections.deque()
        self._probes: dict[int, asyncio.Task] = {}
        self._kick = asyncio.Event()
        self._health_task: asyncio.Task | None = None
        self._send = send or (lambda i, req, progress: self._clients[i].complete(req, progress))

    def __repr__(self) -> str:
        return f"EndpointFleet({[ep.url for ep in self.set.endpoints]!r})"

    @property
    def stream(self) -> bool:
        """Whether requests are streamed (SSE), as every endpoint's client."""
        return self._clients[0].stream

    def __len__(self) -> int:
        return len(self._clients)

    # ---- lifecycle ---------------------------------------------------------------------------
    async def start(self) -> tuple[tuple[str, ProbeResult], ...]:
        """Probe every endpoint once (an unreachable one starts ``down``), then start probing the
        endpoints out of rotation in the background. Returns ``(url, probe result)`` per endpoint."""
        results = await asyncio.gather(*(self._probe(ep) for ep in self.set.endpoints))
        if self._health_task is None:
            self._health_task = asyncio.create_task(self._health_loop(), name="endpoint-health")
        return tuple((ep.url, r) for ep, r in zip(self.set.endpoints, results, strict=True))

    async def aclose(self) -> None:
        """Stop probing and close every endpoint's connection pool."""
        tasks = [t for t in [self._health_task, *self._probes.values()] if t is not None]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._health_task = None
        for c in self._clients:
            await c.aclose()

    async def __aenter__(self) -> EndpointFleet:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # ---- requests ----------------------------------------------------------------------------
    async def complete(self, req: ChatRequest, progress: StreamProgress | None = None) -> Completion:
        """Send ONE chat-completions request to the least-loaded healthy endpoint (see the module docstring);
        the completion names it (:attr:`Completion.endpoint`: its url as shown).

        Raises:
            RequestError: the endpoint's error, its message prefixed with the endpoint's url and
                ``endpoint_fault`` set where the fault is the endpoint's; ``connect`` when no endpoint is healthy.
            asyncio.CancelledError: on cancellation (the slot is released).
        """
        ep = await self._acquire()
        try:
            try:
                c = await self._send(ep.index, req, progress)
            except RequestError as e:
                raise e.at_endpoint(ep.url, await self._judge(ep, e)) from None
            tokens = c.usage.completion_tokens or (progress.tokens_received if progress is not None else 0)
            self.set.on_success(ep, self.clock(), c.latency_s, tokens)
            return c if c.endpoint == ep.url else dataclasses.replace(c, endpoint=ep.url)  # who served it
        finally:
            self._release(ep)

    async def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """GET ``path`` (``/models``, ``/generation``...) of the first endpoint that answers:
        healthy ones first (fewest in flight), then the others. What each endpoint answers for
        itself (``/key``: its own credits) is asked of every one through :meth:`getters`.

        Raises:
            RequestError: the answer's error, or the last transport failure when none could be reached.
        """
        order = sorted(self.set.endpoints, key=lambda ep: (ep.state is not EndpointState.HEALTHY, ep.in_flight,
                                                           ep.index))
        last: RequestError | None = None
        for ep in order:
            try:
                return await self._clients[ep.index].get_json(path, params)
            except RequestError as e:
                if e.error_class not in (ErrorClass.CONNECT, ErrorClass.DISCONNECT):
                    raise
                last = e.at_endpoint(ep.url, False)
        assert last is not None
        raise last

    def getters(self) -> tuple[tuple[str, Callable[..., Awaitable[Any]]], ...]:
        """``(url as shown, get_json)`` of every endpoint in config order, for what each endpoint
        answers for itself (``/key``: each replica's own credits, :func:`engine.money.credits.read_credits_each`).
        Each call is limited to the probe timeout: one without an answer by then raises ``timeout``
        (status 0), as an unreachable endpoint raises ``connect``."""
        def getter(client: ChatClient) -> Callable[..., Awaitable[Any]]:
            async def get_json(path: str, params: dict[str, Any] | None = None) -> Any:
                try:
                    async with asyncio.timeout(self._probe_timeout):
                        return await client.get_json(path, params)
                except TimeoutError:
                    raise RequestError(ErrorClass.TIMEOUT,
                                       f"GET {path}: no answer within {self._probe_timeout:g}s") from None
            return get_json
        return tuple((ep.url, getter(self._clients[ep.index])) for ep in self.set.endpoints)

    def snapshot(self) -> tuple[EndpointSnapshot, ...]:
        """Every endpoint's figures now, in config order."""
        return self.set.snapshot(self.clock(), self._t0)

    # ---- slots -------------------------------------------------------------------------------
    async def _acquire(self) -> Endpoint:
        loop = asyncio.get_running_loop()
        while True:
            if not self.set.any_healthy():
                raise RequestError(ErrorClass.CONNECT, truncate("no healthy endpoint: " + "; ".join(
                    f"{ep.url} {ep.state.value} ({ep.reason})" for ep in self.set.endpoints)))
            ep = self.set.pick()
            if ep is not None:
                self.set.start(ep)
                return ep
            fut = loop.create_future()  # every healthy endpoint is at its cap: wait for a slot
            self._waiters.append(fut)
            try:
                await fut
            finally:
                if not fut.done():
                    fut.cancel()
                try:
                    self._waiters.remove(fut)
                except ValueError:
                    pass

    def _release(self, ep: Endpoint) -> None:
        self.set.finish(ep)
        self._wake(1)

    def _wake(self, n: int | None = None) -> None:
        """Wake ``n`` waiters for a slot (None: all of them, after a state change)."""
        while self._waiters and (n is None or n > 0):
            fut = self._waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                if n is not None:
                    n -= 1

    # ---- health ------------------------------------------------------------------------------
    async def _judge(self, ep: Endpoint, e: RequestError) -> bool:
        """Record ``e`` against ``ep``; True when the fault is the endpoint's (see the module docstring)."""
        now = self.clock()
        if e.error_class is ErrorClass.CONNECT:
            self._changed(self.set.on_unreachable(ep, now, e.error_class.value, truncate(e.message, 160)))
            return True
        if e.error_class in (ErrorClass.DISCONNECT, ErrorClass.STALL):
            if ep.state is not EndpointState.DOWN:
                r = await self._probe(ep)
                if r.ok:
                    self._changed(self.set.on_error(ep, self.clock(), e.error_class.value))
                    return False
            self._changed(self.set.on_unreachable(ep, self.clock(), e.error_class.value,
                                                  ep.reason or "went down during the request"))
            return True
        self._changed(self.set.on_error(ep, now, e.error_class.value))
        return False

    def _changed(self, change: StateChange | None) -> None:
        if change is None:
            return
        self._kick.set()
        self._wake()  # waiters re-check: an endpoint back in rotation has slots, none left means an error
        if self._on_change is None:
            return
        if change.new is EndpointState.HEALTHY:
            self._on_change("info", f"endpoint {change.url} healthy again ({change.reason}); it takes new requests")
        else:
            ep = next(e for e in self.set.endpoints if e.url == change.url)
            self._on_change("warning", f"endpoint {change.url} {change.new.value}: {change.reason}; new requests go "
                                       f"to the other endpoints (next probe in {max(0.0, ep.probe_at - self.clock()):.1f}s)")

    async def _probe(self, ep: Endpoint) -> ProbeResult:
        """Probe ``ep`` once (a probe already running for it is shared) and apply the result."""
        task = self._probes.get(ep.index)
        if task is None or task.done():
            task = self._probes[ep.index] = asyncio.create_task(self._probe_now(ep), name=f"probe-{ep.index}")
        return await asyncio.shield(task)

    async def _probe_now(self, ep: Endpoint) -> ProbeResult:
        t0 = self.clock()
        try:
            async with asyncio.timeout(self._probe_timeout):
                await self._clients[ep.index].get_json(PROBE_PATH)
            r = ProbeResult(True, "", self.clock() - t0)
        except TimeoutError:
            r = ProbeResult(False, f"no answer to GET {PROBE_PATH} within {self._probe_timeout:g}s", self.clock() - t0)
        except RequestError as e:
            answered = 0 < e.status < 500
            r = ProbeResult(answered, "" if answered else truncate(e.message, 160), self.clock() - t0)
        except Exception as e:  # a probe must never fail the request that waits on it
            log.exception("health probe of %s failed unexpectedly", ep.url)
            r = ProbeResult(False, f"probe error ({type(e).__name__})", self.clock() - t0)
        self._changed(self.set.on_probe(ep, self.clock(), r.ok, r.reason))
        return r

    async def _health_loop(self) -> None:
        """Probe the endpoints out of rotation as their backoff falls due, until cancelled."""
        while True:
            due = self.set.next_due()
            self._kick.clear()
            if due is None or due > self.clock():
                timeout = None if due is None else due - self.clock()
                try:
                    await asyncio.wait_for(self._kick.wait(), timeout)
                except TimeoutError:
                    pass
                continue
            try:
                await asyncio.gather(*(self._probe(ep) for ep in self.set.due(self.clock())))
            except Exception:  # e.g. the state-change callback: probing goes on
                log.exception("endpoint health check failed")
                await asyncio.sleep(1.0)
