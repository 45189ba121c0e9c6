"""Which failures belong to the run (the account, the route, the config) and which to one prompt.

Pure rules, no I/O; the scheduler applies them (:meth:`engine.run.failures.Failures.on_failure`).

A failure is **run-wide** when retrying the same prompt later, unchanged, would succeed once the
account, the route or the configuration is fixed, and every other prompt would meet the same
error meanwhile. Such a failure never fails its prompt: the prompt returns to ``pending``, the
whole run pauses with the reason, and the error does not feed a dataset's anomaly guard (it says
nothing about that dataset's prompts). The conditions:

- ``credits``: HTTP 402 (or a 403 saying the key's limit is exceeded): out of credits. Not
  OpenRouter's in-flight budget 402s (:mod:`engine.client.errors`): ``in_flight_budget_exhausted``
  is a rate limit (retried after its ``Retry-After``, the prompt's own), and
  ``weight_exceeds_budget`` (one request's estimated cost is larger than the whole in-flight
  budget) fails only its prompt, never taken for a configuration mistake either (see
  :func:`is_rejection`): the message names the ``max_tokens`` that would fit.
- ``auth``: HTTP 401: the key is rejected.
- ``route``: HTTP 404 on chat completions, or any error (a 4xx, an error chunk in a 200 stream)
  whose message says no endpoint or provider can serve the request (OpenRouter's "No endpoints
  found", "No endpoints found matching your data policy", "No allowed providers are available"):
  a routing outage, or a routing or model setting.
- ``connect``: a request's final error is ``connect`` (its retries spent) and no endpoint can be
  reached: the one server refuses connections or cannot be resolved or reached within
  ``timeouts.connect_s``, or, with several ``base_urls``, every replica is out of rotation (the
  fleet's ``no healthy endpoint``). A replica's own ``connect`` (``endpoint_fault``: others may be up)
  is not: the fleet takes that replica out of rotation and the request goes elsewhere. Nor is a
  ``PoolTimeout`` (this process's connection pool was full; the server was never asked). The same
  kind, ``connect``, is a server that accepts connections and never answers: a request's final
  error is a ``stall`` in which not one byte of a response arrived (no status line, or headers and
  no body byte: ``no_answer``), provided the endpoint shows no other sign of answering (the caller
  judges that: :meth:`engine.run.failures.Failures.run_wide`). A stream that sends anything, text or
  keep-alive comments, is never this.
- ``config``: the same 4xx rejection (same error class, same message) of the first
  :data:`CONFIG_STREAK` distinct prompts of this engine process, with no success in between: a
  setting every request carries is refused (e.g. a ``reasoning`` setting the endpoint does not
  accept). Once any request succeeded, a 4xx fails only its own prompt. A user's resume after such
  a pause says "it is not the config": that rejection then fails its prompts as usual.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, TypeVar

from engine.client.errors import is_weight_exceeds_budget
from engine.client.types import ErrorClass

#: Distinct prompts that must meet the identical 4xx rejection (no success in between) before it
#: is taken for a configuration mistake.
CONFIG_STREAK = 3

#: Error classes that are a condition of the account or the route by themselves.
RUN_WIDE_CLASSES = frozenset({ErrorClass.CREDITS.value, ErrorClass.AUTH.value, ErrorClass.ROUTE.value})

#: Lower-case message fragments that name a routing condition whatever the status.
ROUTE_PHRASES = ("no endpoints found", "no allowed providers", "no available providers",
                 "no providers available", "matching your data policy")

#: Lower-case message fragments of a 403 that is the key's spending limit, not moderation.
CREDIT_PHRASES = ("key limit exceeded", "insufficient credits", "requires more credits")

_WHAT = {
    "credits": "out of credits",
    "auth": "API key rejected",
    "route": "no provider endpoint can serve the requests",
    "config": "the provider refuses every request the same way (a setting in the config?)",
    "connect": "cannot reach",
}


@dataclass(frozen=True)
class Condition:
    """A run-wide condition.

    Attributes:
        kind: ``credits`` | ``auth`` | ``route`` | ``connect`` | ``config`` (the run's ``pause_kind``).
        reason: one line for the run's state reason, the event log and the notice.
        signature: ``(error class, message)`` of the rejection (``config`` only; else None).
    """

    kind: str
    reason: str
    signature: tuple[str, str] | None = None


def _status_text(error_class: str, status: int) -> str:
    return f"HTTP {status}" if 400 <= status < 600 else error_class  # an error chunk in a 200: its class


def condition_of(error_class: str, status: int, message: str, *, endpoint_fault: bool = False,
                 where: str = "the server", no_answer: bool = False) -> Condition | None:
    """The run-wide condition a request's final error shows by itself, or None.

    Args:
        error_class: the :class:`~engine.client.types.ErrorClass` value (``"credits"``...).
        status: HTTP status (or the code of an error chunk; 0 when none).
        message: the provider's message (never holds the key).
        endpoint_fault: the error is one replica's (several ``base_urls``): never ``connect``.
        where: what could not be reached, for a ``connect`` reason (the base URL, or "any of the 3 endpoints").
        no_answer: the error is a ``stall`` in which no byte of a response arrived
            (:attr:`engine.client.types.RequestError.no_answer`): a ``connect`` condition.
    """
    low = message.lower()
    if error_class == ErrorClass.CONNECT.value:
        if endpoint_fault or "pooltimeout" in low:
            return None
        return Condition("connect", f"{_WHAT['connect']} {where} ({error_class}): {message}")
    if no_answer and error_class == ErrorClass.STALL.value:
        if endpoint_fault:
            return None
        return Condition("connect", f"no answer from {where} ({error_class}): {message}; a hung server or proxy "
                                    f"(restart it), or one that queues requests that long (raise [provider.timeouts] "
                                    f"stall_s)")
    kind = None
    if error_class == ErrorClass.CREDITS.value:
        kind = "credits"
    elif error_class == ErrorClass.AUTH.value:
        kind = "auth"
    elif error_class == ErrorClass.ROUTE.value:
        kind = "route"
    elif any(p in low for p in ROUTE_PHRASES):  # whatever the status: an error chunk in a 200 stream too
        kind = "route"
    elif status == 403 and any(p in low for p in CREDIT_PHRASES):
        kind = "credits"
    if kind is None:
        return None
    return Condition(kind, f"{_WHAT[kind]} ({_status_text(error_class, status)}): {message}")


def is_rejection(error_class: str, status: int, message: str = "") -> bool:
    """True for a 4xx that fails one prompt unless it repeats (a candidate configuration mistake):
    ``bad_request`` / ``forbidden`` of any status, ``other`` with a 4xx status. Never OpenRouter's
    ``weight_exceeds_budget`` 402 (``message`` says it): that request is too expensive for the
    account's in-flight budget, it fails its prompt alone and the run goes on."""
    if is_weight_exceeds_budget(message):
        return False
    if error_class in (ErrorClass.BAD_REQUEST.value, ErrorClass.FORBIDDEN.value):
        return True
    return error_class == ErrorClass.OTHER.value and 400 <= status < 500


def signature(error_class: str, message: str) -> tuple[str, str]:
    """``(error class, message with whitespace collapsed)``: what "the same rejection" compares."""
    return error_class, " ".join(message.split())


T = TypeVar("T")


@dataclass
class ConfigMistakeDetector(Generic[T]):
    """Finds a configuration mistake: the identical 4xx rejection of the first ``streak`` distinct
    prompts with no success in between (see the module docstring).

    The caller counts a rejected prompt as failed but lets the detector HOLD it (``T``: whatever
    the caller needs to write the failure later or undo it; the scheduler keeps ``(dataset
    runtime, prompt, attempts, error class, error text)``) until the question is settled:

    - a success (:meth:`on_success`), another rejection (:meth:`on_rejection` with another
      signature) or the end of the run (:meth:`release`) releases the held items: the caller
      writes their failures;
    - the ``streak``-th distinct prompt with the same rejection returns the ``config`` condition
      and every held item: the caller returns them to pending and pauses the run.

    At most ``streak - 1`` items are held at a time; every method is O(streak).

    Attributes:
        streak: distinct prompts needed (default :data:`CONFIG_STREAK`, at least 2).
        armed: False once a request succeeded: later rejections are released at once.
        dismissed: signatures a user resumed past (never taken for a config mistake again).
    """

    streak: int = CONFIG_STREAK
    armed: bool = True
    dismissed: set = field(default_factory=set)
    _sig: tuple[str, str] | None = None
    _items: dict = field(default_factory=dict)  # prompt id -> T, in failure order

    def __post_init__(self) -> None:
        if self.streak < 2:
            raise ValueError(f"streak must be at least 2, got {self.streak}")

    def on_success(self) -> list[T]:
        """A request succeeded: the endpoint accepts this config; stop looking. Returns the held
        items (their failures are final)."""
        self.armed = False
        return self.release()

    def on_rejection(self, prompt_id: int, sig: tuple[str, str], item: T
                     ) -> tuple[tuple[Condition, list[T]] | None, list[T]]:
        """Record a prompt's rejection ``sig`` (see :func:`signature`).

        Returns:
            ``(found, release)``: ``release`` are items whose failures are final now (this one
            when the detector is not looking, or the earlier streak of another signature);
            ``found`` is None, or ``(condition, items)`` when this rejection completes the
            streak: the ``config`` condition and the items of the streak, this one included, to
            return to pending. The detector then starts over.
        """
        if not self.armed or sig in self.dismissed:
            return None, [item]
        release: list[T] = []
        if sig != self._sig:
            release = self.release()
            self._sig = sig
        self._items[prompt_id] = item
        if len(self._items) < self.streak:
            return None, release
        items = list(self._items.values())
        self._sig, self._items = None, {}
        cls, msg = sig
        cond = Condition("config", f"{_WHAT['config']}: the first {len(items)} prompts were all rejected with "
                                   f"{cls}: {msg}", sig)
        return (cond, items), release

    def release(self) -> list[T]:
        """Return (and forget) the held items: their failures are final."""
        items = list(self._items.values())
        self._sig, self._items = None, {}
        return items

    def dismiss(self, sig: tuple[str, str]) -> None:
        """The user resumed past a pause for ``sig``: that rejection fails prompts from now on."""
        self.dismissed.add(sig)


__all__ = ["CONFIG_STREAK", "Condition", "ConfigMistakeDetector", "RUN_WIDE_CLASSES", "condition_of",
           "is_rejection", "signature"]
