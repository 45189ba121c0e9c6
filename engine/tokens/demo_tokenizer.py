"""A small Kimi-layout tokenizer built offline: the demo's ``[tokenizer]`` and the tests' fixture.

:func:`write_kimi_dir` writes a tiktoken directory (the way Kimi-K2.5 ships) from a real production
vocabulary that ``mistral-common`` ships inside its wheel (``data/tekken_240911.json``: base64 token
bytes + rank; the first 130,072 ranks, Tekken's own inner vocabulary), so nothing is downloaded:

- ``tiktoken.model``: ``base64 rank`` per line (Kimi's split regex is the loader's default);
- ``tokenizer_config.json``: Kimi-K2.5's special tokens at ``130,072 + Kimi's offsets`` in
  ``added_tokens_decoder`` (so ``<|im_end|>`` is 130,074 here, not Kimi's 163,586: code that
  hard-codes a Kimi id fails), and a chat template following the Kimi-K2.5 layout, including its
  quirk of blanking the reasoning of the last assistant turn without tool calls and its
  ``tool_declare`` turn: ``tools_ts_str`` (the TypeScript declaration Kimi's tokenizer computes,
  docs/kimi-tokenizer.md) when set, else the tools as compact JSON.

It has Kimi-K2.5's layout, NOT its vocabulary: token ids of real Kimi completions rebuilt with it are
wrong (every record fails ``billing_diff``). Use it with the simulator counting usage with the same
tokenizer (``[provider.sim] tokenizer``); for real completions point ``[tokenizer] path`` at
Kimi-K2.5's own tokenizer directory. ``datagen make-tokenizer DIR`` builds it (``make demo`` does).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import tempfile
from pathlib import Path

from engine.errors import DatagenError

#: Kimi-K2.5's special tokens as offsets from the base vocabulary size (docs/eagle3-data.md).
KIMI_OFFSETS = {
    "[BOS]": 0, "[EOS]": 1, "<|im_end|>": 2, "<|im_user|>": 3, "<|im_assistant|>": 4, "<|start_header_id|>": 6,
    "<|end_header_id|>": 7, "[EOT]": 9, "<|im_system|>": 10, "<|tool_calls_section_begin|>": 11,
    "<|tool_calls_section_end|>": 12, "<|tool_call_begin|>": 13, "<|tool_call_argument_begin|>": 14,
    "<|tool_call_end|>": 15, "<|im_middle|>": 17, "<think>": 22, "</think>": 23, "[UNK]": 254, "[PAD]": 255,
}
#: Base vocabulary size: Tekken's inner vocabulary (token ids 0..130,071).
TEKKEN_BASE = 130_072

KIMI_TEMPLATE = r"""
{%- macro text(m) -%}
{%- if m.content is string -%}{{ m.content }}
{%- elif m.content -%}{%- for part in m.content -%}{%- if part.type == 'text' -%}{{ part.text }}{%- endif -%}{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- macro open(m) -%}
{%- set name = m.name or m.role -%}
{%- if m.role == 'user' -%}<|im_user|>{{ name }}<|im_middle|>
{%- elif m.role == 'assistant' -%}<|im_assistant|>{{ name }}<|im_middle|>
{%- else -%}<|im_system|>{{ name }}<|im_middle|>
{%- endif -%}
{%- endmacro -%}
{%- macro calls(m) -%}
<|tool_calls_section_begin|>
{%- for tc in m.tool_calls -%}
<|tool_call_begin|>{{ tc.id }}<|tool_call_argument_begin|>{% if tc.function.arguments is string %}{{ tc.function.arguments }}{% else %}{{ tc.function.arguments | tojson }}{% endif %}<|tool_call_end|>
{%- endfor -%}
<|tool_calls_section_end|>
{%- endmacro -%}
{%- set ns = namespace(last_plain=-1) -%}
{%- for i in range(messages | length - 1, -1, -1) -%}
{%- if ns.last_plain == -1 and messages[i].role == 'assistant' and not messages[i].tool_calls -%}{%- set ns.last_plain = i -%}{%- endif -%}
{%- endfor -%}
{%- if tools -%}<|im_system|>tool_declare<|im_middle|>
{%- if tools_ts_str -%}{{ tools_ts_str }}{%- else -%}{{ tools | tojson(separators=(',', ':')) }}{%- endif -%}
<|im_end|>{%- endif -%}
{%- if not messages or messages[0].role != 'system' -%}<|im_system|>system<|im_middle|>You are Kimi, an AI assistant created by Moonshot AI.<|im_end|>{%- endif -%}
{%- for m in messages -%}
{{ open(m) }}
{%- if m.role == 'assistant' -%}
{%- if loop.index0 <= ns.last_plain -%}<think></think>{%- else -%}<think>{{ m.reasoning_content or '' }}</think>{%- endif -%}
{{ text(m) }}
{%- if m.tool_calls -%}{{ calls(m) }}{%- endif -%}
{%- elif m.role == 'tool' -%}## Return of {{ m.tool_call_id }}
{{ text(m) }}
{%- else -%}{{ text(m) }}
{%- endif -%}
<|im_end|>
{%- endfor -%}
{%- if add_generation_prompt -%}<|im_assistant|>assistant<|im_middle|>
{%- if thinking is defined and thinking is false -%}<think></think>{%- else -%}<think>{%- endif -%}
{%- endif -%}
"""


class DemoTokenizerError(DatagenError):
    """The demo tokenizer cannot be built (``mistral-common`` or its vocabulary file missing, or the
    target directory is not writable)."""


def tekken_path() -> Path:
    """The Tekken vocabulary file shipped in the installed ``mistral-common`` wheel.

    Raises:
        DemoTokenizerError: ``mistral-common`` is not installed or no longer ships the file.
    """
    try:
        import mistral_common
    except ImportError:
        raise DemoTokenizerError("the package mistral-common is not installed (pip install mistral-common)") from None
    p = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"
    if not p.is_file():
        raise DemoTokenizerError(f"{p}: not found in the installed mistral-common {getattr(mistral_common, '__version__', '?')}")
    return p


def write_kimi_dir(d: Path, template: str = KIMI_TEMPLATE) -> Path:
    """Write the Kimi-layout tiktoken directory into ``d`` (created; existing files overwritten).

    Args:
        d: the directory (``tiktoken.model`` ~2.3 MB and ``tokenizer_config.json``).
        template: the chat template stored in ``tokenizer_config.json``.

    Returns:
        ``d``.

    Raises:
        DemoTokenizerError: see :func:`tekken_path`.
    """
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    vocab = json.loads(tekken_path().read_text())["vocab"][:TEKKEN_BASE]
    if len(vocab) != TEKKEN_BASE or not base64.b64decode(vocab[-1]["token_bytes"]):
        raise DemoTokenizerError(f"{tekken_path()}: expected at least {TEKKEN_BASE} tokens, got {len(vocab)}")
    with open(d / "tiktoken.model", "w") as f:
        for v in vocab:
            f.write(f"{v['token_bytes']} {v['rank']}\n")
    added = {str(TEKKEN_BASE + off): {"content": text, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": True} for text, off in KIMI_OFFSETS.items()}
    cfg = {"tokenizer_class": "TikTokenTokenizer", "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
           "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
           "added_tokens_decoder": added, "chat_template": template}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    return d


def build_demo_tokenizer(d: Path, *, force: bool = False) -> bool:
    """Build the demo tokenizer into ``d`` atomically (a sibling temporary directory renamed to ``d``).

    Args:
        d: target directory; must not exist (or be empty) unless ``force``.
        force: replace an existing directory.

    Returns:
        True when built, False when ``d`` already holds a complete tokenizer and not ``force``.

    Raises:
        DemoTokenizerError: ``d`` exists with other content, or the vocabulary is missing, or an
            OS error (the message names the path).
    """
    d = Path(d)
    if d.exists() and not force:
        if (d / "tiktoken.model").is_file() and (d / "tokenizer_config.json").is_file():
            return False
        if not d.is_dir() or any(d.iterdir()):
            raise DemoTokenizerError(f"{d}: exists and is not a tokenizer directory built by make-tokenizer "
                                     f"(remove it or pass --force)")
    try:
        d.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{d.name}.", dir=d.parent))
        try:
            write_kimi_dir(tmp)
            os.chmod(tmp, 0o755)
            if d.exists():
                shutil.rmtree(d)
            os.replace(tmp, d)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    except OSError as e:
        raise DemoTokenizerError(f"{d}: cannot write the tokenizer: {e.strerror or e}") from None
    return True
