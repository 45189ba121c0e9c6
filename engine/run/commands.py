"""One command path: the typed commands sent to a run, and the one place they are applied.

A :class:`RunCommand` (a :class:`Verb` and its operands) is built by the dashboard's keys
(:mod:`tui.actions`) and by ``datagen ctl`` (:func:`engine.run.ctl.send`). :func:`apply` applies it
to a :class:`CommandTarget`, whichever that is:

- the live engine's :class:`~engine.run.controller.Controller`: the dashboard's keys, and the
  supervisor applying the commands ``datagen ctl`` queued in the store's ``commands`` table (as the
  row :meth:`RunCommand.to_row`, read back with :meth:`RunCommand.from_row`);
- with no engine running, the store itself (:class:`engine.run.ctl.OfflineTarget`, through
  :func:`apply_sync`): persistent commands are saved for the next start, the others are not applied.

It returns a :class:`CommandResult`: ``ok`` says whether the command was applied (or saved for the
next start); success is never judged from the text.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Awaitable, Protocol

from engine.errors import DatagenError


class Verb(StrEnum):
    """A command's verb (its value is the ``datagen ctl`` verb and the ``commands`` table's ``verb``)."""

    PAUSE = "pause"
    RESUME = "resume"
    SKIP = "skip"
    ABORT = "abort"
    CONCURRENCY = "concurrency"
    EXCLUDE_PROVIDER = "exclude-provider"
    INCLUDE_PROVIDER = "include-provider"
    RETRY_FAILED = "retry-failed"
    CLEAR_VERDICT = "clear-verdict"


VERBS = tuple(v.value for v in Verb)
"""Every ``ctl`` verb."""


@dataclass(frozen=True)
class RunCommand:
    """A command to a run. Build it with the constructors (:meth:`pause`, :meth:`skip`...).

    Attributes:
        verb: what to do.
        dataset: the dataset (pause, resume, skip, abort, retry-failed; None: the whole run / every dataset).
        cls: the request class (concurrency).
        n: the concurrency (concurrency).
        provider: the provider's name (exclude-provider, include-provider, clear-verdict).
        abort_in_flight: ``skip --abort``: the dataset's in-flight requests are cancelled too.
        reason: ``retry-failed --reason``: only prompts that failed with this error class (None: any).
    """

    verb: Verb
    dataset: str | None = None
    cls: str | None = None
    n: int | None = None
    provider: str | None = None
    abort_in_flight: bool = False
    reason: str | None = None

    # ---- constructors -----------------------------------------------------------------------
    @classmethod
    def pause(cls, dataset: str | None = None) -> RunCommand:
        """Pause ``dataset`` (None: the whole run); in-flight requests drain."""
        return cls(Verb.PAUSE, dataset=dataset)

    @classmethod
    def resume(cls, dataset: str | None = None) -> RunCommand:
        """Resume ``dataset`` (paused, skipped or budget_met; None: the whole run)."""
        return cls(Verb.RESUME, dataset=dataset)

    @classmethod
    def skip(cls, dataset: str, abort: bool = False) -> RunCommand:
        """Skip ``dataset``: its pending prompts count as skipped (``abort``: cancel its in-flight too)."""
        return cls(Verb.SKIP, dataset=dataset, abort_in_flight=abort)

    @classmethod
    def abort(cls, dataset: str | None = None) -> RunCommand:
        """Cancel in-flight requests now (of ``dataset``, None: all); their prompts return to pending."""
        return cls(Verb.ABORT, dataset=dataset)

    @classmethod
    def concurrency(cls, klass: str, n: int) -> RunCommand:
        """Set request class ``klass``'s concurrency to ``n``."""
        return cls(Verb.CONCURRENCY, cls=klass, n=n)

    @classmethod
    def exclude_provider(cls, name: str) -> RunCommand:
        """Stop routing new requests to provider ``name``."""
        return cls(Verb.EXCLUDE_PROVIDER, provider=name)

    @classmethod
    def include_provider(cls, name: str) -> RunCommand:
        """Route new requests to the excluded provider ``name`` again."""
        return cls(Verb.INCLUDE_PROVIDER, provider=name)

    @classmethod
    def clear_verdict(cls, name: str) -> RunCommand:
        """Clear provider ``name``'s ``drifting`` fidelity verdict: its records count again, it is routed
        to again when the drift excluded it, and it is never acted on again (docs/fidelity.md)."""
        return cls(Verb.CLEAR_VERDICT, provider=name)

    @classmethod
    def retry_failed(cls, dataset: str | None = None, reason: str | None = None) -> RunCommand:
        """Return the failed prompts of ``dataset`` (None: all) of error class ``reason`` (None: any) to pending."""
        return cls(Verb.RETRY_FAILED, dataset=dataset, reason=reason)

    # ---- the ``commands`` table's row -------------------------------------------------------
    def to_row(self) -> tuple[str, str | None, str | None]:
        """``(verb, dataset, arg)`` as ``datagen ctl`` queues it: ``arg`` is N for ``concurrency``
        (``dataset`` its CLASS), NAME for the provider verbs, ``"abort"`` for ``skip --abort``, the
        error class for ``retry-failed``."""
        v = self.verb
        if v == Verb.CONCURRENCY:
            return v.value, self.cls, None if self.n is None else str(self.n)
        if v in (Verb.EXCLUDE_PROVIDER, Verb.INCLUDE_PROVIDER, Verb.CLEAR_VERDICT):
            return v.value, None, self.provider
        if v == Verb.SKIP:
            return v.value, self.dataset, "abort" if self.abort_in_flight else None
        if v == Verb.RETRY_FAILED:
            return v.value, self.dataset, self.reason
        return v.value, self.dataset, None

    @classmethod
    def from_row(cls, verb: str, dataset: str | None, arg: str | None) -> RunCommand:
        """The command of a ``commands`` row (see :meth:`to_row`).

        Raises:
            ValueError: unknown verb, or operands missing or malformed (the message says which).
        """
        try:
            v = Verb(verb)
        except ValueError:
            raise ValueError(f"unknown command {verb!r}") from None
        if v == Verb.SKIP:
            if not dataset:
                raise ValueError("skip needs a dataset")
            return cls.skip(dataset, abort=arg == "abort")
        if v == Verb.CONCURRENCY:
            if not dataset or arg is None:
                raise ValueError("concurrency needs CLASS and N")
            try:
                n = int(arg)
            except ValueError:
                raise ValueError(f"concurrency N must be a whole number, got {arg!r}") from None
            return cls.concurrency(dataset, n)
        if v in (Verb.EXCLUDE_PROVIDER, Verb.INCLUDE_PROVIDER, Verb.CLEAR_VERDICT):
            if not arg:
                raise ValueError(f"{v.value} needs a provider name")
            return cls(v, provider=arg)
        if v == Verb.RETRY_FAILED:
            return cls.retry_failed(dataset, arg or None)
        return cls(v, dataset=dataset)

    def describe(self) -> str:
        """``verb [DATASET] [ARG]`` as typed to ``datagen ctl`` (the run's event log names it so)."""
        verb, dataset, arg = self.to_row()
        return f"{verb}{' ' + dataset if dataset else ''}{' ' + arg if arg else ''}"


