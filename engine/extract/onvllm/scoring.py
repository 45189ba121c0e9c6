"""Phase-two fidelity scoring on the vLLM engine: the captured final state, the final norm and the LM head
read from the checkpoint.

vLLM's ``extract_hidden_states`` captures the last layer's output BEFORE the final norm (id ``L``,
:mod:`engine.extract.onvllm.hidden`); :class:`~engine.extract.onvllm.norm.FinalNorm` gives the normed
state and this module multiplies it by the LM head's weight, read from the checkpoint's safetensors
(``*lm_head.weight``, or the input embedding when ``tie_word_embeddings``), on the worker's first GPU
(163,840 x 7,168 in bfloat16 on Kimi-K2.5: 2.35 GB, beside vLLM's ``gpu_memory_utilization`` share) or
on the CPU. vLLM's ``prompt_logprobs`` would need a second pass and give no entropies; the captured
state costs no extra forward.

Check: each request of the first batch is prefilled with ``max_tokens = 1`` at temperature 0, so vLLM
returns its own argmax at the last position; the head on the captured state must agree on
:data:`AGREE_MIN` of the batch's samples (ties aside), else scoring is turned off (logged).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any, Iterable

import torch

from engine.extract.fidelity import Scorer, guarded, score_batch
from engine.extract.job import ExtractError
from engine.extract.onvllm.norm import _model_file, checkpoint_key

log = logging.getLogger(__name__)

_HEAD_KEY = re.compile(r"(^|\.)lm_head\.weight$")
_EMBED_KEY = re.compile(r"(^|\.)embed_tokens\.weight$")
#: share of a batch's samples whose greedy token (vLLM's) the head on the captured state must reproduce
AGREE_MIN = 0.9


def lm_head_weight(model: str) -> torch.Tensor:
    """The LM head's weight ``[V, H]`` from ``model``'s safetensors (the input embedding when the config
    ties them).

    Raises:
        ExtractError: no config, no such tensor (or several candidates), or no safetensors.
    """
    cfg_path = _model_file(model, "config.json")
    if cfg_path is None:
        raise ExtractError(f"model {model!r}: no config.json")
    cfg = json.loads(cfg_path.read_text())
    text = cfg.get("text_config") or cfg
    tied = bool(text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False)))
    pattern = _EMBED_KEY if tied else _HEAD_KEY
    key, path = checkpoint_key(model, pattern, f"one LM head weight ({pattern.pattern})")
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        return f.get_tensor(key)


class VllmScoring:
    """The worker's batch scorer on vLLM (same interface as
    :class:`engine.extract.fidelity.TransformersScoring`): ``on``, ``__call__(table, rows)``.

    Args:
        job: the extraction job; hs: the :class:`~engine.extract.onvllm.hidden.VllmHiddenStates` whose
            ``final`` (normed, ``[B, Tmax, H]``) and ``greedy`` (vLLM's argmax at each sample's last
            position) the last forward left.
    """

    def __init__(self, job: Any, hs: Any) -> None:
        self.job, self.hs = job, hs
        self.scorer: Scorer | None = None
        self.checked = False
        try:
            weight = lm_head_weight(job.model)
        except (ExtractError, OSError, ValueError) as e:
            log.warning("fidelity: %s; scoring off", e)
            return
        device = torch.device("cuda", 0) if job.device == "cuda" and torch.cuda.is_available() else torch.device("cpu")
        try:
            w = weight.to(device=device, dtype=getattr(torch, job.dtype))
        except torch.OutOfMemoryError:
            log.warning("fidelity: no room for the LM head (%.2f GB) on %s beside vLLM; scoring off (lower "
                        "[extract.vllm] gpu_memory_utilization to score)", weight.numel() * weight.element_size() / 1e9,
                        device)
            return
        skip = job.skip_token_ids
        if skip is None:
            from engine.extract.specials import special_token_ids

            skip = set(special_token_ids(job.model)) | set(job.unscored_token_ids)

        def head(h: torch.Tensor) -> torch.Tensor:
            return h.to(device=w.device, dtype=w.dtype) @ w.T

        self.scorer = Scorer(head, int(w.shape[0]), skip)

    @property
    def on(self) -> bool:
        """Whether the batches are scored."""
        return self.scorer is not None

    def _agree(self, rows: list[int], table: Any) -> float:
        """Share of the batch's samples whose head argmax at the last position is vLLM's greedy token."""
        assert self.scorer is not None
        final, greedy = self.hs.final, self.hs.greedy
        last = torch.stack([final[k, len(table.tokens(r)[0]) - 1] for k, r in enumerate(rows)])
        ours = self.scorer.head(last).float().argmax(-1).cpu().tolist()
        return sum(int(a == b) for a, b in zip(ours, greedy, strict=True)) / max(1, len(rows))

    def __call__(self, table: Any, rows: Iterable[int]) -> list[dict[str, Any]] | None:
        """Score the batch the last forward ran; None when scoring is off (logged once)."""
        rows = list(rows)
        if self.scorer is None or self.hs.final is None:
            return None
        with torch.inference_mode():
            if not self.checked and self.hs.greedy is not None:
                self.checked = True
                agree = self._agree(rows, table)
                if agree < AGREE_MIN:
                    log.warning("fidelity: the LM head on vLLM's captured state reproduces vLLM's own greedy token on "
                                "%.0f%% of a batch (< %.0f%%): scoring off", 100 * agree, 100 * AGREE_MIN)
                    self.scorer = None
                    return None
        scorer, final = self.scorer, self.hs.final
        return guarded(self, lambda: score_batch(scorer, final, table, rows, self.job.temperature, self.job.top_p))
