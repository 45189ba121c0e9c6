"""The rehearsal kit: a word-level tokenizer and a tiny random-weight target the simulator samples from.

``python -m engine.sim.rehearsal DIR`` (or :func:`build_kit`) writes:

- ``DIR/tokenizer``: the word-level tokenizer of :mod:`engine.sim.wordtok` (``[tokenizer] path``);
- ``DIR/target``: a tiny causal LM (``save_pretrained``, float32, vocabulary = the tokenizer's
  :data:`~engine.sim.wordtok.VOCAB_SIZE`): DeepSeek-V3's architecture (Kimi-K2.5's: MLA, MoE with a
  shared expert) by default, or a small Llama (``--family llama``). ``[extract] model = DIR/target``
  with ``dtype = "float32"`` scores exactly what the simulator sampled;
- ``DIR/kit.json``: the figures below.

The random weights are made peaked: the LM head's rows are scaled so the mean next-token entropy at
temperature 1 is about ``entropy`` nats (default 2.0, where a uniform pick would be
``log(768) = 6.6``), and the rows of the "end" tokens (specials and bytes: every token but the words,
:mod:`engine.sim.backend`) so their mean total probability is about ``end_rate`` per token (default
0.025: an end token ends reasoning or the answer, so each runs about 40 tokens on average). Both are
measured on a batch of contexts (a rendered prompt followed by random words) and tuned by bisection;
the values reached are printed and stored in ``kit.json``.

Serve it: ``datagen sim --target DIR/target --tokenizer DIR/tokenizer --behaviours ...``
(:mod:`engine.sim.behaviours`).
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

#: Default mean next-token entropy of the kit's target at temperature 1 (nats).
DEFAULT_ENTROPY = 2.0
#: Default mean total probability of the end tokens (specials and bytes) per position.
DEFAULT_END_RATE = 0.025


@dataclass(frozen=True)
class KitInfo:
    """What :func:`build_kit` built (also ``DIR/kit.json``).

    Attributes:
        tokenizer / target: the two directories.
        family: ``deepseek`` | ``llama``; layers / hidden: its size; vocab_size: ids in ``[0, V)``.
        seed: weights seed.
        entropy: measured mean next-token entropy at temperature 1 (nats).
        end_rate: measured mean total probability of the end tokens (specials, bytes) per position.
        word_scale / end_scale: the LM head's scale factors reached (all rows; end rows relative to it).
        unscored_token_ids: the end tokens (every id but the words): the simulator never writes them, so
            phase two scores the words given that the token is not one of these (``[extract]
            unscored_token_ids``; ``DIR/extract.toml`` has the lines to copy).
    """

    tokenizer: str
    target: str
    family: str
    layers: int
    hidden: int
    vocab_size: int
    seed: int
    entropy: float
    end_rate: float
    word_scale: float
    end_scale: float
    unscored_token_ids: tuple[int, ...] = ()


def kit_config(family: str, vocab: int, layers: int = 6, hidden: int = 64) -> Any:
    """A tiny transformers config: ``deepseek`` (DeepSeek-V3: MLA; the first layer dense, the rest MoE
    with 4 routed experts, 2 per token, 1 shared) or ``llama`` (dense, 4 heads, 2 KV heads).

    Raises:
        ValueError: an unknown family.
    """
    from engine.tokens.hfimport import transformers_module

    tf = transformers_module()
    common: dict[str, Any] = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                  num_hidden_layers=layers, max_position_embeddings=16384, tie_word_embeddings=False)
    if family == "deepseek":
        return tf.DeepseekV3Config(
            moe_intermediate_size=hidden // 2, num_attention_heads=4, num_key_value_heads=4, n_shared_experts=1,
            n_routed_experts=4, num_experts_per_tok=2, n_group=2, topk_group=1, first_k_dense_replace=1,
            q_lora_rank=hidden // 2, kv_lora_rank=hidden // 4, qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=16,
            **common)
    if family == "llama":
        return tf.LlamaConfig(num_attention_heads=4, num_key_value_heads=2, **common)
    raise ValueError(f"unknown family {family!r} (deepseek, llama)")


def _bisect(f: Callable[[float], float], want: float, lo: float, hi: float, *, increasing: bool,
            log: bool, iters: int = 20) -> float:
    """The ``x`` in ``[lo, hi]`` where the monotone ``f(x)`` is closest to ``want``."""
    for _ in range(iters):
        mid = math.sqrt(lo * hi) if log else (lo + hi) / 2
        if (f(mid) < want) == increasing:
            lo = mid
        else:
            hi = mid
    return math.sqrt(lo * hi) if log else (lo + hi) / 2


def peak_lm_head(model: Any, end_ids: Sequence[int], contexts: Any, *, entropy: float,
                 end_rate: float) -> tuple[float, float, float, float]:
    """Scale ``model``'s LM head in place (see the module docstring).

    Args:
        end_ids: ids of the end tokens (their rows get the extra factor).
        contexts: ``[B, T]`` ids the entropy and end mass are measured on (every position).
        entropy: wanted mean entropy at temperature 1 (nats); end_rate: wanted mean end-token mass.

    Returns:
        ``(word_scale, end_scale, entropy reached, end rate reached)``.
    """
    import torch

    w = model.get_output_embeddings().weight
    with torch.inference_mode():
        hidden = model.model(input_ids=contexts).last_hidden_state.float().flatten(0, -2)
    base = w.detach().float().clone()
    specials = torch.tensor(sorted(end_ids), dtype=torch.long)

    def measure(sw: float, r: float) -> tuple[float, float]:
        wt = base * sw
        wt[specials] *= r
        lp = torch.log_softmax(hidden @ wt.T, dim=-1)
        p = lp.exp()
        return float(-(p * lp).sum(-1).mean()), float(p[:, specials].sum(-1).mean())

    sw, r = 1.0, 1.0
    for _ in range(3):  # the two knobs interact a little: alternate
        sw = _bisect(functools.partial(lambda x, r: measure(x, r)[0], r=r), entropy, 0.01, 1e4, increasing=False,
                     log=True)
        r = _bisect(functools.partial(lambda x, sw: measure(sw, x)[1], sw=sw), end_rate, 0.0, 4.0,
                    increasing=True, log=False)
    h, ps = measure(sw, r)
    with torch.no_grad():
        wt = base * sw
        wt[specials] *= r
        w.copy_(wt.to(w.dtype))
    return sw, r, h, ps


def random_contexts(prompt: Sequence[int], words: range, batch: int, length: int, seed: int) -> Any:
    """``[batch, len(prompt) + length]`` ids: ``prompt`` then ``length`` random ids of ``words``."""
    import torch

    g = torch.Generator().manual_seed(seed)
    head = torch.tensor(list(prompt), dtype=torch.long).expand(batch, -1)
    return torch.cat([head, torch.randint(words.start, words.stop, (batch, length), generator=g)], dim=1)


def build_kit(d: Path | str, *, seed: int = 0, family: str = "deepseek", layers: int = 6, hidden: int = 64,
              entropy: float = DEFAULT_ENTROPY, end_rate: float = DEFAULT_END_RATE) -> KitInfo:
    """Write the rehearsal kit into ``d`` (``tokenizer/``, ``target/``, ``kit.json``; files overwritten).

    Sets torch's intra-op threads to 1 for the process.

    Raises:
        ValueError: an unknown family, ``entropy <= 0`` or ``end_rate`` outside (0, 1).
        OSError: ``d`` cannot be written.
    """
    if not entropy > 0 or not 0 < end_rate < 1:
        raise ValueError("entropy must be > 0 nats and end_rate within (0, 1)")
    import torch

    from engine.tokens.hfimport import transformers_module
    from engine.tokens.reconstruct import prompt_ids

    torch.set_num_threads(1)  # a tiny model: intra-op threads only contend on a shared machine
    from engine.tokens.tokenizer import load_tokenizer

    from .wordtok import VOCAB_SIZE, WORD_BASE, WORDS, write_word_tokenizer

    d = Path(d)
    tok_dir = write_word_tokenizer(d / "tokenizer")
    tok = load_tokenizer(str(tok_dir))
    torch.manual_seed(seed)
    cfg = kit_config(family, VOCAB_SIZE, layers, hidden)
    model = transformers_module().AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).eval()
    msg = [{"role": "user", "content": " ".join(WORDS[i] for i in range(0, 400, 37))}]
    words = range(WORD_BASE, WORD_BASE + len(WORDS))
    contexts = random_contexts(prompt_ids(tok, msg, None)[1], words, 8, 64, seed + 1)
    ends = [i for i in range(VOCAB_SIZE) if i not in words]
    sw, r, h, ps = peak_lm_head(model, ends, contexts, entropy=entropy, end_rate=end_rate)
    model.save_pretrained(str(d / "target"))
    info = KitInfo(tokenizer=str(tok_dir), target=str(d / "target"), family=family, layers=layers, hidden=hidden,
                   vocab_size=VOCAB_SIZE, seed=seed, entropy=round(h, 4), end_rate=round(ps, 5),
                   word_scale=round(sw, 4), end_scale=round(r, 4), unscored_token_ids=tuple(ends))
    (d / "kit.json").write_text(json.dumps(asdict(info), indent=1) + "\n")
    (d / "extract.toml").write_text(
        "# phase two on the rehearsal kit: copy these lines into the run config's [extract] section\n"
        f"model = {json.dumps(str(d / 'target'))}\ndtype = \"float32\"  # the simulator samples in float32\n"
        f"unscored_token_ids = {json.dumps(list(ends))}  # the end tokens: never written by the simulator\n")
    return info


def main(argv: list[str] | None = None) -> int:
    """``python -m engine.sim.rehearsal DIR [--seed N] [--family deepseek|llama] ...``; returns 0, 1 on a bad option."""
    p = argparse.ArgumentParser(prog="python -m engine.sim.rehearsal",
                                description="build the rehearsal kit: DIR/tokenizer and DIR/target")
    p.add_argument("dir", type=Path)
    p.add_argument("--seed", type=int, default=0, help="weights seed (default %(default)s)")
    p.add_argument("--family", choices=("deepseek", "llama"), default="deepseek",
                   help="architecture (default %(default)s: Kimi-K2.5's)")
    p.add_argument("--layers", type=int, default=6, help="decoder layers (default %(default)s)")
    p.add_argument("--hidden", type=int, default=64, help="hidden size (default %(default)s)")
    p.add_argument("--entropy", type=float, default=DEFAULT_ENTROPY,
                   help="mean next-token entropy at temperature 1, nats (default %(default)s)")
    p.add_argument("--end-rate", type=float, default=DEFAULT_END_RATE,
                   help="mean probability per position of a token that ends reasoning or the answer (a special or "
                        "a byte token; default %(default)s)")
    a = p.parse_args(argv)
    try:
        info = build_kit(a.dir, seed=a.seed, family=a.family, layers=a.layers, hidden=a.hidden, entropy=a.entropy,
                         end_rate=a.end_rate)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    print(f"tokenizer: {info.tokenizer}\ntarget:    {info.target} ({info.family}, {info.layers} layers, "
          f"hidden {info.hidden}, vocabulary {info.vocab_size})\nentropy {info.entropy:.3f} nats/token at "
          f"temperature 1, end tokens {info.end_rate:.4f}/token")
    print(f"phase two: copy {Path(a.dir) / 'extract.toml'}'s lines into [extract] (model, dtype, unscored_token_ids)")
    print(f"serve it: datagen sim --target {info.target} --tokenizer {info.tokenizer} "
          f"--behaviours \"SimA=honest,SimB=honest,SimQ=quant:0.03,SimT=temp:1.4,SimM=mix:0.3\"")
    return 0


if __name__ == "__main__":
    sys.exit(main())
