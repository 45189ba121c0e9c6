"""The target's final RMSNorm, read from its checkpoint, for the normed ``last_hidden_state``.

vLLM's ``extract_hidden_states`` captures residual-stream states (vLLM layer id ``i`` = the input of
decoder layer ``i`` = Hugging Face ``hidden_states[i]``; id ``L`` = the last layer's output, BEFORE
the final norm: vllm/model_executor/models/llama.py, deepseek_v2.py ``aux_hidden_state_layers``).
The drafter's loss needs the state after the final norm (docs/eagle3-data.md section 1), so the
worker applies the norm itself, computed as transformers' ``LlamaRMSNorm`` / ``DeepseekV3RMSNorm``
do: ``x / sqrt(mean(x^2) + eps)`` in float32, cast back to the input dtype, times ``w``. Families whose
final norm is not a plain weighted RMSNorm (Gemma's ``1 + w``, LayerNorm with a bias) are refused.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from engine.extract.job import ExtractError

_NORM_KEY = re.compile(r"(^|\.)model\.norm\.weight$")


def _model_file(model: str, name: str) -> Path | None:
    local = Path(model).expanduser()
    if local.is_dir():
        p = local / name
        return p if p.is_file() else None
    from huggingface_hub import hf_hub_download

    try:
        return Path(hf_hub_download(model, name))
    except Exception:  # absent file, offline cache miss
        return None


def checkpoint_key(model: str, pattern: re.Pattern[str], what: str,
                   skip: tuple[str, ...] = (".layers.", "mtp", "vision")) -> tuple[str, Path]:
    """The one tensor of ``model``'s safetensors whose key matches ``pattern`` outside the decoder layers, the
    MTP head and a vision tower (``skip``), and the file holding it (the index's, or ``model.safetensors``).

    Raises:
        ExtractError: no safetensors, or not exactly one such key (``what`` names what was expected).
    """
    index = _model_file(model, "model.safetensors.index.json")
    if index is not None:
        wmap: dict[str, str] = json.loads(index.read_text())["weight_map"]
        keys = [k for k in wmap if pattern.search(k) and not any(s in k for s in skip)]
        files = {k: _model_file(model, wmap[k]) for k in keys}
    else:
        single = _model_file(model, "model.safetensors")
        if single is None:
            raise ExtractError(f"model {model!r}: no model.safetensors(.index.json)")
        from safetensors import safe_open

        with safe_open(str(single), "pt") as f:
            keys = [k for k in f.keys() if pattern.search(k) and not any(s in k for s in skip)]
        files = {k: single for k in keys}
    if len(keys) != 1 or files[keys[0]] is None:
        raise ExtractError(f"model {model!r}: expected {what}, found {keys}")
    path = files[keys[0]]
    assert path is not None
    return keys[0], path


class FinalNorm:
    """``RMSNorm(weight, eps)`` applied to ``[..., H]`` tensors (see module doc)."""

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        self.weight = weight
        self.eps = float(eps)

    @classmethod
    def from_checkpoint(cls, model: str) -> "FinalNorm":
        """Read ``*model.norm.weight`` and ``rms_norm_eps`` (``text_config`` for multimodal models).

        Raises:
            ExtractError: no such tensor or eps, or a family with another kind of final norm.
        """
        cfg_path = _model_file(model, "config.json")
        if cfg_path is None:
            raise ExtractError(f"model {model!r}: no config.json")
        cfg = json.loads(cfg_path.read_text())
        text = cfg.get("text_config") or cfg
        kind = str(text.get("model_type", cfg.get("model_type", "")))
        if kind.startswith("gemma"):
            raise ExtractError(f"model {model!r}: {kind}'s final norm (1 + w) is not supported by engine = \"vllm\"")
        eps = text.get("rms_norm_eps")
        if not isinstance(eps, (int, float)):
            raise ExtractError(f"model {model!r}: config has no rms_norm_eps (engine = \"vllm\" needs an RMSNorm model)")
        key, path = checkpoint_key(model, _NORM_KEY, "one final norm weight (*model.norm.weight)")
        from safetensors import safe_open

        with safe_open(str(path), "pt") as f:
            if key.replace("weight", "bias") in f.keys():
                raise ExtractError(f"model {model!r}: the final norm has a bias (not an RMSNorm)")
            weight = f.get_tensor(key)
        return cls(weight, float(eps))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x [..., H]`` normed, in ``x``'s dtype and device."""
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight.to(device=x.device, dtype=x.dtype) * h.to(x.dtype)

    def to_dict(self) -> dict[str, Any]:
        return {"hidden_size": int(self.weight.shape[0]), "eps": self.eps}
