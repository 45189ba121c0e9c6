"""The target model and one forward pass that returns EAGLE-3's hidden states.

Convention (tested against hooks on the decoder layers in ``tests/engine/extract/test_extract.py``): with
``output_hidden_states`` transformers returns L + 1 states; ``hidden_states[0]`` is the embedding
output, ``hidden_states[i + 1]`` the output of decoder layer ``i`` and, for the DeepSeek-V3 family
in transformers 5.x (``capture_outputs(tie_last_hidden_states=True)``), ``hidden_states[L]`` is
replaced by the base model's ``last_hidden_state``: the final layer's output AFTER the final norm,
exactly what the LM head reads. Only the states needed are kept (``output_hidden_states`` takes a
list of indices in transformers 5.x), logits are computed for one position only
(``logits_to_keep=1``: the ``[B, T, vocab]`` logits would dwarf the hidden states) and there is no
KV cache (``use_cache=False``).
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import numpy as np
import torch

from engine.extract.job import ExtractError, ExtractJob

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _supports_index_selection() -> bool:
    try:
        from transformers.utils import output_capturing

        return hasattr(output_capturing, "selected_hidden_states")
    except ImportError:
        return False


def load_model(job: ExtractJob, gpus: tuple[int, ...] = ()) -> Any:
    """Load ``job.model`` with ``AutoModelForCausalLM`` in ``job.dtype``, in eval mode.

    Args:
        gpus: physical GPU ids of this worker; empty loads on CPU. With one GPU the model goes to
            ``cuda:<local index>``; with several, ``device_map="auto"`` spreads it over them (the
            worker's ``CUDA_VISIBLE_DEVICES`` should list exactly these).

    Raises:
        ExtractError: the model cannot be loaded.
    """
    import importlib.util

    from transformers import AutoModelForCausalLM

    kw: dict[str, Any] = {"dtype": DTYPES[job.dtype], "trust_remote_code": job.trust_remote_code}
    has_accelerate = importlib.util.find_spec("accelerate") is not None
    local = [_local_cuda_index(g) for g in gpus]
    if len(gpus) > 1:
        if not has_accelerate:
            raise ExtractError("gpus_per_worker > 1 spreads the model with device_map='auto', which needs "
                               "`accelerate` (pip install 'eagle-datagen[extract]')")
        # only this worker's GPUs (under torchrun every rank sees every GPU)
        kw["device_map"] = "auto"
        kw["max_memory"] = {i: int(torch.cuda.get_device_properties(i).total_memory * 0.92) for i in local}
    elif gpus and has_accelerate:
        kw["device_map"] = {"": local[0]}
    try:
        model = AutoModelForCausalLM.from_pretrained(job.model, **kw)
        if len(gpus) == 1 and not has_accelerate:
            # transformers' stub of PreTrainedModel.to (a decorated method) loses `self`: the device reads as it
            model = model.to(f"cuda:{local[0]}")  # type: ignore[arg-type]
    except Exception as e:  # OSError, ValueError, CUDA OOM...
        raise ExtractError(f"cannot load model {job.model!r}: {type(e).__name__}: {e}") from None
    model.eval()
    if getattr(model.config, "use_cache", None):
        model.config.use_cache = False
    return model


def _local_cuda_index(physical: int) -> int:
    import os

    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env:
        ids = [x.strip() for x in env.split(",")]
        if str(physical) in ids:
            return ids.index(str(physical))
    return physical


class HiddenStates:
    """Runs batches through a causal LM and returns ``aux_hidden_states`` and ``last_hidden_state``.

    Args:
        model: a loaded ``*ForCausalLM`` (eval mode).
        aux_layers: 0-based decoder-layer output indices (``hidden_states[i + 1]``).
        num_layers: decoder layers L.
    """

    def __init__(self, model: Any, aux_layers: tuple[int, ...] | list[int], num_layers: int) -> None:
        self.model = model
        self.aux = tuple(aux_layers)
        self.num_layers = num_layers
        self.device = model.get_input_embeddings().weight.device
        sel = sorted({i + 1 for i in self.aux} | {num_layers})
        self._select: Any = sel if _supports_index_selection() else True
        params = inspect.signature(model.forward).parameters
        self._logits_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        self.pad_id = int(getattr(model.config, "pad_token_id", None) or 0)
        #: after :meth:`forward`: the final state after the final norm ``[B, T, H]`` (what the LM head
        #: reads, whatever ``last`` a layout's wrapper returns) and the model's logits at the last
        #: position ``[B, V]`` (None when the model returned none): phase-two fidelity scoring reads them
        self.final: torch.Tensor | None = None
        self.logits_last: torch.Tensor | None = None

    def head(self) -> Any:
        """The LM head (``model.get_output_embeddings()``: ``[n, H]`` -> ``[n, V]`` logits), or None."""
        get = getattr(self.model, "get_output_embeddings", None)
        return get() if callable(get) else None

    def collate(self, samples: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Right-pad token arrays into ``input_ids [B, Tmax]`` (int64) and ``attention_mask``
        ``[B, Tmax]`` (1 = real token; None when no sample is padded). Raises ValueError on an
        empty batch (a worker never sends one)."""
        if not samples:
            raise ValueError("empty batch")
        tmax = max(len(s) for s in samples)
        ids = np.full((len(samples), tmax), self.pad_id, dtype=np.int64)
        padded = False
        for b, s in enumerate(samples):
            ids[b, :len(s)] = s
            padded |= len(s) < tmax
        mask = None
        if padded:
            m = np.zeros((len(samples), tmax), dtype=np.int64)
            for b, s in enumerate(samples):
                m[b, :len(s)] = 1
            mask = torch.from_numpy(m)
        return torch.from_numpy(ids), mask

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """One forward pass.

        Args:
            input_ids: ``[B, T]`` int64; attention_mask: ``[B, T]`` (1 = real) or None.

        Returns:
            ``(aux [B, T, len(aux) * H], last [B, T, H])`` on the model's device, model dtype;
            padded positions hold garbage: slice each sample's first ``T_b`` rows.
        """
        ids = input_ids.to(self.device, non_blocking=True)
        am = attention_mask.to(self.device, non_blocking=True) if attention_mask is not None else None
        out = self.model(input_ids=ids, attention_mask=am, use_cache=False, output_hidden_states=self._select,
                         return_dict=True, **self._logits_kw)
        hs = out.hidden_states
        if hs is None or len(hs) != self.num_layers + 1:
            raise ExtractError(f"model returned {0 if hs is None else len(hs)} hidden states, expected "
                               f"{self.num_layers + 1} (embeddings + one per layer)")
        last = hs[self.num_layers]
        aux = torch.cat([hs[i + 1].to(last.device) for i in self.aux], dim=-1)  # layers may sit on other GPUs
        logits = getattr(out, "logits", None)
        self.final, self.logits_last = last, (logits[:, -1] if logits is not None and logits.dim() == 3 else None)
        return aux, last