@dataclass(frozen=True)
class CommandResult:
    """What applying a :class:`RunCommand` did.

    Attributes:
        ok: True when it was applied (or, with no engine running, saved for the next start); False
            when it was refused (an unknown dataset, class or provider, a value out of range) or not
            applied (no engine running, for a live-only verb; not confirmed in time).
        message: one line for the user (a toast, ``datagen ctl``'s output).
        error: the target refused the command (:attr:`text` then reads ``error: MESSAGE``).
    """

    ok: bool
    message: str
    error: bool = False

    @property
    def text(self) -> str:
        """The result line ``datagen ctl`` prints and the ``commands`` table records."""
        return f"error: {self.message}" if self.error else self.message

    @classmethod
    def refused(cls, message: str) -> CommandResult:
        """A command refused before it was applied (``error: MESSAGE``)."""
        return cls(False, message, error=True)


class NotApplied(DatagenError):
    """Raised by a :class:`CommandTarget` that cannot apply a command (no engine running for a live-only
    verb): the result is not ``ok``, with this message as it is."""


class CommandTarget(Protocol):
    """What :func:`apply` applies commands to: one method per verb, each returning a short result
    line (or an awaitable of one), raising ``ValueError`` to refuse (an unknown dataset, class or
    provider, a value out of range; the message says which) and :class:`NotApplied` when it cannot
    apply it. :class:`engine.run.controller.Controller` and :class:`engine.run.ctl.OfflineTarget` fit it."""

    def pause(self, dataset: str | None = None) -> Awaitable[str] | str: ...
    def resume(self, dataset: str | None = None) -> Awaitable[str] | str: ...
    def skip(self, dataset: str, abort: bool = False) -> Awaitable[str] | str: ...
    def abort(self, dataset: str | None = None) -> Awaitable[str] | str: ...
    def set_concurrency(self, cls: str, n: int) -> Awaitable[str] | str: ...
    def exclude_provider(self, name: str) -> Awaitable[str] | str: ...
    def include_provider(self, name: str) -> Awaitable[str] | str: ...
    def retry_failed(self, dataset: str | None = None, reason: str | None = None) -> Awaitable[str] | str: ...
    def clear_verdict(self, name: str) -> Awaitable[str] | str: ...


