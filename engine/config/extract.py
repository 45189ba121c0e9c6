"""``[extract]`` and ``[extract.vllm]``: hidden-state extraction."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator
from pydantic.json_schema import JsonDict

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


_VLLM: JsonDict = {"doc_default": "vLLM's"}


class VllmSection(_Strict):
    """``[extract.vllm]``: keyword arguments passed to ``vllm.LLM(...)`` when ``[extract] engine = "vllm"``
    (docs/extraction.md "Extraction on vLLM", docs/vllm-extraction.md). Unknown keys are errors; a key
    left out keeps vLLM's default, except those datagen fixes (prefill only, our token ids, prefix caching
    off, the ``extract_hidden_states`` method and datagen's KV connector). Each field's ``description``
    says what it does (docs/configuration.md is generated from them: ``make docs``)."""

    tensor_parallel_size: int = Field(1, ge=1, description=(
        "one replica over `tensor_parallel_size x pipeline_parallel_size` GPUs, which must equal `[extract] "
        "gpus_per_worker` on a GPU host"))
    pipeline_parallel_size: int = Field(1, ge=1, description="see `tensor_parallel_size`")
    data_parallel_size: int = Field(1, ge=1, description=(
        "vLLM's own data parallelism inside one replica's `LLM` (multi-node with `distributed_executor_backend = "
        "\"ray\"`); on one host datagen's workers are the data parallelism (one `LLM` per GPU group), so leave it "
        "at 1 there"))
    quantization: str | None = Field(None, json_schema_extra={"doc_default": "from the checkpoint"},
                                     description="vLLM's quantization method")
    max_model_len: int | None = Field(None, ge=1, json_schema_extra={
        "doc_default": "`[extract] max_seq_len` + 1, else the model's"}, description="longest sequence (tokens)")
    gpu_memory_utilization: float | None = Field(None, gt=0, le=1, json_schema_extra={
        "doc_default": "vLLM's (0.5 on vLLM's CPU backend)"}, description=(
        "fraction of GPU memory vLLM may use (on vLLM's CPU backend: of the CPU memory it may use; set "
        "`VLLM_CPU_KVCACHE_SPACE` (GiB) for the KV cache there)"))
    max_num_batched_tokens: int | None = Field(None, ge=1, json_schema_extra=_VLLM,
                                               description="the scheduler's per-step token cap")
    max_num_seqs: int | None = Field(None, ge=1, json_schema_extra=_VLLM,
                                     description="the scheduler's per-step sequence cap")
    distributed_executor_backend: Literal["mp", "ray", "uni", "external_launcher"] | None = Field(
        None, json_schema_extra=_VLLM, description="how vLLM starts its workers")
    trust_remote_code: bool | None = Field(None, json_schema_extra={"doc_default": "`[extract] trust_remote_code`"},
                                           description="models with custom code (Kimi-K2.5)")
    enforce_eager: bool | None = Field(None, json_schema_extra={"doc_default": "vLLM's (`true` on its CPU backend)"},
                                       description=(
        "no CUDA graphs / torch.compile (slower, starts faster)"))
    kv_cache_dtype: str | None = Field(None, json_schema_extra=_VLLM, description=(
        "as in vLLM's engine arguments; the capture layer accepts only `auto`/`bfloat16`/`float16` (not `fp8`)"))
    block_size: int | None = Field(None, ge=1, json_schema_extra=_VLLM, description="as in vLLM's engine arguments")
    seed: int | None = Field(None, json_schema_extra=_VLLM, description="as in vLLM's engine arguments")
    swap_space: float | None = Field(None, ge=0, json_schema_extra=_VLLM, description="as in vLLM's engine arguments")
    cpu_offload_gb: float | None = Field(None, ge=0, json_schema_extra=_VLLM,
                                         description="as in vLLM's engine arguments")
    enable_expert_parallel: bool | None = Field(None, json_schema_extra=_VLLM, description=(
        "as in vLLM's engine arguments (whole experts per GPU instead of slices of all of them)"))

    def llm_kwargs(self) -> dict[str, Any]:
        """The keys set in the config (None values left out), as ``vllm.LLM`` keyword arguments."""
        return {k: v for k, v in self.model_dump().items() if v is not None}


class ExtractSection(_Strict):
    """``[extract]``: hidden-state extraction for EAGLE-3 (``datagen extract CONFIG``). All optional. Each
    field's ``description`` says what it does (docs/configuration.md is generated from them: ``make docs``);
    ``model`` is resolved by :func:`resolve_model`, a ``shards`` output is read by ``engine.extract.loader``."""

    model: str | None = Field(None, json_schema_extra={"doc_default": "unset (required to extract)"}, description=(
        "the target model: a local directory, relative to the config file's directory (or the working directory), or "
        "a hub id `ORG/NAME`, loaded with `AutoModelForCausalLM` (or vLLM). A name is a hub id only with exactly one "
        "`/`, no leading `./`, `/` or `~`, and no directory `ORG` beside the config. Anything else that does not exist "
        "is refused at once, before any network: `no such model directory: PATH (...)`. With `HF_HUB_OFFLINE=1`, a "
        "hub id missing from the Hugging Face cache is refused at once too"))
    dtype: Literal["auto", "bfloat16", "float16", "float32"] = Field("auto", description=(
        "torch dtype of the model and of the saved hidden states: `auto` = `bfloat16` on GPU, `float32` on CPU"))
    aux_layers: list[int] | None = Field(None, min_length=1, json_schema_extra={"doc_default": "`[1, L//2-1, L-4]`"},
                                         description=(
        "0-based layer OUTPUT indices (the SpecForge / Model-Optimizer convention), each in 0..L-2, concatenated into "
        "`aux_hidden_states`; Hugging Face `hidden_states[i + 1]`, vLLM speculators' ids are these + 1; Kimi-K2.5 "
        "(L = 61): `[1, 29, 57]` ([extraction.md](extraction.md#hidden-states))"))
    gpus_per_worker: int = Field(1, ge=1, description=(
        "GPUs per model replica (> 1 spreads one replica with `accelerate`, `device_map=\"auto\"`; with vLLM: "
        "`tensor_parallel_size x pipeline_parallel_size`)"))
    workers: int | None = Field(None, ge=1, json_schema_extra={"doc_default": "GPUs // gpus_per_worker, else 1"},
                                description="worker processes (model replicas)")
    max_tokens_per_batch: int = Field(16_384, ge=1, description=(
        "padded tokens per forward (batch size x longest sample); a single longer sample forms a batch of its own"))
    max_seq_len: int | None = Field(None, ge=1, description="longest sample (tokens); longer ones follow `over_length`")
    over_length: Literal["skip", "truncate"] = Field("skip", description=(
        "`skip` (not extracted, counted as skipped) or `truncate` (the first `max_seq_len` tokens are extracted; the "
        "manifest records `truncated_from`; a sample cut inside its prompt keeps no completion token: it is skipped "
        "and counted as `no_supervised_tokens`, never extracted)"))
    out_dir: Path | None = Field(None, json_schema_extra={"doc_default": "`RUN_DIR/extract`"},
                                 description="shards, manifest, per-worker status")
    disk_margin_gb: float = Field(10.0, ge=0, description=(
        "GB (1e9 bytes) always kept free: the job refuses to start when the projected bytes do not fit above it, and "
        "workers pause while free space is under it"))
    trust_remote_code: bool = Field(False, description=(
        "passed to transformers (models with custom code, e.g. Kimi-K2.5)"))
    layout: Literal["shards", "speculators", "specforge", "modelopt"] = Field("shards", description=(
        "which trainer reads the output as written: `shards` (this project's `ExtractedDataset`), `speculators`, "
        "`specforge` or `modelopt` ([extraction.md](extraction.md#layouts-which-trainer-reads-what))"))
    save_dtype: Literal["model", "fp8"] = Field("model", description=(
        "`model` (the states in `dtype`) or `fp8` (`float8_e4m3fn` + a float32 scale per token, speculators' fp8 "
        "convention: about half the bytes of bf16; `shards` and `speculators` only)"))
    draft_vocab_size: int | None = Field(None, ge=1, json_schema_extra={"doc_default": "`min(32000, vocab)`"},
                                         description=(
        "`specforge` only: the draft vocabulary of `vocab_mapping/vocab_mapping.pt`"))
    compress: bool = Field(False, description=(
        "`specforge` only: gzip each feature file (`data_{i}.ckpt.gz`, SpecForge's `--compress`)"))
    compression_level: int = Field(6, ge=1, le=9, description="`specforge` only: the gzip level of `compress`")
    after_run: Literal["never", "run", "dataset", "follow"] = Field("never", description=(
        "chain extraction to `datagen run`: `run` (after the whole run completed, exit 0), `dataset` (each dataset "
        "as soon as it is done and validated, while generation goes on) or `follow` (newly validated records in "
        "batches of `follow_records` while their dataset is still being bought, so phase-two fidelity verdicts "
        "arrive while money is spent; [fidelity.md](fidelity.md)); needs `model` and `[tokenizer]` "
        "([extraction.md](extraction.md#chaining-extraction-after-generation-in-one-datagen-run))"))
    follow_records: int = Field(200, ge=1, description=(
        "`after_run = \"follow\"`: extract once this many newly validated records of a dataset are waiting (the "
        "rest when the dataset ends)"))
    fidelity: bool = Field(True, description=(
        "score every record's completion under the target from the extraction forward's final hidden state (no "
        "second forward): phase-two provider fidelity ([fidelity.md](fidelity.md))"))
    unscored_token_ids: list[int] = Field(default_factory=list, description=(
        "token ids fidelity scoring leaves out besides the tokenizer's special tokens, as the special tokens are: "
        "not scored, and the distribution of the scored tokens is the target's given that the token is none of "
        "them (the rehearsal kit's byte tokens, which its simulator never writes: `kit.json` lists them)"))
    engine: Literal["transformers", "vllm"] = Field("transformers", description=(
        "what runs the target model: `transformers` (`AutoModelForCausalLM`, right for small targets and for proving "
        "correctness) or `vllm` (vLLM's `extract_hidden_states` method and datagen's KV connector: its kernels and "
        "tensor/pipeline parallelism, for targets like Kimi-K2.5; needs the `vllm` extra; "
        "[extraction.md](extraction.md#extraction-on-vllm-engine--vllm))"))
    vllm: VllmSection = Field(default_factory=VllmSection, description="`vllm.LLM` arguments for `engine = \"vllm\"`.")

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
