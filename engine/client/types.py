"""Value types shared by the client, the store and the scheduler.

Wire facts follow ``docs/openrouter.md`` (OpenRouter chat-completions, late 2026).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from engine.errors import DatagenError


@dataclass(frozen=True, slots=True)
class Usage:
    """Token usage and cost of one generation, as billed by the provider.

    Attributes:
        prompt_tokens: tokens of the prompt (tokens).
        completion_tokens: generated tokens, reasoning INCLUDED (tokens).
        reasoning_tokens: the reasoning part of ``completion_tokens`` (tokens), 0 when not reported.
        cost_usd: ``usage.cost`` in USD credits, or ``None`` when the provider did not report it.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    reasoning_tokens: int = 0
    cost_usd: float | None = None


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One assistant tool call in OpenAI shape; ``arguments`` is the provider's JSON string, verbatim."""

    id: str
    name: str
    arguments: str
    type: str = "function"

    def to_openai(self) -> dict[str, Any]:
        """Return ``{"id", "type", "function": {"name", "arguments"}}``."""
        return {"id": self.id, "type": self.type, "function": {"name": self.name, "arguments": self.arguments}}


#: ``finish_reason`` values with a known meaning (OpenAI / OpenRouter's normalised set). Any other non-empty
#: value still finishes the choice, is kept verbatim and is flagged (:attr:`Completion.finish_known` False;
#: validation fails the record with ``unknown_finish``): whether the text is complete is then unknown.
KNOWN_FINISH_REASONS: frozenset[str] = frozenset({"stop", "length", "tool_calls", "content_filter", "function_call"})


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished generation.

    Attributes:
        reasoning: the reasoning text (``reasoning`` / ``reasoning_content`` / ``reasoning_details``).
        content: the answer text ("" when the model produced none).
        tool_calls: assembled tool calls, in index order.
        finish_reason: ``stop`` | ``length`` | ``tool_calls`` | ``content_filter`` | ``function_call``, or
            another non-empty value kept verbatim (see :attr:`finish_known`); never empty (an unfinished stream
            raises ``DISCONNECT``) and never ``error`` (errors raise :class:`RequestError`).
        native_finish_reason: the provider's own finish reason, when given.
        usage: billed usage (see :class:`Usage`); zeros when the provider sent none.
        provider: provider display name from the response's ``provider`` field ("" if absent).
        model: model id the RESPONSE names (may be a dated id; never the request's): whether it is the
            model asked for is :func:`engine.client.attribution.same_model` (flag ``model_mismatch``).
        generation_id: ``id`` of the response / ``X-Generation-Id`` header.
        latency_s: seconds from sending the request to the end of the response.
        ttft_s: seconds from sending to the first content/reasoning/tool-call byte (None if none came).
        usage_reported: whether the response carried a ``usage`` object. False when the provider sent none
            (e.g. vLLM without ``stream_options.include_usage``) or the connection closed after the finish
            chunk: :attr:`usage` is then zeros and the caller must account the tokens another way.
        flags: wire-conformance flags this response raised, each once (names and meaning:
            :mod:`engine.client.conformance`, ``docs/wire-conformance.md``); ``()`` for a response that
            kept to the standard shapes.
        token_ids: the generated token ids as the server sent them (vLLM ``return_token_ids``), None when
            the server sent none.
        usage_raw: the usage object's numeric figures exactly as sent (JSON text), kept only when one
            was invalid (negative, NaN, not a number: flag ``usage_invalid``; :attr:`usage` reads it as
            0); None otherwise. Not journaled.
        endpoint: the ``[provider] base_urls`` entry (its url) that served it; "" with a single
            ``base_url`` (set by :class:`~engine.client.fleet.EndpointFleet`).
        system_fingerprint: the first non-empty ``system_fingerprint`` of the chunks / body ("" if none).
        temperature / top_p: the sampling settings the request was sent with (its body's values; None
            when the request left them to the provider's default); set by
            :func:`engine.client.attribution.attribute`.
    """

    reasoning: str
    content: str
    tool_calls: tuple[ToolCall, ...]
    finish_reason: str
    native_finish_reason: str | None
    usage: Usage
    provider: str
    model: str
    generation_id: str
    latency_s: float
    ttft_s: float | None
    usage_reported: bool = True
    flags: tuple[str, ...] = ()
    token_ids: tuple[int, ...] | None = None
    usage_raw: str | None = None
    endpoint: str = ""
    system_fingerprint: str = ""
    temperature: float | None = None
    top_p: float | None = None

    @property
    def finish_known(self) -> bool:
        """Whether :attr:`finish_reason` is one of :data:`KNOWN_FINISH_REASONS` (False: kept verbatim, flagged)."""
        return self.finish_reason in KNOWN_FINISH_REASONS


class ErrorClass(str, enum.Enum):
    """How a failed request is classified; the value is the label counted in ``status`` ``errors``."""

    RATE_LIMIT = "rate_limit"  # 429
    SERVER = "server"  # 500 502 503 529 and other 5xx
    TIMEOUT = "timeout"  # 408 524, total-time limit
    MIDSTREAM = "midstream"  # code-less error chunk inside a 200 stream / 200 body (a coded one: its status's class)
    DISCONNECT = "disconnect"  # connection reset / closed before [DONE]
    STALL = "stall"  # no bytes for the stall timeout
    CONNECT = "connect"  # could not connect
    PROTOCOL = "protocol"  # unparseable body / chunk
    BAD_REQUEST = "bad_request"  # 400 (incl. context length exceeded): fail the prompt
    FORBIDDEN = "forbidden"  # 403 moderation / permission: fail the prompt
    AUTH = "auth"  # 401: stop the run
    CREDITS = "credits"  # 402: pause everything
    ROUTE = "route"  # 404 "No endpoints found" (routing, model id, data policy): pause everything
    OTHER = "other"  # any other 4xx: fail the prompt

    @property
    def retryable(self) -> bool:
        """True for transient classes that are retried with backoff."""
        return self in _RETRYABLE

    @property
    def fatal(self) -> bool:
        """True for conditions of the account or the route (401, 402, 404) that pause the whole run
        rather than fail one prompt (see :mod:`engine.run.runwide`)."""
        return self in (ErrorClass.AUTH, ErrorClass.CREDITS, ErrorClass.ROUTE)


_RETRYABLE = frozenset(
    {
        ErrorClass.RATE_LIMIT,
        ErrorClass.SERVER,
        ErrorClass.TIMEOUT,
        ErrorClass.MIDSTREAM,
        ErrorClass.DISCONNECT,
        ErrorClass.STALL,
        ErrorClass.CONNECT,
        ErrorClass.PROTOCOL,
    }
)


class RequestError(DatagenError):
    """A request that did not yield a :class:`Completion`.

    Attributes:
        error_class: the :class:`ErrorClass`.
        status: HTTP status (0 when none, e.g. a reset before headers).
        message: provider message or local reason; never contains the API key.
        retry_after_s: seconds the server asked us to wait (``Retry-After`` or ``X-RateLimit-Reset``), or None.
        provider: provider name if the error names one.
        generation_id: generation id if one was seen before the failure.
        tokens_received: completion tokens estimated from text streamed before the failure (a lower bound
            of what an aborted stream may be billed; the usage chunk is lost).
        partial_cost_usd: cost reported before the failure, if any.
        attempts: attempts made when this error ended a retry loop (set by ``retry.call_with_retries``; 1 else).
        endpoint: with several endpoints (``[provider] base_urls``), the one that failed ("" otherwise).
        endpoint_fault: the fault is that endpoint's, not the prompt's (it could not be reached, or went
            down during the request): retried at once on another endpoint without counting against the
            prompt's attempts (:class:`~engine.client.retry.RetryPolicy` ``endpoint_retries``) nor
            feeding the anomaly guard. Set only by :class:`~engine.client.fleet.EndpointFleet`.
        no_answer: a ``STALL`` in which not one byte of a response arrived within the stall timeout: no
            status line, or headers and no body byte (a server that accepts connections and never answers;
            a stream that sends anything, keep-alive comments included, is never this). With no other
            sign of the endpoint answering it pauses the run like an unreachable server
            (:func:`engine.run.runwide.condition_of`).
    """

    attempts: int = 1
    endpoint: str = ""
    endpoint_fault: bool = False
    no_answer: bool = False

    def __init__(
        self,
        error_class: ErrorClass,
        message: str,
        *,
        status: int = 0,
        retry_after_s: float | None = None,
        provider: str = "",
        generation_id: str = "",
        tokens_received: int = 0,
        partial_cost_usd: float | None = None,
    ) -> None:
        super().__init__(f"{error_class.value}{f' HTTP {status}' if status else ''}: {message}")
        self.error_class = error_class
        self.status = status
        self.message = message
        self.retry_after_s = retry_after_s
        self.provider = provider
        self.generation_id = generation_id
        self.tokens_received = tokens_received
        self.partial_cost_usd = partial_cost_usd

    @property
    def retryable(self) -> bool:
        """Whether the request may be tried again (see :attr:`ErrorClass.retryable`)."""
        return self.error_class.retryable

    @property
    def bare_message(self) -> str:
        """:attr:`message` without the endpoint prefix :meth:`at_endpoint` adds: what the server or
        the transport said, the same whichever replica said it."""
        return self.message.removeprefix(f"{self.endpoint}: ") if self.endpoint else self.message

    def at_endpoint(self, url: str, fault: bool) -> "RequestError":
        """Name the endpoint ``url`` that failed in the message (``"URL: message"``) and record whether
        the fault is the endpoint's (:attr:`endpoint_fault`); returns ``self``."""
        self.endpoint = url
        self.endpoint_fault = fault
        self.message = f"{url}: {self.message}"
        self.args = (f"{self.error_class.value}{f' HTTP {self.status}' if self.status else ''}: {self.message}",)
        return self


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What to send: the request body fields other than ``stream`` (which the client sets).

    Attributes:
        messages: OpenAI-shape messages.
        tools: OpenAI-shape tools (omitted from the body when empty).
        max_tokens: completion cap in tokens (always sent: see docs/openrouter.md, credit pre-check).
        body: every other body field (model, temperature, top_p, seed, reasoning, provider, extra fields).
        ref: the prompt this request answers, ``(prompt id, dataset, key)``; never sent. A stream worker
            journals the completion under it (:mod:`engine.stream.journal`). None: not journaled.
    """

    messages: list[dict[str, Any]]
    max_tokens: int
    tools: list[dict[str, Any]] = field(default_factory=list)
    body: dict[str, Any] = field(default_factory=dict)
    ref: tuple[int, str, str] | None = field(default=None, compare=False)

    def to_body(self, stream: bool) -> dict[str, Any]:
        """Return the JSON body to POST."""
        out: dict[str, Any] = dict(self.body)
        out["messages"] = self.messages
        if self.tools:
            out["tools"] = self.tools
        out["max_tokens"] = self.max_tokens
        out["stream"] = stream
        return out
