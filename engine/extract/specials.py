"""The token ids phase-two fidelity scoring leaves out: the tokenizer's special tokens.

Light (no torch): the launcher resolves them into the job (:func:`tokenizer_special_ids`, from the
run's ``[tokenizer]``: the ids :meth:`engine.tokens.tokenizer.Tokenizer.is_special` calls special); a
job without them (no ``[tokenizer]``) has its worker read the model directory's
(:func:`special_token_ids`).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def special_token_ids(model: str | Path, config: Any = None) -> set[int]:
    """Token ids the model directory marks special: ``tokenizer_config.json``'s ``added_tokens_decoder``
    entries with ``"special": true``, plus the model config's ``bos``/``eos``/``pad`` token ids
    (``config``: a transformers config, or None to read ``config.json``). Empty for a hub id or a
    directory without these files."""
    out: set[int] = set()
    d = Path(model).expanduser()
    try:
        tc = json.loads((d / "tokenizer_config.json").read_text())
        for k, v in (tc.get("added_tokens_decoder") or {}).items():
            if isinstance(v, dict) and v.get("special"):
                out.add(int(k))
    except (OSError, ValueError, AttributeError, TypeError):
        pass
    if config is None:
        try:
            raw = json.loads((d / "config.json").read_text())
            config = raw.get("text_config") or raw
        except (OSError, ValueError, AttributeError):
            config = {}
    get = config.get if isinstance(config, dict) else (lambda k: getattr(config, k, None))
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = get(key)
        for i in (v if isinstance(v, (list, tuple)) else [v]):
            if isinstance(i, int) and i >= 0:
                out.add(i)
    return out


def tokenizer_special_ids(section: Any) -> set[int] | None:
    """Special-token ids of the run's ``[tokenizer]`` (the ids :meth:`engine.tokens.tokenizer.Tokenizer.is_special`
    calls special: Kimi-K2.5's 256 reserved slots, a Hugging Face tokenizer's added tokens); None when
    the section is unset or the tokenizer cannot be loaded (logged)."""
    if section is None:
        return None
    try:
        from engine.tokens.tokenizer import load_tokenizer

        return {int(i) for i in load_tokenizer(section).backend.special_ids}
    except Exception as e:  # a tokenizer that does not load: the model directory's list is used
        log.warning("fidelity: cannot load the [tokenizer] for its special tokens (%s); the model's are used", e)
        return None
