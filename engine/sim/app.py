"""Routes of the simulated OpenRouter API (``/api/v1/...``) and the chat request pipeline.

Pipeline of ``POST /chat/completions`` (wire facts: docs/openrouter.md): auth (401) -> body validation
(400, incl. ``context_length_exceeded``) -> credits (402: billed total reached, or the remaining
credits cannot pay for ``max_tokens``) -> provider routing (503 when ``only``/``ignore``/``order``
leave nothing) -> one seeded fault draw per request sequence number -> delivery (:mod:`.chat`).

A request may force its fault with the simulator-only header ``X-Sim-Fault: KIND`` (or ``none``);
real OpenRouter ignores the header. Tests use it to mix faulty and healthy requests on one server.

With a model-backed simulator (``SimConfig.target``), the completion is sampled by
:class:`engine.sim.backend.ModelBackend` in its thread pool (the request's ``temperature`` and
``top_p`` are checked first: 400 for a negative temperature or a top_p outside (0, 1]); otherwise it
is the word generator's plan. ``GET /models/{author}/{slug}/endpoints`` lists one endpoint per
provider (:mod:`engine.sim.endpoints`).
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import secrets
import time
from typing import TYPE_CHECKING, Any

from engine.prompts import prompt_key
from engine.simfaults import FAULT_KINDS

from .chat import ChatJob
from .config import SimConfig
from .endpoints import endpoint_tag, endpoints_listing, models_listing, per_token
from .generator import DATA_FAULTS, DEFAULT_MAX_TOKENS, TokenCounter, inject_data_fault, make_plan
from .http import HttpConnection, Request
from .ledger import Ledger
from .wire import CONTEXT_LENGTH, dumps, error_body

if TYPE_CHECKING:
    from .backend import ModelBackend

PREFIX = "/api/v1"
_JSON = [("content-type", "application/json")]
_CREDITS_URL = "https://openrouter.ai/settings/credits"


class SimApp:
    """The API behaviour behind :class:`engine.sim.SimServer` (one instance per server)."""

    def __init__(self, cfg: SimConfig, ledger: Ledger, counter: TokenCounter,
                 backend: "ModelBackend | None" = None) -> None:
        self.cfg = cfg
        self.ledger = ledger
        self.counter = counter
        self.backend = backend
        self.served_model = f"{cfg.model}-0127"
        self._cum: list[tuple[float, str]] = []
        acc = 0.0
        for kind in FAULT_KINDS:
            p = cfg.faults.get(kind, 0.0)
            if p > 0:
                acc += p
                self._cum.append((acc, kind))

    # -- dispatch ------------------------------------------------------------------------------
    async def handle(self, conn: HttpConnection, req: Request) -> None:
        """Answer one request (the ``http.serve_connection`` handler)."""
        path = req.path.rstrip("/") or "/"
        route = path[len(PREFIX) :] if path.startswith(PREFIX + "/") else None
        if route == "/chat/completions" and req.method == "POST":
            await self.chat(conn, req)
            return
        if route == "/models" and req.method == "GET":
            await conn.respond(200, _JSON, dumps(self.models()).encode())
            return
        if route is not None and route.startswith("/models/") and route.endswith("/endpoints") and req.method == "GET":
            await self.endpoints(conn, route[len("/models/"):-len("/endpoints")])
            return
        if route in ("/key", "/auth/key", "/credits", "/generation") and req.method == "GET":
            if not self._authorized(req):
                await self._unauthorized(conn)
            elif route == "/credits":
                await conn.respond(200, _JSON, dumps(self.credits()).encode())
            elif route == "/generation":
                await self.generation(conn, req)
            else:
                await conn.respond(200, _JSON, dumps(self.key()).encode())
            return
        await conn.respond(404, _JSON, error_body(404, f"Not Found: {req.method} {req.path}"))

    @staticmethod
    def _authorized(req: Request) -> bool:
        auth = req.headers.get("authorization", "")
        return auth.lower().startswith("bearer ") and bool(auth[7:].strip())

    @staticmethod
    async def _unauthorized(conn: HttpConnection) -> None:
        await conn.respond(401, _JSON, error_body(401, "No auth credentials found"))

    # -- account endpoints ---------------------------------------------------------------------
    def key(self) -> dict[str, Any]:
        """``GET /key``: ``usage`` is the ledger's billed total (USD); limits from ``credits_usd``."""
        billed = self.ledger.billed_usd
        credits = self.cfg.credits_usd
        return {
            "data": {
                "label": "sim",
                "limit": credits,
                "limit_remaining": None if credits is None else credits - billed,
                "limit_reset": None,
                "include_byok_in_limit": False,
                "usage": billed,
                "usage_daily": billed,
                "usage_weekly": billed,
                "usage_monthly": billed,
                "byok_usage": 0,
                "is_free_tier": False,
                "is_provisioning_key": False,
                "rate_limit": {"requests": -1, "interval": "10s"},
            }
        }

    def credits(self) -> dict[str, Any]:
        """``GET /credits``: total credits (1e9 when unlimited) and total usage (USD)."""
        credits = self.cfg.credits_usd
        return {"data": {"total_credits": 1e9 if credits is None else credits, "total_usage": self.ledger.billed_usd}}

    def models(self) -> dict[str, Any]:
        """``GET /models``: the one model, prices as USD-per-token strings (:func:`engine.sim.endpoints.models_listing`)."""
        cfg = self.cfg
        return models_listing(model=cfg.model, served_model=self.served_model, price_in=per_token(cfg.price_in),
                              price_out=per_token(cfg.price_out), context_length=CONTEXT_LENGTH,
                              max_completion_tokens=DEFAULT_MAX_TOKENS)

    async def endpoints(self, conn: HttpConnection, model: str) -> None:
        """``GET /models/{author}/{slug}/endpoints``: one endpoint per provider (404 for another model)."""
        cfg = self.cfg
        if model.lower() not in (cfg.model.lower(), self.served_model.lower()):
            await conn.respond(404, _JSON, error_body(404, f"No endpoints found for {model}."))
            return
        body = endpoints_listing(model=cfg.model, providers=cfg.providers, quantization=cfg.quantization,
                                 price_in=per_token(cfg.price_in), price_out=per_token(cfg.price_out),
                                 context_length=CONTEXT_LENGTH, max_completion_tokens=DEFAULT_MAX_TOKENS)
        await conn.respond(200, _JSON, dumps(body).encode())

    async def generation(self, conn: HttpConnection, req: Request) -> None:
        """``GET /generation?id=gen-...``: stats of a finished generation, 404 until it finished."""
        rec = self.ledger.generation(req.query.get("id", ""))
        if rec is None:
            await conn.respond(404, _JSON, error_body(404, "Generation not found"))
            return
        data = {
            "id": rec.generation_id,
            "model": self.served_model,
            "provider_name": rec.provider,
            "total_cost": rec.cost_usd,
            "tokens_prompt": rec.prompt_tokens,
            "tokens_completion": rec.completion_tokens_billed,
            "native_tokens_prompt": rec.prompt_tokens,
            "native_tokens_completion": rec.completion_tokens_billed,
            "native_tokens_reasoning": rec.reasoning_tokens,
            "streamed": rec.stream,
            "cancelled": rec.outcome == "client_dropped",
            "finish_reason": None,
            "latency": None,
            "generation_time": None,
        }
        await conn.respond(200, _JSON, dumps({"data": data}).encode())

    # -- chat ----------------------------------------------------------------------------------
    def route_provider(self, routing: Any, seq: int) -> str | None:
        """Pick the provider for a request honouring ``only``, ``ignore``, ``order`` and
        ``allow_fallbacks``; a slug matches a name case-insensitively, or its ``slug/variant``s, or
        its endpoint's tag (``name/quantization``, :func:`engine.sim.endpoints.endpoint_tag`).
        Without ``order`` the pick is seeded by the request sequence number. None = no provider.
        """
        names = list(self.cfg.providers)
        routing = routing if isinstance(routing, dict) else {}

        quant = self.cfg.quantization

        def match(name: str, slug: Any) -> bool:
            n, s = name.lower(), str(slug).lower()
            return n == s or n.startswith(s + "/") or s == endpoint_tag(name, quant)

        only = routing.get("only")
        if isinstance(only, list):
            names = [n for n in names if any(match(n, s) for s in only)]
        ignore = routing.get("ignore")
        if isinstance(ignore, list):
            names = [n for n in names if not any(match(n, s) for s in ignore)]
        order = routing.get("order")
        if isinstance(order, list) and order:
            ordered: list[str] = []
            for s in order:
                ordered += [n for n in names if match(n, s) and n not in ordered]
            if ordered:
                return ordered[0]
            if routing.get("allow_fallbacks") is False:
                return None
        if not names:
            return None
        return names[random.Random(f"sim-route:{self.cfg.seed}:{seq}").randrange(len(names))]

    def draw_fault(self, seq: int) -> str | None:
        """The fault of request ``seq``: one seeded uniform draw against the stacked probabilities."""
        if not self._cum:
            return None
        u = random.Random(f"sim-fault:{self.cfg.seed}:{seq}").random()
        for acc, kind in self._cum:
            if u < acc:
                return kind
        return None

    def _log_refusal(self, seq: int, outcome: str, key: str = "", stream: bool = False, provider: str = "") -> None:
        self.ledger.record(
            seq=seq, generation_id="", prompt_key=key, provider=provider, outcome=outcome, fault=None,
            fully_sent=True, stream=stream,
        )

    async def _refuse(self, conn: HttpConnection, seq: int, status: int, body: bytes, **log: Any) -> None:
        await conn.respond(status, _JSON, body)
        self._log_refusal(seq, str(status), **log)

    async def chat(self, conn: HttpConnection, req: Request) -> None:
        """``POST /chat/completions`` (see the module docstring for the pipeline)."""
        cfg = self.cfg
        seq = self.ledger.next_seq()
        if not self._authorized(req):
            await self._unauthorized(conn)
            self._log_refusal(seq, "401")
            return
        try:
            body = json.loads(req.body or b"null")
        except (ValueError, UnicodeDecodeError):
            await self._refuse(conn, seq, 400, error_body(400, "Invalid JSON in request body"))
            return
        if not isinstance(body, dict):
            await self._refuse(conn, seq, 400, error_body(400, "Request body must be a JSON object"))
            return
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages or not all(isinstance(m, dict) for m in messages):
            await self._refuse(conn, seq, 400, error_body(400, "messages: expected a non-empty array of objects"))
            return
        tools = body.get("tools")
        if tools is not None and not isinstance(tools, list):
            await self._refuse(conn, seq, 400, error_body(400, "tools: expected an array"))
            return
        max_tokens = body.get("max_tokens", body.get("max_completion_tokens"))
        if max_tokens is None:
            max_tokens = DEFAULT_MAX_TOKENS
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            await self._refuse(conn, seq, 400, error_body(400, "max_tokens: expected a positive integer"))
            return
        stream = body.get("stream") is True
        key = prompt_key(messages, tools)
        log = {"key": key, "stream": stream}
        if self.backend is not None:
            bad = _sampling_error(body.get("temperature"), body.get("top_p"))
            if bad:
                await self._refuse(conn, seq, 400, error_body(400, bad), **log)
                return
        stream_options = body.get("stream_options")
        if stream_options is not None:
            # OpenAI / vLLM rules: an object, include_usage a boolean, only together with stream.
            if not isinstance(stream_options, dict) or not isinstance(stream_options.get("include_usage", False), bool):
                await self._refuse(conn, seq, 400, error_body(400, "stream_options: expected an object "
                                                                   "{\"include_usage\": boolean}"), **log)
                return
            if not stream:
                await self._refuse(conn, seq, 400, error_body(400, "stream_options: only allowed when stream is true"),
                                   **log)
                return
        include_usage = not cfg.usage_on_request or bool((stream_options or {}).get("include_usage"))
        forced = req.headers.get("x-sim-fault")
        if forced is not None and forced != "none" and forced not in FAULT_KINDS:
            await self._refuse(conn, seq, 400, error_body(400, f"X-Sim-Fault: unknown fault kind {forced!r}"), **log)
            return
        prompt_tokens = self.counter.prompt_tokens(messages, tools)
        if prompt_tokens + max_tokens > CONTEXT_LENGTH:
            msg = (
                f"This endpoint's maximum context length is {CONTEXT_LENGTH} tokens. However, you requested "
                f"about {prompt_tokens + max_tokens} tokens ({prompt_tokens} of text input, {max_tokens} in the "
                "output). Please reduce the length of either one, or use the \"middle-out\" transform."
            )
            meta = {"error_type": "context_length_exceeded"}
            await self._refuse(conn, seq, 400, error_body(400, msg, meta), **log)
            return
        if self.ledger.exhausted():
            msg = f"Insufficient credits: this key has used its limit of ${cfg.credits_usd:g}. Add more at {_CREDITS_URL}"
            await self._refuse(conn, seq, 402, error_body(402, msg, {"error_type": "payment_required"}), **log)
            return
        affordable = self.ledger.affordable_completion_tokens(prompt_tokens) if cfg.credit_precheck else None
        if affordable is not None and affordable < max_tokens:
            await self._refuse(conn, seq, 402, self._payment_body(max_tokens, affordable), **log)
            return
        provider = self.route_provider(body.get("provider"), seq)
        if provider is None:
            body503 = error_body(503, "no provider meets routing constraints", {"error_type": "provider_unavailable"})
            await self._refuse(conn, seq, 503, body503, **log)
            return
        fault = self.draw_fault(seq) if forced is None else (None if forced == "none" else forced)
        fault_index = self.ledger.note_fault(fault) if fault else 0
        if fault in ("429", "500", "502", "503", "402"):
            await self._status_fault(conn, fault, fault_index, provider, max_tokens)
            self.ledger.record(
                seq=seq, generation_id="", prompt_key=key, provider=provider, outcome=fault, fault=fault,
                fully_sent=True, stream=stream,
            )
            return
        if self.backend is not None:
            sample = functools.partial(
                self.backend.plan, provider=provider, seq=seq, messages=messages, tools=tools, max_tokens=max_tokens,
                temperature=body.get("temperature"), top_p=body.get("top_p"), reasoning_opts=body.get("reasoning"))
            plan = await asyncio.get_running_loop().run_in_executor(self.backend.pool, sample)
        else:
            plan = make_plan(
                seed=cfg.seed,
                key=key,
                messages=messages,
                tools=tools,
                max_tokens=max_tokens,
                mean_completion_tokens=cfg.mean_completion_tokens,
                reasoning_fraction=cfg.reasoning_fraction,
                counter=self.counter,
                reasoning_opts=body.get("reasoning"),
                tool_choice=body.get("tool_choice"),
            )
        if fault in DATA_FAULTS:
            inject_data_fault(plan, fault, self.counter, random.Random(f"sim-data-fault:{cfg.seed}:{seq}"))
        created = int(time.time())
        job = ChatJob(
            cfg=cfg, ledger=self.ledger, conn=conn, seq=seq, gid=f"gen-{created}-{secrets.token_hex(10)}",
            created=created, model=self.served_model, provider=provider, key=key, plan=plan, stream=stream,
            fault=fault, fault_index=fault_index, include_usage=include_usage,
        )
        await job.run()

    @staticmethod
    def _payment_body(max_tokens: int, affordable: int) -> bytes:
        msg = (
            f"This request requires more credits, or fewer max_tokens. You requested up to {max_tokens} tokens, "
            f"but can only afford {affordable}. To increase, visit {_CREDITS_URL} and add more credits"
        )
        return error_body(402, msg, {"error_type": "payment_required"})

    async def _status_fault(
        self, conn: HttpConnection, fault: str, index: int, provider: str, max_tokens: int
    ) -> None:
        """Answer with an injected HTTP error status (429 / 500 / 502 / 503 / 402)."""
        headers = list(_JSON)
        raw = dumps({"error": {"message": "upstream error", "code": int(fault)}})
        if fault == "429":
            if index % 2 == 0:
                headers.append(("retry-after", "1"))
            else:
                reset_ms = int((time.time() + 1.0) * 1000)
                headers += [("x-ratelimit-limit", "20"), ("x-ratelimit-remaining", "0"), ("x-ratelimit-reset", str(reset_ms))]
            meta = {"error_type": "rate_limit_exceeded", "provider_name": provider, "raw": raw}
            body = error_body(429, f"{provider} is temporarily rate-limited upstream. Please retry shortly.", meta)
        elif fault == "500":
            body = error_body(500, "Internal Server Error", {"error_type": "server_error"})
        elif fault == "502":
            body = error_body(502, "Provider returned error", {"provider_name": provider, "raw": raw})
        elif fault == "503":
            if index % 2 == 0:
                headers.append(("retry-after", "1"))
            body = error_body(503, "Provider overloaded", {"error_type": "provider_overloaded", "provider_name": provider})
        else:  # 402
            body = self._payment_body(max_tokens, max(0, max_tokens // 3))
        await conn.respond(int(fault), headers, body)


def _sampling_error(temperature: Any, top_p: Any) -> str | None:
    """Why ``temperature`` / ``top_p`` cannot be sampled with (None: fine; absent is fine)."""
    for name, v in (("temperature", temperature), ("top_p", top_p)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
            return f"{name}: expected a number"
    if temperature is not None and temperature < 0:
        return "temperature: must be >= 0"
    if top_p is not None and not 0 < top_p <= 1:
        return "top_p: must be within (0, 1]"
    return None
