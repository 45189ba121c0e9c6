"""Real tokenizers for the token tests, built offline (nothing is downloaded).

- :func:`kimi_dir`: the Kimi-layout tiktoken directory of :mod:`engine.tokens.demo_tokenizer` (a real
  production vocabulary shipped by ``mistral-common``, Kimi-K2.5's special tokens at ``130,072 +
  Kimi's offsets`` so a hard-coded Kimi id fails, and a chat template following the Kimi-K2.5
  layout); the same one ``make demo`` builds with ``datagen make-tokenizer``.
- :func:`hf_dir`: another family through transformers' own loading path: a byte-level BPE trained
  with ``tokenizers``, saved with ``PreTrainedTokenizerFast``, markers ``<|assistant|>``, ``<|end|>``,
  ``<reasoning>``/``</reasoning>``, ``<tool_calls>``/``<call>``/``<args>``/``</call>``/``</tool_calls>``.

Both are built once per process into a temporary directory (removed at exit).
"""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from pathlib import Path

from engine.tokens.demo_tokenizer import KIMI_OFFSETS, KIMI_TEMPLATE, TEKKEN_BASE, tekken_path, write_kimi_dir  # noqa: F401

#: Kimi-K2.5's real ids (163,584 + offset): the fixture must NOT use them.
KIMI_REAL_BASE = 163_584

HF_SPECIALS = ["<|system|>", "<|user|>", "<|assistant|>", "<|tool|>", "<|end|>", "<reasoning>", "</reasoning>",
               "<tool_calls>", "</tool_calls>", "<call>", "<args>", "</call>"]
HF_TEMPLATE = r"""
{%- if tools -%}<|system|>Tools: {{ tools | tojson }}<|end|>{%- endif -%}
{%- for m in messages -%}
{%- if m.role == 'assistant' -%}<|assistant|>
{%- if loop.last and not add_generation_prompt -%}<reasoning>{{ m.reasoning_content or '' }}</reasoning>
{%- else -%}<reasoning></reasoning>{%- endif -%}
{{ m.content or '' }}
{%- if m.tool_calls -%}<tool_calls>
{%- for tc in m.tool_calls -%}<call>{{ tc.id }}<args>{{ tc.function.arguments }}</call>{%- endfor -%}</tool_calls>
{%- endif -%}
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


#: Kimi-K2.5's pre-tokenizer split regex, written out again here (not imported from the engine) so
#: the tests count tokens independently of the code under test.
KIMI_PAT = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])


@functools.cache
def kimi_encoding():
    """A tiktoken ``Encoding`` over :func:`kimi_dir` built from the files alone (independent of
    ``engine.tokens``): ``kimi_encoding().encode(text, allowed_special="all")`` counts tokens."""
    import json

    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    d = kimi_dir()
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    specials = {v["content"]: int(k) for k, v in cfg["added_tokens_decoder"].items()}
    return tiktoken.Encoding("kimi-fixture", pat_str=KIMI_PAT,
                             mergeable_ranks=load_tiktoken_bpe(str(d / "tiktoken.model")), special_tokens=specials)


def true_count(reasoning: str = "", content: str = "", calls: tuple = (), finished: bool = True) -> int:
    """Completion tokens as an honest provider bills them in Kimi-K2.5's layout (reasoning, ``</think>``,
    content, native tool-call markup, ``<|im_end|>`` when finished), counted with :func:`kimi_encoding`.
    ``calls``: ``(name, arguments)`` pairs; call ids are ``functions.NAME:INDEX``."""
    text = reasoning + "</think>" + content
    if calls:
        text += "<|tool_calls_section_begin|>"
        for i, (name, args) in enumerate(calls):
            text += (f"<|tool_call_begin|>functions.{name}:{i}<|tool_call_argument_begin|>{args}"
                     "<|tool_call_end|>")
        text += "<|tool_calls_section_end|>"
    if finished:
        text += "<|im_end|>"
    return len(kimi_encoding().encode(text, allowed_special="all"))
