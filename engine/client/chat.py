"""Async chat-completions client for OpenRouter (and any OpenAI-compatible server, e.g. the simulator).

One :meth:`ChatClient.complete` call is exactly ONE attempt: every failure mode becomes a :class:`RequestError`
with an :class:`ErrorClass` (retrying is :mod:`engine.client.retry`'s job). Failure modes:

=====================================================  ==============================================
what happened                                          raised
=====================================================  ==============================================
HTTP status >= 300 (body read and classified)          see :func:`~engine.client.errors.classify_http_error`
cannot connect / connect timeout                       ``CONNECT``
no bytes for ``stall_timeout_s`` (httpx read timeout)  ``STALL`` (carries ``tokens_received``); with
                                                       :attr:`~RequestError.no_answer` when not one byte
                                                       of a response came (no status line, or headers
                                                       and no body byte): the endpoint does not answer
whole request over ``total_timeout_s``                 ``TIMEOUT`` (carries ``tokens_received``)
reset / peer closed before ``[DONE]`` and finish       ``DISCONNECT`` (carries ``tokens_received``)
stream ended (``[DONE]`` or not) without a finish      ``DISCONNECT`` (retried; ``""``/null never finish)
error chunk in a 200 stream / 200 body with an error   the class of the HTTP status its ``code`` stands
                                                       for (429 ``RATE_LIMIT``, 402 ``CREDITS``, ...);
                                                       ``MIDSTREAM`` when code-less
undecodable chunk / body                               ``PROTOCOL``
200 body whose choice has no finish_reason             ``PROTOCOL``
=====================================================  ==============================================

A stream whose non-empty ``finish_reason`` arrived is returned as a :class:`Completion` even if the connection
then breaks before ``[DONE]``: the text is complete (usage may then be missing: ``usage_reported`` False).
Streamed requests ask for usage with ``stream_options: {"include_usage": true}`` unless ``stream_usage=False``
(vLLM, SGLang and OpenAI send no usage in a stream without it; OpenRouter accepts it). With
``return_token_ids=True`` every request also asks for the generated token ids (vLLM >= 0.10.2); they come back in
:attr:`Completion.token_ids` (:mod:`engine.client.accumulate` reads them).

The API key is never put into a message, repr or log: messages are built from response data and exception class
names only, and every raised message is additionally scrubbed of the key.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncGenerator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import httpx

from engine.loopback import is_loopback_host

from .accumulate import StreamAccumulator, StreamProgress, parse_completion_body
from .conformance import finalize, finish_aliases
from .errors import classify_http_error
from .pool import ShardedTransport, env_proxy_for
from .responses import truncate
from .secrets import Secret, check_header_secret, redact, secret_forms
from .sse import DONE, SSEDecodeError, SSEParser
from .types import ChatRequest, Completion, ErrorClass, RequestError

if TYPE_CHECKING:
    from .aiostream import AioResponse, AioStream

__all__ = ["ChatClient", "StreamProgress", "is_loopback_host"]

_ERROR_BODY_LIMIT = 64 * 1024
"""At most this many bytes of an error response body are read."""


def _gated(gate: Callable[[], Awaitable[None]]) -> Callable[[str, dict], Awaitable[None]]:
    """httpcore's ``trace`` extension awaiting ``gate`` as the request headers start to be written."""
    async def trace(event: str, info: dict) -> None:
        if event.endswith("send_request_headers.started"):
            await gate()
    return trace


def _progress_error(cls: ErrorClass, msg: str, progress: StreamProgress) -> RequestError:
    """A :class:`RequestError` carrying what ``progress`` knows of the attempt (status, provider, id, tokens, cost)."""
    return RequestError(cls, msg, status=progress.status, provider=progress.provider,
                        generation_id=progress.generation_id, tokens_received=progress.tokens_received,
                        partial_cost_usd=progress.cost_usd)


