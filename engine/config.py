"""Run configuration: the ``config.toml`` schema, validated with pydantic.

Every section forbids unknown keys, so a typo is an error naming the key instead of a silently
ignored setting. :func:`load_config` raises :class:`ConfigError` whose message names the file, the
key path (``datasets[2].token_budget``) and what was expected, before any request is sent.
Relative paths are resolved against the directory of the config file.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal
from urllib.parse import urlparse

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from engine.errors import DatagenError
from engine.simfaults import parse_faults

if TYPE_CHECKING:
    from engine.datasets.hub import HubRef

#: OpenRouter's base URL (used when ``provider.kind = "openrouter"`` and no ``base_url`` is given).
OPENROUTER_BASE_URL = "https://openrouter.ai/api/v1"


#: ``provider.api_key_env`` when the config does not set it, by ``provider.kind`` (others: OPENROUTER_API_KEY).
DEFAULT_KEY_ENV = {"openrouter": "OPENROUTER_API_KEY", "openai": "OPENAI_API_KEY"}


class ConfigError(DatagenError):
    """The configuration is invalid; the message names the file, key and expectation."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RunSection(_Strict):
    """``[run]``: identity and bookkeeping of one run.

    Attributes:
        name: run name shown in status and the dashboard.
        dir: run directory holding ``store.sqlite``, logs and exports (created owner-only).
        progress_interval_s: seconds between headless progress lines.
        commit_interval_s: upper bound on seconds between store commits (results are never lost
            to a crash older than this window).
        max_attempts: attempts per prompt (first try + retries) before it is failed.
        drain_timeout_s: on quit/SIGTERM/SIGINT/SIGHUP, seconds to let in-flight requests finish
            before aborting them; ``"auto"`` (default): ``provider.timeouts.total_s``, the requests'
            own bound, so a drain never cuts a stream that could still finish.
        metrics_port: TCP port of the Prometheus endpoint (``GET /metrics``, README "Metrics
            (Prometheus)") served by ``datagen run`` and ``datagen extract``; None (default): none;
            0: an ephemeral port (printed at start).
        metrics_host: address the endpoint listens on (default ``127.0.0.1``: this host only).
    """

    name: str = "run"
    dir: Path = Path("runs/run")
    progress_interval_s: float = Field(5.0, gt=0)
    commit_interval_s: float = Field(1.0, gt=0, le=10)
    max_attempts: int = Field(6, ge=1, le=100)
    drain_timeout_s: Annotated[float, Field(ge=0)] | Literal["auto"] = "auto"
    metrics_port: int | None = Field(None, ge=0, le=65535)
    metrics_host: str = Field("127.0.0.1", min_length=1)


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
    credits_usd: float | None = Field(None, ge=0)
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
        base_urls: several replicas of the model (kind ``openai`` only, instead of ``base_url``): each a
            URL string or an :class:`EndpointEntry` table; requests go to the healthy one with the fewest
            in flight (:mod:`engine.client.endpoints`).
        endpoint_concurrency: requests in flight per replica at most (None: only the class limits).
        endpoint_error_streak: errors in a row (5xx, timeouts, ...) that drain a replica.
        endpoint_probe_s: seconds before a replica taken out of rotation is probed again (doubling
            after each failed probe, up to 60 s).
    """

    kind: Literal["openrouter", "openai", "simulated"] = "simulated"
    base_url: str | None = None
    model: str = "moonshotai/kimi-k2.5"
    api_key_env: str = Field(default_factory=lambda data: DEFAULT_KEY_ENV.get(data.get("kind"), "OPENROUTER_API_KEY"))
    api_key_file: Path | None = None
    stream: bool = True
    stream_usage: bool = True
    timeouts: TimeoutsSection = Field(default_factory=TimeoutsSection)
    routing: RoutingSection = Field(default_factory=RoutingSection)
    sim: SimSection = Field(default_factory=SimSection)
    base_urls: list[EndpointEntry] | None = Field(None, min_length=1)
    endpoint_concurrency: int | None = Field(None, ge=1)
    endpoint_error_streak: int = Field(5, ge=1)
    endpoint_probe_s: float = Field(1.0, gt=0, le=60)

    @field_validator("base_url")
    @classmethod
    def _url(cls, v: str | None) -> str | None:
        return v if v is None else _check_url(v)

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


class GenerationSection(_Strict):
    """``[generation]``: sampling fields sent with every request.

    ``reasoning`` is OpenRouter's reasoning object (``{effort = "high"}`` or ``{max_tokens = N}``,
    ``exclude``, ``enabled``); ``extra_body`` is merged into the request body last.
    """

    temperature: float | None = Field(1.0, ge=0, le=2)
    top_p: float | None = Field(0.95, gt=0, le=1)
    seed: int | None = None
    reasoning: dict[str, Any] | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)


class ClassSection(_Strict):
    """``[classes.NAME]``: a request class with its own concurrency and completion cap.

    A prompt belongs to the class that lists its dataset in ``datasets``; otherwise to the class
    with the largest ``min_prompt_tokens`` not above the prompt's estimated tokens.

    Attributes:
        max_tokens: completion cap per request (tokens), always sent.
        concurrency: requests of this class in flight at once.
        min_prompt_tokens: smallest estimated prompt length (tokens) of this class.
        datasets: dataset names that always belong to this class.
    """

    max_tokens: int = Field(ge=1)
    concurrency: int = Field(ge=1, le=100_000)
    min_prompt_tokens: int = Field(0, ge=0)
    datasets: list[str] = Field(default_factory=list)


class HubPath(_Strict):
    """A ``[[datasets]] path`` of the form ``hf://datasets/ORG/NAME``: a Hugging Face Hub dataset
    (:mod:`engine.datasets.hub`); ``str()`` gives the path back."""

    repo: str

    def __str__(self) -> str:
        return f"hf://datasets/{self.repo}"


class DatasetSection(_Strict):
    """``[[datasets]]``: one prompt dataset.

    Attributes:
        name: unique name (letters, digits, ``_ - .``).
        path: a JSONL, JSON array or Parquet file (JSON ones optionally ``.gz``/``.zst``-compressed);
            a directory or glob of such files (read in sorted order); or ``hf://datasets/ORG/NAME``,
            a Hub dataset (:class:`HubPath`).
        revision: (``hf://`` only) branch, tag or commit sha; default ``main``. Resolved to a commit
            sha at ingest and stored with the run: a moved revision is re-read like a changed file.
        split: (``hf://`` only) the split whose files are read by the Hub's conventional layouts
            (``data/train-*``, ``train.jsonl``, ``*/train/*``, ...); default ``train``.
        files: (``hf://`` only) a glob over the repository's file paths, instead of ``split``.
        format: row format (``auto`` or one of ``engine.datasets.FORMATS``).
        max_prompts: take at most this many valid prompts, in file order.
        token_budget: token budget (tokens): completion tokens, or prompt + completion tokens
            when ``budget_counts = "total"``; never overshot by more than the in-flight tail.
        max_cost_usd: dollar cap of this dataset (USD).
        fields: optional column renames, e.g. ``{messages = "dialog"}``.
    """

    name: str = Field(pattern=r"^[A-Za-z0-9_.\-]+$", max_length=64)
    path: Path | HubPath
    revision: str | None = Field(None, min_length=1)
    split: str | None = Field(None, pattern=r"^[A-Za-z0-9_.\-]+$")
    files: str | None = Field(None, min_length=1)
    format: str = "auto"
    max_prompts: int | None = Field(None, ge=1)
    token_budget: int | None = Field(None, ge=1)
    budget_counts: Literal["completion", "total"] = "completion"
    max_cost_usd: float | None = Field(None, gt=0)
    fields: dict[str, str] = Field(default_factory=dict)

    @field_validator("path", mode="before")
    @classmethod
    def _hub_path(cls, v: Any) -> Any:
        if isinstance(v, str) and v.startswith("hf:"):
            from engine.datasets.hub import parse_url

            return HubPath(repo=parse_url(v))
        return v

    @field_validator("format")
    @classmethod
    def _format(cls, v: str) -> str:
        from engine.datasets import FORMATS

        if v not in FORMATS:
            raise ValueError(f"expected one of {', '.join(FORMATS)}, got {v!r}")
        return v

    @model_validator(mode="after")
    def _hub_keys(self) -> "DatasetSection":
        given = [k for k in ("revision", "split", "files") if getattr(self, k) is not None]
        if given and not isinstance(self.path, HubPath):
            raise ValueError(f"{', '.join(given)}: only for a path = \"hf://datasets/ORG/NAME\" (a local path names "
                             f"its files itself: a file, a directory or a glob)")
        if self.split is not None and self.files is not None:
            raise ValueError("split and files: give one (files picks the files by a glob instead of the split's layout)")
        return self

    def hub(self) -> "HubRef | None":
        """The Hub dataset of an ``hf://`` path, None for a local path."""
        if not isinstance(self.path, HubPath):
            return None
        from engine.datasets.hub import DEFAULT_REVISION, DEFAULT_SPLIT, HubRef

        return HubRef(self.path.repo, self.revision or DEFAULT_REVISION, self.split or DEFAULT_SPLIT, self.files)


class PricingSection(_Strict):
    """``[pricing]``: the model's prices in USD per MILLION tokens, when you know them.

    Price sources in order: prices learned from billed ``usage.cost`` (after 20 results), these,
    then the provider's ``/models`` endpoint. A dollar cap with no known price refuses to run.
    """

    prompt_usd_per_m: float | None = Field(None, ge=0)
    completion_usd_per_m: float | None = Field(None, ge=0)


class SpendSection(_Strict):
    """``[spend]``: run-wide money controls.

    Attributes:
        max_cost_usd: run-wide dollar cap (USD), reserved at dispatch like token budgets.
        on_budget: ``drain`` (in-flight requests finish and are kept) or ``abort`` (cancelled now)
            when a dataset's budget is met.
        credits_floor_usd: checked before each dispatch: a request is sent only while provider credits
            left minus the dollars reserved in flight minus its own expected cost stay >= this (USD);
            else it waits for in-flight requests, or the run pauses (:mod:`engine.money.creditsfloor`).
        credits_poll_s: seconds between reads of ``/key`` (fallback ``/credits``).
        calibrate_after: completions of a dataset+class before reservations use the observed
            percentile instead of ``max_tokens``; reserve_percentile: that percentile (0.5-1).
        anomaly_error_rate / anomaly_window: pause a dataset when more than this fraction of its
            last ``anomaly_window`` attempts failed, counted in dispatch order once resolved (0 disables;
            see :mod:`engine.run.anomaly`).
        reservation: ``expected`` (default) or ``none`` (naive: reserve nothing; for benchmarks).
        hard_cap: never exceed a token budget or dollar cap: each request reserves its class's
            ``max_tokens`` (and 4x its prompt estimate where prompts count), so fewer requests are
            in flight as a budget nears its end. Default false: reserve the observed percentile
            (overshoot within about 2%).
    """

    max_cost_usd: float | None = Field(None, gt=0)
    on_budget: Literal["drain", "abort"] = "drain"
    credits_floor_usd: float = Field(0.0, ge=0)
    credits_poll_s: float = Field(60.0, gt=0)
    calibrate_after: int = Field(50, ge=1)
    reserve_percentile: float = Field(0.90, ge=0.5, le=1.0)
    anomaly_error_rate: float = Field(0.20, ge=0, lt=1)
    anomaly_window: int = Field(200, ge=10)
    reservation: Literal["expected", "none"] = "expected"
    hard_cap: bool = False

    @model_validator(mode="after")
    def _hard_cap_reserves(self) -> "SpendSection":
        if self.hard_cap and self.reservation == "none":
            raise ValueError('hard_cap = true needs reservation = "expected" ("none" reserves nothing)')
        return self


class VllmSection(_Strict):
    """``[extract.vllm]``: keyword arguments passed to ``vllm.LLM(...)`` when ``[extract] engine = "vllm"``
    (README "Extraction on vLLM", docs/vllm-extraction.md). Unknown keys are errors; a key left out
    keeps vLLM's default, except those datagen fixes (prefill only, our token ids, prefix caching
    off, the ``extract_hidden_states`` method and datagen's KV connector).

    Attributes:
        tensor_parallel_size / pipeline_parallel_size: one replica over ``tp x pp`` GPUs; must equal
            ``[extract] gpus_per_worker`` on a GPU host.
        data_parallel_size: vLLM's own data parallelism inside one replica's ``LLM`` (multi-node with
            ``distributed_executor_backend = "ray"``); on one host datagen's workers are the data
            parallelism (one ``LLM`` per GPU group), so leave it at 1 there.
        quantization: vLLM's quantization method (``None``: from the checkpoint).
        max_model_len: longest sequence (tokens); default ``[extract] max_seq_len`` or the model's.
        gpu_memory_utilization: fraction of GPU memory vLLM may use (on vLLM's CPU backend: of the
            CPU memory it may use; set ``VLLM_CPU_KVCACHE_SPACE`` (GiB) for the KV cache there).
        max_num_batched_tokens / max_num_seqs: the scheduler's per-step token and sequence caps.
        distributed_executor_backend: ``mp``, ``ray``, ``uni`` or ``external_launcher``.
        trust_remote_code: models with custom code (Kimi-K2.5); default ``[extract] trust_remote_code``.
        enforce_eager: no CUDA graphs / torch.compile (slower, starts faster).
        kv_cache_dtype / block_size / seed / swap_space / cpu_offload_gb / enable_expert_parallel:
            as in vLLM's engine arguments.
    """

    tensor_parallel_size: int = Field(1, ge=1)
    pipeline_parallel_size: int = Field(1, ge=1)
    data_parallel_size: int = Field(1, ge=1)
    quantization: str | None = None
    max_model_len: int | None = Field(None, ge=1)
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1)
    max_num_batched_tokens: int | None = Field(None, ge=1)
    max_num_seqs: int | None = Field(None, ge=1)
    distributed_executor_backend: Literal["mp", "ray", "uni", "external_launcher"] | None = None
    trust_remote_code: bool | None = None
    enforce_eager: bool | None = None
    kv_cache_dtype: str | None = None
    block_size: int | None = Field(None, ge=1)
    seed: int | None = None
    swap_space: float | None = Field(None, ge=0)
    cpu_offload_gb: float | None = Field(None, ge=0)
    enable_expert_parallel: bool | None = None

    def llm_kwargs(self) -> dict[str, Any]:
        """The keys set in the config (None values left out), as ``vllm.LLM`` keyword arguments."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class ExtractSection(_Strict):
    """``[extract]``: hidden-state extraction for EAGLE-3 (``datagen extract CONFIG``). All optional.

    Attributes:
        model: target model, a local directory (relative to the config file when it exists there)
            or a Hugging Face hub id; loaded with ``AutoModelForCausalLM``. Required to extract.
        dtype: torch dtype of the model and of the saved hidden states: ``auto`` (``bfloat16`` on
            GPU, ``float32`` on CPU), ``bfloat16``, ``float16`` or ``float32``.
        aux_layers: the layers whose OUTPUTS are concatenated into ``aux_hidden_states``, as
            0-BASED DECODER-LAYER indices (the SpecForge / Model-Optimizer convention; with Hugging
            Face ``output_hidden_states`` layer i is ``hidden_states[i + 1]``; vLLM speculators'
            ids are these + 1). Default ``[1, L//2 - 1, L - 4]`` for L layers (Kimi-K2.5, L = 61:
            ``[1, 29, 57]``). Each must be in ``0 .. L-2``: the last layer's output is saved
            (after the final norm) as ``last_hidden_state``.
        gpus_per_worker: GPUs per model replica (1 when the model fits one GPU; more spreads one
            replica over several GPUs with ``device_map="auto"``).
        workers: worker processes (replicas); default every GPU group (GPUs // gpus_per_worker),
            or 1 on a machine without a GPU.
        max_tokens_per_batch: cap of one forward batch in PADDED tokens (batch size x longest
            sample); a single longer sample forms a batch of its own.
        max_seq_len: longest sample (tokens) to extract; longer ones follow ``over_length``.
        over_length: ``skip`` (default: not extracted, counted as skipped) or ``truncate`` (the
            first ``max_seq_len`` tokens are extracted; the manifest records ``truncated_from``).
        out_dir: output directory (shards, ``manifest.jsonl``, ``status/``); default
            ``<run.dir>/extract``.
        disk_margin_gb: free space (GB, 1e9 bytes) always left on the output file system: the
            job refuses to start when the projected bytes exceed free space minus this margin, and
            workers pause while free space is under it.
        trust_remote_code: passed to transformers (models with custom code, e.g. Kimi-K2.5).
        layout: how the hidden states are written (README "Hidden-state layouts"): ``shards``
            (default: this project's shards, read by ``engine.extract.loader``), ``speculators``
            (vLLM speculators' offline EAGLE-3 data: ``hidden_states/hs_{i}.safetensors`` + its
            preprocessed dataset) or ``specforge`` (SpecForge's offline EAGLE-3 files
            ``rows_*/data_{i}.ckpt``).
        after_run: chain extraction after generation in ``datagen run`` (README "Chaining"):
            ``never`` (default), ``run`` (once the whole run completed with exit 0) or ``dataset``
            (each dataset as soon as it is done and its token records are validated, while
            generation goes on). Needs ``model`` and a ``[tokenizer]`` section.
        engine: what runs the target model: ``transformers`` (default: ``AutoModelForCausalLM``,
            right for small targets and for proving correctness) or ``vllm`` (vLLM's
            ``extract_hidden_states`` method and datagen's KV connector: its kernels and
            tensor/pipeline parallelism, for targets like Kimi-K2.5; needs the ``vllm`` extra).
        vllm: ``[extract.vllm]``, the ``vllm.LLM`` arguments (:class:`VllmSection`).
    """

    model: str | None = None
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    aux_layers: list[int] | None = Field(None, min_length=1)
    gpus_per_worker: int = Field(1, ge=1)
    workers: int | None = Field(None, ge=1)
    max_tokens_per_batch: int = Field(16_384, ge=1)
    max_seq_len: int | None = Field(None, ge=1)
    over_length: Literal["skip", "truncate"] = "skip"
    out_dir: Path | None = None
    disk_margin_gb: float = Field(10.0, ge=0)
    trust_remote_code: bool = False
    layout: Literal["shards", "speculators", "specforge"] = "shards"
    after_run: Literal["never", "run", "dataset"] = "never"
    engine: Literal["transformers", "vllm"] = "transformers"
    vllm: VllmSection = Field(default_factory=VllmSection)

    @field_validator("aux_layers")
    @classmethod
    def _aux(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(i < 0 for i in v):
            raise ValueError(f"expected 0-based layer indices >= 0, got {v}")
        return v


class TokenizerSection(_Strict):
    """``[tokenizer]``: the target's tokenizer, for exact token ids (``engine.tokens``). All optional
    but ``path``; when the section is absent, reconstruction and validation are off.

    Attributes:
        path: a local directory, or a Hugging Face hub id (``kind = "hf"`` only). A relative path is
            resolved against the config file's directory when it exists there.
        kind: ``auto`` (``tiktoken`` when the directory holds ``tiktoken.model`` and no
            ``tokenizer.json``, else ``hf``), ``hf`` (transformers ``AutoTokenizer``) or ``tiktoken``
            (``tiktoken.model`` + ``tokenizer_config.json`` loaded natively, no remote code).
        trust_remote_code: passed to ``AutoTokenizer`` (``hf`` only); off unless set.
        split_regex: the pre-tokenizer regex of a ``tiktoken`` directory; default Kimi-K2.5's.
        thinking: the generation mode: the generation prompt must end with ``think_start`` (true) or
            not (false); the completion has exactly one ``think_end`` (true) or none (false).
        think_start / think_end / end_of_turn / tool_calls_begin / tool_calls_end / tool_call_begin /
            tool_call_argument_begin / tool_call_end: special tokens by TEXT (Kimi-K2.5's by
            default), each resolved at start-up to exactly one id; ``""`` = the family has none.
        tool_id_format: the model's native tool-call id, ``{name}`` and ``{index}`` (calls before it in
            the conversation) filled in; provider ids are rebuilt to it. ``""`` keeps provider ids.
        chat_template: a Jinja file overriding the tokenizer's own chat template.
        chat_preprocess: the steps the tokenizer's own code applies around its template:
            ``kimi`` (Kimi-K2.5's: deep-sorted ``tools`` and the TypeScript ``tools_ts_str``,
            docs/kimi-tokenizer.md), ``none``, or ``auto`` (``kimi`` for a ``tiktoken`` directory and
            for an ``hf`` directory with Kimi's tokenizer code).
        template_vars: extra variables for the chat template (``thinking``/``enable_thinking`` are
            set from ``thinking`` unless given here).
        billing_tolerance_tokens / billing_tolerance_pct: a record fails ``billing_diff`` when
            |rebuilt completion length - usage.completion_tokens| exceeds the larger of the two
            (tokens; percent of the rebuilt length).
        max_failure_rate / failure_window: a dataset whose share of invalid records among its last
            ``failure_window`` validated records passes this is reported to the anomaly guard
            (0 disables).
        workers / executor: reconstruction pool off the event loop (``process`` or ``thread``).
        prompt_special_text: ``keep`` (default: a special token's text typed in a prompt message is
            sent as is, becomes that special id, and the prompt is flagged ``special_text_in_prompt``)
            or ``reject`` (such prompts are rejected at ingest); :mod:`engine.tokens.promptcheck`.
    """

    path: str
    kind: Literal["auto", "hf", "tiktoken"] = "auto"
    trust_remote_code: bool = False
    split_regex: str | None = None
    thinking: bool = True
    think_start: str = "<think>"
    think_end: str = "</think>"
    end_of_turn: str = "<|im_end|>"
    tool_calls_begin: str = "<|tool_calls_section_begin|>"
    tool_calls_end: str = "<|tool_calls_section_end|>"
    tool_call_begin: str = "<|tool_call_begin|>"
    tool_call_argument_begin: str = "<|tool_call_argument_begin|>"
    tool_call_end: str = "<|tool_call_end|>"
    tool_id_format: str = "functions.{name}:{index}"
    chat_template: Path | None = None
    chat_preprocess: Literal["auto", "kimi", "none"] = "auto"
    template_vars: dict[str, Any] = Field(default_factory=dict)
    billing_tolerance_tokens: int = Field(2, ge=0)
    billing_tolerance_pct: float = Field(0.5, ge=0)
    max_failure_rate: float = Field(0.2, ge=0, lt=1)
    failure_window: int = Field(200, ge=10)
    workers: int = Field(1, ge=1, le=64)
    executor: Literal["process", "thread"] = "process"
    prompt_special_text: Literal["keep", "reject"] = "keep"

    @field_validator("path")
    @classmethod
    def _path(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("expected a tokenizer directory or hub id")
        return v

    @field_validator("tool_id_format")
    @classmethod
    def _idfmt(cls, v: str) -> str:
        if v:
            try:
                v.format(name="f", index=0)
            except (KeyError, IndexError, ValueError) as e:
                raise ValueError(f"expected a format with {{name}} and {{index}} only, got {v!r} ({e})") from None
        return v


def _default_classes() -> dict[str, ClassSection]:
    return {
        "short": ClassSection(max_tokens=10_240, concurrency=2_000, min_prompt_tokens=0),
        "long": ClassSection(max_tokens=16_384, concurrency=500, min_prompt_tokens=8_000),
    }


class Config(_Strict):
    """The whole ``config.toml``."""

    run: RunSection = Field(default_factory=RunSection)
    provider: ProviderSection = Field(default_factory=ProviderSection)
    generation: GenerationSection = Field(default_factory=GenerationSection)
    pricing: PricingSection = Field(default_factory=PricingSection)
    spend: SpendSection = Field(default_factory=SpendSection)
    classes: dict[str, ClassSection] = Field(default_factory=_default_classes, min_length=1)
    datasets: list[DatasetSection] = Field(min_length=1)
    tokenizer: TokenizerSection | None = None
    extract: ExtractSection = Field(default_factory=ExtractSection)

    @model_validator(mode="after")
    def _cross(self) -> "Config":
        names = [d.name for d in self.datasets]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"dataset names must be unique; repeated: {', '.join(dup)}")
        for cname, c in self.classes.items():
            unknown = [d for d in c.datasets if d not in names]
            if unknown:
                raise ValueError(f"classes.{cname}.datasets names unknown dataset(s): {', '.join(unknown)}")
        if not any(c.min_prompt_tokens == 0 for c in self.classes.values()):
            raise ValueError("one class must have min_prompt_tokens = 0 so every prompt has a class")
        if self.extract.after_run != "never":
            need = [what for what, ok in (("extract.model (the target model)", self.extract.model),
                                          ("a [tokenizer] section (extraction reads validated token records)",
                                           self.tokenizer)) if not ok]
            if need:
                raise ValueError(f'extract.after_run = "{self.extract.after_run}" needs ' + " and ".join(need))
        return self

    def class_for(self, dataset: str, est_prompt_tokens: int) -> str:
        """Return the class name for a prompt of ``dataset`` with ``est_prompt_tokens`` tokens."""
        for name, c in self.classes.items():
            if dataset in c.datasets:
                return name
        best, best_min = "", -1
        for name, c in self.classes.items():
            if best_min < c.min_prompt_tokens <= est_prompt_tokens:
                best, best_min = name, c.min_prompt_tokens
        return best

    def dataset(self, name: str) -> DatasetSection:
        """Return the dataset section called ``name`` (KeyError if none)."""
        for d in self.datasets:
            if d.name == name:
                return d
        raise KeyError(name)


def _loc(loc: tuple[Any, ...], data: dict[str, Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part in ("function-after", "function-before") or str(part).startswith(("function-", "literal[")):
            continue
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _format_errors(path: Path, err: ValidationError, data: dict[str, Any]) -> str:
    lines = [f"{path}: invalid configuration:"]
    for e in err.errors():
        key = _loc(e["loc"], data)
        kind = e["type"]
        if kind == "extra_forbidden":
            msg = "unknown key (check the spelling; see README 'Configuration')"
        elif kind == "missing":
            msg = "required key is missing"
        else:
            msg = e["msg"].removeprefix("Value error, ")
            if "input" in e and kind not in ("value_error",) and not isinstance(e["input"], dict):
                msg += f" (got {e['input']!r})"
        lines.append(f"  {key}: {msg}")
    return "\n".join(lines)


def _resolve_paths(cfg: Config, base: Path) -> Config:
    def rel(p: Path | None) -> Path | None:
        if p is None:
            return None
        p = p.expanduser()
        return p if p.is_absolute() else (base / p)

    datasets = [d if isinstance(d.path, HubPath) else d.model_copy(update={"path": rel(d.path)}) for d in cfg.datasets]
    sim = cfg.provider.sim.model_copy(update={"tokenizer": rel(cfg.provider.sim.tokenizer), "log": rel(cfg.provider.sim.log)})
    provider = cfg.provider.model_copy(update={"sim": sim, "api_key_file": rel(cfg.provider.api_key_file)})
    run = cfg.run.model_copy(update={"dir": rel(cfg.run.dir)})
    ex = cfg.extract
    model = ex.model
    if model is not None:
        mp = Path(model).expanduser()
        if mp.is_absolute():
            model = str(mp)
        elif (base / mp).exists():
            model = str(base / mp)  # a local directory next to the config; otherwise a hub id
    extract = ex.model_copy(update={"out_dir": rel(ex.out_dir), "model": model})
    return cfg.model_copy(update={"datasets": datasets, "provider": provider, "run": run, "extract": extract})


def _resolve_tokenizer(cfg: Config, base: Path) -> Config:
    """Resolve ``[tokenizer]`` paths: ``path`` when it exists next to the config or the kind is
    ``tiktoken`` (else a hub id), ``chat_template`` always."""
    t = cfg.tokenizer
    if t is None:
        return cfg
    p = Path(t.path).expanduser()
    local = (base / p).exists() or t.kind == "tiktoken"  # a tiktoken tokenizer is always a local directory
    path = str(p) if p.is_absolute() else (str(base / p) if local else t.path)
    tmpl = t.chat_template.expanduser() if t.chat_template else None
    if tmpl is not None and not tmpl.is_absolute():
        tmpl = base / tmpl
    return cfg.model_copy(update={"tokenizer": t.model_copy(update={"path": path, "chat_template": tmpl})})


def _dataset_problem(d: DatasetSection) -> str | None:
    """Why ``d.path`` names nothing to read (None when it does), without touching the network: a
    missing, non-regular or unreadable file; a directory without data files; a glob matching none; for
    ``hf://``, nothing unless ``HF_HUB_OFFLINE`` is set, then the cache must hold the revision."""
    hub = d.hub()
    if hub is not None:
        from engine.datasets import hub as hubs

        return hubs.check_cached(hub) if hubs.offline() else None
    from engine.datasets.sources import DatasetError, is_glob, local_shards

    p = d.path
    try:
        if is_glob(p) and not p.exists() or p.is_dir():
            try:
                local_shards(p)
            except DatasetError as e:
                return str(e)
            return None
        if not p.exists():
            return f"file not found: {p}"
        if not p.is_file():
            return f"not a file: {p}"
        if not os.access(p, os.R_OK):
            return f"not readable: {p}"
    except OSError as e:  # e.g. a directory we may not search
        return f"cannot access {p}: {e.strerror}"
    return None


def parse_config(data: dict[str, Any], path: Path = Path("config.toml"), *, check_files: bool = True) -> Config:
    """Validate an already-parsed TOML mapping.

    Args:
        data: the TOML document as a dict.
        path: the file it came from (for messages and resolving relative paths).
        check_files: verify that every dataset ``path`` names something to read (a readable file, a
            directory with data files, a glob that matches); ``hf://`` paths are not checked (no network
            at validation) unless ``HF_HUB_OFFLINE`` is set, then the Hugging Face cache must hold them.

    Raises:
        ConfigError: naming ``path``, the key and what was expected.
    """
    try:
        cfg = Config.model_validate(data)
    except ValidationError as e:
        raise ConfigError(_format_errors(path, e, data)) from None
    cfg = _resolve_paths(cfg, path.parent)
    cfg = _resolve_tokenizer(cfg, path.parent)
    if check_files:
        problems = [f"  datasets[{i}].path ({d.name}): {why}" for i, d in enumerate(cfg.datasets)
                    if (why := _dataset_problem(d)) is not None]
        tok = cfg.provider.sim.tokenizer
        hint = "`datagen make-tokenizer DIR` builds the small demo tokenizer, as `make demo` does"
        if cfg.provider.kind == "simulated" and tok is not None and not tok.exists():
            problems.append(f"  provider.sim.tokenizer: not found: {tok} ({hint})")
        t = cfg.tokenizer
        if t is not None and t.kind == "tiktoken" and not Path(t.path).is_dir():
            problems.append(f"  tokenizer.path: not a directory: {t.path} (kind \"tiktoken\" needs a local directory; {hint})")
        if problems:
            raise ConfigError(f"{path}: invalid configuration:\n" + "\n".join(problems))
    return cfg


def load_config(path: str | Path, *, check_files: bool = True) -> Config:
    """Read and validate a ``config.toml``.

    Raises:
        ConfigError: file missing/unreadable, TOML syntax error (with line), or invalid values.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise ConfigError(f"{path}: config file not found") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read config file: {e.strerror}") from None
    try:
        data = tomllib.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as e:
        raise ConfigError(f"{path}: config is not UTF-8 (byte {e.start})") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: TOML syntax error: {e}") from None
    return parse_config(data, path.resolve(), check_files=check_files)


