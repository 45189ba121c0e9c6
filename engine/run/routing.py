"""The request body every prompt is sent with, and the providers excluded from its routing.

:class:`Routing` builds the body's fixed part once from the config (model, sampling settings,
``[provider.routing]``, ``extra_body``) and adds the providers a user excluded while the run goes on
(``datagen ctl RUN exclude-provider NAME``, the dashboard's ``x``) to its routing ``ignore`` list,
persistently (the store's ``excluded_providers`` meta key, restored at the next start).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Callable

from engine.client.types import ChatRequest
from engine.tokens.modeswitch import ModePlan, plan

if TYPE_CHECKING:
    from engine.config import Config
    from engine.run.runstate import RunState
    from engine.run.telemetry import Telemetry
    from engine.storage.store import PendingPrompt, Store


def thinking_plan(cfg: "Config") -> ModePlan:
    """How the request body matches ``[tokenizer] thinking`` (:func:`engine.tokens.modeswitch.plan`):
    the switch to add, if any; an empty plan without ``[tokenizer]`` (no mode is configured).

    Raises:
        engine.tokens.modeswitch.ModeConflict: the settings can only buy records validation rejects.
    """
    if cfg.tokenizer is None:
        return ModePlan()
    g = cfg.generation
    return plan(cfg.tokenizer.thinking, cfg.provider.kind, g.reasoning, g.extra_body)


class Routing:
    """The run's request body and its excluded providers (kept on ``run.excluded_providers``).

    Args:
        cfg: validated config.
        run: the run state (its ``excluded_providers``).
        store: the run's store (the exclusions persist there).
        telemetry: the provider figures (an excluded provider is marked so).
        event: ``event(level, kind, dataset, message)`` of the run.
    """

    def __init__(self, cfg: "Config", run: "RunState", store: "Store", telemetry: "Telemetry",
                 event: Callable[[str, str, "str | None", str], None]) -> None:
        self.cfg = cfg
        self.run = run
        self.store = store
        self.telemetry = telemetry
        self._event = event
        body: dict[str, Any] = {"model": cfg.provider.model}
        g = cfg.generation
        for k in ("temperature", "top_p", "seed", "reasoning"):
            v = getattr(g, k)
            if v is not None:
                body[k] = v
        routing = cfg.provider.routing.to_provider_object()
        if routing:
            body["provider"] = routing
        body.update(g.extra_body)
        body.update(thinking_plan(cfg).add)
        #: the body new requests are sent with (the config's, plus the excluded providers).
        self.body = body
        self._config_body = dict(body)

    def _apply(self) -> None:
        body = dict(self._config_body)
        if self.run.excluded_providers:
            prov = dict(body.get("provider") or {})
            ignore = list(prov.get("ignore") or [])
            prov["ignore"] = ignore + [p for p in self.run.excluded_providers if p not in ignore]
            body["provider"] = prov
        self.body = body

    def request_for(self, p: "PendingPrompt") -> ChatRequest:
        """The request of prompt ``p`` (its class's ``max_tokens``, the current body)."""
        return ChatRequest(
            messages=p.messages, tools=p.tools, max_tokens=self.cfg.classes[p.cls].max_tokens, body=self.body,
            ref=(p.id, p.dataset, p.key),
        )

    def restore(self, excluded: list[str]) -> None:
        """The exclusions stored by an earlier process of the run (at load)."""
        self.run.excluded_providers = excluded
        for name in excluded:
            self.telemetry.providers.exclude(name)
        self._apply()

    async def exclude(self, name: str) -> None:
        """Add provider ``name`` to the routing ``ignore`` list for new requests, persistently."""
        if name not in self.run.excluded_providers:
            self.run.excluded_providers.append(name)
        self.telemetry.providers.exclude(name)
        self._apply()
        await self.store.set_meta("excluded_providers", json.dumps(self.run.excluded_providers))
        self._event("warning", "exclude", None, f"provider {name} excluded (routing ignore)")

    async def include(self, name: str) -> None:
        """Undo :meth:`exclude`: route new requests to ``name`` again (unless the config's own
        ``ignore`` lists it), persistently."""
        if name in self.run.excluded_providers:
            self.run.excluded_providers.remove(name)
        self.telemetry.providers.include(name)
        self._apply()
        await self.store.set_meta("excluded_providers", json.dumps(self.run.excluded_providers))
        self._event("info", "include", None, f"provider {name} included again")


__all__ = ["Routing"]