class ChatClient:
    """Async OpenAI-compatible chat-completions client (OpenRouter dialect), HTTP/1.1, pooled.

    Args:
        base_url: API root, e.g. ``https://openrouter.ai/api/v1`` (``/chat/completions`` is appended).
        api_key: sent as ``Authorization: Bearer KEY`` when given. Refused (``ValueError``) over plain ``http://``
            to anything but a loopback host, and with credentials in ``base_url`` (``user:pass@``: httpx
            would send those as Basic auth instead of the key).
        stream: use SSE streaming (default) or plain JSON bodies.
        connect_timeout_s: TCP+TLS connect limit (s).
        stall_timeout_s: longest silence tolerated while waiting for / reading the response (s); keep-alive
            comments and whitespace padding count as bytes. For ``stream=False`` against a server that sends no
            padding, this must exceed the generation time.
        total_timeout_s: limit for one whole request, including waiting for a pooled connection (s).
        max_connections: connection-pool size (and keep-alive pool size): one connection per concurrent stream.
        pool_shard_size: connections per pool shard (see :mod:`engine.client.pool`: httpcore's pool bookkeeping
            is quadratic in its size, so the connections are split over ``max_connections / pool_shard_size``
            small pools).
        headers: extra headers for every request.
        referer: optional ``HTTP-Referer`` (OpenRouter app attribution).
        title: optional ``X-Title`` (OpenRouter app attribution).
        trust_env: honour ``HTTPS_PROXY``/``NO_PROXY`` and ``SSL_CERT_FILE``/``SSL_CERT_DIR`` from the environment.
        drain_timeout_s: after ``[DONE]``, how long to wait for the end of the HTTP body so the connection can be
            reused (s).
        stream_usage: with ``stream``, send ``stream_options: {"include_usage": true}`` (merged into any
            ``stream_options`` the request body already has). Never sent on non-streamed requests (servers
            refuse ``stream_options`` without ``stream``).
        finish_reasons: more aliases of the standard finish reasons (``{"eos": "stop"}``), on top of
            :data:`~engine.client.conformance.DEFAULT_FINISH_ALIASES` (``[provider] finish_reasons``).
        return_token_ids: add ``"return_token_ids": true`` to every request body (vLLM >= 0.10.2 then returns
            the generated ids, read into :attr:`Completion.token_ids`; ``[provider] return_token_ids``). Off by
            default: a server that does not know the field may refuse the request (400).
        http_backend: the library of the chat-completions POST: ``"httpx"`` or ``"aiohttp"``
            (:mod:`engine.client.aiostream`: same errors and parsing, about half the CPU per stream; with an
            environment proxy that is not http(s), httpx). Every other call uses httpx.

    Raises:
        ValueError: a bad ``base_url``, key or alias (named in the message, never the key).
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        *,
        stream: bool = True,
        connect_timeout_s: float = 10,
        stall_timeout_s: float = 120,
        total_timeout_s: float = 1800,
        max_connections: int = 4096,
        headers: dict[str, str] | None = None,
        referer: str | None = None,
        title: str | None = None,
        trust_env: bool = True,
        drain_timeout_s: float = 2.0,
        pool_shard_size: int = 32,
        stream_usage: bool = True,
        finish_reasons: dict[str, str] | None = None,
        return_token_ids: bool = False,
        http_backend: str = "httpx",
    ) -> None:
        try:
            url = httpx.URL(base_url)
        except Exception:
            raise ValueError("invalid base_url") from None
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"base_url must be an http(s) URL with a host, got scheme {url.scheme!r}")
        extra = dict(headers or {})
        if api_key:
            check_header_secret(api_key)
        sends_secret = bool(api_key) or any(k.lower() == "authorization" for k in extra)
        if sends_secret and url.userinfo:  # httpx would send them as Basic auth in place of the key
            raise ValueError("credentials in the URL are not supported with an API key (they would be sent as "
                             "Basic auth instead of it)")
        if sends_secret and url.scheme == "http" and not is_loopback_host(url.host):
            raise ValueError(
                f"refusing to send an API key over plain http:// to non-loopback host {url.host!r}; use https://"
            )
        self._base = str(url).rstrip("/")
        self._chat_url = self._base + "/chat/completions"
        self._stream = stream
        self._stream_usage = bool(stream_usage)
        self._return_token_ids = bool(return_token_ids)
        self._aliases = finish_aliases(finish_reasons)
        self._stall = float(stall_timeout_s)
        self._total = float(total_timeout_s)
        self._drain = float(drain_timeout_s)
        self._key = Secret(api_key) if api_key else None
        hdrs: dict[str, str] = {"Content-Type": "application/json"}
        if referer:
            hdrs["HTTP-Referer"] = referer
        if title:
            hdrs["X-Title"] = title
        hdrs.update(extra)
        if api_key:
            hdrs["Authorization"] = f"Bearer {api_key}"
        # Secrets among user headers are scrubbed from messages too, in every form a message may quote them.
        self._secrets = secret_forms(
            s for s in ([api_key] if api_key else []) + [v for k, v in extra.items() if k.lower() == "authorization"] if s
        )
        if http_backend not in ("httpx", "aiohttp"):
            raise ValueError(f"http_backend must be 'httpx' or 'aiohttp', got {http_backend!r}")
        tls, proxy = httpx.create_ssl_context(trust_env=trust_env), env_proxy_for(url) if trust_env else None
        self._transport = ShardedTransport(max_connections=max_connections, shard_size=pool_shard_size,
                                           keepalive_expiry=20.0, ssl_context=tls, proxy=proxy)
        self._aio: AioStream | None = None
        if http_backend == "aiohttp" and (proxy is None or proxy.lower().startswith(("http://", "https://"))):
            from .aiostream import AioStream
            self._aio = AioStream(self._chat_url, hdrs, connect_timeout_s=float(connect_timeout_s),
                                  stall_timeout_s=self._stall, max_connections=max_connections, keepalive_s=20.0,
                                  ssl_context=tls, proxy=proxy)
        self._http = httpx.AsyncClient(
            headers=hdrs,
            timeout=httpx.Timeout(
                connect=float(connect_timeout_s), read=self._stall, write=self._stall, pool=None
            ),
            transport=self._transport,
            follow_redirects=False,  # a redirect must never carry the key to another host
            trust_env=trust_env,
        )

    # -- lifecycle --------------------------------------------------------------------------------------------

    def __repr__(self) -> str:
        return f"ChatClient(base_url={self._base!r}, stream={self._stream}, api_key={'<set>' if self._key else None})"

    async def aclose(self) -> None:
        """Close the connection pools."""
        await self._http.aclose()
        if self._aio is not None:
            await self._aio.aclose()

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    @property
    def stream(self) -> bool:
        """Whether requests are streamed (SSE)."""
        return self._stream

    # -- public calls -----------------------------------------------------------------------------------------

    async def complete(self, req: ChatRequest, progress: StreamProgress | None = None,
                       gate: Callable[[], Awaitable[None]] | None = None) -> Completion:
        """Send ONE chat-completions request and return the assembled :class:`Completion`.

        Args:
            req: what to send (``stream`` is set from the client).
            progress: optional :class:`StreamProgress`, reset at the start and updated live (tokens received,
                generation id, provider, status, cost): read it after a cancellation to account the spend of an
                aborted stream.
            gate: awaited once, on the connection, right before the request's first byte is written (after
                any wait for a pooled connection and the connect); whatever it raises ends the call with
                nothing sent, raised as is (:mod:`engine.stream.worker` holds a paused run's requests there).

        Raises:
            RequestError: every failure (see the module table); never contains the API key.
            asyncio.CancelledError: on cancellation, after the connection was closed (the server sees it).
        """
        if progress is None:
            progress = StreamProgress()
        else:
            progress.reset()  # one progress object may be reused across attempts: it describes THIS attempt
        fields = req.to_body(self._stream)
        if self._stream and self._stream_usage:
            opts = fields.get("stream_options")
            fields["stream_options"] = {**(opts if isinstance(opts, dict) else {}), "include_usage": True}
        if self._return_token_ids:
            fields["return_token_ids"] = True
        body = json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode()
        t0 = time.monotonic()
        try:
            async with asyncio.timeout(self._total):
                return finalize(req, await self._complete(body, progress, t0, gate))
        except TimeoutError:
            raise self._scrub(_progress_error(
                ErrorClass.TIMEOUT, f"no complete response within the total timeout of {self._total:g}s", progress
            )) from None
        except RequestError as e:
            raise self._scrub(e) from None

    async def get_json(self, path: str, params: dict[str, Any] | None = None) -> Any:
        """GET ``base_url + path`` (e.g. ``/key``, ``/credits``, ``/models``) and return the decoded JSON.

        Raises:
            RequestError: HTTP error statuses (classified), transport failures, non-JSON bodies.
        """
        url = self._base + (path if path.startswith("/") else "/" + path)
        progress = StreamProgress()
        try:
            async with asyncio.timeout(self._total):
                try:
                    resp = await self._http.get(url, params=params)
                except (httpx.HTTPError, OSError) as e:
                    raise self._transport_error(e, progress, f"GET {path}") from None
                if resp.status_code >= 300 or resp.status_code < 200:
                    raise classify_http_error(
                        resp.status_code, resp.headers, resp.content[:_ERROR_BODY_LIMIT]
                    )
                try:
                    return json.loads(resp.content)
                except ValueError:
                    raise RequestError(
                        ErrorClass.PROTOCOL,
                        f"GET {path}: body is not JSON: {truncate(resp.text[:600])}",
                        status=resp.status_code,
                    ) from None
        except TimeoutError:
            raise RequestError(ErrorClass.TIMEOUT, f"GET {path}: over {self._total:g}s") from None
        except RequestError as e:
            raise self._scrub(e) from None

    # -- internals --------------------------------------------------------------------------------------------

    def _scrub(self, e: RequestError) -> RequestError:
        """Remove any secret the server (or a library message) may quote from the error's message and args."""
        e.message = redact(e.message, self._secrets)
        e.args = tuple(redact(a, self._secrets) if isinstance(a, str) else a for a in e.args)
        return e

    def _transport_error(self, exc: BaseException, progress: StreamProgress, phase: str,
                         silent: str | None = None) -> RequestError:
        """Map an httpx / OS exception to a :class:`RequestError` (never stringifies the request).
        ``silent``: the message of a stall in which no byte of a response came (the error is then
        :attr:`~RequestError.no_answer`); None when some did."""
        name = type(exc).__name__
        no_answer = False
        if isinstance(exc, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
            cls, msg = ErrorClass.CONNECT, f"cannot connect ({name}: {exc})"
        elif isinstance(exc, (httpx.ReadTimeout, httpx.WriteTimeout)):
            cls, msg = ErrorClass.STALL, f"no bytes for {self._stall:g}s (stall timeout) while {phase}"
            if silent is not None:
                msg, no_answer = silent, True
        elif isinstance(exc, (httpx.NetworkError, httpx.RemoteProtocolError, OSError)):
            cls, msg = ErrorClass.DISCONNECT, f"connection lost while {phase} ({name}: {exc})"
        elif isinstance(exc, SSEDecodeError):
            cls, msg = ErrorClass.PROTOCOL, f"{exc}: {truncate(exc.payload.decode('utf-8', 'replace'), 200)}"
        elif isinstance(exc, httpx.HTTPError):
            cls, msg = ErrorClass.PROTOCOL, f"HTTP protocol error while {phase} ({name}: {exc})"
        else:
            cls, msg = ErrorClass.PROTOCOL, f"unexpected {name} while {phase}: {exc}"
        err = _progress_error(cls, truncate(msg), progress)
        err.no_answer = no_answer
        return err

    async def _complete(self, body: bytes, progress: StreamProgress, t0: float,
                        gate: Callable[[], Awaitable[None]] | None = None) -> Completion:
        try:
            resp = await self._send(body, gate)
        except (httpx.HTTPError, OSError) as e:
            # connected, and not even a status line came back within the stall timeout: no answer
            raise self._transport_error(e, progress, "waiting for response headers", silent=(
                f"the server accepts connections but has not answered in {self._stall:g}s "
                f"(no status line; stall timeout)")) from None
        try:
            status = resp.status_code
            progress.status = status
            gid = resp.headers.get("x-generation-id") or ""
            if gid:
                progress.generation_id = gid
            if status >= 300 or status < 200:
                raise await self._http_error(resp, progress, gid)
            ctype = resp.headers.get("content-type", "").lower()
            if self._stream and ("event-stream" in ctype or not ctype):
                return await self._read_stream(resp, progress, t0, gid)
            if "json" not in ctype and (self._stream or "html" in ctype):
                # e.g. an HTML page from a proxy or captive portal with status 200
                head = (await self._read_limited(resp))[:2000].decode("utf-8", "replace")
                raise RequestError(
                    ErrorClass.PROTOCOL,
                    f"unexpected content-type {truncate(ctype, 80)!r}: {truncate(head, 300)}",
                    status=status,
                    generation_id=gid,
                )
            # Non-streaming (or a server that answered a stream request with a plain JSON body).
            try:
                raw = await resp.aread()
            except (httpx.HTTPError, OSError) as e:
                raise self._transport_error(e, progress, "reading the response body") from None
            return parse_completion_body(raw, resp.headers, latency_s=time.monotonic() - t0, progress=progress,
                                         finish_aliases=self._aliases)
        finally:
            await resp.aclose()

    async def _send(self, body: bytes, gate: Callable[[], Awaitable[None]] | None) -> httpx.Response | AioResponse:
        """POST ``body`` (with ``http_backend``'s library); the response once its headers came."""
        if self._aio is not None:
            return await self._aio.post(body, gate)
        request = self._http.build_request("POST", self._chat_url, content=body)
        if gate is not None:
            request.extensions["trace"] = _gated(gate)
        return await self._http.send(request, stream=True)

    @staticmethod
    async def _read_limited(resp: httpx.Response | AioResponse) -> bytes:
        """Up to :data:`_ERROR_BODY_LIMIT` bytes of the body; transport errors end the read quietly."""
        chunks: list[bytes] = []
        size = 0
        try:
            async for b in resp.aiter_bytes():
                chunks.append(b)
                size += len(b)
                if size >= _ERROR_BODY_LIMIT:
                    break
        except (httpx.HTTPError, OSError):
            pass  # classify from the status and whatever body arrived
        return b"".join(chunks)[:_ERROR_BODY_LIMIT]

    async def _http_error(self, resp: httpx.Response | AioResponse, progress: StreamProgress, gid: str) -> RequestError:
        body = await self._read_limited(resp)
        return classify_http_error(resp.status_code, resp.headers, body, generation_id=gid)

    async def _read_stream(self, resp: httpx.Response | AioResponse, progress: StreamProgress, t0: float, gid: str) -> Completion:
        acc = StreamAccumulator(t_start=t0, progress=progress, generation_id=gid, finish_aliases=self._aliases)
        parser = SSEParser()
        # httpx declares an AsyncIterator; aiter_bytes is an async generator, which has aclose
        it = cast(AsyncGenerator[bytes, None], resp.aiter_bytes())
        try:
            return await self._consume(it, acc, parser, progress)
        finally:
            await it.aclose()

    async def _consume(
        self, it: Any, acc: StreamAccumulator, parser: SSEParser, progress: StreamProgress
    ) -> Completion:
        feed = acc.feed
        done = False
        got = False  # any byte of the body (a keep-alive comment counts: the server is answering)
        try:
            async for data in it:
                got = True
                for ev in parser.feed(data):
                    if done:  # read in the same bytes as [DONE]: only a late usage counts
                        if ev is not DONE:
                            acc.feed_late(ev)
                    elif ev is DONE:
                        done = True
                    else:
                        feed(ev)
                if done:
                    break
            else:
                parser.flush()  # an unterminated last event is discarded, never dispatched (SSE standard)
        except RequestError:
            raise
        except SSEDecodeError as e:
            if not acc.finished:
                raise self._transport_error(e, progress, "parsing the stream") from None
        except (httpx.HTTPError, OSError) as e:
            if not acc.finished:
                silent = None if got else (f"the server sent response headers (HTTP {progress.status}) but "
                                           f"not one byte of the body in {self._stall:g}s (stall timeout)")
                raise self._transport_error(e, progress, "reading the stream", silent=silent) from None
            # The finish arrived, so the text is complete; only [DONE] (and maybe usage) was lost.
        if not acc.finished:
            # Only a non-empty finish_reason finishes a choice: whatever else arrived ([DONE], text, usage,
            # finish_reason ""), the generation may have been cut, so it is never stored; it is retried.
            seen = [f"{acc.chunks} chunk(s)", f"~{acc.tokens_received} tokens"]
            if acc.empty_finishes:
                seen.append(f'{acc.empty_finishes} with finish_reason ""')
            if parser.discarded:
                seen.append("an unterminated event discarded at the end")
            end = "[DONE]" if done else "the end of the body"
            raise acc.error(ErrorClass.DISCONNECT,
                            f"stream ended ({end}) without a finish_reason after {', '.join(seen)}", status=200)
        if done:
            # Read to the end of the HTTP body (usually already buffered) so the connection goes back to the pool
            # instead of being closed; a usage chunk some servers send after [DONE] is still read.
            try:
                async with asyncio.timeout(self._drain):
                    async for data in it:
                        for ev in parser.feed(data):
                            if ev is not DONE:
                                acc.feed_late(ev)
            except (TimeoutError, httpx.HTTPError, OSError, SSEDecodeError):
                pass
        return acc.completion()
