"""``[provider]`` and its tables (timeouts, routing, the simulator, several endpoints): where completions are bought."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from engine.config.base import DEFAULT_KEY_ENV, OPENROUTER_BASE_URL, _Strict
from engine.finishes import finish_aliases
from engine.simfaults import parse_faults


class TimeoutsSection(_Strict):
    """``[provider.timeouts]`` in seconds: connect, stall (no bytes for N s), total per request."""

    connect_s: float = Field(10.0, gt=0)
    stall_s: float = Field(120.0, gt=0)
    total_s: float = Field(1800.0, gt=0)


class MaxPrice(_Strict):
    """OpenRouter ``provider.max_price`` in USD per million tokens."""

    prompt: float | None = Field(None, ge=0)
    completion: float | None = Field(None, ge=0)


class RoutingSection(_Strict):
    """``[provider.routing]``: passed verbatim (minus unset keys) as OpenRouter's ``provider`` object.

    Field meanings follow OpenRouter's provider-routing docs (see docs/openrouter.md).
    """

    order: list[str] | None = None
    only: list[str] | None = None
    ignore: list[str] | None = None
    quantizations: list[
        Literal["int4", "int8", "fp4", "mxfp4", "nvfp4", "fp6", "fp8", "mxfp8", "fp16", "bf16", "fp32", "unknown"]
    ] | None = None
    allow_fallbacks: bool | None = None
    require_parameters: bool | None = None
    data_collection: Literal["allow", "deny"] | None = None
    sort: Literal["price", "throughput", "latency"] | None = None
    max_price: MaxPrice | None = None

    def to_provider_object(self) -> dict[str, Any]:
        """Return the ``provider`` request object, or ``{}`` when nothing is set."""
        return self.model_dump(exclude_none=True)


class SimSection(_Strict):
    """``[provider.sim]``: the built-in simulator (see ``datagen sim --help`` for each option)."""

    seed: int = 0
    latency_ms: float = Field(0.0, ge=0)
    tokens_per_s: float = Field(0.0, ge=0)
    mean_completion_tokens: int = Field(400, ge=1)
    credits_usd: float | None = Field(100.0, ge=0)  # engine.sim.config.DEFAULT_CREDITS_USD: $100, not unlimited
    price_in: float = Field(0.40, ge=0)
    price_out: float = Field(1.90, ge=0)
    tokenizer: Path | None = None
    faults: str = ""
    providers: list[str] = Field(default_factory=lambda: ["SimA", "SimB", "SimC"], min_length=1)
    cancellable: list[str] = Field(default_factory=lambda: ["SimA", "SimB"])
    log: Path | None = None

    @field_validator("faults")
    @classmethod
    def _faults_parse(cls, v: str) -> str:
        if v:
            parse_faults(v)
        return v


def _check_url(v: str) -> str:
    """An http(s) API root without its trailing ``/``.

    Raises:
        ValueError: not an http(s) URL with a host.
    """
    u = urlparse(v)
    if u.scheme not in ("http", "https") or not u.netloc:
        raise ValueError(f"expected an http(s) URL like https://openrouter.ai/api/v1, got {v!r}")
    return v.rstrip("/")


def _refuse_credentials(url: str, info: ValidationInfo) -> None:
    """Refuse a ``user:password@`` (or ``user@``) in a provider URL: httpx would send it as Basic
    auth in place of the ``Authorization: Bearer`` key, and the server's 401 would blame the key.

    The message names the key's variable (``api_key_env``, validated before the URLs), never the
    URL or anything in it.

    Raises:
        ValueError: the URL has credentials.
    """
    if "@" in urlparse(url).netloc:
        env = info.data.get("api_key_env") or DEFAULT_KEY_ENV.get(info.data.get("kind"), "OPENROUTER_API_KEY")
        raise ValueError("credentials in the URL are not supported (they would be sent as Basic auth instead of "
                         f"the API key); put the key in ${env}")


def _entry_without_credentials(e: "EndpointEntry", info: ValidationInfo) -> "EndpointEntry":
    _refuse_credentials(e.url, info)
    return e


class EndpointEntry(_Strict):
    """One entry of ``[provider] base_urls`` written as a table: ``{ url = "...", concurrency = N }``
    (a plain string is ``{ url = STRING }``).

    Attributes:
        url: the replica's API root ending in ``/v1``.
        concurrency: requests in flight on this replica at most (overrides ``endpoint_concurrency``;
            None: that, else only the class limits).
    """

    url: str
    concurrency: int | None = Field(None, ge=1)

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _check_url(v)


class ProviderSection(_Strict):
    """``[provider]``: where completions are bought.

    Attributes:
        kind: ``openrouter`` | ``openai`` (any OpenAI-compatible server, e.g. vLLM/SGLang) |
            ``simulated`` (the built-in simulator on an ephemeral loopback port; no key, no network).
        base_url: API root ending in ``/v1`` (e.g. ``https://openrouter.ai/api/v1``); ignored for
            ``simulated``. Must be http(s); a key is never sent over plain http except to loopback.
            Credentials in a URL (``user:password@``, here or in ``base_urls``) are refused: the key
            goes in ``api_key_env``.
        model: model id sent in every request.
        api_key_env: NAME of the environment variable holding the key (never the key itself);
            default by kind (:data:`DEFAULT_KEY_ENV`): ``OPENAI_API_KEY`` for ``openai``,
            ``OPENROUTER_API_KEY`` otherwise. Left unset it is not "named in the config"
            (:func:`engine.run.apikey.key_required`).
        api_key_file: optional path of a file holding the key (used when the variable is unset).
        stream: stream responses with SSE (default) or not.
        stream_usage: with ``stream``, ask for usage in the stream (``stream_options: {"include_usage":
            true}``; default true). vLLM, SGLang and OpenAI send no usage in a stream without it; OpenRouter
            accepts it. Set false only for a server that refuses ``stream_options``.
        finish_reasons: more aliases of the standard finish reasons, ``{"alias": "stop" | "length" |
            "tool_calls" | "content_filter"}`` (compared lower-case), on top of the built-in ones
            (``eos``, ``end``, ``end_turn`` ... see docs/wire-conformance.md). Any other finish fails
            its record as ``unknown_finish``.
        return_token_ids: ask the server for the generated token ids (``"return_token_ids": true`` in every
            request; default false). A self-hosted vLLM >= 0.10.2 then returns them (``choices[0].token_ids``,
            per chunk when streamed); they are stored with the result (``results.token_ids``) and validation
            fails a record whose ids differ from the reconstruction's (``token_ids_disagree``). Opt-in: only
            vLLM from that version accepts the field, and another server (or an older vLLM) may reject an
            unknown field with 400; hosted APIs (OpenRouter, OpenAI) do not return ids.
        base_urls: several replicas of the model (kind ``openai`` only, instead of ``base_url``): each a
            URL string or an :class:`EndpointEntry` table; requests go to the healthy one with the fewest
            in flight (:mod:`engine.client.endpoints`).
        endpoint_concurrency: requests in flight per replica at most (None: only the class limits).
        endpoint_error_streak: errors in a row (5xx, timeouts, ...) that drain a replica.
        endpoint_probe_s: seconds before a replica taken out of rotation is probed again (doubling
            after each failed probe, up to 60 s).
    """

    kind: Literal["openrouter", "openai", "simulated"] = "simulated"
    # api_key_env before the URLs: their check names it (fields are validated in this order)
    api_key_env: str = Field(default_factory=lambda data: DEFAULT_KEY_ENV.get(data.get("kind"), "OPENROUTER_API_KEY"))
    api_key_file: Path | None = None
    base_url: str | None = None
    model: str = "moonshotai/kimi-k2.5"
    stream: bool = True
    stream_usage: bool = True
    return_token_ids: bool = False
    finish_reasons: dict[str, Literal["stop", "length", "tool_calls", "content_filter"]] = Field(default_factory=dict)
    timeouts: TimeoutsSection = Field(default_factory=TimeoutsSection)
    routing: RoutingSection = Field(default_factory=RoutingSection)
    sim: SimSection = Field(default_factory=SimSection)
    base_urls: list[Annotated[EndpointEntry, AfterValidator(_entry_without_credentials)]] | None = Field(None, min_length=1)
    endpoint_concurrency: int | None = Field(None, ge=1)
    endpoint_error_streak: int = Field(5, ge=1)
    endpoint_probe_s: float = Field(1.0, gt=0, le=60)

    @field_validator("finish_reasons")
    @classmethod
    def _aliases(cls, v: dict[str, str]) -> dict[str, str]:
        finish_aliases(v)  # raises ValueError naming the alias
        return v

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is None:
            return v
        _refuse_credentials(v, info)
        return _check_url(v)

    @field_validator("base_urls", mode="before")
    @classmethod
    def _url_entries(cls, v: Any) -> Any:
        if isinstance(v, list):
            return [{"url": e} if isinstance(e, str) else e for e in v]
        return v

    @field_validator("base_urls")
    @classmethod
    def _urls(cls, v: list[EndpointEntry] | None, info: Any) -> list[EndpointEntry] | None:
        if v is None:
            return v
        if info.data.get("base_url"):
            raise ValueError("give either base_url (one server) or base_urls (several replicas), not both")
        kind = info.data.get("kind")
        if kind is not None and kind != "openai":
            raise ValueError(f'several endpoints need kind = "openai" (vLLM/SGLang replicas), not {kind!r}')
        urls = [e.url for e in v]
        dup = sorted({u for u in urls if urls.count(u) > 1})
        if dup:
            raise ValueError(f"each endpoint once; repeated: {', '.join(dup)}")
        return v

    @field_validator("api_key_env")
    @classmethod
    def _env_name(cls, v: str) -> str:
        if not v or not all(c.isalnum() or c == "_" for c in v) or v.startswith(("sk-", "sk_")):
            raise ValueError(f"expected the NAME of an environment variable (e.g. OPENROUTER_API_KEY), got {v[:6]!r}...")
        return v

    @model_validator(mode="after")
    def _needs_url(self) -> "ProviderSection":
        if self.kind == "openai" and not self.base_url and not self.base_urls:
            raise ValueError("kind 'openai' needs base_url (e.g. http://127.0.0.1:8000/v1)")
        lonely = [k for k in ("endpoint_concurrency", "endpoint_error_streak", "endpoint_probe_s")
                  if k in self.model_fields_set]
        if lonely and not self.base_urls:
            raise ValueError(f"{', '.join(lonely)}: used only with several endpoints; set base_urls "
                             f"(or remove {'it' if len(lonely) == 1 else 'them'})")
        return self

    def endpoints(self) -> list[tuple[str, int | None]]:
        """``(url, concurrency cap)`` of each ``base_urls`` entry (the entry's own ``concurrency``, else
        ``endpoint_concurrency``); ``[]`` without ``base_urls``."""
        return [(e.url, e.concurrency or self.endpoint_concurrency) for e in self.base_urls or ()]

    def all_base_urls(self) -> list[str]:
        """Every API root requests may go to: the ``base_urls``, else ``[resolved_base_url()]``
        (``[]`` for ``simulated``)."""
        if self.base_urls:
            return [e.url for e in self.base_urls]
        url = self.resolved_base_url()
        return [url] if url else []

    def resolved_base_url(self) -> str | None:
        """``base_url``, or OpenRouter's for kind ``openrouter``; None for ``simulated``."""
        if self.kind == "simulated":
            return None
        return self.base_url or OPENROUTER_BASE_URL
