"""Assembly of a :class:`Completion` from streamed chunks or from a non-streaming body.

Wire facts (``docs/openrouter.md``):

* reasoning arrives as ``reasoning`` (OpenRouter), ``reasoning_content`` (vLLM/SGLang/Moonshot) or
  ``reasoning_details[*].text``; OpenRouter sends ``reasoning`` AND ``reasoning_details`` with the same text in one
  chunk, so per chunk the FIRST present spelling is taken (``reasoning`` > ``reasoning_content`` > details),
  never their sum;
* tool calls stream as fragments keyed by ``index`` and ``id`` (:mod:`engine.client.toolcalls` has the
  assembly rules: a new ``id`` at an index holding another id starts a new call);
* only a non-empty ``finish_reason`` finishes the choice: ``""`` and ``null`` (SGLang, Ollama send ``""`` on
  every intermediate chunk) never do; the first non-empty one is kept verbatim, known or not
  (:data:`~engine.client.types.KNOWN_FINISH_REASONS`; :attr:`Completion.finish_known` flags the others);
* ``finish_reason`` may be repeated by a second chunk carrying ``usage``, or usage may come in a final chunk with
  ``choices: []``: usage is read from whichever chunk has it, the finish is counted once;
* a mid-stream error is a chunk with top-level ``error`` and ``choices[0].finish_reason == "error"``, or (older
  form) ``choices[0].error``; ``code`` is an int or a string. An error whose code stands for an HTTP status is
  classified like that HTTP error (:func:`~engine.client.errors.classify_error_object`: an in-stream 429 is a
  ``RATE_LIMIT``); a code-less one is ``MIDSTREAM``;
* generated token ids (vLLM >= 0.10.2 asked with ``return_token_ids: true``, see :class:`ChatClient`): a streamed
  chunk carries the ids it generated in ``choices[0].token_ids`` (the first, role-only chunk carries none; chunks
  whose delta is empty still carry theirs), a non-streamed body the whole list in ``choices[0].token_ids``; they are
  concatenated in order into :attr:`Completion.token_ids` (None when no chunk carried any, or when one carried
  something that is not a list of non-negative ints). The prompt's ids (top-level ``prompt_token_ids``, first
  chunk only when streamed) are not read;
* the stream's identity (first non-empty chunk ``id``, ``model``, ``provider``, ``system_fingerprint``) is read
  from every chunk; a change of it mid-stream is two generations spliced into one (flag ``spliced_generation``,
  :mod:`engine.client.attribution`).

``tokens_received`` is an ESTIMATE of completion tokens streamed so far: characters of reasoning + content +
tool-call arguments received, divided by 4 and rounded up. Use it as a lower-bound-style estimate of what an aborted
stream may be billed (its usage chunk is lost); it is not a tokenizer count.

The field readers live in :mod:`engine.client.fields` and :class:`StreamProgress` in :mod:`engine.client.progress`;
both are re-exported here (``__all__``).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from typing import Any

from .attribution import GenerationIdentity
from .conformance import DEFAULT_FINISH_ALIASES, raw_usage_figures, read_usage, resolve_finish, usage_location
from .errors import classify_error_object
from .fields import details_text, finish_value, parse_usage, reasoning_text, usage_present
from .progress import StreamProgress, estimate_tokens
from .responses import get_header, truncate
from .toolcalls import ToolCallAssembler
from .types import Completion, ErrorClass, RequestError, ToolCall

__all__ = [
    "StreamAccumulator",
    "StreamProgress",
    "estimate_tokens",
    "finish_value",
    "parse_completion_body",
    "parse_usage",
    "reasoning_text",
    "usage_present",
]


#: Top-level chunk keys that never hold a usage (:func:`~engine.client.conformance.usage_location` looks
#: at ``usage``, at ``choices[0].usage`` and inside ``x_*`` objects): a chunk with only these keys and no
#: ``usage`` in its choice has none, and its usage lookup is skipped.
_NO_USAGE_KEYS = frozenset({"id", "object", "created", "model", "provider", "system_fingerprint", "choices",
                            "service_tier"})


class StreamAccumulator:
    """Consumes parsed stream chunks (dicts) and assembles a :class:`Completion`.

    Args:
        t_start: ``clock()`` value when the request was sent (for ``ttft_s`` / ``latency_s``); defaults to now.
        progress: a :class:`StreamProgress` to update live (one is created if omitted; see :attr:`progress`).
        clock: monotonic clock, injectable for tests.
        generation_id: generation id known from the ``X-Generation-Id`` header, if any (wins over chunk ``id``).
        finish_aliases: lower-case aliases of the standard finish reasons
            (:func:`engine.client.conformance.finish_aliases`); None: the defaults.

    Usage::

        acc = StreamAccumulator()
        for chunk in chunks:
            acc.feed(chunk)          # raises RequestError(MIDSTREAM) on an error chunk
        completion = acc.completion()
    """

    __slots__ = (
        "progress",
        "_clock",
        "_t_start",
        "_content",
        "_reasoning",
        "_tools",
        "finish_reason",
        "native_finish_reason",
        "empty_finishes",
        "usage_raw",
        "provider",
        "model",
        "generation_id",
        "ttft_s",
        "chunks",
        "flags",
        "_aliases",
        "_usage_preview",
        "_content_seen",
        "_token_ids",
        "_ids_bad",
        "_ident",
        "_ident_key",
        "_ident_same",
    )

    def __init__(
        self,
        *,
        t_start: float | None = None,
        progress: StreamProgress | None = None,
        clock: Callable[[], float] = time.monotonic,
        generation_id: str = "",
        finish_aliases: Mapping[str, str] | None = None,
    ) -> None:
        self.progress = progress if progress is not None else StreamProgress()
        self._clock = clock
        self._t_start = clock() if t_start is None else t_start
        self._content: list[str] = []
        self._reasoning: list[str] = []
        self._tools = ToolCallAssembler()
        self.finish_reason: str | None = None
        self.native_finish_reason: str | None = None
        self.empty_finishes = 0
        """Chunks whose ``finish_reason`` was present but empty (``""``): they never finish the choice."""
        self.usage_raw: dict[str, Any] | None = None
        self.provider = ""
        self.model = ""
        self.generation_id = generation_id
        if generation_id and not self.progress.generation_id:
            self.progress.generation_id = generation_id
        self.ttft_s: float | None = None
        self.chunks = 0
        self.flags: list[str] = []
        """Wire-conformance flags raised so far (:mod:`engine.client.conformance`), each once."""
        self._aliases = finish_aliases if finish_aliases is not None else DEFAULT_FINISH_ALIASES
        self._usage_preview = False
        self._content_seen = False
        self._token_ids: list[Any] = []
        self._ids_bad = False
        self._ident = GenerationIdentity()
        self._ident_key: tuple[Any, ...] = ()  # the last chunk's (id, model, provider, system_fingerprint) ...
        self._ident_same = 0  # ... and how many chunks in a row carried it

    # -- state ------------------------------------------------------------------------------------------------

    @property
    def finished(self) -> bool:
        """True once a non-empty (non-error) ``finish_reason`` was seen: the generated text is complete."""
        return self.finish_reason is not None

    @property
    def tokens_received(self) -> int:
        """Estimated completion tokens received so far (``ceil(chars / 4)``, see module docstring)."""
        return self.progress.tokens_received

    @property
    def received_anything(self) -> bool:
        """True when any text, tool call, finish or usage has arrived."""
        return bool(self.progress.chars_received or self._tools or self.finish_reason or self.usage_raw)

    # -- feeding ----------------------------------------------------------------------------------------------

    def feed(self, chunk: Any) -> None:
        """Consume one parsed chunk.

        Raises:
            RequestError: for an error chunk (either form): classified by its code like the HTTP status
                (:func:`~engine.client.errors.classify_error_object`), ``MIDSTREAM`` when it has none;
                ``PROTOCOL`` when the chunk is not an object.
        """
        if type(chunk) is not dict:
            raise self.error(ErrorClass.PROTOCOL, f"stream chunk is not a JSON object: {truncate(repr(chunk), 200)}")
        self.chunks += 1
        key = (chunk.get("id"), chunk.get("model"), chunk.get("provider"), chunk.get("system_fingerprint"))
        if key == self._ident_key:
            self._ident_same += 1
        else:
            self._ident_key, self._ident_same = key, 1
        if self._ident_same <= 2:  # a third chunk in a row with the same identity changes nothing (_meta)
            self._meta(chunk)
        err = chunk.get("error")
        if err is not None:
            self._usage(chunk)  # the usage billed so far, when the error chunk carries it, is spend
            raise self._midstream(err)
        choices = chunk.get("choices")
        choice = choices[0] if choices and type(choices) is list else None
        if type(choice) is dict:
            delta = choice.get("delta")
            if delta:
                self._delta(delta)
            tids = choice.get("token_ids")
            if tids:
                self._ids(tids)
        if not (chunk.keys() <= _NO_USAGE_KEYS) or (type(choice) is dict and "usage" in choice):
            self._usage(chunk)  # else: no usage anywhere usage_location looks (skipped: once per chunk)
        if type(choice) is not dict:
            return
        fr = choice.get("finish_reason")
        if fr == "error" or choice.get("error") is not None:
            raise self._midstream(choice.get("error") or {"message": "finish_reason=error with no error object"})
        if fr is not None:
            fin = finish_value(fr)
            if fin is None:
                self.empty_finishes += 1
            elif self.finish_reason is None:
                self.finish_reason = fin
                nfr = choice.get("native_finish_reason")
                self.native_finish_reason = str(nfr) if nfr is not None else None

    def _meta(self, chunk: dict[str, Any]) -> None:
        """Take a chunk's identity (:class:`~engine.client.attribution.GenerationIdentity`): the first
        non-empty id, model, provider and system fingerprint; a change of them raises ``spliced_generation``."""
        ident = self._ident
        if ident.observe(chunk):
            self._flag("spliced_generation")
        if ident.chunk_id and not self.generation_id:
            self.generation_id = ident.chunk_id
            if not self.progress.generation_id:
                self.progress.generation_id = self.generation_id
        self.model = self.model or ident.model
        if ident.provider and not self.provider:
            self.provider = self.progress.provider = ident.provider

    def _flag(self, name: str) -> None:
        if name not in self.flags:
            self.flags.append(name)

    def _usage(self, chunk: dict[str, Any]) -> None:
        """Take a chunk's usage (wherever it is: :func:`~engine.client.conformance.usage_location`); the
        latest wins (running totals end on the final figure). A usage before any generated text is a
        preview: it stands only if no text follows (:meth:`completion`)."""
        usage, where = usage_location(chunk)
        if not (usage and usage_present(usage)):
            return
        self.usage_raw = usage
        self._usage_preview = not (self.progress.chars_received or self._tools or self.finish_reason)
        if where:
            self._flag(where)
        self.progress.cost_usd = read_usage(usage)[0].cost_usd

    def feed_late(self, chunk: Any) -> None:
        """Consume a chunk that arrived after ``[DONE]``: only its usage is read (flag ``usage_after_done``);
        anything else in it is ignored."""
        if type(chunk) is dict and usage_location(chunk)[0]:
            before = self.usage_raw
            self._usage(chunk)
            if self.usage_raw is not before:
                self._flag("usage_after_done")

    def _delta(self, delta: dict[str, Any]) -> None:
        got = 0
        r = delta.get("reasoning")
        if not (r and type(r) is str):
            r = delta.get("reasoning_content")
            if not (r and type(r) is str):
                d = delta.get("reasoning_details")
                r = details_text(d) if d else ""
        if r:
            if self._content_seen or self._tools:
                self._flag("reasoning_after_content")
            self._reasoning.append(r)
            got += len(r)
        c = delta.get("content")
        if c and type(c) is str:
            self._content.append(c)
            self._content_seen = True
            got += len(c)
        tcs = delta.get("tool_calls")
        if tcs:
            got += self._tool_deltas(tcs)
            if self.ttft_s is None and self._tools:
                self.ttft_s = self._clock() - self._t_start
        if got:
            self.progress.chars_received += got
            if self.ttft_s is None:
                self.ttft_s = self._clock() - self._t_start

    def _tool_deltas(self, tcs: Any) -> int:
        return self._tools.feed(tcs)

    def _ids(self, tids: Any) -> None:
        """Append a chunk's (or a body's) generated ``token_ids``; anything but a list spoils them all."""
        if type(tids) is list:
            self._token_ids.extend(tids)
        else:
            self._ids_bad = True

    def token_ids(self) -> tuple[int, ...] | None:
        """The generated token ids the server sent so far, in order; None when it sent none, or when any
        it sent is not a non-negative int (a partial or garbled list could only fail the comparison)."""
        ids = self._token_ids
        if not ids or self._ids_bad or not all(type(x) is int and x >= 0 for x in ids):
            return None
        return tuple(ids)

    # -- results ----------------------------------------------------------------------------------------------

    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The assembled tool calls in start order (see :mod:`engine.client.toolcalls`)."""
        return self._tools.calls()

    def completion(self, *, latency_s: float | None = None) -> Completion:
        """The assembled :class:`Completion` of a FINISHED choice.

        Args:
            latency_s: seconds from send to end; defaults to ``clock() - t_start``.

        Raises:
            RuntimeError: no non-empty ``finish_reason`` arrived (:attr:`finished` is False): an unfinished
                stream is never a completion (the client raises ``DISCONNECT`` instead).
        """
        if self.finish_reason is None:
            raise RuntimeError("completion() of an unfinished choice (no finish_reason arrived)")
        if latency_s is None:
            latency_s = self._clock() - self._t_start
        flags = list(self.flags)
        fin, aliased = resolve_finish(self.finish_reason, self._aliases)
        native = self.native_finish_reason
        if aliased:
            flags.append("finish_alias")
            native = native or self.finish_reason  # the provider's own spelling stays on record
        usage_raw = self.usage_raw
        if self._usage_preview and (self.progress.chars_received or self._tools):
            usage_raw = None  # only a preview came, before the text: not this generation's usage
            flags.append("usage_preview")
        usage, usage_flags = read_usage(usage_raw)
        flags += usage_flags
        raw = raw_usage_figures(usage_raw) if "usage_invalid" in usage_flags else None
        flags += self._tools.flags
        return Completion(
            reasoning="".join(self._reasoning),
            content="".join(self._content),
            tool_calls=self.tool_calls(),
            finish_reason=fin,
            native_finish_reason=native,
            usage=usage,
            provider=self.provider,
            model=self.model,
            generation_id=self.generation_id,
            latency_s=latency_s,
            ttft_s=self.ttft_s,
            usage_reported=usage_present(usage_raw),
            flags=tuple(dict.fromkeys(flags)),
            token_ids=self.token_ids(),
            usage_raw=raw,
            system_fingerprint=self._ident.system_fingerprint,
        )

    def error(self, error_class: ErrorClass, message: str, *, status: int = 0) -> RequestError:
        """A :class:`RequestError` carrying what this stream received so far (tokens, provider, id, cost)."""
        return RequestError(
            error_class,
            message,
            status=status,
            provider=self.provider,
            generation_id=self.generation_id,
            tokens_received=self.tokens_received,
            partial_cost_usd=self.progress.cost_usd,
        )

    def _midstream(self, err: Any) -> RequestError:
        """The error for an error object inside a 200 response: classified by its code
        (:func:`~engine.client.errors.classify_error_object`), carrying what this stream received so far."""
        e = classify_error_object(err, generation_id=self.generation_id)
        provider = e.provider
        if provider and not self.provider:
            self.provider = self.progress.provider = provider
        e.provider = provider or self.provider
        billed = read_usage(self.usage_raw)[0].completion_tokens if self.usage_raw else 0
        e.tokens_received = max(self.tokens_received, billed)  # an error chunk's usage may bill more than arrived
        e.partial_cost_usd = self.progress.cost_usd
        return e


