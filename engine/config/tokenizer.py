"""``[tokenizer]``: the target's tokenizer, for exact token ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator

from engine.config.base import _Strict

_SPECIAL = ("special token by TEXT (`\"\"` = the family has none), resolved at start-up to exactly one id")
_MARKER = "tool-call marker by text (Kimi-K2.5's by default), resolved at start-up to exactly one id"


class TokenizerSection(_Strict):
    """``[tokenizer]``: the target's tokenizer, for exact token ids (``engine.tokens``). All optional
    but ``path``; when the section is absent, reconstruction and validation are off. Each field's
    ``description`` says what it does (docs/configuration.md is generated from them: ``make docs``);
    ``prompt_special_text`` is applied by :mod:`engine.tokens.promptcheck`."""

    path: str = Field(description=(
        "local directory or hub id (a hub id for `kind = \"hf\"` only); relative: to the config file when it exists "
        "there, always for `kind = \"tiktoken\"`. The demo's is built by `datagen make-tokenizer`"))
    kind: Literal["auto", "hf", "tiktoken"] = Field("auto", description=(
        "`hf` (transformers `AutoTokenizer`), `tiktoken` (a `tiktoken.model` + `tokenizer_config.json` directory "
        "loaded natively, no remote code) or `auto` (`tiktoken` when the directory holds `tiktoken.model` and no "
        "`tokenizer.json`, else `hf`)"))
    trust_remote_code: bool = Field(False, description="allow the tokenizer's remote code (`hf` kind only)")
    split_regex: str | None = Field(None, json_schema_extra={"doc_default": "Kimi-K2.5's"},
                                    description="pre-tokenizer regex of a tiktoken directory")
    thinking: bool = Field(True, description=(
        "thinking mode: the generation prompt ends with `think_start` and the completion has exactly one "
        "`think_end` (false: neither; the request must then carry the server's switch: OpenRouter's is sent for kinds "
        "`openrouter`/`simulated`, kind `openai` without one is refused at start, see "
        "[the switch each server reads](eagle3-data.md#thinking-and-instant-mode-the-switch-each-server-reads))"))
    think_start: str = Field("<think>", description=_SPECIAL)
    think_end: str = Field("</think>", description=_SPECIAL)
    end_of_turn: str = Field("<|im_end|>", description=_SPECIAL)
    tool_calls_begin: str = Field("<|tool_calls_section_begin|>", description=_MARKER)
    tool_calls_end: str = Field("<|tool_calls_section_end|>", description=_MARKER)
    tool_call_begin: str = Field("<|tool_call_begin|>", description=_MARKER)
    tool_call_argument_begin: str = Field("<|tool_call_argument_begin|>", description=_MARKER)
    tool_call_end: str = Field("<|tool_call_end|>", description=_MARKER)
    tool_id_format: str = Field("functions.{name}:{index}", description=(
        "the model's native tool-call id, `{name}` and `{index}` (calls before it in the conversation) filled in; "
        "provider ids are rebuilt to it; `\"\"` keeps the provider's ids"))
    chat_template: Path | None = Field(None, json_schema_extra={"doc_default": "the tokenizer's"},
                                       description="a Jinja template file overriding the tokenizer's own")
    chat_preprocess: Literal["auto", "kimi", "none"] = Field("auto", description=(
        "the steps the tokenizer's own code applies around its template: `kimi` = Kimi-K2.5's (`tools` deep-sorted, "
        "then declared in its TypeScript form `tools_ts_str`, JSON when its encoder rejects a schema), `none`; "
        "`auto` = `kimi` for `kind = \"tiktoken\"` and for an `hf` directory with Kimi's tokenizer code. The request "
        "sent keeps the dataset's key order. See [kimi-tokenizer.md](kimi-tokenizer.md)"))
    template_vars: dict[str, Any] = Field(default_factory=dict, description=(
        "extra template variables (`thinking`/`enable_thinking` are set from `thinking` unless given here)"))
    billing_tolerance_tokens: int = Field(2, ge=0, description=(
        "a record fails `billing_diff` when |rebuilt completion length - `usage.completion_tokens`| exceeds the "
        "larger of this (tokens) and `billing_tolerance_pct`"))
    billing_tolerance_pct: float = Field(0.5, ge=0, description="the same in percent of the rebuilt length")
    max_failure_rate: float = Field(0.2, ge=0, lt=1, description=(
        "a dataset whose share of invalid records among its last `failure_window` validated records passes this is "
        "paused by the anomaly guard (0 disables; records cut at `max_tokens`, `truncated`, do not count: they are "
        "the config's choice and finish last); also the share past which a chained extraction leaves the "
        "dataset out"))
    failure_window: int = Field(200, ge=10, description="validated records `max_failure_rate` is measured over")
    workers: int = Field(1, ge=1, le=64, description="reconstruction pool size (off the event loop)")
    executor: Literal["process", "thread"] = Field("process", description=(
        "reconstruction pool kind: `process` (worker processes ignore terminal signals, the run decides; a dead "
        "pool is replaced; a result whose reconstruction cannot run stays stored and `datagen validate` or an "
        "export rebuilds it) or `thread`"))
    prompt_special_text: Literal["keep", "reject"] = Field("keep", description=(
        "special-token text typed in a prompt message: `keep` (sent as is, becomes that special id, prompt flagged "
        "`special_text_in_prompt`) or `reject` (rejected at ingest, the reason names the token and the message)"))

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
