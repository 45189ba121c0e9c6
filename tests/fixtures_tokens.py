"""Real tokenizers for the token tests, built offline (nothing is downloaded).

- :func:`kimi_dir`: a Kimi-layout tiktoken directory from a real production vocabulary shipped by
  ``mistral-common`` (``data/tekken_240911.json``: base64 token bytes + rank; the first 130,072 ranks,
  Tekken's own inner vocabulary). ``tiktoken.model`` (``base64 rank`` per line), Kimi's split regex
  (the loader's default), the special tokens at ``n_base + Kimi's offsets`` (so ``<|im_end|>`` is
  130,074 here, not Kimi's 163,586: a hard-coded Kimi id fails), ``tokenizer_config.json`` with
  ``added_tokens_decoder`` and a chat template following the Kimi-K2.5 layout, including its quirk
  of blanking the reasoning of the last assistant turn without tool calls.
- :func:`hf_dir`: another family through transformers' own loading path: a byte-level BPE trained
  with ``tokenizers``, saved with ``PreTrainedTokenizerFast``, markers ``<|assistant|>``, ``<|end|>``,
  ``<reasoning>``/``</reasoning>``, ``<tool_calls>``/``<call>``/``<args>``/``</call>``/``</tool_calls>``.

Both are built once per process into a temporary directory (removed at exit).
"""

from __future__ import annotations

import atexit
import base64
import functools
import json
import shutil
import tempfile
from pathlib import Path

#: Kimi-K2.5's special tokens as offsets from the base vocabulary size (eagle3-data.md).
KIMI_OFFSETS = {
    "[BOS]": 0, "[EOS]": 1, "<|im_end|>": 2, "<|im_user|>": 3, "<|im_assistant|>": 4, "<|start_header_id|>": 6,
    "<|end_header_id|>": 7, "[EOT]": 9, "<|im_system|>": 10, "<|tool_calls_section_begin|>": 11,
    "<|tool_calls_section_end|>": 12, "<|tool_call_begin|>": 13, "<|tool_call_argument_begin|>": 14,
    "<|tool_call_end|>": 15, "<|im_middle|>": 17, "<think>": 22, "</think>": 23, "[UNK]": 254, "[PAD]": 255,
}
#: Kimi-K2.5's real ids (163,584 + offset): the fixture must NOT use them.
KIMI_REAL_BASE = 163_584
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
{%- if tools -%}<|im_system|>tool_declare<|im_middle|>{{ tools | tojson(separators=(',', ':')) }}<|im_end|>{%- endif -%}
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

HF_SPECIALS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>", "<reasoning>", "</reasoning>",
               "<tool_calls>", "</tool_calls>", "<call>", "<args>", "</call>"]
HF_TEMPLATE = r"""
{%- if tools -%}<|system|>Tools: {{ tools | tojson }}<|end|>{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' -%}<|assistant|>
{%- if loop.last and not add_generation_prompt -%}<reasoning>{{ m.reasoning_content or '' }}</reasoning>{%- else -%}<reasoning></reasoning>{%- endif -%}
{{ m.content or '' }}
{%- if m.tool_calls -%}<tool_calls>{%- for tc in m.tool_calls -%}<call>{{ tc.id }}<args>{{ tc.function.arguments }}</call>{%- endfor -%}</tool_calls>{%- endif -%}
<|end|>
{%- elif m.role == 'tool' -%}<|tool|>{{ m.tool_call_id }}: {{ m.content }}<|end|>
{%- else -%}<|{{ m.role }}|>{{ m.content }}<|end|>
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}<|assistant|>
{%- if enable_thinking is defined and not enable_thinking -%}<reasoning></reasoning>{%- else -%}<reasoning>{%- endif -%}
{%- endif -%}
"""

#: ``[tokenizer]`` marker settings of the HF family.
HF_MARKERS = {
    "think_start": "<reasoning>", "think_end": "</reasoning>", "end_of_turn": "<|end|>",
    "tool_calls_begin": "<tool_calls>", "tool_calls_end": "</tool_calls>", "tool_call_begin": "<call>",
    "tool_call_argument_begin": "<args>", "tool_call_end": "</call>",
}


@functools.cache
def _root() -> Path:
    d = Path(tempfile.mkdtemp(prefix="datagen-tokfix-"))
    atexit.register(shutil.rmtree, d, True)
    return d


def tekken_path() -> Path:
    import mistral_common

    return Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"


def write_kimi_dir(d: Path, template: str = KIMI_TEMPLATE) -> Path:
    """Write the Kimi-layout tiktoken directory into ``d`` (see the module docstring)."""
    d.mkdir(parents=True, exist_ok=True)
    vocab = json.loads(tekken_path().read_text())["vocab"][:TEKKEN_BASE]
    with open(d / "tiktoken.model", "w") as f:
        for v in vocab:
            f.write(f"{v['token_bytes']} {v['rank']}\n")
    assert base64.b64decode(vocab[-1]["token_bytes"]) and len(vocab) == TEKKEN_BASE
    added = {str(TEKKEN_BASE + off): {"content": text, "lstrip": False, "normalized": False, "rstrip": False,
                                      "single_word": False, "special": True} for text, off in KIMI_OFFSETS.items()}
    cfg = {"tokenizer_class": "TikTokenTokenizer", "auto_map": {"AutoTokenizer": ["tokenization_kimi.TikTokenTokenizer", None]},
           "bos_token": "[BOS]", "eos_token": "[EOS]", "pad_token": "[PAD]", "unk_token": "[UNK]",
           "added_tokens_decoder": added, "chat_template": template}
    (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    return d


@functools.cache
def kimi_dir() -> Path:
    """The Kimi-layout fixture directory (built once per process)."""
    return write_kimi_dir(_root() / "kimi")


def write_hf_dir(d: Path, template: str = HF_TEMPLATE) -> Path:
    """Train a small byte-level BPE and save it as a transformers fast tokenizer into ``d``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from engine.sim.generator import VOCAB

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=4000, special_tokens=HF_SPECIALS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    words = sorted({x for w in VOCAB for x in (w, w.capitalize())})
    corpus = [" ".join(words), ", ".join(words) + ".", '{"city": "Rome", "n": 12}', "functions.get_weather:0"] * 3
    tok.train_from_iterator(corpus, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|end|>", additional_special_tokens=HF_SPECIALS)
    fast.chat_template = template
    fast.save_pretrained(str(d))
    return d


@functools.cache
def hf_dir() -> Path:
    """The HF-family fixture directory (built once per process)."""
    return write_hf_dir(_root() / "hf")