def parse_completion_body(
    text: str | bytes,
    headers: Mapping[str, str] | None = None,
    *,
    latency_s: float = 0.0,
    progress: StreamProgress | None = None,
    finish_aliases: Mapping[str, str] | None = None,
) -> Completion:
    """Parse a NON-streaming 200 body into a :class:`Completion`.

    Leading whitespace padding (keep-alive newlines/spaces sent before the JSON) is stripped; invalid UTF-8
    is decoded with U+FFFD (then flagged ``replacement_char``, :func:`engine.client.conformance.finalize`).
    A 200 body that
    carries an error (top-level ``error`` with null content, or ``choices[0].finish_reason == "error"`` with
    ``choices[0].error``) raises the error its code stands for, like an HTTP error with that status
    (``MIDSTREAM`` when code-less; :func:`~engine.client.errors.classify_error_object`); an unparseable or
    empty body, and a choice without a non-empty ``finish_reason`` (not finished), raise ``PROTOCOL``.

    Args:
        text: the response body.
        headers: response headers (for ``X-Generation-Id``).
        latency_s: seconds from send to the end of the body (also reported as ``ttft_s`` when anything was
            generated: a non-streaming body arrives at once).
        progress: optional :class:`StreamProgress` to update (generation id, chars received).
        finish_aliases: as :class:`StreamAccumulator`'s.
    """
    gid = get_header(headers, "X-Generation-Id") or ""
    if isinstance(text, bytes):
        raw = text.lstrip()
    else:
        raw = text.lstrip().encode() if text else b""
    if not raw:
        raise RequestError(ErrorClass.PROTOCOL, "empty response body", status=200, generation_id=gid)
    try:
        try:
            body = json.loads(raw)
        except UnicodeDecodeError:  # invalid UTF-8 inside the JSON: U+FFFD, as the SSE path (flagged later)
            body = json.loads(raw.decode("utf-8", "replace"))
    except ValueError:
        raise RequestError(
            ErrorClass.PROTOCOL,
            f"response body is not JSON: {truncate(raw[:600].decode('utf-8', 'replace'))}",
            status=200,
            generation_id=gid,
        ) from None
    if not isinstance(body, dict):
        raise RequestError(ErrorClass.PROTOCOL, "response body is not a JSON object", status=200, generation_id=gid)
    acc = StreamAccumulator(t_start=0.0, progress=progress, clock=lambda: latency_s, generation_id=gid,
                            finish_aliases=finish_aliases)
    acc._meta(body)
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = _obj if isinstance(_obj := choice.get("message"), dict) else {}
    # Count what was generated first, so an error raised below carries it.
    content = message.get("content")
    content = content if isinstance(content, str) else ""
    reasoning = reasoning_text(message)
    if content:
        acc._content.append(content)
    if reasoning:
        acc._reasoning.append(reasoning)
    chars = len(content) + len(reasoning)
    tcs = message.get("tool_calls")
    if isinstance(tcs, list) and tcs:
        fixed = [dict(tc, index=i) if isinstance(tc, dict) else tc for i, tc in enumerate(tcs)]
        chars += acc._tool_deltas(fixed)
    acc.progress.chars_received += chars
    acc._usage(body)
    err = body.get("error")
    if err is not None:
        raise acc._midstream(err)
    fr = choice.get("finish_reason")
    if fr == "error" or choice.get("error") is not None:
        raise acc._midstream(choice.get("error") or {"message": "finish_reason=error with no error object"})
    if not choice:
        raise acc.error(ErrorClass.PROTOCOL, "response body has no choices")
    acc.finish_reason = finish_value(fr)
    if acc.finish_reason is None:
        raise acc.error(ErrorClass.PROTOCOL, f"response body's choice has no finish_reason ({fr!r}): not finished",
                        status=200)
    nfr = choice.get("native_finish_reason")
    acc.native_finish_reason = str(nfr) if nfr is not None else None
    tids = choice.get("token_ids")
    if tids:
        acc._ids(tids)
    acc.ttft_s = latency_s if acc.progress.chars_received else None
    return acc.completion(latency_s=latency_s)
