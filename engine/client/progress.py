"""Live progress of one request: what a stream has delivered so far, readable while it runs and after it was
cancelled or failed (the scheduler accounts the spend of aborted streams from it).

``tokens_received`` is an ESTIMATE of completion tokens streamed so far: characters of reasoning + content +
tool-call arguments received, divided by the characters per token of the run's finished completions of the
same dataset (:class:`TokenRatio`: their characters over their billed completion tokens), 4 before any
finished; it is not a tokenizer count. A fixed 4 read 1.4x the provider's count on the simulator's text (and
dollars in flight +32%); text of other languages, code and reasoning differ as much.
"""

from __future__ import annotations

import math

__all__ = ["StreamProgress", "TokenRatio", "estimate_tokens"]

#: Characters per completion token before any completion finished (a rough lower bound for English).
DEFAULT_CHARS_PER_TOKEN = 4.0


class TokenRatio:
    """Characters per completion token, learned from finished completions (pure bookkeeping).

    :meth:`observe` each finished completion's characters (reasoning + content + tool-call arguments)
    and its billed completion tokens; :attr:`chars_per_token` is their ratio over every observation,
    clamped to [1, 16], :data:`DEFAULT_CHARS_PER_TOKEN` until ``min_tokens`` tokens were observed.
    Completions without text (reasoning the provider bills but does not stream) count too: the
    ratio then makes what streams read as the tokens that are billed.
    """

    __slots__ = ("chars", "tokens", "min_tokens", "chars_per_token")

    def __init__(self, min_tokens: int = 2000) -> None:
        self.chars = 0
        self.tokens = 0
        self.min_tokens = int(min_tokens)
        self.chars_per_token = DEFAULT_CHARS_PER_TOKEN

    def observe(self, chars: int, completion_tokens: int) -> None:
        """Add one finished completion: ``chars`` characters, ``completion_tokens`` billed tokens (>= 0)."""
        if chars < 0 or completion_tokens <= 0:
            return
        self.chars += int(chars)
        self.tokens += int(completion_tokens)
        if self.tokens >= self.min_tokens:
            self.chars_per_token = min(16.0, max(1.0, self.chars / self.tokens))

    def tokens_for(self, chars: int) -> int:
        """Estimated tokens for ``chars`` characters (rounded up)."""
        return math.ceil(chars / self.chars_per_token - 1e-9)


_DEFAULT_RATIO = TokenRatio()


def estimate_tokens(chars: int) -> int:
    """Estimated tokens for ``chars`` characters of generated text: ``ceil(chars / 4)`` (a rough lower bound)."""
    return -(-chars // 4)


class StreamProgress:
    """Live progress of one request, updated by the client as bytes arrive.

    Pass one to :meth:`ChatClient.complete` to learn, after a cancellation or failure, how much was streamed (the
    scheduler accounts spend of aborted streams from it).

    Attributes:
        chars_received: characters of reasoning + content + tool-call arguments received so far.
        generation_id: generation id as soon as known (``X-Generation-Id`` header or first chunk ``id``).
        provider: provider display name as soon as a chunk names it.
        status: HTTP status once headers arrived (0 before).
        cost_usd: ``usage.cost`` if a usage chunk arrived, else None.
    """

    __slots__ = ("chars_received", "generation_id", "provider", "status", "cost_usd", "ratio")

    def __init__(self, ratio: TokenRatio | None = None) -> None:
        #: the characters per token :attr:`tokens_received` divides by (shared, it learns as the run goes)
        self.ratio = ratio if ratio is not None else _DEFAULT_RATIO
        self.chars_received = 0
        self.generation_id = ""
        self.provider = ""
        self.status = 0
        self.cost_usd: float | None = None

    @property
    def tokens_received(self) -> int:
        """Estimated completion tokens received so far: ``ceil(chars_received / chars per token)``
        (:attr:`ratio`; see the module docstring)."""
        return self.ratio.tokens_for(self.chars_received)

    def reset(self) -> None:
        """Clear all fields (``ChatClient.complete`` does this at the start of every attempt)."""
        self.chars_received = 0
        self.generation_id = ""
        self.provider = ""
        self.status = 0
        self.cost_usd = None

    def __repr__(self) -> str:
        return (
            f"StreamProgress(tokens_received={self.tokens_received}, chars_received={self.chars_received}, "
            f"generation_id={self.generation_id!r}, provider={self.provider!r}, status={self.status})"
        )
