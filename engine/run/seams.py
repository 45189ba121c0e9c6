"""The typed seams between the run core and its collaborators.

Each collaborator of :class:`~engine.run.scheduler.Scheduler`, :class:`~engine.storage.writer.StoreWriter`,
:class:`~engine.run.controller.Controller` and :class:`~engine.run.supervisor.Supervisor` is handed in
through the constructor as one of these (never assigned afterwards), so a test can pass a fake that
fits the same shape. Pure declarations: no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Awaitable, Callable, Protocol

if TYPE_CHECKING:
    from engine.client.accumulate import StreamProgress
    from engine.client.endpoints import EndpointSnapshot
    from engine.client.types import ChatRequest, Completion
    from engine.stream.pool import PoolFigures


class CompleteFn(Protocol):
    """ONE attempt of a chat request (normally :meth:`engine.client.chat.ChatClient.complete`).

    ``await complete(req, progress=progress) -> Completion``; raises
    :class:`~engine.client.types.RequestError` for provider errors; ``progress`` is updated while
    the stream arrives (tokens received, generation id, provider).
    """

    def __call__(self, req: "ChatRequest", progress: "StreamProgress | None" = None) -> Awaitable["Completion"]: ...


#: ``await get_json(path, params=None) -> decoded JSON`` of the provider (``/key``, ``/credits``,
#: ``/generation``, ``/models``); raises :class:`~engine.client.types.RequestError`.
GetJsonFn = Callable[..., Awaitable[Any]]


class AccountClient(Protocol):
    """The run's client of the provider's account endpoints (``/key``, ``/credits``, ``/generation``,
    ``/models``): a :class:`~engine.client.chat.ChatClient` (one endpoint) or an
    :class:`~engine.client.fleet.EndpointFleet` (several; it asks a healthy one)."""

    async def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any: ...
    async def aclose(self) -> None: ...


#: The store's live ``runtime`` row, built at each commit (see :func:`engine.run.observe.live_row`).
LiveFn = Callable[[], "dict[str, Any]"]

#: The figures of several endpoints now (:meth:`engine.client.fleet.EndpointFleet.snapshot`).
EndpointsFn = Callable[[], "tuple[EndpointSnapshot, ...]"]

#: The stream workers' figures now (:meth:`engine.stream.pool.StreamWorkerPool.figures`).
WorkersFn = Callable[[], "PoolFigures"]

#: Re-reads the provider's credits once (e.g. :meth:`engine.run.supervisor.Supervisor.poll_credits`).
CreditsCheck = Callable[[], Awaitable[None]]


class Reconstructor(Protocol):
    """Token reconstruction of results as they arrive (:class:`engine.tokens.service.ReconstructionService`).

    ``tok``: the loaded tokenizer (None before start); the scheduler counts usage with it when a
    response carries none. ``submit`` queues one result for reconstruction and validation; it may
    raise (the result is stored anyway; ``datagen validate`` rebuilds it).
    """

    tok: Any

    def submit(self, prompt_id: int, dataset: str, key: str, messages: list[dict[str, Any]],
               tools: Any, completion: "Completion") -> None: ...


__all__ = ["CompleteFn", "CreditsCheck", "EndpointsFn", "GetJsonFn", "LiveFn", "Reconstructor", "WorkersFn"]


class TextOut(Protocol):
    """Where a command's progress lines go: ``sys.stdout``, :class:`~engine.run.headless.SafeOut` around it,
    or the dashboard's log bridge (``tui.host``); ``print(..., file=out, flush=True)`` writes to it."""

    def write(self, s: str, /) -> int: ...
    def flush(self) -> None: ...
