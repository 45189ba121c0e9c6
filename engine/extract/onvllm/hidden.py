"""The vLLM engine's forward pass: the worker's ``HiddenStates`` interface on ``vllm.LLM``.

:class:`VllmHiddenStates` has the ``collate``/``forward`` of :class:`engine.extract.model.HiddenStates`,
so the worker loop (batching, control, slicing, the writer with its atomic commits, disk guard and
status) is the same for both engines. ``forward`` submits the batch as prefill-only requests
(``max_tokens = 1``, our token ids, no tokenizer, prefix caching off), each tagged with a key; datagen's
KV connector (:mod:`engine.extract.onvllm.connector`) sends every finished request's capture back
over a local socket; the captures are checked against the ids sent and stacked into the padded
``(aux, last)`` tensors the worker slices.

Layer ids (docs/vllm-extraction.md): ``[extract] aux_layers`` are 0-based decoder-layer OUTPUTS
(``hidden_states[i + 1]``), so vLLM's ids are ``i + 1``; id ``L`` (the last layer's output before the
final norm) is captured too, and :class:`engine.extract.onvllm.norm.FinalNorm` gives the normed
``last_hidden_state`` (the speculators layout keeps the pre-norm state).
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.extract.job import ExtractError, ExtractJob
from engine.extract.onvllm.channel import CaptureServer
from engine.extract.onvllm.version import check_vllm_version

log = logging.getLogger(__name__)

#: what datagen sets on ``vllm.LLM`` itself; ``[extract.vllm]`` cannot override these
FIXED_KEYS = ("model", "skip_tokenizer_init", "enable_prefix_caching", "speculative_config", "kv_transfer_config",
              "dtype")
#: vLLM custom ops datagen turns off on vLLM's CPU backend (``compilation_config.custom_ops``), so that their
#: PyTorch-native forward runs instead. ``rotary_embedding``: ``RotaryEmbedding.forward_cpu`` calls the CPU
#: kernel ``torch.ops._C.rotary_embedding`` (csrc/cpu/pos_encoding.cpp), which assumes rows of
#: ``[tokens, heads * head_size]`` (``num_heads = size(-1) / head_size``, token stride ``stride(-2)``); vLLM's MLA
#: layer (``MultiHeadLatentAttentionWrapper.forward``, vllm/model_executor/layers/mla.py) hands it the 3-D views
#: ``q[..., nope:]`` ``[T, heads, rope]`` and ``k_pe`` ``[T, 1, rope]``, so on DeepSeek-V2/V3-family models with
#: plain rope the query heads get other tokens' positions and ``k_pe`` is rotated at the wrong addresses
#: (layer 0 off by ~3e-3, the final state by 0.28 on the tiny MLA model; docs/vllm-extraction.md section 6).
#: Off on CPU only: the CUDA kernel (csrc/pos_encoding_kernels.cu) reads the token stride at the positions' dim and
#: the head stride at -2; bench/mla_check_gpu.py checks that on a GPU.
CPU_CUSTOM_OPS = ("-rotary_embedding",)
#: vLLM's CPU attention backend for MLA models in any dtype but bfloat16. On an x86 CPU with AMX tiles vLLM 0.32.0
#: picks ``AMX_MLA`` for every MLA model (``CpuPlatform.get_attn_backend_cls``, vllm/platforms/cpu.py), whose
#: ``supported_dtypes`` is ``[bfloat16]`` only: in float32 its weight packing (``convert_weight_packed``,
#: csrc/cpu/sgl-kernels/gemm.cpp) fails at start with "expect weight to be bfloat16, float16, int8, fp8_e4m3 or
#: uint8". ``CPU_MLA``, the reference MLA backend, takes any dtype. The choice depends on the host's CPU: the same
#: test passed on a CI machine without AMX and failed on one with it.
CPU_MLA_BACKEND = "CPU_MLA"
#: seconds without a new capture before a batch is declared lost
CAPTURE_TIMEOUT_S = 120.0


def vllm_layer_ids(aux_layers: tuple[int, ...] | list[int], num_layers: int) -> list[int]:
    """vLLM's capture ids for ``aux_layers`` (0-based layer outputs) plus the final state: ``[i + 1 ...] + [L]``."""
    return [i + 1 for i in aux_layers] + [num_layers]