def _call(cmd: RunCommand, target: CommandTarget) -> Any:
    v = cmd.verb
    if v == Verb.PAUSE:
        return target.pause(cmd.dataset)
    if v == Verb.RESUME:
        return target.resume(cmd.dataset)
    if v == Verb.SKIP:
        if not cmd.dataset:
            raise ValueError("skip needs a dataset")
        return target.skip(cmd.dataset, abort=cmd.abort_in_flight) if cmd.abort_in_flight else target.skip(cmd.dataset)
    if v == Verb.ABORT:
        return target.abort(cmd.dataset)
    if v == Verb.CONCURRENCY:
        if not cmd.cls or cmd.n is None:
            raise ValueError("concurrency needs CLASS and N")
        return target.set_concurrency(cmd.cls, cmd.n)
    if v == Verb.EXCLUDE_PROVIDER:
        return target.exclude_provider(cmd.provider or "")
    if v == Verb.INCLUDE_PROVIDER:
        return target.include_provider(cmd.provider or "")
    if v == Verb.RETRY_FAILED:
        return target.retry_failed(cmd.dataset, cmd.reason)
    if v == Verb.CLEAR_VERDICT:
        return target.clear_verdict(cmd.provider or "")
    raise ValueError(f"unknown command {v!r}")


async def apply(cmd: RunCommand, target: CommandTarget) -> CommandResult:
    """Apply ``cmd`` to ``target``: the one place a command is carried out, for the dashboard, a live
    ``datagen ctl`` and an offline one. ``ValueError`` (a refusal) and :class:`NotApplied` become a
    result that is not ``ok``; any other exception (a store error) propagates."""
    try:
        res = _call(cmd, target)
        if inspect.isawaitable(res):
            res = await res
    except NotApplied as e:
        return CommandResult(False, str(e))
    except ValueError as e:
        return CommandResult.refused(str(e))
    return CommandResult(True, str(res))


def apply_sync(cmd: RunCommand, target: CommandTarget) -> CommandResult:
    """:func:`apply` for a target whose methods return at once (the store, with no engine running),
    without an event loop: the same path, run to its end in one step.

    Raises:
        RuntimeError: the target awaited something (use :func:`apply` on a loop).
    """
    coro = apply(cmd, target)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError(f"{type(target).__name__} awaited while applying {cmd.describe()!r}; use apply()")


__all__ = ["CommandResult", "CommandTarget", "NotApplied", "RunCommand", "VERBS", "Verb", "apply", "apply_sync"]
