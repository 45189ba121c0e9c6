"""``[tokenizer]``: the target's tokenizer, for exact token ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from engine.config.base import _Strict


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
