"""The rehearsal tokenizer: whole words as single tokens, byte fallback, no merges, so sampled words round-trip exactly.

A ``tokenizers`` BPE model with no merges and ``ignore_merges`` (a pre-tokenized chunk found in the
vocabulary is one token, any other chunk is spelled in byte tokens), GPT-2's ``ByteLevel``
pre-tokenizer and decoder, saved as a transformers ``PreTrainedTokenizerFast`` directory
(``tokenizer.json``, ``tokenizer_config.json``, ``chat_template.jinja``) with the demo's Kimi-layout
chat template (:data:`engine.tokens.demo_tokenizer.KIMI_TEMPLATE`). Ids:

- ``0 .. 255``: the 256 byte tokens (:data:`BYTE_TOKENS`): any text encodes and decodes losslessly
  (the run's start-up check rebuilds sample texts with digits, punctuation and Chinese);
- :data:`WORD_BASE` ``..``: the words of :data:`WORDS`, each WITH its leading space (``" the"``);
- then Kimi-K2.5's special tokens (:data:`engine.tokens.demo_tokenizer.KIMI_OFFSETS`, offset order).

The run loads it with ``[tokenizer] path`` (kind ``hf``; its markers resolve by text: ``</think>``,
``<|im_end|>``, the tool-call markers).

Round trip: for word ids ``w``, ``text = "".join(" " + word)`` (:func:`ids_to_text`, so it starts with
a space) encodes back to exactly ``w``: the pre-tokenizer cuts it into ``" word"`` chunks, each one
vocabulary entry. A byte token sampled after a word would glue onto it and re-encode otherwise, so
the simulator never writes one: it ends the part there instead (:mod:`engine.sim.backend`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from engine.sim.generator import VOCAB
from engine.tokens.demo_tokenizer import KIMI_OFFSETS, KIMI_TEMPLATE

_EXTRA = """
user assistant system about above across act add age ago agree air allow almost alone along already always
amount animal another appear area argue arm around art ask away baby back bad bag ball bank base bear beat
beautiful bed before begin behind believe best better big bill bit black blood blue board boat body book born
both box boy break bring brother budget business buy car card care carry cause center certain chair chance
change character child choice choose church city clear cold come common company cover create cup cut dark
daughter day dead deal death decide deep degree design detail die difference dinner door down draw dream drive
drop during easy eat edge effect effort eight either else energy enough enter entire environment even evening
event ever every evidence exist expect experience explain eye face fact fail fall family far father fear feel
few fight figure fill film find fine finger finish fire firm fish five floor fly food foot force forget form
forward four free friend front full fund game garden gas general get girl give glass go goal good great green
ground group grow guess hair half hand hang happen happy hard head health hear heart heat heavy help her here
herself him himself his history hit hold home hope hospital hot hotel hour house how huge human hundred idea
image imagine impact include increase indeed instead interest issue item itself job join just keep kid kind
kitchen know land language last laugh law lay lead learn least leave leg less letter level lie life light like
likely listen little live local long look lose loss lot love machine main maintain major make man manage many
market material matter mean media meet member memory mention message middle might mind minute miss modern
moment money month morning mother mouth move movie much music must name nation nature near need network never
news night nine none nor north nothing notice now
""".split()

#: The special tokens, in Kimi's offset order (ids ``WORD_BASE + len(WORDS) + i``).
SPECIALS: tuple[str, ...] = tuple(sorted(KIMI_OFFSETS, key=lambda t: KIMI_OFFSETS[t]))
#: Vocabulary size of the rehearsal kit (bytes + words + specials).
VOCAB_SIZE = 768
#: Id of the first word (the byte tokens come first).
WORD_BASE = 256
#: The words (ids ``WORD_BASE ..``, each token's text is ``" " + word``): the simulator's own
#: :data:`engine.sim.generator.VOCAB` first, then common English words, letters only.
WORDS: tuple[str, ...] = tuple(dict.fromkeys([*VOCAB, *_EXTRA]))[: VOCAB_SIZE - WORD_BASE - len(SPECIALS)]
assert len(WORDS) == VOCAB_SIZE - WORD_BASE - len(SPECIALS), "the word list is too short for VOCAB_SIZE"
assert all(w.isalpha() and w.isascii() for w in WORDS)


def byte_tokens() -> list[str]:
    """The 256 byte tokens' vocabulary strings in byte order (GPT-2's byte-to-character map)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def ids_to_text(ids: Sequence[int]) -> str:
    """The text of word ids: ``" " + word`` each, concatenated (``[]`` -> ``""``).

    Raises:
        IndexError: an id that is not a word (a byte or special token, or out of range).
    """
    out = []
    for i in ids:
        if not 0 <= i - WORD_BASE < len(WORDS):
            raise IndexError(f"token {i} is not a word")
        out.append(" " + WORDS[i - WORD_BASE])
    return "".join(out)


def write_word_tokenizer(d: Path) -> Path:
    """Write the rehearsal tokenizer directory ``d`` (created; files overwritten); returns ``d``.

    Vocabulary: the byte tokens, :data:`WORDS` and :data:`SPECIALS`, :data:`VOCAB_SIZE` ids in all;
    ``[BOS]``/``[EOS]``/``[PAD]``/``[UNK]`` are the template's bos/eos/pad/unk texts.
    """
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

    from engine.tokens.hfimport import transformers_module

    space = byte_tokens()[ord(" ")]
    vocab = {t: i for i, t in enumerate(byte_tokens())}
    for w in WORDS:
        vocab[space + w] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], ignore_merges=True))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False, lstrip=False, rstrip=False)
                            for s in SPECIALS])
    fast = transformers_module().PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="[BOS]", eos_token="[EOS]", unk_token="[UNK]", pad_token="[PAD]")
    fast.chat_template = KIMI_TEMPLATE
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(d))
    return d
