"""``[provider]`` and its tables (timeouts, routing, the simulator, several endpoints): where completions are bought."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlparse

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from engine.config.base import DEFAULT_KEY_ENV, OPENROUTER_BASE_URL, _Strict
from engine.finishes import finish_aliases
from engine.simfaults import parse_faults


class TimeoutsSection(_Strict):
    """``[provider.timeouts]`` in seconds: connect, stall (no bytes for N s), total per request."""

    connect_s: float = Field(10.0, gt=0, description=(
        "seconds to connect: a server (or replica) not reached within it counts as unreachable (class `connect`); "
        "each replica's credits read is bounded by it too"))
    stall_s: float = Field(120.0, gt=0, description="no bytes for this long = stalled (class `stall`), retried")
    total_s: float = Field(1800.0, gt=0, description=(
        "seconds per attempt (class `timeout` past it); also `run.drain_timeout_s`'s `\"auto\"`"))


class MaxPrice(_Strict):
    """OpenRouter ``provider.max_price`` in USD per million tokens."""

    prompt: float | None = Field(None, ge=0, description="highest prompt price, USD per million tokens")
    completion: float | None = Field(None, ge=0, description="highest completion price, USD per million tokens")


class RoutingSection(_Strict):
    """``[provider.routing]``: passed verbatim (minus unset keys) as OpenRouter's ``provider`` object.

    Field meanings follow OpenRouter's provider-routing docs (see docs/openrouter.md).
    """

    order: list[str] | None = Field(None, description="provider slugs to try first, in order")
    only: list[str] | None = Field(None, description=(
        "allow-list of provider slugs (a base slug such as `deepinfra` covers all of that provider's variants)"))
    ignore: list[str] | None = Field(None, description=(
        "deny-list of provider slugs; `datagen ctl RUN_DIR exclude-provider NAME` and the dashboard's `x` add to it "
        "for new requests"))
    quantizations: list[
        Literal["int4", "int8", "fp4", "mxfp4", "nvfp4", "fp6", "fp8", "mxfp8", "fp16", "bf16", "fp32", "unknown"]
    ] | None = Field(None, description="allow-list of quantizations (`fp4` also admits `mxfp4` and `nvfp4`)")
    allow_fallbacks: bool | None = Field(None, description=(
        "let OpenRouter fall back to other providers (its default: true)"))
    require_parameters: bool | None = Field(None, description=(
        "only providers that support every parameter sent (OpenRouter's default: false)"))
    data_collection: Literal["allow", "deny"] | None = Field(None, description=(
        "`deny`: only providers that do not store or train on prompts"))
    sort: Literal["price", "throughput", "latency"] | None = Field(None, description="order providers by this")
    max_price: MaxPrice | None = Field(None, description="`{ prompt, completion }` USD per million tokens.")

    def to_provider_object(self) -> dict[str, Any]:
        """Return the ``provider`` request object, or ``{}`` when nothing is set."""
        return self.model_dump(exclude_none=True)


class SimSection(_Strict):
    """``[provider.sim]``: the built-in simulator (see ``datagen sim --help`` for each option)."""

    seed: int = Field(0, description="seed for text, lengths and fault draws")
    latency_ms: float = Field(0.0, ge=0, description="milliseconds before the first token")
    tokens_per_s: float = Field(0.0, ge=0, description="tokens per second per stream, 0 = unlimited")
    mean_completion_tokens: int = Field(400, ge=1, description="mean completion length in tokens")
    # engine.sim.config.DEFAULT_CREDITS_USD: $100, not unlimited
    credits_usd: float | None = Field(100.0, ge=0, description=(
        "the account's credits in USD, read like OpenRouter's (`/key`, `/credits`) and falling as the run spends, "
        "402 once spent; raise it for a long rehearsal"))
    price_in: float = Field(0.40, ge=0, description="USD per million prompt tokens")
    price_out: float = Field(1.90, ge=0, description="USD per million completion tokens")
    tokenizer: Path | None = Field(None, description=(
        "count usage with a real tokenizer directory (the same tokenizer and chat template as `[tokenizer]`: "
        "billing then matches exactly); unset: usage is estimated"))
    faults: str = Field("", description=(
        "fault probabilities, a comma list of `kind:probability`, e.g. `\"429:0.05,502:0.03,midstream:0.01\"` "
        "(the kinds: [providers.md](providers.md#the-simulator)); empty: none"))
    providers: list[str] = Field(default_factory=lambda: ["SimA", "SimB", "SimC"], min_length=1,
                                 description="provider names the simulator reports")
    cancellable: list[str] = Field(default_factory=lambda: ["SimA", "SimB"], description=(
        "providers that stop billing when a stream is dropped (the others bill a dropped stream in full)"))
    log: Path | None = Field(None, description="JSONL file with one line per finished request; unset: no log")

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
        env = info.data.get("api_key_env") or DEFAULT_KEY_ENV.get(str(info.data.get("kind")), "OPENROUTER_API_KEY")
        raise ValueError("credentials in the URL are not supported (they would be sent as Basic auth instead of "
                         f"the API key); put the key in ${env}")


def _entry_without_credentials(e: "EndpointEntry", info: ValidationInfo) -> "EndpointEntry":
    _refuse_credentials(e.url, info)
    return e


class EndpointEntry(_Strict):
    """One entry of ``[provider] base_urls`` written as a table: ``{ url = "...", concurrency = N }``
    (a plain string is ``{ url = STRING }``); ``concurrency`` None: ``endpoint_concurrency``, else only
    the class limits."""

    url: str = Field(description="the replica's API root ending in `/v1`")
    concurrency: int | None = Field(None, ge=1, json_schema_extra={"doc_default": "`endpoint_concurrency`"},
                                    description="requests in flight on this replica at most")

    @field_validator("url")
    @classmethod
    def _url(cls, v: str) -> str:
        return _check_url(v)


class ProviderSection(_Strict):
    """``[provider]``: where completions are bought. Each field's ``description`` says what it does
    (docs/configuration.md is generated from them: ``make docs``); :data:`DEFAULT_KEY_ENV` gives
    ``api_key_env`` by kind, and left unset it is not "named in the config"
    (:func:`engine.run.apikey.key_required`)."""

    kind: Literal["openrouter", "openai", "simulated"] = Field("simulated", description=(
        "`openrouter`, `openai` (any OpenAI-compatible server: vLLM, SGLang, OpenAI itself) or `simulated` (the "
        "built-in simulator on an ephemeral 127.0.0.1 port; no key, no network)"))
    # api_key_env before the URLs: their check names it (fields are validated in this order)
    api_key_env: str = Field(
        default_factory=lambda data: DEFAULT_KEY_ENV.get(data.get("kind"), "OPENROUTER_API_KEY"),
        json_schema_extra={"doc_default": '`"OPENROUTER_API_KEY"` (kind `openai`: `"OPENAI_API_KEY"`)'},
        description=(
            "the NAME of the environment variable holding the key (never the key itself); refused at start when unset "
            "for `openrouter`, and for `openai` when this key (or `api_key_file`) is in the config (else a server "
            "answering 401 to `GET /key` is refused at start)"))
    api_key_file: Path | None = Field(None, description=(
        "file holding the key, used when the variable is unset (should be mode 600: a warning says otherwise)"))
    base_url: str | None = Field(None, json_schema_extra={"doc_default": "OpenRouter's for `openrouter`"}, description=(
        "API root ending in `/v1` (e.g. `https://openrouter.ai/api/v1`); ignored for `simulated`; http(s) only, and a "
        "key is never sent over plain http except to loopback; without credentials (`user:password@` is refused: "
        "the key goes in `api_key_env`); required for `openai` (or `base_urls`)"))
    model: str = Field("moonshotai/kimi-k2.5", description="model id sent with every request")
    stream: bool = Field(True, description="SSE streaming; `false` for plain JSON responses")
    stream_usage: bool = Field(True, description=(
        'streamed requests ask for usage with `stream_options: {"include_usage": true}` (vLLM, SGLang and OpenAI send '
        "none in a stream otherwise; OpenRouter accepts it); `false` only for a server that refuses `stream_options`"))
    return_token_ids: bool = Field(False, description=(
        "self-hosted vLLM (>= 0.10.2): ask for the generated token ids (`\"return_token_ids\": true` in every "
        "request; `choices[0].token_ids`, per chunk when streamed), store them (`results.token_ids`) and fail a "
        "record whose ids differ from the reconstruction (`token_ids_disagree`); opt-in because other servers (or "
        "an older vLLM) may refuse the unknown field with 400; hosted APIs (OpenRouter, OpenAI) return no ids"))
    finish_reasons: dict[str, Literal["stop", "length", "tool_calls", "content_filter"]] = Field(
        default_factory=dict, description=(
            "more aliases of the standard finish reasons, e.g. `{ completed = \"stop\" }` (compared lower-case; "
            "targets `stop`, `length`, `tool_calls`, `content_filter`), on top of the built-in ones (`eos`, `end`, "
            "`end_turn`, ...: [wire-conformance.md](wire-conformance.md)); any other finish fails its record as "
            "`unknown_finish`"))
    timeouts: TimeoutsSection = Field(default_factory=TimeoutsSection)
    routing: RoutingSection = Field(default_factory=RoutingSection)
    sim: SimSection = Field(default_factory=SimSection)
    base_urls: list[Annotated[EndpointEntry, AfterValidator(_entry_without_credentials)]] | None = Field(
        None, min_length=1, json_schema_extra={"doc_type": "list of URL strings or tables (length >= 1)"},
        description=(
            "several replicas of the model (kind `openai` only; not with `base_url`): a list of API roots, each a "
            "string or `{ url = \"...\", concurrency = N }`; each request goes to the healthy one with the fewest in "
            "flight"))
    endpoint_concurrency: int | None = Field(None, ge=1, description=(
        "requests in flight per replica at most (an entry's own `concurrency` wins); unset: only the class "
        "concurrencies bound them; only with `base_urls`"))
    endpoint_error_streak: int = Field(5, ge=1, description=(
        "errors in a row (5xx, timeout, stall, protocol, a disconnect it survived) that drain a replica; only with "
        "`base_urls`"))
    endpoint_probe_s: float = Field(1.0, gt=0, le=60, description=(
        "seconds before a replica out of rotation is probed again (`GET {base}/models`), doubling after each failed "
        "probe up to 60 s; only with `base_urls`"))

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
