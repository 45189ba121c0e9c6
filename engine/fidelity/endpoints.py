"""OpenRouter's endpoints listing of a model, reduced to what attribution needs (pure).

``GET /api/v1/models/{author}/{slug}/endpoints`` answers ``{"data": {"id", "name", ..., "endpoints":
[{"name", "provider_name", "tag", "quantization", "context_length", "status", "pricing", ...}]}}``
(OpenRouter API reference, "List endpoints for a model"; docs/fidelity.md, "Attribution").
"""

from __future__ import annotations

from typing import Any

#: The fields kept per endpoint.
FIELDS = ("provider_name", "name", "tag", "quantization", "context_length", "status")


def endpoints_path(model: str) -> str:
    """The listing's path under the API base for ``model`` (``author/slug``; a ``:variant`` suffix is dropped).

    Raises:
        ValueError: ``model`` is not ``author/slug``.
    """
    base = model.split(":", 1)[0]
    if base.count("/") != 1 or not all(base.split("/")):
        raise ValueError(f"model {model!r} is not author/slug: no endpoints listing")
    return f"/models/{base}/endpoints"


def parse_endpoints(doc: Any) -> list[dict[str, Any]]:
    """The endpoints of a listing, each reduced to :data:`FIELDS` (missing ones None), sorted by provider
    then tag; [] for a body of another shape."""
    data = doc.get("data") if isinstance(doc, dict) else None
    eps = data.get("endpoints") if isinstance(data, dict) else None
    if not isinstance(eps, list):
        return []
    out = [{k: e.get(k) for k in FIELDS} for e in eps if isinstance(e, dict)]
    return sorted(out, key=lambda e: (str(e["provider_name"] or ""), str(e["tag"] or "")))


def quantization_by_provider(endpoints: list[dict[str, Any]]) -> dict[str, str]:
    """``{provider_name: quantization}`` (several endpoints of one provider: their precisions joined with ``/``)."""
    out: dict[str, set[str]] = {}
    for e in endpoints:
        if e.get("provider_name") and e.get("quantization"):
            out.setdefault(str(e["provider_name"]), set()).add(str(e["quantization"]))
    return {p: "/".join(sorted(q)) for p, q in out.items()}
