"""``[extract]`` and ``[extract.vllm]``: hidden-state extraction."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from engine.config.base import _Strict


_HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*/[A-Za-z0-9_.\-]+")


def hub_id_form(model: str) -> bool:
    """Whether ``model`` has the form of a Hugging Face hub id, ``ORG/NAME``: exactly one ``/``, no
    leading ``./``, ``../``, ``/`` or ``~`` (characters as the Hub allows them)."""
    return bool(_HUB_ID.fullmatch(model)) and ".." not in model


def resolve_model(model: str, bases: list[Path]) -> str:
    """``[extract] model`` -> a local directory's path or a hub id, decided without the network.

    A hub id is ``ORG/NAME`` (:func:`hub_id_form`) whose ``ORG`` is not an existing directory under
    any of ``bases``; it is returned as it is. Anything else is a local directory: an absolute path
    as given (``~`` expanded), a relative one joined to the first base where it exists, else to the
    first base holding its first component, else to the first base (a path that does not exist,
    which :func:`engine.extract.job.check_model` refuses at once: a typo is never sent to the Hub).

    Args:
        model: the configured value; bases: where relative names are looked up, in order (the
            config file's directory, then the working directory).
    """
    mp = Path(model).expanduser()
    if mp.is_absolute():
        return str(mp)
    for b in bases:
        if (b / mp).exists():
            return str(b / mp)
    holder = next((b for b in bases if (b / mp.parts[0]).is_dir()), None) if mp.parts else None
    if hub_id_form(model) and holder is None:
        return model
    return str((holder or bases[0]) / mp)


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
        model: target model, a local directory (relative to the config file's directory, or the
            working directory when it exists only there) or a Hugging Face hub id ``ORG/NAME``
            (:func:`resolve_model`: a name that is neither is refused at once, before any network);
            loaded with ``AutoModelForCausalLM``. Required to extract.
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
            preprocessed dataset), ``specforge`` (SpecForge's offline EAGLE-3 files
            ``rows_*/data_{i}.ckpt`` + ``vocab_mapping/vocab_mapping.pt``) or ``modelopt`` (NVIDIA
            Model-Optimizer's offline EAGLE-3 dumps, one ``{id}.pt`` per sample).
        save_dtype: how the hidden states are stored: ``model`` (default: the model dtype, ``dtype``)
            or ``fp8`` (``float8_e4m3fn`` with one float32 scale per token, speculators' fp8
            convention: about half the bytes of bf16; layouts ``shards`` and ``speculators`` only).
        draft_vocab_size: ``specforge`` only: the draft vocabulary size of the vocabulary mapping it
            writes (default ``min(32000, the target's vocab_size)``).
        compress / compression_level: ``specforge`` only: gzip each feature file
            (``data_{i}.ckpt.gz``, SpecForge's own ``--compress``/``--compression-level``, level 1-9).
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
    layout: Literal["shards", "speculators", "specforge", "modelopt"] = "shards"
    save_dtype: Literal["model", "fp8"] = "model"
    draft_vocab_size: int | None = Field(None, ge=1)
    compress: bool = False
    compression_level: int = Field(6, ge=1, le=9)
    after_run: Literal["never", "run", "dataset"] = "never"
    engine: Literal["transformers", "vllm"] = "transformers"
    vllm: VllmSection = Field(default_factory=VllmSection)

    @field_validator("aux_layers")
    @classmethod
    def _aux(cls, v: list[int] | None) -> list[int] | None:
        if v is not None and any(i < 0 for i in v):
            raise ValueError(f"expected 0-based layer indices >= 0, got {v}")
        return v

    @model_validator(mode="after")
    def _layout_options(self) -> "ExtractSection":
        if self.save_dtype == "fp8" and self.layout not in ("shards", "speculators"):
            hint = (" (SpecForge reads the model dtype; `compress = true` gzips its files instead)"
                    if self.layout == "specforge" else " (its loader reads the model dtype)")
            raise ValueError(f'save_dtype = "fp8" is for layout "shards" or "speculators", not "{self.layout}"{hint}')
        if (self.compress or "compression_level" in self.model_fields_set) and self.layout != "specforge":
            raise ValueError(f'compress / compression_level are for layout "specforge" (gzip .ckpt.gz), not "{self.layout}"')
        if self.draft_vocab_size is not None and self.layout != "specforge":
            raise ValueError(f'draft_vocab_size sizes the vocabulary mapping of layout "specforge", not "{self.layout}"')
        return self