def uses_mla(model: str) -> bool:
    """Whether the model at local directory ``model`` uses multi-head latent attention (its ``config.json``, or
    its ``text_config``, sets ``kv_lora_rank``: DeepSeek-V2/V3, Kimi-K2). False for a hub id or an unreadable
    config (vLLM then chooses its backend itself)."""
    try:
        cfg = json.loads((Path(model) / "config.json").read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(cfg, dict):
        return False
    text = cfg.get("text_config")
    return bool(cfg.get("kv_lora_rank") or (isinstance(text, dict) and text.get("kv_lora_rank")))


def llm_kwargs(job: ExtractJob, socket_path: str) -> dict[str, Any]:
    """The ``vllm.LLM`` keyword arguments for ``job`` (``[extract.vllm]`` plus the fixed ones).

    Raises:
        ExtractError: ``[extract.vllm]`` sets a key datagen fixes.
    """
    user = dict(job.vllm)
    clash = [k for k in FIXED_KEYS if k in user]
    if clash:
        raise ExtractError(f"[extract.vllm] {clash}: set by datagen (prefill of our token ids with its connector)")
    kw: dict[str, Any] = {
        "model": job.model, "dtype": job.dtype, "skip_tokenizer_init": True, "enable_prefix_caching": False,
        "trust_remote_code": job.trust_remote_code,
        "speculative_config": {
            "method": "extract_hidden_states", "num_speculative_tokens": 1,
            "draft_model_config": {"hf_config": {
                "eagle_aux_hidden_state_layer_ids": vllm_layer_ids(job.aux_layers, job.num_layers)}}},
        "kv_transfer_config": {
            "kv_connector": "DatagenHiddenStatesConnector",
            "kv_connector_module_path": "engine.extract.onvllm.connector",
            "kv_role": "kv_producer",
            "kv_connector_extra_config": {"datagen_socket": socket_path}},
    }
    if job.max_seq_len is not None:
        kw["max_model_len"] = job.max_seq_len + 1  # + the one generated token
    if job.device == "cpu":
        kw["gpu_memory_utilization"] = 0.5  # on vLLM's CPU backend: of the CPU memory
        kw["enforce_eager"] = True
        kw["compilation_config"] = {"custom_ops": list(CPU_CUSTOM_OPS)}
        if job.dtype != "bfloat16" and uses_mla(job.model):
            kw["attention_config"] = {"backend": CPU_MLA_BACKEND}
    kw.update(user)
    return kw


class VllmHiddenStates:
    """Runs batches through ``vllm.LLM`` and returns ``(aux, last)`` like ``HiddenStates.forward``.

    Args:
        job: the extraction job (``engine = "vllm"``); gpus: this worker's physical GPU ids (its
            ``CUDA_VISIBLE_DEVICES`` is set to them before vLLM starts), empty on CPU.
        prenorm_last: return the final state before the final norm (the speculators layout).
        llm: an already built ``vllm.LLM`` (tests); default: built from ``job``.

    Raises:
        ExtractError: vLLM is not installed, or cannot start.
    """

    def __init__(self, job: ExtractJob, gpus: tuple[int, ...] = (), *, prenorm_last: bool = False,
                 llm: Any = None) -> None:
        self.job = job
        self.n_aux = len(job.aux_layers)
        self.device = torch.device("cpu")  # the captures arrive in host memory
        self.server = CaptureServer()
        self.prenorm_last = prenorm_last
        self._seq = 0
        #: after :meth:`forward`, when fidelity scoring is on (:meth:`fidelity_scoring`): the final state
        #: after the final norm ``[B, Tmax, H]`` and vLLM's greedy token at each sample's last position
        self.final: torch.Tensor | None = None
        self.greedy: list[int] | None = None
        self._score_norm: Any = None
        self._keep_final = False
        try:
            if gpus:
                os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in gpus)
            if llm is None:
                per = job.vllm.get("tensor_parallel_size", 1) * job.vllm.get("pipeline_parallel_size", 1)
                if per == 1:  # one process: vLLM's engine lives in this worker and obeys its signals
                    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
                if job.device == "cpu":
                    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
                # vLLM logs, at WARNING, tracebacks about the tokenizer datagen deliberately does not load
                os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
                try:
                    import vllm
                    from vllm import LLM
                except ImportError as e:
                    raise ExtractError(f'[extract] engine = "vllm" needs vLLM: pip install -e ".[vllm]" ({e})') from None
                check_vllm_version(str(getattr(vllm, "__version__", "unknown")))  # before any model loads
                try:
                    llm = LLM(**llm_kwargs(job, self.server.path))
                except ExtractError:
                    raise
                except Exception as e:  # vLLM raises many kinds at start-up
                    raise ExtractError(f"vLLM could not start {job.model!r}: {type(e).__name__}: {e}") from None
            self.llm = llm
            self.norm = None
            if not prenorm_last:
                from engine.extract.onvllm.norm import FinalNorm

                self.norm = FinalNorm.from_checkpoint(job.model)
        except BaseException:
            self.server.close()
            raise
        from vllm import SamplingParams

        self._params = SamplingParams

    def collate(self, samples: list[np.ndarray]) -> tuple[list[np.ndarray], None]:
        """The samples as they are (vLLM batches by itself); ValueError on an empty batch."""
        if not samples:
            raise ValueError("empty batch")
        return samples, None

    def _inproc(self) -> bool:
        core = getattr(self.llm.llm_engine, "engine_core", None)
        return type(core).__name__ == "InprocClient"

    def forward(self, samples: list[np.ndarray], _mask: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Prefill ``samples`` (token-id arrays) and collect their captures.

        Returns:
            ``(aux [B, Tmax, n_aux * H], last [B, Tmax, H])`` on the CPU in the job's dtype; rows past
            a sample's length are zero.

        Raises:
            ExtractError: a capture did not arrive within ``CAPTURE_TIMEOUT_S`` of the last one, or
            its token ids differ from the sample's.
        """
        self._seq += 1
        keys = [f"b{self._seq}-{k}" for k in range(len(samples))]
        prompts = [{"prompt_token_ids": [int(t) for t in s]} for s in samples]
        params = [self._params(max_tokens=1, temperature=0.0, detokenize=False,
                               extra_args={"kv_transfer_params": {"datagen_key": key}}) for key in keys]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        if self._keep_final:
            self.greedy = [int(o.outputs[0].token_ids[0]) if o.outputs and o.outputs[0].token_ids else -1 for o in outs]
        inproc = self._inproc()
        last_new, have = time.monotonic(), 0
        while not self.server.has(keys):
            if inproc:  # finished requests' captures are read out on the engine's next steps
                self.llm.llm_engine.step()
            else:
                self.server.wait(keys, 0.5)
            n = sum(self.server.has([k]) for k in keys)
            if n > have:
                last_new, have = time.monotonic(), n
            elif time.monotonic() - last_new > CAPTURE_TIMEOUT_S:
                raise ExtractError(f"vLLM's KV connector sent {n}/{len(keys)} captures of a batch, then nothing "
                                   f"for {CAPTURE_TIMEOUT_S:.0f} s")
        tmax = max(len(s) for s in samples)
        h = self.job.hidden_size
        dtype = getattr(torch, self.job.dtype)
        aux = torch.zeros((len(samples), tmax, self.n_aux * h), dtype=dtype)
        last = torch.zeros((len(samples), tmax, h), dtype=dtype)
        final = last if not self._keep_final or self.norm is not None else torch.zeros_like(last)
        for b, (key, s) in enumerate(zip(keys, samples, strict=True)):
            ids, hidden = self.server.take(key)
            if len(ids) != len(s) or not np.array_equal(ids, np.asarray(s, dtype=np.int64)):
                raise ExtractError(f"vLLM's capture {key} holds {len(ids)} token ids that differ from the sample's "
                                   f"{len(s)}")
            if tuple(hidden.shape) != (len(s), self.n_aux + 1, h):
                raise ExtractError(f"vLLM's capture {key} has shape {tuple(hidden.shape)}, expected "
                                   f"{(len(s), self.n_aux + 1, h)}")
            hidden = hidden.to(dtype)
            aux[b, :len(s)] = hidden[:, :self.n_aux].reshape(len(s), self.n_aux * h)
            fin = hidden[:, self.n_aux]
            last[b, :len(s)] = fin if self.norm is None else self.norm(fin)
            if final is not last:
                final[b, :len(s)] = self._score_norm(fin)
        self.final = final if self._keep_final else None
        return aux, last

    def fidelity_scoring(self, job: ExtractJob) -> Any:
        """The batch scorer of ``[extract] fidelity`` on this engine
        (:class:`engine.extract.onvllm.scoring.VllmScoring`), or None when the checkpoint has no LM head
        or final norm to score with (logged)."""
        from engine.extract.onvllm.scoring import VllmScoring

        if self.norm is None:
            from engine.extract.onvllm.norm import FinalNorm

            try:
                self._score_norm = FinalNorm.from_checkpoint(job.model)
            except ExtractError as e:
                log.warning("fidelity: %s; scoring off", e)
                return None
        scoring = VllmScoring(job, self)
        self._keep_final = scoring.on
        return scoring if scoring.on else None

    def close(self) -> None:
        """Stop the capture socket and shut vLLM down (its engine, then its process groups), so that
        another ``LLM`` can start in this process. Idempotent."""
        self.server.close()
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        try:
            shutdown = getattr(llm.llm_engine.engine_core, "shutdown", None)
            if shutdown is not None:
                shutdown()
        except Exception as e:  # best effort at exit
            log.debug("vLLM engine shutdown: %s", e)
        del llm
        try:
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()
        except Exception as e:
            log.debug("vLLM process groups: %s", e)
        import gc

        gc.collect()
