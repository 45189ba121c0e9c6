"""OpenRouter's model listings as the simulator serves them: ``GET /api/v1/models`` and the endpoints
listing ``GET /api/v1/models/{author}/{slug}/endpoints``. Pure.

``/models`` lists the one model (:func:`models_listing`). The endpoints listing:

Shape (OpenRouter's "List all endpoints for a model", docs/openrouter.md section 6)::

    {"data": {"id", "name", "created", "description", "architecture": {...},
              "endpoints": [{"name", "model_id", "model_name", "context_length",
                             "pricing": {"prompt", "completion", "request", "image"},
                             "provider_name", "tag", "quantization", "max_completion_tokens",
                             "max_prompt_tokens", "supported_parameters", "status",
                             "uptime_last_30m", "supports_implicit_caching",
                             "latency_last_30m", "throughput_last_30m"}, ...]}}

One endpoint per simulated provider, in the configured order: ``provider_name`` is the provider's
name (the stream's ``provider`` field), ``quantization`` the configured label (default
:data:`DEFAULT_QUANTIZATION`), ``tag`` OpenRouter's ``slug/quantization`` form (``sima/int4``; the
simulator routes ``provider.order`` / ``only`` / ``ignore`` entries of that form, and the bare slug,
to the provider), ``status`` 0 (healthy), prices as USD-per-token strings.
"""

from __future__ import annotations

from typing import Any, Sequence

#: OpenRouter's quantization labels (its ``PublicEndpointQuantization`` enum).
QUANTIZATIONS: tuple[str, ...] = ("int4", "int8", "fp4", "fp6", "fp8", "fp16", "bf16", "fp32", "unknown")
#: The label of a provider not configured: Kimi-K2.5's own format.
DEFAULT_QUANTIZATION = "int4"

SUPPORTED_PARAMETERS: tuple[str, ...] = (
    "max_tokens", "temperature", "top_p", "seed", "stop", "tools", "tool_choice", "reasoning", "include_reasoning",
)


def per_token(usd_per_million: float) -> str:
    """USD per million tokens -> OpenRouter's USD-per-token string (``0.40`` -> ``"0.0000004"``)."""
    s = f"{usd_per_million / 1e6:.12f}".rstrip("0").rstrip(".")
    return s or "0"


def models_listing(*, model: str, served_model: str, price_in: str, price_out: str, context_length: int,
                   max_completion_tokens: int) -> dict[str, Any]:
    """``GET /models``: the one ``model`` (``canonical_slug`` the dated ``served_model``); prices are USD
    per token as strings, lengths in tokens."""
    return {
        "data": [
            {
                "id": model,
                "canonical_slug": served_model,
                "name": "Simulated " + model.split("/")[-1],
                "created": 1769904000,
                "context_length": context_length,
                "architecture": {"modality": "text->text", "tokenizer": "Other", "instruct_type": None},
                "pricing": {"prompt": price_in, "completion": price_out, "request": "0", "image": "0"},
                "top_provider": {
                    "context_length": context_length,
                    "max_completion_tokens": max_completion_tokens,
                    "is_moderated": False,
                },
                "supported_parameters": list(SUPPORTED_PARAMETERS),
            }
        ]
    }


def parse_quantization(spec: str) -> dict[str, str]:
    """``"SimQ=fp4,SimM=fp8"`` -> ``{"SimQ": "fp4", "SimM": "fp8"}`` (empty spec -> ``{}``).

    Raises:
        ValueError: an entry without ``=``, an empty name, or a label not in :data:`QUANTIZATIONS`.
    """
    out: dict[str, str] = {}
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        name, sep, label = part.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"quantization: {part!r} is not PROVIDER=LABEL")
        out[name.strip()] = label.strip()
    validate_quantization(out, None)
    return out


def validate_quantization(quantization: dict[str, str], providers: Sequence[str] | None) -> None:
    """Check labels (and, when ``providers`` is given, that every name is one of them).

    Raises:
        ValueError: an unknown label or provider.
    """
    for name, label in quantization.items():
        if label not in QUANTIZATIONS:
            raise ValueError(f"quantization: {name}={label}: the label must be one of {', '.join(QUANTIZATIONS)}")
        if providers is not None and name not in providers:
            raise ValueError(f"quantization: {name!r} is not one of the providers ({', '.join(providers)})")


def endpoint_tag(provider: str, quantization: dict[str, str]) -> str:
    """The endpoint's tag: ``{lower-cased provider}/{its quantization}`` (``SimQ`` at fp4 -> ``simq/fp4``)."""
    return f"{provider.lower()}/{quantization.get(provider, DEFAULT_QUANTIZATION)}"


def endpoints_listing(*, model: str, providers: Sequence[str], quantization: dict[str, str], price_in: str,
                      price_out: str, context_length: int, max_completion_tokens: int) -> dict[str, Any]:
    """The listing's JSON object for ``model`` (``author/slug``).

    Args:
        providers: the simulated providers, in order.
        quantization: provider -> label (others: :data:`DEFAULT_QUANTIZATION`).
        price_in / price_out: USD per token, as strings (OpenRouter's pricing form).
        context_length / max_completion_tokens: tokens.
    """
    short = model.split("/")[-1]
    endpoints = [
        {
            "name": f"{p} | {model}",
            "model_id": model,
            "model_name": f"Simulated {short}",
            "context_length": context_length,
            "pricing": {"prompt": price_in, "completion": price_out, "request": "0", "image": "0"},
            "provider_name": p,
            "tag": endpoint_tag(p, quantization),
            "quantization": quantization.get(p, DEFAULT_QUANTIZATION),
            "max_completion_tokens": max_completion_tokens,
            "max_prompt_tokens": None,
            "supported_parameters": list(SUPPORTED_PARAMETERS),
            "status": 0,
            "uptime_last_30m": 100.0,
            "supports_implicit_caching": False,
            "latency_last_30m": None,
            "throughput_last_30m": None,
        }
        for p in providers
    ]
    return {
        "data": {
            "id": model,
            "name": f"Simulated {short}",
            "created": 1769904000,
            "description": "The eagle-datagen simulator's model",
            "architecture": {"tokenizer": "Other", "instruct_type": None, "modality": "text->text",
                             "input_modalities": ["text"], "output_modalities": ["text"]},
            "endpoints": endpoints,
        }
    }
