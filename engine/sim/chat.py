"""Delivery of one chat completion: streaming (SSE) or not, with the injected faults.

A :class:`ChatJob` is created by ``app.SimApp`` once a request has passed validation, credits,
routing and the fault draw; it owns the per-request state (tokens written so far) and records the
request in the ledger exactly once, whatever happens (completion, client drop, fault, server stop).
Wire shapes come from :mod:`engine.sim.wire` (docs/openrouter.md).
"""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Iterable, Iterator

from .config import SimConfig
from .generator import Plan, chunk_sizes, split_arguments
from .http import ClientGone, HttpConnection
from .ledger import Ledger
from .wire import COMMENT, DONE, ChunkBuilder, completion_object, dumps, error_body, error_object, usage_object

#: Faults that cut a response part-way (billed for what was sent, on every provider).
CUT_FAULTS = ("midstream", "disconnect", "stall")
_BATCH = 16  # SSE events per write when tokens_per_s is unlimited
_MIN_SLEEP_S = 0.05  # at most ~20 writes per second per stream when rate limited


@dataclass
class _Event:
    data: bytes
    tokens: int
    reasoning_tokens: int


class ChatJob:
    """One accepted chat request (after validation, credits, routing and the fault draw)."""

    def __init__(
        self,
        *,
        cfg: SimConfig,
        ledger: Ledger,
        conn: HttpConnection,
        seq: int,
        gid: str,
        created: int,
        model: str,
        provider: str,
        key: str,
        plan: Plan,
        stream: bool,
        fault: str | None,
        fault_index: int,
        include_usage: bool = True,
    ) -> None:
        self.cfg = cfg
        self.ledger = ledger
        self.conn = conn
        self.seq = seq
        self.gid = gid
        self.created = created
        self.model = model
        self.provider = provider
        self.key = key
        self.plan = plan
        self.stream = stream
        self.fault = fault
        self.fault_index = fault_index
        self.include_usage = include_usage
        self.rng = random.Random(f"sim-fault-shape:{cfg.seed}:{seq}")
        self.cut_fraction = self.rng.uniform(0.2, 0.8)
        self.sent_tokens = 0
        self.sent_reasoning = 0
        self.recorded = False
        self.fully_sent = False

    # -- ledger --------------------------------------------------------------------------------
    def _record(self, outcome: str, completion: int, reasoning: int, *, billed: bool = True) -> None:
        if self.recorded:
            return
        self.recorded = True
        self.ledger.record(
            seq=self.seq,
            generation_id=self.gid,
            prompt_key=self.key,
            provider=self.provider,
            outcome=outcome,
            fault=self.fault,
            fully_sent=self.fully_sent,
            stream=self.stream,
            prompt_tokens=self.plan.prompt_tokens if billed else 0,
            completion_tokens=completion if billed else 0,
            reasoning_tokens=reasoning if billed else 0,
            served=str(self.plan.extra.get("served", "")),
        )

    def _record_full(self, outcome: str) -> None:
        self._record(outcome, self.plan.completion_tokens, self.plan.reasoning_tokens)

    def _record_sent(self, outcome: str) -> None:
        self._record(outcome, self.sent_tokens, self.sent_reasoning)

    def _record_dropped(self) -> None:
        """The client went away: cut faults bill what was sent; otherwise the provider decides."""
        if self.fault in CUT_FAULTS:
            self._record_sent(self.fault)
        elif self.stream and self.provider in self.cfg.cancellable_providers:
            self._record_sent("client_dropped")
        else:
            self._record_full("client_dropped")

    def _usage(self) -> dict:
        p = self.plan
        return usage_object(p.prompt_tokens, p.completion_tokens, p.reasoning_tokens, self.cfg.price_in, self.cfg.price_out)

    def _error(self) -> dict:
        """Mid-stream / 200 error object; code alternates int 502 and string ``server_error``."""
        code: int | str = 502 if (self.fault_index // 2) % 2 == 0 else "server_error"
        meta = {
            "error_type": "provider_error",
            "provider_name": self.provider,
            "raw": dumps({"error": {"message": "upstream connection reset", "type": "server_error"}}),
        }
        return error_object(code, "Provider returned error", meta)

    # -- entry ---------------------------------------------------------------------------------
    async def run(self) -> None:
        """Deliver the response; always leaves exactly one ledger record."""
        try:
            if self.stream:
                await self._run_stream()
            else:
                await self._run_plain()
        except ClientGone:
            self._record_dropped()
            raise
        except asyncio.CancelledError:  # server stopping
            self._record_sent(self.fault if self.fault in CUT_FAULTS else "server_stopped")
            raise
        finally:
            if not self.recorded:  # unexpected error: bill what was sent
                self._record_sent("error")

    async def _sleep_or_gone(self, seconds: float) -> None:
        if seconds > 0 and await self.conn.wait_gone(seconds):
            raise ClientGone("client left")
        if self.conn.gone.is_set():
            raise ClientGone("client left")

    # -- streaming -----------------------------------------------------------------------------
    def _events(self, cb: ChunkBuilder) -> Iterator[_Event]:
        """SSE events of the generated part (reasoning, content, tool call) with token costs.

        A generator (bytes are built burst by burst, so thousands of streams stay small); it is
        re-seeded on every call, so two passes give the same events.
        """
        plan = self.plan
        rng = random.Random(f"sim-chunks:{self.cfg.seed}:{self.seq}")
        comment_p = 0.03 if self.cfg.keepalive_comments else 0.0
        n_comments = 1
        if self.fault == "padding":
            comment_p, n_comments = 0.3, 3
        i = 0
        for k in chunk_sizes(len(plan.reasoning_pieces), rng):
            tok = sum(plan.reasoning_costs[i : i + k])
            text = "".join(plan.reasoning_pieces[i : i + k])
            yield _Event(cb.reasoning(text) if plan.reasoning_visible else b"", tok, tok)
            i += k
            if comment_p and rng.random() < comment_p:
                yield _Event(COMMENT * n_comments, 0, 0)
        i = 0
        special = plan.special_cost  # </think>: billed with the first content chunk
        for k in chunk_sizes(len(plan.content_pieces), rng):
            tok = sum(plan.content_costs[i : i + k]) + special
            special = 0
            yield _Event(cb.content("".join(plan.content_pieces[i : i + k])), tok, 0)
            i += k
            if comment_p and rng.random() < comment_p:
                yield _Event(COMMENT * n_comments, 0, 0)
        tool = plan.tool_call
        if tool is not None:
            frags = split_arguments(tool.arguments, rng)
            share = [tool.cost // (len(frags) + 1)] * len(frags)
            yield _Event(cb.tool_first(tool), tool.cost - sum(share), 0)
            for frag, tok in zip(frags, share, strict=True):
                yield _Event(cb.tool_args(frag), tok, 0)

    async def _pump(self, events: Iterable[_Event], max_data: int | None = None) -> None:
        """Write events, paced at ``tokens_per_s`` (bursts >= 50 ms apart) or as fast as possible;
        stop after ``max_data`` token-carrying events when given."""
        conn = self.conn
        tps = self.cfg.tokens_per_s
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        done_tok = 0
        batch: list[bytes] = []
        btok = brt = 0

        async def flush() -> None:
            nonlocal batch, btok, brt, done_tok
            if conn.gone.is_set():
                raise ClientGone("client left")
            conn.write(b"".join(batch))
            await conn.drain()
            self.sent_tokens += btok
            self.sent_reasoning += brt
            done_tok += btok
            batch, btok, brt = [], 0, 0

        for ev in events:
            batch.append(ev.data)
            btok += ev.tokens
            brt += ev.reasoning_tokens
            if max_data is not None and ev.tokens:
                max_data -= 1
                if max_data <= 0:
                    break
            if tps > 0:
                delay = t0 + (done_tok + btok) / tps - loop.time()
                if delay < _MIN_SLEEP_S:
                    continue
                await asyncio.sleep(delay)
                await flush()
            elif len(batch) >= _BATCH:
                await flush()
                await asyncio.sleep(0)  # let other streams run
        if batch:
            if tps > 0:
                delay = t0 + (done_tok + btok) / tps - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            await flush()

    async def _flushed(self) -> None:
        """Wait until the transport buffer is empty (so an abort loses nothing already "sent")."""
        transport = self.conn.writer.transport
        for _ in range(200):
            if transport.is_closing() or transport.get_write_buffer_size() == 0:
                return
            await asyncio.sleep(0.005)

    async def _run_stream(self) -> None:
        conn = self.conn
        cb = ChunkBuilder(self.gid, self.created, self.model, self.provider)
        await conn.start(
            200,
            [
                ("content-type", "text/event-stream"),
                ("cache-control", "no-cache"),
                ("x-generation-id", self.gid),
            ],
        )
        if self.fault == "padding":
            await conn.send(COMMENT * 8)
        elif self.cfg.keepalive_comments:
            await conn.send(COMMENT)
        await self._sleep_or_gone(self.cfg.latency_ms / 1000.0)
        if self.fault == "200error":
            err = self._error()
            conn.write(cb.error_top(err) if self.fault_index % 2 == 0 else cb.error_in_choice(err))
            await conn.end()
            self._record("200error", 0, 0, billed=False)
            return
        keep: int | None = None
        if self.fault in CUT_FAULTS:  # part of the completion: a share of the token-carrying events
            n_data = sum(1 for e in self._events(cb) if e.tokens)
            keep = max(1, int(n_data * self.cut_fraction)) if n_data else 0
        if keep != 0:
            await self._pump(self._events(cb), keep)
        if self.fault == "midstream":
            err = self._error()
            conn.write(cb.error_top(err) if self.fault_index % 2 == 0 else cb.error_in_choice(err))
            await conn.end()  # a clean end of the HTTP body, but no [DONE]
            self._record_sent("midstream")
        elif self.fault == "disconnect":
            await self._flushed()
            self._record_sent("disconnect")
            conn.abort(reset=self.fault_index % 2 == 1)
        elif self.fault == "stall":
            await self._flushed()
            gone = await conn.wait_gone(self.cfg.stall_s)
            self._record_sent("stall")
            if not gone:
                conn.abort()
        else:
            fr = self.plan.finish_reason
            usage = self._usage()
            if not self.include_usage:  # vLLM-like server, usage not asked for: none in the stream
                tail = cb.finish(fr)
            elif self.seq % 2 == 1:  # form (a): finish chunk, then choices: [] + usage
                tail = cb.finish(fr) + cb.usage_only(usage)
            else:  # form (b): finish chunk, then finish repeated with usage attached
                tail = cb.finish(fr) + cb.finish(fr, usage)
            if conn.gone.is_set():
                raise ClientGone("client left")
            conn.write(tail + DONE)
            await conn.end()
            self.fully_sent = True
            self._record_full("completed")

    # -- non-streaming -------------------------------------------------------------------------
    def _partial(self, tokens: int) -> tuple[str, str, int, int]:
        """(reasoning, content, tokens, reasoning_tokens) of the longest prefix of the completion
        that fits in ``tokens`` completion tokens."""
        plan = self.plan
        used = rt = 0
        r: list[str] = []
        c: list[str] = []
        full = True
        for piece, cost in zip(plan.reasoning_pieces, plan.reasoning_costs, strict=True):
            if used + cost > tokens:
                full = False
                break
            r.append(piece)
            used += cost
            rt += cost
        if full:
            for piece, cost in zip(plan.content_pieces, plan.content_costs, strict=True):
                if used + cost > tokens:
                    break
                c.append(piece)
                used += cost
        return "".join(r), "".join(c), used, rt

    async def _run_plain(self) -> None:
        conn = self.conn
        cfg = self.cfg
        plan = self.plan
        gen_s = cfg.latency_ms / 1000.0 + (plan.completion_tokens / cfg.tokens_per_s if cfg.tokens_per_s > 0 else 0.0)
        headers = [("content-type", "application/json"), ("x-generation-id", self.gid)]
        if self.fault in CUT_FAULTS:
            reasoning, content, tok, rtok = self._partial(int(plan.completion_tokens * self.cut_fraction))
            await self._sleep_or_gone(gen_s * self.cut_fraction)
            self.sent_tokens, self.sent_reasoning = tok, rtok  # generated before the fault
            if self.fault == "midstream":
                err = self._error()
                if self.fault_index % 2 == 0:
                    obj = completion_object(
                        gid=self.gid, created=self.created, model=self.model, provider=self.provider, plan=plan,
                        usage=None, content=None, reasoning=reasoning, finish_reason="error", top_error=err,
                        with_tool=False,
                    )
                else:
                    obj = completion_object(
                        gid=self.gid, created=self.created, model=self.model, provider=self.provider, plan=plan,
                        usage=None, content=content, reasoning=reasoning, finish_reason="error", choice_error=err,
                        with_tool=False,
                    )
                await conn.respond(200, headers, dumps(obj).encode())
                self._record_sent("midstream")
                return
            await conn.start(200, headers)
            full = dumps(self._full_object()).encode()
            if self.fault == "disconnect":
                await conn.send(full[: max(1, int(len(full) * self.cut_fraction))])
                await self._flushed()
                self._record_sent("disconnect")
                conn.abort(reset=self.fault_index % 2 == 1)
                return
            await conn.send(b"\n")  # stall: headers and one padding byte, then silence
            await self._flushed()
            gone = await conn.wait_gone(cfg.stall_s)
            self._record_sent("stall")
            if not gone:
                conn.abort()
            return
        if self.fault == "padding":
            await conn.start(200, headers)
            n = 4
            for i in range(n):
                await conn.send(b"\n" if i % 2 == 0 else b"   \n")
                await self._sleep_or_gone(gen_s / n)
            conn.write(dumps(self._full_object()).encode())
            await conn.end()
            self.fully_sent = True
            self._record_full("completed")
            return
        await self._sleep_or_gone(gen_s)
        if self.fault == "200error":
            err = self._error()
            if self.fault_index % 2 == 0:
                body = error_body(err["code"], err["message"], err["metadata"])
            else:
                body = dumps(
                    completion_object(
                        gid=self.gid, created=self.created, model=self.model, provider=self.provider, plan=plan,
                        usage=None, content=None, reasoning="", finish_reason="error", choice_error=err,
                        with_tool=False,
                    )
                ).encode()
            await conn.respond(200, headers, body)
            self._record("200error", 0, 0, billed=False)
            return
        await conn.respond(200, headers, dumps(self._full_object()).encode())
        self.fully_sent = True
        self._record_full("completed")

    def _full_object(self) -> dict:
        return completion_object(
            gid=self.gid, created=self.created, model=self.model, provider=self.provider, plan=self.plan,
            usage=self._usage(),
        )
