"""Live progress of one request: what a stream has delivered so far, readable while it runs and after it was
cancelled or failed (the scheduler accounts the spend of aborted streams from it).

``tokens_received`` is an ESTIMATE of completion tokens streamed so far: characters of reasoning + content +
tool-call arguments received, divided by 4 and rounded up (:func:`estimate_tokens`); it is not a tokenizer count.
"""

from __future__ import annotations

__all__ = ["StreamProgress", "estimate_tokens"]


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

    __slots__ = ("chars_received", "generation_id", "provider", "status", "cost_usd")

    def __init__(self) -> None:
        self.chars_received = 0
        self.generation_id = ""
        self.provider = ""
        self.status = 0
        self.cost_usd: float | None = None

    @property
    def tokens_received(self) -> int:
        """Estimated completion tokens received so far: ``ceil(chars_received / 4)`` (see module docstring)."""
        return -(-self.chars_received // 4)

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
