"""Simulator configuration: :class:`SimConfig`, fault-spec parsing and argparse helpers.

The simulator reproduces OpenRouter's chat-completions wire protocol as recorded in
``docs/openrouter.md``; this module only holds the knobs.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.simfaults import FAULT_KINDS, parse_faults, validate_faults

from .behaviours import parse_behaviour, parse_behaviours
from .endpoints import parse_quantization, validate_quantization

__all__ = ["DEFAULT_CREDITS_USD", "FAULT_KINDS", "SimConfig", "add_sim_arguments", "parse_faults",
           "sim_config_from_args", "validate_faults"]

DEFAULT_CREDITS_USD = 100.0
"""The account credits (USD) of ``datagen sim`` and of the built-in simulator (``[provider.sim]
credits_usd``) when not set: a plausible balance that falls as the run spends, where unlimited
credits read $1,000,000,000.00 in the dashboard."""

@dataclass
class SimConfig:
    """Settings of one simulated OpenRouter endpoint.

    Attributes:
        host: interface to bind (default loopback only).
        port: TCP port; 0 picks an ephemeral port (read it back from ``SimServer.port``).
        seed: makes responses (text, lengths, tool calls, providers) and fault draws reproducible.
        latency_ms: milliseconds before the first generated token (stream) / before the response
            (non-stream).
        tokens_per_s: generation speed of ONE stream in tokens per second; 0 = as fast as possible.
        mean_completion_tokens: mean of the completion-length distribution (tokens, reasoning
            included); lengths are 8 + exponential, so the minimum is 8 tokens.
        reasoning_fraction: share (0..1) of the completion tokens that are reasoning.
        credits_usd: account credits in USD; ``None`` = unlimited (``datagen sim`` and ``[provider.sim]``
            default to :data:`DEFAULT_CREDITS_USD`). When set, a chat request gets
            HTTP 402 once the billed total reaches it, or (``credit_precheck``) when the remaining
            credits cannot pay for ``max_tokens`` (OpenRouter's pre-check, docs/openrouter.md).
        price_in: USD per million prompt tokens (Kimi K2.5 headline price, docs/openrouter.md).
        price_out: USD per million completion tokens (reasoning included).
        tokenizer: path of a tokenizer directory; when set, usage is counted with it instead of the
            estimate, loaded as ``[tokenizer]`` loads it (``engine.tokens.tokenizer.load_tokenizer``:
            a Kimi-style tiktoken directory natively, otherwise transformers ``AutoTokenizer``).
        faults: fault kind (see :data:`FAULT_KINDS`) -> probability per chat request; sum <= 1.
        providers: provider display names requests are routed to (``provider.only/ignore/order``).
        cancellable_providers: providers that stop billing when the client drops a stream; on
            the others a dropped stream is billed in full (docs/openrouter.md, "Cancellation").
        model: model id served; responses name the dated id ``{model}-0127``.
        keepalive_comments: send ``: OPENROUTER PROCESSING`` SSE comments in streams.
        log_path: when set, one JSON line per finished chat request is appended (and flushed).
        stall_s: seconds a ``stall`` fault keeps the socket silent, after which the server drops
            the connection (ends earlier when the client disconnects or the server stops).
        credit_precheck: refuse (402) a request whose ``max_tokens`` the remaining credits cannot
            pay for, as OpenRouter does. Only matters when ``credits_usd`` is set.
        usage_on_request: behave like vLLM / SGLang / OpenAI: a stream carries ``usage`` only when
            the request asks with ``stream_options: {"include_usage": true}`` (default False:
            OpenRouter sends usage in every stream).
        target: a causal LM directory (the rehearsal kit's ``DIR/target``, :mod:`engine.sim.rehearsal`);
            when set, completions are sampled from it (:mod:`engine.sim.backend`) instead of the word
            generator, and ``tokenizer`` must be set (the kit's ``DIR/tokenizer``).
        behaviours: provider -> behaviour text (``honest``, ``quant:KL``, ``temp:X``, ``mix:F[/INNER]``,
            :mod:`engine.sim.behaviours`) of a model-backed simulator; providers not named are honest.
        quantization: provider -> the ``quantization`` its endpoint declares in
            ``GET /models/{author}/{slug}/endpoints`` (default ``int4`` for every provider, Kimi-K2.5's
            own format).
        model_threads: threads that sample model-backed completions (each one request at a time).
    """

    host: str = "127.0.0.1"
    port: int = 0
    seed: int = 0
    latency_ms: float = 0.0
    tokens_per_s: float = 0.0
    mean_completion_tokens: int = 400
    reasoning_fraction: float = 0.5
    credits_usd: float | None = None
    price_in: float = 0.40
    price_out: float = 1.90
    tokenizer: str | None = None
    faults: dict[str, float] = field(default_factory=dict)
    providers: tuple[str, ...] = ("SimA", "SimB", "SimC")
    cancellable_providers: tuple[str, ...] = ("SimA", "SimB")
    model: str = "moonshotai/kimi-k2.5"
    keepalive_comments: bool = True
    log_path: str | None = None
    stall_s: float = 3600.0
    credit_precheck: bool = True
    usage_on_request: bool = False
    target: str | None = None
    behaviours: dict[str, str] = field(default_factory=dict)
    quantization: dict[str, str] = field(default_factory=dict)
    model_threads: int = 1

    def __post_init__(self) -> None:
        validate_faults(self.faults)
        self.providers = tuple(self.providers)
        self.cancellable_providers = tuple(self.cancellable_providers)
        if not self.providers:
            raise ValueError("providers must name at least one provider")
        if not 0.0 <= self.reasoning_fraction <= 1.0:
            raise ValueError(f"reasoning_fraction must be within [0, 1], got {self.reasoning_fraction}")
        if self.mean_completion_tokens < 1:
            raise ValueError(f"mean_completion_tokens must be >= 1, got {self.mean_completion_tokens}")
        if self.tokens_per_s < 0 or self.latency_ms < 0 or self.stall_s < 0:
            raise ValueError("tokens_per_s, latency_ms and stall_s must be >= 0")
        for name, text in self.behaviours.items():
            parse_behaviour(text)
            if name not in self.providers:
                raise ValueError(f"behaviours: {name!r} is not one of the providers ({', '.join(self.providers)})")
        if self.behaviours and not self.target:
            raise ValueError("behaviours need a model-backed simulator: set --target")
        if self.target and not self.tokenizer:
            raise ValueError("--target needs --tokenizer (the rehearsal kit's DIR/tokenizer)")
        if self.model_threads < 1:
            raise ValueError(f"model_threads must be >= 1, got {self.model_threads}")
        validate_quantization(self.quantization, self.providers)


def _names(spec: str) -> tuple[str, ...]:
    return tuple(s.strip() for s in spec.split(",") if s.strip())


def add_sim_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the simulator options (``--host --port --seed ... --log``) to ``parser``."""
    d = SimConfig()
    g = parser.add_argument_group("simulator")
    g.add_argument("--host", default=d.host, help="interface to bind (default %(default)s)")
    g.add_argument("--port", type=int, default=d.port, help="TCP port, 0 = ephemeral (default %(default)s)")
    g.add_argument("--seed", type=int, default=d.seed, help="seed for text, lengths and fault draws (default %(default)s)")
    g.add_argument("--latency-ms", type=float, default=d.latency_ms,
                   help="milliseconds before the first token (default %(default)s)")
    g.add_argument("--tokens-per-s", type=float, default=d.tokens_per_s,
                   help="tokens per second per stream, 0 = unlimited (default %(default)s)")
    g.add_argument("--mean-completion-tokens", type=int, default=d.mean_completion_tokens,
                   help="mean completion length in tokens (default %(default)s)")
    g.add_argument("--credits", type=float, default=DEFAULT_CREDITS_USD,
                   help="account credits in USD, read from /key and /credits; HTTP 402 once spent "
                        "(default %(default)s)")
    g.add_argument("--price-in", type=float, default=d.price_in,
                   help="USD per million prompt tokens (default %(default)s)")
    g.add_argument("--price-out", type=float, default=d.price_out,
                   help="USD per million completion tokens (default %(default)s)")
    g.add_argument("--tokenizer", default=None,
                   help="tokenizer directory to count usage with (default: none, usage is estimated)")
    g.add_argument("--faults", default="", help='fault probabilities, e.g. "429:0.05,502:0.03,midstream:0.01"; '
                   'data faults toolid, leak, split, badargs alter a completed response (default: none)')
    g.add_argument("--providers", default=None,
                   help=f"comma-separated provider names; when not given, the providers the behaviours name, if any "
                        f"(default {','.join(d.providers)})")
    g.add_argument(
        "--cancellable",
        default=",".join(d.cancellable_providers),
        help="comma-separated providers whose dropped streams stop billing (default %(default)s)",
    )
    g.add_argument("--log", default=None,
                   help="append one JSON line per finished chat request to this file (default: no log)")
    g.add_argument("--usage-on-request", action="store_true",
                   help="vLLM-like: usage in a stream only when stream_options.include_usage is true "
                        "(default: usage in every stream, as OpenRouter)")
    m = parser.add_argument_group("model-backed simulator (rehearsal: python -m engine.sim.rehearsal DIR builds a kit)")
    m.add_argument("--target", default=None,
                   help="sample completions from this causal LM directory (the kit's DIR/target; default: "
                        "the word generator); --tokenizer defaults to the kit's DIR/tokenizer beside it")
    m.add_argument("--behaviours", default="",
                   help='provider behaviours, e.g. "SimA=honest,SimB=honest,SimQ=quant:0.03,SimT=temp:1.4,'
                        'SimM=mix:0.3": quant:KL = fake-quantized weights at about KL nats/token, temp:X = X times '
                        'the requested temperature, mix:F[/quant:KL|/temp:X] = a share F of requests drifted '
                        '(default quant:0.1); unnamed providers are honest')
    m.add_argument("--quantization", default="",
                   help='declared precision per provider in /models/{author}/{slug}/endpoints, e.g. '
                        '"SimQ=fp4,SimM=fp8" (default int4 for every provider)')
    m.add_argument("--model-threads", type=int, default=d.model_threads,
                   help="threads sampling model-backed completions (default %(default)s)")


def sim_config_from_args(args: Any) -> SimConfig:
    """Build a :class:`SimConfig` from a namespace filled by :func:`add_sim_arguments`."""
    d = SimConfig()
    behaviours = {k: str(v) for k, v in parse_behaviours(getattr(args, "behaviours", "") or "").items()}
    providers = getattr(args, "providers", None)
    names = _names(providers) if providers else (tuple(behaviours) or d.providers)
    target = getattr(args, "target", None)
    tokenizer = getattr(args, "tokenizer", None)
    if target and not tokenizer and (Path(target).parent / "tokenizer").is_dir():
        tokenizer = str(Path(target).parent / "tokenizer")
    return SimConfig(
        host=getattr(args, "host", d.host),
        port=getattr(args, "port", d.port),
        seed=getattr(args, "seed", d.seed),
        latency_ms=getattr(args, "latency_ms", d.latency_ms),
        tokens_per_s=getattr(args, "tokens_per_s", d.tokens_per_s),
        mean_completion_tokens=getattr(args, "mean_completion_tokens", d.mean_completion_tokens),
        credits_usd=getattr(args, "credits", DEFAULT_CREDITS_USD),
        price_in=getattr(args, "price_in", d.price_in),
        price_out=getattr(args, "price_out", d.price_out),
        tokenizer=tokenizer,
        faults=parse_faults(getattr(args, "faults", "") or ""),
        providers=names,
        cancellable_providers=_names(getattr(args, "cancellable", ",".join(d.cancellable_providers))),
        log_path=getattr(args, "log", None),
        usage_on_request=bool(getattr(args, "usage_on_request", False)),
        target=target,
        behaviours=behaviours,
        quantization=parse_quantization(getattr(args, "quantization", "") or ""),
        model_threads=getattr(args, "model_threads", d.model_threads),
    )
