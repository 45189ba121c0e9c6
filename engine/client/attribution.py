"""Who served a completion, and whether it is one generation of the model asked for (pure: data in, data out).

Every stored result records its attribution (``results`` columns, :class:`~engine.client.types.Completion`):
``provider`` (the stream's ``provider`` field, OpenRouter), ``endpoint`` (the ``[provider] base_urls`` entry
that served it; "" with a single ``base_url``), ``system_fingerprint`` (first non-empty one of the chunks),
``generation_id`` and ``model`` (the id the RESPONSE names, never the request's), and the sampling
settings the request was sent with (``temperature``, ``top_p``; None when the request left them to the
provider's default).

Two failing flags (:data:`FAILING`; the record stays in the store and is kept out of every training export):

``model_mismatch``
    the response names another model than the one asked for. OpenRouter answers with the model it actually
    routed to when a ``models`` fallback list or a routing fallback served the request (langchain-ai/openwiki
    #85: a fallback list made OpenRouter quietly serve another vendor's model; BerriAI/litellm #29406 and PR
    #29710: the response ``model`` names the model actually routed to). The same model is still named in
    other spellings, so :func:`same_model` accepts:

    - the exact id, in any letter case (vLLM answers with its served name; Together capitalises);
    - the asked id followed by a date or version suffix: ``-MMDD`` / ``-YYMM`` (4 digits: OpenRouter's
      ``moonshotai/kimi-k2.5-0127`` for ``moonshotai/kimi-k2.5``), ``-YYMMDD`` (6), ``-YYYYMMDD`` (8),
      ``-YYYY-MM-DD`` (an ISO date), or a 3-digit version starting with 0 (``-001``);
    - either side without its ``author/`` prefix when the other has one (``kimi-k2.5`` asked from a server
      that names ``moonshotai/kimi-k2.5``), and OpenRouter's variant suffixes (``:nitro``, ``:floor``,
      ``:free``, ``:exacto``...) removed from both.

    Anything else is another model: ``moonshotai/kimi-k2-thinking``, ``moonshotai/kimi-k2-0905``,
    ``z-ai/glm-4.7``, ``openai/gpt-4o-mini`` for ``moonshotai/kimi-k2.5``. A response that names no model
    is not flagged (nothing to compare). Limit: a dated id of the asked family is accepted whatever the
    date, so two dated snapshots sold under one undated id (``kimi-k2`` and ``kimi-k2-0905``) are not told
    apart; pin the dated id in ``[provider] model`` to compare exactly.

``spliced_generation``
    one stream carries two generations: the chunks' ``model`` or ``provider`` changes mid-stream, or their
    ``id`` does (a gateway splicing a mid-stream fallback's continuation into the first stream: BerriAI/litellm
    PR #36267, PR #41127). Empty or missing values are not a change. Servers that mint a new ``id`` for
    every chunk (old llama.cpp #5876, litellm #1571, foundry-local #144) are not splices, nor is one odd
    chunk (a closing chunk sent under another id): the ``id`` rule needs two different ids each carried by
    at least two consecutive chunks (:class:`GenerationIdentity`). A continuation sent as ONE chunk under a
    new id, with the same model and provider, is therefore not caught.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

from .types import ChatRequest, Completion

__all__ = ["FAILING", "GenerationIdentity", "attribute", "canonical_model", "model_mismatch", "same_model",
           "sampling_settings"]

#: Flags whose record is not one generation of the target, with the reason shown to the user
#: (merged into :data:`engine.client.conformance.FAILING`).
FAILING: dict[str, str] = {
    "model_mismatch": "the response names another model than the one asked for (a fallback or routing "
                      "substitution): not the target's generation",
    "spliced_generation": "the stream's id, model or provider changed mid-stream: two generations spliced "
                          "into one (a gateway's mid-stream fallback)",
}

#: A date or version suffix that still names the asked model (see the module docstring).
_SUFFIX = re.compile(r"-(?:\d{4}|\d{6}|\d{8}|\d{4}-\d{2}-\d{2}|0\d{2})")


def canonical_model(name: str) -> str:
    """``name`` lower-cased, stripped, without an OpenRouter variant suffix (``:nitro``, ``:free``...)."""
    return name.strip().lower().split(":", 1)[0]


def _one(asked: str, served: str) -> bool:
    if served == asked:
        return True
    return served.startswith(asked) and _SUFFIX.fullmatch(served[len(asked):]) is not None


def same_model(asked: str, served: str) -> bool:
    """Whether the response's model id ``served`` names the model ``asked`` for (rules: module docstring).

    Args:
        asked: the request's ``model``; served: the response's ``model``.
    """
    a, s = canonical_model(asked), canonical_model(served)
    if _one(a, s):
        return True
    if ("/" in a) != ("/" in s):  # one side without its author prefix: compare the names
        return _one(a.rsplit("/", 1)[-1], s.rsplit("/", 1)[-1])
    return False


def model_mismatch(asked: str, served: str) -> bool:
    """True when both ids are known (non-empty) and ``served`` is another model than ``asked``."""
    return bool(asked.strip()) and bool(served.strip()) and not same_model(asked, served)


def _float(v: Any) -> float | None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def sampling_settings(body: dict[str, Any]) -> tuple[float | None, float | None]:
    """``(temperature, top_p)`` a request body asks for; None for one it leaves to the provider."""
    return _float(body.get("temperature")), _float(body.get("top_p"))


def attribute(req: ChatRequest, c: Completion) -> Completion:
    """``c`` with what its request tells about it: the sampling settings it was bought with
    (:func:`sampling_settings`) and, when the response names another model than ``req.body["model"]``,
    the flag ``model_mismatch`` (:func:`model_mismatch`)."""
    temperature, top_p = sampling_settings(req.body)
    asked = req.body.get("model")
    flags = c.flags
    if isinstance(asked, str) and model_mismatch(asked, c.model) and "model_mismatch" not in flags:
        flags = (*flags, "model_mismatch")
    if temperature == c.temperature and top_p == c.top_p and flags is c.flags:
        return c
    return replace(c, temperature=temperature, top_p=top_p, flags=flags)


class GenerationIdentity:
    """The identity a stream's chunks claim (``id``, ``model``, ``provider``, ``system_fingerprint``),
    watched for a second generation spliced in (flag ``spliced_generation``, module docstring).

    Feed every chunk to :meth:`observe`; :attr:`spliced` turns True at the first change of ``model`` or
    ``provider`` (non-empty values), or once two different chunk ``id`` values have each been carried by at
    least two consecutive chunks (ids minted per chunk, and one odd chunk, are no second generation).
    """

    __slots__ = ("chunk_id", "model", "provider", "system_fingerprint", "spliced", "_last_id", "_run", "_stable")

    def __init__(self) -> None:
        self.chunk_id = ""
        """The first non-empty chunk ``id``."""
        self.model = ""
        self.provider = ""
        self.system_fingerprint = ""
        self.spliced = False
        self._last_id = ""
        self._run = 0
        self._stable: set[str] = set()
        """Ids carried by two or more consecutive chunks."""

    def observe(self, chunk: dict[str, Any]) -> bool:
        """Take one chunk's identity fields; returns :attr:`spliced`."""
        self._model(chunk.get("model"))
        prov = chunk.get("provider")
        if prov and isinstance(prov, str):
            if self.provider and prov != self.provider:
                self.spliced = True
            self.provider = self.provider or prov
        fp = chunk.get("system_fingerprint")
        if fp and isinstance(fp, str) and not self.system_fingerprint:
            self.system_fingerprint = fp
        cid = chunk.get("id")
        if cid and isinstance(cid, str):
            self._id(cid)
        return self.spliced

    def _model(self, model: Any) -> None:
        if model and isinstance(model, str):
            if self.model and model != self.model:
                self.spliced = True
            self.model = self.model or model

    def _id(self, cid: str) -> None:
        self.chunk_id = self.chunk_id or cid
        if cid != self._last_id:
            self._last_id, self._run = cid, 1
            return
        self._run += 1
        if self._run == 2:
            self._stable.add(cid)
            if len(self._stable) >= 2:
                self.spliced = True
