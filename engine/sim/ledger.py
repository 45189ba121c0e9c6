"""Billing: what the simulated account was charged, credits left, and a log of finished requests.

Billing rules (mirroring docs/openrouter.md, "Cancellation"; the simulator's own choices are marked):

- A completed request is billed its ``usage.cost`` =
  ``prompt_tokens * price_in / 1e6 + completion_tokens * price_out / 1e6`` (USD).
- A stream dropped by the client on a cancellable provider is billed for the prompt plus the
  completion tokens written so far; on a non-cancellable provider it is billed in full. A dropped
  non-stream request is always billed in full.
- Injected ``midstream`` / ``disconnect`` / ``stall`` faults are billed for the prompt plus the
  completion tokens written before the fault, on every provider (simulator choice).
- HTTP error answers (429, 5xx, 402, 4xx) and ``200error`` cost nothing.

The ledger is read from other threads (``SimThread``), so updates and snapshots take a lock.
"""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, TextIO


@dataclass(frozen=True)
class GenerationRecord:
    """One finished chat request, as appended to the log (one JSON line each).

    Attributes:
        seq: request sequence number (1-based, order of arrival of chat requests).
        generation_id: ``gen-...`` id sent to the client ("" when none was assigned).
        prompt_key: ``engine.prompts.prompt_key`` of the request ("" when the body was invalid).
        provider: provider the request was routed to ("" when none).
        outcome: ``completed`` | ``client_dropped`` | a fault kind (``429``, ``midstream``, ...)
            | ``402`` | ``400`` | ``401`` | ``503`` (routing).
        fault: injected fault kind, or None (``padding`` still ends ``completed``).
        fully_sent: the whole response (incl. ``[DONE]`` for streams) was written to the socket.
        stream: the request asked for SSE.
        prompt_tokens: prompt tokens billed (tokens; 0 when nothing was billed).
        completion_tokens_billed: completion tokens billed (tokens, reasoning included).
        cost_usd: USD billed for this request.
        t: UNIX time (seconds) when it finished.
        served: what sampled a model-backed completion (``honest``, ``quant:KL``, ``temp:X``;
            :class:`engine.sim.behaviours.Served`), "" for the word generator or no completion.
    """

    seq: int
    generation_id: str
    prompt_key: str
    provider: str
    outcome: str
    fault: str | None
    fully_sent: bool
    stream: bool
    prompt_tokens: int
    completion_tokens_billed: int
    reasoning_tokens: int
    cost_usd: float
    t: float
    served: str = ""


class Ledger:
    """Running totals of the simulated account (USD, tokens, outcomes, injected faults).

    Attributes (read them, or take a consistent copy with :meth:`stats`):
        requests: chat requests received.
        completed: chat requests that finished with outcome ``completed``.
        billed_usd: USD billed in total (what ``/key`` ``usage`` reports).
        prompt_tokens_billed / completion_tokens_billed: tokens billed in total.
        outcomes: outcome -> count of finished chat requests.
        faults: fault kind -> times injected.
    """

    def __init__(
        self,
        *,
        price_in: float,
        price_out: float,
        credits_usd: float | None = None,
        log_path: str | None = None,
    ) -> None:
        self.price_in = price_in
        self.price_out = price_out
        self.credits_usd = credits_usd
        self.requests = 0
        self.completed = 0
        self.billed_usd = 0.0
        self.prompt_tokens_billed = 0
        self.completion_tokens_billed = 0
        self.outcomes: Counter[str] = Counter()
        self.faults: Counter[str] = Counter()
        self._records: dict[str, GenerationRecord] = {}
        self._lock = threading.Lock()
        self._log: TextIO | None = open(log_path, "a", encoding="utf-8", buffering=1) if log_path else None

    def cost(self, prompt_tokens: int, completion_tokens: int) -> float:
        """USD for the given tokens at this account's prices (USD per million tokens)."""
        return prompt_tokens * self.price_in / 1e6 + completion_tokens * self.price_out / 1e6

    def next_seq(self) -> int:
        """Count a new chat request and return its 1-based sequence number."""
        with self._lock:
            self.requests += 1
            return self.requests

    def note_fault(self, kind: str) -> int:
        """Count an injected fault; returns how many of this kind came before (0-based index)."""
        with self._lock:
            n = self.faults[kind]
            self.faults[kind] = n + 1
            return n

    def remaining_usd(self) -> float | None:
        """Credits left in USD (may be negative after in-flight requests), or None if unlimited."""
        if self.credits_usd is None:
            return None
        return self.credits_usd - self.billed_usd

    def exhausted(self) -> bool:
        """True when credits are set and the billed total has reached them."""
        return self.credits_usd is not None and self.billed_usd >= self.credits_usd

    def affordable_completion_tokens(self, prompt_tokens: int) -> int | None:
        """Completion tokens the remaining credits can pay for after the prompt (None = unlimited)."""
        rem = self.remaining_usd()
        if rem is None or self.price_out <= 0:
            return None
        left = rem - prompt_tokens * self.price_in / 1e6
        return max(0, int(left / (self.price_out / 1e6)))

    def record(
        self,
        *,
        seq: int,
        generation_id: str,
        prompt_key: str,
        provider: str,
        outcome: str,
        fault: str | None,
        fully_sent: bool,
        stream: bool,
        prompt_tokens: int = 0,
        completion_tokens: int = 0,
        reasoning_tokens: int = 0,
        served: str = "",
    ) -> GenerationRecord:
        """Bill one finished chat request (tokens as given; 0 for unbilled answers) and log it."""
        cost = self.cost(prompt_tokens, completion_tokens) if (prompt_tokens or completion_tokens) else 0.0
        rec = GenerationRecord(
            seq=seq,
            generation_id=generation_id,
            prompt_key=prompt_key,
            provider=provider,
            outcome=outcome,
            fault=fault,
            fully_sent=fully_sent,
            stream=stream,
            prompt_tokens=prompt_tokens,
            completion_tokens_billed=completion_tokens,
            reasoning_tokens=reasoning_tokens,
            cost_usd=cost,
            t=time.time(),
            served=served,
        )
        with self._lock:
            self.billed_usd += cost
            self.prompt_tokens_billed += prompt_tokens
            self.completion_tokens_billed += completion_tokens
            self.outcomes[outcome] += 1
            if outcome == "completed":
                self.completed += 1
            if generation_id:
                self._records[generation_id] = rec
            if self._log is not None:
                self._log.write(json.dumps(asdict(rec), separators=(",", ":")) + "\n")
                self._log.flush()
        return rec

    def generation(self, generation_id: str) -> GenerationRecord | None:
        """The record of a finished generation, or None."""
        with self._lock:
            return self._records.get(generation_id)

    def stats(self) -> dict[str, Any]:
        """A consistent snapshot: requests, completed, billed_usd, token totals, outcomes, faults."""
        with self._lock:
            return {
                "requests": self.requests,
                "completed": self.completed,
                "billed_usd": self.billed_usd,
                "prompt_tokens_billed": self.prompt_tokens_billed,
                "completion_tokens_billed": self.completion_tokens_billed,
                "outcomes": dict(self.outcomes),
                "faults": dict(self.faults),
                "credits_usd": self.credits_usd,
            }

    def close(self) -> None:
        """Close the log file."""
        with self._lock:
            if self._log is not None:
                self._log.close()
                self._log = None
